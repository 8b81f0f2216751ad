"""Model specs as users write them (`demo`, a built-in shape name, a directory) resolved to
what each package takes: a roofline shape, draft-head shapes, a directory to load."""

from __future__ import annotations

from calibration.demo_files import DEMO_MODEL_DIR
from roofline.shapes import DraftHeadsShape, ModelShape, model_shape, resolve_heads, shape_from_config
from treeopt.errors import UserError

DEMO = "demo"


def is_demo(spec) -> bool:
    return str(spec).lower() == DEMO


def model_location(spec) -> str:
    """`demo` -> the bundled demo model's directory; anything else unchanged."""
    return str(DEMO_MODEL_DIR) if is_demo(spec) else str(spec)


def shape_of(spec, dtype: str | None = None) -> ModelShape:
    """The roofline shape of a model spec, named as the user wrote it."""
    if is_demo(spec) and not (DEMO_MODEL_DIR / "config.json").is_file():
        raise UserError(f"--model demo: the demo model is not there ({DEMO_MODEL_DIR / 'config.json'} is "
                        "missing); train it with `treeopt demo train` or pass a built-in name or a config.json")
    return model_shape(model_location(spec), dtype=dtype, name=DEMO if is_demo(spec) else None)


def heads_of(spec, shape: ModelShape, **kwargs) -> DraftHeadsShape:
    """`roofline.shapes.resolve_heads` for a model spec (the heads directory next to it)."""
    return resolve_heads(model_location(spec), shape, **kwargs)


def draft_shape_of(drafter, dtype: str | None = None) -> ModelShape:
    """The roofline shape of a draft model (`calibration.drafters.DraftModel`) from its own
    config: its passes cost like any decoder's (docs/performance-model.md, "Draft-model steps")."""
    shape = shape_from_config(drafter.model.config.to_dict(), name="draft model")
    return shape.with_dtype(dtype) if dtype is not None else shape
