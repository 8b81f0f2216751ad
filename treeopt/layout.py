"""Where things sit beside a model on disk (docs/formats.md#medusa-heads): one rule, shared
by the calibration loader and the roofline's shape lookup. Pure pathlib and json; no torch."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DRAFTER_KINDS", "DRAFTER_SUBDIRS", "HEADS_SUBDIRS", "default_heads_dir"]

#: sub-directories of a model directory searched, in order, for each kind of drafter (the demo
#: model's layout; Medusa's own checkpoints name theirs `medusa_heads`)
DRAFTER_SUBDIRS = {
    "medusa": ("heads", "medusa_heads"),
    "hydra": ("hydra",),
    "mlp-speculator": ("mlp_speculator", "speculator"),
    "draft-model": ("draft", "draft_model"),
    "eagle3": ("eagle3",),
    "eagle": ("eagle",),
}
#: the kinds of drafter treeopt knows, as every package names them
DRAFTER_KINDS = tuple(DRAFTER_SUBDIRS)
#: sub-directories of a model directory searched, in order, for its Medusa heads
HEADS_SUBDIRS = DRAFTER_SUBDIRS["medusa"]
#: the key that marks a config.json as a Medusa heads config (Medusa's published checkpoints)
_HEADS_CONFIG_KEY = "medusa_num_heads"


def default_heads_dir(model_dir) -> Path | None:
    """The Medusa heads directory of a model, or None when there is none.

    The first of ``MODEL_DIR/heads`` and ``MODEL_DIR/medusa_heads`` that holds a config.json;
    else `model_dir` itself when its own config.json declares ``medusa_num_heads`` (a published
    Medusa checkpoint is a heads directory on its own). A config.json that cannot be read or
    parsed does not count as a heads config.
    """
    model_dir = Path(model_dir)
    for name in HEADS_SUBDIRS:
        if (model_dir / name / "config.json").is_file():
            return model_dir / name
    config = model_dir / "config.json"
    if not config.is_file():
        return None
    try:
        doc = json.loads(config.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return model_dir if isinstance(doc, dict) and _HEADS_CONFIG_KEY in doc else None
