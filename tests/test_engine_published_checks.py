"""The engine presets against published measurements they were not fitted on
(docs/performance-model.md#engine-presets, `python benchmarks/bench_published_steps.py` parts (d)
and (e)): chains against trees on one vLLM backend, SGLang's chains and trees of an MoE beside plain
decoding, TensorRT-LLM's EAGLE-3 chain beside plain decoding, and vLLM's speedups per batch.

Every measured number is typed here from its source (the data file holds the same, which one test
checks); the predictions come from the latency model with the preset, and what is asserted is what
the measurement says (which configuration was cheapest per token), never a value the code computed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from roofline.engine_presets import fitted_tables, step_costs
from roofline.hardware import load_hardware
from roofline.latency import step_time_s
from roofline.published_steps import DATA_FILE, published_tables
from roofline.shapes import model_shape
from roofline.step_shape import StepShape

ROOT = Path(__file__).resolve().parents[1]

# vLLM PR #22752 (github.com/vllm-project/vllm/pull/22752), mt-bench, chain against tree on the Tree
# Attention backend, Llama-3.1-8B with EAGLE-1: output token throughput and mean acceptance length
PR22752_BATCHES = (1, 8, 16)
PR22752_CHAIN = ((114.27, 847.38, 1567.5), (2.05, 2.06, 2.05))
PR22752_TREE = ((128.63, 902.72, 1640.95), (2.37, 2.37, 2.38))

# SpecForge issue #339 (github.com/sgl-project/SpecForge/issues/339): Qwen3-30B-A3B on two H100s (TP 2)
# in SGLang with an EAGLE-3 draft; (steps, topk, num_draft): (throughput tok/s, acceptance length)
ISSUE339_PLAIN = {1: 222.47, 4: 566.21}
ISSUE339 = {
    1: {
        (3, 1, 4): (159.78, 1.86),
        (3, 3, 8): (172.99, 2.20),
        (3, 3, 4): (207.62, 1.99),
        (7, 4, 16): (191.90, 2.52),
        (6, 4, 12): (171.54, 2.42),
        (8, 8, 60): (177.5, 3.2),
    },
    4: {(3, 1, 4): (447.90, 1.86), (3, 3, 8): (426.46, 2.27)},
}

# Tencent/AngelSlim issue #163 (github.com/Tencent/AngelSlim/issues/163): Qwen3-30B-A3B on four H100s (TP 4)
# in SGLang (through SpecForge) with an EAGLE-3 draft; plain throughput (tok/s) per batch, and
# (steps, topk, num_draft): (throughput tok/s, acceptance length) per batch
ISSUE163_PLAIN = {1: 218.89, 4: 507.49, 8: 677.14, 32: 1128.30, 64: 1237.84}
ISSUE163 = {
    1: {
        (3, 3, 4): (170.35, 2.017),
        (3, 2, 8): (185.28, 2.216),
        (4, 4, 16): (185.64, 2.542),
        (7, 10, 64): (193.31, 3.034),
    },
    4: {(4, 4, 16): (476.37, 2.556)},
    8: {(4, 4, 16): (673.14, 2.578)},
    32: {(4, 4, 16): (927.11, 2.560)},
    64: {(4, 4, 16): (1307.95, 2.553)},
}

# SGLang PR #5318 (github.com/sgl-project/sglang/pull/5318): Llama-3.1-8B, one request (send_one), CUDA graphs
# and torch.compile; (throughput tok/s, acceptance length) of No Spec, 314 (chain) and 548 (tree)
PR5318 = {"plain": (148.66, 1.00), (3, 1, 4): (214.14, 2.12), (5, 4, 8): (204.46, 2.56)}

# SGLang PR #4716 (github.com/sgl-project/sglang/pull/4716): Llama-3.3-70B on eight H100s (TP 8), MT-Bench,
# bench_sglang_eagle.py at batch 1; (throughput tok/s, acceptance length) without speculation and with
# EAGLE-3's tree of 8 steps, topk 8, 64 draft tokens
PR4716_PLAIN = (88.61, 1.00)
PR4716_TREE = (234.54, 5.88)

# SpecForge's SpecBundle dashboard (github.com/sgl-project/SpecForge, docs/spec_bundle/public/raw_data/data.json,
# PR #382, December 2025): SGLang 0.5.6 on H200s, MT-Bench, SpecForge's own EAGLE-3 drafters; (steps, topk,
# num_draft): (output tok/s, accept_length), (0, 0, 0) the run without EAGLE-3. Llama-3.1-8B at batch 1 on one
# GPU, Llama-3.3-70B at batch 8 on four (TP 4, from the dashboard's earlier sheet)
SPECBUNDLE_8B = {
    (0, 0, 0): (189.98, 1.0),
    (3, 1, 4): (404.25, 2.8981),
    (5, 1, 6): (446.64, 3.5164),
    (5, 3, 6): (346.47, 3.0061),
    (7, 1, 8): (450.03, 3.8558),
    (7, 4, 8): (308.01, 2.9382),
}
SPECBUNDLE_70B = {
    (0, 0, 0): (540.46, 1.0),
    (3, 1, 4): (1238.47, 2.9607),
    (5, 1, 6): (1409.51, 3.6175),
    (5, 3, 6): (1108.31, 3.2249),
    (7, 1, 8): (1440.37, 3.9779),
    (7, 4, 8): (1033.77, 3.2422),
}
# SpecForge's SpecBundle dashboard, Qwen3-30B-A3B-Instruct-2507 at batch 8 on H200s (TP 4 taken: the
# run's parallel configuration is not printed), MT-Bench, drafter QiaolingChen/Sglang-eagle3-Qwen3-30B-A3B-
# Instruct-2507; held out (no preset term is fitted on it)
SPECBUNDLE_QWEN3_30B = {
    (0, 0, 0): (1341.35, 1.0),
    (3, 1, 4): (2048.69, 2.4958),
    (5, 1, 6): (2086.12, 2.8311),
    (5, 3, 6): (1698.42, 2.5572),
    (7, 1, 8): (1998.16, 2.9819),
    (7, 4, 8): (1742.98, 2.7422),
}
# the same dashboard, Llama-4-Scout-17B-16E-Instruct at batch 8 on eight H200s (TP 8, the dashboard's
# earlier sheet), MT-Bench, drafter frankleeeee/SGLangg-EAGLE3-Llama-4-Scout-17B-16E-Instruct-perfect-blend-
# regenerated; its plain run (502.10 tok/s) is not held (a step longer than 3-1-4's whole speculative step)
SPECBUNDLE_SCOUT_PLAIN_TOK_S = 502.10
SPECBUNDLE_SCOUT = {
    (3, 1, 4): (1302.38, 2.4914),
    (5, 1, 6): (1312.40, 2.8364),
    (5, 3, 6): (967.13, 2.3256),
    (7, 1, 8): (1276.96, 3.0189),
    (7, 4, 8): (1010.41, 2.7008),
}

# vLLM PR #16035 (github.com/vllm-project/vllm/pull/16035): EAGLE-1 chains on Llama-3-8B at batch 1,
# MT-Bench, offline; K draft tokens: (output tok/s, acceptance length), K = 0 vanilla
PR16035 = {0: (128.64, 1.0), 2: (175.49, 1.89), 4: (165.65, 2.08)}

# SPEED-Bench (Abramovich et al. 2026, arXiv 2604.09557): Llama-3.3-70B on one B200 in TensorRT-LLM,
# EAGLE-3 chains of 3. Table 10 at batch 16: (ISL, AL, actual speedup) for high and low entropy prompts,
# and the step latencies t_ar, t_sd (ms) per ISL; Table 1 at batch 32: (mean AL, mean speedup)
SPEED_T10 = [
    (1024, 2.12, 1.63),
    (1024, 2.93, 2.23),
    (2048, 1.86, 1.39),
    (2048, 2.59, 1.91),
    (8192, 1.17, 0.85),
    (8192, 1.19, 0.87),
]
SPEED_T10_STEPS = {1024: (19.6, 25.9), 2048: (20.4, 27.5), 8192: (25.2, 34.1)}
SPEED_T1 = {"eagle3": (2.44, 1.90), "ngram": (1.41, 0.88)}
# Table 1, DeepSeek R1 on eight B200s (TP 8), MTP chains of 3 at batch 32: (mean AL, mean speedup)
SPEED_T1_MTP = (2.55, 1.45)

# EAGLE-3 paper (Li et al. 2025, arXiv 2503.01840), Table 5: vLLM, chains of 2, speedup per batch
TABLE5_BATCHES = (2, 4, 8, 16, 24, 32, 48, 56)
TABLE5_EAGLE3 = (1.75, 1.68, 1.58, 1.49, 1.42, 1.36, 1.21, 1.01)


def _steps(engine, drafter, hardware, shape, batch, tokens, stages, tp=1, context=512, trees=False):
    """Predicted step times (s) of each (tokens, stages) at one batch with the engine's preset;
    trees: which configurations verify a branching tree (SGLang: topk > 1)."""
    hw = step_costs(load_hardware(hardware), engine=engine, drafter=drafter).profile
    step = StepShape(
        batch,
        np.asarray(tokens),
        context,
        draft_stages=np.asarray(stages),
        tensor_parallel_gpus=tp,
        tree_verify=np.asarray(trees),
    )
    return np.asarray(step_time_s(model_shape(shape), None, hw, step), dtype=float)


def test_the_vllm_preset_prices_a_tree_against_a_chain_as_vllm_measured():
    """The 9-token tree of 2 levels against the chain of 2 (3 tokens), both 2 draft forwards: the
    tree's step over the chain's within 15% at the median, the tree called cheaper per token where
    it was by more than 5% (batches 1 and 8), and the structure the preset picks never costs more
    than 5% per token over the measured best (at one batch, cost per token is 1 / throughput)."""
    errors = []
    for i, b in enumerate(PR22752_BATCHES):
        (tc, lc), (tt, lt) = (PR22752_CHAIN[0][i], PR22752_CHAIN[1][i]), (PR22752_TREE[0][i], PR22752_TREE[1][i])
        # both on the tree's own attention path (TREE_ATTN), so both pay the carried tree term
        chain, tree = _steps("vllm", "eagle", "h100-sxm", "llama-3-8b", b, [3, 9], [2, 2], trees=[True, True])
        measured = (lt / tt) / (lc / tc)  # tree step over chain step: b x L / throughput each
        errors.append(tree / chain / measured - 1)
        tree_picked = tree / lt < chain / lc
        picked, best = (tt if tree_picked else tc), max(tt, tc)
        assert best / picked - 1 <= 0.05
        if tt / tc - 1 > 0.05:  # batches 1 and 8: the tree measured 12.6% and 6.5% faster
            assert tree_picked
    assert np.median(np.abs(errors)) <= 0.15


def test_the_sglang_preset_calls_speculation_off_for_the_moe_as_measured():
    """Qwen3-30B-A3B on two H100s: every chain and tree measured slower than plain decoding at
    batches 1 and 4, and the preset prices every one of them above plain decoding per token;
    the step ratios T/T(plain) within 15% at the median over the 8 configurations (12.3% with
    SGLang's own EAGLE-3 drafting, 0.35 ms a depth and 0.86 ms a step fitted on SpecBundle's 8B
    chains; 17.9% with vLLM's 0.75 ms a depth carried, 15% before the trees paid
    tree_verify_layer_s, which prices the small trees high: the 3-3-4 tree measured 18% cheaper
    than its chain, the recorded miss of docs/performance-model.md#engine-presets)."""
    errors = []
    for b, configs in ISSUE339.items():
        plain_thr = ISSUE339_PLAIN[b]
        steps, stages = [1] + [c[2] for c in configs], [0] + [c[0] for c in configs]
        trees = [False] + [c[1] > 1 for c in configs]
        predicted = _steps("sglang", "eagle3", "h100-sxm", "qwen3-30b-a3b", b, steps, stages, tp=2, trees=trees)
        for (thr, length), step in zip(configs.values(), predicted[1:], strict=True):
            assert thr < plain_thr  # measured: off
            assert step / predicted[0] / length > 1  # predicted: off, per token
            errors.append((step / predicted[0]) / (length * plain_thr / thr) - 1)
    assert len(errors) == 8
    assert np.median(np.abs(errors)) <= 0.15


def test_the_sglang_preset_misses_angelslims_moe_trees_at_tp4_as_recorded():
    """AngelSlim issue #163: Qwen3-30B-A3B on four H100s, EAGLE-3 trees beside plain decoding at
    batches 1-64. Each step over the plain step is L x plain throughput / throughput. Recorded, not
    fitted (held out). Every configuration is a tree (topk > 1) and pays tree_verify_layer_s (48
    layers): at batch 4 the preset prices the 4-4-16 tree 5-15% above the measured 2.72 (8.7% with
    SGLang's own EAGLE-3 drafting fitted on SpecBundle's chains; 15.3% with vLLM's carried; within 5%
    before the tree term); at batch 64 it calls speculation on, as measured (1307.95 against 1237.84
    tok/s); at batch 32 it prices the tree's step (measured 3.12 plain steps) more than 35% low and
    calls speculation on where plain decoding measured cheaper per token (927.11 against 1128.30
    tok/s), the one confident call that misses, at a batch whose plain step measured 3.5 times the
    preset's (set aside as outside the priced regime, below). At batch 1 every tree measured slower
    than plain decoding per token."""
    ratio = {}
    for b, configs in ISSUE163.items():
        plain_thr = ISSUE163_PLAIN[b]
        steps, stages = [1] + [c[2] for c in configs], [0] + [c[0] for c in configs]
        trees = [False] + [True] * len(configs)
        predicted = _steps("sglang", "eagle3", "h100-sxm", "qwen3-30b-a3b", b, steps, stages, tp=4, trees=trees)
        for key, (thr, length), step in zip(configs, configs.values(), predicted[1:], strict=True):
            measured = length * plain_thr / thr
            ratio[b, key] = (step / predicted[0], measured, length)
    tree = (4, 4, 16)
    assert 0.05 <= ratio[4, tree][0] / ratio[4, tree][1] - 1 <= 0.15
    assert ratio[64, tree][0] / ratio[64, tree][2] < 1 and ISSUE163[64][tree][0] > ISSUE163_PLAIN[64]
    assert ratio[32, tree][0] / ratio[32, tree][1] - 1 < -0.35
    assert ratio[32, tree][0] / ratio[32, tree][2] < 1 and ISSUE163[32][tree][0] < ISSUE163_PLAIN[32]
    assert all(thr < ISSUE163_PLAIN[1] for thr, _ in ISSUE163[1].values())
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    table = raw["angelslim-issue-163"]
    assert table["configs"]["plain"]["throughput_tok_s"] == [ISSUE163_PLAIN[b] for b in table["batches"]]
    assert table["configs"]["tree 4-4-16"]["acceptance_length"] == [ISSUE163[b][tree][1] for b in table["batches"]]
    assert table["configs"]["tree 7-10-64"]["throughput_tok_s"][0] == ISSUE163[1][(7, 10, 64)][0]
    assert (table["setup"]["tensor_parallel"], table["setup"]["shape"]) == (4, "qwen3-30b-a3b")


def test_the_sglang_preset_on_sglangs_chain_and_tree_of_llama_8b_at_batch_1():
    """SGLang PR #5318: plain decoding, the chain (3, 1, 4) and the tree (5, 4, 8) for one request.
    Each step over the plain step is L x 148.66 / throughput: 1.47 and 1.86. The sglang preset
    within 20% of each, both low (14% and 19%: SGLang's own drafting, fitted on SpecBundle's SGLang
    0.5.6 chains on an H200, is cheaper than this April 2025 build's; 11% and 18% with vLLM's
    carried 0.75 ms a depth), both priced cheaper per token than plain
    decoding (speculation on, as measured), and chain against tree within the stored call
    resolution of each other per token, in the preset as in the measurement (214.14 against
    204.46 tok/s: 4.7%): a close call, which the model does not make."""
    plain_thr = PR5318["plain"][0]
    chain, tree = PR5318[(3, 1, 4)], PR5318[(5, 4, 8)]
    plain_s, chain_s, tree_s = _steps(
        "sglang", "eagle3", "h100-sxm", "llama-3-8b", 1, [1, 4, 8], [0, 3, 5], context=256, trees=[False, False, True]
    )
    errors = [
        chain_s / plain_s / (chain[1] * plain_thr / chain[0]) - 1,
        tree_s / plain_s / (tree[1] * plain_thr / tree[0]) - 1,
    ]
    assert max(map(abs, errors)) <= 0.20 and max(errors) < 0
    assert chain_s / plain_s / chain[1] < 1 and tree_s / plain_s / tree[1] < 1
    resolution = json.loads((ROOT / "roofline" / "data" / "call_resolution.json").read_text(encoding="utf-8"))[
        "fraction"
    ]
    per_token = (chain_s / chain[1], tree_s / tree[1])
    assert max(per_token) / min(per_token) - 1 < resolution
    assert chain[0] / tree[0] - 1 < resolution
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    configs = raw["sglang-pr-5318"]["configs"]
    assert (configs["chain 3-1-4"]["throughput_tok_s"][0], configs["chain 3-1-4"]["acceptance_length"][0]) == chain
    assert (configs["tree 5-4-8"]["throughput_tok_s"][0], configs["tree 5-4-8"]["acceptance_length"][0]) == tree
    assert configs["plain"]["throughput_tok_s"] == [plain_thr]


def test_the_trtllm_preset_predicts_tensorrt_llms_published_eagle3_chain():
    """TensorRT-LLM PR #5146: Llama-3.3-70B, EAGLE-3 chains of 3, eight H200s, concurrency 4,
    acceptance length 1.83 at 1.26x tokens per second per user: T(chain)/T(plain) = 1.83 / 1.26.
    The trtllm preset (vLLM's terms, carried) within 15%, where the ideal engine misses by more
    than 25%, and speculation called on, as measured."""
    measured = 1.83 / 1.26
    plain, chain = _steps("trtllm", "eagle3", "h200", "llama-3-70b", 4, [1, 4], [0, 3], tp=8, context=1024)
    assert abs(chain / plain / measured - 1) <= 0.15
    ideal_plain, ideal_chain = _steps("ideal", "eagle3", "h200", "llama-3-70b", 4, [1, 4], [0, 3], tp=8, context=1024)
    assert abs(ideal_chain / ideal_plain / measured - 1) > 0.25
    assert chain / plain < 1.83  # on: a token costs less than a plain step


def test_the_sglang_preset_underprices_sglangs_64_token_tree_at_tp8_by_the_recorded_miss():
    """SGLang PR #4716: a 64-token EAGLE-3 tree (8 draft forwards of topk 8) on Llama-3.3-70B over
    eight H100s at batch 1 ran 25.07 ms a step (5.88 x 1000 / 234.54) against 11.29 ms plain
    (1000 / 88.61): T(tree)/T(plain) = 2.22. The plain step is priced within 5%; the sglang preset
    (SGLang's own EAGLE-3 drafting, 0.35 ms a depth and 0.86 ms a step fitted on SpecBundle's 8B
    chains on one GPU, and its tree_verify_layer_s, 80 layers x 31.8 us = 2.5 ms) prices the tree
    15-25% low (19.9%; 10.3% with vLLM's 0.75 ms a depth carried), the recorded
    miss of docs/performance-model.md#engine-presets (the ideal engine: more than 40% low);
    speculation is still called on, as measured (2.65x)."""
    plain_ms, tree_ms = 1e3 / PR4716_PLAIN[0], 1e3 * PR4716_TREE[1] / PR4716_TREE[0]
    plain, tree = _steps("sglang", "eagle3", "h100-sxm", "llama-3-70b", 1, [1, 64], [0, 8], tp=8, trees=[False, True])
    assert abs(1e3 * plain / plain_ms - 1) <= 0.05
    error = (tree / plain) / (tree_ms / plain_ms) - 1
    assert -0.25 <= error <= -0.15
    ideal_plain, ideal_tree = _steps("ideal", "eagle3", "h100-sxm", "llama-3-70b", 1, [1, 64], [0, 8], tp=8)
    assert (ideal_tree / ideal_plain) / (tree_ms / plain_ms) - 1 < -0.40
    assert tree / plain / PR4716_TREE[1] < 1  # on: a token of the tree costs less than a plain step
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    configs = raw["sglang-pr-4716"]["configs"]
    assert (configs["plain"]["throughput_tok_s"][0], configs["plain"]["acceptance_length"][0]) == PR4716_PLAIN
    assert (
        configs["tree 8-8-64"]["throughput_tok_s"][0],
        configs["tree 8-8-64"]["acceptance_length"][0],
    ) == PR4716_TREE
    assert (configs["tree 8-8-64"]["verified_tokens"], configs["tree 8-8-64"]["draft_stages"]) == (64, 8)


def _specbundle(configs, hardware, shape, batch, tp):
    """Measured and predicted (sglang preset) steps over the plain step, in the order of configs;
    measured: L x plain throughput / throughput (a step of b sequences yields b x L tokens)."""
    plain_thr = configs[(0, 0, 0)][0]
    measured = np.array([length * plain_thr / thr for thr, length in configs.values()])
    tokens, stages = [c[2] if c[0] else 1 for c in configs], [c[0] for c in configs]
    trees = [c[1] > 1 for c in configs]
    predicted = _steps("sglang", "eagle3", hardware, shape, batch, tokens, stages, tp=tp, trees=trees)
    return measured, predicted / predicted[0], predicted[0]


def _tree_minus_chain_s(configs, batch, layers):
    """Per target layer, the measured steps of SpecBundle's trees 5-3-6 and 7-4-8 minus those of
    the chains 5-1-6 and 7-1-8 (step = batch x L / throughput)."""
    step = {c: batch * length / thr for c, (thr, length) in configs.items()}
    return [(step[(5, 3, 6)] - step[(5, 1, 6)]) / layers, (step[(7, 4, 8)] - step[(7, 1, 8)]) / layers]


#: the sglang preset's tree_verify_layer_s, the mean of the four pairs per layer, typed from the dashboard
SPECBUNDLE_TREE_LAYER_S = float(
    np.mean(_tree_minus_chain_s(SPECBUNDLE_8B, 1, 32) + _tree_minus_chain_s(SPECBUNDLE_70B, 8, 80))
)


def test_the_sglang_preset_on_specbundles_8b_chains_and_trees_on_one_h200():
    """SpecBundle, Llama-3.1-8B on one H200 at batch 1 (a FITTED table: the sglang preset's
    tree_verify_layer_s is fitted on its trees minus chains and the 70B table's): every configuration
    measured faster per token than plain decoding (404-450 and 308-346 tok/s against 189.98) and
    called so; the step ratios within 15% at the median. The tree 5-3-6 verifies as many tokens
    after as many draft forwards as the chain 5-1-6, yet its step is (3.0061 / 346.47) / (3.5164 /
    446.64) = 1.102 times the chain's, and 7-4-8's (2.9382 / 308.01) / (3.8558 / 450.03) = 1.113
    times 7-1-8's: SGLang's topk > 1 path, which the preset prices as 32 layers x the mean per layer
    of the four SpecBundle pairs. The chains fit SGLang's EAGLE-3 drafting (a line through their steps
    against depth, tests/test_engine_presets.py): 7-1-8's step over 3-1-4's measured (3.8558 /
    450.03) / (2.8981 / 404.25) = 1.195 for four more depths, the preset within 2% of it (over 1.3
    with vLLM's 0.75 ms a depth carried), and every step ratio within 3% at the median."""
    configs = SPECBUNDLE_8B
    measured, predicted, plain_s = _specbundle(configs, "h200", "llama-3-8b", 1, 1)
    errors = predicted[1:] / measured[1:] - 1
    assert np.median(np.abs(errors)) <= 0.03
    lengths = np.array([length for _, length in configs.values()])
    assert np.all(measured[1:] < lengths[1:]) and np.all(predicted[1:] < lengths[1:])  # on, as measured
    chain5, tree5, chain7, tree7 = (list(configs).index(c) for c in ((5, 1, 6), (5, 3, 6), (7, 1, 8), (7, 4, 8)))
    assert measured[tree5] / measured[chain5] == pytest.approx((3.0061 / 346.47) / (3.5164 / 446.64))
    assert measured[tree5] / measured[chain5] > 1.08 and measured[tree7] / measured[chain7] > 1.08
    for tree, chain in ((tree5, chain5), (tree7, chain7)):
        assert (predicted[tree] - predicted[chain]) * plain_s == pytest.approx(32 * SPECBUNDLE_TREE_LAYER_S, rel=1e-3)
    chain3 = list(configs).index((3, 1, 4))
    assert measured[chain7] / measured[chain3] == pytest.approx(1.195, abs=1e-3)
    assert predicted[chain7] / predicted[chain3] == pytest.approx(measured[chain7] / measured[chain3], rel=0.02)


def test_the_sglang_preset_on_specbundles_70b_at_tp4_and_the_forward_it_overprices():
    """SpecBundle, Llama-3.3-70B on four H200s (TP 4) at batch 8: the step ratios within 15% at the
    median and speculation called on, as measured; the trees cost 1.134 and 1.136 times the chains
    of equal counts ((3.2249 / 1108.31) / (3.6175 / 1409.51) and (3.2422 / 1033.77) / (3.9779 /
    1440.37)), more than on one GPU at 8B. The measured best per token is the chain 7-1-8 (1440.37
    tok/s), whose whole step is (3.9779 / 1440.37) / (2.9607 / 1238.47) = 1.155 times 3-1-4's; the
    ideal engine's forward alone, verifying 64 rows against 32, is priced above 1.4 times: the H200
    row curve's step near 64 rows (docs/performance-model.md), not an engine term, is what makes
    the preset pick the chain of 3 (16% dearer per token, the benchmark's FAIL on this table)."""
    configs = SPECBUNDLE_70B
    measured, predicted, plain_s = _specbundle(configs, "h200", "llama-3-70b", 8, 4)
    assert np.median(np.abs(predicted[1:] / measured[1:] - 1)) <= 0.15
    lengths = np.array([length for _, length in configs.values()])
    assert np.all(measured[1:] < lengths[1:]) and np.all(predicted[1:] < lengths[1:])
    order = list(configs)
    chain3, chain5, tree5, chain7, tree7 = (
        order.index(c) for c in ((3, 1, 4), (5, 1, 6), (5, 3, 6), (7, 1, 8), (7, 4, 8))
    )
    assert measured[tree5] / measured[chain5] > 1.1 and measured[tree7] / measured[chain7] > 1.1
    # the trees pay 80 layers x the preset's tree term, once a step under TP 4 (a FITTED table too)
    assert (predicted[tree5] - predicted[chain5]) * plain_s == pytest.approx(80 * SPECBUNDLE_TREE_LAYER_S, rel=1e-3)
    assert max(configs, key=lambda c: configs[c][0]) == (7, 1, 8)
    assert measured[chain7] / measured[chain3] == pytest.approx((3.9779 / 1440.37) / (2.9607 / 1238.47))
    ideal = _steps("ideal", "eagle3", "h200", "llama-3-70b", 8, [4, 8], [3, 7], tp=4)
    assert ideal[1] / ideal[0] > 1.4 > measured[chain7] / measured[chain3]
    per_token = predicted[1:] / lengths[1:]
    assert order[1 + int(np.argmin(per_token))] == (3, 1, 4)  # the preset's pick, the recorded miss


def test_the_sglang_preset_calls_a_chain_for_specbundles_moe_as_measured_but_overprices_its_steps():
    """SpecBundle, Qwen3-30B-A3B at batch 8 on four H200s (held out; TP 4 taken, not printed): every
    configuration measured cheaper per token than plain decoding, and priced so (with vLLM's 0.75 ms
    a depth carried the preset priced both trees dearer per token than plain decoding), and the best
    per token a chain
    (5-1-6 at 2086.12 tok/s, 19.7% more tokens per second than the best tree, 7-4-8 at 1742.98).
    The preset calls both as measured: speculation on, and a chain, its cheapest chain and tree
    farther apart per token than the stored call resolution (a confident call). Its steps over plain
    decoding are too dear, above 15% at the median (15.6% with SGLang's own EAGLE-3 drafting fitted
    on SpecBundle's 8B chains, 34.1% with vLLM's carried; 2.4958 x 1341.35 / 2048.69 = 1.634
    measured for 3-1-4; the benchmark's FAIL on this table). The trees cost more than the chains of equal counts,
    (2.5572 / 1698.42) / (2.8311 / 2086.12) = 1.109 and (2.7422 / 1742.98) / (2.9819 / 1998.16) =
    1.054 times, but per target layer (48) less than the low end of the sglang preset's fitted range
    (25.1 us): 24.7 and 13.5 us."""
    configs = SPECBUNDLE_QWEN3_30B
    measured, predicted, plain_s = _specbundle(configs, "h200", "qwen3-30b-a3b", 8, 4)
    order = list(configs)
    lengths = np.array([length for _, length in configs.values()])
    assert measured[order.index((3, 1, 4))] == pytest.approx(2.4958 * 1341.35 / 2048.69)
    assert np.all(measured[1:] < lengths[1:]) and min(predicted[1:] / lengths[1:]) < 1  # on, as measured
    assert np.all(predicted[1:] < lengths[1:])  # every configuration priced cheaper per token, as measured
    assert np.median(np.abs(predicted[1:] / measured[1:] - 1)) > 0.15  # the recorded miss
    resolution = json.loads((ROOT / "roofline" / "data" / "call_resolution.json").read_text(encoding="utf-8"))[
        "fraction"
    ]
    chains = [i for i, c in enumerate(order) if c[0] and c[1] == 1]
    trees = [i for i, c in enumerate(order) if c[1] > 1]
    for per_token in (measured / lengths, predicted / lengths):
        best_chain, best_tree = min(per_token[chains]), min(per_token[trees])
        assert best_chain < best_tree
    predicted_per_token = predicted / lengths
    assert min(predicted_per_token[trees]) / min(predicted_per_token[chains]) - 1 > resolution  # confident
    assert max(configs, key=lambda c: configs[c][0]) == (5, 1, 6)
    assert configs[(5, 1, 6)][0] / configs[(7, 4, 8)][0] == pytest.approx(1.197, abs=1e-3)
    chain5, tree5, chain7, tree7 = (order.index(c) for c in ((5, 1, 6), (5, 3, 6), (7, 1, 8), (7, 4, 8)))
    assert measured[tree5] / measured[chain5] == pytest.approx((2.5572 / 1698.42) / (2.8311 / 2086.12))
    assert measured[tree7] / measured[chain7] == pytest.approx((2.7422 / 1742.98) / (2.9819 / 1998.16))
    per_layer = _tree_minus_chain_s(configs, 8, 48)
    assert per_layer == pytest.approx([24.7e-6, 13.5e-6], abs=0.1e-6)
    assert max(per_layer) < 25.1e-6 < SPECBUNDLE_TREE_LAYER_S


def test_the_sglang_preset_calls_a_chain_for_specbundles_llama_4_scout_at_tp8_as_measured():
    """SpecBundle, Llama 4 Scout (16 experts, top-1, in every layer) at batch 8 on eight H200s (held
    out). The file's plain run is not held: its step, 8 / 502.10 tok/s = 15.93 ms, is longer than
    the chain 3-1-4's whole speculative step, 8 x 2.4914 / 1302.38 = 15.30 ms. Against the chain
    3-1-4 the steps are within 15% at the median. The best per token is a chain (5-1-6, 1312.40
    tok/s, 29.9% more tokens per second than the best tree, 7-4-8 at 1010.41), and the preset calls a
    chain with its cheapest chain and tree farther apart per token than the stored call resolution
    (a confident call), as measured. The trees cost (2.3256 / 967.13) / (2.8364 / 1312.40) = 1.113
    and (2.7008 / 1010.41) / (3.0189 / 1276.96) = 1.131 times the chains of equal counts: 40.6 and
    51.5 us per target layer (48), above the sglang preset's fitted range (25.1-37.5 us)."""
    configs = SPECBUNDLE_SCOUT
    assert 8 / SPECBUNDLE_SCOUT_PLAIN_TOK_S > 8 * 2.4914 / 1302.38  # the plain run not held
    order = list(configs)
    tokens, stages = [c[2] for c in order], [c[0] for c in order]
    trees = [c[1] > 1 for c in order]
    predicted = _steps("sglang", "eagle3", "h200", "llama-4-scout", 8, tokens, stages, tp=8, trees=trees)
    step = np.array([8 * length / thr for thr, length in configs.values()])
    measured, predicted = step / step[0], predicted / predicted[0]
    assert measured[order.index((7, 4, 8))] == pytest.approx((2.7008 / 1010.41) / (2.4914 / 1302.38))
    assert np.median(np.abs(predicted[1:] / measured[1:] - 1)) <= 0.15
    lengths = np.array([length for _, length in configs.values()])
    resolution = json.loads((ROOT / "roofline" / "data" / "call_resolution.json").read_text(encoding="utf-8"))[
        "fraction"
    ]
    chains, tree_rows = [i for i, t in enumerate(trees) if not t], [i for i, t in enumerate(trees) if t]
    for per_token in (measured / lengths, predicted / lengths):
        assert min(per_token[chains]) < min(per_token[tree_rows])
    per_token = predicted / lengths
    assert min(per_token[tree_rows]) / min(per_token[chains]) - 1 > resolution  # confident
    assert max(configs, key=lambda c: configs[c][0]) == (5, 1, 6)
    assert configs[(5, 1, 6)][0] / configs[(7, 4, 8)][0] == pytest.approx(1.299, abs=1e-3)
    per_layer = _tree_minus_chain_s(configs, 8, 48)
    assert per_layer == pytest.approx([40.6e-6, 51.5e-6], abs=0.1e-6)
    assert min(per_layer) > 37.5e-6 > SPECBUNDLE_TREE_LAYER_S


def test_the_specbundle_tables_hold_the_typed_numbers():
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    for table_id, configs, tp, batch in (
        ("specbundle-llama-3.1-8b", SPECBUNDLE_8B, 1, 1),
        ("specbundle-llama-3.3-70b", SPECBUNDLE_70B, 4, 8),
        ("specbundle-qwen3-30b-a3b", SPECBUNDLE_QWEN3_30B, 4, 8),
        ("specbundle-llama-4-scout", SPECBUNDLE_SCOUT, 8, 8),
    ):
        table = raw[table_id]
        assert (table["setup"]["hardware"], table["setup"]["tensor_parallel"], table["batches"]) == (
            "h200",
            tp,
            [batch],
        )
        for (steps, topk, draft), (thr, length) in configs.items():
            name = "plain" if not steps else f"{'chain' if topk == 1 else 'tree'} {steps}-{topk}-{draft}"
            config = table["configs"][name]
            assert (config["throughput_tok_s"], config["acceptance_length"]) == ([thr], [length])
            assert (config["verified_tokens"], config["draft_stages"]) == ((draft, steps) if steps else (1, 0))
    scout = raw["specbundle-llama-4-scout"]
    assert "plain" not in scout["configs"] and "502.10 tok/s" in scout["setup"]["plain_run_not_held"]


def test_the_trtllm_preset_predicts_tensorrt_llms_eagle3_chain_of_llama_4_maverick():
    """TensorRT-LLM PR #5146's second line: NVIDIA's FP8 Llama 4 Maverick with a BF16 EAGLE-3 draft,
    chains of 3, eight H200s, concurrency 4: acceptance length 2.90 at 1.67x tokens per second per
    user, T(chain)/T(plain) = 2.90 / 1.67. The trtllm preset within 15% on this MoE (the ideal
    engine misses by more than 20%), and speculation called on, as measured."""
    measured = 2.90 / 1.67
    hw = step_costs(load_hardware("h200"), engine="trtllm", drafter="eagle3").profile
    ideal = load_hardware("h200")
    step = StepShape(4, np.array([1, 4]), 1024, draft_stages=np.array([0, 3]), tensor_parallel_gpus=8)
    shape = model_shape("llama-4-maverick", dtype="fp8")
    plain, chain = np.asarray(step_time_s(shape, None, hw, step), dtype=float)
    assert abs(chain / plain / measured - 1) <= 0.15
    ideal_plain, ideal_chain = np.asarray(step_time_s(shape, None, ideal, step), dtype=float)
    assert abs(ideal_chain / ideal_plain / measured - 1) > 0.20
    assert chain / plain < 2.90  # on: a token costs less than a plain step
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    table = raw["trtllm-pr-5146-maverick"]
    assert (table["configs"]["chain"]["acceptance_length"], table["configs"]["chain"]["speedup"]) == ([2.90], [1.67])
    assert (table["setup"]["shape"], table["setup"]["shape_dtype"], table["batches"]) == (
        "llama-4-maverick",
        "fp8",
        [4],
    )


def test_the_vllm_preset_picks_vllms_better_chain_length_for_llama_3_8b():
    """vLLM PR #16035: chains of 2 and 4 EAGLE-1 draft tokens beside vanilla decoding at batch 1.
    Each step over the plain step is L(K) x 128.64 / throughput(K): 1.39 and 1.62. The vllm
    preset within 15% at the median, the chain of 2 (the measured faster: 175.49 against 165.65
    tok/s) priced cheaper per token than the chain of 4, and both cheaper than plain decoding."""
    ks = (0, 2, 4)
    predicted = _steps("vllm", "eagle", "h100-sxm", "llama-3-8b", 1, [k + 1 for k in ks], list(ks))
    plain_thr = PR16035[0][0]
    errors = [
        (predicted[i] / predicted[0]) / (PR16035[k][1] * plain_thr / PR16035[k][0]) - 1 for i, k in enumerate(ks) if k
    ]
    assert np.median(np.abs(errors)) <= 0.15
    per_token = [predicted[i] / PR16035[k][1] for i, k in enumerate(ks)]
    assert per_token[1] < per_token[2] < per_token[0]
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    configs = raw["vllm-pr-16035"]["configs"]
    for name, k in (("plain", 0), ("chain 2", 2), ("chain 4", 4)):
        assert (configs[name]["throughput_tok_s"][0], configs[name]["acceptance_length"][0]) == PR16035[k]
        assert (configs[name]["verified_tokens"], configs[name]["draft_stages"]) == (k + 1, k)


def test_the_trtllm_preset_predicts_speed_benchs_eagle3_chains_on_a_b200():
    """SPEED-Bench's Table 10: T(chain)/T(plain) = AL / actual speedup per ISL and entropy (1.30-1.38),
    which the table's own step latencies t_sd / t_ar confirm within 3%; the trtllm preset within 15%
    at the median and on every row, with speculation called off exactly where it measured below 1x
    (ISL 8k). Table 1 at batch 32: mean AL 2.44 at 1.90x, the preset within 15% and on."""
    errors = []
    for context, length, speedup in SPEED_T10:
        t_ar, t_sd = SPEED_T10_STEPS[context]
        measured = length / speedup
        assert abs(measured / (t_sd / t_ar) - 1) <= 0.03
        plain, chain = _steps("trtllm", "eagle3", "b200", "llama-3-70b", 16, [1, 4], [0, 3], context=context)
        errors.append(chain / plain / measured - 1)
        assert (speedup < 1) == (chain / plain > length)  # plain decoding cheaper per token, as measured
    assert np.median(np.abs(errors)) <= 0.15 and np.max(np.abs(errors)) <= 0.15
    length, speedup = SPEED_T1["eagle3"]
    plain, chain = _steps("trtllm", "eagle3", "b200", "llama-3-70b", 32, [1, 4], [0, 3], context=1024)
    assert abs(chain / plain / (length / speedup) - 1) <= 0.15 and chain / plain < length


def test_the_trtllm_preset_prices_speed_benchs_deepseek_r1_mtp_chain():
    """SPEED-Bench's Table 1: DeepSeek-R1 (FP8 taken) on eight B200s, MTP chains of 3 at batch 32,
    2.55 tokens a step at 1.45x: T(chain)/T(plain) = 1.76. The trtllm preset within 15% at the assumed
    1024-token context (13% low; the recorded sensitivity: 18% low at 8192) and speculation on."""
    length, speedup = SPEED_T1_MTP
    hw = step_costs(load_hardware("b200"), engine="trtllm", drafter="mtp").profile
    shape = model_shape("deepseek-v3", dtype="fp8")
    ratios = []
    for context in (1024, 8192):
        step = StepShape(32, np.array([1, 4]), context, draft_stages=np.array([0, 3]), tensor_parallel_gpus=8)
        plain, chain = np.asarray(step_time_s(shape, None, hw, step), dtype=float)
        ratios.append(chain / plain)
    errors = np.array(ratios) / (length / speedup) - 1
    assert abs(errors[0]) <= 0.15 and errors[1] < -0.15
    assert ratios[0] < length
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    chain_config = raw["speed-bench-table1-mtp"]["configs"]["chain"]
    assert (chain_config["acceptance_length"][0], chain_config["speedup"][0]) == SPEED_T1_MTP


def test_the_trtllm_preset_misses_speed_benchs_ngram_chain_as_recorded():
    """SPEED-Bench's Table 1: n-gram chains of 3 at batch 32 ran at 0.88x with 1.41 tokens a step, so
    T(chain)/T(plain) = 1.60 and plain decoding is cheaper per token. The trtllm preset, with its CPU
    n-gram drafter's 1.1 ms per step (TensorRT-LLM PR #19437, not this row), prices the step 15-30% low,
    leaning to speculation: the recorded miss of docs/performance-model.md#engine-presets, not
    refitted (a held-out row)."""
    length, speedup = SPEED_T1["ngram"]
    plain, chain = _steps("trtllm", "ngram", "b200", "llama-3-70b", 32, [1, 4], [0, 3], context=1024)
    error = (chain / plain) / (length / speedup) - 1
    assert -0.30 <= error <= -0.15
    assert speedup < 1 and chain / plain < length  # measured off, predicted on
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    for drafter, (al, sp) in SPEED_T1.items():
        chain_config = raw[f"speed-bench-table1-{drafter}"]["configs"]["chain"]
        assert (chain_config["acceptance_length"], chain_config["speedup"]) == ([al], [sp])
    # Table 1's per-domain n-gram ALs (no per-domain speedups printed) average to its Mean AL
    domains = raw["speed-bench-table1-ngram"]["setup"]["domain_acceptance_length"]
    assert len(domains) == 11 and round(sum(domains.values()) / 11, 2) == length
    t10 = raw["speed-bench-table10"]
    assert t10["configs"]["chain"]["acceptance_length"] == [r[1] for r in SPEED_T10]
    assert t10["configs"]["chain"]["speedup"] == [r[2] for r in SPEED_T10]
    assert t10["setup"]["contexts"] == [r[0] for r in SPEED_T10]
    steps = t10["step_latency_ms"]
    assert list(zip(steps["t_ar"], steps["t_sd"], strict=True)) == [SPEED_T10_STEPS[c] for c in (1024, 2048, 8192)]


def test_the_vllm_preset_follows_eagle3_speedups_over_batch_in_vllm():
    """vLLM's EAGLE-3 speedups per batch (the paper's Table 5; chains of 2, A100 per the caption):
    with tau the same at every batch, speedup(b) = speedup(2) x ratio(2) / ratio(b), so from batch
    2's speedup alone the preset predicts batches 4-56 within 15% at the median and that
    speculation still pays at every one of them. (EAGLE's steeper fall in the same table is the
    recorded miss whose cause is not established: docs/performance-model.md#engine-presets.)"""
    ratio = []
    for b in TABLE5_BATCHES:
        chain, plain = _steps("vllm", "eagle3", "a100-80gb-sxm", "llama-3-8b", b, [3, 1], [2, 0])
        ratio.append(chain / plain)
    measured = np.array(TABLE5_EAGLE3)
    predicted = measured[0] * ratio[0] / np.array(ratio)
    assert np.median(np.abs(predicted[1:] / measured[1:] - 1)) <= 0.15
    assert np.all(predicted > 1) and np.all(measured > 1)


def test_the_data_file_holds_the_typed_numbers_and_says_the_eagle_cause_is_open():
    raw = {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}
    pr = raw["vllm-pr-22752"]["configs"]
    assert tuple(pr["chain"]["throughput_tok_s"]) == PR22752_CHAIN[0]
    assert tuple(pr["tree"]["acceptance_length"]) == PR22752_TREE[1]
    issue = raw["specforge-issue-339"]["configs"]
    assert issue["plain"]["throughput_tok_s"] == [ISSUE339_PLAIN[1], ISSUE339_PLAIN[4]]
    assert issue["tree 7-4-16"]["throughput_tok_s"][0] == ISSUE339[1][(7, 4, 16)][0]
    assert issue["tree 3-3-8"]["acceptance_length"] == [2.20, 2.27]
    trt = raw["trtllm-pr-5146"]["configs"]["chain"]
    assert (trt["acceptance_length"], trt["speedup"]) == ([1.83], [1.26])
    assert tuple(raw["eagle3-table5"]["speedup"]["eagle3"]) == TABLE5_EAGLE3
    why = raw["eagle3-table3"]["why_eagle_falls"]
    assert "could not be established" in why and "eagle3-table5" in why


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_published_steps", ROOT / "benchmarks" / "bench_published_steps.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_calls_by_hand():
    """The benchmark's calls on a batch worked by hand: plain 10 ms; a chain of 15 ms yielding 2
    tokens (7.5 ms per token); a tree of 18 ms yielding 2.5 (7.2 ms): the tree is the measured
    best. Predicted: chain 1.4 T(0) / 2 = 0.70, tree 1.9 / 2.5 = 0.76: the chain is picked, and
    it costs 7.5 / 7.2 - 1 = 4.17% more per token than the best."""
    group = pd.DataFrame(
        {
            "config": ["plain", "chain", "tree"],
            "step_ms": [10.0, 15.0, 18.0],
            "ratio": [1.0, 1.5, 1.8],
            "tokens_per_step": [1.0, 2.0, 2.5],
            "predicted_rel": [1.0, 1.4, 1.9],
        }
    )
    calls = _bench().config_calls(group)
    assert calls["errors"].tolist() == pytest.approx([1.4 / 1.5 - 1, 1.9 / 1.8 - 1])
    assert calls["pick_excess"] == pytest.approx(7.5 / 7.2 - 1)
    assert calls["on_off"] == (False, False)
    assert calls["chain_or_tree"] == ("tree", "chain")
    # the pairs a call compares, with a resolution of 10%: chain against tree, predicted 0.76 / 0.70
    # = 8.57% apart (close: no call), their step ratio (1.9 / 1.4) / (1.8 / 1.5) - 1 = 13.1% off, and
    # measured 7.5 / 7.2 = 4.17% apart; plain against the chain, 1 / 0.70 = 42.9% apart (a call), its
    # ratio 1.4 / 1.5 - 1 off, measured 10 / 7.2 = 38.9% apart (the tree is the measured best)
    pairs = _bench().config_calls(group, 0.10)["pairs"]
    tree = pairs["chain_or_tree"]
    assert tree["predicted_gap"] == pytest.approx(0.76 / 0.70 - 1) and tree["close"]
    assert tree["error"] == pytest.approx((1.9 / 1.4) / (1.8 / 1.5) - 1)
    assert tree["measured_gap"] == pytest.approx(7.5 / 7.2 - 1)
    assert tree["measured_within"]  # 4.17% < 10%: what the close call claims holds
    assert not _bench().config_calls(group, 0.04)["pairs"]["chain_or_tree"]["measured_within"]
    # at 5% the prediction (8.57% apart) is a call, and the measured gap (4.17%) is within it
    assert _bench().config_calls(group, 0.05)["pairs"]["chain_or_tree"]["measured_within"]
    plain = pairs["on_off"]
    assert plain["predicted_gap"] == pytest.approx(1 / 0.70 - 1) and not plain["close"]
    assert plain["error"] == pytest.approx(1.4 / 1.5 - 1)
    assert plain["measured_gap"] == pytest.approx(10 / 7.2 - 1)
    assert not _bench().config_calls(group, 0.08)["pairs"]["chain_or_tree"]["close"]
    # without a plain step the chain is the reference, and the ratio column serves when step_ms is NaN
    no_plain = group.iloc[1:].assign(step_ms=np.nan, predicted_rel=[1.0, 1.9 / 1.4])
    calls = _bench().config_calls(no_plain)
    assert calls["errors"].tolist() == pytest.approx([(1.9 / 1.4) / (1.8 / 1.5) - 1])
    assert "on_off" not in calls


def test_every_engine_configs_table_loads_with_its_preset_named():
    for table in published_tables():
        if table.kind == "engine_configs":
            assert table.setup["engine_preset"] in ("vllm", "sglang", "trtllm"), table.id
            assert not table.steps.empty and not table.skipped, table.id


# EAGLE-3 paper (Li et al. 2025, arXiv 2503.01840), Table 3 (SGLang, chains of 3) and Table 5 (vLLM,
# chains of 2): EAGLE's and EAGLE-3's speedups per batch as printed
TABLE3_BATCHES = (2, 4, 8, 16, 24, 32, 48, 56, 64)
TABLE3_EAGLE = (1.40, 1.38, 1.23, 1.02, 0.93, 0.94, 0.88, 0.99, 0.99)
TABLE3_EAGLE3 = (1.81, 1.82, 1.62, 1.48, 1.39, 1.32, 1.38, 1.34, 1.38)
TABLE5_EAGLE = (1.30, 1.25, 1.21, 1.10, 1.03, 0.93, 0.82, 0.71)


def test_the_eagle3_tables_contradict_constant_tau_for_eagle_by_hand():
    """speedup_E1(b) / speedup_E3(b) = (tau_E1 / tau_E3) / (1 + c / T_E3(b)) with c >= 0 constant
    cannot fall as batch grows while both taus are constant (docs/performance-model.md
    #published-speculative-steps). Table 3: 1.40 / 1.81 = 0.7735 at batch 2, 0.88 / 1.38 = 0.6377
    at 48, a fall of 1 - 0.6377 / 0.7735 = 17.56%, where printing to 2 decimals can make at most
    0.005 (1/1.40 + 1/1.81 + 1/0.88 + 1/1.38) = 1.56%. Table 5: its largest fall is from batch 8
    (1.21 / 1.58 = 0.7658) to 48 (0.82 / 1.21 = 0.6777), 11.51%, bound 0.005 (1/1.21 + 1/1.58 +
    1/0.82 + 1/1.21) = 1.75%. EAGLE-3 against itself: ratio 1 everywhere, no fall."""
    from roofline.published_checks import speedup_ratio_premise

    t3 = speedup_ratio_premise(TABLE3_BATCHES, TABLE3_EAGLE, TABLE3_EAGLE3)
    assert t3.ratio[0] == pytest.approx(1.40 / 1.81) and t3.ratio[6] == pytest.approx(0.88 / 1.38)
    assert t3.batches_fallen == (2, 48)
    assert t3.fall == pytest.approx(1 - (0.88 / 1.38) / (1.40 / 1.81))
    assert t3.rounding_bound == pytest.approx(0.005 * (1 / 1.40 + 1 / 1.81 + 1 / 0.88 + 1 / 1.38))
    assert t3.contradicted
    t5 = speedup_ratio_premise(TABLE5_BATCHES, TABLE5_EAGLE, TABLE5_EAGLE3)
    assert t5.batches_fallen == (8, 48)
    assert t5.fall == pytest.approx(1 - (0.82 / 1.21) / (1.21 / 1.58))
    assert t5.rounding_bound == pytest.approx(0.005 * (1 / 1.21 + 1 / 1.58 + 1 / 0.82 + 1 / 1.21))
    assert t5.contradicted
    same = speedup_ratio_premise(TABLE5_BATCHES, TABLE5_EAGLE3, TABLE5_EAGLE3)
    assert same.fall == pytest.approx(0.0) and not same.contradicted
    # a ratio that rises, then falls by less than rounding: 1.00 / 1.00, then 1.50 / 1.49 at batch 4
    small = speedup_ratio_premise((2, 4, 8), (1.00, 1.00, 1.50), (1.00, 0.99, 1.49))
    assert small.batches_fallen == (4, 8) and small.fall == pytest.approx(1 - (1.50 / 1.49) / (1.00 / 0.99))
    assert not small.contradicted


def test_the_benchmark_leaves_eagles_contradicted_rows_unjudged_and_judges_eagle3():
    results, unjudged, _ = _bench().batch_growth(published_tables())
    judged = [name for name, *_ in results]
    assert any("eagle3-table3 eagle3" in n for n in judged) and any("eagle3-table5 eagle3" in n for n in judged)
    assert not any(n.split(":")[0].endswith(" eagle") for n in judged)
    assert sorted(n.split(":")[0].split(" on ")[1] for n, *_ in unjudged) == [
        "eagle3-table3 eagle",
        "eagle3-table5 eagle",
    ]
    assert all("premise contradicted by the table" in why for *_, why in unjudged)


def test_call_resolution_is_the_90th_percentile_of_the_pair_errors_by_hand():
    """Ten |errors| 1%, 2%, ..., 10%: numpy's linear 90th percentile sits at position 0.9 x 9 = 8.1
    of the sorted list, 9% + 0.1 x 1% = 9.1%; signs do not matter."""
    from roofline.published_checks import call_resolution

    assert call_resolution([(-1) ** i * i / 100 for i in range(1, 11)]) == pytest.approx(0.091)
    assert call_resolution([0.05]) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        call_resolution([])


def test_the_benchmark_counts_close_calls_apart_and_its_stored_resolution_holds():
    """Every call of the engine_configs tables is either confident (judged against the
    measurement) or close (listed apart, never counted as agreeing), but for those of a batch set
    aside outside the priced regime, and the stored call resolution is the one its rule gives on
    these tables."""
    tables = published_tables()
    results, close_lines, _, unjudged = _bench().engine_configs(tables)
    aside = {name.split(" on ")[1].split(":")[0] for name, *_ in unjudged}
    calls = 0
    for table in tables:
        if table.kind == "engine_configs":
            for g, group in table.steps.groupby("group"):
                kinds = set(group["config"].str.split().str[0])
                if f"{table.id} {g}" not in aside:
                    calls += ("plain" in kinds) + ({"chain", "tree"} <= kinds)
    confident = sum(
        int(name.split("confident calls wrong, ")[1].split(" of ")[1].split()[0])
        for name, *_ in results
        if "confident calls wrong" in name
    )
    assert confident + len(close_lines) == calls
    assert all("close call, no call made" in line for line in close_lines)
    (check,) = [r for r in results if r[0].startswith("call resolution")]
    assert check[1] == 0.0


def test_the_pooled_held_out_judgement_by_hand_and_without_the_fitted_tables():
    """Part (f): |errors| 5%, 10%, 30% pool to a median of 10%; one confident call wrong of two
    is 50% wrong. On the real tables, the pool takes every configuration but each batch's
    reference (plain, else the chain) of the engine_configs tables no preset term was fitted on
    (SpecBundle's two are left out), and each of their calls is either confident (pooled) or
    close."""
    bench = _bench()
    median, wrong = bench.pooled([0.05, 0.30, 0.10], [True, False])
    assert median[1] == pytest.approx(0.10) and "pooled over 3 held-out" in median[0]
    assert wrong[1] == pytest.approx(0.5) and "wrong: 1 of 2" in wrong[0]
    tables = published_tables()
    fitted = fitted_tables()
    held_tables = [t for t in tables if t.kind == "engine_configs" and t.id not in fitted]
    assert len(held_tables) < sum(t.kind == "engine_configs" for t in tables)
    _, close_lines, held, unjudged = bench.engine_configs(tables)
    aside = {name.split(" on ")[1].split(":")[0] for name, *_ in unjudged}
    judged = [
        (table, group)
        for table in held_tables
        for g, group in table.steps.groupby("group")
        if f"{table.id} {g}" not in aside
    ]
    assert len(held["errors"]) == sum(len(group) - 1 for _, group in judged)
    calls = 0
    for _, group in judged:
        kinds = set(group["config"].str.split().str[0])
        calls += ("plain" in kinds) + ({"chain", "tree"} <= kinds)
    held_close = [line for line in close_lines if line.split()[0] not in fitted]
    assert len(held["confident"]) + len(held_close) == calls


def test_plain_step_regime_by_hand():
    """Measured over predicted plain steps: 28.36 / 8.00 = 3.545 is beyond twice, 8 / 8 = 1 inside,
    3 / 8 = 0.375 under half; exactly twice (or half) is still inside."""
    from roofline.published_checks import PRICED_REGIME_FACTOR, plain_step_regime

    assert PRICED_REGIME_FACTOR == 2.0
    got = plain_step_regime([28.36, 8.0, 3.0, 16.0, 4.0], [8.0, 8.0, 8.0, 8.0, 8.0])
    assert got.factor == pytest.approx([3.545, 1.0, 0.375, 2.0, 0.5])
    assert got.outside.tolist() == [True, False, True, False, False]
    assert plain_step_regime([12.0], [4.0], bound=4.0).outside.tolist() == [False]
    for bad in (([1.0, 2.0], [1.0]), ([0.0], [1.0]), ([np.nan], [1.0])):
        with pytest.raises(ValueError):
            plain_step_regime(*bad)


def test_the_benchmark_sets_aside_only_angelslims_batches_whose_plain_step_it_does_not_price():
    """AngelSlim issue #163's plain steps, 1000 x batch / throughput: 4.57, 7.88, 11.81, 28.36 and 51.70
    ms at batches 1, 4, 8, 32 and 64. The sglang preset on four H100s prices them at under 9 ms
    throughout; from batch 8 on the measured step is over twice the priced one (and it grows by 0.7-1.0
    ms for each request added, which no decode step of a 3B-active model on four GPUs does), so
    those batches are set aside, their calls not counted; batches 1 and 4 are judged. Every other
    table's measured plain step lies within twice its preset's, so nothing else is set aside, and
    no held-out confident call disagrees with its measurement."""
    measured_ms = {b: 1000 * b / thr for b, thr in ISSUE163_PLAIN.items()}
    assert measured_ms[32] == pytest.approx(28.36, abs=0.01) and measured_ms[64] == pytest.approx(51.70, abs=0.01)
    priced_ms = {
        b: 1e3 * _steps("sglang", "eagle3", "h100-sxm", "qwen3-30b-a3b", b, [1], [0], tp=4)[0] for b in measured_ms
    }
    beyond = sorted(b for b in measured_ms if measured_ms[b] > 2 * priced_ms[b])
    assert beyond == [8, 32, 64]
    bench = _bench()
    results, close_lines, held, unjudged = bench.engine_configs(published_tables())
    assert [name.split(" on ")[1].split(":")[0] for name, *_ in unjudged] == [
        f"angelslim-issue-163 batch {b}" for b in beyond
    ]
    assert all("outside the priced regime" in why for *_, why in unjudged)
    assert not any(line.startswith("angelslim-issue-163 batch 8 ") for line in close_lines)
    assert held["confident"] and all(held["confident"])
    _, _, aside = bench.presets(published_tables())
    assert aside == []
