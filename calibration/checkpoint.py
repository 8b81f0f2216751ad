"""Calibration checkpoints: the counts so far, written atomically, and read back only for the
same inputs (docs/formats.md#calibration-checkpoint-treeoptcalibration-checkpointv1).

A checkpoint is one JSON object: ``format``, the ``fingerprint`` of the inputs and its
``fingerprint_sha256``, the counts (``hits``, ``positions``, ``joint``, ``prompts_done``,
``tokens``, ``generated``) and ``rank_vectors`` (``rows``, ``dtype`` and the ``ranks`` and
``sequence`` arrays as little-endian bytes, zlib-compressed, base64: compact and deterministic
in JSON), and with `treeopt calibrate --draft-scores` ``draft_pools`` (``shape`` [N, M, S] and
the ``scores`` and ``on_path`` arrays packed alike).
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from pathlib import Path

import numpy as np

from calibration.counts import CalibrationCounts
from treeopt.errors import UserError
from treeopt.fileio import read_json_input, write_json
from treeopt.resume import differences_text

__all__ = [
    "CHECKPOINT_FORMAT",
    "counts_from_json",
    "counts_to_json",
    "load_checkpoint",
    "run_id",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = "treeopt.calibration-checkpoint/v1"


def _pack(a: np.ndarray) -> str:
    raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def _unpack(text: str, dtype: np.dtype) -> np.ndarray:
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (ValueError, zlib.error, AttributeError) as err:
        raise ValueError(f"rank_vectors: damaged data ({err})") from None
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)


def counts_to_json(counts: CalibrationCounts) -> dict:
    """The counts as the JSON fields of a checkpoint (module doc)."""
    ranks, sequence = counts.rank_vectors()
    joint = None if counts.joint is None else [[list(k), v] for k, v in sorted(counts.joint.items())]
    pools = counts.draft_pools()
    # why only when recorded: the checkpoints and run_ids of runs without draft scores stay as they were
    extra = (
        {}
        if pools is None
        else {
            "draft_pools": {
                "shape": [*pools[0].shape, pools[1].shape[1]],
                "scores": _pack(pools[0]),
                "on_path": _pack(pools[1]),
            }
        }
    )
    return {
        "hits": counts.hits.tolist(),
        "positions": counts.positions.tolist(),
        "joint": joint,
        "prompts_done": counts.prompts_done,
        "tokens": counts.tokens,
        "generated": counts.generated,
        "rank_vectors": {
            "rows": int(ranks.shape[0]),
            "dtype": ranks.dtype.str,
            "ranks": _pack(ranks),
            "sequence": _pack(sequence),
        },
        **extra,
    }


def counts_from_json(doc: dict) -> CalibrationCounts:
    """The counts of a checkpoint's JSON fields; KeyError, TypeError or ValueError when damaged."""
    joint = doc.get("joint")
    hits = np.asarray(doc["hits"], np.int64).reshape(len(doc["positions"]), -1)
    vectors = doc["rank_vectors"]
    rows, num_heads = int(vectors["rows"]), hits.shape[0]
    ranks = _unpack(vectors["ranks"], np.dtype(vectors["dtype"])).reshape(rows, num_heads)
    sequence = _unpack(vectors["sequence"], np.dtype(np.int32))
    if sequence.shape != (rows,):
        raise ValueError(f"rank_vectors: {sequence.size} sequence ids for {rows} rows")
    counts = CalibrationCounts(
        hits,
        np.asarray(doc["positions"], np.int64),
        None if joint is None else {tuple(k): int(v) for k, v in joint},
        int(doc["prompts_done"]),
        int(doc["tokens"]),
        int(doc["generated"]),
    )
    if rows:
        counts.rank_chunks, counts.sequence_chunks = [ranks], [sequence]
    if "draft_pools" in doc:
        n, m, steps = (int(x) for x in doc["draft_pools"]["shape"])
        if n != rows:
            raise ValueError(f"draft_pools: {n} rows for {rows} rank vectors")
        scores = _unpack(doc["draft_pools"]["scores"], np.dtype(np.float32)).reshape(n, m)
        on_path = _unpack(doc["draft_pools"]["on_path"], np.dtype(np.int32)).reshape(n, steps)
        counts.pool_chunks = [(scores, on_path)] if n else []
    return counts


def _fingerprint_sha256(fingerprint: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


def run_id(fingerprint: dict, counts: CalibrationCounts) -> str:
    """The provenance key shared by an accuracy table and its rank-vector sidecar: the first
    16 hex digits of the sha256 of the inputs' fingerprint and the counts (in their checkpoint
    encoding, which is deterministic). Equal runs get equal ids; a table beside a sidecar of
    another run is told by the mismatch (docs/formats.md#output-safety)."""
    doc = {"fingerprint": fingerprint, **counts_to_json(counts)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def save_checkpoint(path: Path, fingerprint: dict, counts: CalibrationCounts) -> None:
    """Write the checkpoint atomically (`treeopt.fileio.write_json`)."""
    write_json(
        path,
        {
            "format": CHECKPOINT_FORMAT,
            "fingerprint": fingerprint,
            "fingerprint_sha256": _fingerprint_sha256(fingerprint),
            **counts_to_json(counts),
        },
        indent=None,
    )


def load_checkpoint(path: Path, fingerprint: dict) -> CalibrationCounts:
    """Read a checkpoint; UserError if unreadable, damaged or made from other inputs."""
    doc = read_json_input(path, "a calibration checkpoint")
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path}: not a calibration checkpoint ({CHECKPOINT_FORMAT})")
    theirs = doc.get("fingerprint") or {}
    if theirs != fingerprint:
        detail = differences_text(theirs, fingerprint) or "settings this treeopt no longer records"
        raise UserError(
            f"{path}: checkpoint was made with other inputs ({detail}); rerun without --resume to start over"
        )
    if "rank_vectors" not in doc:
        raise UserError(
            f"{path}: checkpoint of an older treeopt (no rank vectors); rerun without --resume to start over"
        )
    try:
        return counts_from_json(doc)
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: damaged calibration checkpoint ({err})") from None
