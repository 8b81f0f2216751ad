"""Public timings of a model's weight GEMMs by row count: a check of each built-in GPU's GEMM row
curve that no engine's other costs blur, and the measurements the GH100, GA102 and CDNA3 curves
were fitted to (docs/performance-model.md#gemm-row-efficiency and "Where the knee was checked").

The timings are Vidur's profiling data (Agrawal et al., "Vidur: A Large-Scale Simulation
Framework for LLM Inference", MLSys 2024; github.com/microsoft/vidur, file
data/profiling/compute/<gpu>/meta-llama/Llama-2-7b-hf/mlp.csv). Vidur runs each operator of a
Llama-2-7B layer in fp16 on one GPU at 1..4096 token rows, 20 times under the PyTorch profiler,
and keeps the kernels' GPU time. roofline/data/vidur-llama-2-7b-gemms.csv holds the medians
of the four weight GEMMs, at tensor parallelism 1, for 36 row counts:

- attn_pre_proj: the fused Q, K and V projection, 4096 -> 12288;
- attn_post_proj: the output projection, 4096 -> 4096;
- mlp_up_proj: the fused gate and up projection, 4096 -> 22016;
- mlp_down_proj: the down projection, 11008 -> 4096.

PyTorch runs them with cuBLAS, as vLLM and SGLang run unquantised linear layers. The GPUs are
Vidur's "a100", "a40" and "h100". Its H100 data comes from a DGX H100, an H100-SXM5-80GB.
Its A100 data comes from A100 80GB nodes, either PCIe (Azure NC96ads_A100_v4) or SXM4 (DGX
A100). Single-row GEMMs stream at 1.52 TB/s there, 78.6% of the PCIe board's 1935 GB/s and
74.6% of the SXM's 2039. treeopt takes the PCIe board, whose fraction is the one every other
measurement shows (docs/performance-model.md#efficiencies).

The MI300X's timings are the same four GEMMs in fp16, as PyTorch's TunableOp measured them on
one MI300X (gfx942) while tuning vLLM's Llama-2-7B: for each shape it times the candidate
rocBLAS and hipBLASLt kernels and keeps the fastest, the one every later call runs
(github.com/BruceXcluding/Ali_MI300_Tuned, Gemm_Tune/Llama-2-7b-chat-hf-1000inp/full_tuned3.csv;
PyTorch 2.4, ROCm 6.1, hipBLASLt 0.7). roofline/data/tunableop-mi300x-llama-2-7b-gemms.csv
holds the 32 row counts from 7 to 4096 at which all four shapes were tuned. The smallest is 7
rows, so on this board the ratios are T(r)/T(7). TunableOp times back-to-back calls with warm
caches; the MI300X's 256 MB Infinity Cache holds every one of these weights, so the few-row
GEMMs may read faster than HBM alone allows. That bends the ratios up, never down.

numpy and scipy only, like the rest of `roofline`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from roofline.hardware import (
    CDNA3_GEMM_CURVE,
    GA102_GEMM_CURVE,
    GH100_GEMM_CURVE,
    EfficiencyCurve,
    HardwareProfile,
    load_hardware,
)
from roofline.latency import gemm_timing

__all__ = [
    "FITTED_CURVES",
    "GEMM_BANDS",
    "GEMM_DATA",
    "GEMM_SOURCES",
    "GEMM_TOLERANCE",
    "LLAMA_2_7B_GEMMS",
    "MI300X_FILE",
    "MI300X_TUNABLEOP",
    "ROW_CURVE_KNOTS",
    "VIDUR",
    "VIDUR_FILES",
    "GemmBand",
    "GemmCheck",
    "PublishedGemms",
    "fit_row_curve",
    "gemm_bands",
    "gemm_checks",
    "layer_gemm_time_s",
    "published_gemms",
]

VIDUR = (
    'Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference" (MLSys 2024), profiling data '
    "github.com/microsoft/vidur data/profiling/compute/{a100,a40,h100}/meta-llama/Llama-2-7b-hf/mlp.csv "
    "(fp16, PyTorch and cuBLAS, one GPU)"
)
#: the stored version of each file the medians were copied from: board -> (Vidur's GPU, commit)
VIDUR_FILES = {
    "a100-80gb-pcie": ("a100", "bee57dafa1eb2dc422dcaec46a66975599a6a242"),
    "a40": ("a40", "e26eb8f79fa9a6a7c38eac0f5291302402b20364"),
    "h100-sxm": ("h100", "e26eb8f79fa9a6a7c38eac0f5291302402b20364"),
}
MI300X_TUNABLEOP = (
    "PyTorch TunableOp's GEMM tuning results on an AMD Instinct MI300X for Llama-2-7B, "
    "github.com/BruceXcluding/Ali_MI300_Tuned Gemm_Tune/Llama-2-7b-chat-hf-1000inp/full_tuned3.csv "
    "(fp16, the fastest rocBLAS or hipBLASLt kernel per shape; PyTorch 2.4, ROCm 6.1, one GPU)"
)
#: the stored version of the file the MI300X's timings were copied from: (repository, path, commit)
MI300X_FILE = (
    "BruceXcluding/Ali_MI300_Tuned",
    "Gemm_Tune/Llama-2-7b-chat-hf-1000inp/full_tuned3.csv",
    "629887670d16c0b8206f44e4ffc6bc6e40bd076d",
)
_DATA = Path(__file__).parent / "data"
#: every file of published GEMM timings, one board per row, in the same columns
GEMM_DATA = (_DATA / "vidur-llama-2-7b-gemms.csv", _DATA / "tunableop-mi300x-llama-2-7b-gemms.csv")
#: board -> the publication its timings come from
GEMM_SOURCES = {"a100-80gb-pcie": VIDUR, "a40": VIDUR, "h100-sxm": VIDUR, "mi300x": MI300X_TUNABLEOP}
#: the built-in curves fitted to a board's timings (`fit_row_curve`): on that board they are no check
FITTED_CURVES = {"h100-sxm": GH100_GEMM_CURVE, "a40": GA102_GEMM_CURVE, "mi300x": CDNA3_GEMM_CURVE}

#: Vidur's column -> (in_features, out_features) of Llama-2-7B's weight GEMM it times
LLAMA_2_7B_GEMMS = {
    "attn_pre_proj_ms": (4096, 3 * 4096),
    "attn_post_proj_ms": (4096, 4096),
    "mlp_up_proj_ms": (4096, 2 * 11008),
    "mlp_down_proj_ms": (11008, 4096),
}

#: the row counts are judged in bands; a curve matches when the median error of T(r)/T(r0), r0 the
#: board's fewest rows (1, or 7 on the MI300X), in every band is within GEMM_TOLERANCE. Single
#: row counts scatter by up to 30% around any smooth curve (cuBLAS changes tile shapes at 72 and
#: at 144 rows), hence bands and their medians.
GEMM_BANDS = ((1, 64), (64, 256), (256, 1024), (1024, 4096))
GEMM_TOLERANCE = 0.15

#: where a fitted row curve has its points: every power of two of the published row counts
ROW_CURVE_KNOTS = tuple(float(2**i) for i in range(13))


@dataclass(frozen=True)
class PublishedGemms:
    """The four weight GEMMs of one Llama-2-7B layer on one board: rows and, per GEMM (the keys
    of LLAMA_2_7B_GEMMS), the measured milliseconds at each row count."""

    hardware: str
    rows: tuple[int, ...]
    time_ms: dict

    @property
    def layer_time_s(self) -> np.ndarray:
        """The four GEMMs together, per row count."""
        return sum(np.asarray(self.time_ms[c], dtype=float) for c in LLAMA_2_7B_GEMMS) * 1e-3


@cache
def _read() -> dict[str, PublishedGemms]:
    by_board: dict[str, list[dict]] = {}
    for path in GEMM_DATA:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                by_board.setdefault(row["board"], []).append(row)
    out = {}
    for board, rows in by_board.items():
        rows.sort(key=lambda r: int(r["num_tokens"]))
        out[board] = PublishedGemms(
            board,
            tuple(int(r["num_tokens"]) for r in rows),
            {c: tuple(float(r[c]) for r in rows) for c in LLAMA_2_7B_GEMMS},
        )
    return out


def published_gemms(hardware: str | None = None) -> list[PublishedGemms]:
    """The published GEMM timings of `hardware` (a built-in name; None: every board)."""
    data = _read()
    return [g for name, g in sorted(data.items()) if hardware is None or name == hardware]


def layer_gemm_time_s(hw: HardwareProfile, rows) -> np.ndarray:
    """What `hw` predicts for the GPU time of Llama-2-7B's four weight GEMMs of one layer in
    fp16, at `rows`: max(compute, memory) of each. The profiler times kernels on the GPU, so
    the launch gaps a step pays (kernel_overhead_s) are not in the measurements."""
    total = 0.0
    for k, n in LLAMA_2_7B_GEMMS.values():
        t = gemm_timing(hw, dtype="fp16", dtype_bytes=2, rows=rows, in_features=k, out_features=n)
        total = total + np.maximum(t.compute_s, t.memory_s)
    return total


@dataclass(frozen=True)
class GemmCheck:
    """T(rows) / T(r0) of a layer's four GEMMs on one board, measured and predicted (r0 the
    fewest rows the board was timed at: `reference_rows`)."""

    hardware: str
    rows: int
    reference_rows: int
    measured_ratio: float
    predicted_ratio: float

    @property
    def error(self) -> float:
        return self.predicted_ratio / self.measured_ratio - 1.0


def gemm_checks(hardware: str, *, profile: HardwareProfile | None = None) -> list[GemmCheck]:
    """Every published row count of `hardware` above its fewest, against the built-in profile (or
    `profile`, to check a variant). The check is of the row curve: the profile's memory roof is
    first set to what the fewest-row GEMMs attained (they are memory bound), so the board's
    bandwidth and eta_memory drop out of T(r)/T(r0)."""
    base = profile if profile is not None else load_hardware(hardware)
    checks = []
    for g in published_gemms(hardware):
        measured = g.layer_time_s
        rows = np.asarray(g.rows, dtype=float)
        fewest = layer_gemm_time_s(base, rows[:1])[0]
        hw = base.with_(eta_memory=base.eta_memory * float(fewest / measured[0]))
        predicted = layer_gemm_time_s(hw, rows)
        checks += [
            GemmCheck(hardware, r, g.rows[0], float(measured[i] / measured[0]), float(predicted[i] / predicted[0]))
            for i, r in enumerate(g.rows)
            if i > 0
        ]
    return checks


@dataclass(frozen=True)
class GemmBand:
    """The errors of T(r)/T(r0) for the row counts lo < r <= hi of one board (r0 =
    reference_rows, the fewest it was timed at): their median, the worst of them, and how many
    there are."""

    hardware: str
    reference_rows: int
    lo: int
    hi: int
    median_error: float
    worst_error: float
    row_counts: int

    @property
    def matches(self) -> bool:
        return abs(self.median_error) <= GEMM_TOLERANCE


def gemm_bands(hardware: str, *, profile: HardwareProfile | None = None) -> list[GemmBand]:
    """`gemm_checks` summarised per band of GEMM_BANDS (empty without published timings)."""
    checks = gemm_checks(hardware, profile=profile)
    out = []
    for lo, hi in GEMM_BANDS:
        errors = np.array([c.error for c in checks if lo < c.rows <= hi])
        if errors.size:
            worst = float(errors[np.argmax(np.abs(errors))])
            reference = checks[0].reference_rows
            out.append(GemmBand(hardware, reference, lo, hi, float(np.median(errors)), worst, int(errors.size)))
    return out


def fit_row_curve(hw: HardwareProfile, gemms: PublishedGemms, knots=ROW_CURVE_KNOTS) -> EfficiencyCurve:
    """The non-decreasing row curve, with points at `knots`, whose predicted layer GEMM times
    best match the measured ones (least squares in log error); `hw`'s roofs, eta_compute and
    eta_memory stay. A point the measurements cannot see (rows where every GEMM is memory
    bound) takes the value of the next one: a small cost on each step up keeps the curve flat
    where nothing asks it to rise, as `treeopt hw calibrate` keeps it flat below its first
    compute-bound row count."""
    rows = np.asarray(gemms.rows, dtype=float)
    measured = gemms.layer_time_s
    knots = tuple(float(k) for k in knots)

    def curve(x) -> EfficiencyCurve:
        return EfficiencyCurve(knots, tuple(float(v) for v in np.cumsum(x)))

    def residuals(x):
        predicted = layer_gemm_time_s(hw.with_(gemm_efficiency=curve(x)), rows)
        return np.concatenate([np.log(predicted / measured), 1e-3 * x[1:]])

    start = np.concatenate([[0.5], np.full(len(knots) - 1, 0.5 / len(knots))])
    lower = np.concatenate([[0.05], np.zeros(len(knots) - 1)])
    fit = least_squares(
        residuals, start, bounds=(lower, np.full(len(knots), 1.5)), x_scale=0.1, ftol=1e-12, xtol=1e-12, gtol=1e-12
    )
    values = np.round(np.cumsum(fit.x), 3)
    return EfficiencyCurve(knots, tuple(float(v) for v in values))
