"""The decoder layer of an EAGLE draft and the shape its config.json declares
(docs/formats.md#eagle-drafts; docs/decoder.md#eagle).

The layer is a Llama decoder layer whose attention reads explicit keys and values, so that a
draft node attends to the draft's cache of the context plus the keys of its own path without
any cache object (the calibration's teacher-forced depths and the decoder's tree drafting run
the same function):

- EAGLE-3 (Li et al. 2025; vLLM ``llama_eagle3.py``, the authors' ``LlamaDecoderLayeremb``):
  the attention input is ``[input_layernorm(embed(token)), hidden_norm(h)]`` (2·hidden wide),
  the residual is h itself (``h`` normed first with ``norm_before_residual``);
- EAGLE-1/2 (Li et al. 2024; vLLM ``llama_eagle.py``, the authors' ``cnets1.py``): the input is
  ``fc([embed(token), h])`` (2·hidden -> hidden, bias as the file has it), layer 0 has no
  input norm, and the residual is that input.

Then attention, the residual, ``post_attention_layernorm``, the MLP and the residual again.
The output is the pre-norm state: EAGLE-3 feeds it back as the next depth's h and takes logits
from ``lm_head(norm(out))``; EAGLE-1/2 feed it back and take logits from the base lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from calibration.drafters.io import config_int
from treeopt.errors import UserError

#: the layer keys of the config a speculators checkpoint nests under transformer_layer_config
SPECULATORS_KEY = "speculators_model_type"


@dataclass(frozen=True)
class EagleShape:
    """What a draft's config.json declares (docs/formats.md#eagle-drafts)."""

    eagle3: bool
    hidden_size: int  # the draft's width
    target_hidden_size: int | None  # the base model's width (None: the draft's)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int | None  # the target's vocabulary (None: not said)
    draft_vocab_size: int | None  # EAGLE-3's reduced vocabulary (None: the target's)
    aux_layer_ids: tuple[int, ...] | None  # EAGLE-3's auxiliary layers (None: the engines' default)
    norm_before_residual: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    rope: dict  # rope_theta, rope_scaling, max_position_embeddings


def _layer_config(config: dict) -> dict:
    """The Llama keys of a draft config: nested under ``transformer_layer_config`` in the
    speculators layout, top-level in the authors' and vLLM's."""
    if SPECULATORS_KEY in config:
        nested = config.get("transformer_layer_config")
        return nested if isinstance(nested, dict) else {}
    return config


def _aux_ids(config: dict, config_file) -> tuple[int, ...] | None:
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    nested = config.get("eagle_config")
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise UserError(f"{config_file}: eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got {ids!r}")
    return tuple(ids)


def read_shape(config: dict, config_file, *, eagle3: bool) -> EagleShape:
    """The draft's shape from its config.json, in either published layout."""
    layer = _layer_config(config)
    hidden = config_int(layer, config_file, "hidden_size", minimum=1)
    heads = config_int(layer, config_file, "num_attention_heads", minimum=1)
    kv_heads = config_int(layer, config_file, "num_key_value_heads", minimum=1, default=heads)
    head_dim = layer.get("head_dim") or hidden // heads
    layers = layer.get("num_hidden_layers", 1)
    if layers != 1:
        raise UserError(f"{config_file}: num_hidden_layers {layers!r}: treeopt reads EAGLE drafts of one decoder layer")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if config.get(flag):
            raise UserError(f"{config_file}: {flag} is not supported (treeopt reads EAGLE-3 drafts without it)")
    if heads % kv_heads:
        raise UserError(
            f"{config_file}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    target_hidden = config.get("target_hidden_size", layer.get("target_hidden_size"))
    draft_vocab = config.get("draft_vocab_size", layer.get("draft_vocab_size"))
    for name, value in (("target_hidden_size", target_hidden), ("draft_vocab_size", draft_vocab)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"{config_file}: invalid {name!r} (an integer >= 1), got {value!r}")
    return EagleShape(
        eagle3=eagle3,
        hidden_size=hidden,
        target_hidden_size=target_hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(head_dim),
        intermediate_size=config_int(layer, config_file, "intermediate_size", minimum=1),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        vocab_size=layer.get("vocab_size", config.get("vocab_size")),
        draft_vocab_size=draft_vocab if eagle3 else None,
        aux_layer_ids=_aux_ids(config, config_file) if eagle3 else None,
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)),
        hidden_act=str(layer.get("hidden_act", "silu")),
        rope={
            k: layer[k]
            for k in ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")
            if layer.get(k) is not None
        },
    )


def rotary_for(shape: EagleShape) -> LlamaRotaryEmbedding:
    """transformers' rotary embedding of the draft's rope settings (any rope type it knows)."""
    config = LlamaConfig(
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        **shape.rope,
    )
    return LlamaRotaryEmbedding(config)


class EagleAttention(nn.Module):
    def __init__(self, shape: EagleShape, in_features: int):
        super().__init__()
        nh, kvh, hd = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
        self.heads, self.kv_heads, self.head_dim = nh, kvh, hd
        bias = shape.attention_bias
        self.q_proj = nn.Linear(in_features, nh * hd, bias=bias)
        self.k_proj = nn.Linear(in_features, kvh * hd, bias=bias)
        self.v_proj = nn.Linear(in_features, kvh * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, shape.hidden_size, bias=bias)

    def forward(self, x, cos_sin, past_k, past_v, mask):
        """x (N, q, in); past_k/past_v (N, kv, P, d) rotated already; mask (N, q, P + q) bool
        (True = may attend). Returns (attention output (N, q, hidden), the new rotated keys and
        the values (N, kv, q, d))."""
        n, q, _ = x.shape
        query = self.q_proj(x).view(n, q, self.heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(x).view(n, q, self.kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(x).view(n, q, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos_sin
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        keys, values = torch.cat([past_k, key], 2), torch.cat([past_v, value], 2)
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask[:, None], enable_gqa=self.heads != self.kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(n, q, -1)), key, value


class EagleMLP(nn.Module):
    def __init__(self, shape: EagleShape):
        super().__init__()
        h, i, bias = shape.hidden_size, shape.intermediate_size, shape.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act_fn = ACT2FN[shape.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """One EAGLE decoder layer (module doc); keys as the files name them under ``layers.0.``."""

    def __init__(self, shape: EagleShape):
        super().__init__()
        h, eps = shape.hidden_size, shape.rms_norm_eps
        self.eagle3, self.norm_before_residual = shape.eagle3, shape.norm_before_residual
        self.self_attn = EagleAttention(shape, 2 * h if shape.eagle3 else h)
        self.mlp = EagleMLP(shape)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        if shape.eagle3:
            self.input_layernorm = LlamaRMSNorm(h, eps=eps)
            self.hidden_norm = LlamaRMSNorm(h, eps=eps)

    def forward(self, x, residual, cos_sin, past_k, past_v, mask):
        """`x`: the EAGLE-3 pair (embedding, h) as a tuple, or EAGLE-1's fc output; `residual`:
        ignored for EAGLE-3 (h is it). Returns (pre-norm output, new keys, new values)."""
        if self.eagle3:
            emb, h = x
            normed = self.hidden_norm(h)
            residual = normed if self.norm_before_residual else h
            x = torch.cat([self.input_layernorm(emb), normed], dim=-1)
        attn, key, value = self.self_attn(x, cos_sin, past_k, past_v, mask)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), key, value


def check_aux_layers(ids: tuple[int, ...] | None, num_layers: int, where) -> tuple[int, ...]:
    """The auxiliary layers an EAGLE-3 draft reads: the input of each named layer, that is
    transformers' ``hidden_states[i]`` (vLLM and the authors capture it before layer i runs);
    the engines' default (2, L // 2, L - 3) when the config names none
    (docs/formats.md#eagle-drafts)."""
    if ids is None:
        ids = (2, num_layers // 2, num_layers - 3)
        if num_layers < 4:
            raise UserError(
                f"{where}: names no eagle_aux_hidden_state_layer_ids and the model's {num_layers} layers are too "
                f"few for the engines' default (2, L // 2, L - 3); name them in its config.json"
            )
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise UserError(
            f"{where}: auxiliary layer {bad[0]} is not one of the model's {num_layers} layers (0..{num_layers - 1})"
        )
    return tuple(ids)


__all__ = ["EagleLayer", "EagleShape", "check_aux_layers", "read_shape", "rotary_for"]
