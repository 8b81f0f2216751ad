"""The reference decoder's side of an EAGLE draft: the draft's own KV cache, slot for slot as
the target's (docs/decoder.md#eagle).

Slot j of the target's cache holds token x_j; slot j of the draft's holds the pair
(feature of the token before x_j, x_j) at that feature's position (vLLM's convention: the pair
(feature_i, x_{i+1}) sits at position i). A prompt's first token has no pair: its draft slot is
not valid (`draft_valid`). Each step appends, for the kept tokens (root and accepted nodes),
the pairs (previous feature, kept token), so both caches grow by the same slots and a hole of
the target's is a hole of the draft's; the next root's pair (last kept feature, bonus) is the
query the drafting begins with.
"""

from __future__ import annotations

import torch

from calibration.kv_cache import KVCache

__all__ = ["append_pairs", "draft_context", "prefill_pairs"]


def prefill_pairs(heads, features, input_ids, valid, positions, capacity: int) -> tuple[KVCache, torch.Tensor]:
    """The draft's cache after a prompt (b, L) (padding anywhere): each valid token after the
    first paired with the feature of the valid token before it. Returns (the cache, its valid
    slots (b, L))."""
    b, length = valid.shape
    slots = torch.arange(length, device=valid.device)
    last_valid = torch.cummax(torch.where(valid, slots[None], -1), dim=1).values
    before = torch.cat([last_valid.new_full((b, 1), -1), last_valid[:, :-1]], dim=1)  # valid token before j
    draft_valid = valid & (before >= 0)
    rows = torch.arange(b, device=valid.device)[:, None]
    src = before.clamp(min=0)
    _, key, value = heads.context_pass(features[rows, src], input_ids, draft_valid, positions[rows, src])
    cache = KVCache(1, capacity)
    cache.layers[0].update(key, value)
    return cache, draft_valid


def append_pairs(heads, cache: KVCache, past_valid, features, tokens, kept, positions) -> None:
    """Append the pairs (features (b, n, F), tokens (b, n)) at `positions` (b, n) to the draft's
    cache; `kept` (b, n) which are real (the others are holes). A pair sees the cache's valid
    slots and the kept pairs up to itself (and itself, so that no row is empty)."""
    b, n = kept.shape
    causal = torch.ones((n, n), dtype=torch.bool, device=kept.device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=kept.device)
    new = (causal[None] & kept[:, None, :]) | eye[None]
    mask = torch.cat([past_valid[:, None, :].expand(b, n, past_valid.shape[1]), new], dim=2)
    layer = cache.layers[0]
    _, key, value = heads.pair_forward(heads.first_state(features), tokens, positions, layer.keys, layer.values, mask)
    layer.update(key, value)


def draft_context(cache: KVCache, draft_valid, root_positions) -> tuple:
    """What `EagleDrafter.set_context` takes for a step's drafting: the cache's keys and values,
    its valid slots and each root pair's position (b,)."""
    layer = cache.layers[0]
    return layer.keys, layer.values, draft_valid, root_positions
