"""roofline.grid and the selection built from it: the speedup grid, the best tree per cell, the
selection document (treeopt.selection), the greedy proposal of the first K heads (treeopt.tau)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from roofline.grid import DEFAULT_BATCHES, DEFAULT_CONTEXTS, GRID_COLUMNS, PerTreeSize, speedup_grid
from roofline.hardware import HardwareProfile, load_hardware
from roofline.latency import step_time_s
from roofline.shapes import DraftHeadsShape, ModelShape, draft_heads_shape, model_shape
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.errors import UserError
from treeopt.selection import best_per_cell, selection_from_grid
from treeopt.tau import first_heads, proposal_sequence, tau_curves
from treeopt.tree import Tree


def proposal_from_accuracy(table, max_nodes, *, num_heads=None):
    """Medusa's greedy proposal of the first `num_heads` heads and its independent tau."""
    table = first_heads(table, num_heads)
    curves = tau_curves(table, proposal_sequence(table, max_nodes, method="greedy"))
    return curves.proposal, curves.independent


CSV = Path(__file__).resolve().parents[1] / "treeopt" / "data" / "medusa_train_accuracy.csv"
V7 = model_shape("vicuna-7b")
HEADS = draft_heads_shape(V7, 5)
A100 = load_hardware("a100-80gb-sxm")


@pytest.fixture(scope="module")
def proposal():
    table = load_accuracy(CSV, model="vicuna-7b")
    return proposal_from_accuracy(table, 64)


@pytest.fixture(scope="module")
def grid(proposal):
    return speedup_grid(V7, HEADS, A100, proposal[1])


def test_grid_shape_and_columns(grid, proposal):
    tree, tau = proposal
    assert tree.size == 64 and tau.shape == (65,)
    assert tuple(grid.columns) == GRID_COLUMNS
    assert len(grid) == len(DEFAULT_BATCHES) * len(DEFAULT_CONTEXTS) * 65
    assert list(grid["nodes"].unique()) == list(range(65))
    ok = grid[grid["fits_memory"]]
    plain = ok[ok["nodes"] == 0]
    assert (plain["overhead"] == 1).all() and (plain["speedup"] == 1).all() and (plain["tau"] == 1).all()


def test_grid_matches_step_time(grid):
    for b, s, n in [(1, 128, 0), (1, 128, 10), (8, 2048, 63), (64, 1024, 5)]:
        row = grid[(grid["batch"] == b) & (grid["context"] == s) & (grid["nodes"] == n)].iloc[0]
        heads = None if n == 0 else HEADS
        assert row["step_time_s"] == pytest.approx(step_time_s(V7, heads, A100, batch=b, tokens=n + 1, context=s))
        t0 = step_time_s(V7, None, A100, batch=b, tokens=1, context=s)
        assert row["overhead"] == pytest.approx(row["step_time_s"] / t0)


# A toy model on a profile where only framework costs take time (every roof at 1e30/s): a step
# of b sequences x q tokens with k heads costs 1e-3 + 2 layers x 1e-4 x b q + k x 1e-4 seconds.
TOY = ModelShape(
    "toy", layers=2, hidden=32, intermediate=64, heads=8, kv_heads=2, head_dim=4, vocab=16, dtype="fp16", dtype_bytes=2
)
TOY_HEADS = DraftHeadsShape(num_heads=2, num_layers=1, hidden=32, vocab=16)
FRAMEWORK_ONLY = HardwareProfile(
    name="framework-only",
    peak_flops={"fp16": 1e30},
    vector_flops=1e30,
    bandwidth_bytes_per_s=1e30,
    capacity_bytes=1e12,
    kernel_overhead_s=0.0,
    forward_overhead_s=1e-3,
    token_overhead_s=1e-4,
    head_overhead_s=1e-4,
)


def cells(grid, batch):
    return grid[grid["batch"] == batch].set_index("nodes")


def test_grid_by_hand_on_framework_costs():
    tau = [1.0, 1.5, 1.8, 1.95]
    grid = speedup_grid(TOY, TOY_HEADS, FRAMEWORK_ONLY, tau, [1, 4], [8])
    # b = 1: plain (q = 1, no heads) 1.2e-3; n = 1, 2, 3 (q = n + 1, 2 heads) 1.6e-3, 1.8e-3, 2.0e-3
    # overhead 4/3, 3/2, 5/3; speedup 1.5 x 3/4 = 1.125, 1.8 / 1.5 = 1.2, 1.95 x 3/5 = 1.17
    b1 = cells(grid, 1)
    assert b1["step_time_s"].tolist() == pytest.approx([1.2e-3, 1.6e-3, 1.8e-3, 2.0e-3], rel=1e-9)
    assert b1["overhead"].tolist() == pytest.approx([1.0, 4 / 3, 1.5, 5 / 3], rel=1e-9)
    assert b1["speedup"].tolist() == pytest.approx([1.0, 1.125, 1.2, 1.17], rel=1e-9)
    # b = 4: plain 1e-3 + 8e-4 = 1.8e-3; n = 1: 1e-3 + 1.6e-3 + 2e-4 = 2.8e-3, speedup 1.5 x 1.8 / 2.8
    b4 = cells(grid, 4)
    assert b4["step_time_s"].tolist() == pytest.approx([1.8e-3, 2.8e-3, 3.6e-3, 4.4e-3], rel=1e-9)
    assert b4["speedup"].tolist() == pytest.approx([1.0, 1.5 * 1.8 / 2.8, 1.8 * 1.8 / 3.6, 1.95 * 1.8 / 4.4], rel=1e-9)
    best = best_per_cell(grid).set_index("batch")
    # b = 1: 2 nodes; b = 4: nothing beats plain decoding
    assert (best.loc[1, "nodes"], best.loc[1, "speedup"]) == (2, pytest.approx(1.2, rel=1e-9))
    assert (best.loc[4, "nodes"], best.loc[4, "speedup"]) == (0, 1.0)


def test_grid_prices_the_sizes_beyond_the_first_branch_as_trees():
    # the proposal [0], [0, 0], [1]: its first two sizes are chains, the third branches
    # (docs/performance-model.md#close-calls); with 0.1 ms per layer of a tree (TOY: 2 layers) only
    # the third pays 0.2 ms: the framework-only steps of test_grid_by_hand_on_framework_costs
    tau = [1.0, 1.5, 1.8, 1.95]
    hw = FRAMEWORK_ONLY.with_(tree_verify_layer_s=1e-4)
    proposal = Tree(((0,), (0, 0), (1,)))
    grid = speedup_grid(TOY, TOY_HEADS, hw, tau, [1], [8], tree=proposal)
    assert grid["step_time_s"].tolist() == pytest.approx([1.2e-3, 1.6e-3, 1.8e-3, 2.2e-3], rel=1e-9)
    # chains price exactly as without the term; a grid without its proposal takes every size as a chain
    chain = speedup_grid(TOY, TOY_HEADS, hw, tau, [1], [8], tree=Tree(((0,), (0, 0), (0, 0, 0))))
    assert (
        chain["step_time_s"].tolist()
        == speedup_grid(TOY, TOY_HEADS, FRAMEWORK_ONLY, tau, [1], [8])["step_time_s"].tolist()
    )
    assert speedup_grid(TOY, TOY_HEADS, hw, tau, [1], [8])["step_time_s"].tolist() == pytest.approx(
        [1.2e-3, 1.6e-3, 1.8e-3, 2.0e-3], rel=1e-9
    )


def test_grid_by_hand_with_the_heads_each_prefix_uses():
    tau = [1.0, 1.5, 1.8, 1.95]
    # the trees of 1 and 2 nodes need head 1 only, the tree of 3 heads 1 and 2
    grid = speedup_grid(TOY, TOY_HEADS, FRAMEWORK_ONLY, tau, [1], [8], per_size=PerTreeSize(heads_used=[0, 1, 1, 2]))
    # b = 1: 1.2e-3; 1e-3 + 4e-4 + 1e-4 = 1.5e-3; 1.7e-3; 1e-3 + 8e-4 + 2e-4 = 2.0e-3
    assert grid["step_time_s"].tolist() == pytest.approx([1.2e-3, 1.5e-3, 1.7e-3, 2.0e-3], rel=1e-9)
    assert grid["speedup"].tolist() == pytest.approx([1.0, 1.2, 1.8 * 1.2 / 1.7, 1.95 * 1.2 / 2.0], rel=1e-9)
    assert best_per_cell(grid).iloc[0]["nodes"] == 2
    # heads in the baseline: plain decoding runs both heads too, 1.2e-3 + 2e-4 = 1.4e-3
    grid = speedup_grid(TOY, TOY_HEADS, FRAMEWORK_ONLY, tau, [1], [8], heads_in_baseline=True)
    assert grid["step_time_s"].tolist() == pytest.approx([1.4e-3, 1.6e-3, 1.8e-3, 2.0e-3], rel=1e-9)
    assert grid["speedup"].tolist() == pytest.approx([1.0, 1.5 * 1.4 / 1.6, 1.4, 1.95 * 1.4 / 2.0], rel=1e-9)


def test_best_tree_shrinks_with_batch(grid):
    best = best_per_cell(grid)
    assert len(best) == 49
    for s in (128, 256, 512, 1024):
        col = best[(best["context"] == s) & best["fits_memory"]].set_index("batch")["nodes"]
        # (not strictly monotone: the row-efficiency curve has a knee between 96 and 256 rows)
        assert col[1] >= col[4] >= col[16] >= col.iloc[-1]
    b1 = best[(best["batch"] == 1) & (best["context"] == 1024)].iloc[0]
    assert b1["nodes"] > 30 and 1.8 < b1["speedup"] < 2.4
    # out-of-memory cells: plain decoding of 32 x 8192 tokens needs 12.55 GiB of weights +
    # 32 x 8193 x 0.5 MiB = 128 GiB of KV cache > 80 GiB; 16 x 8192 needs 12.55 + 64.0 = 76.6 GiB
    # and fits (it did not while "80 GB" was read as 80e9 bytes)
    oom = best[~best["fits_memory"]]
    assert set(zip(oom["batch"], oom["context"])) >= {(32, 8192), (64, 8192)}
    assert (16, 8192) not in set(zip(oom["batch"], oom["context"]))
    assert oom["speedup"].isna().all()


def test_no_speculation_when_nothing_beats_one():
    tau = np.array([1.0, 1.001, 1.002, 1.003])
    grid = speedup_grid(V7, HEADS, A100, tau, [1, 64], [512])
    best = best_per_cell(grid)
    assert (best["nodes"] == 0).all() and (best["speedup"] == 1.0).all()


def test_best_ties_go_to_the_smaller_tree():
    grid = pd.DataFrame(
        {
            "batch": [1, 1, 1],
            "context": [8, 8, 8],
            "nodes": [0, 1, 2],
            "speedup": [1.0, 1.5, 1.5],
            "tau": [1, 2, 3],
            "overhead": [1, 4 / 3, 2],
        }
    )
    assert best_per_cell(grid).iloc[0]["nodes"] == 1


def test_tau_validation():
    with pytest.raises(UserError, match=r"tau\[0\] must be 1"):
        speedup_grid(V7, HEADS, A100, [1.2, 1.5], [1], [128])
    with pytest.raises(UserError, match="finite number >= 1"):
        speedup_grid(V7, HEADS, A100, [1.0, np.nan], [1], [128])
    with pytest.raises(UserError, match="--batch"):
        speedup_grid(V7, HEADS, A100, [1.0, 1.5], [0], [128])
    with pytest.raises(UserError, match="--context"):
        speedup_grid(V7, HEADS, A100, [1.0, 1.5], [1], [-5])


def test_heads_in_baseline_changes_only_the_denominator():
    tau = np.array([1.0, 1.5, 1.8])
    a = speedup_grid(V7, HEADS, A100, tau, [4], [256])
    b = speedup_grid(V7, HEADS, A100, tau, [4], [256], heads_in_baseline=True)
    assert a["step_time_s"].iloc[0] < b["step_time_s"].iloc[0]
    assert np.allclose(a["step_time_s"].iloc[1:], b["step_time_s"].iloc[1:])


def test_selection_document(grid, proposal):
    tree, _ = proposal
    doc = selection_from_grid(grid, tree, "a100-80gb-sxm", "vicuna-7b").to_json()
    assert doc["format"] == "treeopt.selection/v1"
    assert (doc["hardware"], doc["model"]) == ("a100-80gb-sxm", "vicuna-7b")
    best = best_per_cell(grid)
    assert len(doc["cells"]) == int(best["fits_memory"].sum())
    assert {(c["batch"], c["context"]) for c in doc["out_of_memory"]} == set(
        zip(best.loc[~best["fits_memory"], "batch"], best.loc[~best["fits_memory"], "context"])
    )
    for cell in doc["cells"]:
        assert set(cell) >= {"batch", "context", "nodes", "speedup", "medusa_choices"}
        assert cell["medusa_choices"] == tree.prefix(cell["nodes"]).to_choices()
        assert len(cell["medusa_choices"]) == cell["nodes"]
    none = selection_from_grid(speedup_grid(V7, HEADS, A100, [1.0, 1.0001], [64], [512]), tree, "h", "m").to_json()
    assert none["cells"][0]["nodes"] == 0 and none["cells"][0]["medusa_choices"] == []


def test_proposal_from_accuracy_cuts_heads_and_size():
    table = load_accuracy(CSV, model="vicuna-7b")
    tree, tau = proposal_from_accuracy(table, 64, num_heads=2)
    assert tree.depth == 2 and tree.size == 5 + 25 and len(tau) == 31  # all a 2-deep, 5-wide tree holds
    one_head = AccuracyTable(hits=[[0.5, 0.2]], positions=[1.0])
    tree, tau = proposal_from_accuracy(one_head, 64)  # one head of width 2: at most 2 nodes
    assert tree.size == 2 and tau.tolist() == pytest.approx([1.0, 1.5, 1.7])
    with pytest.raises(UserError, match="--num-heads: 6 heads asked for, the accuracy table has 5"):
        proposal_from_accuracy(table, 8, num_heads=6)


def test_heads_used_by_prefix_runs_only_the_heads_the_tree_reaches(proposal):
    from roofline.grid import heads_used_by_prefix

    tree, tau = proposal
    used = heads_used_by_prefix(tree)
    assert used[0] == 0 and used[1] == 1 and (np.diff(used) >= 0).all() and used[-1] == tree.depth
    for n in (1, 2, 10, 64):
        assert used[n] == tree.prefix(n).depth
    g_all = speedup_grid(V7, HEADS, A100, tau, [1], [512])
    g_used = speedup_grid(V7, HEADS, A100, tau, [1], [512], per_size=PerTreeSize(heads_used=used))
    from dataclasses import replace

    for n in (1, 3, 64):
        k = int(used[n])
        expect = step_time_s(V7, replace(HEADS, num_heads=k), A100, batch=1, tokens=n + 1, context=512)
        assert g_used["step_time_s"].iloc[n] == pytest.approx(expect)
        assert g_used["step_time_s"].iloc[n] <= g_all["step_time_s"].iloc[n]
