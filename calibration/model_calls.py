"""Calls into a transformers causal LM that the reference decoders share: the forward to the
last hidden states, the lm_head, the draft heads, additive masks and the input checks
(docs/decoder.md).

GQA: with a custom mask and q > 1, transformers' sdpa path repeats the whole KV cache to all
query heads on every forward (docs/decoder.md#gqa-and-sdpa). On CPU the decoders set
``TRANSFORMERS_SDPA_FORCE_GQA=1`` around their own forwards (`force_sdpa_gqa`; torch's CPU sdpa
then runs grouped attention itself; exact, tested). On CUDA the masked GQA path of torch falls
back to the math kernel, so the library default stays there.
"""

from __future__ import annotations

import contextlib
import inspect
import os

import numpy as np
import torch

from treeopt.errors import UserError

__all__ = [
    "additive_mask",
    "cache_kwargs",
    "synchronizer",
    "check_full_attention",
    "check_inputs",
    "fast_argmax",
    "force_sdpa_gqa",
    "lm_head",
    "model_device",
    "model_forward_features",
    "model_forward_hidden",
    "prompt_mask",
    "run_heads",
    "text_config",
    "uses_gqa",
]


def text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def model_device(model) -> torch.device:
    return next(model.parameters()).device


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


def fast_argmax(x: torch.Tensor) -> torch.Tensor:
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


#: the keyword each forward function takes its KV cache by (`cache_kwargs`), by function
_CACHE_KEYWORD: dict = {}


def cache_kwargs(module, cache) -> dict:
    """``{keyword: cache}`` for `module`'s forward: ``cache`` where the forward takes that
    argument, else ``past_key_values``."""
    # why: transformers 5.24 renamed the forward argument `past_key_values` to `cache` and warns
    # on every call that still uses the old name (`@deprecate_kwarg("past_key_values", "5.40.0",
    # new_name="cache")` in transformers/models/llama/modeling_llama.py); the versions before
    # it that pyproject.toml allows know only `past_key_values`
    forward = getattr(type(module), "forward", None) or module.forward
    name = _CACHE_KEYWORD.get(forward)
    if name is None:
        try:
            params = inspect.signature(forward).parameters
        except (TypeError, ValueError):  # a builtin or C forward: the long-standing name
            params = {}
        name = _CACHE_KEYWORD[forward] = "cache" if "cache" in params else "past_key_values"
    return {name: cache}


def synchronizer(dev: torch.device):
    """A function that waits for the work queued on `dev`: an accelerator runs asynchronously,
    so a timing that did not wait would measure the launch, not the work."""
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    if dev.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def model_forward_hidden(model, input_ids, *, attention_mask, position_ids, cache):
    """The base model's last hidden states (b, q, h) (after the final norm), appending the q
    tokens' keys and values to `cache` (None: no cache). `attention_mask` is 4D additive
    (b, 1, q, C + q), 2D (b, C + q) or None; `position_ids` (b, q)."""
    body = model.get_decoder()
    out = body(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=cache is not None,
        **cache_kwargs(body, cache),
    )
    return out.last_hidden_state


def model_forward_features(model, heads, input_ids, *, attention_mask, position_ids, cache):
    """(last hidden states, the EAGLE draft's features) of one forward of the base model, as
    `model_forward_hidden`, with every layer's input kept for the draft's auxiliary layers."""
    body = model.get_decoder()
    out = body(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=cache is not None,
        output_hidden_states=True,
        **cache_kwargs(body, cache),
    )
    return out.last_hidden_state, heads.features(out.hidden_states, out.last_hidden_state)


def lm_head(model, hidden: torch.Tensor) -> torch.Tensor:
    return _softcap(model, model.get_output_embeddings()(hidden))


def run_heads(heads, hidden: torch.Tensor, num: int) -> torch.Tensor:
    """The first `num` heads on hidden (..., h) -> (num, ..., V)."""
    if num == 0:
        return hidden.new_zeros((0, *hidden.shape[:-1], heads.vocab_size))
    return torch.stack([heads[k](hidden) for k in range(num)])


def attention_refusal(config) -> str | None:
    """Why the reference tree decoder cannot decode a model of this transformers `config`, or
    None: it masks every layer with one tree mask, so every layer must attend to the whole
    sequence (a sliding-window layer, as Gemma-2's every other layer, would need its own mask)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None) or []
    other = sorted({t for t in types if t != "full_attention"})
    if other:
        return f"layer types {other} are not supported by the reference tree decoder (full attention only)"
    return None


def check_full_attention(model) -> None:
    why = attention_refusal(model.config)
    if why:
        raise UserError(f"model: {why}")


#: the attention implementations tried in order: sdpa (what the decoder's timings assume,
#: docs/decoder.md#gqa-and-sdpa), else eager, which every transformers model has (Gemma-2
#: refuses sdpa in the transformers versions treeopt supports)
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")


def with_supported_attention(build):
    """`build(attn_implementation=...)` with the first implementation of
    ATTENTION_IMPLEMENTATIONS the model accepts; transformers refuses one it does not support
    with a ValueError naming the attention implementation."""
    for name in ATTENTION_IMPLEMENTATIONS[:-1]:
        try:
            return build(attn_implementation=name)
        except ValueError as err:
            if "attention implementation" not in str(err) and "attn_implementation" not in str(err):
                raise
    return build(attn_implementation=ATTENTION_IMPLEMENTATIONS[-1])


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True = may attend) -> additive float mask: 0 / dtype's most negative value (the
    value transformers itself uses: exact zeros after softmax, no NaN for a row that sees at
    least one slot)."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(mask, zero, neg)


def prompt_mask(valid: torch.Tensor) -> torch.Tensor:
    """The prefill's mask (b, L, L) bool over prompts whose real tokens are `valid` (b, L):
    causal, padding hidden. A padding row sees itself only: its output is unused, but must not
    be NaN (it would poison the keys and values of the next layers' padding slots)."""
    length = valid.shape[1]
    ar = torch.arange(length, device=valid.device)
    causal = ar[None, :] <= ar[:, None]  # (L, L)
    return (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=valid.device)


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
