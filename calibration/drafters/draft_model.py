"""A draft model: any transformers causal LM with the target's vocabulary, drafting with a KV
cache of its own (docs/decoder.md, "Draft models"; Leviathan et al. 2023).

`DraftModel` carries the drafter attributes the decoder and the calibration check (`kind`,
`sequential`, `num_heads` = the deepest depth it may draft, `vocab_size`); the drafting itself
runs in `calibration.speculative.SpeculativeDecoder`, which owns the draft's cache. Its
calibration statistics are teacher-forced over whole sequences in one forward of the draft
(docs/statistics.md, "Draft-model acceptance"):

- greedy verification: the rank of the true token x_{t+d+2} under the draft's logits at
  position t+d+1 (given the true prefix): the rank vectors every other drafter gives;
- rejection sampling: alpha at each position, the accepted mass sum_x min(p(x), q(x)) of the
  target's and the draft's distributions at temperature T, from which the expected tokens per
  step of a chain of any gamma follow (`chain_tau`).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from calibration.drafters.base import Drafter
from treeopt.errors import UserError

#: the deepest depth a draft model drafts by default (a chain of gamma needs gamma)
DEFAULT_MAX_DEPTH = 16


class DraftModel(torch.nn.Module, Drafter):
    """A small causal LM as a drafter. ``model`` is the transformers model (eval mode)."""

    kind: ClassVar[str] = "draft-model"
    sequential: ClassVar[bool] = True

    def __init__(self, model, *, max_depth: int = DEFAULT_MAX_DEPTH):
        super().__init__()
        self.model = model
        self.num_heads = int(max_depth)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(model.config.hidden_size)

    @classmethod
    def from_pretrained(cls, path, *, device=None, dtype=None, max_depth: int = DEFAULT_MAX_DEPTH) -> DraftModel:
        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"{path}: no config.json (a draft model is a transformers causal LM directory)")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
        if device is not None:
            model = model.to(device)
        return cls(model.eval(), max_depth=max_depth)

    def begin(self, hidden, root):
        raise UserError("draft model: it drafts from a cache of its own (calibration.speculative)")

    @torch.inference_mode()
    def sequence_logits(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the draft over left-padded sequences, teacher-forced."""
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits


def shift_rows(per_position: np.ndarray, seq: np.ndarray, col: np.ndarray, has: np.ndarray, fill):
    """(N, K) rows in `calibration.labels.label_rows` order from per-position values
    (B, T): row (t, depth d) takes position t + d + 1 (the distribution of x_{t+d+2}), `fill`
    where there is no label."""
    depth = np.arange(has.shape[1])
    cols = np.minimum(col[:, None] + depth[None] + 1, per_position.shape[1] - 1)
    return np.where(has, per_position[seq[:, None], cols], fill)


def chain_tau(alpha_rows: np.ndarray, gamma: int) -> float:
    """Expected tokens per step of a chain of `gamma` drafts under rejection sampling, walked
    along the calibration rows: mean over rows of 1 + sum_k prod_{j<k} alpha[row, j]
    (docs/statistics.md, "Draft-model acceptance"). `alpha_rows` (N, K >= gamma), rows with
    all gamma depths."""
    if gamma == 0:
        return 1.0
    a = np.asarray(alpha_rows, np.float64)[:, :gamma]
    return float(1.0 + np.cumprod(a, axis=1).sum(1).mean())


def chain_tau_iid(alpha: float, gamma: int) -> float:
    """Leviathan et al. 2023, equation (1): (1 - alpha^(gamma+1)) / (1 - alpha) for i.i.d.
    acceptance alpha."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return float((1.0 - alpha ** (gamma + 1)) / (1.0 - alpha))
