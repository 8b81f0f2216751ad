"""Stage 5 of the main job: the measured sweep of the proposal's trees over batch x context
(`sweep.csv`, its round samples and metadata), with the roofline's prediction of every step
beside the measurement."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from calibration.sweep import SweepSettings
from roofline.hardware import HardwareProfile
from treeopt.app.stages.calibrate import accuracy_path
from treeopt.app.stages.hardware import Bench
from treeopt.app.stages.job import Job, RunSettings
from treeopt.app.stages.proposal import Proposal
from treeopt.app.sweep import fit_from_sweep, format_transfer, sweep


@dataclass(frozen=True)
class MeasuredSweep:
    """The sweep's `table` (one row per batch, context and tree size, as in `csv`) and the
    `settings` it was measured with."""

    table: pd.DataFrame
    settings: SweepSettings
    csv: Path


def sweep_settings(s: RunSettings, sizes, verification: str = "tree") -> SweepSettings:
    """The sweep of `sizes` the run's settings ask for (every form is measured alike)."""
    return SweepSettings(
        sizes,
        s.batches,
        s.contexts,
        repeats=s.repeats,
        topk=s.topk,
        time_budget_s=s.time_budget_s,
        verification=verification,
        tolerance=s.tolerance,
    )


def measure_sweep(job: Job, proposal: Proposal, bench: Bench, hw: HardwareProfile) -> MeasuredSweep:
    """Measure every drafted size of the proposal up to the run's largest, resuming `sweep.csv`."""
    s, csv = job.settings, job.out / "sweep.csv"
    sizes = proposal.drafted(tuple(n for n in s.sizes if n <= proposal.tree.size))
    settings = sweep_settings(s, sizes)
    job.log(
        f"[sweep] sizes {list(sizes)} x batch {list(s.batches)} x context {list(s.contexts)}, "
        f"{s.repeats} rounds each (+ up to {s.time_budget_s:g} s of extra rounds where the answer is open), "
        f"{bench.dtype}"
    )
    table = sweep(
        bench.lm,
        proposal.table,
        proposal.tau,
        settings,
        csv,
        hardware=hw,
        resume="auto",
        progress=job.progress,
        accuracy_path=accuracy_path(job),
    )
    return MeasuredSweep(table, settings, csv)


def log_batch_transfer(job: Job, proposal: Proposal, bench: Bench, hw: HardwareProfile, measured: MeasuredSweep):
    """How well a profile fitted at batch 1 predicts the larger batches (heads and speculators
    only: its draft term models heads, not a draft model)."""
    s = job.settings
    if len(set(s.batches)) > 1 and 1 in s.batches and bench.lm.heads.kind != "draft-model":
        job.log(f"[fit] {format_transfer(fit_from_sweep(bench.lm, proposal.tree, hw, measured.table, job.out))}")
