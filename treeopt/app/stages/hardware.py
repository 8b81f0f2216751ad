"""Stage 3 of the main job: the device every measurement runs on, set up once (one torch
thread count for the profile, the sweep and the validation), and this machine's roofline
profile from microbenchmarks (`hardware.json`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calibration.threads import default_threads
from roofline.hardware import HardwareProfile
from roofline.shapes import ModelShape
from treeopt.app.hwcalibrate import calibrate_hardware
from treeopt.app.models import shape_of
from treeopt.app.stages.job import Job
from treeopt.dtypes import torch_dtype_name

STAGE = "hardware"


@dataclass(frozen=True)
class Bench:
    """What the run measures on: the loaded model with its drafter (`lm`), its dtype's name
    ("float32", "bfloat16", ...), the torch threads and the model's roofline shape."""

    lm: object
    dtype: str
    threads: int
    shape: ModelShape


def set_up_bench(job: Job, lm) -> Bench:
    """Fix the torch threads of every measurement of the run on a CPU."""
    threads = torch.get_num_threads()
    if lm.device.type == "cpu":
        # One thread count for every measurement of the run (profile, sweep, validation).
        threads = job.settings.threads or default_threads(lm.model, lm.device) or torch.get_num_threads()
        torch.set_num_threads(threads)
    job.log(f"[setup] {lm.device}, {str(lm.dtype).replace('torch.', '')}, {threads} torch thread(s)")
    dtype_name = torch_dtype_name(lm.dtype)
    return Bench(lm, dtype_name, threads, shape_of(job.settings.model, dtype=dtype_name))


def record(job: Job, bench: Bench) -> dict:
    """The settings this stage is recorded with in `run_state.json`."""
    return {
        "device": str(bench.lm.device),
        "dtype": bench.dtype,
        "model": job.settings.model,
        "quick": job.settings.hw_quick,
    }


def profile_hardware(job: Job, bench: Bench) -> HardwareProfile:
    """Microbenchmark this device for the model's shape."""
    job.log(f"[hardware] microbenchmarks on {bench.lm.device} ({bench.dtype})")
    return calibrate_hardware(
        bench.lm.device.type, bench.shape, dtype=bench.dtype, quick=job.settings.hw_quick, progress=job.progress
    )
