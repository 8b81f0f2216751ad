"""Model shapes: the handful of numbers the latency model needs about a Llama-like decoder
and its draft heads.

A shape comes from a built-in name (`llama-7b`, `llama-3-8b`, ...; `vicuna-7b` is an alias of
`llama-7b`), or from a Hugging Face `config.json` (or the directory holding it). The
application layer resolves `--model demo` to the bundled demo model's directory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from treeopt.drafter_cost import MAX_HEAD_LAYERS, MAX_HEADS
from treeopt.dtypes import DTYPE_BYTES, normalize_dtype
from treeopt.errors import UserError
from treeopt.fileio import portable_path, read_json_input
from treeopt.layout import default_heads_dir

__all__ = [
    "ModelShape",
    "DraftHeadsShape",
    "model_shape",
    "builtin_shapes",
    "draft_heads_shape",
    "load_heads_shape",
    "DTYPE_BYTES",
    "normalize_dtype",
    "heads_config_near",
    "resolve_heads",
    "shape_from_config",
]


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family decoder: `layers` blocks of attention (GQA when kv_heads < heads) and a
    gated MLP (gate, up, down), an input embedding and an `lm_head` of `vocab` rows.

    dtype is the storage/compute type of weights and activations; dtype_bytes its size (β).
    `source` says where the numbers come from.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    dtype: str = "bf16"
    dtype_bytes: int = 2
    source: str = ""
    # mixture of experts (docs/performance-model.md#mixture-of-experts); routed_experts 0: dense
    routed_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # all shared experts together (n_shared x their intermediate)
    dense_layers: int = 0  # layers that keep a dense MLP of `intermediate` (DeepSeek's first_k_dense_replace)
    routing_skew: float = 1.0  # >= 1: tokens route as if over routed_experts / skew equally likely experts
    mla_kv_dim: int = 0  # multi-head latent attention: cached latent + rotary key per token per layer
    # MLA's projections (DeepSeek-V2, arXiv 2405.04434 section 2.1): the query's low rank (0: one
    # h x heads projection), the rotary and non-rotary parts of a query/key head; the values'
    # head is head_dim and the latent is mla_kv_dim - mla_rope_dim
    mla_q_rank: int = 0
    mla_rope_dim: int = 0
    mla_nope_dim: int = 0

    def __post_init__(self):
        for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"model shape {self.name}: '{key}' must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise UserError(
                f"model shape {self.name}: heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})"
            )
        self._check_experts()
        if self.dtype not in DTYPE_BYTES:
            raise UserError(f"model shape {self.name}: unknown dtype '{self.dtype}'")
        if self.dtype_bytes != DTYPE_BYTES[self.dtype]:
            raise UserError(
                f"model shape {self.name}: dtype {self.dtype} has {DTYPE_BYTES[self.dtype]} "
                f"bytes, not {self.dtype_bytes}"
            )

    def _check_experts(self) -> None:
        for key in ("routed_experts", "experts_per_token", "expert_intermediate", "shared_intermediate"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"model shape {self.name}: '{key}' must be a non-negative integer, got {value!r}")
        for key in ("dense_layers", "mla_kv_dim", "mla_q_rank", "mla_rope_dim", "mla_nope_dim"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 0:
                raise UserError(f"model shape {self.name}: '{key}' must be a non-negative integer")
        if self.mla_kv_dim and not (0 < self.mla_rope_dim < self.mla_kv_dim and self.mla_nope_dim > 0):
            raise UserError(
                f"model shape {self.name}: multi-head latent attention needs 0 < mla_rope_dim < mla_kv_dim "
                f"({self.mla_rope_dim}, {self.mla_kv_dim}) and mla_nope_dim > 0 ({self.mla_nope_dim})"
            )
        if not self.routed_experts:
            return
        if not 1 <= self.experts_per_token <= self.routed_experts or self.expert_intermediate < 1:
            raise UserError(
                f"model shape {self.name}: a mixture of experts needs 1 <= experts per token "
                f"({self.experts_per_token}) <= routed experts ({self.routed_experts}) and an expert intermediate size"
            )
        if self.dense_layers > self.layers:
            raise UserError(f"model shape {self.name}: {self.dense_layers} dense layers of {self.layers}")
        if not self.routing_skew >= 1.0 or self.routing_skew > self.routed_experts / self.experts_per_token:
            raise UserError(
                f"model shape {self.name}: routing skew must be in 1..routed experts / experts per token, "
                f"got {self.routing_skew!r}"
            )

    @property
    def is_moe(self) -> bool:
        return self.routed_experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the mixture of experts."""
        return self.layers - self.dense_layers if self.is_moe else 0

    def expected_experts(self, routed_tokens):
        """Expected distinct routed experts T tokens read in one MoE layer: under uniform top-k
        routing over E experts, E (1 - (1 - k/E)^T); with routing skew r, over E / r equally
        likely experts (docs/performance-model.md#mixture-of-experts). Broadcasts over T."""
        e = self.routed_experts / self.routing_skew
        t = np.asarray(routed_tokens, dtype=float)
        return e * (1.0 - (1.0 - self.experts_per_token / e) ** t)

    @property
    def expert_params(self) -> int:
        """One routed expert's gated MLP (gate, up, down)."""
        return 3 * self.hidden * self.expert_intermediate

    def with_dtype(self, dtype: str) -> ModelShape:
        dtype = normalize_dtype(dtype)
        return replace(self, dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype])

    def with_layers(self, layers: int) -> ModelShape:
        return replace(self, layers=int(layers), dense_layers=min(self.dense_layers, int(layers)))

    # --- parameter and memory accounting -----------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def mla_latent(self) -> int:
        """MLA's compressed key-value latent per token (kv_lora_rank), without the rotary key."""
        return self.mla_kv_dim - self.mla_rope_dim

    @property
    def attention_params(self) -> int:
        """One layer's attention projections. MLA (DeepSeek-V2, arXiv 2405.04434 eq. 9-14): the
        query through its low rank (with its norm) or directly, the latent and rotary key from
        the hidden state (with the latent's norm), the latent up to every head's non-rotary key
        and value, and the output projection."""
        h, nh = self.hidden, self.heads
        if not self.mla_kv_dim:
            return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        qk_head = self.mla_nope_dim + self.mla_rope_dim
        qr = self.mla_q_rank
        query = h * qr + qr + qr * nh * qk_head if qr else h * nh * qk_head
        latent = h * self.mla_kv_dim + self.mla_latent
        up = self.mla_latent * nh * (self.mla_nope_dim + self.head_dim)
        return query + latent + up + nh * self.head_dim * h

    @property
    def layer_params(self) -> int:
        """One decoder layer with a dense MLP."""
        h, i = self.hidden, self.intermediate
        attn = self.attention_params
        mlp = 3 * h * i
        norms = 2 * h
        return attn + mlp + norms

    @property
    def moe_mlp_params(self) -> int:
        """One MoE layer's MLP: the router, every routed expert and the shared experts."""
        h = self.hidden
        return h * self.routed_experts + self.routed_experts * self.expert_params + 3 * h * self.shared_intermediate

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        moe = self.moe_layers * (self.moe_mlp_params - 3 * self.hidden * self.intermediate)
        return self.layers * self.layer_params + moe + embed + head + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes for one token of one sequence, all layers (K and V; multi-head latent
        attention caches one latent and rotary key instead)."""
        if self.mla_kv_dim:
            return self.layers * self.mla_kv_dim * self.dtype_bytes
        return 2 * self.layers * self.kv_dim * self.dtype_bytes

    def describe(self) -> str:
        gqa = f", {self.kv_heads} KV heads" if self.kv_heads != self.heads else ""
        if self.is_moe:
            gqa += (
                f", {self.routed_experts} experts (top-{self.experts_per_token}, intermediate "
                f"{self.expert_intermediate}, shared {self.shared_intermediate}, {self.dense_layers} dense layers)"
            )
        if self.mla_kv_dim:
            gqa += f", latent KV {self.mla_kv_dim}"
        return (
            f"{self.name}: {self.layers} layers, hidden {self.hidden}, intermediate "
            f"{self.intermediate}, {self.heads} heads x {self.head_dim}{gqa}, vocab {self.vocab}, "
            f"{self.dtype}, "
            + (f"{self.params / 1e9:.2f} B" if self.params >= 1e9 else f"{self.params / 1e6:.2f} M")
            + " parameters"
        )

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class DraftHeadsShape:
    """K Medusa-style draft heads, each L ResBlocks (x + SiLU(Wx + b), W h x h) followed by
    its own projection to the vocabulary (h x V). num_heads = 0 means no draft heads.

    tokens_per_sequence: how many of the q verified tokens per sequence the heads run on.
    None (the default, Medusa's reference code) = all q; a decoder that runs them only on the
    accepted token's hidden state uses 1.
    """

    num_heads: int
    num_layers: int
    hidden: int
    vocab: int
    tokens_per_sequence: int | None = None

    def __post_init__(self):
        t = self.tokens_per_sequence
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
            raise UserError(f"draft heads: 'tokens_per_sequence' must be a positive integer or None, got {t!r}")
        for key, most in (("num_heads", MAX_HEADS), ("num_layers", MAX_HEAD_LAYERS)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"draft heads: '{key}' must be a non-negative integer, got {value!r}")
            if value > most:
                raise UserError(f"draft heads: '{key}' is {str(value)[:24]}, beyond any drafter's (at most {most})")
        for key in ("hidden", "vocab"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"draft heads: '{key}' must be a positive integer, got {value!r}")

    @property
    def params(self) -> int:
        h, v = self.hidden, self.vocab
        return self.num_heads * (self.num_layers * (h * h + h) + h * v)

    def describe(self) -> str:
        on = "all q tokens" if self.tokens_per_sequence is None else f"{self.tokens_per_sequence} token(s) per sequence"
        return (
            f"{self.num_heads} heads x {self.num_layers} ResBlock(s), hidden {self.hidden}, vocab {self.vocab}, "
            f"run on {on}"
        )


def draft_heads_shape(shape: ModelShape, num_heads: int, num_layers: int = 1) -> DraftHeadsShape:
    """Medusa heads for `shape`: hidden and vocabulary are the model's."""
    return DraftHeadsShape(int(num_heads), int(num_layers), shape.hidden, shape.vocab)


def load_heads_shape(path, *, hidden_size: int | None = None, vocab_size: int | None = None) -> DraftHeadsShape:
    """Read a Medusa heads `config.json` (or the directory holding it).

    The published heads configs hold only medusa_num_heads/medusa_num_layers (docs/formats.md#medusa-heads): hidden
    size and vocabulary then come from `hidden_size`/`vocab_size` (the
    model's) or from the config.json of the model directory the heads sit in. A config without
    medusa_num_layers means 1 ResBlock, as in the Medusa authors' code."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    cfg = _read_json(file)
    if "medusa_num_heads" not in cfg:
        raise UserError(f"{file}: missing key 'medusa_num_heads' (not a Medusa heads config)")
    model_cfg_file = file.parent.parent / "config.json"
    model_cfg = _read_json(model_cfg_file) if model_cfg_file.is_file() and model_cfg_file != file else {}
    dims = {}
    for key, given in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
        value = cfg.get(key, given if given is not None else model_cfg.get(key))
        if value is None:
            raise UserError(f"{file}: missing key '{key}' (and no model config beside it to take it from)")
        dims[key] = int(value)
    return DraftHeadsShape(
        int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1)), dims["hidden_size"], dims["vocab_size"]
    )


# --- built-in shapes -------------------------------------------------------------------------
_HF = "Hugging Face config.json of "


def _s(name, layers, hidden, inter, heads, kv, vocab, source, head_dim=128, tied=False):
    return ModelShape(
        name=name,
        layers=layers,
        hidden=hidden,
        intermediate=inter,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        vocab=vocab,
        tied_embeddings=tied,
        dtype="fp16",
        dtype_bytes=2,
        source=source,
    )


_BUILTIN = {
    s.name: s
    for s in [
        _s(
            "llama-7b",
            32,
            4096,
            11008,
            32,
            32,
            32000,
            _HF + "huggyllama/llama-7b (LLaMA-1; Touvron et al. 2023, Table 2)",
        ),
        _s("llama-13b", 40, 5120, 13824, 40, 40, 32000, _HF + "huggyllama/llama-13b (LLaMA-1)"),
        _s("llama-33b", 60, 6656, 17920, 52, 52, 32000, _HF + 'huggyllama/llama-30b (LLaMA-1 "33B")'),
        _s("llama-65b", 80, 8192, 22016, 64, 64, 32000, _HF + "huggyllama/llama-65b (LLaMA-1)"),
        _s("llama-2-7b", 32, 4096, 11008, 32, 32, 32000, _HF + "meta-llama/Llama-2-7b-hf"),
        _s("llama-2-13b", 40, 5120, 13824, 40, 40, 32000, _HF + "meta-llama/Llama-2-13b-hf"),
        _s("llama-2-70b", 80, 8192, 28672, 64, 8, 32000, _HF + "meta-llama/Llama-2-70b-hf (GQA, 8 KV heads)"),
        _s("llama-3-8b", 32, 4096, 14336, 32, 8, 128256, _HF + "meta-llama/Meta-Llama-3-8B (GQA, 8 KV heads)"),
        _s("llama-3-70b", 80, 8192, 28672, 64, 8, 128256, _HF + "meta-llama/Meta-Llama-3-70B (GQA, 8 KV heads)"),
        _s("mistral-7b", 32, 4096, 14336, 32, 8, 32000, _HF + "mistralai/Mistral-7B-v0.1 (GQA, 8 KV heads)"),
        _s("qwen2-7b", 28, 3584, 18944, 28, 4, 152064, _HF + "Qwen/Qwen2-7B (GQA, 4 KV heads; q/k/v biases ignored)"),
    ]
}
_MOE_BUILTIN = [
    replace(
        _s("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, _HF + "mistralai/Mixtral-8x7B-v0.1 (8 experts, top-2)"),
        routed_experts=8,
        experts_per_token=2,
        expert_intermediate=14336,
    ),
    replace(
        _s("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 151936, _HF + "Qwen/Qwen3-30B-A3B (128 experts, top-8)"),
        routed_experts=128,
        experts_per_token=8,
        expert_intermediate=768,
        dtype="bf16",
    ),
    replace(
        _s(
            "deepseek-v3",
            61,
            7168,
            18432,
            128,
            128,
            129280,
            _HF + "deepseek-ai/DeepSeek-V3 (256 experts, top-8, 1 shared, 3 dense layers, MLA: query rank 1536, "
            "latent 512 + rotary key 64, non-rotary 128)",
        ),
        routed_experts=256,
        experts_per_token=8,
        expert_intermediate=2048,
        shared_intermediate=2048,
        dense_layers=3,
        mla_kv_dim=576,
        mla_q_rank=1536,
        mla_rope_dim=64,
        mla_nope_dim=128,
        dtype="bf16",
    ),
]
# Llama 4 Maverick interleaves a dense MLP of intermediate_size_mlp (16384) with a MoE layer of
# 128 routed experts (top-1) and one shared expert, both of intermediate_size (8192), every other
# layer (interleave_moe_layer_step 2): transformers' and TensorRT-LLM's Llama4 decoder layers; the
# dense layers' order does not change a step's cost, so they are counted as dense_layers.
_MOE_BUILTIN.append(
    replace(
        _s(
            "llama-4-maverick",
            48,
            5120,
            16384,
            40,
            8,
            202048,
            _HF + "meta-llama/Llama-4-Maverick-17B-128E-Instruct text_config (as copied, with its 48 layers "
            "named, in NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_llama_min_latency.py): "
            "128 experts, top-1, 1 shared expert of intermediate_size 8192, 24 dense layers of "
            "intermediate_size_mlp 16384 (interleave_moe_layer_step 2); chunked attention not modelled",
        ),
        routed_experts=128,
        experts_per_token=1,
        expert_intermediate=8192,
        shared_intermediate=8192,
        dense_layers=24,
        dtype="bf16",
    )
)
# Llama 4 Scout: every layer a MoE layer (interleave_moe_layer_step 1) of 16 routed experts (top-1)
# and one shared expert, both of intermediate_size (8192); no dense layer, so intermediate_size_mlp
# (16384) is carried unused. transformers' Llama4TextConfig defaults are Scout's, its docstring says.
_MOE_BUILTIN.append(
    replace(
        _s(
            "llama-4-scout",
            48,
            5120,
            16384,
            40,
            8,
            202048,
            "transformers 5.24 Llama4TextConfig defaults, documented as 'a similar configuration to that of "
            "meta-llama/Llama-4-Scout-17B-16E': 16 experts, top-1, 1 shared expert of intermediate_size 8192 in "
            "every one of its 48 layers (interleave_moe_layer_step 1); chunked attention not modelled",
        ),
        routed_experts=16,
        experts_per_token=1,
        expert_intermediate=8192,
        shared_intermediate=8192,
        dense_layers=0,
        dtype="bf16",
    )
)
_BUILTIN.update({s.name: s for s in _MOE_BUILTIN})
# Vicuna v1.3 (the Medusa paper's models) are LLaMA-1 fine-tunes with unchanged shapes.
_ALIASES = {
    "vicuna-7b": "llama-7b",
    "vicuna-13b": "llama-13b",
    "vicuna-33b": "llama-33b",
    "llama-30b": "llama-33b",
    "llama2-7b": "llama-2-7b",
    "llama2-13b": "llama-2-13b",
    "llama2-70b": "llama-2-70b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
}


def builtin_shapes() -> dict[str, ModelShape]:
    return dict(_BUILTIN)


# --- Hugging Face config.json ---------------------------------------------------------------
_LLAMA_LIKE = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Phi3ForCausalLM",
    "InternLM2ForCausalLM",
    "YiForCausalLM",
    "OlmoForCausalLM",
    "Olmo2ForCausalLM",
    "GraniteForCausalLM",
    "CohereForCausalLM",
    "StableLmForCausalLM",
    "DeepseekForCausalLM",
    "MiniCPMForCausalLM",
}
#: mixture-of-experts decoders read by `_moe_fields` (docs/performance-model.md#mixture-of-experts)
_MOE = {
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
}
_LLAMA_LIKE_TYPES = {a.removesuffix("ForCausalLM").lower() for a in _LLAMA_LIKE}
_MOE_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
_NOT_LLAMA_HINT = {
    "gpt2": "not gated-MLP Llama-like",
    "mamba": "not a transformer",
    "rwkv": "not a transformer",
    "t5": "an encoder-decoder",
}


def _read_json(file: Path) -> dict:
    data = read_json_input(file, "a model config.json")
    if not isinstance(data, dict):
        raise UserError(f"{file}: expected a JSON object")
    return data


def shape_from_config(config: dict, *, name: str, source: str = "") -> ModelShape:
    """A ModelShape from the dict of a Hugging Face config.json."""
    archs = config.get("architectures") or []
    mtype = str(config.get("model_type", "")).lower()
    if archs:
        arch = archs[0]
        if arch not in _LLAMA_LIKE and arch not in _MOE:
            why = next((v for k, v in _NOT_LLAMA_HINT.items() if k in arch.lower()), None)
            raise UserError(
                f"{name}: architecture '{arch}' is not supported"
                + (f" ({why})" if why else "")
                + "; supported: Llama-like decoders such as LlamaForCausalLM, "
                "MistralForCausalLM, Qwen2ForCausalLM, and the mixtures of experts MixtralForCausalLM, "
                "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM"
            )
    elif mtype:
        if mtype not in _LLAMA_LIKE_TYPES and mtype not in _MOE_TYPES:
            raise UserError(
                f"{name}: model_type '{mtype}' is not supported; supported: Llama-like "
                "decoders (llama, mistral, qwen2, ...)"
            )
    else:
        raise UserError(f"{name}: missing key 'architectures' (and no 'model_type'): cannot tell the architecture")

    def need(key: str) -> int:
        if key not in config or config[key] is None:
            raise UserError(f"{name}: missing key '{key}'")
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{name}: key '{key}' must be a positive integer, got {value!r}")
        return value

    hidden = need("hidden_size")
    layers = need("num_hidden_layers")
    heads = need("num_attention_heads")
    inter = need("intermediate_size")
    vocab = need("vocab_size")
    kv = need("num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
    moe = _moe_fields(config, need)
    if (archs and archs[0] in _MOE or mtype in _MOE_TYPES) and "routed_experts" not in moe:
        raise UserError(
            f"{name}: a mixture-of-experts architecture without its experts "
            "(num_local_experts, num_experts or n_routed_experts)"
        )
    if config.get("kv_lora_rank") is not None:
        # multi-head latent attention: heads of v_head_dim, one cached latent (DeepSeek-V2, arXiv 2405.04434)
        head_dim = need("v_head_dim")
    elif config.get("head_dim") is not None:
        head_dim = need("head_dim")
    else:
        if hidden % heads:
            raise UserError(
                f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads "
                f"{heads} and there is no 'head_dim'"
            )
        head_dim = hidden // heads
    raw_dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    dtype = normalize_dtype(raw_dtype, what=f"{name}: torch_dtype")
    return ModelShape(
        name=name,
        layers=layers,
        hidden=hidden,
        intermediate=inter,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        vocab=vocab,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype,
        dtype_bytes=DTYPE_BYTES[dtype],
        source=source or name,
        **moe,
    )


def _moe_fields(config: dict, need) -> dict:
    """The mixture-of-experts fields of a config.json (Mixtral, Qwen-MoE and DeepSeek key names;
    {} for a dense model) and MLA's cached latent (docs/performance-model.md#mixture-of-experts)."""
    out = {}
    if config.get("kv_lora_rank") is not None:
        out["mla_kv_dim"] = need("kv_lora_rank") + need("qk_rope_head_dim")
        out["mla_rope_dim"] = need("qk_rope_head_dim")
        out["mla_nope_dim"] = need("qk_nope_head_dim")
        out["mla_q_rank"] = need("q_lora_rank") if config.get("q_lora_rank") is not None else 0
    experts_key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts") if config.get(k)), None)
    if experts_key is None:
        return out
    out["routed_experts"] = need(experts_key)
    out["experts_per_token"] = need("num_experts_per_tok")
    if config.get("moe_intermediate_size") is not None:
        out["expert_intermediate"] = need("moe_intermediate_size")
    else:  # Mixtral: every expert is the dense MLP's size
        out["expert_intermediate"] = need("intermediate_size")
    if config.get("n_shared_experts"):
        out["shared_intermediate"] = need("n_shared_experts") * out["expert_intermediate"]
    elif config.get("shared_expert_intermediate_size"):
        out["shared_intermediate"] = need("shared_expert_intermediate_size")
    dense = config.get("first_k_dense_replace") or len(config.get("mlp_only_layers") or [])
    out["dense_layers"] = int(dense)
    return out


def model_shape(name_or_path, *, dtype: str | None = None, name: str | None = None) -> ModelShape:
    """A built-in shape name, an alias (vicuna-7b), a config.json or a model directory.

    dtype overrides the shape's own dtype (e.g. fp32 for a CPU run of a bf16 checkpoint);
    name overrides the name a shape read from a file gets (its path).
    """
    spec = str(name_or_path)
    key = spec.lower()
    shape = None
    if key in _BUILTIN or key in _ALIASES:
        base = _BUILTIN[_ALIASES.get(key, key)]
        shape = (
            base
            if key in _BUILTIN
            else replace(base, name=key, source=base.source + f"; {key} is a fine-tune with the same shape")
        )
    else:
        path = Path(spec)
        if path.is_dir():
            file = path / "config.json"
            if not file.is_file():
                raise UserError(f"{path}: a directory without config.json")
        elif path.is_file():
            file = path
        elif path.suffix == ".json" or "/" in spec or "\\" in spec:
            raise UserError(f"{spec}: no such file or directory")
        else:
            names = ", ".join(sorted(_BUILTIN) + sorted(_ALIASES))
            raise UserError(
                f"--model: unknown model '{spec}' (built-in: {names}, or a path to config.json / a model directory)"
            )
        shape = shape_from_config(_read_json(file), name=name or str(spec), source=portable_path(file))
    if dtype is not None:
        shape = shape.with_dtype(dtype)
    return shape


def heads_config_near(model_spec) -> Path | None:
    """The Medusa heads config.json of a model directory (or of the directory of a config.json),
    by the one rule of `treeopt.layout.default_heads_dir`; None when there is none."""
    path = Path(str(model_spec))
    base = path.parent if path.is_file() else path if path.is_dir() else None
    found = default_heads_dir(base) if base is not None else None
    return None if found is None else found / "config.json"


def resolve_heads(
    model_spec,
    shape: ModelShape,
    *,
    num_heads: int | None = None,
    num_layers: int | None = None,
    accuracy_heads: int | None = None,
    tokens_per_sequence: int | None = None,
) -> DraftHeadsShape:
    """Draft heads for a model: K = num_heads, else the accuracy table's head count, else the
    Medusa heads config next to the model, else 5; L = num_layers, else that config's, else 1.
    Hidden size and vocabulary are the model's."""
    near = heads_config_near(model_spec)
    near_shape = load_heads_shape(near, hidden_size=shape.hidden, vocab_size=shape.vocab) if near is not None else None
    if num_heads is None:
        num_heads = (
            accuracy_heads if accuracy_heads is not None else (near_shape.num_heads if near_shape is not None else 5)
        )
    if num_layers is None:
        num_layers = near_shape.num_layers if near_shape is not None else 1
    if num_heads < 0:
        raise UserError(f"--num-heads: must be >= 0, got {num_heads}")
    if num_layers < 0:
        raise UserError(f"--head-layers: must be >= 0, got {num_layers}")
    if tokens_per_sequence is not None and tokens_per_sequence < 1:
        raise UserError(f"--head-tokens: must be >= 1, got {tokens_per_sequence}")
    return replace(draft_heads_shape(shape, num_heads, num_layers), tokens_per_sequence=tokens_per_sequence)
