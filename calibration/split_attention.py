"""Verification attention split at the cache: the cached prefix attended without a per-query
mask, the step's own block of q tokens with its small tree mask, the two merged by their
log-sum-exp (docs/decoder.md#split-verification-attention).

Every query token of a verification step (a tree's nodes, a chain, the candidate rows) sees
the same cached slots; only the step's own q tokens need the tree (or causal) mask. The masked
path hands the attention one (b, 1, q, C + q) mask, and on CUDA transformers then repeats the
whole cache to every query head (`repeat_kv`) and torch falls back to a masked kernel: the
cost per cached key grows several-fold as soon as q > 1. The split path instead computes

- the prefix: the q query tokens of the g query heads sharing a KV head stacked into g q rows
  of that KV head (FlashDecoding's and FlashInfer's grouped decoding: nothing repeated), over
  the cached slots, under a key-padding mask (b, 1, 1, C) shared by every row; with its
  log-sum-exp per row;
- the block: the q queries against the step's q keys under the tree mask (b, 1, q, q);
- the merge (FlashAttention's online softmax, Dao et al. 2022, section 3.1; FlashDecoding's
  split-KV reduction, Dao et al. 2023): with L = logaddexp(L_prefix, L_block),
  out = exp(L_prefix - L) out_prefix + exp(L_block - L) out_block, in float32.

This is softmax over the union of the two key sets, exactly the masked path's attention up to
float rounding.

The path is a transformers attention function (`split_attention_forward`), switched on for a
forward by `split_block(model, slots)`; any other forward (a prefill, another caller) runs the
model's sdpa attention unchanged.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from treeopt.errors import UserError

__all__ = [
    "ATTENTION_PATHS",
    "DEFAULT_ATTENTION",
    "default_attention",
    "run_verification_attention",
    "SPLIT_IMPLEMENTATION",
    "attention_path",
    "attention_with_lse",
    "check_attention_path",
    "split_attention_forward",
    "split_block",
    "split_supported",
]

#: how a verification forward attends (`--attention`): one masked sdpa call over cache and
#: block, or the prefix/block split merged by log-sum-exp
ATTENTION_PATHS = ("split", "masked")
#: the default, by device type (docs/decoder.md#split-verification-attention): the split on
#: CUDA, where the masked path repeats the cache and leaves the fast kernels; the masked path
#: elsewhere (on a CPU torch's masked kernel reads the cache once: the split only adds its merge)
DEFAULT_ATTENTION = {"cuda": "split"}
FALLBACK_ATTENTION = "masked"
#: the name the split path is registered under in transformers' AttentionInterface
SPLIT_IMPLEMENTATION = "treeopt_split"

#: the step block of the forward now running under `split_block`: None (no split), or a
#: `_Block`
_ACTIVE: list = [None]


class _Block:
    """The step block of one forward: its slots (q,) int64 in the keys each layer attends to
    (None: the last q), and the masks split from the forward's mask, computed at the first
    layer and reused by the others (every layer gets the same mask tensor)."""

    def __init__(self, slots: torch.Tensor | None):
        self.slots = slots
        self.mask = self.prefix_mask = self.block_mask = None

    def masks(self, mask: torch.Tensor, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(prefix key-padding mask (b, 1, 1, m'), block mask (b, 1, q, q)) of the verification
        mask (b, 1, q, m): row 0, without the block's own slots, is what every query row sees
        of the cache (m' = m - q for the last-q layout, else m)."""
        if mask is not self.mask:
            if self.slots is None:
                self.prefix_mask, self.block_mask = mask[:, :, :1, :-q], mask[:, :, :, -q:]
            else:
                neg = torch.finfo(mask.dtype).min
                self.prefix_mask = mask[:, :, :1, :].index_fill(-1, self.slots, neg)
                self.block_mask = mask.index_select(-1, self.slots)
            self.mask = mask
        return self.prefix_mask, self.block_mask


def default_attention(device) -> str:
    """The attention path a decoder on `device` takes by default (DEFAULT_ATTENTION)."""
    return DEFAULT_ATTENTION.get(torch.device(device).type, FALLBACK_ATTENTION)


def attention_path(model, attention: str | None, device) -> str:
    """The path a verification forward of `model` takes for the setting `attention` (None: the
    device's default; "masked" where the model does not attend through sdpa)."""
    path = check_attention_path(attention or default_attention(device))
    return path if split_supported(model) else "masked"


def check_attention_path(path: str) -> str:
    if path not in ATTENTION_PATHS:
        raise UserError(f"attention: must be one of {', '.join(ATTENTION_PATHS)}, got {path!r}")
    return path


def split_supported(model) -> bool:
    """Whether `model` attends through transformers' sdpa function, the one the split path
    replaces (a model running eager attention, as Gemma-2's softcapping needs, keeps it)."""
    return getattr(model.config, "_attn_implementation", None) == "sdpa"


@contextlib.contextmanager
def split_block(model, slots: torch.Tensor | None, enabled: bool = True):
    """Run `model`'s forwards inside with the split attention: the step's q tokens are written
    at `slots` (q,) of the keys each layer attends to (None: they are the last q). Not
    `enabled` or not `split_supported`: the model's own attention, untouched."""
    if not enabled or not split_supported(model):
        yield
        return
    config = model.config
    _ACTIVE[0] = _Block(slots)
    config._attn_implementation = SPLIT_IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
        _ACTIVE[0] = None


def _math_with_lse(query, key, value, mask, scale: float):
    """Attention and its log-sum-exp per row by the definition, in float32 (any device)."""
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), value.float())
    return out, lse


def attention_with_lse(query, key, value, mask, scale: float):
    """softmax(q k^T scale + mask) v and the rows' log-sum-exp: (out (b, h, n, d) in the query's
    dtype or float32, lse (b, h, n) float32) for query (b, h, n, d), key/value (b, h, m, d),
    additive mask broadcastable to (b, h, n, m) or None. torch's fused kernels on CPU and
    CUDA (they return the log-sum-exp the backward pass needs); the definition elsewhere."""
    if query.device.type == "cpu":
        mask = None if mask is None else mask.to(query.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=mask, scale=scale
        )
        return out, lse.float()
    if query.device.type == "cuda":
        return _cuda_with_lse(query, key, value, mask, scale)
    return _math_with_lse(query, key, value, mask, scale)


def _cuda_with_lse(query, key, value, mask, scale: float):
    """The memory-efficient kernel (the one torch's sdpa picks for a masked call), asked for
    its log-sum-exp; the bias padded to a multiple of 16 slots as torch's sdpa pads it."""
    b, h, n, _ = query.shape
    m = key.shape[2]
    bias = None
    if mask is not None:
        pad = -m % 16
        bias = mask.to(query.dtype)
        if pad:
            bias = torch.nn.functional.pad(bias, (0, pad))
        bias = bias[..., :m].expand(b, h, n, m)
    try:
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, True, 0.0, False, scale=scale
        )
    except RuntimeError:  # an unsupported shape or dtype: the definition, exact
        return _math_with_lse(query, key, value, mask, scale)
    return out, lse[..., :n].float()


def split_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: query (b, H, q, d), key/value (b, K, m, d)
    (the cache's slots with the step's q written at the active block's slots), the additive
    verification mask (b, 1, q, m). Returns (out (b, q, H, d), None). Outside `split_block`,
    for one query token (the single-token path is the one the split is measured against), or
    with any other mask, the sdpa function."""
    block = _ACTIVE[0]
    b, heads, q, d = query.shape
    mask = attention_mask
    if block is None or q == 1 or mask is None or mask.dim() != 4 or mask.dtype == torch.bool:
        return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, **kwargs)
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = d**-0.5 if scaling is None else scaling
    prefix_mask, block_mask = block.masks(mask, q)
    slots = block.slots
    prefix_keys = key[:, :, :-q] if slots is None else key
    prefix_values = value[:, :, :-q] if slots is None else value
    block_keys = key[:, :, -q:] if slots is None else key.index_select(2, slots)
    block_values = value[:, :, -q:] if slots is None else value.index_select(2, slots)
    # why: the g query heads of one KV head read its keys once, as g q rows (module docstring)
    grouped = query.reshape(b, kv_heads, group * q, d)
    out_p, lse_p = attention_with_lse(grouped, prefix_keys, prefix_values, prefix_mask, scale)
    out_p, lse_p = out_p.reshape(b, heads, q, d), lse_p.reshape(b, heads, q)
    if group > 1:
        block_keys = block_keys.repeat_interleave(group, dim=1)  # q keys only: cheap
        block_values = block_values.repeat_interleave(group, dim=1)
    out_b, lse_b = _math_with_lse(query, block_keys, block_values, block_mask, scale)
    lse = torch.logaddexp(lse_p, lse_b)
    merged = out_p.float() * torch.exp(lse_p - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]
    return merged.to(query.dtype).transpose(1, 2).contiguous(), None


def run_verification_attention(path: str, module, query, key, value, mask, scale: float) -> torch.Tensor:
    """One layer's verification attention through `path` outside a model (the step's q tokens
    the last q of the keys; `module` carries transformers' `num_key_value_groups`): what
    `treeopt hw calibrate` times (calibration.attention_bench). Returns (b, q, H, d)."""
    if path != "split":
        return sdpa_attention_forward(module, query, key, value, mask, scaling=scale)[0]
    previous, _ACTIVE[0] = _ACTIVE[0], _Block(None)
    try:
        return split_attention_forward(module, query, key, value, mask, scaling=scale)[0]
    finally:
        _ACTIVE[0] = previous


AttentionInterface.register(SPLIT_IMPLEMENTATION, split_attention_forward)
