"""Public step-time measurements of optimised engines, and how the built-in GPU profiles predict
them: where each profile's GEMM row curve (its "knee") was checked
(docs/performance-model.md#where-the-knee-was-checked).

A knee shows in ratios of step times measured on one engine build: a forward pass over 128
tokens against a one-token decode step (rows 1 -> 128, where tree sizes are chosen), and over
2048 tokens against 128 (the climb to the large-GEMM rate). Absolute times also carry the
engine's own costs and maturity, so the verdict rests on the ratios; the absolute errors are
shown beside them.

The measurements are NVIDIA's own tables for TensorRT-LLM v0.5 and v0.9 at tensor parallelism
1, mostly at batch 1 (1st-token latency of a prompt with nothing cached, and output tokens per
second), plus 64 prompts prefilled together, where only the large-GEMM efficiency counts:

- "H100 has 4.6x A100 Performance in TensorRT-LLM" (TensorRT-LLM repository,
  docs/source/blogs/H100vsA100.md; TensorRT-LLM v0.5.0, TensorRT 9.1, SXM 80GB GPUs, H100 in
  FP8, A100 in FP16),
- "Performance of TensorRT-LLM", section "Low Latency" (TensorRT-LLM repository,
  docs/source/performance.md, data of v0.5; the H100 engines built with FP8 weights and KV
  cache, the A100 ones in FP16),
- the same document as released with TensorRT-LLM v0.9.0 ("All data was generated using
  version 0.9.0"): 1st-token latencies only, on the H200, H100 and L40S in FP8 and the A100 in
  FP16, for GPT-J 6B, Mistral 7B and LLaMA 7B.

A ratio pairs steps of one engine release only. Where one ratio was measured several times (on
models of the same size, or by two releases), the verdict takes the median of its errors: the
measurements scatter by more than the tolerance between models that differ little, and the
curve is a property of the chip, not of one engine build.

numpy only, like the rest of `roofline`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roofline.hardware import HardwareProfile, builtin_hardware, load_hardware
from roofline.latency import step_time_s
from roofline.published_gemms import FITTED_CURVES, gemm_bands
from roofline.shapes import ModelShape, model_shape

__all__ = [
    "FITTED",
    "GPT_J_6B",
    "KNEE_TOLERANCE",
    "PUBLISHED_STEPS",
    "SAME_DIE",
    "KneeCheck",
    "KneeRatio",
    "PublishedStep",
    "StepComparison",
    "compare_steps",
    "knee_checks",
    "knee_note",
    "knee_ratios",
    "knee_summary",
    "knee_verdict",
    "published_shape",
]

BLOG = (
    'NVIDIA, "H100 has 4.6x A100 Performance in TensorRT-LLM" (TensorRT-LLM v0.5.0, '
    "github.com/NVIDIA/TensorRT-LLM docs/source/blogs/H100vsA100.md)"
)
PERF = (
    'NVIDIA, "Performance of TensorRT-LLM", Low Latency tables (data of v0.5, '
    "github.com/NVIDIA/TensorRT-LLM docs/source/performance.md)"
)
PERF_V09 = (
    'NVIDIA, "Performance of TensorRT-LLM", Low Latency tables ("All data was generated using version '
    '0.9.0", github.com/NVIDIA/TensorRT-LLM docs/source/performance.md at release v0.9.0)'
)
RELEASE = {BLOG: "v0.5", PERF: "v0.5", PERF_V09: "v0.9"}

# GPT-J 6B (EleutherAI; 28 layers, width 4096, 16 heads of 256, an ungated 16384-wide MLP, a
# 50400-token vocabulary with its own lm_head). Its two MLP matrices hold 2 x 4096 x 16384
# weights; a gated MLP of width 10923 holds 3 x 4096 x 10923, 0.003% more, so the Llama-shaped
# model below has GPT-J's FLOPs and bytes per token.
GPT_J_6B = ModelShape(
    name="gpt-j-6b",
    layers=28,
    hidden=4096,
    intermediate=10923,
    heads=16,
    kv_heads=16,
    head_dim=256,
    vocab=50400,
    tied_embeddings=False,
    dtype="fp16",
    dtype_bytes=2,
    source="EleutherAI/gpt-j-6b config.json, as a Llama-shaped model of the same FLOPs and bytes",
)


def published_shape(model: str, dtype: str) -> ModelShape:
    """The shape of a model named in the tables: "gpt-j-6b", "llama-2-7b" (the tables' "LLaMA
    7B", built from Llama-2-7b) or "mistral-7b", in `dtype`."""
    base = GPT_J_6B if model == "gpt-j-6b" else model_shape(model)
    return base.with_dtype(dtype)


@dataclass(frozen=True)
class PublishedStep:
    """One published measurement of one forward pass.

    tokens: tokens run per sequence (a prompt of `tokens` with nothing cached for a 1st-token
    latency; 1 for a decode step); context_tokens: tokens already cached; step_ms: its time;
    batch: sequences in the pass; release: the TensorRT-LLM release that measured it.
    """

    hardware: str
    model: str
    dtype: str
    tokens: int
    context_tokens: int
    step_ms: float
    measured_as: str
    source: str
    batch: int = 1
    release: str = "v0.5"


def _first_token(hardware, model, dtype, tokens, ms, source=PERF, batch=1):
    what = f"1st-token latency, {tokens}-token prompt" + (f"s x {batch}" if batch > 1 else "")
    return PublishedStep(hardware, model, dtype, tokens, 0, ms, what, source, batch, RELEASE[source])


def _first_tokens_v09(hardware, dtype, rows):
    """v0.9's Low Latency rows of one GPU: {model: (ms at 128 tokens, ms at 2048 tokens)}."""
    return tuple(
        _first_token(hardware, model, dtype, tokens, ms, PERF_V09)
        for model, pair in rows.items()
        for tokens, ms in zip((128, 2048), pair)
    )


def _decode(hardware, model, dtype, tokens_per_s, source=BLOG):
    # a decode step after the 128-token prompt: the tables give no output length, so the cache
    # holds 128-256 tokens during the steps measured; at batch 1 attention over them is about 1%
    # of a 6B model's step, so 192 stands for all of them
    return PublishedStep(
        hardware,
        model,
        dtype,
        1,
        192,
        1e3 / tokens_per_s,
        f"{tokens_per_s:g} output tokens/s",
        source,
        release=RELEASE[source],
    )


PUBLISHED_STEPS: tuple[PublishedStep, ...] = (
    # A100-SXM4-80GB, fp16
    _first_token("a100-80gb-sxm", "gpt-j-6b", "fp16", 128, 12.5, BLOG),
    _decode("a100-80gb-sxm", "gpt-j-6b", "fp16", 111),
    _first_token("a100-80gb-sxm", "gpt-j-6b", "fp16", 2048, 129),
    _first_token("a100-80gb-sxm", "llama-2-7b", "fp16", 128, 16),
    _first_token("a100-80gb-sxm", "llama-2-7b", "fp16", 2048, 133),
    # 64 prompts of 128 tokens prefilled together (the blog's maximum-throughput row): 8192
    # token rows, where the large-GEMM efficiency eta_compute alone sets the time
    _first_token("a100-80gb-sxm", "gpt-j-6b", "fp16", 128, 481, BLOG, batch=64),
    # H100-SXM5-80GB ("H100-HBM3-80GB"), fp8 weights, activations and KV cache
    _first_token("h100-sxm", "gpt-j-6b", "fp8", 128, 7.1, BLOG),
    _decode("h100-sxm", "gpt-j-6b", "fp8", 185),
    _first_token("h100-sxm", "gpt-j-6b", "fp8", 2048, 29),
    _first_token("h100-sxm", "llama-2-7b", "fp8", 128, 7),
    _first_token("h100-sxm", "llama-2-7b", "fp8", 2048, 36),
    _first_token("h100-sxm", "gpt-j-6b", "fp8", 128, 102, BLOG, batch=64),
    # L40S, fp8
    _first_token("l40s", "gpt-j-6b", "fp8", 128, 12),
    _first_token("l40s", "gpt-j-6b", "fp8", 2048, 71),
    _first_token("l40s", "llama-2-7b", "fp8", 128, 14),
    _first_token("l40s", "llama-2-7b", "fp8", 2048, 73),
    # v0.9: the GPT-J, Mistral 7B and LLaMA 7B (Llama-2-7b) engines of that release. The tables
    # name no A100 board; it is taken as the SXM4-80GB of the v0.5 tables.
    *_first_tokens_v09(
        "a100-80gb-sxm", "fp16", {"gpt-j-6b": (14.8, 136.4), "mistral-7b": (16.3, 139.6), "llama-2-7b": (16.2, 132.4)}
    ),
    *_first_tokens_v09(
        "h100-sxm", "fp8", {"gpt-j-6b": (5.5, 23.8), "mistral-7b": (6.5, 32.4), "llama-2-7b": (6.3, 30.8)}
    ),
    *_first_tokens_v09("h200", "fp8", {"gpt-j-6b": (5.0, 23.5), "mistral-7b": (5.9, 31.7), "llama-2-7b": (5.7, 30.2)}),
    *_first_tokens_v09(
        "l40s", "fp8", {"gpt-j-6b": (12.4, 61.7), "mistral-7b": (15.4, 87.3), "llama-2-7b": (14.1, 80.1)}
    ),
)

#: a knee ratio matches when the median of its errors (predicted / measured - 1) is within these
#: bounds. 1 -> 128 tokens is where tree sizes are chosen: 10%. 128 -> 2048 tokens: 25%, because
#: the tables disagree with themselves by about that much there (on the A100, v0.5 measured 10.3
#: for GPT-J and 8.3 for Llama-2-7B, two models of nearly the same size; v0.9 measured 9.2 for
#: GPT-J).
KNEE_TOLERANCE = {1: 0.10, 128: 0.25}


@dataclass(frozen=True)
class StepComparison:
    measurement: PublishedStep
    predicted_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measurement.step_ms - 1.0


@dataclass(frozen=True)
class KneeCheck:
    """T(tokens) / T(reference_tokens), measured by one engine release and predicted, for one
    model on one GPU."""

    hardware: str
    model: str
    dtype: str
    tokens: int
    reference_tokens: int
    measured_ratio: float
    predicted_ratio: float
    release: str = "v0.5"

    @property
    def error(self) -> float:
        return self.predicted_ratio / self.measured_ratio - 1.0

    @property
    def matches(self) -> bool:
        return abs(self.error) <= KNEE_TOLERANCE[self.reference_tokens]


def compare_steps(hardware=None, *, profile: HardwareProfile | None = None) -> list[StepComparison]:
    """Each published step of `hardware` (a built-in name; None: all of them) beside the step
    time the profile predicts for it. `profile` replaces the built-in (to check a variant)."""
    out = []
    for m in PUBLISHED_STEPS:
        if hardware is not None and m.hardware != hardware:
            continue
        hw = profile if profile is not None else load_hardware(m.hardware)
        shape = published_shape(m.model, m.dtype)
        t = step_time_s(shape, None, hw, batch=m.batch, tokens=m.tokens, context=m.context_tokens, on_oom="raise")
        out.append(StepComparison(m, float(t) * 1e3))
    return out


def knee_checks(hardware=None, *, profile: HardwareProfile | None = None) -> list[KneeCheck]:
    """The ratios T(128)/T(1) and T(2048)/T(128) wherever both steps of a model were measured
    on one GPU by the same engine release."""
    steps = [c for c in compare_steps(hardware, profile=profile) if c.measurement.batch == 1]
    by_key = {
        (c.measurement.hardware, c.measurement.release, c.measurement.model, c.measurement.tokens): c for c in steps
    }
    checks = []
    for (hw, release, model, tokens), c in by_key.items():
        reference = {128: 1, 2048: 128}.get(tokens)
        ref = by_key.get((hw, release, model, reference))
        if ref is None:
            continue
        checks.append(
            KneeCheck(
                hw,
                model,
                c.measurement.dtype,
                tokens,
                reference,
                c.measurement.step_ms / ref.measurement.step_ms,
                c.predicted_ms / ref.predicted_ms,
                release,
            )
        )
    checks.sort(key=lambda k: (k.hardware, k.reference_tokens, k.release, k.model))
    return checks


@dataclass(frozen=True)
class KneeRatio:
    """One knee ratio of one GPU over every model and release that measured it: the median of
    their errors decides whether the curve matches."""

    hardware: str
    tokens: int
    reference_tokens: int
    median_error: float
    measurements: int

    @property
    def matches(self) -> bool:
        return abs(self.median_error) <= KNEE_TOLERANCE[self.reference_tokens]


def knee_ratios(hardware: str, *, profile: HardwareProfile | None = None) -> list[KneeRatio]:
    """T(128)/T(1) and T(2048)/T(128) of `hardware`, each with the median error of its checks."""
    checks = knee_checks(hardware, profile=profile)
    out = []
    for reference in sorted({k.reference_tokens for k in checks}):
        group = [k for k in checks if k.reference_tokens == reference]
        errors = np.array([k.error for k in group])
        out.append(KneeRatio(hardware, group[0].tokens, reference, float(np.median(errors)), len(group)))
    return out


#: the verdict of a board whose row curve was fitted to its own published GEMM timings and has no
#: other measurement to be checked against
FITTED = "fitted to public GEMM timings"


def _fitted_here(hardware: str, hw: HardwareProfile) -> bool:
    curve = FITTED_CURVES.get(hardware)
    return curve is not None and hw.gemm_efficiency == curve


def knee_verdict(hardware: str, *, profile: HardwareProfile | None = None) -> str:
    """The knee's verdict on one GPU, from every public measurement its curve was not fitted to
    (step times, and GEMM timings unless the curve came from them): "checked" (all match, and
    one of them covers 1 -> 128 token rows), "partly checked" (those measured match, but not
    below 128 rows), "does not match"; without such a measurement, FITTED when the curve was
    fitted to this board's GEMM timings, else "not measured"."""
    hw = profile if profile is not None else load_hardware(hardware)
    ratios = knee_ratios(hardware, profile=profile)
    fitted = _fitted_here(hardware, hw)
    bands = [] if fitted else gemm_bands(hardware, profile=profile)
    if not ratios and not bands:
        return FITTED if fitted else "not measured"
    if not all(r.matches for r in [*ratios, *bands]):
        return "does not match"
    if bands or any(r.reference_tokens == 1 for r in ratios):
        return "checked"
    return "partly checked"


#: built-in boards on the die of a board with public measurements: the row curve is a property of
#: the die's SMs and tensor cores, so its check carries over as a hint, not a proof
SAME_DIE = {
    "a100-40gb-sxm": "a100-80gb-sxm",
    "a100-80gb-pcie": "a100-80gb-sxm",
    "h100-pcie": "h100-sxm",
    "h200": "h100-sxm",
    "rtx-a6000": "a40",
    "rtx-4090": "l40s",
}
_SETTLED = ("checked", FITTED)


def knee_summary(hardware: str) -> str:
    """The verdict of `hardware`, with that of its measured sibling on the same die when its own
    falls short of checked."""
    verdict = knee_verdict(hardware)
    sibling = SAME_DIE.get(hardware)
    if verdict in ("not measured", "partly checked") and sibling:
        return f"{verdict}; {knee_verdict(sibling)} on {sibling} (same die)"
    return verdict


def knee_note(hw: HardwareProfile) -> str | None:
    """One line for the user of a built-in profile whose knee is neither checked nor fitted on
    its GPU, or on a board of the same die (None otherwise): the tree sizes it picks above a few
    dozen nodes rest on an unconfirmed curve."""
    if builtin_hardware().get(hw.name) != hw:
        return None
    verdict, sibling = knee_verdict(hw.name), SAME_DIE.get(hw.name)
    sibling_verdict = knee_verdict(sibling) if sibling else None
    if verdict in _SETTLED or (verdict in ("not measured", "partly checked") and sibling_verdict in _SETTLED):
        return None
    if verdict == "not measured" and sibling:
        state = f"is not checked on this board and {sibling_verdict} on {sibling}, the same die"
    else:
        state = {
            "does not match": "does not match public measurements",
            "partly checked": "is checked against public step times only above 128 tokens",
            "not measured": "is not checked: no public step times or GEMM timings were found",
        }[verdict]
    return (
        f"note: {hw.name}'s GEMM row curve, which sets where verification stops being free, {state} "
        "(treeopt hw published); before trusting trees of more than about 32 nodes, fit your engine's "
        "step times (treeopt hw fit) or calibrate the GPU (treeopt hw calibrate)"
    )
