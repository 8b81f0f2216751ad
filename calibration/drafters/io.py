"""Reading drafter checkpoints: config.json and a state dict in safetensors or a torch pickle,
with one clear line for every way a file can be wrong (docs/formats.md)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from calibration.weights import check_state, torch_load
from treeopt.errors import UserError, first_line
from treeopt.fileio import read_json_input

CONFIG_NAME = "config.json"
__all__ = ["CONFIG_NAME", "read_config", "config_int", "load_state", "check_state", "torch_load"]


def read_config(path: Path, what: str, directory: str = "drafter") -> tuple[dict, Path]:
    """config.json of the `directory` (e.g. "Medusa heads") at `path`, a JSON object."""
    config_file = Path(path) / CONFIG_NAME
    if not config_file.is_file():
        raise UserError(f"{path}: not a {directory} directory (no {CONFIG_NAME})")
    config = read_json_input(config_file, what)
    if not isinstance(config, dict):
        raise UserError(f"{config_file}: expected a JSON object ({what})")
    return config, config_file


def config_int(config: dict, config_file: Path, key: str, *, minimum: int, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{config_file}: missing or invalid {key!r} (an integer >= {minimum}), got {value!r}")
    return value


def load_state(path: Path, *names: str) -> dict[str, torch.Tensor]:
    """The state dict in the first of `names` (safetensors or a torch pickle) under `path`."""
    for name in names:
        file = Path(path) / name
        if not file.is_file():
            continue
        if name.endswith(".safetensors"):
            try:
                return load_file(str(file))
            except (SafetensorError, OSError) as err:
                raise UserError(f"{file}: cannot read ({first_line(err)})") from None
        state = torch_load(file)
        if not isinstance(state, dict):
            raise UserError(f"{file}: expected a state dict, found {type(state).__name__}")
        return state
    raise UserError(f"{path}: no weights file (looked for {', '.join(names)})")
