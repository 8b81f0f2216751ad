"""The checks every checkpoint reader shares: a torch pickle read safely, and a state dict held
against the module it is for, with one clear line for every way a file can be wrong
(docs/formats.md). Outside `calibration.drafters` so that `calibration.heads`, which that
package imports, can use them too."""

from __future__ import annotations

from pathlib import Path

import torch

from treeopt.errors import UserError, first_line

__all__ = ["torch_load", "check_state"]


def torch_load(file: Path):
    """A torch pickle, tensors only (`weights_only`); UserError naming the file when it is not one."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch.load raises many types for a corrupt pickle
        raise UserError(f"{file}: cannot read ({first_line(err)})") from None


def check_state(path: Path, expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> dict:
    """`state` cut to the keys of `expected`, after checking every key is there with its shape."""
    missing = [k for k in expected if k not in state]
    if missing:
        raise UserError(f"{path}: weights lack key '{missing[0]}' ({len(missing)} missing)")
    for key, value in expected.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise UserError(
                f"{path}: weight '{key}' has shape {tuple(state[key].shape)}, expected {tuple(value.shape)}"
            )
    return {k: state[k] for k in expected}
