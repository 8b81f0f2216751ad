"""Shape-aware GEMM efficiency: tile and wave quantisation of one weight GEMM on one die
(docs/performance-model.md#shape-aware-gemm-efficiency).

The row curves (`roofline.hardware.EfficiencyCurve`) depend on the row count alone. A GEMM's
kernel computes its rows x N output in tiles of tile_m x tile_n elements, one tile per SM at a
time, so its cost also depends on N, K and the die's SM count: a narrow GEMM leaves SMs idle, a
wide one fills them, and one row past a tile boundary costs a whole new wave. cuBLAS chooses the
kernel (tile and split-K) per shape, so this module prices one GEMM (rows x K times K x N) as the
fastest of the kernels of TILES and SPLITS:

- tiles = ceil(rows / tile_m) * ceil(N / tile_n), each split along K into `split` parts;
- waves = ceil(tiles * split / SMs);
- a tile's time = its FLOPs, 2 tile_m tile_n K / split, at the SM's share of peak x
  eta_compute, plus its operands, (tile_m + tile_n) K / split elements, at the SM's operand
  bandwidth (`operand_bytes_per_s`, fitted): a small tile reuses each operand less, so it runs
  further below peak;
- compute = waves x a tile's time; memory = bytes (K N weights + rows K + rows N activations,
  plus a split's fp32 partial sums) / (bandwidth x eta_memory);
- time = max(compute, memory) of the fastest kernel + overhead.

A profile with `gemm_tiles` prices its weight GEMMs with `tile_terms` in place of the row curve
(`roofline.hardware.HardwareProfile.weight_gemm_efficiency`). `fit_shape_params` fits
eta_compute, eta_memory, the overhead and the operand bandwidth by least squares in log time.

The timings are Vidur's (roofline/data/vidur-gemm-shapes.csv; see VIDUR_SHAPES_FILE).
numpy and scipy only, like the rest of `roofline`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

__all__ = [
    "DIES",
    "SHAPE_DATA",
    "SPLITS",
    "TILES",
    "VIDUR_SHAPES_FILE",
    "Die",
    "ShapeParams",
    "ShapeTimings",
    "fit_shape_params",
    "gemm_time_s",
    "shape_timings",
    "tile_terms",
    "tile_waves",
]

#: the Vidur files the CSV was copied from: (repository, path pattern, commit)
VIDUR_SHAPES_FILE = (
    "microsoft/vidur",
    "data/profiling/compute/{a100,h100}/<org>/<model>/mlp.csv",
    "7d47513363ec447a741ac5e47241580b47724fbf",
)
SHAPE_DATA = Path(__file__).parent / "data" / "vidur-gemm-shapes.csv"


@dataclass(frozen=True)
class Die:
    """What the tile model needs of a die: SM count, dense fp16 tensor peak, memory bandwidth
    (the same roofs as the built-in profile `board`), and where the SM count comes from."""

    sms: int
    peak_flops: float
    bandwidth_bytes_per_s: float
    board: str
    source: str


#: Vidur's GPU name -> die. SM counts are the shipping boards' (not the full dies').
DIES = {
    "a100": Die(
        108, 312e12, 1935e9, "a100-80gb-pcie", "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs"
    ),
    "h100": Die(
        132, 989e12, 3350e9, "h100-sxm", "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): SXM5, 132 SMs"
    ),
    "a40": Die(84, 149.7e12, 696e9, "a40", "NVIDIA Ampere GA102 GPU Architecture whitepaper (2021), A40: 84 SMs"),
}

#: the output tiles (rows x columns) a kernel may use: CUTLASS's and cuBLAS's usual tensor-core
#: tile shapes
TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128), (256, 256))
#: split-K factors a kernel may use (cuBLAS splits K for narrow GEMMs that leave SMs idle)
SPLITS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class ShapeParams:
    """A die's fitted tile model: eta_compute and eta_memory as fractions of the die's peak and
    bandwidth, the fixed cost of a GEMM, and each SM's operand bandwidth in bytes/s."""

    eta_compute: float
    eta_memory: float
    overhead_s: float
    operand_bytes_per_s: float


def tile_waves(rows, n, tile_m: int, tile_n: int, sms: int, split=1):
    """(tiles, waves) of a rows x n output in tile_m x tile_n tiles, each split `split` ways
    along K, on `sms` SMs."""
    rows = np.asarray(rows, dtype=float)
    tiles = np.ceil(rows / tile_m) * np.ceil(float(n) / tile_n)
    waves = np.ceil(tiles * split / sms)
    return tiles, waves


def tile_terms(
    rows, k, n, *, sms: int, flops_per_s: float, operand_bytes_per_s: float, bytes_per_s: float, dtype_bytes=2.0
):
    """(compute, memory) seconds of one rows x k times k x n GEMM with the fastest kernel of
    TILES x SPLITS on `sms` SMs: flops_per_s is the die's peak x eta_compute, operand_bytes_per_s
    one SM's operand bandwidth, bytes_per_s the die's bandwidth x eta_memory."""
    rows = np.asarray(rows, dtype=float)
    k, n = float(k), float(n)
    flops_sm = flops_per_s / sms
    moved = dtype_bytes * (k * n + rows * k + rows * n)
    best = None
    for (tile_m, tile_n), split in product(TILES, SPLITS):
        if k / split < 64 and split > 1:
            continue
        _, waves = tile_waves(rows, n, tile_m, tile_n, sms, split)
        depth = k / split
        per_tile = (
            2.0 * tile_m * tile_n * depth / flops_sm + dtype_bytes * (tile_m + tile_n) * depth / operand_bytes_per_s
        )
        compute = waves * per_tile
        extra = 0.0 if split == 1 else 4.0 * split * rows * n  # fp32 partial sums written and read back
        memory = (moved + extra) / bytes_per_s
        if best is None:
            best = (compute, memory)
        else:
            # the kernel with the shorter max(compute, memory), as cuBLAS's heuristics pick one per
            # shape: a minimum of functions that rise with rows rises with rows too
            better = np.maximum(compute, memory) < np.maximum(*best)
            best = (np.where(better, compute, best[0]), np.where(better, memory, best[1]))
    return best


def _terms(rows, k, n, die: Die, p: ShapeParams):
    return tile_terms(
        rows,
        k,
        n,
        sms=die.sms,
        flops_per_s=die.peak_flops * p.eta_compute,
        operand_bytes_per_s=p.operand_bytes_per_s,
        bytes_per_s=die.bandwidth_bytes_per_s * p.eta_memory,
    )


def gemm_time_s(rows, k, n, die: Die | str, params: ShapeParams) -> np.ndarray:
    """The tile model's GPU time of one fp16 GEMM (rows x k times k x n) at `rows`."""
    d = DIES[die] if isinstance(die, str) else die
    compute, memory = _terms(rows, k, n, d, params)
    return np.maximum(compute, memory) + params.overhead_s


@dataclass(frozen=True)
class ShapeTimings:
    """Vidur's medians of one GEMM shape on one GPU."""

    gpu: str
    model: str
    tp: int
    operator: str
    k: int
    n: int
    rows: tuple[int, ...]
    time_ms: tuple[float, ...]

    @property
    def label(self) -> str:
        return f"{self.model} tp{self.tp} {self.operator} {self.k}->{self.n}"


@cache
def _read() -> tuple[ShapeTimings, ...]:
    groups: dict[tuple, list] = {}
    with open(SHAPE_DATA, newline="") as f:
        lines = (line for line in f if not line.startswith("#"))
        for r in csv.DictReader(lines):
            key = (r["gpu"], r["model"], int(r["tp"]), r["operator"], int(r["in_features"]), int(r["out_features"]))
            groups.setdefault(key, []).append((int(r["rows"]), float(r["median_ms"])))
    out = []
    for key, pts in groups.items():
        pts.sort()
        out.append(ShapeTimings(*key, tuple(p[0] for p in pts), tuple(p[1] for p in pts)))
    return tuple(out)


def shape_timings(gpu: str | None = None) -> list[ShapeTimings]:
    """Every stored shape (of `gpu`, a key of DIES; None: all)."""
    return [s for s in _read() if gpu is None or s.gpu == gpu]


def fit_shape_params(shapes, die: Die | str) -> ShapeParams:
    """The tile model that best matches `shapes` (ShapeTimings of one die): eta_compute (at most
    1), eta_memory (at most 1), the overhead and the operand bandwidth by least squares in log
    time."""
    d = DIES[die] if isinstance(die, str) else die
    data = [(np.asarray(s.rows, dtype=float), s.k, s.n, np.asarray(s.time_ms) * 1e-3) for s in shapes]

    def residuals(x):
        p = ShapeParams(*(float(v) for v in np.exp(x)))
        return np.concatenate([np.log(gemm_time_s(r, k, n, d, p) / t) for r, k, n, t in data])

    fit = least_squares(
        residuals,
        np.log([0.8, 0.8, 2e-6, 1e11]),
        bounds=(np.log([0.05, 0.2, 1e-8, 1e9]), np.log([1.0, 1.0, 1e-4, 1e14])),
    )
    return ShapeParams(*(float(v) for v in np.exp(fit.x)))
