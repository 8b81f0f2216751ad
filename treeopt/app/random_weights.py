"""`--random-weights`: a model spec as users write it (a built-in shape name, a config.json, a
model directory, demo) turned into the random model `calibration.random_model` builds, checked
to fit the device before anything is allocated (docs/performance-model.md#timing-without-weights)."""

from __future__ import annotations

from pathlib import Path

from transformers import LlamaConfig

from calibration.device_memory import bench_bytes
from calibration.models import LoadedModel, resolve_device, resolve_dtype
from calibration.random_model import (
    RANDOM_DRAFT_HEADS,
    RandomModel,
    build_random_model,
    check_random_fits,
    read_model_config,
)
from roofline.shapes import ModelShape, model_shape
from treeopt.app.models import is_demo, model_location
from treeopt.errors import UserError

#: positions of a model built from a built-in shape, which does not say how many it takes;
#: a step's time does not depend on it (the rotary tables are computed per call)
RANDOM_MAX_POSITIONS = 131072


def llama_config(shape: ModelShape) -> LlamaConfig:
    """The transformers Llama config of a roofline shape: every built-in shape is Llama-like, and
    the roofline counts each as a Llama of these dims (roofline/shapes.py)."""
    return LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=shape.tied_embeddings,
        max_position_embeddings=RANDOM_MAX_POSITIONS,
    )


def model_config(spec):
    """The transformers config of a model spec: a config.json or a directory (demo included) as
    it is written, else a built-in shape name (`roofline.shapes.model_shape`, which names the
    choices when `spec` is none of them)."""
    if is_demo(spec) or Path(str(spec)).exists():
        return read_model_config(model_location(spec))
    return llama_config(model_shape(spec))


def random_model(
    spec, *, heads: str | None = None, drafter: str | None = None, num_heads: int | None = None, seed: int = 0
) -> RandomModel:
    """What `--random-weights` builds for `--model spec`, `--drafter` (default Medusa heads) and
    `--num-heads` (default `RANDOM_DRAFT_HEADS`); a drafter directory has no place here."""
    if heads is not None:
        raise UserError("--heads: --random-weights builds a random drafter (--drafter, --num-heads); drop --heads")
    return RandomModel(model_config(spec), str(spec), drafter or "medusa", num_heads or RANDOM_DRAFT_HEADS, seed)


def check_random_bench(spec: RandomModel, device: str, dtype: str, *, batch: int, positions: int) -> None:
    """UserError, before anything is allocated, when the weights of `spec` plus a KV cache and
    prefill of `batch` sequences of `positions` positions exceed the device's free memory."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    element = dt.itemsize
    check_random_fits(spec, dev, dt, bench_bytes(spec.config, batch, positions, element))


def load_random(spec: RandomModel, device: str, dtype: str) -> LoadedModel:
    """The random model of `spec` on `device` in `dtype` (`calibration.random_model`)."""
    return build_random_model(spec, device=device, dtype=dtype)
