"""Stage 2 of the main job: the proposal sequence (every prefix is the tree of that size) and
its tau curves from the calibrated table, in the family of the engine the run targets
(`proposal_tree.json`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.app.stages.job import Job, RunSettings
from treeopt.engines import Engine, engine_for_drafter, get_engine
from treeopt.errors import UserError
from treeopt.export import format_tree
from treeopt.family_build import drafted_sizes, engine_proposal
from treeopt.fileio import write_text
from treeopt.tau import TauCurve, load_tau_curves, tau_curves
from treeopt.tree import Tree
from treeopt.tree_api import engine_for_table


@dataclass(frozen=True)
class Proposal:
    """The calibrated `table`, the proposal sequence's `tau` curves, the `method` that built it
    ("joint", "greedy", ...) and the `engine` whose family it is from (None: treeopt's own)."""

    table: AccuracyTable
    tau: TauCurve
    method: str
    engine: Engine | None

    @property
    def tree(self) -> Tree:
        return self.tau.proposal

    def drafted(self, sizes) -> tuple[int, ...]:
        """The sizes to measure: for an engine that drafts only some prefixes of the proposal as
        written (vLLM's uniform trees), each size becomes the largest such prefix not above it."""
        if self.engine is None or self.engine.family != "uniform":
            return tuple(sizes)
        ok = np.flatnonzero(drafted_sizes(self.tree, self.engine))
        return tuple(sorted({int(ok[ok <= min(n, self.tree.size)].max()) for n in sizes}))


def run_engine(s: RunSettings, table: AccuracyTable, log) -> Engine | None:
    """The engine whose family the run's trees come from. `--engine` as the drafter the table was
    measured from is served by it (`engine_for_table`: vLLM serves Medusa heads as a top-1
    chain, ...); without `--engine`, Hydra heads search Hydra's own family, the only engine that
    serves them being the Hydra authors' code (docs/engines.md#hydra); otherwise None, treeopt's
    own decoder, which drafts any tree."""
    if s.engine:
        name = engine_for_table(s.engine, table, note=lambda line: log(f"[trees] note: {line}"))
        if name is None:  # refused before any work by `check_engine_serves_drafter`
            raise UserError(f"--engine {s.engine}: cannot serve the {table.drafter} drafter of this run")
        return get_engine(name, topk=s.topk)
    if table.drafter == "hydra":
        log("[trees] Hydra heads: trees from the family Hydra's own code drafts (grounded heads expand first children)")
        return get_engine("hydra")
    return None


def check_engine_serves_drafter(s: RunSettings, drafter_kind: str) -> None:
    """UserError, before any work, when `--engine` cannot serve the run's drafter at all
    (`treeopt.engines.engine_for_drafter`: SGLang and Medusa heads, ...)."""
    if s.engine:
        served, why = engine_for_drafter(s.engine, drafter_kind)
        if served is None:
            raise UserError(why)


def build_proposal(job: Job, acc_file: Path) -> Proposal:
    """The proposal sequence of at most `max_nodes` nodes from `acc_file`; writes
    `proposal_tree.json`."""
    s = job.settings
    table = load_accuracy(acc_file)
    target = run_engine(s, table, job.log)
    if target is None:
        table, tau = load_tau_curves(acc_file, s.max_nodes, method=s.method)
    else:
        tau = tau_curves(
            table,
            engine_proposal(table, s.max_nodes, target, method=s.method),
            load_rank_vectors(acc_file, table=table),
        )
    proposal = tau.proposal
    method = "joint" if (s.method == "auto" and table.joint) else ("greedy" if s.method == "auto" else s.method)
    write_text(
        job.out / "proposal_tree.json",
        format_tree(
            proposal,
            "json",
            tau=float(tau.joint[-1] if tau.joint is not None else tau.independent[-1]),
            method=method,
            provenance=table.provenance,
        ),
    )
    job.log(
        f"[trees] {method} proposal sequence of {proposal.size} nodes; tau({proposal.size}) = "
        f"{tau.independent[-1]:.3f} independent"
        + (f", {tau.joint[-1]:.3f} joint" if tau.joint is not None else "")
        + (f", {tau.walked[-1]:.3f} walked" if tau.walked is not None else "")
    )
    return Proposal(table, tau, method, target)
