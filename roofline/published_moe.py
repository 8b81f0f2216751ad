"""Public timings of a fused mixture-of-experts kernel by token count: a check of the priced
routed experts (the `experts` and `expert_act` operators of roofline.ops) that no engine's other
costs blur (docs/performance-model.md#mixture-of-experts, "Checked against kernel timings").

The timings are vLLM's `benchmarks/kernels/benchmark_moe.py` as Michael Goin (mgoin) printed
them on an H100 80GB HBM3 in vLLM pull request #24700 ("[Perf] Improve default fused moe configs
by analyzing tuned configs", 2025-09-11, github.com/vllm-project/vllm/pull/24700). The script
times vLLM's `fused_moe` (top-k of random, so near-uniform, router logits; both expert GEMMs
with the SiLU-and-multiply between them; the weighted sum) on random weights: ten calls captured
in one CUDA graph, 100 replays, the mean per call in microseconds. Two shapes:

- Mixtral-8x7B in bf16 at tensor parallelism 2 (8 experts, top-2, hidden 4096, 7168 of each
  expert's 14336 intermediate columns per GPU), with vLLM's tuned configuration for the shape
  ("# Tuned Config"), 1 to 1536 tokens;
- Qwen3-30B-A3B in fp8 (w8a8, per-tensor scales) at tensor parallelism 1 (128 experts, top-8,
  hidden 2048, intermediate 768), with vLLM's configuration before the pull request ("# Main"),
  1 to 4096 tokens.

roofline/data/vllm-fused-moe-kernel-times.csv holds them as printed. The check compares the
ratio T(n)/T(1) over token counts, so the board's absolute bandwidth cancels and what is judged is
how the priced cost grows with the tokens: the distinct experts read (uniform routing), then
the GEMMs' compute at the tokens per expert.

numpy only, like the rest of `roofline`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from roofline.hardware import HardwareProfile, load_hardware
from roofline.latency import op_timings
from roofline.shapes import model_shape
from roofline.step_shape import StepShape

__all__ = [
    "MOE_KERNEL_DATA",
    "MOE_KERNEL_OPS",
    "MOE_KERNEL_SOURCE",
    "MOE_KERNEL_UNCERTAINTY",
    "MoeKernelCheck",
    "MoeKernelTimes",
    "moe_kernel_checks",
    "moe_kernel_times",
    "priced_moe_kernel_s",
]

MOE_KERNEL_SOURCE = (
    'vLLM pull request #24700, "[Perf] Improve default fused moe configs by analyzing tuned configs" '
    "(mgoin, 2025-09-11), github.com/vllm-project/vllm/pull/24700: benchmarks/kernels/benchmark_moe.py "
    "on one H100 80GB HBM3 (fused_moe, CUDA graph of 10 calls, mean of 100 replays)"
)
MOE_KERNEL_DATA = Path(__file__).parent / "data" / "vllm-fused-moe-kernel-times.csv"
#: a printed time is one Triton configuration's, not the best kernel's: the same pull request's
#: own configurations move Qwen3-30B-A3B's times by 5-33% at one token count (its "# Main" against
#: "# PR" columns), so a single point is read as +-5% at best and a ratio as +-10%
MOE_KERNEL_UNCERTAINTY = 0.10
#: what vLLM's fused_moe runs that the performance model prices: both expert GEMMs and the
#: activation between them (the router GEMM is outside the benchmarked call)
MOE_KERNEL_OPS = ("experts", "expert_act")


@dataclass(frozen=True)
class MoeKernelTimes:
    """One model's fused-MoE kernel on one board: the built-in shape it is, the dtype and tensor
    parallelism it ran at, and the published microseconds per call at each token count."""

    shape: str
    model: str
    hardware: str
    dtype: str
    tensor_parallel: int
    config: str
    tokens: tuple[int, ...]
    kernel_us: tuple[float, ...]

    @property
    def kernel_s(self) -> np.ndarray:
        return np.asarray(self.kernel_us, dtype=float) * 1e-6


@cache
def _read() -> tuple[MoeKernelTimes, ...]:
    rows: dict[str, list[dict]] = {}
    with open(MOE_KERNEL_DATA, newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["shape"], []).append(row)
    out = []
    for shape, group in rows.items():
        first = group[0]
        out.append(
            MoeKernelTimes(
                shape=shape,
                model=first["model"],
                hardware=first["board"],
                dtype=first["dtype"],
                tensor_parallel=int(first["tensor_parallel"]),
                config=first["config"],
                tokens=tuple(int(r["tokens"]) for r in group),
                kernel_us=tuple(float(r["kernel_us"]) for r in group),
            )
        )
    return tuple(out)


def moe_kernel_times() -> list[MoeKernelTimes]:
    """Every published fused-MoE kernel timing, one entry per model shape."""
    return list(_read())


def priced_moe_kernel_s(times: MoeKernelTimes, profile: HardwareProfile | None = None) -> np.ndarray:
    """The performance model's time of what the kernel runs (MOE_KERNEL_OPS of one MoE layer) at
    each published token count: the tokens as a batch of one-token sequences, on one GPU of
    the published tensor parallelism."""
    hw = profile or load_hardware(times.hardware)
    shape = model_shape(times.model).with_dtype(times.dtype)
    step = StepShape(
        batch_sequences=np.asarray(times.tokens, dtype=float),
        tokens_per_sequence=1,
        context_tokens=0,
        tensor_parallel_gpus=times.tensor_parallel,
    )
    priced = [t.time_s for t in op_timings(shape, None, hw, step) if t.op.name in MOE_KERNEL_OPS]
    return np.sum(np.broadcast_arrays(*priced), axis=0)


@dataclass(frozen=True)
class MoeKernelCheck:
    """The published kernel against the priced one, as ratios T(n)/T(first token count)."""

    times: MoeKernelTimes
    priced_s: np.ndarray

    @property
    def measured_ratio(self) -> np.ndarray:
        t = self.times.kernel_s
        return t / t[0]

    @property
    def priced_ratio(self) -> np.ndarray:
        return self.priced_s / self.priced_s[0]

    @property
    def errors(self) -> np.ndarray:
        """Relative error of the priced ratio at each token count (0 at the first, by construction)."""
        return self.priced_ratio / self.measured_ratio - 1.0

    @property
    def median_error(self) -> float:
        """Median |error| over the token counts after the first."""
        return float(np.median(np.abs(self.errors[1:])))

    @property
    def worst_error(self) -> float:
        return float(np.max(np.abs(self.errors)))


def moe_kernel_checks(profile: HardwareProfile | None = None) -> list[MoeKernelCheck]:
    """Every published fused-MoE timing against the model (each on its own built-in board, or
    on `profile`)."""
    return [MoeKernelCheck(t, priced_moe_kernel_s(t, profile)) for t in moe_kernel_times()]
