"""Hydra heads (Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft Heads for Medusa
Decoding"), in the layout their authors publish (docs/formats.md#hydra-heads).

Head k (0-based) of a grounded Hydra set reads the concatenation
``[h_t, E(x_{t+1}), ..., E(x_{t+k+1})]`` of the base model's last hidden state and the base
model's input embeddings of the tokens already on the candidate's path (x_{t+1} is the root,
the base model's own next token) and predicts x_{t+k+2} (paper section 3). Its first block
maps the (k + 2)·h input back to h: ``res_connection(x) + SiLU(linear(x))``; then L - 1
ordinary ResBlocks ``x + SiLU(Wx + b)``; then its own projection with bias,
``hydra_lm_head.{k}``. Ungrounded heads read h_t alone (Medusa heads with a biased projection).

Files: config.json (``hydra_num_heads``, ``hydra_num_layers``, ``hydra_head_arch``,
``grounded_heads``, ``hidden_state_offset``, ``base_model_name_or_path``) and the state dict
in ``hydra_lm_head.pt`` (the authors' file) or ``hydra_lm_head.safetensors``, with keys
``input_embed_fn.weight``, ``hydra_mlp.{k}.{j}.linear.{weight,bias}``,
``hydra_mlp.{k}.0.res_connection.{weight,bias}`` (grounded) and
``hydra_lm_head.{k}.{weight,bias}``.

Hydra++ (``hydra_head_arch: "prefix-mlp"``, the paper's Hydra++ section) adds one Llama decoder layer built
from the base model's config, ``prefix_embeding_layer``: it runs causally over the base model's
last hidden states of the whole context, then the final RMSNorm, and its output at t replaces
h_t as the heads' input. The authors' module wraps every block and projection in a Sequential
behind a Dropout, so that layout keys them ``hydra_mlp.{k}.{2j+1}.*`` and
``hydra_lm_head.{k}.1.*``, and the layer ``prefix_embeding_layer.layers.0.*`` and
``prefix_embeding_layer.norm.weight`` (docs/formats.md#hydra-heads).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from calibration.drafters.base import Drafter, DraftState
from calibration.drafters.io import check_state, config_int, load_state, read_config
from calibration.model_calls import cache_kwargs
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_json

WEIGHTS_PT = "hydra_lm_head.pt"
WEIGHTS_SAFETENSORS = "hydra_lm_head.safetensors"
#: the head architectures treeopt reads: the authors' "mlp" and Hydra++'s "prefix-mlp" (an extra
#: decoder layer over the context); their attention heads ("cross-attn", "eagle-attn") are not
SUPPORTED_ARCHS = ("mlp", "prefix-mlp")
PREFIX_ARCH = "prefix-mlp"


class HydraResBlock(nn.Module):
    """``res(x) + SiLU(Wx + b)``, with ``res`` a projection when the input is wider than h."""

    def __init__(self, hidden_size: int, conditions: int = 0):
        super().__init__()
        width = hidden_size * (conditions + 1)
        self.linear = nn.Linear(width, hidden_size)
        # Zero init: a fresh head starts as its residual path (the authors' recipe).
        nn.init.zeros_(self.linear.weight)
        self.res_connection = nn.Linear(width, hidden_size) if conditions else nn.Identity()
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res_connection(x) + self.act(self.linear(x))


def prefix_layer_config(base_config) -> LlamaConfig:
    """The config of Hydra++'s prefix layer: the base model's (text) config with one layer, as
    the authors build it (a copy of the base config, num_hidden_layers = 1)."""
    text = base_config.get_text_config() if hasattr(base_config, "get_text_config") else base_config
    config = LlamaConfig(**{**text.to_dict(), "num_hidden_layers": 1, "layer_types": None})
    config._attn_implementation = "sdpa"
    return config


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (True = may attend) -> 0 / dtype's most negative value (transformers' own value)."""
    return torch.where(mask, torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype))


class HydraPrefixLayer(nn.Module):
    """Hydra++'s ``prefix_embeding_layer``: one decoder layer of the base architecture over the
    base model's last hidden states, then the final RMSNorm (the authors' one-layer LlamaModel
    fed ``inputs_embeds``; its unused ``embed_tokens`` is not kept)."""

    def __init__(self, base_config):
        super().__init__()
        config = prefix_layer_config(base_config)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, hidden, attention_mask, position_ids, cache=None) -> torch.Tensor:
        rotary = self.rotary_emb(hidden, position_ids)
        out = self.layers[0](
            hidden,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=cache is not None,
            position_embeddings=rotary,
            **cache_kwargs(self.layers[0], cache),
        )
        return self.norm(out)


def _from_authors_prefix_keys(state: dict) -> dict:
    """The prefix-mlp file's keys -> this module's: Sequential index 2j+1 (behind a Dropout) ->
    j; ``hydra_lm_head.{k}.1`` -> ``hydra_lm_head.{k}``."""
    out = {}
    for key, value in state.items():
        key = re.sub(r"^hydra_mlp\.(\d+)\.(\d+)\.", lambda m: f"hydra_mlp.{m[1]}.{(int(m[2]) - 1) // 2}.", key)
        out[re.sub(r"^hydra_lm_head\.(\d+)\.1\.", r"hydra_lm_head.\1.", key)] = value
    return out


def _to_authors_prefix_keys(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        key = re.sub(r"^hydra_mlp\.(\d+)\.(\d+)\.", lambda m: f"hydra_mlp.{m[1]}.{2 * int(m[2]) + 1}.", key)
        out[re.sub(r"^hydra_lm_head\.(\d+)\.", r"hydra_lm_head.\1.1.", key)] = value
    return out


class HydraHeads(nn.Module, Drafter):
    kind = "hydra"

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int = 1,
        *,
        grounded: bool = True,
        prefix_config=None,
    ):
        """`prefix_config`: the base model's config, for Hydra++'s prefix layer (None: plain
        "mlp" heads)."""
        super().__init__()
        if num_layers < 1:
            raise UserError(f"hydra_num_layers: must be at least 1, got {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.grounded = num_heads, num_layers, grounded
        self.input_embed_fn = nn.Embedding(vocab_size, hidden_size)
        self.hydra_mlp = nn.ModuleList(
            nn.Sequential(
                HydraResBlock(hidden_size, k + 1 if grounded else 0),
                *[HydraResBlock(hidden_size) for _ in range(num_layers - 1)],
            )
            for k in range(num_heads)
        )
        self.hydra_lm_head = nn.ModuleList(nn.Linear(hidden_size, vocab_size) for _ in range(num_heads))
        if prefix_config is not None:
            self.prefix_embeding_layer = HydraPrefixLayer(prefix_config)

    @property
    def sequential(self) -> bool:  # type: ignore[override]
        # the prefix layer's state is kept by the decoder's sequential path either way
        return self.grounded or self.prefix_layer

    @property
    def prefix_layer(self) -> bool:
        """Hydra++: a decoder layer over the context replaces h_t (docs/decoder.md#hydra)."""
        return hasattr(self, "prefix_embeding_layer")

    @property
    def head_arch(self) -> str:
        return PREFIX_ARCH if self.prefix_layer else "mlp"

    def context_states(
        self,
        hidden: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        *,
        past_valid: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """Hydra++'s prefix layer on n new tokens per sequence: `hidden` (b, n, h) their base
        hidden states, `valid` (b, n) which are real tokens, `positions` (b, n) their position
        ids; `cache` (a one-layer `calibration.kv_cache.KVCache`, None: no cache) holds the C
        earlier tokens, `past_valid` (b, C) which of them each sequence sees. A token sees the
        valid earlier tokens and the valid new ones up to itself (causal); a padding token sees
        itself too, so that no row is empty. Returns (b, n, h): the heads' input at each token
        (docs/decoder.md#hydra)."""
        b, n = valid.shape
        causal = torch.ones((n, n), dtype=torch.bool, device=valid.device).tril()
        eye = torch.eye(n, dtype=torch.bool, device=valid.device)
        new = (causal[None] & valid[:, None, :]) | eye[None]
        if past_valid is None:
            past_valid = valid.new_zeros((b, 0))
        past = past_valid[:, None, :].expand(b, n, past_valid.shape[1])
        mask = additive(torch.cat([past, new], dim=-1), hidden.dtype).to(hidden.device)[:, None]
        return self.prefix_embeding_layer(hidden, mask, positions, cache)

    # ---- the drafter interface: the state is the head input so far, [h, E(root), ...] -------

    def begin(self, hidden: torch.Tensor, root: torch.Tensor) -> DraftState:
        if not self.grounded:
            return (hidden,)
        return (torch.cat([hidden, self.input_embed_fn(root)], dim=-1),)

    def depth_logits(self, state: DraftState, depth: int) -> tuple[torch.Tensor, DraftState]:
        return self.hydra_lm_head[depth](self.hydra_mlp[depth](state[0])), state

    def child_state(self, carry: DraftState, depth: int, tokens: torch.Tensor) -> DraftState:
        if not self.grounded:
            return carry
        return (torch.cat([carry[0], self.input_embed_fn(tokens)], dim=-1),)

    def init_from_base(self, lm_head_weight: torch.Tensor, input_embeddings: torch.Tensor) -> None:
        """Projections start as the base lm_head, the path embeddings as the base model's
        (the authors' recipe)."""
        with torch.no_grad():
            self.input_embed_fn.weight.copy_(input_embeddings)
            for head in self.hydra_lm_head:
                head.weight.copy_(lm_head_weight)
                head.bias.zero_()

    # ---- files ------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        device=None,
        dtype=None,
        num_heads: int | None = None,
        input_embeddings: torch.Tensor | None = None,
        base_config=None,
    ) -> HydraHeads:
        """`base_config`: the base model's config (transformers), needed by "prefix-mlp" heads
        (their decoder layer is built from it)."""
        path = Path(path)
        config, config_file = read_config(path, "a Hydra heads config")
        configured = config_int(config, config_file, "hydra_num_heads", minimum=1)
        num_layers = config_int(config, config_file, "hydra_num_layers", minimum=1, default=1)
        arch = config.get("hydra_head_arch", "mlp")
        if arch not in SUPPORTED_ARCHS:
            raise UserError(
                f"{config_file}: hydra_head_arch {arch!r} is not supported (treeopt reads {', '.join(SUPPORTED_ARCHS)})"
            )
        offset = config.get("hidden_state_offset", 0)
        if offset not in (0, None):
            raise UserError(
                f"{config_file}: hidden_state_offset {offset!r} is not supported (treeopt "
                "feeds the heads the base model's last hidden state: offset 0)"
            )
        if arch == PREFIX_ARCH and base_config is None:
            raise UserError(
                f"{config_file}: hydra_head_arch 'prefix-mlp' needs the base model's config "
                "(its prefix decoder layer is built from it)"
            )
        grounded = bool(config.get("grounded_heads", True))
        if num_heads is None:
            num_heads = configured
        elif not 1 <= num_heads <= configured:
            raise UserError(f"--num-heads: {path} holds {configured} Hydra heads, asked for {num_heads}")
        state = load_state(path, WEIGHTS_SAFETENSORS, WEIGHTS_PT)
        if arch == PREFIX_ARCH:
            state = _from_authors_prefix_keys(state)
        proj = state.get("hydra_lm_head.0.weight")
        if proj is None or proj.ndim != 2:
            raise UserError(f"{path}: weights lack key 'hydra_lm_head.0.weight' (head 0's projection)")
        vocab_size, hidden_size = proj.shape
        _check_config_against_weights(config, config_file, state, configured, (vocab_size, hidden_size))
        if "input_embed_fn.weight" not in state and grounded:
            if input_embeddings is None:
                raise UserError(f"{path}: weights lack 'input_embed_fn.weight' and no base embeddings were given")
            state = {**state, "input_embed_fn.weight": input_embeddings.detach().to("cpu")}
        elif not grounded and "input_embed_fn.weight" not in state:
            state = {**state, "input_embed_fn.weight": torch.zeros(vocab_size, hidden_size)}
        heads = cls(
            int(hidden_size),
            int(vocab_size),
            num_heads,
            num_layers,
            grounded=grounded,
            prefix_config=base_config if arch == PREFIX_ARCH else None,
        )
        expected = heads.state_dict()
        if arch == PREFIX_ARCH:
            # the file's names, so that a missing or misshapen weight is named as written there
            found = check_state(path, _to_authors_prefix_keys(expected), _to_authors_prefix_keys(state))
            heads.load_state_dict(_from_authors_prefix_keys(found))
        else:
            heads.load_state_dict(check_state(path, expected, state))
        heads.base_model_name_or_path = config.get("base_model_name_or_path", "")
        return heads.to(device=device, dtype=dtype).eval()

    def save_pretrained(
        self,
        path,
        *,
        base_model_name_or_path: str = "",
        dtype=torch.bfloat16,
        format: str = "safetensors",
        input_embeddings: bool = True,
    ) -> None:
        """config.json + hydra_lm_head.safetensors, or hydra_lm_head.pt (format="pt"), the file
        the authors' loader reads (prefix-mlp heads in their prefix-mlp key layout).
        input_embeddings=False leaves out `input_embed_fn.weight` where it is the base model's
        frozen embedding table: `from_pretrained` takes it from the base model again."""
        if format not in ("safetensors", "pt"):
            raise UserError(f"format: must be 'safetensors' or 'pt', got {format!r}")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        if not input_embeddings:
            del state["input_embed_fn.weight"]
        if self.prefix_layer:
            state = _to_authors_prefix_keys(state)
        if format == "pt":
            with atomic_path(path / WEIGHTS_PT) as tmp:
                torch.save(state, tmp)
        else:
            with atomic_path(path / WEIGHTS_SAFETENSORS) as tmp:
                save_file(state, str(tmp))
        write_json(
            path / "config.json",
            {
                "hydra_num_heads": self.num_heads,
                "hydra_num_layers": self.num_layers,
                "hydra_head_arch": self.head_arch,
                "grounded_heads": self.grounded,
                "hidden_state_offset": 0,
                "base_model_name_or_path": base_model_name_or_path,
                "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size,
            },
        )


__all__ = ["HydraHeads", "HydraPrefixLayer", "HydraResBlock", "SUPPORTED_ARCHS", "prefix_layer_config"]


def _check_config_against_weights(config: dict, config_file, state: dict, configured: int, proj_shape) -> None:
    """The config's head count and sizes must be those of the weights, checked before any module
    is built: a config asking for 5000 heads of 4 would otherwise build them (the last one
    5002 hidden sizes wide) before the weights are compared."""
    held = len({key.split(".")[1] for key in state if key.startswith("hydra_lm_head.")})
    if configured > held:
        raise UserError(f"{config_file}: hydra_num_heads {configured}, but the weights hold {held} heads")
    vocab_size, hidden_size = (int(n) for n in proj_shape)
    for name, size in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
        if name in config and config[name] != size:
            raise UserError(
                f"{config_file}: {name} {config[name]!r}, but the weights' head 0 projection is "
                f"{vocab_size} x {hidden_size} (vocab x hidden)"
            )
