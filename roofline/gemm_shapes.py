"""Shape-aware GEMM efficiency: tile and wave quantisation of one weight GEMM on one die
(docs/performance-model.md#shape-aware-gemm-efficiency-not-yet-in-the-latency-model).

The built-in row curves (`roofline.hardware.EfficiencyCurve`) depend on the row count alone.
A GEMM's kernel computes its rows x N output in tiles of tile_m x tile_n elements, one tile per
SM at a time, so its cost also depends on N and on the die's SM count: a narrow GEMM leaves SMs
idle, a wide one fills them. This module prices one GEMM (rows x K times K x N, fp16) as

- tiles = ceil(rows / tile_m) * ceil(N / tile_n), split along K into `split` parts (split-K,
  chosen from SPLITS for the shortest max(compute, memory); cuBLAS does the same for narrow GEMMs);
- waves = ceil(tiles * split / SMs);
- compute = waves * (2 tile_m tile_n K / split) / (peak / SMs * eta_compute);
- memory = bytes (K N weights + rows K + rows N activations, plus the fp32 partial sums of a
  split-K) / (bandwidth * eta_memory);
- time = max(compute, memory) + overhead.

`efficiency` is the useful fraction of the compute term (2 rows K N at the large-GEMM rate
over the quantised compute time), the shape-aware counterpart of the row curve.
`fit_shape_params` fits (tile_m, tile_n) from TILE_CANDIDATES and eta_compute, eta_memory and
the overhead by least squares in log time. Nothing here is wired into the latency model.

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
    "TILE_CANDIDATES",
    "VIDUR_SHAPES_FILE",
    "Die",
    "ShapeParams",
    "ShapeTimings",
    "efficiency",
    "fit_shape_params",
    "gemm_time_s",
    "shape_timings",
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

#: the tile sizes a fit may choose from (rows x N of output per tile)
TILE_CANDIDATES = (64, 128, 256)
#: split-K factors the model may use; the one with the shortest max(compute, memory) is taken
SPLITS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class ShapeParams:
    """A die's fitted tile model."""

    tile_m: int
    tile_n: int
    eta_compute: float
    eta_memory: float
    overhead_s: float


def tile_waves(rows, n, tile_m: int, tile_n: int, sms: int, split=1):
    """(tiles, waves) of a rows x n output in tile_m x tile_n tiles, each split `split` ways
    along K, on `sms` SMs."""
    rows = np.asarray(rows, dtype=float)
    tiles = np.ceil(rows / tile_m) * np.ceil(float(n) / tile_n)
    waves = np.ceil(tiles * split / sms)
    return tiles, waves


def _terms(rows, k, n, die: Die, p: ShapeParams):
    rows = np.asarray(rows, dtype=float)
    k, n = float(k), float(n)
    rate_sm = die.peak_flops / die.sms * p.eta_compute
    moved = 2.0 * (k * n + rows * k + rows * n)
    bw = die.bandwidth_bytes_per_s * p.eta_memory
    best = None
    for s in SPLITS:
        if k / s < 64 and s > 1:
            break
        _, waves = tile_waves(rows, n, p.tile_m, p.tile_n, die.sms, s)
        compute = waves * 2.0 * p.tile_m * p.tile_n * (k / s) / rate_sm
        extra = 0.0 if s == 1 else 4.0 * s * rows * n  # fp32 partial sums written and read back
        memory = (moved + extra) / bw
        if best is None:
            best = (compute, memory)
        else:
            # the split with the shorter max(compute, memory): a minimum of functions that rise
            # with rows rises with rows too
            better = np.maximum(compute, memory) < np.maximum(*best)
            best = (np.where(better, compute, best[0]), np.where(better, memory, best[1]))
    best_c, memory = best
    return best_c, memory


def gemm_time_s(rows, k, n, die: Die | str, params: ShapeParams) -> np.ndarray:
    """The tile model's GPU time of one fp16 GEMM (rows x k times k x n) at `rows`."""
    d = DIES[die] if isinstance(die, str) else die
    compute, memory = _terms(rows, k, n, d, params)
    return np.maximum(compute, memory) + params.overhead_s


def efficiency(rows, k, n, die: Die | str, params: ShapeParams) -> np.ndarray:
    """Useful fraction of the quantised compute: 2 rows k n FLOPs at eta_compute x peak over
    the tile model's compute time (1 when every tile of every wave is full)."""
    d = DIES[die] if isinstance(die, str) else die
    compute, _ = _terms(rows, k, n, d, params)
    rows = np.asarray(rows, dtype=float)
    return 2.0 * rows * float(k) * float(n) / (d.peak_flops * params.eta_compute) / compute


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
    """The tile model that best matches `shapes` (ShapeTimings of one die): each (tile_m,
    tile_n) of TILE_CANDIDATES, eta_compute, eta_memory and overhead by least squares in log
    time; the tile pair with the smallest residual wins."""
    d = DIES[die] if isinstance(die, str) else die
    data = [(np.asarray(s.rows, dtype=float), s.k, s.n, np.asarray(s.time_ms) * 1e-3) for s in shapes]
    best = None
    for tm, tn in product(TILE_CANDIDATES, TILE_CANDIDATES):

        def residuals(x, tm=tm, tn=tn):
            p = ShapeParams(tm, tn, float(np.exp(x[0])), float(np.exp(x[1])), float(np.exp(x[2])))
            return np.concatenate([np.log(gemm_time_s(r, k, n, d, p) / t) for r, k, n, t in data])

        fit = least_squares(
            residuals, np.log([0.7, 0.8, 2e-6]), bounds=(np.log([0.05, 0.2, 1e-8]), np.log([1.5, 1.0, 1e-4]))
        )
        cost = float(fit.cost)
        if best is None or cost < best[0]:
            best = (cost, ShapeParams(tm, tn, *(float(v) for v in np.exp(fit.x))))
    return best[1]
