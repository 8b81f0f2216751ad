"""roofline.ops: FLOPs and bytes per operator against values derived by hand from the operator
table (docs/performance-model.md#operators; the Medusa paper, Appendix G, Table 5)."""

import numpy as np
import pytest

from roofline.ops import LAYER_OPS, STEP_OPS, operators
from roofline.shapes import DraftHeadsShape, ModelShape, model_shape
from treeopt.errors import UserError

# h=8, i=16, 2 query heads sharing 1 KV head (GQA), head dim 4, vocab 32, 3 layers, fp16
TINY = ModelShape(
    "tiny", layers=3, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=32, dtype="fp16", dtype_bytes=2
)
HEADS = DraftHeadsShape(num_heads=2, num_layers=1, hidden=8, vocab=32)


def by_name(ops):
    return {op.name: op for op in ops}


def test_hand_derived_values_b3_q5_s7():
    # b = 3, q = 5, s = 7: b*q = 15 token rows, s + q = 12 keys, b*n_h*q*(s+q) = 360 scores
    ops = by_name(operators(TINY, HEADS, batch=3, tokens=5, context=7))
    expect = {  # name: (FLOPs, bytes)
        "q_proj": (2 * 15 * 8 * 8, 2 * (64 + 120 + 120)),  # 1920, 608
        "k_proj": (2 * 15 * 8 * 4, 2 * (32 + 120 + 60)),  # GQA: n_kv*d = 4 outputs
        "v_proj": (960, 424),
        "qk": (2 * 3 * 2 * 5 * 12 * 4, 2 * (3 * 2 * 5 * 4 + 3 * 1 * 12 * 4)),  # 2880, 528 (fused)
        "softmax": (5 * 360, 0),
        "pv": (2880, 2 * (3 * 1 * 12 * 4 + 3 * 2 * 5 * 4)),
        "o_proj": (1920, 608),
        "gate": (2 * 15 * 8 * 16, 2 * (128 + 120 + 240)),  # 3840, 976
        "up": (3840, 976),
        "down": (3840, 2 * (128 + 240 + 120)),
        "lm_head": (2 * 15 * 8 * 32, 2 * (256 + 120 + 480)),  # 7680, 1712
        # K=2 heads, 1 ResBlock: K*(2*bq*h^2 + 6*bq*h (bias, SiLU, residual) + 2*bq*h*V)
        "draft_heads": (2 * (1920 + 720 + 7680), 2 * (2 * (64 + 8 + 256) + 2 * (4 * 120 + 120 + 480))),
    }
    for name, (flops, nbytes) in expect.items():
        assert float(ops[name].flops) == flops, name
        assert float(ops[name].bytes) == nbytes, name
    for name in LAYER_OPS:
        assert ops[name].count == 3
    for name in STEP_OPS:
        assert ops[name].count == 1
    assert ops["draft_heads"].kernels == 2 * (3 * 1 + 1)
    assert float(ops["q_proj"].rows) == 15 and float(ops["qk"].rows) == 5 * 2  # q x heads per KV head


# Grouped-query attention with several KV heads: h = 32 = n_h x d, i = 64, V = 16, 2 layers, fp16.
# With one KV head (TINY) n_h / n_kv = n_h, so a term that forgets to divide by n_kv or uses
# n_h where n_kv belongs cannot be told apart; with 2 of 8 (and 8 of 8) it can.
GQA = ModelShape(
    "gqa", layers=2, hidden=32, intermediate=64, heads=8, kv_heads=2, head_dim=4, vocab=16, dtype="fp16", dtype_bytes=2
)
MHA = ModelShape(
    "mha", layers=2, hidden=32, intermediate=64, heads=8, kv_heads=8, head_dim=4, vocab=16, dtype="fp16", dtype_bytes=2
)

# b = 2, q = 3, s = 5: b q = 6 token rows, s + q = 8 keys, b n_h q (s+q) = 2*8*3*8 = 384 scores,
# b n_h q d = 2*8*3*4 = 192 query elements. Bytes are element counts x beta = 2.
GQA_EXPECT = {  # name: (FLOPs, bytes fused+append, bytes unfused or concat, rows)
    "q_proj": (2 * 6 * 32 * 32, 2 * (32 * 32 + 6 * 32 + 6 * 32), None, 6),  # 12288, 2816
    # n_kv d = 2*4 = 8 outputs
    "k_proj": (2 * 6 * 32 * 8, 2 * (32 * 8 + 6 * 32 + 6 * 8), None, 6),  # 3072, 992
    "v_proj": (3072, 992, None, 6),
    # rotary on the 8 query and 2 key heads: 3 FLOP/elem; read+write 6*10*4, cos/sin 2*3*4
    "rotary": (3 * 6 * 10 * 4, 2 * (2 * 6 * 10 * 4 + 2 * 3 * 4), None, 6),  # 720, 1008
    # append: read and write the new K and V rows, 2 * (2 * b q n_kv d) = 2 * 2 * 48;
    # concat: K and V each: read b s n_kv d = 80 cached, read 48 new, write b (s+q) n_kv d = 128
    "kv_cache": (0, 2 * 2 * (2 * 6 * 8), 2 * 2 * (2 * 5 * 8 + 6 * 8 + 2 * 8 * 8), 6),  # 384, 1024
    # QK^T: 2 b n_h q (s+q) d; Q in (192) + K in b n_kv (s+q) d = 2*2*8*4 = 128 (+ scores out)
    # rows per KV head: q n_h / n_kv = 3 * 4 = 12
    "qk": (2 * 2 * 8 * 3 * 8 * 4, 2 * (192 + 128), 2 * (192 + 128 + 384), 12),  # 3072, 640, 1408
    "softmax": (5 * 384, 0, 2 * 2 * 384, 12),  # 1920, 0, 1536
    "pv": (3072, 2 * (128 + 192), 2 * (384 + 128 + 192), 12),
    "o_proj": (2 * 6 * 32 * 32, 2 * (32 * 32 + 6 * 32 + 6 * 32), None, 6),
}
MHA_EXPECT = {  # n_kv = n_h = 8: n_kv d = 32; K in b n_kv (s+q) d = 2*8*8*4 = 512
    "k_proj": (2 * 6 * 32 * 32, 2 * (32 * 32 + 6 * 32 + 6 * 32), None, 6),  # 12288, 2816
    "v_proj": (12288, 2816, None, 6),
    "rotary": (3 * 6 * 16 * 4, 2 * (2 * 6 * 16 * 4 + 2 * 3 * 4), None, 6),  # 1152, 1584
    "kv_cache": (0, 2 * 2 * (2 * 6 * 32), 2 * 2 * (2 * 5 * 32 + 6 * 32 + 2 * 8 * 32), 6),  # 1536, 4096
    "qk": (3072, 2 * (192 + 512), 2 * (192 + 512 + 384), 3),  # 1408, 2176
    "softmax": (1920, 0, 1536, 3),
    "pv": (3072, 2 * (512 + 192), 2 * (384 + 512 + 192), 3),
}


@pytest.mark.parametrize("shape, expect", [(GQA, GQA_EXPECT), (MHA, MHA_EXPECT)], ids=["kv2of8", "kv8of8"])
def test_attention_and_kv_terms_with_several_kv_heads(shape, expect):
    fused = by_name(operators(shape, None, batch=2, tokens=3, context=5))
    unfused = by_name(operators(shape, None, batch=2, tokens=3, context=5, attention="unfused"))
    concat = by_name(operators(shape, None, batch=2, tokens=3, context=5, kv_cache_update="concat"))
    for name, (flops, nbytes, other_bytes, rows) in expect.items():
        assert float(fused[name].flops) == flops, name
        assert float(fused[name].bytes) == nbytes, name
        assert float(fused[name].rows) == rows, name
        if name == "kv_cache":
            assert float(concat[name].bytes) == other_bytes
        elif other_bytes is not None:
            assert float(unfused[name].bytes) == other_bytes, name
            assert float(unfused[name].flops) == flops, name
    # an attention call runs one block per (sequence, query head): 2 x 8
    assert float(fused["qk"].blocks) == 16 and float(fused["pv"].blocks) == 16


def test_unfused_attention_writes_and_reads_the_scores():
    fused = by_name(operators(TINY, None, batch=3, tokens=5, context=7, attention="fused"))
    unfused = by_name(operators(TINY, None, batch=3, tokens=5, context=7, attention="unfused"))
    scores_bytes = 2 * 360
    # docs/performance-model.md#operators, QK^T  b n_h q d + b n_kv (s+q) d + b n_h q (s+q);
    # softmax 2 b n_h q (s+q)
    assert float(unfused["qk"].bytes) == float(fused["qk"].bytes) + scores_bytes
    assert float(unfused["softmax"].bytes) == 2 * scores_bytes
    assert float(unfused["pv"].bytes) == float(fused["pv"].bytes) + scores_bytes
    for name in ("qk", "softmax", "pv"):
        assert float(unfused[name].flops) == float(fused[name].flops)
    assert (fused["qk"].kernels, fused["softmax"].kernels, fused["pv"].kernels) == (1, 0, 0)
    assert "draft_heads" not in fused


def test_kv_cache_append_vs_concat():
    app = by_name(operators(TINY, None, batch=3, tokens=5, context=7))["kv_cache"]
    cat = by_name(operators(TINY, None, batch=3, tokens=5, context=7, kv_cache_update="concat"))["kv_cache"]
    assert float(app.bytes) == 2 * 2 * (2 * 15 * 4)  # read new K, V and write them
    # DynamicCache: read the 7 cached and the 5 new rows, write all 12, for K and V
    assert float(cat.bytes) == 2 * 2 * (3 * 7 * 4 + 15 * 4 + 3 * 12 * 4)


def test_design_table_values_for_7b_decode():
    s = model_shape("llama-7b")
    ops = by_name(operators(s, None, batch=1, tokens=1, context=1023))
    h, i, V = 4096, 11008, 32000
    assert float(ops["q_proj"].bytes) == 2 * (h * h + h + h)
    assert float(ops["gate"].flops) == 2 * h * i
    assert float(ops["lm_head"].bytes) == 2 * (h * V + h + V)
    assert float(ops["qk"].flops) == 2 * 32 * 1024 * 128


@pytest.mark.parametrize("b", [1, 2, 4, 8, 16])
def test_decode_linear_intensity_is_about_batch(b):
    # OI = 2 b k n / (2 (k n + b k + b n)) = b / (1 + b/n + b/k) ~ b at beta = 2
    ops = by_name(operators(model_shape("llama-7b"), None, batch=b, tokens=1, context=512))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down", "lm_head"):
        assert float(ops[name].intensity) == pytest.approx(b, rel=0.01)


def test_gqa_shrinks_kv_traffic():
    mha = model_shape("llama-2-7b")
    gqa = model_shape("mistral-7b")  # 8 KV heads instead of 32
    a = by_name(operators(mha, None, batch=4, tokens=1, context=4096))
    g = by_name(operators(gqa, None, batch=4, tokens=1, context=4096))
    # K read dominates QK at decode: b n_kv (s+q) d; 4x fewer KV heads
    kv_a = 4 * 32 * 4097 * 128
    kv_g = 4 * 8 * 4097 * 128
    assert float(a["qk"].bytes) == 2 * (4 * 32 * 128 + kv_a)
    assert float(g["qk"].bytes) == 2 * (4 * 32 * 128 + kv_g)
    assert float(g["k_proj"].flops) == 2 * 4 * 4096 * 1024


def test_vectorised_equals_scalar():
    b = np.array([1, 4, 16])[:, None]
    q = np.array([1, 8, 64])[None, :]
    vec = by_name(operators(TINY, HEADS, batch=b, tokens=q, context=100))
    for i, bb in enumerate([1, 4, 16]):
        for j, qq in enumerate([1, 8, 64]):
            sc = by_name(operators(TINY, HEADS, batch=bb, tokens=qq, context=100))
            for name, op in sc.items():
                assert vec[name].flops[i, j] == float(op.flops)
                assert vec[name].bytes[i, j] == float(op.bytes)


def test_prefill_has_no_cache():
    ops = by_name(operators(TINY, None, batch=1, tokens=16, context=0))
    assert float(ops["qk"].flops) == 2 * 2 * 16 * 16 * 4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch": 0, "tokens": 1, "context": 0}, "--batch"),
        ({"batch": 1, "tokens": 0, "context": 0}, "--tokens"),
        ({"batch": 1, "tokens": 1, "context": -1}, "--context"),
        ({"batch": 1.5, "tokens": 1, "context": 0}, "--batch"),
    ],
)
def test_bad_sizes(kwargs, match):
    with pytest.raises(UserError, match=match):
        operators(TINY, None, **kwargs)


def test_bad_attention_mode():
    with pytest.raises(UserError, match="--attention"):
        operators(TINY, None, batch=1, tokens=1, context=0, attention="flash")


def test_heads_on_fewer_tokens_per_sequence():
    one = DraftHeadsShape(2, 1, 8, 32, tokens_per_sequence=1)
    ops = by_name(operators(TINY, one, batch=3, tokens=5, context=7))
    # 3 rows (one per sequence) instead of 15
    assert float(ops["draft_heads"].flops) == 2 * (2 * 3 * 64 + 6 * 3 * 8 + 2 * 3 * 8 * 32)
    assert float(ops["draft_heads"].rows) == 3
    all_q = by_name(operators(TINY, HEADS, batch=3, tokens=1, context=7))
    one_q = by_name(operators(TINY, one, batch=3, tokens=1, context=7))
    assert float(all_q["draft_heads"].flops) == float(one_q["draft_heads"].flops)
    with pytest.raises(UserError, match="tokens_per_sequence"):
        DraftHeadsShape(2, 1, 8, 32, tokens_per_sequence=0)
