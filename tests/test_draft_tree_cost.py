"""The cost of a draft-model tree (roofline/speculative.py, `draft_model_tree_step_time_s`,
`tree_grid`), the sweep's predictor and the gamma command with trees, against the sum of the
passes a step runs written out by hand and the chain special case."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from roofline.hardware import builtin_hardware
from roofline.latency import step_time_s
from roofline.shapes import ModelShape, model_shape
from roofline.speculative import (
    best_gamma,
    draft_model_step_time_s,
    draft_model_tree_step_time_s,
    gamma_grid,
    level_widths_by_prefix,
    tree_grid,
)
from treeopt.app.draft_model import chain_tree, gamma_prediction
from treeopt.app.models import draft_shape_of, shape_of
from treeopt.app.sweep import step_predictor
from treeopt.chain import ChainAcceptance, chain_tau
from treeopt.cli import main
from treeopt.tau import TauCurve
from treeopt.tree import make_tree

HW = builtin_hardware()["h100-sxm"]
TARGET = model_shape("llama-7b")
DRAFT = ModelShape("draft", layers=4, hidden=1024, intermediate=2816, heads=8, kv_heads=8, head_dim=128, vocab=32000)


@pytest.mark.parametrize("batch,context", [(1, 128), (16, 1000), (64, 2048), (256, 4096)])
def test_a_chain_is_the_draft_model_step_exactly(batch, context):
    # (256, 4096) does not fit the profile's memory: NaN in both
    for gamma in range(8):
        np.testing.assert_array_equal(
            draft_model_tree_step_time_s(TARGET, DRAFT, HW, batch=batch, level_widths=[1] * gamma, context=context),
            draft_model_step_time_s(TARGET, DRAFT, HW, batch=batch, gamma=gamma, context=context),
        )


def test_tree_step_is_one_draft_pass_per_depth_plus_the_verification():
    # widths (3, 2, 1): pass 1 reads the root over s, pass 2 the 3 depth-1 nodes over s + 1,
    # pass 3 the 2 depth-2 nodes over s + 1 + 3; the target verifies 3 + 2 + 1 + 1 = 7 tokens
    b, s = 4, 300
    want = (
        step_time_s(DRAFT, None, HW, batch=b, tokens=1, context=s)
        + step_time_s(DRAFT, None, HW, batch=b, tokens=3, context=s + 1)
        + step_time_s(DRAFT, None, HW, batch=b, tokens=2, context=s + 4)
        + step_time_s(TARGET, None, HW, batch=b, tokens=7, context=s)
    )
    got = draft_model_tree_step_time_s(TARGET, DRAFT, HW, batch=b, level_widths=[3, 2, 1], context=s)
    assert got == pytest.approx(want, rel=1e-12)
    # many trees at once, zero-padded: the same numbers; the empty tree is plain decoding
    many = draft_model_tree_step_time_s(
        TARGET, DRAFT, HW, batch=b, level_widths=[[3, 2, 1], [2, 0, 0], [0, 0, 0]], context=s
    )
    assert many[0] == pytest.approx(want, rel=1e-12)
    assert many[1] == pytest.approx(
        draft_model_tree_step_time_s(TARGET, DRAFT, HW, batch=b, level_widths=[2], context=s), rel=1e-12
    )
    assert many[2] == pytest.approx(step_time_s(TARGET, None, HW, batch=b, tokens=1, context=s), rel=1e-12)
    # beyond the profile's memory: NaN
    assert np.isnan(draft_model_tree_step_time_s(TARGET, DRAFT, HW, batch=100000, level_widths=[3, 1], context=30000))


def test_tree_grid_over_the_prefixes_of_a_proposal():
    proposal = make_tree([[0], [1], [2], [0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(
        level_widths_by_prefix(proposal), [[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0], [3, 1, 0], [3, 1, 1]]
    )
    tau = np.array([1.0, 1.6, 1.8, 1.9, 2.2, 2.4])
    grid = tree_grid(TARGET, DRAFT, HW, proposal, tau, batches=[1, 64], contexts=[128])
    assert grid["nodes"].tolist() == [0, 1, 2, 3, 4, 5] * 2 and grid["depth"].tolist()[:6] == [0, 1, 1, 1, 2, 3]
    row = grid[(grid["batch"] == 64) & (grid["nodes"] == 4)].iloc[0]
    step = draft_model_tree_step_time_s(TARGET, DRAFT, HW, batch=64, level_widths=[3, 1], context=128)
    plain = step_time_s(TARGET, None, HW, batch=64, tokens=1, context=128)
    assert row["step_time_s"] == pytest.approx(step) and row["speedup"] == pytest.approx(2.2 * plain / step)
    assert (grid[grid["nodes"] == 0]["speedup"] == 1.0).all()
    # the prefixes of a chain are gamma_grid's chains
    alpha = [0.8, 0.7, 0.6]
    chains = tree_grid(TARGET, DRAFT, HW, chain_tree(3), chain_tau(alpha), batches=[1, 64], contexts=[128])
    gammas = gamma_grid(TARGET, DRAFT, HW, alpha, batches=[1, 64], contexts=[128])
    np.testing.assert_allclose(chains["speedup"], gammas["speedup"], rtol=1e-12)
    assert best_gamma(chains)["nodes"].tolist() == best_gamma(gammas)["gamma"].tolist()


def test_step_predictor_and_gamma_prediction_charge_a_draft_model_tree():
    draft_model = SimpleNamespace(
        config=SimpleNamespace(
            to_dict=lambda: {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "vocab_size": 4096,
            }
        )
    )
    heads = SimpleNamespace(kind="draft-model", model=draft_model)
    lm = SimpleNamespace(name="demo", dtype=torch.float32, heads=heads)
    hw = HW
    shape, draft = shape_of("demo", dtype="float32"), draft_shape_of(heads, dtype="float32")
    proposal = make_tree([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    predict = step_predictor(lm, proposal, hw)
    for n, widths in enumerate([[], [1], [2], [2, 1], [2, 2], [2, 2, 1]]):
        want = draft_model_tree_step_time_s(shape, draft, hw, batch=2, level_widths=widths, context=64)
        assert predict(2, n + 1, 64) == pytest.approx(want, rel=1e-12)
    chain = step_predictor(lm, chain_tree(4), hw)
    for gamma in range(5):
        assert chain(2, gamma + 1, 64) == draft_model_step_time_s(shape, draft, hw, batch=2, gamma=gamma, context=64)
    tau = TauCurve(proposal, np.array([1.0, 1.5, 1.7, 2.0, 2.1, 2.3]))
    pred = gamma_prediction(shape, draft, hw, tau, [2], [64])
    assert pred["step_time_s"].tolist() == pytest.approx([predict(2, n + 1, 64) for n in range(6)], rel=1e-12)


def _sidecar(path, per_child):
    per_child = np.asarray(per_child, dtype=np.float64)
    ChainAcceptance.from_rows(per_child[None, :, 0], 1.0, child_rows=per_child[None], samples=8).save(path)


def test_cli_gamma_prints_the_best_chain_and_the_best_tree(tmp_path, capsys):
    side = tmp_path / "acc.alpha.json"
    _sidecar(side, [[0.6, 0.2, 0.1]] * 4)
    tree_csv = tmp_path / "trees.csv"
    draft = tmp_path / "draft.json"  # a 4-layer, 1024-wide draft of llama-7b's vocabulary
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 1024,
                "intermediate_size": 2816,
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
            }
        )
    )
    args = ["roofline", "gamma", "--model", "llama-7b", "--draft-model", str(draft), "--hardware", "h100-sxm"]
    args += ["--alpha", str(side), "--batch", "1,512", "--context", "128", "--max-nodes", "12"]
    main([*args, "--tree-out", str(tree_csv)])
    text = capsys.readouterr().out
    assert "best gamma" in text and "best tree (nodes, predicted speedup)" in text
    grid = pd.read_csv(tree_csv)
    assert sorted(set(grid["nodes"])) == list(range(13))
    best = best_gamma(grid).set_index("batch")
    assert best.loc[1, "nodes"] > 0  # at batch 1 a tree pays; printed as "N (S.SSx)"
    assert f"{int(best.loc[1, 'nodes'])} ({best.loc[1, 'speedup']:.2f}x)" in text
    # an explicit proposal tree
    main([*args[:-2], "--tree", "[[0], [1], [0, 0]]"])
    assert "3 nodes" in capsys.readouterr().out
    # a v1 sidecar or a constant alpha: chains only, and --tree is refused with one line
    v1 = tmp_path / "v1.alpha.json"
    doc = json.loads(side.read_text())
    v1.write_text(
        json.dumps(
            {k: doc[k] for k in ("temperature", "alpha_per_depth", "tau_walked", "rows")}
            | {"format": "treeopt.chain_acceptance/v1"}
        )
    )
    main([*args[:8], "--alpha", str(v1), "--batch", "1", "--context", "128"])
    assert "best tree" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([*args[:8], "--alpha-value", "0.7", "--tree", "[[0]]"])
    assert exc.value.code == 2


def test_a_branching_draft_model_tree_pays_the_tree_term_and_a_chain_does_not():
    # docs/performance-model.md#engine-terms-of-a-speculative-step: the target's verification of a
    # tree wider than one node at some depth pays tree_verify_layer_s x the target's 32 layers
    hw = HW.with_(tree_verify_layer_s=2e-5)
    kwargs = {"batch": 4, "context": 512}
    for widths in ([1, 1, 1], [0]):  # a chain of 3; no draft at all
        assert draft_model_tree_step_time_s(TARGET, DRAFT, hw, level_widths=widths, **kwargs) == (
            draft_model_tree_step_time_s(TARGET, DRAFT, HW, level_widths=widths, **kwargs)
        )
    wide = [2, 3, 1]
    extra = draft_model_tree_step_time_s(TARGET, DRAFT, hw, level_widths=wide, **kwargs) - (
        draft_model_tree_step_time_s(TARGET, DRAFT, HW, level_widths=wide, **kwargs)
    )
    assert extra == pytest.approx(32 * 2e-5, rel=1e-9)
    both = draft_model_tree_step_time_s(TARGET, DRAFT, hw, level_widths=[[1, 1, 1], [2, 3, 1]], **kwargs)
    alone = draft_model_tree_step_time_s(TARGET, DRAFT, HW, level_widths=[[1, 1, 1], [2, 3, 1]], **kwargs)
    assert both - alone == pytest.approx([0.0, 32 * 2e-5], abs=1e-12)
