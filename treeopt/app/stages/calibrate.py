"""Stage 1 of the main job: the drafter's accuracy table and rank vectors on the calibration
prompts (`accuracy.json`), in the dtype every later stage runs in."""

from __future__ import annotations

from pathlib import Path

import torch

from calibration.models import ModelSource
from calibration.runner import CalibrationSettings, run_calibration
from treeopt.app.stages.job import Job

STAGE = "calibrate"


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16 in the CPU flags of
    /proc/cpuinfo; False where the flags cannot be read). Without them bf16 GEMMs are converted
    to float32 and slower than float32 itself (docs/performance-model.md#measured-on-the-development-machine)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def run_dtype(dtype: str, device: str) -> str:
    """The dtype of the main job: `dtype` unless "auto"; on a CPU, bfloat16 where it is native
    (`cpu_has_fast_bf16`), else float32. Why bf16: verifying a few extra tokens is nearly free
    only where a step is bound by streaming the weights, as on a GPU; in bf16 this holds on such
    a CPU too, while float32 makes the step cost grow with every token (docs/statistics.md#the-demos-regime)."""
    if dtype != "auto":
        return dtype
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available() and not mps):
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    return "auto"


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
    job.log(f"[calibrate] {s.model} on {s.data}: {s.steps} greedy tokens per prompt, top-{s.topk}")
    run_calibration(
        ModelSource(s.model, s.heads, s.drafter, s.num_heads, s.device, dtype),
        s.data,
        output=acc_file,
        settings=CalibrationSettings(steps=s.steps, topk=s.topk, seed=s.seed, max_prompts=s.max_prompts),
        resume=True,
        progress=progress,
        threads=s.threads,
    )
    return acc_file
