"""Hydra heads (Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft Heads for Medusa
Decoding"), in the layout their authors publish (docs/formats.md, "Hydra heads").

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
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from calibration.drafters.base import Drafter, DraftState
from calibration.drafters.io import check_state, config_int, load_state, read_config
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_json

WEIGHTS_PT = "hydra_lm_head.pt"
WEIGHTS_SAFETENSORS = "hydra_lm_head.safetensors"
#: the head architectures treeopt reads (the authors' "mlp"; their "prefix-mlp" adds a decoder
#: layer over the context, which the reference decoder does not run yet)
SUPPORTED_ARCHS = ("mlp",)


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


class HydraHeads(nn.Module, Drafter):
    kind = "hydra"

    def __init__(
        self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1, *, grounded: bool = True
    ):
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

    @property
    def sequential(self) -> bool:  # type: ignore[override]
        return self.grounded

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
    ) -> HydraHeads:
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
        grounded = bool(config.get("grounded_heads", True))
        if num_heads is None:
            num_heads = configured
        elif not 1 <= num_heads <= configured:
            raise UserError(f"--num-heads: {path} holds {configured} Hydra heads, asked for {num_heads}")
        state = load_state(path, WEIGHTS_SAFETENSORS, WEIGHTS_PT)
        proj = state.get("hydra_lm_head.0.weight")
        if proj is None or proj.ndim != 2:
            raise UserError(f"{path}: weights lack key 'hydra_lm_head.0.weight' (head 0's projection)")
        vocab_size, hidden_size = proj.shape
        if "input_embed_fn.weight" not in state and grounded:
            if input_embeddings is None:
                raise UserError(f"{path}: weights lack 'input_embed_fn.weight' and no base embeddings were given")
            state = {**state, "input_embed_fn.weight": input_embeddings.detach().to("cpu")}
        elif not grounded and "input_embed_fn.weight" not in state:
            state = {**state, "input_embed_fn.weight": torch.zeros(vocab_size, hidden_size)}
        heads = cls(int(hidden_size), int(vocab_size), num_heads, num_layers, grounded=grounded)
        heads.load_state_dict(check_state(path, heads.state_dict(), state))
        heads.base_model_name_or_path = config.get("base_model_name_or_path", "")
        return heads.to(device=device, dtype=dtype).eval()

    def save_pretrained(
        self, path, *, base_model_name_or_path: str = "", dtype=torch.bfloat16, format: str = "safetensors"
    ) -> None:
        """config.json + hydra_lm_head.safetensors, or hydra_lm_head.pt (format="pt"), the file
        the authors' loader reads."""
        if format not in ("safetensors", "pt"):
            raise UserError(f"format: must be 'safetensors' or 'pt', got {format!r}")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
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
                "hydra_head_arch": "mlp",
                "grounded_heads": self.grounded,
                "hidden_state_offset": 0,
                "base_model_name_or_path": base_model_name_or_path,
                "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size,
            },
        )


__all__ = ["HydraHeads", "HydraResBlock", "SUPPORTED_ARCHS"]
