"""The step-cost terms where trees are decided, against hand-derived values
(docs/performance-model.md#engine-terms-of-a-speculative-step, "Attention KV bandwidth",
"Verification modes", "Memory capacity", "Fitting a profile to measured steps")."""

import json

import numpy as np
import pandas as pd
import pytest

from roofline.grid import PerTreeSize, candidates_by_prefix, speedup_grid
from roofline.hardware import EfficiencyCurve, HardwareProfile, load_hardware
from roofline.latency import memory_required_bytes, op_timings, speculation_overhead_s, step_time_s
from roofline.profile_fit import (
    apply_terms,
    fit_profile,
    identifiable_terms,
    predict_step_s,
    read_step_points,
    step_points_frame,
)
from roofline.shapes import ModelShape, draft_heads_shape, model_shape
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.tree import Tree

# 2 layers, h = 32, i = 64, 8 query heads sharing 2 KV heads of dim 4, V = 16, fp16 (beta = 2)
GQA = ModelShape(
    "gqa", layers=2, hidden=32, intermediate=64, heads=8, kv_heads=2, head_dim=4, vocab=16, dtype="fp16", dtype_bytes=2
)
FLAT = EfficiencyCurve((1.0,), (1.0,))
HUGE = 1e30
# only bytes cost time, at 1e9 x 0.5 = 5e8 B/s
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
# a calibrated-looking profile: framework costs per forward, layer, token row and cached key
FRAMEWORK = MEMORY_ONLY.with_(
    kernel_overhead_s=2e-6,
    forward_overhead_s=1e-4,
    layer_overhead_s=3e-5,
    token_overhead_s=1e-6,
    context_overhead_s=2e-8,
    plain_context_overhead_s=1e-8,
)
V7 = model_shape("vicuna-7b")
A100 = load_hardware("a100-80gb-sxm")


def attention_s(timings) -> float:
    return sum(float(t.total_s) for t in timings if t.op.kind == "attention")


# ---- engine terms ------------------------------------------------------------------------


def test_fixed_cost_is_paid_by_speculative_steps_only():
    hw = MEMORY_ONLY.with_(spec_step_overhead_s=2.5e-3)
    for q in (2, 3, 17):
        assert step_time_s(GQA, None, hw, batch=2, tokens=q, context=5) - step_time_s(
            GQA, None, MEMORY_ONLY, batch=2, tokens=q, context=5
        ) == pytest.approx(2.5e-3, rel=1e-9)
    assert step_time_s(GQA, None, hw, batch=2, tokens=1, context=5) == step_time_s(
        GQA, None, MEMORY_ONLY, batch=2, tokens=1, context=5
    )


def test_cost_per_verified_token_counts_every_token_of_every_sequence():
    hw = MEMORY_ONLY.with_(verified_token_s=7e-5)
    # b = 2 sequences x q = 3 tokens = 6 verified tokens; plain decoding verifies b = 2
    assert step_time_s(GQA, None, hw, batch=2, tokens=3, context=5) - step_time_s(
        GQA, None, MEMORY_ONLY, batch=2, tokens=3, context=5
    ) == pytest.approx(6 * 7e-5, rel=1e-9)
    assert float(speculation_overhead_s(hw, batch=2, tokens=1)) == pytest.approx(2 * 7e-5, rel=1e-12)


def test_cost_per_sequential_draft_stage():
    hw = MEMORY_ONLY.with_(draft_stage_s=4e-4, spec_step_overhead_s=1e-3)
    # 3 stages + the fixed cost: 3 x 0.4 ms + 1 ms
    assert float(speculation_overhead_s(hw, batch=4, tokens=5, draft_stages=3)) == pytest.approx(2.2e-3, rel=1e-12)
    grid = speedup_grid(GQA, None, hw, [1.0, 1.5, 1.9], [1], [5], per_size=PerTreeSize(draft_stages=[0, 1, 2]))
    plain = step_time_s(GQA, None, MEMORY_ONLY, batch=1, tokens=np.array([1, 2, 3]), context=5)
    assert grid["step_time_s"].to_numpy() - plain == pytest.approx([0.0, 1.4e-3, 1.8e-3], rel=1e-9)


def test_a_branching_tree_pays_its_cost_per_layer_and_a_chain_does_not():
    # docs/performance-model.md#engine-terms-of-a-speculative-step: tree_verify_layer_s x layers
    # (GQA: 2 layers) once per step whose tokens branch and q > 1; 30 us x 2 = 60 us
    hw = MEMORY_ONLY.with_(tree_verify_layer_s=3e-5)
    tree = step_time_s(GQA, None, hw, batch=4, tokens=6, context=5, tree_verify=True)
    chain = step_time_s(GQA, None, hw, batch=4, tokens=6, context=5)
    assert tree - chain == pytest.approx(2 * 3e-5, rel=1e-9)
    # a chain and plain decoding price exactly as without the term; a lone root (q = 1) has no tree
    for tokens in (1, 6):
        assert step_time_s(GQA, None, hw, batch=4, tokens=tokens, context=5) == step_time_s(
            GQA, None, MEMORY_ONLY, batch=4, tokens=tokens, context=5
        )
    assert float(speculation_overhead_s(hw, batch=4, tokens=1, tree_verify=True, layers=2)) == 0.0
    # per step, not per sequence or token: batch 1 and batch 8 pay the same 60 us; broadcasting flags
    steps = speculation_overhead_s(hw, batch=np.array([1, 8]), tokens=5, tree_verify=np.array([True, False]), layers=2)
    assert steps == pytest.approx([6e-5, 0.0], abs=1e-15)
    assert float(speculation_overhead_s(hw, batch=8, tokens=5, tree_verify=True, layers=80)) == pytest.approx(2.4e-3)


def test_attention_reads_the_kv_cache_at_its_own_bandwidth():
    # b = 2, q = 3, s = 5: qk and pv each move 320 elements per layer (roofline.ops), 2 layers,
    # beta 2: 2560 bytes; at a quarter of 5e8 B/s they take 4x as long
    slow = MEMORY_ONLY.with_(attention_kv_efficiency=EfficiencyCurve((1.0,), (0.25,)))
    base = attention_s(op_timings(GQA, None, MEMORY_ONLY, batch=2, tokens=3, context=5))
    assert base == pytest.approx(2560 / 5e8, rel=1e-12)
    assert attention_s(op_timings(GQA, None, slow, batch=2, tokens=3, context=5)) == pytest.approx(4 * base, rel=1e-12)
    # the other operators keep their rates
    assert step_time_s(GQA, None, slow, batch=2, tokens=3, context=5) - step_time_s(
        GQA, None, MEMORY_ONLY, batch=2, tokens=3, context=5
    ) == pytest.approx(3 * 2560 / 5e8, rel=1e-9)


def test_attention_kv_efficiency_follows_the_keys_per_sequence():
    # 1.0 at 8 keys, 0.5 at 32: 16 keys is halfway in log2 -> sqrt(0.5)
    hw = MEMORY_ONLY.with_(attention_kv_efficiency=EfficiencyCurve((8.0, 32.0), (1.0, 0.5)))
    # b = 1, q = 1, s = 15: 16 keys; qk moves 8*1*4 + 2*16*4 = 160 elements, pv the same
    t = attention_s(op_timings(GQA, None, hw, batch=1, tokens=1, context=15))
    assert t == pytest.approx(2 * 2 * 160 * 2 / (5e8 * 0.5**0.5), rel=1e-12)


# ---- verification modes ------------------------------------------------------------------


def test_one_candidate_is_tree_verification():
    for att in ("fused", "unfused"):
        tree = step_time_s(GQA, None, FRAMEWORK, batch=2, tokens=7, context=5, attention=att)
        one = step_time_s(GQA, None, FRAMEWORK, batch=2, tokens=7, context=5, attention=att, candidates=1)
        assert one == tree


def test_one_token_candidates_are_plain_decoding_of_the_expanded_batch():
    # b = 2 sequences x 6 candidates of one token = 12 sequences decoding one token each
    for att in ("fused", "unfused"):
        cand = op_timings(GQA, None, FRAMEWORK, batch=2, tokens=6, context=5, attention=att, candidates=6)
        plain = op_timings(GQA, None, FRAMEWORK, batch=12, tokens=1, context=5, attention=att)
        for a, b in zip(cand, plain, strict=True):
            assert a.op.name == b.op.name
            assert (float(a.time_s), float(a.op.flops), float(a.op.bytes)) == (
                float(b.time_s),
                float(b.op.flops),
                float(b.op.bytes),
            ), a.op.name
        assert step_time_s(
            GQA, None, FRAMEWORK, batch=2, tokens=6, context=5, attention=att, candidates=6
        ) == step_time_s(GQA, None, FRAMEWORK, batch=12, tokens=1, context=5, attention=att)


def test_candidates_re_read_the_context():
    # b = 2, q = 3 in 3 candidates of one token, s = 5: qk reads Q (2*8*3*4 = 192 elements) and
    # K of 6 candidate sequences x 2 KV heads x (5 + 1) keys x 4 = 288; the tree reads K once,
    # 2 x 2 x 8 x 4 = 128
    ops = {t.op.name: t.op for t in op_timings(GQA, None, MEMORY_ONLY, batch=2, tokens=3, context=5, candidates=3)}
    assert float(ops["qk"].bytes) == (192 + 288) * 2
    tree = {t.op.name: t.op for t in op_timings(GQA, None, MEMORY_ONLY, batch=2, tokens=3, context=5)}
    assert float(tree["qk"].bytes) == (192 + 128) * 2
    with pytest.raises(UserError, match="--candidates"):
        step_time_s(GQA, None, MEMORY_ONLY, batch=2, tokens=3, context=5, candidates=4)


def test_candidates_of_a_tree_are_its_root_to_leaf_paths():
    tree = Tree(((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (2,)))
    tokens, leaves = candidates_by_prefix(tree)
    # prefixes: {} 1 token; {0} 2; {0,1} 2+2; {1, 00} 2+3; {1, 00, 01} 2+3+3; {1, 01, 000} 2+3+4;
    # {1, 01, 000, 2} 2+3+4+2
    assert tokens.tolist() == [1, 2, 4, 5, 8, 9, 11]
    assert leaves.tolist() == [1, 1, 2, 2, 3, 3, 4]
    # a chain is verified identically either way
    chain = Tree(((0,), (0, 0), (0, 0, 0)))
    tau = [1.0, 1.5, 1.8, 2.0]
    a = speedup_grid(V7, None, A100, tau, [1, 4], [64, 2048])
    b = speedup_grid(V7, None, A100, tau, [1, 4], [64, 2048], verification="candidates", tree=chain)
    assert a["step_time_s"].tolist() == b["step_time_s"].tolist()


def test_longer_context_lowers_the_speedup_under_unfused_attention():
    # Medusa's reference code (unfused attention) loses speedup at longer contexts (Cai et al.
    # 2024, Appendix G); so does an engine that verifies candidates without tree attention
    tau = np.concatenate(([1.0], 1 + 0.5 * np.log1p(np.arange(1, 65))))
    heads = draft_heads_shape(V7, 5)
    unfused = speedup_grid(V7, heads, A100, tau, [1], [128, 2048], attention="unfused").set_index(["context", "nodes"])
    for n in (32, 64):
        assert unfused.loc[(2048, n), "speedup"] < unfused.loc[(128, n), "speedup"]
    proposal = Tree(
        tuple((r,) for r in range(10))
        + tuple((0, r) for r in range(10))
        + tuple((1, r) for r in range(10))
        + tuple((0, 0, r) for r in range(10))
        + tuple((0, 1, r) for r in range(10))
        + tuple((1, 0, r) for r in range(10))
        + tuple((0, 0, 0, r) for r in range(4))
    )
    cand = speedup_grid(V7, heads, A100, tau, [1], [128, 2048], verification="candidates", tree=proposal).set_index(
        ["context", "nodes"]
    )
    for n in (16, 32, 64):
        assert cand.loc[(2048, n), "speedup"] < cand.loc[(128, n), "speedup"]


# ---- memory capacity ---------------------------------------------------------------------


def test_capacity_is_the_binary_gigabytes_printed_on_the_datasheet():
    assert A100.capacity_bytes == 85899345920 and A100.capacity_gib == 80.0
    # Vicuna-7B fp16, 16 x 8192 tokens: 13476831232 B of weights + 16 x 8193 x 524288 B of KV
    # + the logits 16 x 32000 x 2 = 82205720576 B: above 80e9, below 80 GiB; it fits
    need = float(memory_required_bytes(V7, None, batch=16, tokens=1, context=8192))
    assert need == 13476831232 + 16 * 8193 * 524288 + 16 * 32000 * 2
    assert np.isfinite(step_time_s(V7, None, A100, batch=16, tokens=1, context=8192))
    assert A100.capacity_text() == "80 GiB (sold as 80 GB)"
    # 32 x 8192: 12.55 GiB of weights + 32 x 8193 x 0.5 MiB = 128.02 GiB of KV cache + 2 MB of logits
    with pytest.raises(UserError, match=r"needs 140\.6 GiB .* has 80 GiB \(sold as 80 GB\)"):
        step_time_s(V7, None, A100, batch=32, tokens=1, context=8192, on_oom="raise")


# ---- fitting -----------------------------------------------------------------------------

TRUE = {
    "eta_memory": 0.7,
    "forward_overhead_s": 1e-3,
    "spec_step_overhead_s": 2.5e-3,
    "verified_token_s": 7e-5,
    "gemm_efficiency_scale": 0.8,
    "attention_kv_short": 0.33,
}


def synthetic_steps(terms=TRUE, batches=(1, 2, 4), contexts=(64, 2048), tokens=(1, 4, 16, 64, 128)):
    b, s, q = np.meshgrid(batches, contexts, tokens, indexing="ij")
    frame = pd.DataFrame({"batch": b.ravel(), "context": s.ravel(), "tokens": q.ravel(), "step_ms": 1.0})
    truth = apply_terms(A100, terms, (1.0, 2.0))
    frame["step_ms"] = predict_step_s(V7, None, truth, step_points_frame(frame, source="synthetic")) * 1e3
    return frame


def test_fit_recovers_the_terms_it_was_generated_from():
    points = step_points_frame(synthetic_steps(), source="synthetic")
    assert set(identifiable_terms(points, V7)) == set(TRUE)
    fit = fit_profile(V7, None, A100, points, leave_one_out=False)
    for name, value in TRUE.items():
        assert fit.terms[name] == pytest.approx(value, rel=0.01), name
    assert np.max(np.abs(fit.in_sample_error)) < 1e-3
    assert fit.profile.spec_step_overhead_s == pytest.approx(2.5e-3, rel=0.01)
    assert fit.profile.attention_kv_fraction(2048.0) == pytest.approx(0.33, rel=0.01)
    # the fitted profile still says where its row curve came from, and that the fit scaled it
    assert fit.profile.gemm_efficiency_source.startswith(A100.gemm_efficiency_source)
    assert fit.profile.gemm_efficiency_source.endswith("scaled by 0.8 to the measured steps (treeopt hw fit)")


def test_fit_is_robust_to_one_outlier_row():
    frame = synthetic_steps()
    frame.loc[3, "step_ms"] *= 1.5  # batch 1, context 64, 64 tokens: one disturbed measurement
    fit = fit_profile(V7, None, A100, step_points_frame(frame, source="synthetic"), leave_one_out=False)
    for name in ("spec_step_overhead_s", "verified_token_s", "attention_kv_short"):
        assert fit.terms[name] == pytest.approx(TRUE[name], rel=0.1), name
    # the outlier stands out instead of being spread over the other rows
    assert int(np.argmax(np.abs(fit.in_sample_error))) == 3
    assert np.median(np.abs(fit.in_sample_error)) < 0.02


def test_plain_rows_alone_fix_no_speculative_term():
    frame = synthetic_steps(tokens=(1,))
    assert identifiable_terms(step_points_frame(frame, source="s"), V7) == (
        "eta_memory",
        "forward_overhead_s",
        "attention_kv_short",
    )


def test_fit_and_predict_commands(tmp_path, capsys):
    steps = tmp_path / "steps.csv"
    synthetic_steps().to_csv(steps, index=False)
    profile = tmp_path / "engine.json"
    with pytest.raises(SystemExit) as bad:
        main(
            [
                "hw",
                "fit",
                "--model",
                "vicuna-7b",
                "--hardware",
                "a100",
                "--measurements",
                str(tmp_path / "none.csv"),
                "-o",
                str(profile),
            ]
        )
    assert bad.value.code == 2
    main(["hw", "fit", "--model", "vicuna-7b", "--hardware", "a100", "--measurements", str(steps), "-o", str(profile)])
    out = capsys.readouterr().out
    assert "leave-one-out: median |error|" in out and "spec_step_overhead_s" in out
    saved = json.loads(profile.read_text())
    assert saved["spec_step_overhead_s"] == pytest.approx(2.5e-3, rel=0.01)
    points = tmp_path / "points.csv"
    pd.DataFrame({"batch": [1, 8], "context": [64, 512], "tokens": [1, 9], "candidates": [1, 3]}).to_csv(
        points, index=False
    )
    predicted = tmp_path / "predicted.csv"
    main(
        [
            "roofline",
            "predict",
            "--model",
            "vicuna-7b",
            "--hardware",
            str(profile),
            "--points",
            str(points),
            "-o",
            str(predicted),
        ]
    )
    got = pd.read_csv(predicted)
    hw = load_hardware(str(profile))
    expect = [
        step_time_s(V7, None, hw, batch=1, tokens=1, context=64) * 1e3,
        step_time_s(V7, None, hw, batch=8, tokens=9, context=512, candidates=3) * 1e3,
    ]
    assert got["predicted_step_ms"].tolist() == pytest.approx(expect, rel=1e-5)


def test_bad_measurements_are_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("batch,context,tokens,step_ms,candidates\n1,64,4,10.0,5\n")
    with pytest.raises(UserError, match="row 1: 'candidates' exceeds 'tokens'"):
        read_step_points(bad)
    bad.write_text("batch,context,step_ms\n1,64,10.0\n")
    with pytest.raises(UserError, match="missing column 'tokens'"):
        read_step_points(bad)


def test_hw_calibrate_fits_only_the_engine_terms_from_the_decoders_steps(tmp_path):
    """`hw calibrate` times tree steps of treeopt's own decoder and frees only the engine terms:
    everything the microbenchmarks measured stays as measured."""
    from calibration.models import load_model, tiny_model_for_tests
    from roofline.hardware import load_hardware
    from treeopt.app.hwcalibrate import ENGINE_TERMS, calibrate_engine_terms

    lm = load_model(str(tiny_model_for_tests(tmp_path / "tiny")), device="cpu", dtype="float32")
    base = load_hardware("a100")
    fit = calibrate_engine_terms(lm, base, batches=(1,), context=16, sizes=(0, 1, 2, 4), repeats=3)
    assert set(fit.terms) == set(ENGINE_TERMS) and all(v >= 0 for v in fit.terms.values())
    for kept in ("eta_memory", "eta_compute", "bandwidth_bytes_per_s", "forward_overhead_s", "layer_overhead_s"):
        assert getattr(fit.profile, kept) == getattr(base, kept), kept
    assert fit.profile.calibration["fit"]["rows"] == 4  # plain decoding and three tree sizes
