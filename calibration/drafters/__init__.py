"""Drafters: Medusa heads, Hydra heads, IBM's MLP speculator, EAGLE-3 and EAGLE-1/2 drafts and
draft models behind one interface (`calibration.drafters.base.Drafter`, docs/decoder.md#drafters).

`load_drafter` reads a drafter directory in its authors' layout; the kind is detected from its
config.json (``medusa_num_heads``, ``hydra_num_heads``, ``model_type: "mlp_speculator"``, an
EAGLE draft (`calibration.drafters.eagle.eagle_kind`), or a transformers causal LM:
``architectures`` naming a ``...ForCausalLM``) unless given.
"""

from __future__ import annotations

from pathlib import Path

import torch

from calibration.drafters.base import Drafter, DraftState, select_rows
from calibration.drafters.draft_model import DEFAULT_MAX_DEPTH, DraftModel
from calibration.drafters.eagle import EagleDrafter, eagle_kind
from calibration.drafters.hydra import HydraHeads
from calibration.drafters.io import read_config
from calibration.drafters.medusa import MedusaDrafter
from calibration.drafters.mlp_speculator import MODEL_TYPE, MLPSpeculator
from treeopt.errors import UserError
from treeopt.layout import DRAFTER_KINDS, DRAFTER_SUBDIRS

__all__ = [
    "DRAFTER_KINDS",
    "DraftModel",
    "Drafter",
    "DraftState",
    "EagleDrafter",
    "HydraHeads",
    "MLPSpeculator",
    "MedusaDrafter",
    "detect_kind",
    "load_drafter",
    "select_rows",
    "DRAFTER_SUBDIRS",
]


def detect_kind(config: dict) -> str | None:
    """The drafter kind a config.json declares, or None."""
    if "hydra_num_heads" in config:
        return "hydra"
    if config.get("model_type") == MODEL_TYPE:
        return "mlp-speculator"
    if "medusa_num_heads" in config:
        return "medusa"
    eagle = eagle_kind(config)
    if eagle is not None:
        return eagle
    architectures = config.get("architectures")
    if isinstance(architectures, list) and any(str(a).endswith("ForCausalLM") for a in architectures):
        return "draft-model"
    return None


def find_drafter_dir(model_dir, kind: str) -> Path | None:
    """The first sub-directory of `model_dir` holding a drafter of `kind`."""
    for name in DRAFTER_SUBDIRS[kind]:
        if (Path(model_dir) / name / "config.json").is_file():
            return Path(model_dir) / name
    return None


def load_drafter(
    path,
    *,
    kind: str | None = None,
    device=None,
    dtype=None,
    num_heads: int | None = None,
    lm_head_weight: torch.Tensor | None = None,
    input_embeddings: torch.Tensor | None = None,
    warn=None,
    base_config=None,
) -> Drafter:
    """The drafter in directory `path`. `kind` (`DRAFTER_KINDS`) overrides detection and must
    agree with what the config declares. `base_config`: the base model's transformers config
    (Hydra++ builds its prefix decoder layer from it)."""
    path = Path(path)
    if kind is not None and kind not in DRAFTER_KINDS:
        raise UserError(f"--drafter: unknown drafter {kind!r} (choose from {', '.join(DRAFTER_KINDS)})")
    names = {
        None: "Medusa heads",
        "medusa": "Medusa heads",
        "hydra": "Hydra heads",
        "mlp-speculator": "MLP speculator",
        "draft-model": "draft model",
        "eagle3": "EAGLE-3 draft",
        "eagle": "EAGLE draft",
    }
    config, config_file = read_config(path, "a drafter config", names[kind])
    found = detect_kind(config)
    if found is None:
        raise UserError(
            f"{config_file}: not a drafter config (no medusa_num_heads, hydra_num_heads, "
            f"model_type {MODEL_TYPE!r} or a ...ForCausalLM architecture)"
        )
    if kind == "eagle" and found == "draft-model":
        # why: the authors' EAGLE-1/2 config.json is the base model's Llama config cut to one
        # layer, which reads as a causal LM; --drafter eagle says what it is
        found = "eagle"
    if kind is not None and kind != found:
        raise UserError(f"--drafter: {path} holds a {found} drafter, not {kind}")
    if found in ("eagle3", "eagle"):
        if base_config is None or lm_head_weight is None or input_embeddings is None:
            raise UserError(f"{path}: an EAGLE draft is read against its base model, which was not given")
        return EagleDrafter.from_pretrained(
            path,
            kind=found,
            base_config=base_config,
            lm_head_weight=lm_head_weight,
            input_embeddings=input_embeddings,
            device=device,
            dtype=dtype,
            max_depth=num_heads,
        )
    if found == "medusa":
        return MedusaDrafter.from_pretrained(
            path, device=device, dtype=dtype, num_heads=num_heads, lm_head_weight=lm_head_weight, warn=warn
        )
    if found == "hydra":
        return HydraHeads.from_pretrained(
            path,
            device=device,
            dtype=dtype,
            num_heads=num_heads,
            input_embeddings=input_embeddings,
            base_config=base_config,
        )
    if found == "draft-model":
        return DraftModel.from_pretrained(
            path, device=device, dtype=dtype, max_depth=DEFAULT_MAX_DEPTH if num_heads is None else num_heads
        )
    return MLPSpeculator.from_pretrained(path, device=device, dtype=dtype, num_heads=num_heads)
