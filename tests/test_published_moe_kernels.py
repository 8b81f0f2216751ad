"""The priced routed experts against vLLM's published fused-MoE kernel timings (roofline/published_moe.py,
docs/performance-model.md#mixture-of-experts). Expected values are typed from vLLM pull request #24700
(mgoin, 2025-09-11: benchmark_moe.py on one H100 80GB HBM3), not computed by the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.published_moe import MoeKernelCheck, MoeKernelTimes, moe_kernel_checks, moe_kernel_times

# typed from the pull request's "Mixtral BF16 ... -tp=2 ... # Tuned Config" block
MIXTRAL_US = {1: 144.03, 2: 229.28, 8: 434.98, 32: 487.35, 128: 491.39, 256: 536.77, 1024: 833.72, 1536: 1122.93}
# typed from its "Qwen3 MoE FP8 ... -tp=1 --dtype=fp8_w8a8 ... # Main" block
QWEN3_FP8_US = {1: 44.54, 16: 185.40, 64: 262.73, 128: 273.72, 512: 391.86, 2048: 911.64, 4096: 1647.57}


def _by_shape():
    return {c.times.shape: c for c in moe_kernel_checks()}


def test_the_data_file_holds_the_published_timings():
    times = {t.shape: t for t in moe_kernel_times()}
    mixtral, qwen = times["mixtral-bf16-tp2"], times["qwen3-30b-a3b-fp8-tp1"]
    assert (mixtral.model, mixtral.hardware, mixtral.dtype, mixtral.tensor_parallel) == (
        "mixtral-8x7b",
        "h100-sxm",
        "bf16",
        2,
    )
    assert (qwen.model, qwen.hardware, qwen.dtype, qwen.tensor_parallel) == ("qwen3-30b-a3b", "h100-sxm", "fp8", 1)
    # the pull request's 15 and 18 batch sizes, 1 .. 1536 and 1 .. 4096
    assert len(mixtral.tokens) == 15 and mixtral.tokens[-1] == 1536
    assert len(qwen.tokens) == 18 and qwen.tokens[-1] == 4096
    for t, typed in ((mixtral, MIXTRAL_US), (qwen, QWEN3_FP8_US)):
        got = dict(zip(t.tokens, t.kernel_us, strict=True))
        assert {n: got[n] for n in typed} == typed


def test_measured_ratios_are_the_published_times_over_the_one_token_time():
    checks = _by_shape()
    mixtral = checks["mixtral-bf16-tp2"]
    at = dict(zip(mixtral.times.tokens, mixtral.measured_ratio, strict=True))
    assert at[32] == pytest.approx(487.35 / 144.03)
    assert at[1536] == pytest.approx(1122.93 / 144.03)


def test_mixtral_expert_gemms_grow_with_tokens_as_the_kernel_does():
    # 8 experts of 4096 x 7168 per GPU, top-2: the distinct experts read and then the GEMMs'
    # compute set the growth; median |error| of T(n)/T(1) 13%, worst 26% (at 256 tokens)
    check = _by_shape()["mixtral-bf16-tp2"]
    assert check.median_error <= 0.15
    assert check.worst_error <= 0.30
    # at one token two experts' weights are read: 2 x 3 x 4096 x 7168 x 2 bytes = 352 MB, at the
    # H100 profile's 0.78 x 3.35 TB/s 135 us, plus the priced kernels; the kernel took 144.03 us
    assert float(check.priced_s[0]) * 1e6 == pytest.approx(144.03, rel=0.05)
    # from 16 to 128 tokens every expert is read: the measured plateau is 3.3-3.4x the one-token
    # time and the priced one within 16% of it
    errors = dict(zip(check.times.tokens, check.errors, strict=True))
    assert all(abs(errors[n]) <= 0.16 for n in (16, 24, 32, 48, 64, 96, 128))


def test_qwen3_small_experts_are_the_stated_miss():
    # docs/performance-model.md#mixture-of-experts: with 128 small experts (2048 x 768) the model
    # prices one token too cheaply against the kernel's fixed work (routing, alignment, the
    # activations' fp8 quantisation), so the priced ratio over-grows by 50-72% at 8-128 tokens;
    # from 2048 tokens the kernel runs far below the priced GEMM efficiency (at 4096 tokens
    # 2 x 4096 x 8 x 3 x 2048 x 768 FLOPs = 0.31 PFLOP in 1647.57 us: 188 TFLOP/s, 9.5% of fp8 peak)
    check = _by_shape()["qwen3-30b-a3b-fp8-tp1"]
    errors = dict(zip(check.times.tokens, check.errors, strict=True))
    assert all(errors[n] > 0.4 for n in (8, 16, 32, 64, 128))
    assert all(errors[n] < -0.3 for n in (2048, 3072, 4096))
    flops = 2 * 4096 * 8 * 3 * 2048 * 768
    assert flops / 1647.57e-6 / 1979e12 == pytest.approx(0.095, abs=0.002)
    assert float(check.priced_s[0]) < 0.6 * 44.54e-6
    assert np.all(np.isfinite(check.priced_s))


def test_the_check_errors_by_hand():
    # measured 10, 20, 40 us; priced 1, 2.4, 3.2: ratios 1, 2, 4 against 1, 2.4, 3.2, so the
    # errors are 0, +20% and -20%: median |error| 20% (misses both ways do not cancel), worst 20%
    times = MoeKernelTimes("t", "qwen3-30b-a3b", "h100-sxm", "bf16", 1, "tuned", (1, 2, 4), (10.0, 20.0, 40.0))
    check = MoeKernelCheck(times, np.array([1.0, 2.4, 3.2]))
    assert check.errors == pytest.approx([0.0, 0.2, -0.2])
    assert check.median_error == pytest.approx(0.2)
    assert check.worst_error == pytest.approx(0.2)
