"""A calibration's outputs: its result (`CalibrationResult`), the accuracy table of its counts,
the checks before a run that its outputs can be written without overwriting an input, the
table and rank-vector sidecar written together, and an output already complete for the same
inputs taken back on --resume (`calibration.runner`'s module doc;
docs/formats.md#output-safety)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.calibration_settings import CalibrationSettings
from calibration.checkpoint import run_id
from calibration.counts import CalibrationCounts
from calibration.data import PromptSet
from calibration.device_info import table_device_name
from calibration.distributed import Processes, rank_checkpoint_path
from calibration.models import ModelSource
from calibration.provenance import run_date, tool_versions
from treeopt.acceptance import (
    load_rank_vectors,
    rank_vectors_fingerprint,
    rank_vectors_path,
    save_rank_vectors,
)
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.draft_scores import DraftScores, draft_scores_path, save_draft_scores
from treeopt.dtypes import torch_dtype_name
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError
from treeopt.fileio import atomic_outputs, check_writable, refuse_overwriting_inputs
from treeopt.input_paths import input_files
from treeopt.resume import differences_text

__all__ = [
    "CalibrationResult",
    "accuracy_table",
    "check_outputs",
    "finished_result",
    "recorded_draft_scores",
    "save_outputs",
]


@dataclass(frozen=True)
class CalibrationResult:
    table: AccuracyTable
    counts: CalibrationCounts
    complete: bool  # every prompt of the data set was used
    checkpoint: Path | None  # the checkpoint left on disk (None once complete)
    elapsed_s: float  # wall time of this invocation (not of resumed parts)
    resumed_prompts: int = 0  # prompts already done by the checkpoint this run resumed from
    run_tokens: int = 0  # tokens (prompt + generation) processed by this invocation
    # Rank vectors of every counted position (module doc): (N, K) int16, -1 = no label,
    # topk = miss (rank >= topk), else the exact rank; rows ordered by (prompt, t)
    ranks: np.ndarray | None = None
    sequence: np.ndarray | None = None  # (N,) int32 prompt index (file order) of each row
    fingerprint: dict | None = None  # the inputs (as in the checkpoint)
    already_complete: bool = False  # resumed on an output already complete: nothing was run
    draft_scores: DraftScores | None = None  # the drafter's own pools (--draft-scores), row for row with ranks


def finished_result(output: Path, fingerprint: dict, total: int, *, refuse_other: bool) -> CalibrationResult | None:
    """The result of an output already complete for these inputs (None when `output` is not a
    calibration's complete output for `total` prompts). An output from other inputs is
    refused (UserError) when `refuse_other`, else the run starts over and replaces it."""
    if not output.is_file():
        return None
    theirs = rank_vectors_fingerprint(output)
    if theirs is None:  # no sidecar: not from a calibration, nothing to compare
        return None
    if theirs != fingerprint:
        detail = differences_text(theirs, fingerprint) or "settings this treeopt no longer records"
        if refuse_other:
            raise UserError(
                f"{output}: already calibrated from other inputs ({detail}); rerun without --resume to replace it"
            )
        print(f"treeopt: {output} was calibrated from other inputs ({detail}); calibrating anew", file=sys.stderr)
        return None
    table = load_accuracy(output)
    prompts_done = table.provenance.get("prompts")
    if prompts_done != total:
        return None
    ranks, sequence = load_rank_vectors(output, table=table)
    counts = CalibrationCounts(
        table.hits.astype(np.int64),
        table.positions.astype(np.int64),
        None if table.joint is None else dict(table.joint),
        prompts_done,
        int(table.provenance.get("tokens", 0)),
        int(table.provenance.get("steps", 0)) * prompts_done,
    )
    counts.rank_chunks, counts.sequence_chunks = [ranks], [sequence]
    print(
        f"treeopt: {output} is already complete for these inputs ({prompts_done} prompts); its counts are kept",
        file=sys.stderr,
    )
    return CalibrationResult(
        table, counts, True, None, 0.0, prompts_done, 0, ranks, sequence, fingerprint, already_complete=True
    )


def accuracy_table(
    loaded, prompts: PromptSet, settings: CalibrationSettings, counts, fingerprint: dict, processes
) -> AccuracyTable:
    """The accuracy table of the counts, its provenance naming the inputs and the software."""
    empty = np.flatnonzero(counts.positions == 0)
    if len(empty):
        raise UserError(
            f"{prompts.name}: head {int(empty[0]) + 1} got no labelled position: the "
            f"prompts are too short (data labels need at least {loaded.heads.num_heads + 2} tokens)"
        )
    provenance = {
        "source": "treeopt calibrate",
        "model": loaded.name,
        "heads": fingerprint["heads"],
        "dataset": prompts.name,
        "dataset_sha256": prompts.sha256,
        "data_format": prompts.data_format,
        "chat_template": prompts.chat_template,
        "labels": settings.labels,
        "steps": settings.generated_tokens,
        "topk": settings.topk,
        "batch_size": settings.batch_size,
        "prompt_tokens": prompts.prompt_tokens,
        "prompts": counts.prompts_done,
        "positions": int(counts.positions[0]),
        "tokens": counts.tokens,
        "seed": settings.seed,
        "run_id": run_id(fingerprint, counts),
        "rank_ties": "rank = number of logits strictly greater than the label's",
        "date": run_date(),
        **tool_versions(),
        "device": table_device_name(loaded.device),
        "dtype": torch_dtype_name(loaded.dtype),
        **({"processes": processes.world_size} if processes.many else {}),
    }
    return AccuracyTable(
        hits=counts.hits.astype(np.float64),
        positions=counts.positions.astype(np.float64),
        joint=None if counts.joint is None else dict(sorted(counts.joint.items())),
        provenance=provenance,
    )


def recorded_draft_scores(counts: CalibrationCounts, sequence, heads, settings: CalibrationSettings, table):
    """The draft scores the counts hold (None when the run records none), with the table's run_id."""
    if settings.draft_scores_topk is None:
        return None
    pools = counts.draft_pools()
    if pools is None:  # no row counted
        m = sglang_pool_size(heads.num_heads, settings.draft_scores_topk)
        pools = (np.zeros((0, m), np.float32), np.zeros((0, heads.num_heads), np.int32))
    return DraftScores(
        pools[0],
        pools[1],
        np.asarray(sequence, np.int32),
        heads.num_heads,
        settings.draft_scores_topk,
        settings.generated_tokens,
        table.provenance["run_id"],
    )


def _sidecar_paths(output) -> list[Path]:
    return [rank_vectors_path(output), draft_scores_path(output)]


def check_outputs(source: ModelSource, data: str, output, checkpoint: Path | None, processes: Processes) -> None:
    """UserError, before the model loads and hours of calibration, for outputs that would
    overwrite an input or cannot be written (docs/formats.md#output-safety)."""
    own_checkpoint = None if checkpoint is None else rank_checkpoint_path(checkpoint, processes)
    outputs = [] if output is None or not processes.is_main else [output, *_sidecar_paths(output)]
    outputs += [own_checkpoint] if own_checkpoint is not None else []
    check_writable(outputs)
    # a model folder counts with its weights and configuration; `demo` names no file here, and
    # what it resolves to lies inside the package, which `check_writable` refuses
    refuse_overwriting_inputs(outputs, input_files(source.model, source.heads, data))
    if output is not None and checkpoint is not None:
        refuse_overwriting_inputs([own_checkpoint], [output, *_sidecar_paths(output)])


def save_outputs(output: str | Path, result: CalibrationResult) -> None:
    """Write the accuracy table `output` and its sidecars (rank vectors; draft scores when
    recorded) together, durably (`treeopt.fileio.atomic_outputs`). The sidecars are renamed
    first and the table, which readers open first, last; all carry the run's ``run_id``
    (docs/formats.md#output-safety)."""
    with atomic_outputs() as out:
        if result.draft_scores is not None:
            save_draft_scores(out.path(draft_scores_path(output)), result.draft_scores)
        save_rank_vectors(
            out.path(rank_vectors_path(output)),
            result.ranks,
            result.sequence,
            result.table.width,
            result.fingerprint,
            run_id=result.table.provenance["run_id"],
        )
        result.table.save(out.path(output))
