"""Stage 7 of the main job: the reference decoder on held-out prompts, its measured tokens per
step against tau and the roofline's step-latency ratios against the sweep
(docs/formats.md#validation-csvs)."""

from __future__ import annotations

from treeopt.app.stages.hardware import Bench
from treeopt.app.stages.job import Job
from treeopt.app.stages.proposal import Proposal
from treeopt.app.stages.sweep import MeasuredSweep
from treeopt.app.validation import ValidationDecoding, ValidationResult, format_validation, validate
from treeopt.selection_types import Selection


def validate_held_out(
    job: Job, proposal: Proposal, bench: Bench, measured: MeasuredSweep, chosen: Selection
) -> ValidationResult:
    """Validate every drafted size of the run's validation sizes that the proposal has."""
    s, lm, tau, out, progress = job.settings, bench.lm, proposal.tau, job.out, job.progress
    sweep_df = measured.table
    val_sizes = tuple(n for n in proposal.drafted(s.validation_sizes) if 0 < n <= proposal.tree.size)
    job.log(f"[validate] decoder on {s.validation_data}, tree sizes {list(val_sizes)}")
    result = validate(
        lm,
        tau,
        val_sizes,
        s.validation_data,
        decoding=ValidationDecoding(max_new_tokens=s.steps, max_prompts=s.validation_prompts, topk=s.topk),
        sweep_df=sweep_df,
        out_dir=out,
        progress=progress,
        selection=chosen,
    )
    job.result(format_validation(result))
    return result
