"""The reference Medusa tree decoder: a static candidate tree, tree attention, greedy or typical
verification, over a transformers causal LM with its Medusa heads and a KV cache kept in one
preallocated buffer (docs/decoder.md).

One decoding step (`TreeDecoder.step`), for every sequence of the batch at once, vectorised
over the batch and the tree:

1. draft: Medusa heads (a drafter that ignores the path) run on the last accepted token's
   hidden state; their top-k fill Medusa's flat candidate vector ``[root, head 1 top-TOPK,
   head 2 top-TOPK, ...]`` and the tree tokens are ``flat[tree_indices]``. A sequential
   drafter (Hydra, MLP speculator: `calibration.drafters`) drafts depth by depth: at depth d
   it runs once on all nodes of depth d - 1 that have children, of all sequences together,
   and each node takes its children's ranks from its own top-k. The attention mask is
   ``[cache slots the sequence may see | tree ancestor mask]``, the position ids
   ``next position + depth``;
2. verify: one forward of the base model over the q = n + 1 tree tokens;
3. accept: greedy (a token equal to the base argmax at its parent, under an accepted parent)
   or typical (p(x) > min(eps, alpha * exp(-H(p))) at the parent); the longest accepted
   root-to-leaf path and the bonus token after it;
4. update: the cache keeps the step's root and accepted nodes, the sequences get their tokens,
   finished ones (eos, max_new_tokens) leave the batch.

Verification "candidates" (IBM's batch expansion) verifies the same tree as its leaves' root
paths instead: every sequence becomes n rows, one per leaf, each the root and its path against
its own copy of the context; the row with the longest accepted prefix is the tree form's
accepted path, and its new cache entries are written back (docs/decoder.md,
"Candidate-sequence verification").

Tokens emitted per step per sequence = accepted nodes + 1 (the bonus, which is the next root).
The first token comes from the prefill, so with the empty tree this is plain greedy decoding.

Batches: every sequence keeps its own validity mask over the cache slots and its own next
position id. A step keeps ``max(1 + accepted)`` slots for every sequence; a sequence that
accepted fewer leaves holes, masked out of its attention. Prompt padding is handled the same way.

GQA: with a custom mask and q > 1, transformers' sdpa path repeats the whole KV cache to all
query heads on every forward (docs/performance-model.md, "CPU facts"). On CPU the decoder sets
``TRANSFORMERS_SDPA_FORCE_GQA=1`` around its own forwards (torch's CPU sdpa then runs grouped
attention itself; exact, tested). On CUDA the masked GQA path of torch falls back to the math
kernel, so the library default stays there.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin

from calibration.drafters.base import select_rows
from treeopt.errors import UserError
from treeopt.forms import VERIFICATION_FORMS
from treeopt.tree import Tree, make_tree, tree_buffers

__all__ = [
    "DecodeResult",
    "DecodeState",
    "KVCache",
    "TreeDecoder",
    "cut_tree",
    "greedy_decode",
    "model_forward_hidden",
    "new_cache",
    "plain_step_forward",
]


# --------------------------------------------------------------------------------------------
# Results and state


@dataclass
class DecodeResult:
    """What one `TreeDecoder.generate` call produced.

    tokens:   new tokens per sequence, in input order (eos included if hit, nothing after; at
              most max_new_tokens). The first one comes from the prefill.
    accepted: (steps, b) int64, tokens a step produced per sequence = accepted nodes + 1 (the
              bonus), 0 for a sequence already finished. It is the verification outcome: on a
              sequence's last step it may exceed what was kept (see `emitted`).
    emitted:  (steps, b) int64, tokens actually appended to `tokens` per step (the step's
              accepted count cut at eos / max_new_tokens). ``1 + emitted.sum(0) == len(tokens)``.
    draft_s, verify_s, update_s: (steps,) wall seconds per step: candidate layout (head top-k,
              tree tokens, mask, positions); model work (the heads and the tree forward); the
              rest (acceptance, bonus, cache update, bookkeeping).
    prefill_s: wall seconds of the prefill (forward over the prompts, first token).
    """

    tokens: list[list[int]]
    accepted: np.ndarray
    draft_s: np.ndarray
    verify_s: np.ndarray
    update_s: np.ndarray
    prefill_s: float
    emitted: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    @property
    def steps(self) -> int:
        return int(self.accepted.shape[0])

    @property
    def tokens_per_step(self) -> float:
        """Mean of `accepted` over the (sequence, step) pairs where the sequence was active."""
        active = self.accepted > 0
        return float(self.accepted[active].mean()) if active.any() else float("nan")

    @property
    def step_s(self) -> np.ndarray:
        return self.draft_s + self.verify_s + self.update_s

    @property
    def non_model_share(self) -> float:
        """(draft + update) / step time, summed over steps."""
        total = float(self.step_s.sum())
        return float((self.draft_s.sum() + self.update_s.sum()) / total) if total > 0 else float("nan")

    def accepted_histogram(self) -> dict[int, int]:
        """{tokens per step: number of (sequence, step) pairs}, over active pairs."""
        values, counts = np.unique(self.accepted[self.accepted > 0], return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts)}


@dataclass
class DecodeState:
    """The decoder's state between steps, for the b sequences still active.

    cache:    `KVCache` holding C slots per sequence.
    valid:    (b, C) bool, cache slots each sequence may attend to (False = padding or hole).
    next_pos: (b,) int64, position id of the root token (number of valid slots).
    root:     (b,) int64, the next token (already emitted, not yet in the cache).
    hidden:   (b, h), the base model's last hidden state at the token that produced `root`:
              the heads draft the next step from it (Hydra++: the prefix layer's output there).
    rows:     (b,) int64, each active sequence's index in the caller's batch.
    draft_cache: Hydra++'s prefix-layer `KVCache` (one layer), slot for slot as `cache` (the
              same `valid`); None for other drafters.
    """

    cache: KVCache
    valid: torch.Tensor
    next_pos: torch.Tensor
    root: torch.Tensor
    hidden: torch.Tensor
    rows: torch.Tensor
    draft_cache: KVCache | None = None


# --------------------------------------------------------------------------------------------
# The KV cache: one buffer for all layers, updated by index


class _BufferLayer(CacheLayerMixin):
    """Layer `index` of a `KVCache`: the per-layer interface transformers' attention calls.
    Keys and values are views of the shared buffer, not tensors of their own."""

    is_sliding = False
    is_croppable = True
    is_compileable = False
    supports_early_init = False

    def __init__(self, cache: KVCache, index: int):
        # CacheLayerMixin.__init__ would store keys/values tensors: here they are views (below).
        self.cache, self.index = cache, index
        self.length = 0

    @property
    def is_initialized(self) -> bool:
        return self.cache.buffer is not None

    @property
    def keys(self) -> torch.Tensor | None:
        """(b, kv_heads, length, head_dim) view of the buffer."""
        buf = self.cache.buffer
        return None if buf is None else buf[self.index, 0, :, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        buf = self.cache.buffer
        return None if buf is None else buf[self.index, 1, :, :, : self.length]

    def lazy_initialization(self, key_states, value_states) -> None:
        self.cache.reserve(self.length + key_states.shape[-2], key_states)

    def update(self, key_states, value_states, *args, **kwargs):
        """Write the q new keys/values at this layer's length; return views of the filled
        slots, so attention costs O(length), not O(capacity)."""
        start, end = self.length, self.length + key_states.shape[-2]
        buf = self.cache.reserve(end, key_states)
        buf[self.index, 0, :, :, start:end] = key_states
        buf[self.index, 1, :, :, start:end] = value_states
        self.length = end
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1  # grows on demand

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop: expected a negative count of tokens to remove, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0


class KVCache(Cache):
    """A transformers `Cache` whose layers share one preallocated tensor, updated by index, as
    gpt-fast keeps its static cache and Medusa's reference code its KV buffer.

    buffer: (layers, 2, b, kv_heads, capacity, head_dim), keys at [:, 0] and values at [:, 1];
    slot s holds the same token in every layer. Allocated at the first write (batch, heads,
    head size, dtype and device from the keys written) with at least `capacity` slots; a write
    past the capacity doubles it (one copy). `crop(-n)` forgets the last n slots in O(1);
    `keep_slots` and `batch_select_indices` move entries of all layers in one indexing op.
    """

    def __init__(self, num_layers: int, capacity: int = 0):
        self.buffer: torch.Tensor | None = None
        self.min_capacity = int(capacity)
        super().__init__(layers=[_BufferLayer(self, i) for i in range(num_layers)])

    @property
    def length(self) -> int:
        """Filled slots per sequence (of layer 0; all layers agree between forwards)."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.shape[4])

    def reserve(self, slots: int, like: torch.Tensor) -> torch.Tensor:
        """The buffer, allocated (shaped like `like`, (b, kv_heads, *, head_dim)) or grown so
        that it holds at least `slots` slots."""
        if self.buffer is None:
            b, heads, _, head_dim = like.shape
            size = max(slots, self.min_capacity)
            self.buffer = like.new_empty((len(self.layers), 2, b, heads, size, head_dim))
        elif slots > self.capacity:
            shape = list(self.buffer.shape)
            shape[4] = max(slots, 2 * self.capacity)
            grown = self.buffer.new_empty(shape)
            filled = max(layer.length for layer in self.layers)
            grown[:, :, :, :, :filled] = self.buffer[:, :, :, :, :filled]
            self.buffer = grown
        return self.buffer

    def keep_slots(self, start: int, slots: torch.Tensor) -> None:
        """Per sequence, slot ``start + j`` takes the entries of slot ``slots[:, j]`` (slots
        (b, k) int64, any slots below the length) in every layer; the length becomes
        ``start + k``. One gather and one copy over the whole buffer: keeping a step's accepted
        path (docs/decoder.md, "KV cache handling"; Medusa's reference code does the same)."""
        n_layers, _, b, heads, _, head_dim = self.buffer.shape
        k = slots.shape[1]
        index = slots[None, None, :, None, :, None].expand(n_layers, 2, b, heads, k, head_dim)
        self.buffer[:, :, :, :, start : start + k] = torch.gather(self.buffer, 4, index)
        for layer in self.layers:
            layer.length = start + k

    def expanded(self, repeats: int, extra: int, scratch: KVCache | None = None) -> KVCache:
        """A cache in which rows ``i * repeats .. i * repeats + repeats - 1`` each hold a copy of
        sequence i's filled slots, with room for `extra` more slots per row: one copy over the
        whole buffer. Batch expansion gives every candidate sequence its own context
        (docs/decoder.md, "Candidate-sequence verification").

        `scratch`: a cache returned by an earlier call, whose buffer is reused when it has the
        rows and room (else replaced, its slots doubled as `reserve` does), as an engine reuses
        its preallocated blocks: a fresh allocation per step would add the page faults of
        touching new memory to the copy (docs/decoder.md, "Candidate-sequence verification")."""
        n_layers, two, b, heads, _, head_dim = self.buffer.shape
        filled = self.length
        out = scratch if scratch is not None else KVCache(len(self.layers))
        rows_shape = (n_layers, two, b * repeats, heads)
        old = out.buffer
        same_rows = old is not None and tuple(old.shape[:4]) == rows_shape and old.dtype == self.buffer.dtype
        if not same_rows or old.shape[4] < filled + extra or old.device != self.buffer.device:
            slots = max(filled + extra, 2 * old.shape[4] if same_rows else 0)
            out.buffer = self.buffer.new_empty((*rows_shape, slots, head_dim))
        capacity = out.buffer.shape[4]
        rows = out.buffer.view(n_layers, two, b, repeats, heads, capacity, head_dim)
        rows[..., :filled, :] = self.buffer[:, :, :, None, :, :filled]
        for layer in out.layers:
            layer.length = filled
        return out

    def take_rows(self, source: KVCache, rows: torch.Tensor, count: int) -> None:
        """Per sequence i, the `count` slots after the filled ones take the entries of `source`'s
        row ``rows[i]`` at the same slots (rows (b,) int64), in every layer; the length grows
        by `count`. Writes a chosen candidate's new entries back (docs/decoder.md,
        "Candidate-sequence verification")."""
        start = self.length
        self.reserve(start + count, source.buffer[0, 0])
        self.buffer[:, :, :, :, start : start + count] = source.buffer[:, :, rows, :, start : start + count]
        for layer in self.layers:
            layer.length = start + count

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the sequences `indices` (the cache's batch order), all layers at once."""
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(2, indices.to(self.buffer.device))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def _text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def new_cache(model, capacity: int = 0) -> KVCache:
    """An empty `KVCache` for `model` (full-attention layers), holding `capacity` slots per
    sequence without reallocating (0: as many as the first forward writes, then doubling).
    Pass it as `past_key_values` to the model's forward; batch, heads, dtype and device come
    from the first keys written."""
    return KVCache(int(_text_config(model).num_hidden_layers), capacity)


# --------------------------------------------------------------------------------------------
# Helpers


def cut_tree(tree: Tree, num_heads: int, topk: int) -> Tree:
    """The nodes of `tree` with depth <= num_heads and every rank < topk (a tree again: the
    kept set is closed under prefixes), in the same insertion order."""
    keep = [p for p in tree.paths if len(p) <= num_heads and max(p) < topk]
    return make_tree(keep, allow_empty=True, source=tree.name)


@contextlib.contextmanager
def force_sdpa_gqa(enabled: bool):
    """Set TRANSFORMERS_SDPA_FORCE_GQA=1 for the duration (transformers reads it per call)."""
    if not enabled:
        yield
        return
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def uses_gqa(model) -> bool:
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    return heads is not None and kv < heads


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim, first maximum on ties (torch's rule). On CPU torch's argmax is
    not vectorised (~0.45 ms for 65 x 4096 floats, 5% of a demo-model step); numpy's is (20 us)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64, torch.float16):
        return torch.from_numpy(np.ascontiguousarray(x.numpy().argmax(-1)))
    return x.argmax(-1)


def _softcap(model, logits: torch.Tensor) -> torch.Tensor:
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def model_forward_hidden(model, input_ids, *, attention_mask, position_ids, cache):
    """The base model's last hidden states (b, q, h) (after the final norm), appending the q
    tokens' keys and values to `cache` (None: no cache). `attention_mask` is 4D additive
    (b, 1, q, C + q), 2D (b, C + q) or None; `position_ids` (b, q)."""
    out = model.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=cache is not None,
    )
    return out.last_hidden_state


def _lm_head(model, hidden: torch.Tensor) -> torch.Tensor:
    return _softcap(model, model.get_output_embeddings()(hidden))


def _run_heads(heads, hidden: torch.Tensor, num: int) -> torch.Tensor:
    """The first `num` heads on hidden (..., h) -> (num, ..., V)."""
    if num == 0:
        return hidden.new_zeros((0, *hidden.shape[:-1], heads.vocab_size))
    return torch.stack([heads[k](hidden) for k in range(num)])


def _longest_accepted(on_path: torch.Tensor, loglik: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen path of a verification: on_path (b, L, D + 1) bool, whether each position of
    each root-to-leaf path (or candidate sequence) passed the acceptance rule (False past the
    path's end); loglik (b, L, D + 1) the log-probability of each position's token (typical
    acceptance) or None (greedy). A path is accepted up to its first rejected position.
    Returns (best (b,) the path kept, n_keep (b,) its accepted length, root included)."""
    accepted = on_path.long().cumprod(-1)
    lengths = accepted.sum(-1)  # (b, L), root included
    n_keep = lengths.max(-1).values
    if loglik is None:
        return lengths.argmax(-1), n_keep  # the first longest path, as Medusa's reference code
    # why: Medusa's reference code takes, among the longest, the most likely path.
    counted = accepted.bool()
    counted[..., 0] = False  # the root's own probability does not count
    path_ll = torch.where(counted, loglik, 0.0).sum(-1)
    path_ll = path_ll.masked_fill(lengths != n_keep[:, None], float("-inf"))
    return path_ll.argmax(-1), n_keep


_DRAFT_UNITS = {
    "medusa": "Medusa heads",
    "hydra": "Hydra heads",
    "mlp-speculator": "MLP speculator stages",
    "draft-model": "draft-model depths",
}


@dataclass(frozen=True)
class _DraftLevel:
    """One depth of sequential drafting (tensors on the decoder's device).

    nodes:       (n,) tree indices of the nodes of this depth, in tree order.
    parents:     how many nodes of the previous depth have children (the drafter's rows per
                 sequence).
    parent_slot: (n,) each node's parent's index among those rows.
    rank:        (n,) each node's rank among its parent's children.
    width:       1 + the largest rank (the top-k the drafter's logits are cut to).
    expand:      indices into `nodes` of the nodes that have children themselves.
    """

    nodes: torch.Tensor
    parents: int
    parent_slot: torch.Tensor
    rank: torch.Tensor
    width: int
    expand: torch.Tensor


def _draft_levels(depth: np.ndarray, parent: np.ndarray, rank: np.ndarray, to_device) -> list[_DraftLevel]:
    """The levels of sequential drafting of a tree given per node (tree order, root = 0) its
    depth, parent (-1 for the root) and rank."""
    has_children = np.zeros(len(depth), bool)
    has_children[parent[parent >= 0]] = True
    levels = []
    for d in range(1, int(depth.max()) + 1 if len(depth) > 1 else 1):
        nodes = np.flatnonzero(depth == d)
        expanded_above = np.flatnonzero((depth == d - 1) & has_children)
        slot = np.searchsorted(expanded_above, parent[nodes])
        levels.append(
            _DraftLevel(
                to_device(nodes),
                len(expanded_above),
                to_device(slot),
                to_device(rank[nodes]),
                int(rank[nodes].max()) + 1,
                to_device(np.flatnonzero(has_children[nodes])),
            )
        )
    return levels


def eos_set(eos_token_id) -> frozenset[int]:
    """None | int | iterable of ints -> the set of end-of-sequence token ids."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset([int(eos_token_id)])
    return frozenset(int(t) for t in eos_token_id)


def _check_full_attention(model) -> None:
    types = getattr(_text_config(model), "layer_types", None) or []
    other = sorted({t for t in types if t != "full_attention"})
    if other:
        raise UserError(
            f"model: layer types {other} are not supported by the reference tree decoder (full attention only)"
        )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True = may attend) -> additive float mask: 0 / dtype's most negative value (the
    value transformers itself uses: exact zeros after softmax, no NaN for a row that sees at
    least one slot)."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(mask, zero, neg)


def check_inputs(input_ids, attention_mask):
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise UserError("input_ids: expected a (batch, length) tensor with length >= 1")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        if attention_mask.shape != input_ids.shape:
            raise UserError(
                f"attention_mask: shape {tuple(attention_mask.shape)} differs from input_ids {tuple(input_ids.shape)}"
            )
        attention_mask = attention_mask.to(device=input_ids.device, dtype=torch.bool)
    if not bool(attention_mask.any(-1).all()):
        raise UserError("attention_mask: a sequence has no unmasked token")
    return attention_mask


class PhaseClock:
    """Wall seconds per phase ("prefill", "draft", "verify", "update"), summed over the times
    a phase is entered; ``with clock("verify"): ...``. Disabled: no clock reads and no CUDA
    synchronisation. On CUDA every read synchronises, so a phase owns the kernels it queued."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = enabled
        self.cuda = device if device.type == "cuda" else None
        self.seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "update": 0.0}
        self._phase, self._t0 = "", 0.0

    def _now(self) -> float:
        if self.cuda is not None:
            torch.cuda.synchronize(self.cuda)
        return time.perf_counter()

    def __call__(self, phase: str) -> PhaseClock:
        self._phase = phase
        return self

    def __enter__(self) -> None:
        if self.enabled:
            self._t0 = self._now()

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.seconds[self._phase] += self._now() - self._t0

    def lap(self) -> dict[str, float]:
        """The seconds so far, then zero."""
        out = dict(self.seconds)
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        return out


# --------------------------------------------------------------------------------------------
# The plain reference


@torch.inference_mode()
def greedy_decode(
    model, input_ids, attention_mask=None, *, max_new_tokens: int, eos_token_id: int | list[int] | None = None
) -> list[list[int]]:
    """Plain cached greedy decoding (the reference the tree decoder must reproduce), through
    the model's ordinary forward with a 2D padding mask and the library's own `DynamicCache`:
    one token per step for every sequence. Returns the new tokens per sequence (eos included
    if hit, nothing after)."""
    eos = eos_set(eos_token_id)
    device = _model_device(model)
    input_ids = input_ids.to(device)
    mask = check_inputs(input_ids, attention_mask).long()
    b = input_ids.shape[0]
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    if max_new_tokens <= 0:
        return out
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
    ).logits[:, -1]
    next_pos = positions[:, -1:] + 1
    for step in range(max_new_tokens):
        token = logits.argmax(-1)
        for i, t in enumerate(token.tolist()):
            if not done[i]:
                out[i].append(t)
                done[i] = t in eos or len(out[i]) >= max_new_tokens
        if all(done) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones((b, 1))], dim=1)
        logits = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache, use_cache=True
        ).logits[:, -1]
        next_pos = next_pos + 1
    return out


@torch.inference_mode()
def plain_step_forward(model, heads, cache, input_ids, attention_mask, position_ids, *, num_heads: int | None = None):
    """One plain decoding step (q = 1) with the Medusa heads: the work T(0) of decoding
    without speculation (plus the heads, which a Medusa deployment runs anyway).

    cache:          a cache (`new_cache`) holding C slots per sequence; ONE slot is appended
                    (``cache.crop(-1)`` undoes it, e.g. between timing repeats).
    input_ids:      (b, 1) int64, the token to feed.
    attention_mask: (b, C + 1) 2D padding mask (1 = real token), the library's ordinary path.
    position_ids:   (b, 1) int64, the token's position.
    num_heads:      heads to run (default all; 0 = base model only).
    Returns (logits (b, 1, V), head logits (num_heads, b, 1, V)).
    """
    num = heads.num_heads if num_heads is None else num_heads
    if num and getattr(heads, "sequential", False):
        raise UserError("plain_step_forward: a sequential drafter needs a path to draft from; pass num_heads=0")
    hidden = model_forward_hidden(
        model, input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache
    )
    return _lm_head(model, hidden), _run_heads(heads, hidden, num)


# --------------------------------------------------------------------------------------------
# The tree decoder


def emit_roots(out, roots, max_new_tokens: int, eos) -> list:
    """The prefill's first token of every sequence into its output; which ones are finished."""
    finished = []
    for i, tok in enumerate(roots.tolist()):
        out[i].append(tok)
        finished.append(tok in eos or max_new_tokens <= 1)
    return finished


def generation_loop(step, live_rows, drop_finished, out, batch: int, max_new_tokens: int, eos, clock) -> DecodeResult:
    """Step until every sequence has finished, emitting each step's tokens (`emit_tokens`) and
    timing its phases; `clock` has just timed the prefill. Shared by every decoder: `step()`
    returns (new tokens (b_live, q), tokens to keep (b_live,)), `live_rows()` the input index of
    each live sequence, `drop_finished(flags)` removes the finished ones from the state."""
    prefill_s = clock.lap()["prefill"]
    accepted, emitted, seconds = [], [], []
    while live_rows().numel():
        new, n_keep = step()
        with clock("update"):
            acc_row, emi_row, finished = emit_tokens(out, live_rows(), n_keep, new, batch, max_new_tokens, eos)
            drop_finished(finished)
        accepted.append(acc_row)
        emitted.append(emi_row)
        seconds.append(clock.lap())

    def col(phase):
        return np.array([s[phase] for s in seconds])

    return DecodeResult(
        out,
        np.array(accepted, np.int64).reshape(-1, batch),
        col("draft"),
        col("verify"),
        col("update"),
        prefill_s,
        np.array(emitted, np.int64).reshape(-1, batch),
    )


def emit_tokens(out, rows, n_keep, new, batch: int, max_new_tokens: int, eos) -> tuple[np.ndarray, np.ndarray, list]:
    """Append each live sequence's new tokens to its output (`out[i]`, in input order), cut at
    the first eos and at max_new_tokens. Returns the step's accepted and emitted counts per
    input sequence, (batch,) each, and whether each live sequence (in `rows` order) finished.
    A loop over sequences, not tree nodes: each one's cut is its own."""
    accepted, emitted = np.zeros(batch, np.int64), np.zeros(batch, np.int64)
    finished = []
    for i, count, toks in zip(rows.tolist(), n_keep.tolist(), new.tolist(), strict=True):
        take = toks[:count][: max_new_tokens - len(out[i])]
        stop = next((p for p, tok in enumerate(take) if tok in eos), None)
        if stop is not None:
            take = take[: stop + 1]
        out[i].extend(take)
        accepted[i], emitted[i] = count, len(take)
        finished.append(stop is not None or len(out[i]) >= max_new_tokens)
    return accepted, emitted, finished


class TreeDecoder:
    """Medusa tree decoding with `model` (a transformers causal LM, eval mode) and `heads`
    (`MedusaHeads` on the same device and dtype) over the static `tree`, candidates from the
    heads' top-`topk`. See the module docstring for the algorithm.

    `timing=True` records per-step wall times of the phases (synchronising CUDA devices before
    each clock read); with False the times are zeros and nothing is synchronised.
    `verification`: "tree" (one sequence of q tokens under the tree mask) or "candidates" (the
    tree's leaves' root paths as candidate sequences, docs/decoder.md "Candidate-sequence
    verification"); both accept the same tokens.
    """

    def __init__(self, model, heads, tree: Tree, *, topk: int = 10, timing: bool = True, verification: str = "tree"):
        if verification not in VERIFICATION_FORMS:
            raise UserError(f"verification: must be one of {', '.join(VERIFICATION_FORMS)}, got {verification!r}")
        if tree.depth > heads.num_heads:
            what = _DRAFT_UNITS.get(getattr(heads, "kind", "medusa"), "draft heads")
            raise UserError(
                f"{tree.name}: depth {tree.depth} needs {tree.depth} {what}, "
                f"the drafter has {heads.num_heads} (cut the tree with cut_tree)"
            )
        vocab = model.get_output_embeddings().weight.shape[0]
        if heads.vocab_size != vocab:
            raise UserError(f"heads: vocabulary {heads.vocab_size}, the model's is {vocab}")
        if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= vocab:
            raise UserError(f"topk: must be an integer in 1..{vocab}, got {topk!r}")
        _check_full_attention(model)
        buf = tree_buffers(tree, topk)  # validates ranks < topk
        self.model, self.heads, self.tree, self.topk, self.timing = model, heads, tree, topk, timing
        self.device = _model_device(model)
        self.dtype = model.get_output_embeddings().weight.dtype
        self.q = tree.size + 1
        self.num_draft_heads = tree.depth  # the heads the tree uses
        self.buffers = buf

        def t(a):
            return torch.from_numpy(np.array(a, copy=True)).to(self.device)

        self.tree_mask_add = additive_mask(t(buf.attention_mask), self.dtype)[None, None]  # (1, 1, q, q)
        self.depth = t(buf.depth)  # (q,)
        self.tree_indices = t(buf.tree_indices)  # (q,)
        self.parent = t(np.maximum(buf.parent, 0))  # root -> itself
        ri = buf.retrieve_indices
        self.retrieve = t(np.maximum(ri, 0))  # (L, D + 1)
        self.retrieve_valid = t(ri >= 0)
        # Only the ranks the tree uses need sorting out of each head's logits; the flat layout
        # keeps Medusa's stride `topk` (docs/trees.md, "Medusa buffers").
        self.topk_used = 1 + max((p[-1] for p in tree.paths), default=-1)
        self.force_gqa = self.device.type == "cpu" and uses_gqa(model)
        self.verification = verification
        self.candidates = int(ri.shape[0])  # one candidate sequence per leaf
        length = ri.shape[1]  # root + the deepest path
        self.candidate_mask_add = additive_mask(t(np.tri(length, dtype=bool)), self.dtype)[None, None]
        self.candidate_depth = torch.arange(length, device=self.device)
        self._expansion: KVCache | None = None  # the candidate rows' cache, reused step to step
        self.sequential = bool(getattr(heads, "sequential", False))
        self.prefix_layer = bool(getattr(heads, "prefix_layer", False))
        self.levels = (
            _draft_levels(buf.depth, buf.parent, np.array([0, *(p[-1] for p in tree.sorted_paths)]), t)
            if self.sequential
            else []
        )

    # ---- the pieces of a step --------------------------------------------------------------

    def _forward(self, cache, tokens, mask, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """(base logits (b, q, V), last hidden states (b, q, h)) of tokens (b, q) appended to
        `cache`."""
        with force_sdpa_gqa(self.force_gqa):
            hidden = model_forward_hidden(self.model, tokens, attention_mask=mask, position_ids=positions, cache=cache)
        return _lm_head(self.model, hidden), hidden

    def _pick(self, logits, temperature, generator):
        """Argmax (temperature 0) or a sample from softmax(logits / T); logits (b, V)."""
        if temperature <= 0:
            return _argmax(logits)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    @torch.inference_mode()
    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask=None,
        *,
        capacity: int = 0,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> DecodeState:
        """Run the prompts (b, L) through the model (padding anywhere, where attention_mask
        is 0) into a fresh cache of at least `capacity` slots and return the state whose
        `root` is each sequence's first new token."""
        input_ids = input_ids.to(self.device)
        valid = check_inputs(input_ids, attention_mask)
        b, length = input_ids.shape
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        ar = torch.arange(length, device=self.device)
        causal = ar[None, :] <= ar[:, None]  # (L, L)
        # A padding row sees itself only: its output is unused, but must not be NaN (it would
        # poison the keys and values of the next layers' padding slots).
        mask = (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=self.device)
        cache = new_cache(self.model, max(capacity, length))
        mask = additive_mask(mask, self.dtype)[:, None]
        with force_sdpa_gqa(self.force_gqa):
            hidden = model_forward_hidden(
                self.model, input_ids, attention_mask=mask, position_ids=positions, cache=cache
            )
        last = length - 1 - valid.flip(-1).long().argmax(-1)  # index of each row's last real token
        rows = torch.arange(b, device=self.device)
        h_last = hidden[rows, last]  # (b, h)
        draft_cache, draft_hidden = None, h_last
        if self.prefix_layer:
            # why: Hydra++'s prefix layer reads the whole prompt into a cache of its own
            # (docs/decoder.md, "Hydra++")
            draft_cache = KVCache(1, max(capacity, length))
            draft_hidden = self.heads.context_states(hidden, valid, positions, cache=draft_cache)[rows, last]
        return DecodeState(
            cache=cache,
            valid=valid,
            next_pos=valid.sum(-1),
            root=self._pick(_lm_head(self.model, h_last), temperature, generator),
            hidden=draft_hidden,
            rows=rows,
            draft_cache=draft_cache,
        )

    def step_mask(self, valid: torch.Tensor) -> torch.Tensor:
        """The 4D additive mask (b, 1, q, C + q) of a step: row i sees the cache slots its
        sequence may see (`valid` (b, C)) and its tree ancestors and itself."""
        b, c = valid.shape
        return torch.cat(
            [
                additive_mask(valid, self.dtype)[:, None, None, :].expand(b, 1, self.q, c),
                self.tree_mask_add.expand(b, 1, self.q, self.q),
            ],
            dim=-1,
        )

    def layout(self, valid: torch.Tensor, next_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The 4D additive mask and the position ids of a step's verification forward, given the
        sequences' cache validity (b, C) and root positions (b,). Tree: (b, 1, q, C + q) and
        (b, q). Candidates: (b n, 1, D + 1, C + D + 1) and (b n, D + 1), row i n + j the j-th
        leaf's path of sequence i, causal over its own tokens."""
        if self.verification == "tree":
            return self.step_mask(valid), next_pos[:, None] + self.depth[None]
        n, length = self.candidates, self.candidate_depth.shape[0]
        rows_valid = valid.repeat_interleave(n, dim=0)
        mask = torch.cat(
            [
                additive_mask(rows_valid, self.dtype)[:, None, None, :].expand(-1, 1, length, -1),
                self.candidate_mask_add.expand(rows_valid.shape[0], 1, length, length),
            ],
            dim=-1,
        )
        return mask, next_pos.repeat_interleave(n)[:, None] + self.candidate_depth[None]

    def _forward_candidates(self, cache, tree_tokens, mask, positions):
        """Batch expansion (docs/decoder.md, "Candidate-sequence verification"): the context of
        each sequence copied to its n candidate rows, one forward over the rows' root-to-leaf
        tokens. Returns (base logits (b, n, D + 1, V), hidden states (b, n, D + 1, h), the
        expanded cache holding the rows' new entries); `cache` itself is not written.
        A path shorter than the deepest is padded at its end (with the root token): the causal
        mask keeps the padding out of the path's own attention, and acceptance ignores it."""
        b = tree_tokens.shape[0]
        rows = tree_tokens[:, self.retrieve].reshape(b * self.candidates, -1)  # (b n, D + 1)
        expanded = cache.expanded(self.candidates, rows.shape[1], self._expansion)
        self._expansion = expanded
        logits, hidden = self._forward(expanded, rows, mask, positions)
        return (
            logits.view(b, self.candidates, *logits.shape[1:]),
            hidden.view(b, self.candidates, *hidden.shape[1:]),
            expanded,
        )

    def draft_sequential(self, hidden: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """The tree tokens (b, q) a sequential drafter drafts from `hidden` (b, h), the base
        model's hidden state at the token that produced `root` (b,): depth by depth, one
        drafter call per depth on the nodes of the previous depth that have children, of all
        sequences together (docs/decoder.md, "Drafters")."""
        b = root.shape[0]
        tokens = root.new_zeros((b, self.q))
        tokens[:, 0] = root
        state = self.heads.begin(hidden, root)  # one row per sequence: the root
        for d, level in enumerate(self.levels):
            logits, carry = self.heads.depth_logits(state, d)  # rows (sequence, expanded node)
            top = logits.topk(level.width, dim=-1).indices.view(b, level.parents, level.width)
            children = top[:, level.parent_slot, level.rank]  # (b, nodes of depth d + 1)
            tokens[:, level.nodes] = children
            if level.expand.numel():
                rows = (
                    torch.arange(b, device=self.device)[:, None] * level.parents + level.parent_slot[level.expand][None]
                ).reshape(-1)
                state = self.heads.child_state(select_rows(carry, rows), d, children[:, level.expand].reshape(-1))
        return tokens

    def draft(self, state: DecodeState, head_logits: torch.Tensor):
        """The candidate tree from the heads' logits (D, b, V) at the token that produced the
        root: (tree tokens (b, q), 4D additive mask (b, 1, q, C + q), position ids (b, q))."""
        b = state.root.shape[0]
        parts = [state.root[:, None]]
        if self.num_draft_heads:
            top = head_logits.topk(self.topk_used, dim=-1).indices  # (D, b, r)
            if self.topk_used < self.topk:
                top = torch.nn.functional.pad(top, (0, self.topk - self.topk_used))
            parts.append(top.permute(1, 0, 2).reshape(b, -1))
        flat = torch.cat(parts, dim=1)  # (b, 1 + D * topk): [root, head 1 top-k, head 2 top-k, ...]
        tokens = flat[:, self.tree_indices]
        # why: tree attention, Medusa paper section 2.1.2: a node attends to the context and its
        # ancestors only and sits at position root + depth, so every node's logits are those of
        # a causal run of its root-to-node path (docs/decoder.md, "step").
        return tokens, *self.layout(state.valid, state.next_pos)

    @torch.inference_mode()
    def verify_forward(self, cache, tree_tokens, cache_valid, positions):
        """Exactly the model work of one decoding step: the tree forward over `tree_tokens`
        (b, q) against `cache`, the base lm_head on all q tokens, the heads the tree uses on
        one token per sequence (the root here; a step runs them at its last accepted token:
        the same cost).

        cache:       `KVCache` with C slots per sequence; the q tree tokens are APPENDED
                     (``cache.crop(-q)`` undoes it, e.g. between timing repeats).
        cache_valid: (b, C) bool, the cache slots each sequence may attend to.
        positions:   (b,) int64, each sequence's root position (its number of valid slots).
        Returns (base logits (b, q, V), head logits (D, b, 1, V)), D = the tree's depth; for a
        sequential drafter the second item is the tree it drafts from the root (b, q). Hydra++'s
        prefix layer runs too, on one token over a stand-in cache of C entries (undone after).

        Verification "candidates": the context copied to the n candidate rows of each sequence
        and one forward over the rows (`_forward_candidates`); nothing is appended to `cache`
        (`verify_appends` is 0), and the base logits are per row, (b, n, D + 1, V): row j is
        the j-th leaf's root path (`tree_buffers(...).retrieve_indices[j]`), padded at its end.
        """
        mask, position_ids = self.layout(cache_valid, positions)
        if self.verification == "tree":
            logits, hidden = self._forward(cache, tree_tokens, mask, position_ids)
        else:
            logits, hidden, _ = self._forward_candidates(cache, tree_tokens, mask, position_ids)
            hidden = hidden[:, 0]  # every row starts at the root
        if self.prefix_layer:
            draft_cache = self._stand_in_draft_cache(cache_valid.shape[0], cache_valid.shape[1])
            root_hidden = self.heads.context_states(
                hidden[:, :1],
                cache_valid.new_ones((cache_valid.shape[0], 1)),
                positions[:, None],
                past_valid=cache_valid,
                cache=draft_cache,
            )[:, 0]
            draft_cache.crop(-1)
            return logits, self.draft_sequential(root_hidden, tree_tokens[:, 0])
        if self.sequential:
            return logits, self.draft_sequential(hidden[:, 0], tree_tokens[:, 0])
        return logits, _run_heads(self.heads, hidden[:, :1], self.num_draft_heads)

    @property
    def verify_appends(self) -> int:
        """Slots `verify_forward` appends to the cache it is given (to crop between repeats)."""
        return self.q if self.verification == "tree" else 0

    def _stand_in_draft_cache(self, b: int, c: int) -> KVCache:
        """A prefix-layer cache of c zero entries per sequence for timing `verify_forward`
        (the values do not change the work), kept between calls."""
        cache = getattr(self, "_timing_draft_cache", None)
        if cache is None or cache.buffer.shape[2] != b or cache.capacity < c + 1:
            attn = self.heads.prefix_embeding_layer.layers[0].self_attn
            kv_heads = attn.config.num_key_value_heads
            cache = KVCache(1, c + 1)
            cache.reserve(c + 1, torch.zeros((b, kv_heads, 0, attn.head_dim), dtype=self.dtype, device=self.device))
            cache.buffer.zero_()
            self._timing_draft_cache = cache
        cache.layers[0].length = c
        return cache

    @torch.inference_mode()
    def accept(
        self, tree_tokens, logits, *, temperature=0.0, posterior_threshold=0.09, posterior_alpha=0.3, generator=None
    ):
        """Verification, vectorised over batch and tree.

        Returns (path (b, D + 1) token indices of the chosen root-to-leaf path, n_keep (b,) =
        1 + accepted nodes, last (b,) index of the last accepted token, bonus (b,) token).
        """
        b = tree_tokens.shape[0]
        bi = torch.arange(b, device=tree_tokens.device)
        if temperature <= 0:
            # why: greedy verification is lossless: a node is accepted when it is the base
            # model's own argmax after its parent (docs/decoder.md, "acceptance rules").
            pred = _argmax(logits)  # (b, q)
            match = tree_tokens == pred[:, self.parent]
            loglik = None
        else:
            # why: typical acceptance, Medusa paper section 2.3.1: accept x when
            # p(x) > min(eps, alpha * exp(-H(p))) at the parent (H with Medusa's +1e-5).
            probs = torch.softmax(logits.float() / temperature, dim=-1)  # (b, q, V)
            entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)  # (b, q)
            threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
            cand_p = probs[bi[:, None], self.parent[None], tree_tokens]  # p at parent of token
            match = cand_p > threshold[:, self.parent]
            loglik = torch.log(cand_p)
        match[:, 0] = True  # the root is the base model's own token
        on_path = match[:, self.retrieve] & self.retrieve_valid  # (b, L, D + 1)
        best, n_keep = _longest_accepted(on_path, None if loglik is None else loglik[:, self.retrieve])
        path = self.retrieve[best]  # (b, D + 1)
        last = path[bi, n_keep - 1]
        # The bonus: the base model's own next token after the last accepted one.
        if temperature <= 0:
            bonus = pred[bi, last]
        else:
            bonus = torch.multinomial(probs[bi, last], 1, generator=generator)[:, 0]
        return path, n_keep, last, bonus

    @torch.inference_mode()
    def accept_candidates(
        self, row_tokens, logits, *, temperature=0.0, posterior_threshold=0.09, posterior_alpha=0.3, generator=None
    ):
        """Verification of candidate sequences (b, n, D + 1) from their own rows' logits
        (b, n, D + 1, V): a row's token j is judged by the row's distribution at j - 1, with
        `accept`'s rules; the rows' padding (past each leaf's depth) never counts.

        Returns (best (b,) the row of the longest accepted prefix (the first on ties, the tree
        form's choice: rows are the tree's retrieve rows in order), n_keep (b,) = 1 + accepted
        tokens, bonus (b,) token after the last accepted one in that row)."""
        b = row_tokens.shape[0]
        bi = torch.arange(b, device=row_tokens.device)
        match = torch.ones_like(row_tokens, dtype=torch.bool)  # position 0: the root
        loglik = None
        if temperature <= 0:
            # why: greedy verification, as the tree form (docs/decoder.md, "acceptance rules")
            pred = _argmax(logits)  # (b, n, D + 1)
            match[..., 1:] = row_tokens[..., 1:] == pred[..., :-1]
        else:
            # why: typical acceptance, Medusa paper section 2.3.1, as the tree form
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
            threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
            cand_p = torch.ones(row_tokens.shape, dtype=probs.dtype, device=probs.device)
            cand_p[..., 1:] = probs[..., :-1, :].gather(-1, row_tokens[..., 1:, None])[..., 0]
            match[..., 1:] = cand_p[..., 1:] > threshold[..., :-1]
            loglik = torch.log(cand_p)
        best, n_keep = _longest_accepted(match & self.retrieve_valid, loglik)
        if temperature <= 0:
            bonus = pred[bi, best, n_keep - 1]
        else:
            bonus = torch.multinomial(probs[bi, best, n_keep - 1], 1, generator=generator)[:, 0]
        return best, n_keep, bonus

    # ---- one step --------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, state: DecodeState, clock: PhaseClock | None = None, **rule):
        """One decoding step for every active sequence (`rule`: `accept`'s keywords; `clock`:
        where the phases' wall times go, None = not timed). Updates `state` in place and
        returns (tokens (b, D + 1) the step produced per sequence, in order, valid up to
        n_keep; n_keep (b,) = accepted nodes + 1)."""
        clock = clock or PhaseClock(False, self.device)
        # 1. draft: head k (1..D) guesses the k-th token after the root from the hidden state
        #    of the token that produced the root (Medusa paper section 2.1.1); the heads are
        #    model work, timed with the verification.
        #    A sequential drafter drafts depth by depth, each depth reading the path so far.
        if self.sequential:
            with clock("verify"):
                tokens = self.draft_sequential(state.hidden, state.root)
            with clock("draft"):
                mask, positions = self.layout(state.valid, state.next_pos)
        else:
            with clock("verify"):
                head_logits = _run_heads(self.heads, state.hidden, self.num_draft_heads)
            with clock("draft"):
                tokens, mask, positions = self.draft(state, head_logits)
        # 2. verify: one forward over the whole tree scores every candidate at once; or, as
        #    candidate sequences, one forward over the leaves' root paths, each against its own
        #    copy of the context (batch expansion).
        with clock("verify"):
            if self.verification == "tree":
                logits, hidden = self._forward(state.cache, tokens, mask, positions)
            else:
                logits, hidden, expanded = self._forward_candidates(state.cache, tokens, mask, positions)
        with clock("update"):
            # 3. accept: the longest accepted root-to-leaf path and the bonus token after it.
            bi = torch.arange(tokens.shape[0], device=self.device)
            if self.verification == "tree":
                path, n_keep, _, bonus = self.accept(tokens, logits, **rule)
                path_hidden = hidden[bi[:, None], path]  # (b, D + 1, h) along the accepted path
            else:
                best, n_keep, bonus = self.accept_candidates(tokens[:, self.retrieve], logits, **rule)
                path = self.retrieve[best]  # the same path as the tree form's: rows = retrieve rows
                path_hidden = hidden[bi, best]  # the chosen row is the path
            # 4. update: the cache keeps, per sequence, the root and the accepted nodes: out of
            #    the tree's slots C..C+q-1 (path[:, j] is the j-th kept token's tree index), or
            #    out of the chosen candidate row's slots C..C+D; a sequence that accepted fewer
            #    than the batch's longest keeps holes, masked out (docs/decoder.md, "KV cache
            #    handling", "batches with holes").
            c = state.valid.shape[1]
            keep = int(n_keep.max())
            if self.verification == "tree":
                state.cache.keep_slots(c, c + path[:, :keep])
            else:
                state.cache.take_rows(expanded, bi * self.candidates + best, keep)
            kept = torch.arange(keep, device=self.device)[None] < n_keep[:, None]
            if state.draft_cache is None:
                state.hidden = path_hidden[bi, n_keep - 1]  # the last accepted token drafts next
            else:
                # Hydra++: the prefix layer reads the kept tokens' hidden states into its cache,
                # slot for slot as the target's; its output at the last one drafts next
                # (docs/decoder.md, "Hydra++").
                state.hidden = self.heads.context_states(
                    path_hidden[:, :keep],
                    kept,
                    state.next_pos[:, None] + torch.arange(keep, device=self.device)[None],
                    past_valid=state.valid,
                    cache=state.draft_cache,
                )[bi, n_keep - 1]
            state.valid = torch.cat([state.valid, kept], dim=1)
            state.next_pos = state.next_pos + n_keep
            state.root = bonus
            new = torch.cat([tokens.gather(1, path[:, 1:]), bonus[:, None]], dim=1)
            new[bi, n_keep - 1] = bonus  # the accepted nodes, then the bonus
        return new, n_keep

    def _drop_finished(self, state: DecodeState, finished: list[bool]) -> None:
        """Finished sequences leave the batch (they cost nothing afterwards), and so do cache
        slots no remaining sequence may see (holes of dropped rows, shared padding)."""
        if not any(finished):
            return
        idx = torch.tensor([not f for f in finished], device=self.device).nonzero()[:, 0]
        state.rows = state.rows[idx]
        if idx.numel() == 0:
            return
        caches = [c for c in (state.cache, state.draft_cache) if c is not None]
        for cache in caches:
            cache.batch_select_indices(idx)
        state.valid, state.next_pos = state.valid[idx], state.next_pos[idx]
        state.root, state.hidden = state.root[idx], state.hidden[idx]
        used = state.valid.any(0)
        if not bool(used.all()):
            cols = used.nonzero()[:, 0]
            for cache in caches:
                cache.keep_slots(0, cols[None].expand(idx.numel(), -1))
            state.valid = state.valid[:, cols]

    # ---- the loop --------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask=None,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        eos_token_id: int | list[int] | None = None,
        seed: int = 0,
    ) -> DecodeResult:
        """Decode up to `max_new_tokens` new tokens for each prompt row of `input_ids` (b, L),
        padded where `attention_mask` (b, L) is 0 (left padding as tokenizers do; any padding
        works). temperature 0: greedy, lossless; > 0: typical acceptance with
        `posterior_threshold` (epsilon) and `posterior_alpha`, root and bonus tokens sampled
        with a torch.Generator seeded with `seed` (deterministic for a seed). A sequence ends
        at an `eos_token_id` (an id or a list of ids; included in its tokens) or after
        `max_new_tokens` tokens, and then leaves the batch."""
        eos = eos_set(eos_token_id)
        if max_new_tokens < 0:
            raise UserError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise UserError(f"temperature: must be >= 0, got {temperature}")
        b = input_ids.shape[0]
        out: list[list[int]] = [[] for _ in range(b)]
        if max_new_tokens == 0:
            none = np.zeros(0)
            return DecodeResult(out, np.zeros((0, b), np.int64), none, none, none, 0.0, np.zeros((0, b), np.int64))
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        rule = {
            "temperature": temperature,
            "posterior_threshold": posterior_threshold,
            "posterior_alpha": posterior_alpha,
            "generator": gen,
        }
        clock = PhaseClock(self.timing, self.device)

        with clock("prefill"):
            # Room for the prompt, the new tokens and one tree: one sequence never grows the
            # cache; ragged acceptance in a batch (holes) may, by doubling.
            capacity = input_ids.shape[1] + max_new_tokens + self.q
            state = self.prefill(input_ids, attention_mask, capacity=capacity, temperature=temperature, generator=gen)
            self._drop_finished(state, emit_roots(out, state.root, max_new_tokens, eos))
        return generation_loop(
            lambda: self.step(state, clock, **rule),
            lambda: state.rows,
            lambda finished: self._drop_finished(state, finished),
            out,
            b,
            max_new_tokens,
            eos,
            clock,
        )
