"""Running calibration counts: per-rank hits, per-head positions, joint prefix counts and the
rank vectors themselves, added one batch of rank vectors at a time
(docs/statistics.md#joint-statistics-and-rank-vectors).

Rank vectors: (N, K) int, ``ranks[i, k]`` the exact rank of head k's label at row i, -1 where
head k has no label, a rank >= the width for a miss. The kept copy is capped at the width
(``width`` = miss) and stored as `rank_dtype(width)`; ``sequence`` (N,) int32 holds each row's
prompt index (docs/formats.md#rank-vector-sidecar-nameranksnpz).

A batch is counted in two steps so that the counts and their progress marker move together
(docs/formats.md#calibration-checkpoint-treeoptcalibration-checkpointv1): `CalibrationCounts.batch_update` computes
everything a batch adds without touching the counts, and `CalibrationCounts.commit` applies
it, progress included, with no work left that can fail; the runner holds Ctrl-C back while it
runs, so a checkpoint never holds a batch's hits without the prompts that produced them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from treeopt.accuracy import joint_counts_from_ranks, rank_hits


def rank_dtype(width: int) -> np.dtype:
    """int16 for the kept rank vectors (values -1 .. width), int32 when width does not fit."""
    return np.dtype(np.int16 if width < np.iinfo(np.int16).max else np.int32)


@dataclass(frozen=True)
class BatchUpdate:
    """What one batch adds to the counts, computed before any of it is applied."""

    hits: np.ndarray  # (K, R) int64
    positions: np.ndarray  # (K,) int64
    joint: dict[tuple[int, ...], int] | None
    ranks: np.ndarray | None  # (n, K) capped rank vectors to keep, or None
    sequence: np.ndarray | None  # (n,) int32 prompt index of each kept row
    prompts_done: int  # the progress marker after this batch
    tokens: int  # teacher-forced tokens of the batch
    generated: int  # generated tokens of the batch
    # the drafter's own pool at each row (treeopt.draft_scores): (n, M) float32 scores and
    # (n, S) int32 on-path indices, or None when not recorded
    pool: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class CalibrationCounts:
    """Running counts: ``hits`` (K, R) int64, ``positions`` (K,) int64, ``joint`` path -> count
    (None: joint statistics not kept), ``prompts_done``, ``tokens`` (teacher-forced tokens,
    prompt + generation), ``generated`` (generated tokens), and the rank vectors so far
    (`rank_vectors`; kept when `add_ranks` is given sequence ids)."""

    hits: np.ndarray
    positions: np.ndarray
    joint: dict[tuple[int, ...], int] | None = field(default_factory=dict)
    prompts_done: int = 0
    tokens: int = 0
    generated: int = 0
    # chunks of capped rank vectors (n_i, K) and their sequence ids (n_i,), in order
    rank_chunks: list = field(default_factory=list)
    sequence_chunks: list = field(default_factory=list)
    # chunks of the drafter's pools (scores (n_i, M), on_path (n_i, S)), row for row with the ranks
    pool_chunks: list = field(default_factory=list)

    @classmethod
    def zeros(cls, num_heads: int, width: int, joint: bool = True) -> CalibrationCounts:
        return cls(np.zeros((num_heads, width), np.int64), np.zeros(num_heads, np.int64), {} if joint else None)

    @property
    def width(self) -> int:
        return self.hits.shape[1]

    def batch_update(
        self,
        ranks: np.ndarray,
        sequence: np.ndarray | None = None,
        *,
        prompts_done: int | None = None,
        tokens: int = 0,
        generated: int = 0,
        pool: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> BatchUpdate:
        """What adding rank vectors (N, K) would change (exact ranks >= 0, -1 where the head
        has no label), computed without changing the counts. With `sequence` (N,) (each row's
        prompt index) the vectors are kept as well, capped at the width (module doc).
        `prompts_done` is the progress after the batch (None: unchanged). `pool`: the
        drafter's pools at the same rows, kept with them (`draft_pools`)."""
        ranks = np.asarray(ranks, np.int64)
        K, width = self.hits.shape
        if ranks.size:
            batch = rank_hits(ranks, width)
            hits, positions = batch.hits.astype(np.int64), batch.positions.astype(np.int64)
            joint = joint_counts_from_ranks(ranks, width) if self.joint is not None else None
        else:
            hits, positions, joint = np.zeros((K, width), np.int64), np.zeros(K, np.int64), None
        kept = seq = None
        if sequence is not None:
            kept = np.minimum(ranks, width).astype(rank_dtype(width))
            seq = np.asarray(sequence, np.int32)
        return BatchUpdate(
            hits,
            positions,
            joint,
            kept,
            seq,
            self.prompts_done if prompts_done is None else int(prompts_done),
            int(tokens),
            int(generated),
            None if pool is None else (np.asarray(pool[0], np.float32), np.asarray(pool[1], np.int32)),
        )

    def commit(self, update: BatchUpdate) -> None:
        """Apply a `batch_update`: counts, kept rank vectors and progress. Nothing in it can
        fail on valid input, so with Ctrl-C held back it is all or nothing."""
        self.hits += update.hits
        self.positions += update.positions
        if self.joint is not None and update.joint is not None:
            self._merge_joint(update.joint)
        if update.ranks is not None:
            self.rank_chunks.append(update.ranks)
            self.sequence_chunks.append(update.sequence)
        if update.pool is not None:
            self.pool_chunks.append(update.pool)
        self.prompts_done = update.prompts_done
        self.tokens += update.tokens
        self.generated += update.generated

    def _merge_joint(self, joint: dict[tuple[int, ...], int]) -> None:
        for path, n in joint.items():
            self.joint[path] = self.joint.get(path, 0) + n

    def add_ranks(self, ranks: np.ndarray, sequence: np.ndarray | None = None) -> None:
        """Add rank vectors (N, K) at once (`batch_update` + `commit`), progress unchanged."""
        self.commit(self.batch_update(ranks, sequence))

    def rank_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(ranks (N, K), sequence (N,)) kept so far, in order (module doc for the encoding)."""
        num_heads = self.hits.shape[0]
        if len(self.rank_chunks) > 1:  # concatenate once, keep one chunk
            self.rank_chunks = [np.concatenate(self.rank_chunks)]
            self.sequence_chunks = [np.concatenate(self.sequence_chunks)]
        if not self.rank_chunks:
            return np.zeros((0, num_heads), rank_dtype(self.width)), np.zeros(0, np.int32)
        return self.rank_chunks[0], self.sequence_chunks[0]

    def draft_pools(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(scores (N, M) float32, on_path (N, S) int32) kept so far, row for row with
        `rank_vectors`; None when no pool was recorded."""
        if not self.pool_chunks:
            return None
        if len(self.pool_chunks) > 1:  # concatenate once, keep one chunk
            self.pool_chunks = [tuple(np.concatenate(part) for part in zip(*self.pool_chunks, strict=True))]
        return self.pool_chunks[0]
