"""Every term of the latency model on a toy model and toy profiles, against step times derived
by hand (docs/performance-model.md#operators, "Efficiencies", "GEMM row efficiency",
"KV-cache update", "Memory capacity").

The toy profiles make one roof irrelevant (a rate of 1e30 per second), so a step time is a sum
of counts over rates that can be written out as literal arithmetic. A term the model dropped
or read from the wrong field moves one of these sums.
"""

import numpy as np
import pytest

from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.latency import memory_required_bytes, op_timings, step_time_s
from roofline.shapes import DraftHeadsShape, ModelShape, model_shape

# 2 layers, h = 32, i = 64, 8 query heads sharing 2 KV heads of dim 4, V = 16, fp16 (beta = 2)
GQA = ModelShape(
    "gqa", layers=2, hidden=32, intermediate=64, heads=8, kv_heads=2, head_dim=4, vocab=16, dtype="fp16", dtype_bytes=2
)
B, Q, S = 2, 3, 5  # b q = 6 rows, s + q = 8 keys, q n_h / n_kv = 12 attention rows per KV head
FLAT = EfficiencyCurve((1.0,), (1.0,))
HUGE = 1e30

# Only bytes cost time: bandwidth 1e9 B/s at eta_memory 0.5 = 5e8 B/s for everything.
MEMORY_ONLY = HardwareProfile(
    name="memory-only",
    peak_flops={"fp16": HUGE},
    vector_flops=HUGE,
    bandwidth_bytes_per_s=1e9,
    eta_memory=0.5,
    capacity_bytes=1e12,
    kernel_overhead_s=0.0,
    gemm_efficiency=FLAT,
)
# Only FLOPs cost time: matrix work at 1e9 x eta_compute 0.5 = 5e8 FLOP/s, vector work at
# 1e8 x 0.5 = 5e7 FLOP/s.
COMPUTE_ONLY = HardwareProfile(
    name="compute-only",
    peak_flops={"fp16": 1e9},
    vector_flops=1e8,
    eta_compute=0.5,
    bandwidth_bytes_per_s=HUGE,
    capacity_bytes=1e12,
    kernel_overhead_s=0.0,
    gemm_efficiency=FLAT,
)

# Element counts per step (x beta = 2 for bytes), b = 2, q = 3, s = 5, fused attention, append:
# per layer  attn_norm 2*6*32+32 = 416, q_proj 32*32+6*32+6*32 = 1408, k_proj 32*8+6*32+6*8 = 496,
#            v_proj 496, rotary 2*6*10*4+2*3*4 = 504, kv_cache 2*2*6*8 = 192, qk 192+128 = 320,
#            softmax 0, pv 320, o_proj 1408, attn_residual 3*6*32 = 576, mlp_norm 416,
#            gate 32*64+6*32+6*64 = 2624, up 2624, act 3*6*64 = 1152, down 2624, mlp_residual 576
#            = 16152
# per step   embedding 2*6*32 = 384, final_norm 416, lm_head 32*16+6*32+6*16 = 800
STEP_ELEMENTS = 2 * 16152 + 384 + 416 + 800  # 33904
# elementwise kernels only (vector kind, not the KV-cache copy):
# per layer 416 + 504 + 0 + 576 + 416 + 1152 + 576 = 3640; per step 384 + 416
ELEMENTWISE_ELEMENTS = 2 * 3640 + 384 + 416  # 8080
KV_ELEMENTS = 2 * 192  # 384

# FLOPs per step: GEMMs per layer q_proj 2*6*32*32 = 12288, k_proj 2*6*32*8 = 3072, v_proj 3072,
# o_proj 12288, gate/up/down 2*6*32*64 = 24576 each; lm_head 2*6*32*16 = 6144
GEMM_FLOPS = 2 * (12288 + 3072 + 3072 + 12288 + 3 * 24576) + 6144  # 215040
# attention per layer: qk and pv 2*2*8*3*8*4 = 3072 each
ATTENTION_FLOPS = 2 * (3072 + 3072)  # 12288
# vector per layer: norms 4*6*32 = 768 (x2), rotary 3*6*10*4 = 720, softmax 5*384 = 1920,
# residuals 6*32 = 192 (x2), act 5*6*64 = 1920; final_norm 768
VECTOR_FLOPS = 2 * (768 + 720 + 1920 + 192 + 768 + 1920 + 192) + 768  # 13728


def step(hw, shape=GQA, heads=None, **kw):
    args = {"batch": B, "tokens": Q, "context": S}
    args.update(kw)
    return step_time_s(shape, heads, hw, **args)


def timings(hw, shape=GQA, heads=None, **kw):
    args = {"batch": B, "tokens": Q, "context": S}
    args.update(kw)
    return {t.op.name: t for t in op_timings(shape, heads, hw, **args)}


def test_memory_only_step_is_all_bytes_over_attained_bandwidth():
    # 33904 elements x 2 bytes / (1e9 x 0.5) B/s
    assert step(MEMORY_ONLY) == pytest.approx(STEP_ELEMENTS * 2 / 5e8, rel=1e-12)  # 1.35616e-4 s


def test_compute_only_step_splits_matrix_and_vector_rates():
    # matrix work (GEMMs and attention) at 5e8 FLOP/s, vector work at 5e7 FLOP/s
    # (215040 + 12288) / 5e8 + 13728 / 5e7 = 4.54656e-4 + 2.7456e-4 s
    expect = (GEMM_FLOPS + ATTENTION_FLOPS) / 5e8 + VECTOR_FLOPS / 5e7
    assert step(COMPUTE_ONLY) == pytest.approx(expect, rel=1e-12)


def test_vector_work_runs_at_vector_flops_times_eta_compute():
    faster = COMPUTE_ONLY.with_(vector_flops=2e8)
    # only the 13728 vector FLOPs change rate: 5e7 -> 1e8 FLOP/s saves 13728 / 1e8 s
    assert step(COMPUTE_ONLY) - step(faster) == pytest.approx(VECTOR_FLOPS / 1e8, rel=1e-9)
    softmax = timings(COMPUTE_ONLY)["softmax"]
    assert float(softmax.compute_s) == pytest.approx(1920 / 5e7, rel=1e-12)  # 3.84e-5 s


def test_vector_rate_falls_back_to_fp32_peak_then_to_a_sixteenth_of_the_best_peak():
    with_fp32 = COMPUTE_ONLY.with_(vector_flops=None, peak_flops={"fp16": 1e9, "fp32": 4e8})
    # softmax: 1920 FLOPs at 4e8 x 0.5 = 2e8 FLOP/s
    assert float(timings(with_fp32)["softmax"].compute_s) == pytest.approx(9.6e-6, rel=1e-12)
    no_fp32 = COMPUTE_ONLY.with_(vector_flops=None, peak_flops={"fp16": 1.6e9, "bf16": 0.8e9})
    # 1.6e9 / 16 = 1e8 x 0.5 = 5e7 FLOP/s
    assert float(timings(no_fp32)["softmax"].compute_s) == pytest.approx(3.84e-5, rel=1e-12)


def test_elementwise_kernels_run_at_elementwise_bytes_per_s():
    slow = MEMORY_ONLY.with_(elementwise_bytes_per_s=1e8)
    # 8080 elementwise elements = 16160 bytes move from 5e8 to 1e8 B/s: + 16160 x (1e-8 - 2e-9) s
    assert step(slow) - step(MEMORY_ONLY) == pytest.approx(ELEMENTWISE_ELEMENTS * 2 * (1e-8 - 2e-9), rel=1e-9)
    t = timings(slow)
    assert float(t["act"].memory_s) == pytest.approx(2 * 1152 / 1e8, rel=1e-12)
    # the KV-cache copy and the GEMMs keep the bandwidth roof
    assert float(t["kv_cache"].memory_s) == pytest.approx(2 * 192 / 5e8, rel=1e-12)
    assert float(t["gate"].memory_s) == pytest.approx(2 * 2624 / 5e8, rel=1e-12)


def test_kv_cache_update_runs_at_its_own_rate():
    slow = MEMORY_ONLY.with_(kv_update_bytes_per_s=1e8)
    # 384 KV elements = 768 bytes move from 5e8 to 1e8 B/s
    assert step(slow) - step(MEMORY_ONLY) == pytest.approx(KV_ELEMENTS * 2 * (1e-8 - 2e-9), rel=1e-9)
    # concat: per layer 2 x (2*5*8 + 6*8 + 2*8*8) = 512 elements instead of 192
    cat = MEMORY_ONLY.with_(kv_cache_update="concat")
    assert step(cat) - step(MEMORY_ONLY) == pytest.approx(2 * 2 * (512 - 192) / 5e8, rel=1e-9)


def test_attention_efficiency_scales_attention_compute():
    # curve over query rows per KV head: 0.5 at 12 rows, 1.0 at 48; the fixture has
    # q n_h / n_kv = 3 x 8 / 2 = 12 rows -> 0.5
    curve = EfficiencyCurve((12.0, 48.0), (0.5, 1.0))
    half = COMPUTE_ONLY.with_(attention_efficiency=curve)
    # the 12288 attention FLOPs go from 5e8 to 2.5e8 FLOP/s: + 12288 / 5e8 s
    assert step(half) - step(COMPUTE_ONLY) == pytest.approx(ATTENTION_FLOPS / 5e8, rel=1e-9)
    t = timings(half)
    assert float(t["qk"].compute_s) == pytest.approx(3072 / 2.5e8, rel=1e-12)
    assert float(t["q_proj"].compute_s) == pytest.approx(12288 / 5e8, rel=1e-12)  # GEMMs keep theirs
    # q = 6: 24 rows, halfway between 12 and 48 in log2(rows) -> the geometric mean, sqrt(0.5)
    t6 = timings(half, tokens=6)
    # qk at q = 6: 2 * 2 * 8 * 6 * 11 * 4 = 8448 FLOPs at 5e8 x sqrt(0.5)
    assert float(t6["qk"].compute_s) == pytest.approx(8448 / (5e8 * 0.5**0.5), rel=1e-12)


def test_attention_uses_the_gemm_curve_when_it_has_none_of_its_own():
    # GEMM curve 0.5 at 6 rows, 1.0 from 12: GEMMs (b q = 6 rows) at half rate, attention
    # (12 rows per KV head) at full rate
    hw = COMPUTE_ONLY.with_(gemm_efficiency=EfficiencyCurve((6.0, 12.0), (0.5, 1.0)))
    t = timings(hw)
    assert float(t["q_proj"].compute_s) == pytest.approx(12288 / 2.5e8, rel=1e-12)
    assert float(t["qk"].compute_s) == pytest.approx(3072 / 5e8, rel=1e-12)
    # the whole step: 215040 GEMM FLOPs at 2.5e8, 12288 attention at 5e8, 13728 vector at 5e7
    assert step(hw) == pytest.approx(GEMM_FLOPS / 2.5e8 + ATTENTION_FLOPS / 5e8 + VECTOR_FLOPS / 5e7, rel=1e-12)


def test_gemm_efficiency_is_read_at_batch_times_tokens_rows():
    # 0.5 at 3 rows, 1.0 at 12: b q = 6 is halfway in log2(rows) -> sqrt(0.5)
    hw = COMPUTE_ONLY.with_(gemm_efficiency=EfficiencyCurve((3.0, 12.0), (0.5, 1.0)), attention_efficiency=FLAT)
    t = timings(hw)
    rate = 5e8 * 0.5**0.5
    assert float(t["q_proj"].compute_s) == pytest.approx(12288 / rate, rel=1e-12)
    assert float(t["lm_head"].compute_s) == pytest.approx(6144 / rate, rel=1e-12)
    assert step(hw) == pytest.approx(GEMM_FLOPS / rate + ATTENTION_FLOPS / 5e8 + VECTOR_FLOPS / 5e7, rel=1e-12)


def test_launch_block_and_head_overheads():
    hw = MEMORY_ONLY.with_(
        bandwidth_bytes_per_s=HUGE,
        elementwise_bytes_per_s=HUGE,
        kernel_overhead_s=1e-6,
        attention_block_overhead_s=1e-7,
        head_overhead_s=1e-5,
    )
    # fused: 17 operators per layer but softmax and pv run inside qk's kernel -> 15 kernels;
    # 2 layers + embedding, final_norm, lm_head = 33 kernels; qk pays 2 x 8 = 16 blocks per layer
    assert step(hw) == pytest.approx(33 * 1e-6 + 2 * 16 * 1e-7, rel=1e-9)
    # unfused: 17 kernels per layer = 37; qk and pv each pay the blocks
    assert step(hw, attention="unfused") == pytest.approx(37 * 1e-6 + 2 * 2 * 16 * 1e-7, rel=1e-9)
    # 3 heads of 2 ResBlocks: 3 x (3 x 2 + 1) = 21 kernels and 3 head overheads
    heads = DraftHeadsShape(num_heads=3, num_layers=2, hidden=32, vocab=16)
    assert step(hw, heads=heads) - step(hw) == pytest.approx(21 * 1e-6 + 3 * 1e-5, rel=1e-9)


# Weights of GQA: per layer q, o 32*32 each, k, v 32*8 each, gate/up/down 32*64 each, 2 norms
# of 32 = 1024 + 1024 + 256 + 256 + 3 * 2048 + 64 = 8768; 2 layers + embedding 16*32 + lm_head
# 16*32 + final norm 32 = 17536 + 512 + 512 + 32 = 18592 parameters = 37184 bytes.
# KV cache: K and V, 2 layers, n_kv d = 8, 2 bytes = 64 bytes per token.
GQA_WEIGHT_BYTES = 37184


def test_memory_required_bytes_by_hand():
    heads = DraftHeadsShape(num_heads=2, num_layers=1, hidden=32, vocab=16)
    # heads: 2 x (32*32 + 32 + 32*16) = 3136 parameters = 6272 bytes;
    # KV of b (s + q) = 2 x 8 tokens = 1024 bytes; largest activation: the MLP's b q x i x 2
    # (gate and up) = 2*3*64*2 x 2 bytes = 1536 > logits b (q + q K) V = 2*9*16 x 2 = 576
    need = memory_required_bytes(GQA, heads, batch=2, tokens=3, context=5)
    assert float(need) == 37184 + 6272 + 1024 + 1536  # 46016
    # unfused attention, b = 1, q = 1, s = 99: KV 100 x 64 = 6400; the scores b n_h q (s+q)
    # = 8*100 x 2 = 1600 beat the MLP (1*64*2 x 2 = 256) and the logits (16 x 2 = 32)
    need = memory_required_bytes(GQA, None, batch=1, tokens=1, context=99, attention="unfused")
    assert float(need) == 37184 + 6400 + 1600  # 45184
    # fused: no scores, the MLP activation is the largest
    assert float(memory_required_bytes(GQA, None, batch=1, tokens=1, context=99)) == 37184 + 6400 + 256


def test_memory_required_bytes_vicuna_7b_with_heads():
    v7 = model_shape("vicuna-7b")
    heads = DraftHeadsShape(num_heads=5, num_layers=1, hidden=4096, vocab=32000, tokens_per_sequence=1)
    # weights: 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 2 x 32000 x 4096 + 4096
    #   = 6738415616 parameters x 2 bytes = 13476831232
    # heads: 5 x (4096^2 + 4096 + 4096 x 32000) = 739266560 x 2 = 1478533120
    # KV: 2 x 32 x 4096 x 2 = 524288 bytes per token, b (s + q) = 1 x (0 + 4) tokens = 2097152
    # logits: b (q + 1 x K) V x 2 = (4 + 5) x 32000 x 2 = 576000 > MLP 4 x 11008 x 2 x 2 = 176128
    need = memory_required_bytes(v7, heads, batch=1, tokens=4, context=0)
    assert float(need) == 13476831232 + 1478533120 + 2097152 + 576000


def test_capacity_boundary_counts_the_new_tokens_in_the_cache():
    # exactly the 45184 bytes of the unfused b = 1, q = 1, s = 99 step fit; one byte less does not
    fits = MEMORY_ONLY.with_(capacity_bytes=45184.0)
    assert np.isfinite(step(fits, batch=1, tokens=1, context=99, attention="unfused"))
    short = MEMORY_ONLY.with_(capacity_bytes=45183.0)
    assert np.isnan(step(short, batch=1, tokens=1, context=99, attention="unfused"))
