"""Expert parallelism (docs/performance-model.md#expert-parallelism): an MoE's routed experts spread
whole over the tensor-parallel GPUs, the step priced at its slowest GPU. The expected maxima are
checked against a brute-force simulation of uniform top-k routing and by hand (an exact binomial
sum written here with math.comb); the command refuses what it cannot price in one line."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from roofline.ops import expected_max_standard_normal, operators, slowest_gpu_experts
from roofline.shapes import model_shape
from roofline.step_shape import StepShape
from treeopt.cli import main
from treeopt.errors import UserError


def _simulate(experts: int, top_k: int, gpus: int, tokens: int, trials: int = 3000, seed: int = 11):
    """Mean over trials of the largest per-GPU count of distinct experts read and of token-expert
    pairs run, each token picking top_k distinct experts uniformly; GPU g holds experts
    g E/N .. (g + 1) E/N - 1."""
    rng = np.random.default_rng(seed)
    picks = np.argpartition(rng.random((trials, tokens, experts)), top_k, axis=2)[:, :, :top_k]
    hit = np.zeros((trials, experts), bool)
    np.put_along_axis(hit, picks.reshape(trials, -1), True, axis=1)
    per_gpu = experts // gpus
    read = hit.reshape(trials, gpus, per_gpu).sum(axis=2).max(axis=1)
    gpu_of_pick = picks.reshape(trials, -1) // per_gpu
    pairs = np.stack([(gpu_of_pick == g).sum(axis=1) for g in range(gpus)], axis=1).max(axis=1)
    return read.mean(), pairs.mean()


# DeepSeek-V3 (256 routed experts, top-8) on eight GPUs; Qwen3-30B-A3B (128, top-8) on four: the
# published configs' counts, which the built-in shapes carry
@pytest.mark.parametrize(
    ("model", "experts", "top_k", "gpus", "tokens"),
    [
        ("deepseek-v3", 256, 8, 8, 1),
        ("deepseek-v3", 256, 8, 8, 4),
        ("deepseek-v3", 256, 8, 8, 16),
        ("deepseek-v3", 256, 8, 8, 64),
        ("qwen3-30b-a3b", 128, 8, 4, 1),
        ("qwen3-30b-a3b", 128, 8, 4, 8),
        ("qwen3-30b-a3b", 128, 8, 4, 32),
    ],
)
def test_the_slowest_gpu_matches_a_simulation_of_uniform_routing(model, experts, top_k, gpus, tokens):
    shape = model_shape(model)
    assert (shape.routed_experts, shape.experts_per_token) == (experts, top_k)
    read, pairs = _simulate(experts, top_k, gpus, tokens)
    got_read, got_pairs = slowest_gpu_experts(shape, tokens, gpus)
    assert float(got_read) == pytest.approx(read, rel=0.03)
    assert float(got_pairs) == pytest.approx(pairs, rel=0.03)
    # the slowest GPU does more than its even share, which is what tensor parallelism pays
    assert got_read > float(shape.expected_experts(tokens)) / gpus


def test_one_token_on_eight_gpus_by_hand():
    """One token's 8 experts of 256 on 8 GPUs of 32: each expert read with p = 8/256; the slowest
    GPU reads E[max of 8 Binomial(32, 1/32)] = sum over m < 32 of 1 - P(X <= m)^8 = 2.544, against
    one expert's worth under tensor parallelism (8 experts, an eighth of each per GPU)."""
    p, n = 8 / 256, 32
    cdf = np.cumsum([comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)])
    by_hand = sum(1 - cdf[m] ** 8 for m in range(n))
    assert by_hand == pytest.approx(2.544, abs=1e-3)
    shape = model_shape("deepseek-v3")
    read, pairs = slowest_gpu_experts(shape, 1, 8)
    assert float(read) == pytest.approx(by_hand, rel=1e-9)
    assert float(pairs) == pytest.approx(by_hand, rel=1e-9)  # each read expert runs the one token
    # the routed experts' weights one GPU reads per MoE layer, expert parallel over tensor parallel
    step = StepShape(1, 1, 1024, tensor_parallel_gpus=8)
    tp = next(op for op in operators(shape, None, step) if op.name == "experts")
    ep = next(op for op in operators(shape, None, StepShape(1, 1, 1024, tensor_parallel_gpus=8, expert_parallel=True))
              if op.name == "experts")  # fmt: skip
    assert float(ep.bytes / tp.bytes) == pytest.approx(by_hand / (8 / 8), rel=1e-9)
    assert float(ep.flops / tp.flops) == pytest.approx(by_hand, rel=1e-9)


def test_the_limits_by_hand():
    shape = model_shape("qwen3-30b-a3b")
    t = np.array([1.0, 8.0, 32.0])
    # one GPU: the slowest is the only one, every expert the step reads and every pair it runs
    read, pairs = slowest_gpu_experts(shape, t, 1)
    assert read == pytest.approx(128 * (1 - (1 - 8 / 128) ** t))
    assert pairs == pytest.approx(8 * t)
    # a batch that reads every expert: each GPU reads its 32, and at most T k pairs
    read, pairs = slowest_gpu_experts(shape, 4096, 4)
    assert float(read) == pytest.approx(32.0)
    # the fixed-sum spread: 4096 x 8 / 4 + sqrt(4096 x 8 x 120 / (4 x 127)) E[max of 4 normals]
    assert float(pairs) == pytest.approx(8192 + np.sqrt(4096 * 8 * 120 / (4 * 127)) * 1.0294, rel=1e-4)
    assert [round(expected_max_standard_normal(n), 4) for n in (1, 2, 4, 8)] == [0.0, 0.5642, 1.0294, 1.4236]


def test_expert_parallel_needs_routed_experts_that_spread_evenly():
    with pytest.raises(UserError, match="no routed experts"):
        operators(model_shape("llama-3-8b"), None, StepShape(1, 1, 8, tensor_parallel_gpus=2, expert_parallel=True))
    with pytest.raises(UserError, match="128 routed experts do not spread evenly over 3 GPUs"):
        operators(model_shape("qwen3-30b-a3b"), None, StepShape(1, 1, 8, tensor_parallel_gpus=3, expert_parallel=True))


def _speedup(capsys, *extra):
    args = ["roofline", "speedup", "--model", "deepseek-v3", "--dtype", "fp8", "--hardware", "h200"]
    args += ["--accuracy", "treeopt/data/medusa_train_accuracy.csv", "--csv-model", "vicuna-7b"]
    args += ["--batch", "1,32", "--context", "1024", "--max-nodes", "8", "--engine-costs", "vllm", *extra]
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def test_roofline_speedup_prices_expert_parallel_steps(tmp_path, capsys, monkeypatch):
    import pandas as pd

    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    tp_csv, ep_csv = tmp_path / "tp.csv", tmp_path / "ep.csv"
    code, _, err = _speedup(capsys, "--tensor-parallel", "8", "-o", str(tp_csv))
    assert code == 0, err
    code, _, err = _speedup(capsys, "--tensor-parallel", "8", "--expert-parallel", "-o", str(ep_csv))
    assert code == 0, err
    tp, ep = pd.read_csv(tp_csv), pd.read_csv(ep_csv)
    # plain decoding at batch 1: the slowest GPU reads 2.5 experts' weights where an even split reads 1
    plain = (tp["batch"] == 1) & (tp["nodes"] == 0)
    assert float(ep.loc[plain, "step_time_s"].iloc[0]) > float(tp.loc[plain, "step_time_s"].iloc[0])
    # a dense model has no experts to spread: one line, exit 2, no output
    out_csv = tmp_path / "dense.csv"
    with pytest.raises(SystemExit) as exc:
        main(["roofline", "speedup", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tensor-parallel", "2",
              "--expert-parallel", "--accuracy", "treeopt/data/medusa_train_accuracy.csv", "--csv-model", "vicuna-7b",
              "-o", str(out_csv)])  # fmt: skip
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "no routed experts" in err
    assert not out_csv.exists()


def test_the_slowest_gpu_reads_its_experts_weights_and_runs_its_pairs_at_64_tokens():
    """DeepSeek-V3 on eight GPUs, 64 tokens in the step (batch 64, plain): the routed-experts
    operator moves each read expert's gate, up and down weights (3 h i_e, h = 7168, i_e = 2048) and
    each pair's activations (2 h + 3 i_e); the slowest GPU's share against the even split of
    tensor parallelism, with the slowest GPU's experts read and pairs run taken from the simulation."""
    read, pairs = _simulate(256, 8, 8, 64)
    weights, activations = 3 * 7168 * 2048, 2 * 7168 + 3 * 2048
    mean_read = 256 * (1 - (1 - 8 / 256) ** 64)
    even = (mean_read * weights + 64 * 8 * activations) / 8
    expected = (read * weights + pairs * activations) / even
    shape = model_shape("deepseek-v3")
    ops = {
        ep: next(
            op
            for op in operators(shape, None, StepShape(64, 1, 1024, tensor_parallel_gpus=8, expert_parallel=ep))
            if op.name == "experts"
        )
        for ep in (False, True)
    }
    assert float(ops[True].bytes / ops[False].bytes) == pytest.approx(expected, rel=0.02)
    assert float(ops[True].flops / ops[False].flops) == pytest.approx(pairs / (64 * 8 / 8), rel=0.02)
    # its GEMM runs at the token rows per expert of that GPU: its pairs over its experts read
    assert float(ops[True].rows) == pytest.approx(pairs / read, rel=0.03)
    assert float(ops[False].rows) == pytest.approx(64 * 8 / mean_read, rel=1e-9)
