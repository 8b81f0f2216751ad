"""A model directory checked before and after transformers loads it (docs/formats.md#output-safety):
a config whose numbers would calibrate a silently wrong table (`rms_norm_eps: NaN`, no layers)
is refused before the weights load, and a checkpoint whose tensors do not match the
architecture (transformers initialises a missing tensor at random and ignores an unexpected
one) after, each in one line instead of transformers' load report."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

from transformers.utils import logging as hf_logging

from calibration.heads import FULL_PREFIX
from treeopt.errors import UserError
from treeopt.fileio import read_json_input

#: sizes a runnable decoder has at least one of (when its config names them)
_COUNTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size")


def _numbers(value, where: str) -> Iterator[tuple[str, float]]:
    """Every number in a config document with its key path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{where}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield where, value


def check_config(model_dir: Path) -> None:
    """UserError naming config.json and the field: a number that is not finite (a NaN epsilon
    turns every normalisation into NaN), an epsilon outside (0, 1), or a count of layers,
    heads, hidden units or vocabulary below 1, in the config or its `text_config`."""
    config_file = Path(model_dir) / "config.json"
    doc = read_json_input(config_file, "a model config")
    if not isinstance(doc, dict):
        raise UserError(f"{config_file}: expected a JSON object, found {type(doc).__name__}")
    for key, value in _numbers(doc, ""):
        if not math.isfinite(value):
            raise UserError(f"{config_file}: {key}: must be a finite number, got {value}")
        if key.rsplit(".", 1)[-1].endswith("_eps") and not 0 < value < 1:
            raise UserError(f"{config_file}: {key}: must be in (0, 1), got {value}")
    for section in (doc, doc.get("text_config")):
        if not isinstance(section, dict):
            continue
        for key in _COUNTS:
            value = section.get(key)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise UserError(f"{config_file}: {key}: must be a whole number >= 1, got {value}")


@contextlib.contextmanager
def quiet_load_report() -> Iterator[None]:
    """transformers' multi-line load report held back: `check_loading_info` says it in one line."""
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def check_loading_info(model_dir: Path, info: dict) -> None:
    """UserError naming the first tensor of the checkpoint that is missing (transformers would
    initialise it at random), unexpected (it would be ignored; the `medusa_head.` tensors of a
    full checkpoint are the heads, read on their own) or of the wrong shape."""
    for kind, what in (
        ("missing_keys", "lacks"),
        ("unexpected_keys", "holds an unexpected"),
        ("mismatched_keys", "has a wrongly shaped"),
    ):
        keys = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(kind) or ())
        if kind == "unexpected_keys":  # a Medusa-1.0 full checkpoint keeps its heads beside the model
            keys = [k for k in keys if not k.startswith(FULL_PREFIX)]
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            raise UserError(f"--model: {model_dir}: the checkpoint {what} tensor {keys[0]}{more}")
