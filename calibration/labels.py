"""The model passes of a calibration: greedy continuations with the KV cache, and the rank of
every head's label at the counted positions (docs/statistics.md#labels).

Tokens x_0 .. x_{L-1} of one sequence (prompt + generation, or the data text). At position t
the base model's last hidden state h_t predicts x_{t+1}; head k (0-based) reads h_t and is
labelled by x_{t+k+2}, when that token exists in the sequence. The rank of the label under
head k's logits at t is the number of vocabulary entries whose logit is *strictly greater*
than the label's (ties count in the label's favour: with exactly tied logits the label gets the
best rank of the tie; this matters only for low-precision logits).

A sequential drafter (Hydra, MLP speculator) also reads the path: its depth-k guess at t is
conditioned on the TRUE path x_{t+1} .. x_{t+k+1}, teacher-forced along the sequence. Under
greedy verification a node is accepted only when its whole path equals the base model's greedy
continuation, so this is exactly the statistic acceptance depends on (docs/statistics.md#dependent-drafters).

Hidden states come from one teacher-forced forward of the decoder body (`decoder_body`, no base
``lm_head``) over prompt + generation; the heads run only at the labelled positions, in chunks
of rows, and a rank is one fused ``(logits > label_logit).sum(-1)`` per chunk.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from transformers import DynamicCache

from calibration.batching import label_rows, pad_left
from calibration.drafters.base import select_rows
from calibration.model_calls import cache_kwargs
from treeopt.errors import UserError

#: ``greedy``: the base model's own greedy continuation (self-distillation); ``data``: the text
LABEL_MODES = ("greedy", "data")
#: logits elements (rows x vocabulary) materialised at once when ranking: 16 MB of fp32 on a
#: CPU (stays in cache), 256 MB on an accelerator (fewer, larger kernels)
CHUNK_ELEMENTS = {"cpu": 1 << 22, "other": 1 << 26}


def _logits_to_keep_kwarg(model) -> dict:
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def pad_token_id(model, tokenizer=None) -> int:
    """Any valid id for padding (the value never matters: padded slots are masked out)."""
    for src in (tokenizer, getattr(model, "config", None)):
        for attr in ("pad_token_id", "eos_token_id"):
            value = getattr(src, attr, None) if src is not None else None
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            if isinstance(value, int) and value >= 0:
                return value
    return 0


@torch.inference_mode()
def greedy_continuations(model, prompts, steps: int, *, pad_id: int = 0) -> list[list[int]]:
    """Generate `steps` tokens greedily after each prompt, batched, with the KV cache.

    `prompts` is a list of token-id lists of any lengths; they are left-padded with an
    attention mask and explicit position ids (cumsum of the mask - 1) so each continuation
    equals an unbatched greedy run. EOS does not stop generation. Returns the generated ids.
    """
    device = next(model.parameters()).device
    ids, mask, pos = pad_left(prompts, pad_id, device)
    cache = DynamicCache()
    keep = {**_logits_to_keep_kwarg(model), **cache_kwargs(model, cache)}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep)
    nxt = out.logits[:, -1].argmax(-1)
    generated = [nxt]
    ones = torch.ones((len(prompts), 1), dtype=mask.dtype, device=device)
    last_pos = pos[:, -1:]
    for _ in range(steps - 1):
        mask = torch.cat([mask, ones], dim=1)
        last_pos = last_pos + 1
        out = model(
            input_ids=nxt[:, None],
            attention_mask=mask,
            position_ids=last_pos,
            use_cache=True,
            **keep,
        )
        nxt = out.logits[:, -1].argmax(-1)
        generated.append(nxt)
    return torch.stack(generated, 1).cpu().tolist()


def decoder_body(model):
    """The transformer body of a causal LM (its last hidden states, no base lm_head)."""
    get = getattr(model, "get_decoder", None)
    body = get() if callable(get) else None
    if body is None:
        body = getattr(model, "model", None)
    if body is None:
        raise UserError(f"{type(model).__name__}: cannot find the decoder body (no get_decoder())")
    return body


@torch.inference_mode()
def label_ranks(
    model, heads, sequences, starts, *, pad_id: int = 0, chunk_elements: int | None = None, inputs=None
) -> np.ndarray:
    """Ranks of each head's label at the counted positions of `sequences` (module doc).

    One teacher-forced forward of the decoder body over the left-padded batch, then each head
    on its labelled positions only. Returns (N, K) int64: the exact rank (number of logits
    strictly greater than the label's), -1 where head k has no label. Rows follow
    `label_rows(lengths, starts)`. `inputs`: `drafter_inputs` of these sequences already
    computed by the caller (who then clears an EAGLE draft's context), else computed here.
    """
    if getattr(heads, "kind", "") == "draft-model":
        # why: a draft model reads the true prefix itself, in one teacher-forced pass of its own
        # (docs/statistics.md#draft-model-acceptance)
        return heads.label_ranks(sequences, starts, pad_id=pad_id)
    lengths = [len(s) for s in sequences]
    num_heads = heads.num_heads
    seq, t, has = label_rows(lengths, starts, num_heads)
    ranks = np.full(has.shape, -1, np.int64)
    if len(seq) == 0:
        return ranks
    own = inputs is None
    hidden, ids, pos = drafter_inputs(model, heads, sequences, pad_id=pad_id) if own else inputs
    device = hidden.device
    eagle = hasattr(heads, "read_context") and own
    width = ids.shape[1]
    col = (width - np.asarray(lengths, np.int64))[seq] + t  # column of position t
    vocab = heads.vocab_size
    if chunk_elements is None:
        chunk_elements = CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "other"]
    rows_per_chunk = max(1, chunk_elements // vocab)
    if getattr(heads, "sequential", False):
        try:
            _sequential_ranks(heads, hidden, ids, seq, col, has, ranks, rows_per_chunk, pos)
        finally:
            if eagle:
                heads.set_context(None)
        return ranks
    for k in range(num_heads):
        sel = np.nonzero(has[:, k])[0]
        if len(sel) == 0:
            continue
        b = torch.from_numpy(seq[sel]).to(device)
        c = torch.from_numpy(col[sel]).to(device)
        h = hidden[b, c]
        labels = ids[b, c + k + 2]
        out = torch.empty(len(sel), dtype=torch.int64, device=device)
        for i in range(0, len(sel), rows_per_chunk):
            logits = heads[k](h[i : i + rows_per_chunk])
            lab = logits.gather(1, labels[i : i + rows_per_chunk, None])
            out[i : i + rows_per_chunk] = (logits > lab).sum(-1)
        ranks[sel, k] = out.cpu().numpy()
    return ranks


def drafter_inputs(model, heads, sequences, *, pad_id: int = 0):
    """What the heads read at every column of the left-padded `sequences`: (hidden (b, W - 2,
    h) on the heads' device, ids (b, W), positions (b, W - 2)), from one teacher-forced forward
    of the decoder body. An EAGLE draft's features replace the hidden states and its context
    (the pairs of every column) is set (`read_context`; the caller clears it); Hydra++'s
    prefix layer's outputs replace them too."""
    device = next(model.parameters()).device
    ids, mask, pos = pad_left(sequences, pad_id, device)
    eagle = hasattr(heads, "read_context")
    # Sequences are right-aligned and no head has a label at the last two positions of any
    # sequence, so the last two columns need no hidden state.
    body = decoder_body(model)(
        input_ids=ids[:, :-2],
        attention_mask=mask[:, :-2],
        position_ids=pos[:, :-2],
        use_cache=False,
        output_hidden_states=eagle,
    )
    hidden = body.last_hidden_state
    # a model spread over devices (--device-map) ends on its last one, where the heads are
    device = hidden.device
    if eagle:
        # why: an EAGLE draft reads the base model's auxiliary layers from this same forward and
        # the pairs before t through a cache of its own (docs/statistics.md#dependent-drafters)
        hidden = heads.features([h.to(device) for h in body.hidden_states], hidden)
        heads.read_context(hidden, ids[:, 1:-1].to(device), mask[:, :-2].to(device).bool(), pos[:, :-2].to(device))
    if getattr(heads, "prefix_layer", False):
        # why: Hydra++'s prefix layer reads the whole context causally; its output at t replaces
        # h_t (docs/statistics.md#dependent-drafters; docs/decoder.md#hydra)
        hidden = heads.context_states(hidden, mask[:, :-2].to(device).bool(), pos[:, :-2].to(device))
    return hidden, ids.to(device), pos[:, :-2].to(device)


def _sequential_ranks(drafter, hidden, ids, seq, col, has, ranks, rows_per_chunk: int, positions) -> None:
    """Fill `ranks` (N, K) for a drafter that reads the path: chunk by chunk of rows, depth by
    depth, each depth on the rows that have a label there (has[:, k] implies has[:, k - 1]),
    the drafter's state advanced with the true token of the depth. A drafter with a context
    of its own (EAGLE: `begin_at`) begins each row at its column, seeing the columns before."""
    device = hidden.device
    for start in range(0, len(seq), rows_per_chunk):
        stop = min(start + rows_per_chunk, len(seq))
        b = torch.from_numpy(seq[start:stop]).to(device)
        c = torch.from_numpy(col[start:stop]).to(device)
        if hasattr(drafter, "begin_at"):
            state = drafter.begin_at(hidden[b, c], ids[b, c + 1], b, c, positions[b, c])
        else:
            state = drafter.begin(hidden[b, c], ids[b, c + 1])  # the root: x_{t+1}
        alive = np.arange(stop - start)
        for k in range(has.shape[1]):
            keep = np.flatnonzero(has[start + alive, k])
            if len(keep) == 0:
                break
            if len(keep) < len(alive):
                rows = torch.from_numpy(keep).to(device)
                state, alive = select_rows(state, rows), alive[keep]
                b, c = b[rows], c[rows]
            logits, carry = drafter.depth_logits(state, k)
            labels = ids[b, c + k + 2]
            ranks[start + alive, k] = (logits > logits.gather(1, labels[:, None])).sum(-1).cpu().numpy()
            state = drafter.child_state(carry, k, labels)
