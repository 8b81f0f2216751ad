"""A base model and drafter of a given shape with random weights, for timing without a
checkpoint (`--random-weights`, docs/performance-model.md#timing-without-weights).

A step's time depends on the shapes it multiplies, not on the values, so a model of a
checkpoint's shape times like the checkpoint. What random weights cannot give is anything that
depends on what the model says: acceptance rates, text. There is no tokenizer: prompts are
random token ids (`random_token_ids`).

The caller passes a transformers config (calibration reads no roofline shape; the application
layer turns a built-in shape into a LlamaConfig). The weights are sized before anything is
allocated (`random_weight_bytes`, from a model built on the meta device), then built directly on
the target device in the target dtype: a 70B model is never built in float32 on the CPU first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from calibration.device_memory import available_bytes
from calibration.drafters import HydraHeads, MedusaDrafter, MLPSpeculator
from calibration.model_calls import with_supported_attention
from calibration.models import LoadedModel, resolve_device, resolve_dtype
from treeopt.dtypes import normalize_dtype
from treeopt.errors import UserError

__all__ = [
    "RANDOM_DRAFTERS",
    "RANDOM_DRAFT_HEADS",
    "RANDOM_PROMPT_TOKENS",
    "RandomModel",
    "build_random_model",
    "check_random_fits",
    "random_parameter_counts",
    "random_token_ids",
    "random_weight_bytes",
    "read_model_config",
]

#: drafter kinds a random drafter is built for; a draft model is a model of its own, with a
#: config a kind name does not give
RANDOM_DRAFTERS = ("medusa", "hydra", "mlp-speculator")
#: heads (stages) of a random drafter when --num-heads is not given: as many as Medusa-1's
#: published Vicuna v1.3 heads hold (treeopt/data/medusa_train_accuracy.csv)
RANDOM_DRAFT_HEADS = 5
#: tokens of each random prompt where a command has no --prompt-tokens of its own: the default
#: of those that have one (calibrate, decode)
RANDOM_PROMPT_TOKENS = 128
#: standard deviation of every random matrix: transformers' Llama `initializer_range`; small
#: enough that logits stay finite in float16 through 80 layers, since RMSNorm rescales each
#: layer's input
INIT_STD = 0.02


@dataclass(frozen=True)
class RandomModel:
    """What to build: a transformers `config` (its architecture and dims), shown as `name`
    (kept as `LoadedModel.name`, so it must be a spec the roofline reads the same shape from),
    with a random drafter of `drafter` kind and `num_heads` heads, all drawn with `seed`."""

    config: object
    name: str
    drafter: str = "medusa"
    num_heads: int = RANDOM_DRAFT_HEADS
    seed: int = 0

    def __post_init__(self):
        if self.drafter not in RANDOM_DRAFTERS:
            raise UserError(
                f"--drafter: --random-weights builds {', '.join(RANDOM_DRAFTERS)} drafters, not {self.drafter} "
                "(a draft model needs its own checkpoint)"
            )
        if self.num_heads < 1:
            raise UserError(f"--num-heads: must be at least 1, got {self.num_heads}")


def read_model_config(path) -> object:
    """The transformers config of a config.json, or of a directory holding one."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise UserError(f"--model: cannot read {file}: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict) or "model_type" not in doc:
        raise UserError(f"--model: {file} is not a transformers config.json (no model_type)")
    try:
        return AutoConfig.for_model(**doc)
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"--model: {file}: {str(err).splitlines()[0]}") from None


def _base(config) -> torch.nn.Module:
    """The causal LM of `config`, built where the caller's device context says."""
    return with_supported_attention(lambda **attn: AutoModelForCausalLM.from_config(config, **attn))


def _drafter(spec: RandomModel) -> torch.nn.Module:
    """The drafter of `spec`, built where the caller's device context says: one-layer Medusa
    heads, grounded one-layer Hydra heads, or an MLP speculator whose inner dimension is the
    hidden size."""
    hidden, vocab, k = spec.config.hidden_size, spec.config.vocab_size, spec.num_heads
    if spec.drafter == "hydra":
        return HydraHeads(hidden, vocab, k, 1, grounded=True)
    if spec.drafter == "mlp-speculator":
        return MLPSpeculator(hidden, hidden, vocab, k)
    return MedusaDrafter(hidden, vocab, k, 1)


def _on_meta(spec: RandomModel) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Base model and drafter with parameters on the meta device: shapes only, no memory."""
    hf_logging.disable_progress_bar()
    with torch.device("meta"):
        return _base(spec.config), _drafter(spec)


def _count(module: torch.nn.Module) -> int:
    # parameters() yields a tied weight (lm_head = embed_tokens) once
    return sum(p.numel() for p in module.parameters())


def random_parameter_counts(spec: RandomModel) -> tuple[int, int]:
    """(base model, drafter) parameters of `spec`, counted on the meta device."""
    base, drafter = _on_meta(spec)
    return _count(base), _count(drafter)


def random_weight_bytes(spec: RandomModel, dtype: torch.dtype) -> int:
    """Bytes the base model's and the drafter's weights take in `dtype`."""
    base, drafter = random_parameter_counts(spec)
    return (base + drafter) * torch.empty((), dtype=dtype).element_size()


def check_random_fits(spec: RandomModel, device: torch.device, dtype: torch.dtype, bench: int = 0) -> None:
    """UserError, before anything is allocated, when the weights of `spec` in `dtype` plus
    `bench` bytes (the cache and prefill the command will need, `calibration.device_memory.
    bench_bytes`) exceed what `device` has free."""
    free = available_bytes(device)
    if free is None:
        return
    weights = random_weight_bytes(spec, dtype)
    if weights + bench > free:
        extra = f" and {bench / 2**30:,.1f} GiB for its cache and prefill" if bench else ""
        dt = normalize_dtype(str(dtype), what="--dtype")
        raise UserError(
            f"--model: {spec.name} in {dt} needs about {weights / 2**30:,.1f} GiB of weights{extra}; "
            f"{device.type} has {free / 2**30:,.1f} GiB free"
        )


def _materialise(module: torch.nn.Module, device: torch.device, dtype: torch.dtype, gen: torch.Generator):
    """`module` (on the meta device) allocated on `device` in `dtype`, matrices drawn from
    N(0, INIT_STD) with `gen`, vectors as a fresh model has them (norm weights 1, biases 0),
    and the rotary embeddings' buffers computed again (to_empty leaves buffers unset)."""
    module = module.to(dtype=dtype).to_empty(device=device)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, INIT_STD, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
        for sub in module.modules():
            own = dict(sub.named_buffers(recurse=False))
            if not own:
                continue
            if hasattr(sub, "scalar_embed_scale") and set(own) == {"embed_scale"}:
                # Gemma's scaled embedding keeps its scale (sqrt(hidden)) as a buffer too
                sub.embed_scale = torch.tensor(float(sub.scalar_embed_scale), device=device)
                continue
            if not hasattr(sub, "inv_freq"):
                raise UserError(f"--random-weights: {type(sub).__name__} keeps buffers a random model cannot set")
            fresh = type(sub)(sub.config)  # on the CPU, in float32, as from_pretrained computes it
            for key in own:
                setattr(sub, key, getattr(fresh, key).to(device))
    return module.eval()


def build_random_model(spec: RandomModel, *, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """The model and drafter of `spec` with random weights on `device` in `dtype` (names as
    every command takes them), checked to fit first (`check_random_fits`, without a bench:
    the caller checks its own). Same spec, device and dtype: the same weights."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    check_random_fits(spec, torch_device, torch_dtype)
    base, drafter = _on_meta(spec)
    gen = torch.Generator(device=torch_device).manual_seed(spec.seed)
    base = _materialise(base, torch_device, torch_dtype, gen)
    base.tie_weights()
    drafter = _materialise(drafter, torch_device, torch_dtype, gen)
    return LoadedModel(base, drafter, None, spec.name, torch_device, torch_dtype, random_seed=spec.seed)


def random_token_ids(vocab: int, count: int, tokens: int, seed: int) -> list[list[int]]:
    """`count` prompts of `tokens` token ids drawn uniformly from `vocab` with `seed`: the
    prompts of a model without a tokenizer."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (count, tokens), generator=gen).tolist()
