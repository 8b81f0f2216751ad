"""The drafter's own scores that `treeopt calibrate --draft-scores TOPK` records beside an
accuracy table (``<output stem>.scores.npz``, docs/formats.md#draft-score-sidecar-namescoresnpz),
and tau of SGLang's dynamic EAGLE tree predicted from them (docs/statistics.md#dynamic-trees).

An engine that builds its tree at run time from the drafter's probabilities (SGLang's EAGLE
worker with topk > 1; TensorRT-LLM's dynamic tree) drafts the pool of
`calibration.sglang_drafting.draft_pool` at every step. The calibration drafts that pool at
every counted position of its greedy sequences, from the same forward of the base model that
ranks the labels, for one topk and as many steps as the drafter has depths, and keeps what
`treeopt.dynamic_tree.dynamic_tau` reads: the pool's scores and where the base model's
continuation lies in it. The pool of fewer steps is a prefix of it (each level's beams are
chosen from that level's candidates only), so every steps up to the recorded ones is
predicted from one file; another topk drafts other beams and needs its own file.

numpy only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from treeopt.dynamic_tree import dynamic_tau, forced_draft_tokens
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError
from treeopt.npz_input import read_npz, write_npz

__all__ = [
    "DRAFT_SCORES_FORMAT",
    "DraftScores",
    "draft_scores_path",
    "draft_scores_tau",
    "load_draft_scores",
    "save_draft_scores",
]

DRAFT_SCORES_FORMAT = "treeopt.draft-scores/v1"
#: the sidecar of ``acc.json`` is ``acc.scores.npz``
DRAFT_SCORES_SUFFIX = ".scores.npz"


@dataclass(frozen=True)
class DraftScores:
    """SGLang's pool drafted at every counted calibration position (module doc).

    Rows are the calibration's rank-vector rows: prompt by prompt, positions t = P-1 .. L-3 of
    a sequence of P prompt and ``generated_tokens`` greedy tokens (docs/statistics.md#labels).
    """

    pool_probability: np.ndarray  # (N, M) float32: product of the drafter's probabilities along each pool node's path
    on_path_index: np.ndarray  # (N, S) int32: pool index of the continuation's node at depth d + 1, -1 none
    sequence_index: np.ndarray  # (N,) int32: the row's prompt (file order)
    steps_recorded: int  # S: the pool's levels, M = sglang_pool_size(S, topk)
    topk: int  # the beams and children per level the pool was drafted with
    generated_tokens: int  # greedy tokens per prompt (the calibration's --steps)
    run_id: str = ""  # the calibration's run_id (its accuracy table carries the same)

    @property
    def rows(self) -> int:
        return self.pool_probability.shape[0]


def draft_scores_path(accuracy_path) -> Path:
    """``acc.json`` -> ``acc.scores.npz`` (beside it)."""
    p = Path(accuracy_path)
    return p.with_suffix(DRAFT_SCORES_SUFFIX) if p.suffix else p.with_name(p.name + DRAFT_SCORES_SUFFIX)


def save_draft_scores(path, scores: DraftScores) -> None:
    """Write the sidecar atomically, byte-identical for equal scores."""
    write_npz(
        path,
        {
            "format": np.asarray(DRAFT_SCORES_FORMAT),
            "pool_probability": np.asarray(scores.pool_probability, np.float32),
            "on_path_index": np.asarray(scores.on_path_index, np.int32),
            "sequence_index": np.asarray(scores.sequence_index, np.int32),
            "steps_recorded": np.asarray(scores.steps_recorded, np.int64),
            "topk": np.asarray(scores.topk, np.int64),
            "generated_tokens": np.asarray(scores.generated_tokens, np.int64),
            "run_id": np.asarray(str(scores.run_id)),
        },
    )


def _format(z: dict, name: str) -> None:
    value = z.get("format")
    if value is None or value.shape != () or value.dtype.kind != "U":
        raise UserError(f"{name}: not a draft-score file (no 'format' string)")
    text = str(value)
    if text != DRAFT_SCORES_FORMAT:
        newer = text.startswith("treeopt.draft-scores/")
        raise UserError(
            f"{name}: format {text!r}"
            + (", written by a newer treeopt" if newer else " is not a draft-score file")
            + f"; this treeopt reads {DRAFT_SCORES_FORMAT}"
        )


def _scalar(z: dict, key: str, name: str, least: int) -> int:
    value = z.get(key)
    if value is None or value.shape != () or value.dtype.kind not in "iu" or int(value) < least:
        raise UserError(f"{name}: '{key}' must be an integer >= {least}")
    return int(value)


def _check_rows(name: str, seq: np.ndarray, generated: int) -> None:
    """Every prompt holds ``generated - 1`` rows, grouped: a cut or spliced file is refused."""
    if seq.size and np.any(np.diff(seq) < 0):
        raise UserError(f"{name}: 'sequence_index' is not non-decreasing (rows must be grouped by prompt)")
    _, per_prompt = np.unique(seq, return_counts=True)
    if np.any(per_prompt != generated - 1):
        raise UserError(
            f"{name}: a prompt holds {int(per_prompt[per_prompt != generated - 1][0])} rows, "
            f"expected {generated - 1} ({generated} generated tokens per prompt): the file is cut or damaged"
        )


def load_draft_scores(path) -> DraftScores:
    """The sidecar at `path`, checked whole: UserError, one line naming the file, for anything
    but a complete v1 file (module doc; docs/formats.md)."""
    name = os.fspath(path)
    z = read_npz(path, "a draft-score file")
    _format(z, name)
    steps = _scalar(z, "steps_recorded", name, 1)
    topk = _scalar(z, "topk", name, 1)
    generated = _scalar(z, "generated_tokens", name, steps + 1)
    missing = [k for k in ("pool_probability", "on_path_index", "sequence_index") if k not in z]
    if missing:
        raise UserError(f"{name}: not a draft-score file (no '{missing[0]}' array)")
    scores, on_path, seq = z["pool_probability"], z["on_path_index"], z["sequence_index"]
    pool = sglang_pool_size(steps, topk)
    if scores.ndim != 2 or scores.shape[1] != pool or scores.dtype != np.float32:
        raise UserError(
            f"{name}: 'pool_probability' must be (N, {pool}) float32 for {steps} steps of topk {topk}, "
            f"got {scores.dtype} {scores.shape}"
        )
    n = scores.shape[0]
    if on_path.shape != (n, steps) or on_path.dtype.kind not in "iu":
        raise UserError(f"{name}: 'on_path_index' must be ({n}, {steps}) integers, got {on_path.dtype} {on_path.shape}")
    if seq.shape != (n,) or seq.dtype.kind not in "iu":
        raise UserError(f"{name}: 'sequence_index' must be {n} integers, got {seq.dtype} {seq.shape}")
    if not np.all((scores >= 0) & (scores <= 1)):  # NaN fails both
        raise UserError(f"{name}: 'pool_probability' holds values outside [0, 1] (NaN included)")
    if on_path.size and (on_path.min() < -1 or on_path.max() >= pool):
        raise UserError(f"{name}: 'on_path_index' holds pool indices outside -1..{pool - 1}")
    _check_rows(name, seq, generated)
    run_id = z.get("run_id")
    return DraftScores(
        scores,
        on_path.astype(np.int32),
        seq.astype(np.int32),
        steps,
        topk,
        generated,
        "" if run_id is None or run_id.shape != () else str(run_id),
    )


def draft_scores_tau(
    scores: DraftScores, steps: int, topk: int, num_draft_tokens: int, *, name: str = "draft scores"
) -> tuple[float, float, int]:
    """SGLang's tokens per step for the triple, its standard error and the steps walked
    (`treeopt.dynamic_tree.dynamic_tau`), walked as `treeopt sglang-tau` walks its own pass of
    ``generated_tokens - steps`` new tokens: steps start only where every depth still has a
    label (docs/statistics.md#walked-tau). UserError for a triple the file cannot answer."""
    if topk != scores.topk:
        raise UserError(f"{name}: recorded for topk {scores.topk}, not {topk} (another topk drafts other beams)")
    if not 1 <= steps <= scores.steps_recorded:
        raise UserError(f"{name}: --steps {steps} is outside 1..{scores.steps_recorded} (the steps recorded)")
    new_tokens = scores.generated_tokens - steps
    if new_tokens < 2:
        raise UserError(
            f"{name}: {scores.generated_tokens} generated tokens per prompt leave fewer than 2 to walk "
            f"{steps} steps over (calibrate with --steps of at least {steps + 2})"
        )
    pool = sglang_pool_size(steps, topk)
    return dynamic_tau(
        scores.pool_probability[:, :pool],
        scores.on_path_index[:, :steps],
        scores.sequence_index,
        steps,
        topk,
        forced_draft_tokens(steps, topk, num_draft_tokens),
        start_rows=new_tokens - 1,
    )
