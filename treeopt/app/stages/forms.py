"""The drafter's own forms that the main job measures beside its proposal trees, and the
choice per cell between them (docs/architecture.md#forms-the-main-job-compares): part of
the selection stage."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from roofline.hardware import HardwareProfile
from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import AccuracyTable
from treeopt.app.draft_model import chain_tau_curves
from treeopt.app.stages.calibrate import accuracy_path
from treeopt.app.stages.hardware import Bench
from treeopt.app.stages.job import Job, RunSettings
from treeopt.app.stages.sweep import sweep_settings
from treeopt.app.sweep import sweep
from treeopt.candidates import candidate_proposal
from treeopt.export import format_tree
from treeopt.fileio import write_text
from treeopt.forms import choose_form
from treeopt.selection import read_round_samples, select, sweep_samples_path
from treeopt.selection_types import FormsChoice, Selection, write_selection
from treeopt.tau import TauCurve, tau_curves


@dataclass(frozen=True)
class OtherForm:
    """Another way of drafting and verifying that the main job measures beside its proposal
    trees, because the drafter's own published form might beat them (docs/architecture.md#forms-the-main-job-compares):

    name:          "chain" (a draft model's gamma drafts, Leviathan et al. 2023), "merged" or
                   "candidates" (IBM's n best full-length candidates, Wertheimer et al. 2024,
                   merged into their prefix tree or verified as n sequences);
    tau:           its proposal sequence and expected tokens per step;
    sizes:         the proposal sizes measured (nodes; 0 is plain decoding);
    verification:  how the target checks it: "tree" attention or "candidates" sequences;
    labels:        nodes -> how a user names that size ("gamma 3", "4 candidates").
    """

    name: str
    tau: TauCurve
    sizes: tuple[int, ...]
    verification: str
    labels: dict


#: per drafter, the forms `choose_form` compares, preferred first where intervals overlap
#: (docs/architecture.md#forms-the-main-job-compares)
FORM_ORDER = {"draft-model": ("chain", "tree"), "mlp-speculator": ("tree", "merged", "candidates")}


def other_forms(lm, table: AccuracyTable, acc_file, s: RunSettings) -> list[OtherForm]:
    """The forms the drafter's authors publish, beside the proposal trees: chains for a draft
    model; for an MLP speculator, IBM's candidate sets (its config's `top_k_tokens_per_head`
    and `n_candidates`, at most `max_nodes` nodes) merged into their prefix tree and as
    candidate sequences; none for the others."""
    kind = lm.heads.kind
    if kind == "draft-model":
        _, tau = chain_tau_curves(acc_file, s.max_nodes)
        sizes = sorted({0} | {min(int(n), tau.proposal.size) for n in s.sizes})
        return [OtherForm("chain", tau, tuple(sizes), "tree", {n: f"gamma {n}" for n in sizes if n})]
    if kind != "mlp-speculator":
        return []
    topk = [min(int(k), table.width) for k in lm.heads.top_k_tokens_per_head[: table.num_heads]]
    most = min(int(lm.heads.n_candidates), int(np.prod(topk)))
    proposal, nodes = candidate_proposal(table.accuracy, topk, most)
    counts = [m for m in range(1, most + 1) if nodes[m - 1] <= s.max_nodes and (m & (m - 1) == 0 or m == most)]
    if not counts:
        return []
    proposal = proposal.prefix(nodes[counts[-1] - 1])
    vectors = load_rank_vectors(acc_file, table=table) if str(acc_file).endswith(".json") else None
    tau = tau_curves(table, proposal, vectors)
    labels = {nodes[m - 1]: f"{m} candidate{'s' if m > 1 else ''}" for m in counts}
    return [
        OtherForm(name, tau, (0, *labels), name if name == "candidates" else "tree", labels)
        for name in ("merged", "candidates")
    ]


def _measure_form(job: Job, bench: Bench, table: AccuracyTable, form: OtherForm, hw: HardwareProfile) -> Selection:
    """Sweep `form` like the proposal trees (`sweep-NAME.csv`, `selection-NAME.json`,
    `proposal-NAME.json`); returns its selection."""
    s, out = job.settings, job.out
    csv = out / f"sweep-{form.name}.csv"
    settings = sweep_settings(s, form.sizes, form.verification)
    job.log(
        f"[sweep] {form.name}: {', '.join(form.labels.values())} ({form.verification} verification) x batch "
        f"{list(s.batches)} x context {list(s.contexts)}"
    )
    df = sweep(
        bench.lm,
        table,
        form.tau,
        settings,
        csv,
        hardware=hw,
        resume="auto",
        progress=job.progress,
        accuracy_path=accuracy_path(job),
    )
    chosen = select(
        df,
        form.tau.proposal,
        by="measured",
        hardware=hw.name,
        model=s.model,
        samples=read_round_samples(sweep_samples_path(csv)),
        threads=bench.threads,
        tolerance=s.tolerance,
        confidence=settings.confidence,
    )
    labels = {str(n): label for n, label in form.labels.items()}
    chosen = replace(chosen, provenance=replace(chosen.provenance, verification=form.verification, labels=labels))
    write_selection(out / f"selection-{form.name}.json", chosen)
    write_text(
        out / f"proposal-{form.name}.json",
        format_tree(form.tau.proposal, "json", tau=float(form.tau.best[-1]), method=form.name),
    )
    return chosen


def measure_other_forms(
    job: Job, bench: Bench, table: AccuracyTable, forms: list[OtherForm], selection: Selection, hw: HardwareProfile
) -> FormsChoice:
    """Sweep every form of `forms` (`_measure_form`) and choose, per cell, between them and the
    trees' selection (`treeopt.forms.choose_form`, in the drafter's `FORM_ORDER`)."""
    chosen = {f.name: _measure_form(job, bench, table, f, hw) for f in forms}
    choice = choose_form({"tree": selection, **chosen}, order=FORM_ORDER[bench.lm.heads.kind])
    return replace(choice, labels={name: sel.provenance.labels for name, sel in chosen.items()})
