"""Hardware profiles: the roofs and the overheads the latency model uses.

Built-in profiles are the datasheet table of docs/performance-model.md#built-in-hardware (dense fp16/bf16 tensor-core
FLOP/s, memory bandwidth, capacity), plus the vector (non-tensor) fp32 rate where the vendor
prints one. Efficiencies for them:

- eta_memory = 0.78: the middle of the published 77-80% of peak bandwidth reached by
  single-token decode on A100, H100 and A40 (docs/performance-model.md#efficiencies). Decode is where bandwidth
  binds, so this is the number that sets plain-decoding latency.
- eta_compute = 0.74: the middle of the 71-76% of peak FLOP/s reached by large GEMMs.
- gemm_efficiency: a relative efficiency (x eta_compute) that depends on the GEMM's row
  count M = batch x tokens, one curve per die (docs/performance-model.md#gemm-row-efficiency). DEFAULT_GPU_GEMM_CURVE
  (GA100) is fitted so that the predicted step time of
  Vicuna-7B (fp16, batch 1, 512 cached tokens, no heads) on `a100-80gb-sxm` reproduces a
  skinny-GEMM measurement: flat to ~64 tokens, 1.27x the 1-token time at 96 tokens, 1.9x at
  256 (tile and wave quantisation make rows 64-256 cost more than a pure max(compute, memory)
  says). GH100_GEMM_CURVE and GA102_GEMM_CURVE are fitted to Vidur's public fp16 GEMM timings
  on an H100-SXM and an A40 (roofline/published_gemms.py). Each profile's
  `gemm_efficiency_source` says which curve it carries and what its knee was checked against
  (`treeopt hw published`); calibrate (`treeopt hw calibrate --device cuda`) to replace it by
  measurements.
- kernel_overhead_s = 3 us per kernel: the minimum cost of a launched kernel (launch gap plus
  the smallest kernel's duration) in an engine that replays CUDA graphs; eager PyTorch costs
  more. forward_overhead_s = 0 for the built-ins (no framework overhead assumed).
- the engine terms (docs/performance-model.md#engine-terms-of-a-speculative-step):
  spec_step_overhead_s, verified_token_s, draft_stage_s, tree_verify_layer_s and the attention
  kernel's KV bandwidth by context length. The built-ins describe an ideal engine (0, 0, 0, 0, the
  streaming bandwidth); a profile fitted to an engine's measured step times (`treeopt hw fit`) sets them.
- capacity: NVIDIA and AMD print HBM/GDDR sizes in binary units ("80 GB" = 80 GiB), so the
  built-ins hold capacity_sold_gb x 2^30 bytes (docs/performance-model.md#memory-capacity).

Calibrated profiles (`treeopt hw calibrate`) measure all of these on the machine at hand,
including the framework's fixed cost per forward pass and per layer, and are stored as JSON
(`treeopt.hardware/v1`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from roofline.gemm_shapes import tile_terms
from treeopt.dtypes import DTYPE_BYTES
from treeopt.errors import UserError
from treeopt.fileio import read_json_input, write_json

__all__ = [
    "EfficiencyCurve",
    "GemmTiles",
    "HardwareProfile",
    "load_hardware",
    "builtin_hardware",
    "DEFAULT_GPU_GEMM_CURVE",
    "CDNA3_GEMM_CURVE",
    "GA102_GEMM_CURVE",
    "GH100_GEMM_CURVE",
    "HARDWARE_FORMAT",
    "GIB",
    "VERIFICATION_MODES",
]

# how a step verifies its draft tokens (docs/performance-model.md#verification-modes)
VERIFICATION_MODES = ("tree", "candidates")

HARDWARE_FORMAT = "treeopt.hardware/v1"
GB = 1e9
GIB = 2.0**30
TFLOPS = 1e12


@dataclass(frozen=True)
class EfficiencyCurve:
    """Efficiency as a function of a row count: a power law between neighbouring points (linear
    in log2(rows) and log2(efficiency)) and constant beyond the ends. Values are relative (0, 1.5].

    Between two points the time of a GEMM, rows / efficiency, is then a power of rows too, so it
    rises monotonically whenever it does at the points: an efficiency linear in log2(rows) made
    the time dip between points and the predicted curves zigzag
    (docs/performance-model.md#gemm-row-efficiency)."""

    rows: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self):
        if len(self.rows) != len(self.values) or not self.rows:
            raise UserError("efficiency curve: 'rows' and 'values' must be non-empty and of equal length")
        r = np.asarray(self.rows, dtype=float)
        v = np.asarray(self.values, dtype=float)
        if np.any(r < 1) or np.any(np.diff(r) <= 0):
            raise UserError("efficiency curve: 'rows' must be increasing and >= 1")
        if np.any(~np.isfinite(v)) or np.any(v <= 0):
            raise UserError("efficiency curve: 'values' must be positive numbers")

    def __call__(self, rows) -> np.ndarray:
        x = np.log2(np.maximum(np.asarray(rows, dtype=float), 1.0))
        log_values = np.log2(np.asarray(self.values, dtype=float))
        return np.exp2(np.interp(x, np.log2(np.asarray(self.rows, dtype=float)), log_values))

    def to_dict(self) -> dict:
        return {"rows": list(self.rows), "values": list(self.values)}

    @classmethod
    def from_dict(cls, d, *, source: str = "curve") -> EfficiencyCurve:
        if not isinstance(d, dict) or "rows" not in d or "values" not in d:
            raise UserError(f"{source}: expected an object with 'rows' and 'values'")
        try:
            return cls(tuple(float(x) for x in d["rows"]), tuple(float(x) for x in d["values"]))
        except (TypeError, ValueError):
            raise UserError(f"{source}: 'rows' and 'values' must be lists of numbers") from None
        except UserError as err:
            raise UserError(f"{source}: {err}") from None


# Fitted by bisection on the two measured ratios (tests/test_roofline_latency.py checks that
# the fit still holds): relative GEMM efficiency; x eta_compute (0.74) = fraction of peak.
# Up to 96 rows an A100 runs a 7B model's GEMMs at ~0.52 x 0.74 = 38% of peak (one partly
# filled 128-row tile per column block); from 256 rows on they are near the large-GEMM 74%.
# Rows <= 64 are memory bound for 7B weights either way, so the flat start only matters
# for compute-heavy small GEMMs. Predicted Vicuna-7B step / 1-token step on a100-80gb-sxm:
# 1.05 at 64 tokens, 1.27 at 96, 1.39 at 128, 1.90 at 256, 3.6 at 512.
DEFAULT_GPU_GEMM_CURVE = EfficiencyCurve(
    rows=(1.0, 96.0, 256.0, 512.0, 1024.0),
    values=(0.52, 0.52, 0.93, 0.95, 1.0),
)

# The GH100's and GA102's curves, fitted by roofline.published_gemms.fit_row_curve to Vidur's fp16
# timings of Llama-2-7B's weight GEMMs at 1..4096 rows on an H100-SXM5-80GB and on an A40
# (tests/test_roofline_published_gemms.py checks that the fit still gives them). On the GH100 a
# 7B model's GEMMs run at ~0.19 x 0.74 = 14% of peak up to 64 rows and ~28% at 128, where the
# A100 curve says 47%: its knee comes earlier.
_POWERS_OF_TWO = tuple(float(2**i) for i in range(13))
GH100_GEMM_CURVE = EfficiencyCurve(
    rows=_POWERS_OF_TWO,
    values=(0.188, 0.188, 0.188, 0.188, 0.188, 0.188, 0.188, 0.378, 0.557, 0.807, 0.924, 1.01, 1.017),
)
GA102_GEMM_CURVE = EfficiencyCurve(
    rows=_POWERS_OF_TWO,
    values=(0.141, 0.141, 0.141, 0.141, 0.141, 0.141, 0.255, 0.514, 0.725, 0.893, 0.964, 1.002, 1.002),
)
# The MI300X's (CDNA3), fitted the same way to PyTorch TunableOp's timings of the same GEMMs at
# 7..4096 rows on one MI300X. Its dense fp16 GEMMs reach 0.61 x 0.74 = 45% of the datasheet peak
# at 4096 rows and 31% at 256: on this GPU what rocBLAS and hipBLASLt attain is far below the
# datasheet, and the curve carries the difference. No timings lie between 36 and 216 rows, so
# the rise there is the fit's cautious choice (flat until 128), not a measurement.
CDNA3_GEMM_CURVE = EfficiencyCurve(
    rows=_POWERS_OF_TWO,
    values=(0.287, 0.287, 0.287, 0.287, 0.287, 0.287, 0.287, 0.287, 0.417, 0.417, 0.525, 0.567, 0.613),
)


@dataclass(frozen=True)
class GemmTiles:
    """A die's tile and wave model of its weight GEMMs
    (docs/performance-model.md#shape-aware-gemm-efficiency): `sms` SMs, each running a tile's
    FLOPs at peak_fraction of its share of the die's peak and loading the tile's operands at
    operand_bytes_per_s. With it a weight GEMM's efficiency depends on its width and depth as
    well as its rows (`roofline.gemm_shapes.tile_terms`)."""

    sms: int
    peak_fraction: float
    operand_bytes_per_s: float

    def __post_init__(self):
        if not isinstance(self.sms, int) or isinstance(self.sms, bool) or self.sms < 1:
            raise UserError(f"gemm_tiles: 'sms' must be an integer >= 1, got {self.sms!r}")
        for key in ("peak_fraction", "operand_bytes_per_s"):
            if not _positive(getattr(self, key)):
                raise UserError(f"gemm_tiles: '{key}' must be a positive number, got {getattr(self, key)!r}")

    def scaled(self, factor: float) -> GemmTiles:
        """Every tile's time divided by `factor` (a fitted GEMM efficiency scale)."""
        return GemmTiles(self.sms, self.peak_fraction * factor, self.operand_bytes_per_s * factor)

    def to_dict(self) -> dict:
        return {"sms": self.sms, "peak_fraction": self.peak_fraction, "operand_bytes_per_s": self.operand_bytes_per_s}

    @classmethod
    def from_dict(cls, d, *, source: str = "gemm_tiles") -> GemmTiles:
        keys = {"sms", "peak_fraction", "operand_bytes_per_s"}
        if not isinstance(d, dict) or set(d) != keys:
            raise UserError(f"{source}: expected an object with 'sms', 'peak_fraction' and 'operand_bytes_per_s'")
        try:
            return cls(**d)
        except UserError as err:
            raise UserError(f"{source}: {err}") from None


#: the most any fixed per-step cost of a profile may be: a whole decoding step of a 70B model on
#: one CPU core takes tens of seconds, so a term above this is a unit error, not a measurement
MAX_OVERHEAD_S = 60.0


@dataclass(frozen=True)
class HardwareProfile:
    """Roofs, efficiencies and overheads of one machine (and, for calibrated profiles, one
    framework on it).

    peak_flops: FLOP/s per dtype ("bf16", "fp16", "fp32", ...), dense, no sparsity.
    vector_flops: FLOP/s of non-matrix (elementwise, softmax) work; None = peak_flops["fp32"].
    bandwidth_bytes_per_s / capacity_bytes: memory roof and size.
    eta_compute, eta_memory: attained fractions of the roofs for large GEMMs and streaming.
    gemm_efficiency: relative GEMM efficiency by row count M (multiplies eta_compute).
    attention_efficiency: the same for attention's matmuls, by query rows per KV head
        (None = gemm_efficiency).
    elementwise_bytes_per_s: throughput of elementwise kernels on activations (None =
        bandwidth x eta_memory).
    kernel_overhead_s: fixed cost added per kernel launch.
    forward_overhead_s, layer_overhead_s: fixed cost per forward pass and per decoder layer
        per forward pass (framework/Python work that is not in any kernel).
    head_overhead_s: fixed cost per draft head per step (the heads are separate modules).
    token_overhead_s, context_overhead_s: framework cost per layer per new token row (b q) and
        per cached token (b s) of a tree step (q > 1, a custom attention mask) beyond the
        operators' minimum traffic (calibrated profiles).
    plain_context_overhead_s: the same per cached token for plain decoding (q = 1), which takes
        the framework's ordinary causal path.
    kv_cache_update: "append" (new K/V written in place) or "concat" (the whole cache is
        copied every forward, as transformers' DynamicCache does).
    kv_update_bytes_per_s: throughput of that update (None = bandwidth x eta_memory).
    attention_block_overhead_s: extra cost per (sequence x head) of an attention call (CPU
        kernels loop over these blocks).
    spec_step_overhead_s: fixed cost of a speculative step (q > 1) beyond its forward pass:
        drafting launches, candidate assembly, acceptance, host synchronisation.
    verified_token_s: cost per verified token (b q of them) beyond the forward pass: logits,
        sampling, bookkeeping.
    draft_stage_s: cost per sequential draft stage (a drafter that drafts depth by depth).
    tree_verify_layer_s: cost per target-model layer of a step whose verified tokens branch (a
        tree, `StepShape.tree_verify`) beyond a chain of as many tokens: SGLang verifies such a
        tree with two attention passes per layer where a chain takes one. Wall time per step:
        under tensor parallelism every GPU runs all the layers, so it is charged once per layer.
    attention_kv_efficiency: the attention kernel's achieved fraction of bandwidth x eta_memory
        when it reads the KV cache, by keys per sequence (s + q) (None = 1: the streaming rate).
    capacity_sold_gb: the capacity as printed on the datasheet, for display; capacity_bytes
        is what the model may use.
    gemm_efficiency_source: where the row curve comes from and which measurement its knee was
        checked against ("" = not stated).
    gemm_tiles: the die's tile and wave model (`GemmTiles`); where set, a weight GEMM of known
        width takes its efficiency from it instead of the row curve (None = the row curve).
    """

    name: str
    peak_flops: dict
    bandwidth_bytes_per_s: float
    capacity_bytes: float
    eta_compute: float = 0.74
    eta_memory: float = 0.78
    kernel_overhead_s: float = 3e-6
    forward_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    head_overhead_s: float = 0.0
    token_overhead_s: float = 0.0
    context_overhead_s: float = 0.0
    plain_context_overhead_s: float = 0.0
    gemm_efficiency: EfficiencyCurve = DEFAULT_GPU_GEMM_CURVE
    attention_efficiency: EfficiencyCurve | None = None
    vector_flops: float | None = None
    elementwise_bytes_per_s: float | None = None
    kv_cache_update: str = "append"
    kv_update_bytes_per_s: float | None = None
    attention_block_overhead_s: float = 0.0
    spec_step_overhead_s: float = 0.0
    verified_token_s: float = 0.0
    draft_stage_s: float = 0.0
    tree_verify_layer_s: float = 0.0
    attention_kv_efficiency: EfficiencyCurve | None = None
    interconnect_bytes_per_s: float = 32e9
    # one small all-reduce inside a captured step with the engines' own kernels: 3-8 us on 2-8
    # H100s (docs/performance-model.md#tensor-parallelism: TensorRT-LLM's, vLLM's, SGLang's)
    collective_latency_s: float = 5e-6
    capacity_sold_gb: float | None = None
    description: str = ""
    source: str = ""
    gemm_efficiency_source: str = ""
    gemm_tiles: GemmTiles | None = None
    calibration: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.peak_flops, dict) or not self.peak_flops:
            raise UserError(f"hardware {self.name}: 'peak_flops' must be a non-empty object of dtype -> FLOP/s")
        for dt, value in self.peak_flops.items():
            if not _positive(value):
                raise UserError(f"hardware {self.name}: peak_flops['{dt}'] must be a positive number")
        for key in ("bandwidth_bytes_per_s", "capacity_bytes", "eta_compute", "eta_memory", "interconnect_bytes_per_s"):
            if not _positive(getattr(self, key)):
                raise UserError(f"hardware {self.name}: '{key}' must be a positive number")
        for key in ("eta_compute", "eta_memory"):  # attained fractions of a roof: never above it
            if getattr(self, key) > 1:
                raise UserError(
                    f"hardware {self.name}: '{key}' is a fraction of the peak, at most 1, got {getattr(self, key)}"
                )
        for key in (
            "kernel_overhead_s",
            "forward_overhead_s",
            "layer_overhead_s",
            "head_overhead_s",
            "token_overhead_s",
            "context_overhead_s",
            "plain_context_overhead_s",
            "attention_block_overhead_s",
            "spec_step_overhead_s",
            "verified_token_s",
            "draft_stage_s",
            "tree_verify_layer_s",
            "collective_latency_s",
        ):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value < 0:
                raise UserError(f"hardware {self.name}: '{key}' must be a number >= 0")
            if value > MAX_OVERHEAD_S:
                raise UserError(
                    f"hardware {self.name}: '{key}' is {value:g} s, more than any step takes ({MAX_OVERHEAD_S:g} s)"
                )
        for key in ("vector_flops", "elementwise_bytes_per_s", "kv_update_bytes_per_s", "capacity_sold_gb"):
            value = getattr(self, key)
            if value is not None and not _positive(value):
                raise UserError(f"hardware {self.name}: '{key}' must be a positive number or null")
        if self.kv_cache_update not in ("append", "concat"):
            raise UserError(f"hardware {self.name}: kv_cache_update must be 'append' or 'concat'")

    # --- derived rates -------------------------------------------------------------------
    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for matrix work in `dtype` (bf16 and fp16 stand in for each other)."""
        if dtype in self.peak_flops:
            return float(self.peak_flops[dtype])
        twin = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)
        if twin in self.peak_flops:
            return float(self.peak_flops[twin])
        raise UserError(
            f"hardware {self.name}: no peak FLOP/s for dtype {dtype} "
            f"(it has {', '.join(sorted(self.peak_flops))}); pass --dtype"
        )

    @property
    def vector_flops_per_s(self) -> float:
        if self.vector_flops is not None:
            return float(self.vector_flops)
        if "fp32" in self.peak_flops:
            return float(self.peak_flops["fp32"])
        # without a vector figure: a sixteenth of the 16-bit tensor rate (not of fp8's, twice it)
        sixteen_bit = [self.peak_flops[k] for k in ("bf16", "fp16") if k in self.peak_flops]
        return float(max(sixteen_bit or self.peak_flops.values())) / 16.0

    @property
    def elementwise_rate(self) -> float:
        if self.elementwise_bytes_per_s is not None:
            return float(self.elementwise_bytes_per_s)
        return self.bandwidth_bytes_per_s * self.eta_memory

    def weight_gemm_efficiency(self, rows, in_features, out_features, dtype: str) -> np.ndarray:
        """Relative efficiency (x eta_compute) of a weight GEMM of `rows` rows, in_features x
        out_features: the tile model's where the profile has `gemm_tiles` and the GEMM's shape
        is known (in_features > 0), else the row curve's."""
        if self.gemm_tiles is None or not in_features > 0:
            return self.gemm_efficiency(rows)
        t = self.gemm_tiles
        peak = self.peak(dtype)
        compute_s, _ = tile_terms(
            rows,
            in_features,
            out_features,
            sms=t.sms,
            flops_per_s=peak * t.peak_fraction,
            operand_bytes_per_s=t.operand_bytes_per_s,
            bytes_per_s=self.bandwidth_bytes_per_s * self.eta_memory,
            dtype_bytes=float(DTYPE_BYTES.get(dtype, 2)),
        )
        flops = 2.0 * np.asarray(rows, dtype=float) * float(in_features) * float(out_features)
        return flops / (peak * self.eta_compute) / compute_s

    @property
    def attention_curve(self) -> EfficiencyCurve:
        return self.attention_efficiency or self.gemm_efficiency

    def attention_kv_fraction(self, keys) -> np.ndarray:
        """Achieved fraction of the streaming rate when attention reads `keys` cached keys per
        sequence (1 without a curve)."""
        if self.attention_kv_efficiency is None:
            return np.ones_like(np.asarray(keys, dtype=float))
        return self.attention_kv_efficiency(keys)

    @property
    def capacity_gib(self) -> float:
        """Usable memory in GiB (2^30 bytes)."""
        return self.capacity_bytes / GIB

    def capacity_text(self) -> str:
        """'80 GiB' or, for a datasheet figure, '80 GiB (sold as 80 GB)'."""
        sold = f" (sold as {self.capacity_sold_gb:g} GB)" if self.capacity_sold_gb else ""
        return f"{self.capacity_gib:.4g} GiB{sold}"

    def ridge_intensity(self, dtype: str) -> float:
        """FLOP per byte where the attained roofs meet."""
        return self.peak(dtype) * self.eta_compute / (self.bandwidth_bytes_per_s * self.eta_memory)

    def describe(self) -> str:
        unit, scale = ("TFLOP/s", TFLOPS) if max(self.peak_flops.values()) >= TFLOPS else ("GFLOP/s", 1e9)
        peaks = ", ".join(f"{k} {v / scale:.4g}" for k, v in sorted(self.peak_flops.items()))
        return (
            f"{self.name}: peak {unit} {peaks}; {self.bandwidth_bytes_per_s / GB:.4g} GB/s; "
            f"{self.capacity_text()}; eta_c {self.eta_compute:.3g}, eta_m {self.eta_memory:.3g}"
        )

    # --- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"format": HARDWARE_FORMAT}
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if isinstance(value, (EfficiencyCurve, GemmTiles)):
                value = value.to_dict()
            d[key] = value
        return d

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "hardware profile") -> HardwareProfile:
        if not isinstance(d, dict):
            raise UserError(f"{source}: expected a JSON object")
        fmt = d.get("format", HARDWARE_FORMAT)
        if fmt != HARDWARE_FORMAT:
            raise UserError(f"{source}: format '{fmt}' is not {HARDWARE_FORMAT}")
        for key in ("name", "peak_flops", "bandwidth_bytes_per_s", "capacity_bytes"):
            if key not in d:
                raise UserError(f"{source}: missing key '{key}'")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"format"})
        if unknown:
            raise UserError(f"{source}: unknown key '{unknown[0]}'")
        kwargs = {k: v for k, v in d.items() if k in known}
        for key, kinds, what in _FIELD_TYPES:
            if key in kwargs and not isinstance(kwargs[key], kinds):
                raise UserError(f"{source}: '{key}' must be {what}, got {json.dumps(kwargs[key])[:40]}")
        if "gemm_efficiency" in kwargs and kwargs["gemm_efficiency"] is None:
            raise UserError(f"{source}: 'gemm_efficiency' must be an object with 'rows' and 'values', got null")
        for key in ("gemm_efficiency", "attention_efficiency", "attention_kv_efficiency"):
            if kwargs.get(key) is not None:
                kwargs[key] = EfficiencyCurve.from_dict(kwargs[key], source=f"{source}: {key}")
        if kwargs.get("gemm_tiles") is not None:
            kwargs["gemm_tiles"] = GemmTiles.from_dict(kwargs["gemm_tiles"], source=f"{source}: gemm_tiles")
        if not isinstance(kwargs["peak_flops"], dict):
            raise UserError(f"{source}: 'peak_flops' must be an object of dtype -> FLOP/s")
        kwargs["peak_flops"] = {str(k): v for k, v in kwargs["peak_flops"].items()}
        try:
            return cls(**kwargs)
        except UserError as err:
            raise UserError(f"{source}: {err}") from None
        except TypeError as err:
            raise UserError(f"{source}: {err}") from None

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    def with_(self, **changes) -> HardwareProfile:
        return replace(self, **changes)


# keys of a profile file whose JSON type the dataclass cannot check by value (docs/formats.md)
_FIELD_TYPES = (
    ("name", str, "a string"),
    ("description", str, "a string"),
    ("source", str, "a string"),
    ("gemm_efficiency_source", str, "a string"),
    ("kv_cache_update", str, "a string"),
    ("calibration", dict, "an object"),
    ("peak_flops", dict, "an object of dtype -> FLOP/s"),
)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and value > 0


def _gpu(name, bf16_tflops, gbps, gb, fp32_tflops, description, *, fp8_tflops=None, note="", curve="GA100", knee=""):
    peaks = {"bf16": bf16_tflops * TFLOPS, "fp16": bf16_tflops * TFLOPS}
    if fp8_tflops:
        peaks["fp8"] = fp8_tflops * TFLOPS
    if fp32_tflops:
        peaks["fp32"] = fp32_tflops * TFLOPS
    src = (
        "vendor datasheet, see docs/performance-model.md (dense fp16/bf16 and fp8, no sparsity); fp32 = "
        "non-tensor-core rate from the vendor datasheet" + (f"; {note}" if note else "")
    )
    gemm_curve, curve_text = _ROW_CURVES[curve]
    # the "GB" printed on GPU datasheets counts binary gigabytes: an "80 GB" A100 reports
    # 81920 MiB (docs/performance-model.md#memory-capacity)
    return HardwareProfile(
        name=name,
        peak_flops=peaks,
        bandwidth_bytes_per_s=gbps * GB,
        capacity_bytes=gb * GIB,
        capacity_sold_gb=float(gb),
        gemm_efficiency=gemm_curve,
        description=description,
        source=src,
        gemm_efficiency_source=f"{curve_text}; {knee or _UNCHECKED}",
    )


# Each die's GEMM row curve, and where each built-in GPU's was compared with public measurements:
# step times in roofline/published.py, GEMM timings in roofline/published_gemms.py (`treeopt hw
# published`); docs/performance-model.md#where-the-knee-was-checked explains the verdicts.
_ROW_CURVES = {
    "GA100": (DEFAULT_GPU_GEMM_CURVE, "the A100 row curve (DEFAULT_GPU_GEMM_CURVE)"),
    "GH100": (
        GH100_GEMM_CURVE,
        "the GH100 row curve (GH100_GEMM_CURVE, fitted to Vidur's GEMM timings on an H100-SXM)",
    ),
    "GA102": (GA102_GEMM_CURVE, "the GA102 row curve (GA102_GEMM_CURVE, fitted to Vidur's GEMM timings on an A40)"),
    "CDNA3": (
        CDNA3_GEMM_CURVE,
        "the CDNA3 row curve (CDNA3_GEMM_CURVE, fitted to PyTorch TunableOp's GEMM timings on an MI300X)",
    ),
}
_UNCHECKED = "not checked on this GPU: no public measurement of its GEMMs or steps against tokens was found"
_TRT_LLM = "NVIDIA's published TensorRT-LLM step times"
_VIDUR = "Vidur's fp16 GEMM timings"
_A100_SXM = f"checked against {_TRT_LLM} (v0.5 and v0.9) on this board in fp16 (`treeopt hw published`)"
_A100_PCIE = (
    f"checked against {_VIDUR} on an A100 80GB, taken as this board, and against {_TRT_LLM} on the "
    "A100-SXM4-80GB, the same GA100 die (`treeopt hw published`)"
)
_A100_40GB = "checked on the A100 80GB boards (the same GA100 die), not on this board (`treeopt hw published`)"
_H100_SXM = (
    f"compared with {_TRT_LLM} (v0.5 and v0.9) on this board in fp8: 128 to 2048 tokens match; a 128-token "
    "step is predicted 10.5% under the 1.31 decode steps measured, just outside the 10% tolerance "
    "(the curve is fitted to fp16 GEMMs; NVIDIA's FP8 engine gains less at 128 rows) (`treeopt hw published`)"
)
_H100_PCIE = (
    "compared on the H100-SXM5-80GB (the same GH100 die), not on this board, where a 128-token step is "
    "predicted 10.5% under NVIDIA's (`treeopt hw published`)"
)
_H200 = (
    f"compared with {_TRT_LLM} (v0.9) on this board in fp8: 128 to 2048 tokens match, fewer than 128 are not "
    "measured there; below 128 it rests on the H100-SXM5-80GB (the same GH100 die), 10.5% under NVIDIA's "
    "(`treeopt hw published`)"
)
_A40 = "no other public measurement of this board to check it against"
_A6000 = "fitted on the A40 (the same GA102 die), not on this board"
_ADA = "borrowed: Ada's SMs descend from GA102's"
_L40S = (
    f"{_ADA}; compared with {_TRT_LLM} (v0.5 and v0.9) on this board in fp8: 128 to 2048 tokens match, fewer "
    "than 128 are not measured there (`treeopt hw published`)"
)
_BORROWED_GH100 = (
    "borrowed: no public measurement of this GPU's GEMMs or steps against tokens was found, and the GH100's knee, "
    "earlier than the A100's, is the cautious choice"
)
_MI300X = (
    "no other public measurement of this GPU to check it against; the GH100's curve it borrowed before "
    "priced its GEMMs 25% too cheap from 64 to 256 rows and 43% too cheap above 1024 (`treeopt hw published`)"
)

# fp8: the dense FP8 tensor-core rate of the same datasheets (half the printed sparse figure);
# GPUs without FP8 tensor cores (Ampere) have none, and the RTX 4090's datasheet prints two
# rates (fp16 or fp32 accumulate), so it gets none either.
_BUILTIN = {
    hw.name: hw
    for hw in [
        _gpu("a100-40gb-sxm", 312, 1555, 40, 19.5, "NVIDIA A100-SXM4-40GB", knee=_A100_40GB),
        _gpu("a100-80gb-sxm", 312, 2039, 80, 19.5, "NVIDIA A100-SXM4-80GB", knee=_A100_SXM),
        _gpu("a100-80gb-pcie", 312, 1935, 80, 19.5, "NVIDIA A100-PCIe-80GB", knee=_A100_PCIE),
        _gpu("a40", 149.7, 696, 48, 37.4, "NVIDIA A40", curve="GA102", knee=_A40),
        _gpu("rtx-a6000", 154.8, 768, 48, 38.7, "NVIDIA RTX A6000", curve="GA102", knee=_A6000),
        _gpu("l4", 121, 300, 24, 30.3, "NVIDIA L4", fp8_tflops=242.5, curve="GA102", knee=f"{_ADA}; {_UNCHECKED}"),
        _gpu("l40s", 362, 864, 48, 91.6, "NVIDIA L40S", fp8_tflops=733, curve="GA102", knee=_L40S),
        _gpu(
            "rtx-4090",
            165,
            1008,
            24,
            82.6,
            "NVIDIA GeForce RTX 4090",
            note="165 TFLOP/s is the fp16 rate with fp32 accumulate",
            curve="GA102",
            knee=f"{_ADA}; not checked on this board; the L40S (the same AD102 die) matches from 128 tokens up",
        ),
        _gpu("h100-sxm", 989, 3350, 80, 67, "NVIDIA H100-SXM5-80GB", fp8_tflops=1979, curve="GH100", knee=_H100_SXM),
        _gpu("h100-pcie", 756, 2000, 80, 51, "NVIDIA H100-PCIe-80GB", fp8_tflops=1513, curve="GH100", knee=_H100_PCIE),
        _gpu("h200", 989, 4800, 141, 67, "NVIDIA H200-SXM-141GB", fp8_tflops=1979, curve="GH100", knee=_H200),
        _gpu(
            "b200",
            2250,
            8000,
            180,
            None,
            "NVIDIA B200",
            fp8_tflops=4500,
            note="no fp32 figure: vector work at bf16/16",
            curve="GH100",
            knee=_BORROWED_GH100,
        ),
        _gpu(
            "mi300x",
            1307,
            5300,
            192,
            163.4,
            "AMD Instinct MI300X",
            fp8_tflops=2614.9,
            curve="CDNA3",
            knee=_MI300X,
        ),
    ]
}
# GPU-to-GPU bandwidth per GPU and direction, which a ring all-reduce runs at
# (docs/performance-model.md#tensor-parallelism): NVLink from the vendors' datasheets (A100 SXM
# 600 GB/s, H100/H200 SXM 900 GB/s, B200 1.8 TB/s, bidirectional; MI300X 7 Infinity Fabric links of
# 128 GB/s); PCIe boards at their PCIe link (Gen4 x16 64 GB/s, Gen5 x16 128 GB/s, bidirectional).
# The latency per collective is not a published figure: 10 us, the default of every profile.
_INTERCONNECT_GBPS = {
    "a100-40gb-sxm": 300,
    "a100-80gb-sxm": 300,
    "h100-sxm": 450,
    "h200": 450,
    "b200": 900,
    "mi300x": 448,
    "h100-pcie": 64,
}
_BUILTIN = {
    name: hw.with_(interconnect_bytes_per_s=_INTERCONNECT_GBPS.get(name, 32) * GB) for name, hw in _BUILTIN.items()
}
_ALIASES = {
    "a100": "a100-80gb-sxm",
    "a100-80gb": "a100-80gb-sxm",
    "a100-40gb": "a100-40gb-sxm",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "4090": "rtx-4090",
    "a6000": "rtx-a6000",
}


def builtin_hardware() -> dict[str, HardwareProfile]:
    return dict(_BUILTIN)


def hardware_aliases() -> dict[str, str]:
    return dict(_ALIASES)


def load_hardware(name_or_path) -> HardwareProfile:
    """A built-in profile name (`a100-80gb-sxm`, `h100-sxm`, `l4`, ...; aliases `a100`,
    `h100`) or the path of a `treeopt.hardware/v1` JSON file."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    spec = str(name_or_path)
    key = spec.lower()
    if key in _BUILTIN:
        return _BUILTIN[key]
    if key in _ALIASES:
        return _BUILTIN[_ALIASES[key]]
    path = Path(spec)
    if path.is_file():
        return HardwareProfile.from_dict(read_json_input(path, "a hardware profile"), source=str(path))
    if path.suffix == ".json" or "/" in spec:
        raise UserError(f"--hardware: {spec}: no such file")
    names = ", ".join(sorted(_BUILTIN))
    raise UserError(
        f"--hardware: unknown hardware '{spec}' (built-in: {names}; or a profile JSON "
        "written by `treeopt hw calibrate`)"
    )
