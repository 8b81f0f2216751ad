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

from calibration.batching import label_rows, pad_left
from calibration.drafters.base import Drafter
from treeopt.chain import ChainAcceptance
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

    def label_ranks(self, sequences, starts, *, pad_id: int = 0) -> np.ndarray:
        """`draft_label_ranks` of this draft (what `calibration.labels.label_ranks` returns)."""
        return draft_label_ranks(self, sequences, starts, pad_id=pad_id)

    @torch.inference_mode()
    def sequence_logits(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the draft over left-padded sequences, teacher-forced."""
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits


@torch.inference_mode()
def draft_label_ranks(
    drafter: DraftModel, sequences, starts, *, pad_id: int = 0, num_heads: int | None = None, batch: int = 16
) -> np.ndarray:
    """(N, K) ranks in `calibration.labels.label_rows` order: row (t, depth d) is the number of
    the draft's logits at position t + d + 1 strictly greater than that of the true x_{t+d+2}
    (ties in the label's favour, as `calibration.labels`), -1 where there is no label. One
    teacher-forced forward of the draft per `batch` sequences (docs/statistics.md, "Draft-model
    acceptance")."""
    k = drafter.num_heads if num_heads is None else num_heads
    per_position = _per_position(
        sequences,
        pad_id,
        drafter,
        batch,
        lambda ids, logits, _: (logits[:, :-1] > logits[:, :-1].gather(-1, ids[:, 1:, None])).sum(-1),
    )
    return _rows(sequences, starts, k, per_position, -1).astype(np.int64)


@torch.inference_mode()
def acceptance_alpha(
    target,
    drafter: DraftModel,
    sequences,
    starts,
    *,
    temperature: float,
    pad_id: int = 0,
    num_heads: int | None = None,
    batch: int = 16,
) -> np.ndarray:
    """(N, K) float64 in `label_rows` order: row (t, depth d) is alpha = sum_x min(p(x), q(x))
    of the target's and the draft's distributions of x_{t+d+2} at temperature T given the true
    prefix, NaN where there is no label. At T = 0 alpha is 1 exactly when both argmaxes agree
    (docs/statistics.md, "Draft-model acceptance")."""
    k = drafter.num_heads if num_heads is None else num_heads

    def alpha(ids, logits, mask):
        target_logits = target(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False
        ).logits
        p = probabilities(target_logits[:, :-1], temperature)
        q = probabilities(logits[:, :-1], temperature)
        return torch.minimum(p, q).sum(-1).double()

    per_position = _per_position(sequences, pad_id, drafter, batch, alpha)
    return _rows(sequences, starts, k, per_position, np.nan)


#: the sampling temperature calibration measures alpha at (the alpha sidecar, docs/formats.md)
ALPHA_TEMPERATURE = 1.0
#: prompts alpha is measured on: one forward of each model per prompt, no generation
ALPHA_MAX_PROMPTS = 256


def chain_acceptance(
    target, drafter: DraftModel, sequences, *, temperature: float = ALPHA_TEMPERATURE, pad_id: int = 0
) -> ChainAcceptance:
    """The per-depth alpha and walked tau of chains (`treeopt.chain.ChainAcceptance`) over
    `sequences` read from their first token (docs/statistics.md, "Draft-model acceptance")."""
    rows = acceptance_alpha(target, drafter, sequences, [0] * len(sequences), temperature=temperature, pad_id=pad_id)
    return ChainAcceptance.from_rows(rows, temperature)


def _per_position(sequences, pad_id, drafter, batch, value):
    """Per sequence, value(ids, draft logits, mask)[:, c] for columns c = 0 .. L - 2 of its
    own tokens (left padding removed), as float64 arrays."""
    device = next(drafter.model.parameters()).device
    out = []
    for start in range(0, len(sequences), batch):
        chunk = sequences[start : start + batch]
        ids, mask, pos = pad_left(chunk, pad_id, device)
        values = value(ids, drafter.sequence_logits(ids, mask, pos), mask).double().cpu().numpy()
        width = ids.shape[1]
        out.extend(values[i, width - len(s) :] for i, s in enumerate(chunk))
    return out


def _rows(sequences, starts, num_heads, per_position, fill) -> np.ndarray:
    seq, t, has = label_rows([len(s) for s in sequences], starts, num_heads)
    width = max((len(v) for v in per_position), default=0) + 1
    table = np.full((len(per_position), width), np.nan)
    for i, v in enumerate(per_position):  # loop over sequences
        table[i, : len(v)] = v
    return shift_rows(table, seq, t, has, fill)


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32; at T = 0 one-hot at the argmax (the greedy limit)."""
    if temperature <= 0:
        top = logits.argmax(-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top, 1.0)
    return torch.softmax(logits.float() / temperature, dim=-1)


def shift_rows(per_position: np.ndarray, seq: np.ndarray, col: np.ndarray, has: np.ndarray, fill):
    """(N, K) rows in `calibration.labels.label_rows` order from per-position values (B, T),
    column c = the distribution of x_{c+1}: row (t, depth d) takes position t + d + 1 (the
    distribution of x_{t+d+2}), `fill` where there is no label."""
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
