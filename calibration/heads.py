"""Medusa draft heads, in the layout the Medusa authors publish.

Head k (0-based here, "head k+1" in the papers) reads the base model's last hidden state at
position t and predicts token t+k+2: head 0 guesses the token after the base model's own next
token. Each head is L ResBlocks (x + SiLU(Wx + b)) followed by a bias-free projection to the
vocabulary. Subclassing ModuleList makes the state-dict keys exactly Medusa's:
`{k}.{j}.linear.weight`, `{k}.{j}.linear.bias` for j < L, and `{k}.{L}.weight`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from calibration.weights import check_state, torch_load
from treeopt.errors import UserError, first_line
from treeopt.fileio import atomic_path, read_json_input, write_json

CONFIG_NAME = "config.json"
WEIGHTS_SAFETENSORS = "medusa_lm_head.safetensors"
WEIGHTS_PT = "medusa_lm_head.pt"
# a Medusa-1.0 full checkpoint: the heads live in the model's own weight files under this prefix
FULL_PREFIX = "medusa_head."
MODEL_SAFETENSORS = "model.safetensors"
MODEL_BIN = "pytorch_model.bin"


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
    def from_pretrained(
        cls,
        path,
        *,
        device=None,
        dtype=None,
        num_heads: int | None = None,
        lm_head_weight: torch.Tensor | None = None,
        warn=None,
    ) -> MedusaHeads:
        """Load Medusa heads in any of the layouts of docs/formats.md#medusa-heads: a heads
        directory (config.json + medusa_lm_head.{safetensors,pt}), a Medusa-1.0 full checkpoint
        (`medusa_head.*` keys inside the model's weights, possibly sharded), or "medusa2" heads
        (`"version": "2"`: ResBlocks only, the projection is the base model's `lm_head_weight`).

        num_heads: use this many heads of the weights instead of config.json's medusa_num_heads.
        When the weights hold more heads than the config says (the published Vicuna v1.3
        configs say 2 while the weights hold 5), `warn` gets one line and the config's count is
        used unless num_heads says otherwise."""
        path = Path(path)
        config, configured, num_layers = _read_config(path)
        state = _load_state_dict(path)
        stored = _heads_in(state)
        num_heads = _heads_used(path, num_heads, configured, stored, num_layers, warn or _warn)
        if str(config.get("version", "1")) == "2":
            state, (vocab_size, hidden_size) = _with_shared_lm_head(path, state, lm_head_weight, num_heads, num_layers)
        else:
            proj = state.get(f"0.{num_layers}.weight")
            if proj is None or proj.ndim != 2:
                raise UserError(f"{path}: weights lack key '0.{num_layers}.weight' (head 0's projection)")
            vocab_size, hidden_size = proj.shape
        heads = cls(hidden_size, vocab_size, num_heads, num_layers)
        heads.load_state_dict(check_state(path, heads.state_dict(), state))
        heads.base_model_name_or_path = config.get("base_model_name_or_path", "")
        return heads.to(device=device, dtype=dtype).eval()

    def save_pretrained(
        self, path, *, base_model_name_or_path: str = "", dtype=torch.bfloat16, format: str = "safetensors", warn=None
    ) -> None:
        """config.json + medusa_lm_head.safetensors, or medusa_lm_head.pt (format="pt") for
        the Medusa authors' loader, which reads only the .pt file."""
        if format not in ("safetensors", "pt"):
            raise UserError(f"format: must be 'safetensors' or 'pt', got {format!r}")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        if format == "pt":
            if self.num_layers >= 2:
                # why: the authors' loader builds `[ResBlock(h)] * L`, one module object repeated,
                # so the L stored ResBlocks collapse into one (docs/formats.md#medusa-heads)
                (warn or _warn)(
                    f"treeopt: warning: {path / WEIGHTS_PT}: heads with {self.num_layers} ResBlocks "
                    "load wrong in the Medusa authors' code (it shares one ResBlock object across "
                    "layers); treeopt and weights-only loaders read them correctly"
                )
            with atomic_path(path / WEIGHTS_PT) as tmp:
                torch.save(state, tmp)
        else:
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


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def _heads_in(state: dict) -> int:
    """The number of heads a state dict holds: 1 + the largest leading index `{k}.`."""
    ks = [int(key.split(".", 1)[0]) for key in state if key.split(".", 1)[0].isdigit()]
    return max(ks) + 1 if ks else 0


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if (path / WEIGHTS_SAFETENSORS).is_file():
        try:
            state = load_file(str(path / WEIGHTS_SAFETENSORS))
        except (SafetensorError, OSError) as err:
            raise UserError(f"{path / WEIGHTS_SAFETENSORS}: cannot read ({first_line(err)})") from None
        return _without_model_prefix(path / WEIGHTS_SAFETENSORS, state)
    if (path / WEIGHTS_PT).is_file():
        state = torch_load(path / WEIGHTS_PT)
        if not isinstance(state, dict):
            raise UserError(f"{path / WEIGHTS_PT}: expected a state dict, found {type(state).__name__}")
        return _without_model_prefix(path / WEIGHTS_PT, state)
    state = _full_checkpoint_heads(path)
    if state is None:
        raise UserError(
            f"{path}: no {WEIGHTS_SAFETENSORS} or {WEIGHTS_PT}, and no '{FULL_PREFIX}*' weights in "
            "the model's weight files"
        )
    return state


def _without_model_prefix(file: Path, state: dict) -> dict:
    """A heads file's state dict with the `medusa_head.` prefix of `MedusaModel`'s attribute
    removed from its keys, when the heads were saved through the model (`medusa_head.0.0.linear.weight`
    for `0.0.linear.weight`); a file with both spellings is refused."""
    # why: the Medusa authors' loader reads these files into `MedusaModel.medusa_head`, keys
    # `{k}.{j}.linear.weight` (FasterDecoding/Medusa, medusa/model/medusa_model.py); a state
    # dict taken from the whole model carries the attribute name in front, and both
    # Medusa-1.0 full checkpoints and this loader strip it (docs/formats.md#medusa-heads)
    prefixed = [k for k in state if isinstance(k, str) and k.startswith(FULL_PREFIX)]
    if not prefixed:
        return state
    bare = [k for k in state if isinstance(k, str) and k.split(".", 1)[0].isdigit()]
    if bare:
        raise UserError(
            f"{file}: holds heads both as '{bare[0]}' and as '{prefixed[0]}': "
            f"keep one spelling (the '{FULL_PREFIX}' prefix or none)"
        )
    return {k.removeprefix(FULL_PREFIX): state[k] for k in prefixed}


def _full_checkpoint_heads(path: Path) -> dict[str, torch.Tensor] | None:
    """The heads of a Medusa-1.0 full checkpoint: the `medusa_head.` keys of the model's weight
    files (one file, or shards listed by an index JSON), with that prefix removed."""
    files: list[Path] = []
    for single, index in (
        (MODEL_SAFETENSORS, MODEL_SAFETENSORS + ".index.json"),
        (MODEL_BIN, MODEL_BIN + ".index.json"),
    ):
        if (path / index).is_file():
            doc = read_json_input(path / index, "a weights index")
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(weight_map, dict):
                raise UserError(f"{path / index}: no 'weight_map' (not a sharded-weights index)")
            files = sorted({path / f for k, f in weight_map.items() if k.startswith(FULL_PREFIX)})
        elif (path / single).is_file():
            files = [path / single]
        if files:
            break
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt") as f:
                    state.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(FULL_PREFIX)})
            except (SafetensorError, OSError) as err:
                raise UserError(f"{file}: cannot read ({first_line(err)})") from None
        else:
            loaded = torch_load(file)
            if not isinstance(loaded, dict):
                raise UserError(f"{file}: expected a state dict, found {type(loaded).__name__}")
            state.update({k: v for k, v in loaded.items() if k.startswith(FULL_PREFIX)})
    state = {k.removeprefix(FULL_PREFIX): v for k, v in state.items()}
    return state or None


def _read_config(path: Path) -> tuple[dict, int, int]:
    """A heads directory's config.json, its medusa_num_heads and its medusa_num_layers."""
    config_file = path / CONFIG_NAME
    if not config_file.is_file():
        raise UserError(f"{path}: not a Medusa heads directory (no {CONFIG_NAME})")
    config = read_json_input(config_file, "a Medusa heads config")
    if not isinstance(config, dict):
        raise UserError(f"{config_file}: expected a JSON object (a Medusa heads config)")
    configured = config.get("medusa_num_heads")
    if isinstance(configured, bool) or not isinstance(configured, int) or configured < 1:
        raise UserError(f"{config_file}: missing or invalid 'medusa_num_heads'")
    # why 1: a config without medusa_num_layers means one ResBlock in the Medusa authors'
    # MedusaConfig (docs/formats.md#medusa-heads)
    num_layers = config.get("medusa_num_layers", 1)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise UserError(f"{config_file}: invalid 'medusa_num_layers' {num_layers!r}")
    return config, configured, num_layers


def _heads_used(path: Path, num_heads: int | None, configured: int, stored: int, num_layers: int, warn) -> int:
    """The number of heads to load: `num_heads`, else the config's (`MedusaHeads.from_pretrained`)."""
    if num_heads is not None:
        if num_heads < 1 or num_heads > stored:
            raise UserError(f"--num-heads: {path} holds {stored} heads, asked for {num_heads}")
        return num_heads
    if stored > configured:
        warn(
            f"treeopt: warning: {path}: the weights hold {stored} heads but {CONFIG_NAME} says "
            f"medusa_num_heads {configured}; using {configured} (the Medusa authors' code uses all "
            f"{stored}: pass --num-heads {stored} to do the same)"
        )
    if configured > stored:  # checked before building modules for heads that are not there
        first = f"{stored}.0.linear.weight" if num_layers else f"{stored}.0.weight"
        raise UserError(
            f"{path}: weights lack key '{first}' ({CONFIG_NAME} says medusa_num_heads "
            f"{configured}, the weights hold {stored} heads)"
        )
    return configured


def _with_shared_lm_head(path: Path, state: dict, lm_head_weight, num_heads: int, num_layers: int):
    """A medusa2 state (`"version": "2"`) with the base model's lm_head as every head's
    projection, and that projection's (vocab, hidden) shape."""
    if lm_head_weight is None:
        raise UserError(
            f'{path}: medusa2 heads ("version": "2") project with the base model\'s lm_head, which was not given'
        )
    shared = {f"{k}.{num_layers}.weight": lm_head_weight.detach().to("cpu") for k in range(num_heads)}
    return {**state, **shared}, tuple(lm_head_weight.shape)
