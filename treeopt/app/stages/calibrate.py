"""Stage 1 of the main job: the drafter's accuracy table and rank vectors on the calibration
prompts (`accuracy.json`), in the dtype every later stage runs in."""

from __future__ import annotations

from pathlib import Path

from calibration.models import ModelSource, resolve_device, resolve_dtype
from calibration.runner import CalibrationSettings, run_calibration
from treeopt.accuracy import load_accuracy
from treeopt.app.stages.job import Job
from treeopt.dtypes import torch_dtype_name
from treeopt.errors import UserError

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
    # the run keeps accuracy.json as its record of the stage (a rerun reuses the table, never the
    # counts), so the checkpoint of counts that calibration keeps after a --max-prompts subset is
    # not left in a finished run folder (docs/architecture.md#the-run-report)
    Path(str(acc_file) + ".partial").unlink(missing_ok=True)
    job.log(f"[calibrate] {s.model} on {s.data}: {s.steps} greedy tokens per prompt, top-{s.topk} -> {acc_file.name}")
    return acc_file


#: below this top-1 accuracy at every head, the heads never predict the model's next token:
#: chance on a 32,000-token vocabulary is 3e-5, while heads trained for the model reach 0.29-0.50
#: (the demo's four heads, reports/demo-cpu/index.md)
NEVER_MATCHES_TOP1 = 1e-3


def check_heads_match(acc_file: Path, heads: str | None) -> None:
    """Stop the run (UserError, exit status 2) when the calibrated drafter never predicted the
    model's next token: then no tree speeds the model up (tau = 1 for every tree), and the
    sweep and validation would spend minutes measuring nothing. The usual cause is heads
    trained for another model (docs/architecture.md#heads-that-never-match). accuracy.json is kept."""
    table = load_accuracy(acc_file)
    top1 = table.accuracy[:, 0]
    if top1.size == 0 or float(top1.max()) >= NEVER_MATCHES_TOP1:
        return
    drafter = f"--heads {heads}" if heads else "the model's drafter"
    raise UserError(
        f"{acc_file}: {drafter} never predicted the model's next token (top-1 accuracy "
        f"{float(top1.max()):.3f} at every one of {top1.size} heads over {int(table.positions[0])} positions, so "
        "tau = 1 for every tree and no tree can speed this model up); the usual cause is heads trained for another "
        "model, tokenizer or checkpoint revision: check --heads against --model. Stopped before the sweep and "
        "validation; the calibration is kept in accuracy.json"
    )
