"""roofline.hwfit on synthetic timings made from known terms: every fit recovers the terms it was
given (hand-derived FLOPs and bytes), then one quick real calibration on CPU."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.hwfit import (
    attention_block_overhead_s,
    attention_efficiency,
    busy_machine_note,
    efficiency_curve,
    fit_framework_overhead,
    fit_gemm,
    fit_hardware_profile,
    fit_head_overhead,
    fit_kernel_overhead,
    fit_layer_elementwise_rate,
    fit_line,
    kv_update_rate,
    layer_elementwise_bytes,
    validation_errors,
)
from roofline.latency import op_timings, step_time_s
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt.app.hwcalibrate import calibrate_hardware, framework_probe
from treeopt.errors import UserError
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

# fp32, 2 layers, hidden 64, intermediate 128, 8 heads of 16 over 2 KV heads, vocab 256
SHAPE = ModelShape(
    "tiny",
    layers=2,
    hidden=64,
    intermediate=128,
    heads=8,
    kv_heads=2,
    head_dim=16,
    vocab=256,
    dtype="fp32",
    dtype_bytes=4,
)
BETA = 4
PEAK = 1e11
BANDWIDTH = 1e10
KERNEL_S = 2e-6


def close(a, b, rel=1e-9):
    return a == pytest.approx(b, rel=rel, abs=0)


# ---- line fits --------------------------------------------------------------------------------


def test_kernel_overhead_and_plain_elementwise_rate_recovered():
    elements = [1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 21]
    rate = 8e9
    # x + y moves 3 vectors of n elements of 4 bytes
    samples = tuple(ElementwiseSample(n, KERNEL_S + 3 * n * BETA / rate) for n in elements)
    fit = fit_kernel_overhead(samples, BETA)
    assert close(fit.fixed_s, KERNEL_S, 1e-6) and close(fit.bytes_per_s, rate, 1e-9)


def test_kernel_overhead_floor_and_rate_without_size_dependence():
    samples = tuple(ElementwiseSample(n, 3 * n * BETA / 8e9) for n in (1024, 8192, 65536))
    assert fit_kernel_overhead(samples, BETA).fixed_s == 1e-7  # no fixed cost: the 0.1 us floor
    shrinking = fit_line([1e3, 1e4, 1e5], [6e-6, 5.5e-6, 5e-6])  # no positive slope to fit
    assert close(shrinking.bytes_per_s, 1e5 / 5e-6)  # bounded by the largest size over its time


def test_layer_elementwise_bytes_and_rate():
    rows = np.array([1, 16, 64, 256, 1024])
    h, i, nh, nkv, d = 64, 128, 8, 2, 16
    # attn_norm and mlp_norm 2rh + h each, rotary 2r(nh + nkv)d + 2rd, act 3ri, residuals 3rh each
    hand = BETA * (10 * rows * h + 2 * h + 2 * rows * (nh + nkv) * d + 2 * rows * d + 3 * rows * i)
    np.testing.assert_allclose(layer_elementwise_bytes(SHAPE, rows), hand, rtol=1e-12)
    rate, fixed = 5e9, 3e-5
    samples = tuple(LayerElementwiseSample(int(r), fixed + b / rate) for r, b in zip(rows, hand))
    assert close(fit_layer_elementwise_rate(samples, SHAPE), rate)


# ---- GEMM efficiency by rows -----------------------------------------------------------------

# one weight shape 256 x 256 used 3 times per forward; per row count r: FLOPs 3 x 2 r 256^2,
# bytes 3 x 4 (256^2 + 2 x 256 r). With peak 1e11, bandwidth 1e10 and eta_memory 0.8 the
# compute / memory time ratio is 5.12 r / ((128 + r) eff): rows 1 and 4 are memory bound,
# 16..1024 compute bound at the efficiencies below (ratio >= 1.9 > 1.1).
WEIGHT = WeightShape("w", 256, 256, 3)
GEMM_ROWS = (1, 4, 16, 64, 256, 1024)
GEMM_EFF = {16: 0.3, 64: 0.5, 256: 0.9, 1024: 1.0}
ETA_MEMORY = 0.8


def _gemm_busy_s(r):
    flops = 3 * 2.0 * r * 256 * 256
    nbytes = 3 * BETA * (256 * 256 + 2 * 256 * r)
    memory_s = nbytes / (BANDWIDTH * ETA_MEMORY)
    return memory_s if r < 16 else flops / (PEAK * GEMM_EFF[r])


def test_gemm_whole_pass_recovers_efficiency_curve_and_eta_memory():
    samples = tuple(GemmSample(r, 3 * KERNEL_S + _gemm_busy_s(r)) for r in GEMM_ROWS)
    fit = fit_gemm(samples, (WEIGHT,), kernel_s=KERNEL_S, dtype_bytes=BETA, peak=PEAK, bandwidth_bytes_per_s=BANDWIDTH)
    assert fit.mode == "whole model pass" and fit.note is None
    assert close(fit.eta_memory, ETA_MEMORY) and close(fit.bandwidth_bytes_per_s, BANDWIDTH)
    assert close(fit.peak_flops, PEAK)
    assert fit.efficiency.curve.rows == GEMM_ROWS
    # memory-bound rows 1 and 4 take the value of row 16, the first compute-bound one
    np.testing.assert_allclose(fit.efficiency.curve.values, [0.3, 0.3, 0.3, 0.5, 0.9, 1.0], rtol=1e-9)
    assert list(fit.efficiency.compute_bound) == [False, False, True, True, True, True]


def test_gemm_per_shape_with_column_slices_and_disturbed_stream():
    # 3 copies per sample; at 1024 rows only 128 of the 256 columns are computed
    samples = []
    for r in GEMM_ROWS:
        cols = 128 if r == 1024 else 256
        per_call = KERNEL_S + _gemm_busy_s(r) / 3 * cols / 256
        samples.append(GemmSample(r, 3 * per_call, WEIGHT, cols, 3))
    slow_stream = 0.5 * BANDWIDTH  # slower than the single-row GEMMs' 0.8 x BANDWIDTH
    fit = fit_gemm(
        tuple(samples), (WEIGHT,), kernel_s=KERNEL_S, dtype_bytes=BETA, peak=PEAK, bandwidth_bytes_per_s=slow_stream
    )
    assert fit.mode == "per weight shape" and "bandwidth set to the latter" in fit.note
    assert close(fit.bandwidth_bytes_per_s, ETA_MEMORY * BANDWIDTH) and close(fit.eta_memory, 1.0)
    np.testing.assert_allclose(fit.efficiency.curve.values, [0.3, 0.3, 0.3, 0.5, 0.9, 1.0], rtol=1e-9)
    assert fit.points[-1]["columns_timed"] == 128 and close(fit.points[-1]["time_s"], 2 * (samples[-1].time_s / 3))


def test_efficiency_curve_flat_below_each_compute_bound_row_count():
    rows = [1, 2, 4, 8, 16]
    attained = np.array([0.1, 0.6, 0.2, 0.7, 0.05])
    busy = np.ones(5)
    flops = attained * PEAK * busy
    memory = np.array([1.0, 0.5, 1.0, 0.5, 1.0])  # compute bound where busy > 1.1 x memory: rows 2 and 8
    curve = efficiency_curve(rows, flops, memory, busy, PEAK).curve
    # 1 -> row 2's 0.6; 4 -> row 8's 0.7; 16 has no compute-bound row after it: its own 0.05
    np.testing.assert_allclose(curve.values, [0.6, 0.6, 0.7, 0.7, 0.05], rtol=1e-12)


# ---- attention and the KV cache --------------------------------------------------------------

ATT_EFF = {1: 0.05, 4: 0.2, 16: 0.6, 64: 0.9}


def _attention_s(batch, q, s=256):
    # QK^T and PV: 2 x 2 b nh q (s + q) d FLOPs
    return KERNEL_S + 4.0 * batch * 8 * q * (s + q) * 16 / (PEAK * ATT_EFF[q])


def test_attention_efficiency_recovered_from_known_flops():
    samples = tuple(AttentionSample(1, q, 256, _attention_s(1, q)) for q in ATT_EFF)
    curve = attention_efficiency(samples, SHAPE, kernel_s=KERNEL_S, peak=PEAK)
    assert curve.rows == (4.0, 16.0, 64.0, 256.0)  # q x heads / kv_heads
    np.testing.assert_allclose(curve.values, list(ATT_EFF.values()), rtol=1e-9)


def test_attention_efficiency_from_a_batch_by_context_grid():
    """An accelerator's grid (calibration.attention_bench): each cell's time a latency of 40 us
    (far above the per-kernel cost, as a GPU's small attention calls are) plus the keys x
    sequences at the known efficiency. The slope recovers the efficiency where the face value
    of the small cell would read it several times too low; the CPU-sized samples alone keep
    the face value."""
    latency = 40e-6

    def grid_s(batch, q, s):
        return latency + 4.0 * batch * 8 * q * (s + q) * 16 / (PEAK * ATT_EFF[q])

    cells = [(1, q, 256) for q in ATT_EFF] + [(8, 1, 256)]
    cells += [(b, q, s) for q in ATT_EFF for b in (1, 8, 64) for s in (512, 2048, 8192)]
    samples = tuple(AttentionSample(b, q, s, grid_s(b, q, s)) for b, q, s in cells)
    curve = attention_efficiency(samples, SHAPE, kernel_s=KERNEL_S, peak=PEAK)
    assert curve.rows == (4.0, 16.0, 64.0, 256.0)
    np.testing.assert_allclose(curve.values, list(ATT_EFF.values()), rtol=1e-6)
    small = tuple(s for s in samples if s.context_tokens == 256)
    face = attention_efficiency(small, SHAPE, kernel_s=KERNEL_S, peak=PEAK).values
    assert face[0] < 0.5 * ATT_EFF[1]  # one query row: the latency read as slowness
    assert close(attention_block_overhead_s(samples, SHAPE), 0.0)  # the grid's b = 8 cells at 512 not mixed in


def test_attention_block_overhead_recovered():
    block_s = 3e-7
    t1 = _attention_s(1, 1)
    samples = (AttentionSample(1, 1, 256, t1), AttentionSample(8, 1, 256, 8 * t1 + 8 * 8 * block_s))
    assert close(attention_block_overhead_s(samples, SHAPE), block_s)
    faster = (AttentionSample(1, 1, 256, t1), AttentionSample(8, 1, 256, 4 * t1))
    assert attention_block_overhead_s(faster, SHAPE) == 0.0


def test_kv_update_rate_recovered():
    rate, fixed = 2e10, 4e-6
    samples = []
    for q in (1, 16, 64):
        # K and V each: read the 4 x q new rows of 2 x 16 values and write them in place
        nbytes = 2 * BETA * (4 * q * 32 + 4 * q * 32)
        samples.append(KvUpdateSample(4, 256, fixed + nbytes / rate, new_tokens=q))
    assert close(kv_update_rate(tuple(samples), SHAPE), rate)


# ---- framework overhead, heads, validation -----------------------------------------------------

OPS_ONLY = HardwareProfile(
    name="synthetic",
    peak_flops={"fp32": PEAK},
    bandwidth_bytes_per_s=BANDWIDTH,
    capacity_bytes=64e9,
    eta_compute=1.0,
    eta_memory=ETA_MEMORY,
    kernel_overhead_s=KERNEL_S,
    kv_cache_update="concat",
)
# forward, per layer, per layer and token row, per layer and cached token in a tree step (the
# attention-mask path) and in plain decoding
TERMS = {"forward_s": 5e-4, "layer_s": 2e-4, "token_s": 3e-6, "context_s": 4e-7, "plain_context_s": 1.5e-7}
FW_CONFIGS = [
    (1, 1, 1, 64),
    (2, 1, 1, 64),
    (4, 1, 1, 64),
    (4, 8, 1, 64),
    (4, 8, 1, 512),
    (4, 1, 1, 512),
    (4, 2, 8, 256),
    (4, 1, 32, 64),
    (4, 4, 16, 128),
    (4, 4, 64, 128),
    (4, 4, 16, 512),
    (4, 8, 4, 512),
]
PROBE = SHAPE.with_layers(4)


def _overhead_s(L, b, q, s):
    per_key = TERMS["context_s"] if q > 1 else TERMS["plain_context_s"]
    return TERMS["forward_s"] + L * (TERMS["layer_s"] + TERMS["token_s"] * b * q + per_key * b * s)


def _forwards(hw, probe=PROBE):
    return tuple(
        ForwardSample(
            L,
            b,
            q,
            s,
            step_time_s(probe.with_layers(L), None, hw, batch=b, tokens=q, context=s, on_oom="ignore")
            + _overhead_s(L, b, q, s),
        )
        for L, b, q, s in FW_CONFIGS
    )


def test_framework_overhead_terms_recovered_by_nnls():
    fit = fit_framework_overhead(_forwards(OPS_ONLY), PROBE, OPS_ONLY)
    for key, value in TERMS.items():
        assert close(getattr(fit, key), value, 1e-6), key


def test_head_overhead_recovered():
    per_head = 2e-5

    def ops_s(K):
        heads = DraftHeadsShape(K, 1, PROBE.hidden, PROBE.vocab)
        return next(
            float(t.total_s)
            for t in op_timings(PROBE, heads, OPS_ONLY, batch=1, tokens=1, context=0)
            if t.op.name == "draft_heads"
        )

    fit = fit_head_overhead(
        (HeadsSample(4, ops_s(4) + 4 * per_head), HeadsSample(1, ops_s(1) + per_head)), PROBE, OPS_ONLY
    )
    assert close(fit.per_head_s, per_head) and fit.heads == (1.0, 4.0)


def test_validation_errors_of_time_and_ratio():
    def pred(b, q, s):
        return step_time_s(SHAPE, None, OPS_ONLY, batch=b, tokens=q, context=s)

    # measured twice the prediction at q = 1, four times at q = 32
    samples = (ForwardSample(2, 1, 1, 128, 2 * pred(1, 1, 128)), ForwardSample(2, 1, 32, 128, 4 * pred(1, 32, 128)))
    plain, tree = validation_errors(samples, SHAPE, OPS_ONLY)
    assert close(plain["error"], -0.5) and close(tree["error"], -0.75) and "ratio_error" not in plain
    assert close(tree["ratio_error"], -0.5)  # predicted ratio p32/p1, measured 2 p32/p1


def test_busy_machine_note():
    def facts(threads, load, kind="cpu"):
        return DeviceFacts("cpu", kind, 8e9, threads, 2, "2", "transformers", (load, load, load), None)

    assert busy_machine_note(facts(1, 0.4)) is None  # 0.4 <= 2 - 1 + 0.5
    assert busy_machine_note(facts(1, 2.0, kind="cuda")) is None
    assert "recalibrate on a quiet machine if it matters" in busy_machine_note(facts(1, 2.0))
    assert "--threads 1" in busy_machine_note(facts(2, 1.0))  # 1.0 > 0.5: one CPU is taken


# ---- the whole fit -------------------------------------------------------------------------------


def test_fit_hardware_profile_assembles_every_term():
    elementwise = tuple(ElementwiseSample(n, KERNEL_S + 3 * n * BETA / 8e9) for n in (1024, 8192, 65536, 1 << 19))
    rows = np.array([1, 64, 512])
    mix = tuple(
        LayerElementwiseSample(int(r), 1e-5 + b / 5e9) for r, b in zip(rows, layer_elementwise_bytes(SHAPE, rows))
    )
    kv = tuple(KvUpdateSample(4, 256, 1e-6 + 2 * BETA * (2 * 4 * q * 32) / 2e10, new_tokens=q) for q in (1, 64))
    attention = tuple(AttentionSample(1, q, 256, _attention_s(1, q)) for q in ATT_EFF)
    attention += (AttentionSample(8, 1, 256, 8 * _attention_s(1, 1) + 64 * 3e-7),)
    expected = HardwareProfile(
        name="synthetic",
        peak_flops={"fp32": PEAK},
        bandwidth_bytes_per_s=BANDWIDTH,
        capacity_bytes=64e9,
        eta_compute=1.0,
        eta_memory=ETA_MEMORY,
        kernel_overhead_s=KERNEL_S,
        gemm_efficiency=EfficiencyCurve(GEMM_ROWS, (0.3, 0.3, 0.3, 0.5, 0.9, 1.0)),
        attention_efficiency=EfficiencyCurve((4.0, 16.0, 64.0, 256.0), tuple(ATT_EFF.values())),
        vector_flops=PEAK,
        elementwise_bytes_per_s=5e9,
        kv_cache_update="append",
        kv_update_bytes_per_s=2e10,
        attention_block_overhead_s=3e-7,
    )
    facts = DeviceFacts("test cpu", "cpu", 64e9, 1, 2, "2", "transformers", (0.1, 0.1, 0.1), (0.2, 0.2, 0.2))
    m = HardwareMeasurements(
        device=facts,
        dtype="fp32",
        quick=True,
        rounds=5,
        date_utc="2026-01-01T00:00:00Z",
        elapsed_s=1.23,
        elementwise=elementwise,
        layer_elementwise=mix,
        stream=StreamSample(1 << 24, (1 << 24) / BANDWIDTH),
        square_gemms=(SquareGemmSample("fp32", 1024, 2.0 * 1024**3 / PEAK),),
        gemm_weights=(WEIGHT,),
        gemms=tuple(GemmSample(r, 3 * KERNEL_S + _gemm_busy_s(r)) for r in GEMM_ROWS),
        attention=attention,
        kv_update=kv,
        forwards=_forwards(expected),
        heads=(),
        validation=(ForwardSample(2, 1, 1, 128, 1e-3),),
    )
    prof = fit_hardware_profile(m, SHAPE, PROBE, notes=("a note",))
    assert prof.name == "cpu-calibrated" and prof.description == "calibrated on test cpu"
    for key in (
        "bandwidth_bytes_per_s",
        "eta_memory",
        "kernel_overhead_s",
        "elementwise_bytes_per_s",
        "kv_update_bytes_per_s",
        "attention_block_overhead_s",
        "vector_flops",
    ):
        assert close(getattr(prof, key), getattr(expected, key), 1e-6), key
    assert close(prof.peak("fp32"), PEAK)
    np.testing.assert_allclose(prof.gemm_efficiency.values, expected.gemm_efficiency.values, rtol=1e-9)
    np.testing.assert_allclose(prof.attention_efficiency.values, expected.attention_efficiency.values, rtol=1e-6)
    for key, value in TERMS.items():
        assert close(getattr(prof, key.replace("_s", "_overhead_s")), value, 1e-5), key
    cal = prof.calibration
    assert cal["notes"] == ["a note"] and cal["seconds"] == 1.2 and cal["load_average"] == [0.2, 0.2, 0.2]
    assert cal["validation"][0]["measured_s"] == 1e-3 and cal["gemm_mode"] == "whole model pass"
    # the profile survives its own JSON round trip
    assert HardwareProfile.from_dict(prof.to_dict()).to_dict() == prof.to_dict()


# ---- the application layer -----------------------------------------------------------------------


def test_framework_probe_is_the_model_or_a_small_proxy():
    assert framework_probe(SHAPE) is SHAPE
    big = ModelShape(
        "big",
        layers=32,
        hidden=4096,
        intermediate=11008,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=32000,
        dtype="bf16",
        dtype_bytes=2,
    )
    proxy = framework_probe(big)
    assert (proxy.name, proxy.layers, proxy.hidden, proxy.intermediate) == ("big-proxy", 32, 128, 256)
    assert (proxy.heads, proxy.kv_heads, proxy.head_dim, proxy.vocab) == (8, 2, 64, 512)  # 4 query heads per KV head


def test_calibrate_hardware_rejects_bad_input_before_measuring():
    with pytest.raises(UserError, match="--dtype: calibration supports fp32, bf16 and fp16, not int8"):
        calibrate_hardware("cpu", SHAPE, dtype="int8")
    with pytest.raises(UserError, match="--threads: must be >= 1"):
        calibrate_hardware("cpu", SHAPE, threads=0)
    with pytest.raises(UserError, match="--device: must be cpu or cuda"):
        calibrate_hardware("tpu", SHAPE)


def test_calibrate_hardware_quick_on_cpu():
    threads_before = torch.get_num_threads()
    # fp32 named: "auto" follows the CPU's bf16 support (calibration.models.resolve_dtype)
    prof = calibrate_hardware("cpu", SHAPE, dtype="fp32", quick=True, threads=1, validate=False, progress=False)
    assert torch.get_num_threads() == threads_before
    cal = prof.calibration
    assert cal["threads"] == 1 and cal["quick"] and cal["dtype"] == "fp32" and cal["validation"] == []
    # quick: one token over 64 cached ones at 1 and 2 layers, then 3 configurations of 2 layers
    assert cal["framework_fit"]["configs (layers, batch, tokens, context)"] == [
        [1, 1, 1, 64],
        [2, 1, 1, 64],
        [2, 8, 1, 512],
        [2, 1, 32, 64],
        [2, 4, 16, 512],
    ]
    assert prof.gemm_efficiency.rows == (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0)
    assert prof.attention_efficiency.rows == (4.0, 64.0, 256.0)  # q = 1, 16, 64 x 4 query heads per KV head
    assert prof.kernel_overhead_s > 0 and prof.kv_update_bytes_per_s > 0


def test_calibrate_hardware_records_how_its_forwards_ran(monkeypatch):
    """--graphs times the framework forwards as the sweep's static-shape steps (eagerly on a CPU:
    nothing to capture), through `StepRunner`; the default on a CPU stays eager and never
    builds one. The profile records which."""
    import calibration.hwbench as hwbench

    built = []
    real = hwbench.StepRunner
    monkeypatch.setattr(hwbench, "StepRunner", lambda *a, **k: built.append(k) or real(*a, **k))
    kwargs = {"dtype": "fp32", "quick": True, "threads": 1, "validate": False, "progress": False}
    static = calibrate_hardware("cpu", SHAPE, graphs=True, **kwargs)
    assert static.calibration["steps"] == "static" and static.calibration["failed_captures"] == []
    forwards = len(static.calibration["framework_fit"]["measured_s"])
    assert len(built) == forwards and all(k == {"graphs": False, "bucket": 1} for k in built)
    built.clear()
    eager = calibrate_hardware("cpu", SHAPE, **kwargs)
    assert eager.calibration["steps"] == "eager" and built == []


def test_a_replayed_benchmark_is_timed_per_call(monkeypatch):
    """A captured microbenchmark replays `calls` calls per timed call: its sample is the time per
    call (hand-divided: 8, 4 and 12 ms over 4 calls), and an ordinary function's is untouched."""
    import calibration.hwbench as hwbench
    from treeopt.timing import TimingStats

    def replayed():
        pass

    replayed.calls = 4
    stats = TimingStats(8e-3, 4e-3, 12e-3, (8e-3, 4e-3, 12e-3))
    monkeypatch.setattr(hwbench, "measure_interleaved", lambda fns, **kw: [stats for _ in fns])
    bench = hwbench._Bench()
    bench.add("x", lambda st: st, replayed, inner=1)
    bench.add("x", lambda st: st, lambda: None, inner=1)
    per_call, plain = bench.run(rounds=3, seed=0, progress=False)["x"]
    assert (per_call.median_s, per_call.p10_s, per_call.p90_s) == pytest.approx((2e-3, 1e-3, 3e-3))
    assert per_call.samples == pytest.approx((2e-3, 1e-3, 3e-3)) and plain == stats


def test_a_replayed_benchmark_says_how_many_calls_one_replay_makes(monkeypatch):
    """`Replayed` on a CPU, the capture stood in by a plain call of the body: one call runs the
    function CAPTURED_CALLS times, then waits once, and says so in `calls` (what `_Bench.run`
    divides by; the capture itself is checked on CUDA in tests/test_cuda_steps.py)."""
    import calibration.hwbench as hwbench

    monkeypatch.setattr(hwbench, "GraphStep", lambda body: body)
    made = []
    replay = hwbench.Replayed(lambda: made.append("fn"), hwbench.CAPTURED_CALLS, lambda: made.append("sync"))
    replay()
    assert replay.calls == hwbench.CAPTURED_CALLS == 16
    assert made == ["fn"] * 16 + ["sync"]


def test_a_microbenchmark_that_cannot_be_captured_is_timed_eagerly(monkeypatch, capsys):
    """Where capture fails, the benchmark runs once per call (no division by the replay's calls),
    and the failure is recorded for the profile (`calibration.failed_captures`)."""
    import calibration.hwbench as hwbench
    import calibration.static_steps as static_steps

    def failing(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(hwbench, "Replayed", failing)
    monkeypatch.setattr(static_steps, "CAPTURE_FAILURES", [])
    monkeypatch.setattr(hwbench, "CAPTURE_FAILURES", static_steps.CAPTURE_FAILURES)
    calls = []
    _, timed = hwbench._timer(lambda: calls.append("sync"), capture=True)
    fn = timed(lambda: calls.append("fn"))
    fn()
    assert calls == ["fn", "sync"] and not hasattr(fn, "calls") and timed.captured
    assert static_steps.CAPTURE_FAILURES == ["RuntimeError: operation not permitted when stream is capturing"]
    assert "timing it eagerly" in capsys.readouterr().err


def test_a_captured_gemm_benchmark_spills_the_l2(monkeypatch):
    """Copies of a weight cycled through by a captured GEMM: at least twice the L2 (by hand, 60 MB
    of L2: a 4096 x 4096 bf16 weight of 33.5 MB needs 4, a 32000 x 4096 one of 262 MB needs 1);
    none beyond one off CUDA."""
    import calibration.hwbench as hwbench

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(L2_cache_size=60_000_000))
    cuda = torch.device("cuda")
    assert hwbench._cache_spilling_copies(cuda, 4096 * 4096 * 2) == 4
    assert hwbench._cache_spilling_copies(cuda, 32000 * 4096 * 2) == 1
    assert hwbench._cache_spilling_copies(cuda, 60_000_000) == 2
    assert hwbench._cache_spilling_copies(torch.device("cpu"), 4096 * 4096 * 2) == 1


def test_fit_side_imports_no_torch_and_no_calibration():
    code = (
        "import sys, roofline.hwfit, treeopt.hwmeasurements, treeopt.timing; "
        "bad = [m for m in ('torch', 'calibration') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_attention_cells_span_batch_by_context_on_an_accelerator_only():
    """A CPU times the sizes it always did; an accelerator adds the batch x context grid per
    query count, without the cells whose keys and values pass an eighth of its memory: a
    7B-like shape (32 KV heads of 128, bf16: 16 KiB per cached token) on an 8 GiB device
    keeps b (s + q) <= 65,536 tokens."""
    from calibration.attention_bench import attention_cells
    from treeopt.hwmeasurements import ModelDims

    dims = ModelDims("7b", 32, 4096, 11008, 32, 32, 128, 32000, "bf16", False, 13_476_000_000)
    assert attention_cells("cpu", (1, 64), dims, 2, 1e12) == [(1, 1, 256), (1, 64, 256), (8, 1, 256)]
    big = attention_cells("cuda", (1, 64), dims, 2, 1e12)
    assert len(big) == 3 + 2 * 9 and (64, 64, 8192) in big
    small = attention_cells("cuda", (1,), dims, 2, 8 * 2**30)
    grid = small[2:]
    assert all(b * (s + q) <= 65536 for b, q, s in grid)
    assert (8, 1, 8192) not in grid and (64, 1, 512) in grid and (1, 1, 8192) in grid
