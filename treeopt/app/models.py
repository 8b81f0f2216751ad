"""Model specs as users write them (`demo`, a built-in shape name, a directory) resolved to
what each package takes: a roofline shape, draft-head shapes, a directory to load."""

from __future__ import annotations

from pathlib import Path

from calibration.demo_files import DEMO_MODEL_DIR
from roofline.shapes import DraftHeadsShape, ModelShape, model_shape, resolve_heads, shape_from_config
from treeopt.drafter_cost import EAGLE_KINDS, DraftCost, eagle_cost, read_draft_cost
from treeopt.errors import UserError
from treeopt.layout import DRAFTER_SUBDIRS

DEMO = "demo"


def is_demo(spec) -> bool:
    return str(spec).lower() == DEMO


def model_location(spec) -> str:
    """`demo` -> the bundled demo model's directory; anything else unchanged."""
    return str(DEMO_MODEL_DIR) if is_demo(spec) else str(spec)


def shape_of(spec, dtype: str | None = None) -> ModelShape:
    """The roofline shape of a model spec, named as the user wrote it."""
    if is_demo(spec) and not (DEMO_MODEL_DIR / "config.json").is_file():
        raise UserError(
            f"--model demo: the demo model is not there ({DEMO_MODEL_DIR / 'config.json'} is "
            "missing); train it with `treeopt demo train` or pass a built-in name or a config.json"
        )
    return model_shape(model_location(spec), dtype=dtype, name=DEMO if is_demo(spec) else None)


def serving_dtype(spec, dtype: str | None) -> tuple[str | None, str | None]:
    """The dtype to price a model in, and a note when it is not the one its config declares.
    `dtype` given: that one. Else the config's, except float32, which `save_pretrained` writes
    for a model trained or loaded in fp32 and which no engine serves a 7B-class model in
    (vLLM, SGLang and TensorRT-LLM default to the checkpoint's half precision, and fp32 doubles
    every weight byte a step reads): bfloat16 then, said in the note
    (docs/performance-model.md#which-dtype-is-priced)."""
    if dtype is not None:
        return dtype, None
    shape = shape_of(spec)
    if shape.dtype != "fp32":
        return None, None
    return "bf16", (
        f"--model {spec}: its config declares float32 (what save_pretrained writes for an fp32 model); priced in "
        "bfloat16, the dtype it would be served in (--dtype fp32 to price fp32)"
    )


def heads_of(spec, shape: ModelShape, **kwargs) -> DraftHeadsShape:
    """`roofline.shapes.resolve_heads` for a model spec (the heads directory next to it)."""
    return resolve_heads(model_location(spec), shape, **kwargs)


def heads_shape_of_drafter(drafter) -> DraftHeadsShape:
    """The Medusa-heads shape the roofline charges for a loaded drafter, run on the one accepted
    token per sequence; a sequential drafter's stages are charged depth by depth elsewhere
    (`draft_cost_of_drafter`, docs/performance-model.md#drafter-cost)."""
    return DraftHeadsShape(
        drafter.num_heads,
        getattr(drafter, "num_layers", 1),
        drafter.hidden_size,
        drafter.vocab_size,
        tokens_per_sequence=1,
    )


def draft_cost_of_drafter(drafter) -> DraftCost:
    """The roofline's `DraftCost` of a loaded drafter (calibration.drafters), as the reference
    decoder runs it: the heads (stages) it was loaded with."""
    if getattr(drafter, "kind", "") in EAGLE_KINDS:
        shape = drafter.shape
        return eagle_cost(
            drafter.kind,
            {
                "hidden_size": shape.hidden_size,
                "num_attention_heads": shape.num_attention_heads,
                "num_key_value_heads": shape.num_key_value_heads,
                "head_dim": shape.head_dim,
                "intermediate_size": shape.intermediate_size,
            },
            target_hidden=int(drafter.hidden_size),
            vocab_size=int(drafter.vocab_size),
            draft_vocab=int(drafter.draft_vocab_size),
            aux_layers=len(drafter.aux_layer_ids),
            depth=int(drafter.num_heads),
        )
    inner = getattr(drafter, "inner_dim", drafter.hidden_size)
    topk = tuple(int(k) for k in getattr(drafter, "top_k_tokens_per_head", ()))
    # a drafter without a kind is a set of Medusa heads (calibration.heads.MedusaHeads)
    return DraftCost(
        getattr(drafter, "kind", "medusa"),
        bool(getattr(drafter, "sequential", False)),
        int(drafter.num_heads),
        int(getattr(drafter, "num_layers", 1)),
        int(drafter.hidden_size),
        int(inner),
        int(drafter.vocab_size),
        grounded=bool(getattr(drafter, "grounded", False)),
        prefix_layer=bool(getattr(drafter, "prefix_layer", False)),
        topk_per_stage=topk,
        n_candidates=int(getattr(drafter, "n_candidates", 0)) if topk else 0,
    )


def draft_cost_of(spec, shape: ModelShape, *, drafter: str | None = None, drafter_config=None) -> DraftCost | None:
    """The drafter cost the roofline commands charge: `drafter_config` (a drafter's config.json
    or its directory), else the `drafter` kind's directory next to the model
    (`treeopt.layout.DRAFTER_SUBDIRS`); None for Medusa from the heads options."""
    if drafter_config is not None:
        cost = read_draft_cost(drafter_config, hidden_size=shape.hidden, vocab_size=shape.vocab)
        if drafter is not None and cost.drafter != drafter:
            raise UserError(f"--drafter: {drafter_config} holds a {cost.drafter} drafter, not {drafter}")
        return cost
    if drafter in (None, "medusa"):
        return None
    base = Path(model_location(spec))
    base = base.parent if base.is_file() else base
    for name in DRAFTER_SUBDIRS[drafter]:
        if (base / name / "config.json").is_file():
            return read_draft_cost(base / name, hidden_size=shape.hidden, vocab_size=shape.vocab)
    raise UserError(
        f"--drafter {drafter}: no {drafter} drafter next to {spec} (looked for "
        f"{', '.join(DRAFTER_SUBDIRS[drafter])}); pass --drafter-config PATH"
    )


def draft_shape_of(drafter, dtype: str | None = None) -> ModelShape:
    """The roofline shape of a draft model (`calibration.drafters.DraftModel`) from its own
    config: its passes cost like any decoder's (docs/performance-model.md#draft-model-steps)."""
    shape = shape_from_config(drafter.model.config.to_dict(), name="draft model")
    return shape.with_dtype(dtype) if dtype is not None else shape
