"""A draft model: any transformers causal LM with the target's vocabulary, drafting with a KV
cache of its own (docs/decoder.md#draft-models; Leviathan et al. 2023).

`DraftModel` carries the drafter attributes the decoder and the calibration check (`kind`,
`sequential`, `num_heads` = the deepest depth it may draft, `vocab_size`); the drafting itself
runs in `calibration.speculative.SpeculativeDecoder`, which owns the draft's cache. Its
calibration statistics are teacher-forced over whole sequences in one forward of the draft
(docs/statistics.md#draft-model-acceptance):

- greedy verification: the rank of the true token x_{t+d+2} under the draft's logits at
  position t+d+1 (given the true prefix): the rank vectors every other drafter gives;
- rejection sampling: alpha at each position, the accepted mass sum_x min(p(x), q(x)) of the
  target's and the draft's distributions at temperature T, from which the expected tokens per
  step of a chain of any gamma follow (`chain_tau`); and for trees the positional acceptance
  a_j, the probability that the j-th child tried under recursive rejection sampling is the one
  kept (`positional_acceptance`, docs/statistics.md#positional-acceptance-of-a-tree).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM

from calibration.batching import label_rows, pad_left
from calibration.drafters.base import Drafter
from treeopt.chain import ChainAcceptance
from treeopt.errors import UserError, first_line
from treeopt.fileio import read_json_input

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
        files = check_weight_files(path)
        try:
            with warnings.catch_warnings():
                # why: torch's weights-only unpickler warns about a pickle protocol it may not
                # support before it loads or refuses the file; the outcome is told on its own
                # (one line for a refused file, docs/formats.md#output-safety), the warning only
                # adds lines
                warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
        except Exception as err:  # noqa: BLE001 - a damaged model file surfaces as any of torch's or safetensors' errors
            where = files[0] if len(files) == 1 else path
            raise UserError(f"{where}: cannot load the draft model ({first_line(err)})") from None
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


#: a transformers model directory's weights, one file or shards listed by an index, in the
#: order transformers looks for them
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def check_weight_files(path: Path) -> list[Path]:
    """The weight files of the model directory `path`, each safetensors file's header read: a
    UserError naming the file when one is missing, truncated or not safetensors."""
    # why before transformers: its errors name neither the file nor the directory, and a
    # truncated shard is otherwise found only after the other shards were read
    files: list[Path] = []
    for single in WEIGHT_FILES:
        index = path / f"{single}.index.json"
        if index.is_file():
            doc = read_json_input(index, "a weights index")
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise UserError(f"{index}: no 'weight_map' of file names (not a sharded-weights index)")
            files = [path / f for f in sorted(set(weight_map.values()))]
            break
        if (path / single).is_file():
            files = [path / single]
            break
    if not files:
        raise UserError(f"{path}: no weights ({' or '.join(WEIGHT_FILES)}, or their index)")
    for file in files:
        if not file.is_file():
            raise UserError(f"{file}: missing (named by the weights index)")
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt"):
                    pass
            except (SafetensorError, OSError) as err:
                raise UserError(f"{file}: cannot read ({first_line(err)})") from None
    return files


@torch.inference_mode()
def draft_label_ranks(
    drafter: DraftModel, sequences, starts, *, pad_id: int = 0, num_heads: int | None = None, batch: int = 16
) -> np.ndarray:
    """(N, K) ranks in `calibration.labels.label_rows` order: row (t, depth d) is the number of
    the draft's logits at position t + d + 1 strictly greater than that of the true x_{t+d+2}
    (ties in the label's favour, as `calibration.labels`), -1 where there is no label. One
    teacher-forced forward of the draft per `batch` sequences (docs/statistics.md#draft-model-acceptance)."""
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
    (docs/statistics.md#draft-model-acceptance)."""
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
#: children per node whose positional acceptance the alpha sidecar holds (docs/formats.md)
ACCEPT_CHILDREN = 4
#: draw orders sampled per position for the children after the first, and their seed: the
#: spread between positions, not the Monte Carlo, dominates the table's standard error over a
#: calibration set (docs/statistics.md#positional-acceptance-of-a-tree)
ACCEPT_SAMPLES = 4
ACCEPT_SEED = 0
#: elements (positions x vocabulary) the Monte Carlo of `positional_acceptance` holds at once
_CHUNK_ELEMENTS = 1 << 24


def positional_acceptance(
    p: torch.Tensor, q: torch.Tensor, children: int, *, samples: int = ACCEPT_SAMPLES, generator=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positional acceptance under recursive rejection sampling, for every position at once.

    p, q: (..., V) the target's and the draft's distributions at each position. Returns (mean,
    stderr), (..., children) float64 each: a_j = P(the j-th child drawn without replacement
    from q is the one kept), and the Monte Carlo standard error of its estimate (0 for j = 1).

    a_1 = sum_x min(p, q) exactly. For j >= 2, `samples` draw orders per position (Gumbel-top-k,
    as the decoder draws them) and, given an order c_1..c_K, the exact probability that c_j is
    the first kept: prod_{i<j} (1 - r_i) r_j with r_i = min(1, p_i(c_i) / q_i(c_i)), p_i and
    q_i the residuals after i - 1 rejections (Jeon et al. 2024, section 3): the acceptance
    draws are averaged out analytically, only the draw order is sampled
    (docs/statistics.md#positional-acceptance-of-a-tree)."""
    shape, vocab = p.shape[:-1], p.shape[-1]
    p2, q2 = p.reshape(-1, vocab).float(), q.reshape(-1, vocab).float()
    total = p2.new_zeros((p2.shape[0], children), dtype=torch.float64)
    squares = torch.zeros_like(total)
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    for start in range(0, p2.shape[0], step):  # chunks of positions, each chunk batched
        pc, qc = p2[start : start + step], q2[start : start + step]
        for _ in range(samples):
            order = draw_children(qc, children, 1.0, generator)
            w = _first_kept_given_order(pc, qc, order).double()
            total[start : start + step] += w
            squares[start : start + step] += w * w
    mean = total / samples
    var = (squares / samples - mean * mean).clamp(min=0) * samples / max(samples - 1, 1)
    stderr = (var / samples).sqrt()
    # why: the first child is a single draft from q, kept with probability sum min(p, q)
    # (Leviathan et al. 2023, section 3.1): exact, no sampling error
    mean[:, 0] = torch.minimum(p2, q2).sum(-1).double()
    stderr[:, 0] = 0.0
    return mean.reshape(*shape, children), stderr.reshape(*shape, children)


def _first_kept_given_order(p: torch.Tensor, q: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """(P, K): the probability that order[:, j] is the first child kept, given the draw order,
    under recursive rejection sampling (calibration.speculative.recursive_rejection)."""
    out = []
    reach = torch.ones(p.shape[0], dtype=p.dtype, device=p.device)
    for j in range(order.shape[1]):  # the siblings in draw order; each residual needs the last
        x = order[:, j : j + 1]
        p_x, q_x = p.gather(1, x)[:, 0], q.gather(1, x)[:, 0]
        kept = torch.where(q_x > 0, p_x / q_x.clamp(min=1e-30), torch.zeros_like(q_x)).clamp(max=1.0)
        out.append(reach * kept)
        reach = reach * (1.0 - kept)
        if j + 1 == order.shape[1]:
            break
        # why: after a rejection p <- norm(max(0, p - q)) and q loses the rejected child
        # (Jeon et al. 2024, section 3; docs/decoder.md#draft-models)
        residual = (p - q).clamp(min=0)
        p = residual / residual.sum(-1, keepdim=True).clamp(min=1e-30)
        q = q.scatter(1, x, 0.0)
        q = q / q.sum(-1, keepdim=True).clamp(min=1e-30)
    return torch.stack(out, 1)


@torch.inference_mode()
def acceptance_per_child(
    target,
    drafter: DraftModel,
    sequences,
    starts,
    *,
    temperature: float,
    children: int = ACCEPT_CHILDREN,
    samples: int = ACCEPT_SAMPLES,
    seed: int = ACCEPT_SEED,
    pad_id: int = 0,
    num_heads: int | None = None,
    batch: int = 16,
    on_batch=None,
) -> np.ndarray:
    """(N, K, children) float64 in `label_rows` order: row (t, depth d) holds the positional
    acceptance a_1..a_children (`positional_acceptance`) of the target's and the draft's
    distributions of x_{t+d+2} at temperature T given the true prefix, NaN where there is no
    label; [..., 0] is `acceptance_alpha` (docs/statistics.md#positional-acceptance-of-a-tree). The Monte Carlo uses
    one torch.Generator seeded with `seed`. `on_batch(n)` is called after each batch of n
    sequences (a progress bar's update)."""
    k = drafter.num_heads if num_heads is None else num_heads
    device = next(drafter.model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))

    def per_child(ids, logits, mask):
        target_logits = target(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False
        ).logits
        p = probabilities(target_logits[:, :-1], temperature)
        q = probabilities(logits[:, :-1], temperature)
        mean, _ = positional_acceptance(p, q, children, samples=samples, generator=generator)
        return mean

    per_position = _per_position(sequences, pad_id, drafter, batch, per_child, on_batch)
    return _rows(sequences, starts, k, per_position, np.nan)


def chain_acceptance(
    target,
    drafter: DraftModel,
    sequences,
    *,
    temperature: float = ALPHA_TEMPERATURE,
    pad_id: int = 0,
    children: int = ACCEPT_CHILDREN,
    samples: int = ACCEPT_SAMPLES,
    on_batch=None,
) -> ChainAcceptance:
    """The per-depth alpha and walked tau of chains, and the per-depth positional acceptance of
    `children` children for trees (`treeopt.chain.ChainAcceptance`), over `sequences` read from
    their first token (docs/statistics.md#draft-model-acceptance, "Positional acceptance of
    a tree"). `on_batch`: as `acceptance_per_child` takes it."""
    rows = acceptance_per_child(
        target,
        drafter,
        sequences,
        [0] * len(sequences),
        temperature=temperature,
        pad_id=pad_id,
        children=children,
        samples=samples,
        on_batch=on_batch,
    )
    return ChainAcceptance.from_rows(rows[..., 0], temperature, child_rows=rows, samples=samples)


def _per_position(sequences, pad_id, drafter, batch, value, on_batch=None):
    """Per sequence, value(ids, draft logits, mask)[:, c] for columns c = 0 .. L - 2 of its
    own tokens (left padding removed), as float64 arrays; `on_batch(n)` after each batch."""
    device = next(drafter.model.parameters()).device
    out = []
    for start in range(0, len(sequences), batch):
        chunk = sequences[start : start + batch]
        ids, mask, pos = pad_left(chunk, pad_id, device)
        values = value(ids, drafter.sequence_logits(ids, mask, pos), mask).double().cpu().numpy()
        width = ids.shape[1]
        out.extend(values[i, width - len(s) :] for i, s in enumerate(chunk))
        if on_batch is not None:
            on_batch(len(chunk))
    return out


def _rows(sequences, starts, num_heads, per_position, fill) -> np.ndarray:
    seq, t, has = label_rows([len(s) for s in sequences], starts, num_heads)
    width = max((len(v) for v in per_position), default=0) + 1
    extra = per_position[0].shape[1:] if per_position else ()
    table = np.full((len(per_position), width, *extra), np.nan)
    for i, v in enumerate(per_position):  # loop over sequences
        table[i, : len(v)] = v
    return shift_rows(table, seq, t, has, fill)


def draw_children(probs: torch.Tensor, k: int, temperature: float, generator=None) -> torch.Tensor:
    """k distinct tokens per row of `probs` (..., V): the top-k at temperature 0, else k draws
    without replacement from probs, in draw order (the decoder's draw,
    `calibration.speculative`, and the calibration's, `positional_acceptance`)."""
    if temperature <= 0:
        return probs.topk(k, dim=-1).indices
    # why: the Gumbel-top-k trick draws k items without replacement in draw order (Kool et al.
    # 2019, section 2), which recursive rejection sampling needs (docs/decoder.md#draft-models).
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32).clamp(min=1e-20)
    keys = torch.log(probs.clamp(min=1e-30)) - torch.log(-torch.log(u))
    keys = torch.where(probs > 0, keys, torch.full_like(keys, float("-inf")))
    return keys.topk(k, dim=-1).indices


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32; at T = 0 one-hot at the argmax (the greedy limit)."""
    if temperature <= 0:
        top = logits.argmax(-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top, 1.0)
    return torch.softmax(logits.float() / temperature, dim=-1)


def shift_rows(per_position: np.ndarray, seq: np.ndarray, col: np.ndarray, has: np.ndarray, fill):
    """(N, K, ...) rows in `calibration.labels.label_rows` order from per-position values
    (B, T, ...), column c = the distribution of x_{c+1}: row (t, depth d) takes position
    t + d + 1 (the distribution of x_{t+d+2}), `fill` where there is no label."""
    depth = np.arange(has.shape[1])
    cols = np.minimum(col[:, None] + depth[None] + 1, per_position.shape[1] - 1)
    labelled = has.reshape(has.shape + (1,) * (per_position.ndim - 2))
    return np.where(labelled, per_position[seq[:, None], cols], fill)


def chain_tau(alpha_rows: np.ndarray, gamma: int) -> float:
    """Expected tokens per step of a chain of `gamma` drafts under rejection sampling, walked
    along the calibration rows: mean over rows of 1 + sum_k prod_{j<k} alpha[row, j]
    (docs/statistics.md#draft-model-acceptance). `alpha_rows` (N, K >= gamma), rows with
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
