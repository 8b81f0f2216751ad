"""Plain decoding, without speculation: cached greedy decoding, the reference a tree decoder
must reproduce token for token, and one plain step with the draft heads, the work T(0) the
sweep times (docs/decoder.md#losslessness, docs/decoder.md#timing-a-step).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from calibration.decode_loop import eos_set
from calibration.model_calls import cache_kwargs, check_inputs, lm_head, model_device, model_forward_hidden, run_heads
from treeopt.errors import UserError

__all__ = ["greedy_decode", "plain_step_forward"]


@torch.inference_mode()
def greedy_decode(
    model, input_ids, attention_mask=None, *, max_new_tokens: int, eos_token_id: int | list[int] | None = None
) -> list[list[int]]:
    """Plain cached greedy decoding (the reference the tree decoder must reproduce), through
    the model's ordinary forward with a 2D padding mask and the library's own `DynamicCache`:
    one token per step for every sequence. Returns the new tokens per sequence (eos included
    if hit, nothing after)."""
    eos = eos_set(eos_token_id)
    device = model_device(model)
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
        input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_kwargs(model, cache)
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
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_pos,
            use_cache=True,
            **cache_kwargs(model, cache),
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
    return lm_head(model, hidden), run_heads(heads, hidden, num)
