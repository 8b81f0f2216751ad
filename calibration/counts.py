"""Running calibration counts: per-rank hits, per-head positions, joint prefix counts and the
rank vectors themselves, added one batch of rank vectors at a time (docs/statistics.md, "Joint
statistics and rank vectors").

Rank vectors: (N, K) int, ``ranks[i, k]`` the exact rank of head k's label at row i, -1 where
head k has no label, a rank >= the width for a miss. The kept copy is capped at the width
(``width`` = miss) and stored as `rank_dtype(width)`; ``sequence`` (N,) int32 holds each row's
prompt index (docs/formats.md, "Rank-vector sidecar").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from treeopt.accuracy import joint_counts_from_ranks, rank_hits


def rank_dtype(width: int) -> np.dtype:
    """int16 for the kept rank vectors (values -1 .. width), int32 when width does not fit."""
    return np.dtype(np.int16 if width < np.iinfo(np.int16).max else np.int32)


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

    @classmethod
    def zeros(cls, num_heads: int, width: int, joint: bool = True) -> CalibrationCounts:
        return cls(np.zeros((num_heads, width), np.int64), np.zeros(num_heads, np.int64),
                   {} if joint else None)

    @property
    def width(self) -> int:
        return self.hits.shape[1]

    def add_ranks(self, ranks: np.ndarray, sequence: np.ndarray | None = None) -> None:
        """Add rank vectors (N, K): exact ranks >= 0, -1 where the head has no label. With
        `sequence` (N,) (each row's prompt index) the vectors are kept as well, capped at the
        width (module doc)."""
        ranks = np.asarray(ranks, np.int64)
        if ranks.size:
            batch = rank_hits(ranks, self.width)
            self.hits += batch.hits
            self.positions += batch.positions
            if self.joint is not None:
                for path, n in joint_counts_from_ranks(ranks, self.width).items():
                    self.joint[path] = self.joint.get(path, 0) + n
        if sequence is not None:
            self.rank_chunks.append(np.minimum(ranks, self.width).astype(rank_dtype(self.width)))
            self.sequence_chunks.append(np.asarray(sequence, np.int32))

    def rank_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(ranks (N, K), sequence (N,)) kept so far, in order (module doc for the encoding)."""
        num_heads = self.hits.shape[0]
        if len(self.rank_chunks) > 1:  # concatenate once, keep one chunk
            self.rank_chunks = [np.concatenate(self.rank_chunks)]
            self.sequence_chunks = [np.concatenate(self.sequence_chunks)]
        if not self.rank_chunks:
            return np.zeros((0, num_heads), rank_dtype(self.width)), np.zeros(0, np.int32)
        return self.rank_chunks[0], self.sequence_chunks[0]
