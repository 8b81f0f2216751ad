"""A hardware profile from the raw timings of `treeopt hw calibrate` (treeopt.hwmeasurements):
every fit a pure function (docs/performance-model.md#hardware-calibration).

- per-kernel cost: t = k + bytes / rate over `x + y` (3 vectors moved) by least squares in
  relative error; elementwise rate: the slope of the framework's own elementwise work of a
  decoder layer against the minimum bytes those operators move (eager PyTorch makes several
  passes where one would do).
- bandwidth: the streaming read; peak FLOP/s: the best square GEMM per dtype, and for the
  calibrated dtype the best GEMM rate seen anywhere (so eta_compute = 1 and efficiencies are
  relative to the best attained).
- GEMM efficiency by rows: weighted by how often each shape runs, the smallest row count
  (memory bound) gives eta_memory (weight streaming / stream bandwidth) and rows where the
  GEMMs are compute bound give the efficiency curve; below the first compute-bound row count
  the curve stays flat (docs/performance-model.md#gemm-row-efficiency).
- attention efficiency by query rows per KV head, as attained (FLOP/s relative to the GEMM
  peak, whatever binds), and the extra cost per (sequence x head) block when several
  sequences run at once; the KV-cache update's copy rate.
- framework overhead: what the operators do not explain in the forwards, fitted by
  non-negative least squares as forward + layers x (layer + token x b q + (context, or at
  q = 1 plain context) x b s) ("framework overheads"); the draft heads' cost per head.
- validation: the full model's forwards measured against predicted, in time and in the ratio
  T(q) / T(1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import nnls

from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.latency import op_timings, step_time_s
from roofline.ops import operators
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt.hwmeasurements import (
    AttentionSample,
    DeviceFacts,
    ElementwiseSample,
    ForwardSample,
    GemmSample,
    HardwareMeasurements,
    HeadsSample,
    KvUpdateSample,
    LayerElementwiseSample,
    SquareGemmSample,
    StreamSample,
    WeightShape,
)

__all__ = [
    "FrameworkOverhead",
    "GemmFit",
    "HeadOverhead",
    "LineFit",
    "RowEfficiency",
    "attention_block_overhead_s",
    "attention_efficiency",
    "busy_machine_note",
    "efficiency_curve",
    "fit_framework_overhead",
    "fit_gemm",
    "fit_hardware_profile",
    "fit_head_overhead",
    "fit_kernel_overhead",
    "fit_layer_elementwise_rate",
    "fit_line",
    "kv_update_rate",
    "layer_elementwise_bytes",
    "peak_flops",
    "stream_bandwidth",
    "validation_errors",
]

# the framework's elementwise operators of a decoder layer, as calibration.hwbench times them
LAYER_ELEMENTWISE_OPS = ("attn_norm", "rotary", "attn_residual", "mlp_norm", "act", "mlp_residual")
KERNEL_OVERHEAD_FLOOR_S = 1e-7
# busy time never below this fraction of the measured time: the fitted kernel cost may exceed
# a fast kernel's whole time (docs/performance-model.md#hardware-calibration)
MIN_BUSY_FRACTION = 0.05


@dataclass(frozen=True)
class LineFit:
    """t = fixed_s + bytes / bytes_per_s."""

    fixed_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class RowEfficiency:
    """An efficiency curve by rows with, per row count, the attained fraction of the peak and
    whether the measurement was compute bound."""

    curve: EfficiencyCurve
    attained: np.ndarray
    compute_bound: np.ndarray


@dataclass(frozen=True)
class GemmFit:
    """What the GEMM measurements give: the calibrated dtype's peak, the (possibly corrected)
    stream bandwidth, eta_memory, the efficiency by rows, the points behind them, and a note
    when the bandwidth was corrected."""

    peak_flops: float
    bandwidth_bytes_per_s: float
    eta_memory: float
    efficiency: RowEfficiency
    mode: str
    points: tuple[dict, ...]
    note: str | None = None


@dataclass(frozen=True)
class FrameworkOverhead:
    """Fitted framework costs (seconds) and the operators' prediction they sit on top of."""

    forward_s: float
    layer_s: float
    token_s: float
    context_s: float
    plain_context_s: float
    ops_predicted_s: tuple[float, ...]


@dataclass(frozen=True)
class HeadOverhead:
    """Fitted fixed cost per draft head, with the measured and operator-predicted seconds of
    each number of heads behind it."""

    per_head_s: float
    heads: tuple[float, ...]
    measured_s: tuple[float, ...]
    ops_predicted_s: tuple[float, ...]

    def to_dict(self) -> dict:
        return {
            "heads": list(self.heads),
            "measured_s": list(self.measured_s),
            "ops_predicted_s": list(self.ops_predicted_s),
        }


def fit_line(x_bytes, t_s) -> LineFit:
    """t = a + x / rate by least squares in relative error (a >= 0). Without a measurable size
    dependence the rate is bounded by the largest size."""
    x = np.asarray(x_bytes, dtype=float)
    t = np.asarray(t_s, dtype=float)
    w = 1.0 / t
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, slope), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    if slope <= 0:
        slope = float(t[-1] / x[-1])
    return LineFit(max(float(a), 0.0), 1.0 / float(slope))


def fit_kernel_overhead(samples: tuple[ElementwiseSample, ...], dtype_bytes: int) -> LineFit:
    """Per-kernel cost and plain elementwise rate from `x + y` (reads two vectors, writes one)."""
    elements = np.array([s.elements for s in samples], dtype=float)
    fit = fit_line(3.0 * elements * dtype_bytes, [s.time_s for s in samples])
    return LineFit(max(fit.fixed_s, KERNEL_OVERHEAD_FLOOR_S), fit.bytes_per_s)


def layer_elementwise_bytes(shape: ModelShape, rows) -> np.ndarray:
    """Minimum bytes of a decoder layer's elementwise operators at `rows` token rows."""
    ops = {op.name: op for op in operators(shape, None, batch=1, tokens=np.asarray(rows), context=0)}
    return sum(ops[name].bytes for name in LAYER_ELEMENTWISE_OPS)


def fit_layer_elementwise_rate(samples: tuple[LayerElementwiseSample, ...], shape: ModelShape) -> float:
    """Effective elementwise bytes per second: the slope of the layer's elementwise work
    against its minimum bytes."""
    nbytes = layer_elementwise_bytes(shape, [s.rows for s in samples])
    return fit_line(nbytes, [s.time_s for s in samples]).bytes_per_s


def stream_bandwidth(sample: StreamSample) -> float:
    return sample.buffer_bytes / sample.time_s


def peak_flops(samples: tuple[SquareGemmSample, ...]) -> dict[str, float]:
    """FLOP/s per dtype of the square GEMMs."""
    return {s.dtype: s.flops / s.time_s for s in samples}


def efficiency_curve(rows, flops, memory_s, busy_s, peak: float, *, threshold: float = 1.1) -> RowEfficiency:
    """Relative efficiency per row count from aggregated measurements.

    busy_s: measured seconds (kernel cost removed); memory_s: what the memory roof predicts.
    Compute-bound rows (busy > threshold x memory) give flops / (peak x busy); a memory-bound
    row count takes the larger of its own value and that of the next compute-bound row count
    (flat below the transition, docs/performance-model.md#gemm-row-efficiency)."""
    rows = np.asarray(rows, dtype=float)
    busy = np.asarray(busy_s, dtype=float)
    attained = np.asarray(flops, dtype=float) / (peak * busy)
    compute_bound = busy > threshold * np.asarray(memory_s, dtype=float)
    n = len(rows)
    # index of the first compute-bound row count at or after each one (n: none)
    cb_index = np.where(compute_bound, np.arange(n), n)
    next_cb = np.minimum.accumulate(cb_index[::-1])[::-1]
    next_value = attained[np.minimum(next_cb, n - 1)]
    values = np.where(next_cb < n, np.maximum(attained, next_value), attained)
    values = np.clip(values, 1e-4, 1.5)
    curve = EfficiencyCurve(tuple(float(r) for r in rows), tuple(float(v) for v in values))
    return RowEfficiency(curve, attained, compute_bound)


def _whole_pass_totals(samples, weights, kernel_s: float, dtype_bytes: int):
    """Per row count: FLOPs, bytes and busy seconds of one forward's GEMMs, and the points."""
    rows = np.array([s.rows for s in samples], dtype=float)
    time_s = np.array([s.time_s for s in samples], dtype=float)
    k = np.array([w.in_features for w in weights], dtype=float)
    n = np.array([w.out_features for w in weights], dtype=float)
    uses = np.array([w.uses for w in weights], dtype=float)
    r = rows[:, None]
    flops = (uses * 2.0 * r * k * n).sum(axis=1)
    nbytes = (uses * dtype_bytes * (k * n + r * k + r * n)).sum(axis=1)
    busy = np.maximum(time_s - uses.sum() * kernel_s, MIN_BUSY_FRACTION * time_s)
    points = tuple(
        {"shape": "all", "rows": int(rc), "time_s": float(t), "tflops": float(f / t / 1e12)}
        for rc, t, f in zip(rows, time_s, flops, strict=True)
    )
    return rows, flops, nbytes, busy, points


def _per_shape_totals(samples, kernel_s: float, dtype_bytes: int):
    """`_whole_pass_totals` from per-shape samples: `copies` calls on `columns_timed` of the n
    columns, scaled to all columns and to each shape's uses."""
    rows = np.array([s.rows for s in samples], dtype=float)
    time_s = np.array([s.time_s for s in samples], dtype=float)
    k = np.array([s.weight.in_features for s in samples], dtype=float)
    n = np.array([s.weight.out_features for s in samples], dtype=float)
    uses = np.array([s.weight.uses for s in samples], dtype=float)
    columns = np.array([s.columns_timed for s in samples], dtype=float)
    per_call = time_s / np.array([s.copies for s in samples], dtype=float)
    busy_each = np.maximum(per_call - kernel_s, MIN_BUSY_FRACTION * per_call) * (n / columns)
    row_counts, slot = np.unique(rows, return_inverse=True)
    flops = np.bincount(slot, uses * 2.0 * rows * k * n)
    nbytes = np.bincount(slot, uses * dtype_bytes * (k * n + rows * k + rows * n))
    busy = np.bincount(slot, uses * busy_each)
    full_call = per_call * n / columns
    points = tuple(
        {
            "shape": s.weight.label,
            "k": s.weight.in_features,
            "n": s.weight.out_features,
            "rows": s.rows,
            "columns_timed": s.columns_timed,
            "time_s": float(t),
            "tflops": float(2.0 * s.rows * s.weight.in_features * s.weight.out_features / t / 1e12),
        }
        for s, t in zip(samples, full_call, strict=True)
    )
    return row_counts, flops, nbytes, busy, points


def fit_gemm(
    samples: tuple[GemmSample, ...],
    weights: tuple[WeightShape, ...],
    *,
    kernel_s: float,
    dtype_bytes: int,
    peak: float,
    bandwidth_bytes_per_s: float,
) -> GemmFit:
    """Peak, eta_memory and the efficiency by rows from the GEMMs on the model's weights.

    Per row count r, FLOPs and bytes are those of one forward's GEMMs (each weight shape
    `uses` times): 2 r k n FLOPs and (k n + r k + r n) elements. A whole-pass sample is one
    forward's GEMMs; a per-shape sample is `copies` calls on `columns_timed` of the n columns,
    scaled to all columns and to the shape's uses."""
    whole_pass = samples[0].weight is None
    if whole_pass:
        row_counts, flops, nbytes, busy, points = _whole_pass_totals(samples, weights, kernel_s, dtype_bytes)
    else:
        row_counts, flops, nbytes, busy, points = _per_shape_totals(samples, kernel_s, dtype_bytes)
    peak = max(peak, float(np.max(flops / busy)))
    # weight streaming from the smallest row count (memory bound there by construction); if it
    # beats the streaming read, that read was the one disturbed: trust the GEMV
    # (docs/performance-model.md#hardware-calibration)
    gemv_rate = nbytes[0] / busy[0]
    note = None
    bandwidth = bandwidth_bytes_per_s
    if gemv_rate > bandwidth:
        note = (
            f"streaming read ({bandwidth / 1e9:.1f} GB/s) slower than single-row GEMMs "
            f"({gemv_rate / 1e9:.1f} GB/s): bandwidth set to the latter"
        )
        bandwidth = gemv_rate
    eta_memory = float(max(gemv_rate / bandwidth, 0.05))
    efficiency = efficiency_curve(row_counts, flops, nbytes / (bandwidth * eta_memory), busy, peak)
    return GemmFit(
        peak_flops=peak,
        bandwidth_bytes_per_s=float(bandwidth),
        eta_memory=eta_memory,
        efficiency=efficiency,
        mode="whole model pass" if whole_pass else "per weight shape",
        points=points,
        note=note,
    )


def _attention_flops(shape: ModelShape, batch, query_rows, context_tokens) -> np.ndarray:
    """QK^T and PV: 2 x 2 b nh q (s + q) d (roofline.ops, "qk" and "pv")."""
    keys = np.asarray(context_tokens, dtype=float) + query_rows
    return (
        4.0 * np.asarray(batch, dtype=float) * shape.heads * np.asarray(query_rows, dtype=float) * keys * shape.head_dim
    )


def attention_efficiency(
    samples: tuple[AttentionSample, ...], shape: ModelShape, *, kernel_s: float, peak: float
) -> EfficiencyCurve:
    """Attained attention FLOP/s relative to the GEMM peak by query rows per KV head
    (q x heads / kv_heads).

    Taken at face value: attention's speed depends on the kernel's code path more than on a
    roof (on a CPU bf16 attention with one query row runs 3-4x slower than with three, and it
    computes in fp32, faster than a bf16 GEMM); its time then scales with the keys and the
    batch like its FLOPs (docs/performance-model.md#hardware-calibration). Where the samples
    of a query count span several sizes (keys x sequences, the grid timed on an accelerator),
    its rate is the slope of time over that size (`fit_line`): a small cell's time is mostly
    latency, which the per-kernel cost already charges. Else the one-sequence sample's time."""
    if len({(s.batch, s.context_tokens) for s in samples if s.query_rows == samples[0].query_rows}) > 2:
        return _attention_efficiency_by_slope(samples, shape, peak)
    one = [s for s in samples if s.batch == 1]
    q = np.array([s.query_rows for s in one], dtype=float)
    t = np.array([s.time_s for s in one], dtype=float)
    flops = _attention_flops(shape, 1, q, [s.context_tokens for s in one])
    busy = np.maximum(t - kernel_s, MIN_BUSY_FRACTION * t)
    attained = np.clip(flops / (peak * busy), 1e-4, 20.0)
    rows = q * shape.heads / shape.kv_heads
    return EfficiencyCurve(tuple(float(r) for r in rows), tuple(float(v) for v in attained))


def _attention_efficiency_by_slope(samples, shape: ModelShape, peak: float) -> EfficiencyCurve:
    """`attention_efficiency` from the grid: per query count q, seconds per key of one
    sequence = 1 / rate of t = a + (b (s + q)) / rate; attained = 4 heads q d / (that x peak)."""
    rows, values = [], []
    for q in sorted({s.query_rows for s in samples}):
        cells = [s for s in samples if s.query_rows == q]
        keys = [s.batch * (s.context_tokens + q) for s in cells]
        per_key_s = 1.0 / fit_line(keys, [s.time_s for s in cells]).bytes_per_s
        flops_per_key = 4.0 * shape.heads * q * shape.head_dim
        rows.append(float(q * shape.heads / shape.kv_heads))
        values.append(float(np.clip(flops_per_key / (per_key_s * peak), 1e-4, 20.0)))
    return EfficiencyCurve(tuple(rows), tuple(values))


def attention_block_overhead_s(samples: tuple[AttentionSample, ...], shape: ModelShape) -> float:
    """Extra cost per (sequence x head) block of one-token attention for B > 1 sequences beyond
    B x the one-sequence time at the same context: (t_B - B t_1) / (B heads), at least 0."""
    one = next(s for s in samples if s.batch == 1 and s.query_rows == 1)
    many = next(s for s in samples if s.batch > 1 and s.query_rows == 1 and s.context_tokens == one.context_tokens)
    return max(0.0, (many.time_s - many.batch * one.time_s) / (many.batch * shape.heads))


def kv_update_rate(samples: tuple[KvUpdateSample, ...], shape: ModelShape) -> float:
    """Bytes per second of the KV-cache update: K and V of the q new tokens each read and
    written in place, 2 x (2 b q n_kv d) elements (the "append" update, roofline.ops
    "kv_cache")."""
    b = np.array([s.batch for s in samples], dtype=float)
    q = np.array([s.new_tokens for s in samples], dtype=float)
    row = shape.kv_heads * shape.head_dim
    nbytes = shape.dtype_bytes * 2 * 2 * b * q * row
    return fit_line(nbytes, [s.time_s for s in samples]).bytes_per_s


def fit_framework_overhead(
    samples: tuple[ForwardSample, ...], probe: ModelShape, hw: HardwareProfile
) -> FrameworkOverhead:
    """What the operators of `hw` do not explain in the probe's forwards, fitted by
    non-negative least squares in relative error as forward_s + layers x (layer_s + token_s x b q
    + (context_s if q > 1 else plain_context_s) x b s) (docs/performance-model.md#framework-overheads). `hw` must
    carry no framework overhead yet."""
    L = np.array([s.layers for s in samples], dtype=float)
    b = np.array([s.batch for s in samples], dtype=float)
    q = np.array([s.tokens for s in samples], dtype=float)
    s_ctx = np.array([s.context_tokens for s in samples], dtype=float)
    measured = np.array([s.time_s for s in samples], dtype=float)
    predicted = np.array(
        [
            float(
                step_time_s(
                    probe.with_layers(s.layers),
                    None,
                    hw,
                    batch=s.batch,
                    tokens=s.tokens,
                    context=s.context_tokens,
                    on_oom="ignore",
                )
            )
            for s in samples
        ]
    )
    A = np.stack([np.ones_like(L), L, L * b * q, L * b * s_ctx * (q > 1), L * b * s_ctx * (q == 1)], axis=1)
    w = 1.0 / measured
    coef, _ = nnls(A * w[:, None], (measured - predicted) * w)
    return FrameworkOverhead(*(float(c) for c in coef), ops_predicted_s=tuple(float(p) for p in predicted))


def _draft_heads_time_s(probe: ModelShape, num_heads: int, hw: HardwareProfile) -> float:
    heads = DraftHeadsShape(num_heads, 1, probe.hidden, probe.vocab)
    timings = op_timings(probe, heads, hw, batch=1, tokens=1, context=0)
    return float(next(t.total_s for t in timings if t.op.name == "draft_heads"))


def fit_head_overhead(samples: tuple[HeadsSample, ...], probe: ModelShape, hw: HardwareProfile) -> HeadOverhead:
    """Fixed cost per draft head beyond its operators: the least-squares slope through the
    origin of (measured - predicted) against the number of heads, at least 0."""
    ks = np.array(sorted(s.num_heads for s in samples), dtype=float)
    by_heads = {s.num_heads: s.time_s for s in samples}
    measured = np.array([by_heads[int(K)] for K in ks])
    predicted = np.array([_draft_heads_time_s(probe, int(K), hw) for K in ks])
    per_head = max(0.0, float(np.dot(ks, measured - predicted) / np.dot(ks, ks)))
    return HeadOverhead(per_head, tuple(ks.tolist()), tuple(measured.tolist()), tuple(predicted.tolist()))


def validation_errors(samples: tuple[ForwardSample, ...], shape: ModelShape, hw: HardwareProfile) -> list[dict]:
    """Measured against predicted per full-model forward: error = predicted / measured - 1,
    and for q > 1 the same for the ratio T(q) / T(1) at equal batch and context."""
    out, base = [], {}
    for s in samples:
        pred = float(
            step_time_s(shape, None, hw, batch=s.batch, tokens=s.tokens, context=s.context_tokens, on_oom="ignore")
        )
        out.append(
            {
                "batch": s.batch,
                "tokens": s.tokens,
                "context": s.context_tokens,
                "measured_s": s.time_s,
                "predicted_s": pred,
                "error": pred / s.time_s - 1.0,
                "spread": s.spread,
            }
        )
        if s.tokens == 1:
            base[(s.batch, s.context_tokens)] = (s.time_s, pred)
    for v in out:
        key = (v["batch"], v["context"])
        if key in base and v["tokens"] > 1:
            m0, p0 = base[key]
            v["ratio_measured"] = v["measured_s"] / m0
            v["ratio_predicted"] = v["predicted_s"] / p0
            v["ratio_error"] = v["ratio_predicted"] / v["ratio_measured"] - 1.0
    return out


def busy_machine_note(device: DeviceFacts) -> str | None:
    """A note when other processes kept the CPUs busy while measuring, else None."""
    if device.kind == "cuda" or device.load_average_before is None or device.threads is None:
        return None
    cpus, threads_used = device.cpu_count, device.threads
    others = device.load_average_before[0]
    if others <= cpus - threads_used + 0.5:
        return None
    fewer = max(1, cpus - round(others))
    advice = (
        f"recalibrate on a quiet machine or with --threads {fewer} (and run the workload with the same setting)"
        if fewer < threads_used
        else "recalibrate on a quiet machine if it matters"
    )
    return (
        f"the machine was busy (1-minute load {others:.1f} on {cpus} CPUs) while measuring with "
        f"{threads_used} thread(s): other processes' work may be in these timings"
        + (", and torch threads that wait for a descheduled sibling make them erratic" if threads_used > 1 else "")
        + f"; {advice}"
    )


def _roofs_profile(m: HardwareMeasurements, shape: ModelShape, kernel: LineFit, gemm: GemmFit, peaks, name):
    """The profile of the microbenchmarks' roofs and rates, without framework costs yet."""
    dev, dt = m.device, m.dtype
    is_cuda = dev.kind == "cuda"
    return HardwareProfile(
        name=name or f"{'cuda' if is_cuda else 'cpu'}-calibrated",
        peak_flops={k: float(v) for k, v in peaks.items()},
        bandwidth_bytes_per_s=gemm.bandwidth_bytes_per_s,
        capacity_bytes=dev.capacity_bytes,
        eta_compute=1.0,
        eta_memory=gemm.eta_memory,
        kernel_overhead_s=float(kernel.fixed_s),
        forward_overhead_s=0.0,
        layer_overhead_s=0.0,
        gemm_efficiency=gemm.efficiency.curve,
        attention_efficiency=attention_efficiency(m.attention, shape, kernel_s=kernel.fixed_s, peak=peaks[dt]),
        vector_flops=None if is_cuda else float(peaks["fp32"]),
        elementwise_bytes_per_s=float(fit_layer_elementwise_rate(m.layer_elementwise, shape)),
        # the decoder's cache (transformers' DynamicCache) copies the whole cache every forward
        # (docs/performance-model.md#hardware-calibration)
        kv_cache_update="append",
        kv_update_bytes_per_s=float(kv_update_rate(m.kv_update, shape)),
        attention_block_overhead_s=float(attention_block_overhead_s(m.attention, shape)),
        description=f"calibrated on {dev.name}",
        source="treeopt hw calibrate",
    )


def _with_overheads(prof: HardwareProfile, m: HardwareMeasurements, probe: ModelShape):
    """`prof` with the framework and draft-head costs fitted to the probe's forwards, the
    framework fit and the heads' fit record ({} without head samples)."""
    fw = fit_framework_overhead(m.forwards, probe, prof)
    prof = replace(
        prof,
        forward_overhead_s=fw.forward_s,
        layer_overhead_s=fw.layer_s,
        token_overhead_s=fw.token_s,
        context_overhead_s=fw.context_s,
        plain_context_overhead_s=fw.plain_context_s,
    )
    head_fit = {}
    if m.heads:
        heads_fit = fit_head_overhead(m.heads, probe, prof)
        prof = replace(prof, head_overhead_s=heads_fit.per_head_s)
        head_fit = heads_fit.to_dict()
    return prof, fw, head_fit


def _framework_record(m: HardwareMeasurements, probe: ModelShape, prof, fw: FrameworkOverhead, head_fit) -> dict:
    """The framework fit's configurations, measured, operator-predicted and fitted seconds."""
    return {
        "configs (layers, batch, tokens, context)": [
            [s.layers, s.batch, s.tokens, s.context_tokens] for s in m.forwards
        ],
        "measured_s": [s.time_s for s in m.forwards],
        "ops_predicted_s": list(fw.ops_predicted_s),
        "fitted_s": [
            float(
                step_time_s(
                    probe.with_layers(s.layers),
                    None,
                    prof,
                    batch=s.batch,
                    tokens=s.tokens,
                    context=s.context_tokens,
                    on_oom="ignore",
                )
            )
            for s in m.forwards
        ],
        "probe_shape": probe.name,
        "draft_heads": head_fit,
    }


def fit_hardware_profile(
    measurements: HardwareMeasurements,
    shape: ModelShape,
    probe: ModelShape,
    *,
    name: str | None = None,
    notes: tuple[str, ...] = (),
) -> HardwareProfile:
    """The hardware profile of `measurements` of `shape` (in the measured dtype), whose
    framework forwards ran on `probe` (`shape` itself or a small proxy of it). notes: the
    caller's notes about the measurement, stored first."""
    m, dev = measurements, measurements.device
    dt, beta = m.dtype, shape.dtype_bytes
    notes = list(notes)
    kernel = fit_kernel_overhead(m.elementwise, beta)
    peaks = peak_flops(m.square_gemms)
    gemm = fit_gemm(
        m.gemms,
        m.gemm_weights,
        kernel_s=kernel.fixed_s,
        dtype_bytes=beta,
        peak=peaks[dt],
        bandwidth_bytes_per_s=stream_bandwidth(m.stream),
    )
    peaks[dt] = gemm.peak_flops
    if gemm.note:
        notes.append(gemm.note)
    prof, fw, head_fit = _with_overheads(_roofs_profile(m, shape, kernel, gemm, peaks, name), m, probe)
    validation = validation_errors(m.validation, shape, prof)
    busy = busy_machine_note(dev)
    if busy:
        notes.append(busy)
    calibration = {
        "date": m.date_utc,
        "device": dev.name,
        "torch": dev.torch_version,
        "threads": dev.threads,
        "model": shape.name,
        "model_shape": shape.to_dict(),
        "dtype": dt,
        "quick": m.quick,
        "rounds": m.rounds,
        "seconds": round(m.elapsed_s, 1),
        "framework": dev.framework,
        "steps": m.steps,
        "failed_captures": list(m.failed_captures),
        "attention": "fused",
        "stream_buffer_bytes": m.stream.buffer_bytes,
        "plain_elementwise_bytes_per_s": float(kernel.bytes_per_s),
        "gemm_mode": gemm.mode,
        "load_average": None if dev.load_average_after is None else list(dev.load_average_after),
        "gemm_points": list(gemm.points),
        "gemm_attained_fraction": [float(x) for x in gemm.efficiency.attained],
        "gemm_compute_bound": [bool(x) for x in gemm.efficiency.compute_bound],
        "framework_fit": _framework_record(m, probe, prof, fw, head_fit),
        "validation": validation,
        "notes": notes,
    }
    return replace(prof, calibration=calibration)
