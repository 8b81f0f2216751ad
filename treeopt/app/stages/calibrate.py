"""Stage 1 of the main job: the drafter's accuracy table and rank vectors on the calibration
prompts (`accuracy.json`), in the dtype every later stage runs in."""

from __future__ import annotations

from pathlib import Path

from calibration.models import ModelSource, resolve_device, resolve_dtype
from calibration.runner import CalibrationSettings, run_calibration
from treeopt.app.stages.job import Job
from treeopt.dtypes import torch_dtype_name

STAGE = "calibrate"


def run_dtype(dtype: str, device: str) -> str:
    """The dtype every stage of the main job runs in, by torch's name ("bfloat16", ...): `dtype`
    as `calibration.models.resolve_dtype` resolves it on `device`, so that "auto" follows the
    one rule of every command; fixed once, so that the stages cannot differ."""
    return torch_dtype_name(resolve_dtype(dtype, resolve_device(device)))


def accuracy_path(job: Job) -> Path:
    return job.out / "accuracy.json"


def record(job: Job, dtype: str) -> dict:
    """The settings this stage is recorded with in `run_state.json`: a rerun with the same ones
    keeps its table."""
    s = job.settings
    return (
        {
            "model": s.model,
            "heads": s.heads,
            "data": s.data,
            "steps": s.steps,
            "topk": s.topk,
            "dtype": dtype,
            "seed": s.seed,
        }
        | ({"num_heads": s.num_heads} if s.num_heads else {})
        | ({"max_prompts": s.max_prompts} if s.max_prompts else {})
        | ({"drafter": s.drafter} if s.drafter else {})
    )


def calibrate(job: Job, dtype: str) -> Path:
    """Calibrate the drafter on the run's prompts into `accuracy.json`, resuming from its
    checkpoint; returns the table's path."""
    s, progress, acc_file = job.settings, job.progress, accuracy_path(job)
    # Said once the table is written, not before: a model that does not load is then one line
    # (its error), as for every other bad input.
    run_calibration(
        ModelSource(s.model, s.heads, s.drafter, s.num_heads, s.device, dtype),
        s.data,
        output=acc_file,
        settings=CalibrationSettings(steps=s.steps, topk=s.topk, seed=s.seed, max_prompts=s.max_prompts),
        resume=True,
        progress=progress,
        threads=s.threads,
    )
    job.log(f"[calibrate] {s.model} on {s.data}: {s.steps} greedy tokens per prompt, top-{s.topk} -> {acc_file.name}")
    return acc_file
