"""Medusa draft heads, in the layout the Medusa authors publish.

Head k (0-based here, "head k+1" in the papers) reads the base model's last hidden state at
position t and predicts token t+k+2: head 0 guesses the token after the base model's own next
token. Each head is L ResBlocks (x + SiLU(Wx + b)) followed by a bias-free projection to the
vocabulary. Subclassing ModuleList makes the state-dict keys exactly Medusa's:
`{k}.{j}.linear.weight`, `{k}.{j}.linear.bias` for j < L, and `{k}.{L}.weight`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from treeopt.errors import UserError
from treeopt.fileio import atomic_path, read_json_input, write_json

CONFIG_NAME = "config.json"
WEIGHTS_SAFETENSORS = "medusa_lm_head.safetensors"
WEIGHTS_PT = "medusa_lm_head.pt"


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        # Zero init makes a fresh head start as the base lm_head (Medusa's recipe).
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.ModuleList):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1):
        super().__init__(
            nn.Sequential(
                *[ResBlock(hidden_size) for _ in range(num_layers)],
                nn.Linear(hidden_size, vocab_size, bias=False),
            )
            for _ in range(num_heads)
        )
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.num_heads = num_heads
        self.num_layers = num_layers

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., h) -> logits (K, ..., V)."""
        return torch.stack([head(hidden) for head in self])

    def init_projections_from(self, lm_head_weight: torch.Tensor) -> None:
        with torch.no_grad():
            for head in self:
                head[-1].weight.copy_(lm_head_weight)

    @classmethod
    def from_pretrained(cls, path, *, device=None, dtype=None) -> MedusaHeads:
        """Load a Medusa heads directory: config.json + medusa_lm_head.{safetensors,pt}."""
        path = Path(path)
        config_file = path / CONFIG_NAME
        if not config_file.is_file():
            raise UserError(f"{path}: not a Medusa heads directory (no {CONFIG_NAME})")
        config = read_json_input(config_file, "a Medusa heads config")
        if not isinstance(config, dict):
            raise UserError(f"{config_file}: expected a JSON object (a Medusa heads config)")
        for key in ("medusa_num_heads", "medusa_num_layers"):
            if not isinstance(config.get(key), int) or config[key] < (1 if key == "medusa_num_heads" else 0):
                raise UserError(f"{config_file}: missing or invalid '{key}'")
        state = _load_state_dict(path)
        num_heads, num_layers = config["medusa_num_heads"], config["medusa_num_layers"]
        proj = state.get(f"0.{num_layers}.weight")
        if proj is None or proj.ndim != 2:
            raise UserError(f"{path}: weights lack key '0.{num_layers}.weight' (head 0's projection)")
        vocab_size, hidden_size = proj.shape
        heads = cls(hidden_size, vocab_size, num_heads, num_layers)
        expected = heads.state_dict()
        missing = [k for k in expected if k not in state]
        if missing:
            raise UserError(f"{path}: weights lack key '{missing[0]}' ({len(missing)} missing)")
        for key, value in expected.items():
            if tuple(state[key].shape) != tuple(value.shape):
                raise UserError(
                    f"{path}: weight '{key}' has shape {tuple(state[key].shape)}, "
                    f"expected {tuple(value.shape)}"
                )
        heads.load_state_dict({k: state[k] for k in expected})
        heads.base_model_name_or_path = config.get("base_model_name_or_path", "")
        return heads.to(device=device, dtype=dtype).eval()

    def save_pretrained(self, path, *, base_model_name_or_path: str = "", dtype=torch.bfloat16) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        with atomic_path(path / WEIGHTS_SAFETENSORS) as tmp:
            save_file(state, str(tmp))
        write_json(
            path / CONFIG_NAME,
            {
                "medusa_num_heads": self.num_heads,
                "medusa_num_layers": self.num_layers,
                "base_model_name_or_path": base_model_name_or_path,
                "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size,
            },
        )


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if (path / WEIGHTS_SAFETENSORS).is_file():
        try:
            return load_file(str(path / WEIGHTS_SAFETENSORS))
        except (SafetensorError, OSError) as err:
            raise UserError(f"{path / WEIGHTS_SAFETENSORS}: cannot read ({err})") from None
    if (path / WEIGHTS_PT).is_file():
        try:
            state = torch.load(path / WEIGHTS_PT, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch.load raises many types for a corrupt pickle
            raise UserError(f"{path / WEIGHTS_PT}: cannot read ({err})") from None
        if not isinstance(state, dict):
            raise UserError(f"{path / WEIGHTS_PT}: expected a state dict, found {type(state).__name__}")
        return state
    raise UserError(f"{path}: no {WEIGHTS_SAFETENSORS} or {WEIGHTS_PT}")
