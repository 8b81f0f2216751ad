"""Stage 2 of the main job: the proposal sequence (every prefix is the tree of that size) and
its tau curves from the calibrated table, in the family of the engine the run targets
(`proposal_tree.json`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.app.stages.job import Job
from treeopt.engines import Engine, get_engine
from treeopt.export import format_tree
from treeopt.family_build import drafted_sizes, engine_proposal
from treeopt.fileio import write_text
from treeopt.tau import TauCurve, load_tau_curves, tau_curves
from treeopt.tree import Tree


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


def build_proposal(job: Job, acc_file: Path) -> Proposal:
    """The proposal sequence of at most `max_nodes` nodes from `acc_file`; writes
    `proposal_tree.json`."""
    s = job.settings
    target = get_engine(s.engine, topk=s.topk) if s.engine else None
    if target is None:
        table, tau = load_tau_curves(acc_file, s.max_nodes, method=s.method)
    else:
        table = load_accuracy(acc_file)
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
