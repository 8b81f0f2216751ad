"""Batches of token sequences as calibration reads them: left padding, and the index of the
positions whose labels are counted (docs/statistics.md#labels). Shared by the label pass
(calibration.labels) and the drafters that rank labels themselves (a draft model)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["label_rows", "pad_left"]


def pad_left(seqs, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token lists -> input_ids, attention_mask, position_ids (B, T) on `device`."""
    lengths = [len(s) for s in seqs]
    width = max(lengths)
    ids = np.full((len(seqs), width), pad_id, np.int64)
    mask = np.zeros((len(seqs), width), np.int64)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = s
        mask[i, width - len(s) :] = 1
    ids_t = torch.from_numpy(ids).to(device)
    mask_t = torch.from_numpy(mask).to(device)
    pos_t = (mask_t.cumsum(-1) - 1).clamp_(min=0)
    return ids_t, mask_t, pos_t


def label_rows(lengths, starts, num_heads: int):
    """Index the counted positions of a batch of sequences.

    lengths[i] = L_i, starts[i] = first counted position. Rows are the positions
    t = start_i .. L_i - 3 (where head 0 has a label), sequence by sequence. Returns (seq, t)
    int64 arrays and the (N, K) bool matrix `has_label` (t + k + 2 <= L_i - 1).
    """
    lengths = np.asarray(lengths, np.int64)
    starts = np.asarray(starts, np.int64)
    nrows = np.maximum(lengths - 2 - starts, 0)
    seq = np.repeat(np.arange(len(lengths)), nrows)
    first = np.cumsum(nrows) - nrows
    t = starts[seq] + np.arange(int(nrows.sum())) - first[seq]
    has = (t[:, None] + np.arange(num_heads)[None, :] + 2) <= (lengths[seq] - 1)[:, None]
    return seq, t, has
