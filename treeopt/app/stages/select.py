"""Stage 6 of the main job: the tree to ship per batch and context from the measured sweep
(`selection.json`, `measured_speedup.png`), with the evidence of a profile fitted to every
cell, the drafter's own forms where it has them, and one tree for the traffic mix when asked."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from roofline.hardware import HardwareProfile
from roofline.plots import plot_measured_speedup
from treeopt.app.pooled import add_pooled_evidence, pooled_from_sweep
from treeopt.app.stages.calibrate import accuracy_path
from treeopt.app.stages.forms import measure_other_forms, other_forms
from treeopt.app.stages.hardware import Bench
from treeopt.app.stages.job import Job
from treeopt.app.stages.proposal import Proposal
from treeopt.app.stages.sweep import MeasuredSweep
from treeopt.chain_or_tree import chain_or_tree, format_chain_or_tree
from treeopt.engines import draft_model_dir, eagle_draft
from treeopt.mix import TrafficMix, choose_mix_tree, format_mix, mix_grid_from_sweep, mix_section
from treeopt.schedules import format_schedule, with_schedule
from treeopt.selection import read_round_samples, select, sweep_samples_path
from treeopt.selection_text import format_pooled, format_selection
from treeopt.selection_types import Selection, write_selection


@dataclass(frozen=True)
class SelectedTrees:
    """The run's selection (`selection.json`: with the pooled fit, the drafter's other forms
    and the mix where the run has them) and the seconds its slower steps took
    (`pooled_fit_s`, `forms_s`)."""

    selection: Selection
    timings_s: dict


def select_trees(
    job: Job, proposal: Proposal, bench: Bench, hw: HardwareProfile, measured: MeasuredSweep, mix: TrafficMix | None
) -> SelectedTrees:
    """Choose the tree per cell, then add what the run has beside it; writes `selection.json`
    and the measured-speedup plot."""
    s, timings = job.settings, {}
    round_samples = read_round_samples(sweep_samples_path(measured.csv))
    chosen = select(
        measured.table,
        proposal.tree,
        by="measured",
        hardware=hw.name,
        model=s.model,
        samples=round_samples,
        threads=bench.threads,
        tolerance=s.tolerance,
        confidence=measured.settings.confidence,
        fixed_rounds=True,  # the sweep is finished: its budget is spent
    )
    if bench.lm.heads.kind != "draft-model" and round_samples:
        t0 = time.perf_counter()
        chosen = _with_pooled(job, proposal, bench, hw, measured, round_samples, chosen)
        timings["pooled_fit_s"] = time.perf_counter() - t0
    chosen = replace(chosen, provenance=replace(chosen.provenance, dtype=bench.dtype))
    forms = other_forms(bench.lm, proposal.table, accuracy_path(job), s)
    if forms:
        t0 = time.perf_counter()
        chosen = replace(chosen, forms=measure_other_forms(job, bench, proposal.table, forms, chosen, hw))
        timings["forms_s"] = time.perf_counter() - t0
    if mix is not None:
        choice = choose_mix_tree(
            mix_grid_from_sweep(measured.table), mix, source=str(measured.csv), chosen=chosen.chosen_nodes()
        )
        chosen = replace(chosen, mix=mix_section(choice, proposal.tree, mix))
    grid = mix_grid_from_sweep(measured.table)
    if proposal.engine is not None:  # the engine's per-batch schedule (docs/engines.md#schedules)
        table = proposal.table
        chosen = with_schedule(
            chosen,
            proposal.engine,
            grid=grid,
            proposal=proposal.tree,
            accuracy=table.accuracy,
            drafter=eagle_draft(table),
            draft_model=draft_model_dir(table),
        )
    chosen = replace(chosen, chain_or_tree=chain_or_tree(chosen, grid, proposal.tree, proposal.engine))
    plot_measured_speedup(measured.table, chosen, job.out / "measured_speedup.png")
    write_selection(job.out / "selection.json", chosen)
    job.result(format_selection(chosen))
    if chosen.mix is not None:
        job.result(format_mix(chosen.mix))
    if chosen.chain_or_tree is not None:
        job.result(format_chain_or_tree(chosen.chain_or_tree))
    if chosen.schedule is not None:
        job.result(format_schedule(chosen.schedule))
    return SelectedTrees(chosen, timings)


def _with_pooled(
    job: Job, proposal: Proposal, bench: Bench, hw, measured: MeasuredSweep, round_samples, chosen: Selection
) -> Selection:
    """The evidence of one profile fitted to every cell (docs/statistics.md#pooled-evidence)."""
    pooled = pooled_from_sweep(bench.lm, proposal.tree, hw, measured.table, round_samples)
    chosen = add_pooled_evidence(
        chosen,
        measured.table,
        round_samples,
        pooled,
        proposal.tree,
        tolerance=job.settings.tolerance,
        confidence=measured.settings.confidence,
    )
    job.log(f"[pooled] {format_pooled(chosen)}")
    return chosen
