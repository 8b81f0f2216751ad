"""IBM's candidate form (docs/builders.md#ibms-candidate-form): the n best of the product
of per-stage top-k against brute force, their merged prefix tree, the tokens both forms accept
(brute force over every rank vector) and what each form costs."""

import itertools
from pathlib import Path

import numpy as np
import pytest

from roofline.grid import candidate_forms_grid
from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.latency import step_time_s
from roofline.shapes import ModelShape
from treeopt.accuracy import expected_tokens
from treeopt.candidates import (
    candidate_proposal,
    candidate_rank_paths,
    candidate_tokens,
    merged_candidate_tree,
    speculator_draft_rows,
)
from treeopt.cli import main
from treeopt.errors import UserError

ACC = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.7, 0.2, 0.05]])


def test_hand_derived_small_case():
    # products: (0,0) .30, (0,1) .24, (1,0) .15, (1,1) .12
    paths = candidate_rank_paths(ACC[:2], (2, 2), 3)
    assert paths.tolist() == [[0, 0], [0, 1], [1, 0]]
    tree = merged_candidate_tree(paths)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))


def test_candidate_proposal_prefixes_are_the_candidate_sets():
    # hand-derived from the small case above: (0,0) adds [0], [0,0]; (0,1) adds [0,1];
    # (1,0) adds [1], [1,0]
    tree, sizes = candidate_proposal(ACC[:2], (2, 2), 3)
    assert tree.paths == ((0,), (0, 0), (0, 1), (1,), (1, 0))
    assert sizes == (2, 3, 5)
    for m, size in enumerate(sizes, start=1):
        # the prefix holds exactly the merged tree of the m best, its leaves the m candidates
        assert set(tree.prefix(size).paths) == set(
            merged_candidate_tree(candidate_rank_paths(ACC[:2], (2, 2), m)).paths
        )
        assert {p for p in tree.prefix(size).paths if len(p) == 2} == {
            tuple(p) for p in candidate_rank_paths(ACC[:2], (2, 2), m)
        }


def test_best_candidates_against_brute_force():
    rng = np.random.default_rng(3)
    acc = rng.dirichlet(np.ones(6), size=4)[:, :5]
    topk, n = (4, 3, 2, 2), 7
    scored = sorted(
        itertools.product(*(range(k) for k in topk)), key=lambda p: -np.prod([acc[d, r] for d, r in enumerate(p)])
    )
    assert [tuple(p) for p in candidate_rank_paths(acc, topk, n)] == scored[:n]


def test_both_forms_accept_the_same_tokens():
    # every rank vector (rank 3 = the true token is not among the top 3) with its probability
    # under independent depths; n candidate sequences accept the longest common prefix of any
    # candidate with the true ranks, plus the base model's own token
    topk, n = (3, 2, 2), 4
    paths = candidate_rank_paths(ACC, topk, n)
    full = np.concatenate([ACC, 1 - ACC.sum(axis=1, keepdims=True)], axis=1)
    expect = 0.0
    for ranks in itertools.product(range(4), repeat=3):
        prob = np.prod([full[d, r] for d, r in enumerate(ranks)])
        runs = [next((d for d in range(3) if p[d] != ranks[d]), 3) for p in paths]
        expect += prob * (1 + max(runs))
    assert expected_tokens(merged_candidate_tree(paths), ACC) == pytest.approx(expect)


def test_speculator_rows_and_candidate_tokens():
    assert speculator_draft_rows((4, 3, 2, 2)).tolist() == [1, 4, 12, 24]
    assert candidate_tokens(5, 4) == (25, 5)


@pytest.mark.parametrize(
    "topk, n, message",
    [((2, 2), 5, "--candidates"), ((2, 2, 2, 2), 1, "heads"), ((4,), 1, "rank 3"), ((0, 2), 1, "positive")],
)
def test_bad_input(topk, n, message):
    with pytest.raises(UserError, match=message):
        candidate_rank_paths(ACC, topk, n)


def test_the_two_forms_cost_what_they_verify():
    shape = ModelShape(
        "tiny",
        layers=2,
        hidden=8,
        intermediate=16,
        heads=2,
        kv_heads=1,
        head_dim=4,
        vocab=32,
        dtype="fp16",
        dtype_bytes=2,
    )
    hw = HardwareProfile(
        name="flat",
        peak_flops={"fp16": 1e9},
        vector_flops=1e8,
        bandwidth_bytes_per_s=1e9,
        capacity_bytes=1e12,
        kernel_overhead_s=1e-6,
        gemm_efficiency=EfficiencyCurve((1.0,), (1.0,)),
        context_overhead_s=1e-7,
    )
    tree = merged_candidate_tree(candidate_rank_paths(ACC[:2], (2, 2), 3))  # 5 nodes, depth 2
    grid = candidate_forms_grid(shape, None, hw, 1.8, tree, 3, [1, 4], [16])
    for row in grid.itertuples():
        plain = step_time_s(shape, None, hw, batch=row.batch, tokens=1, context=16)
        if row.form == "prefix-tree":
            t = step_time_s(shape, None, hw, batch=row.batch, tokens=6, context=16)
        else:  # 3 sequences of the root + 2 tokens, each re-reading the context
            t = step_time_s(shape, None, hw, batch=row.batch, tokens=9, context=16, candidates=3)
        assert row.step_time_s == pytest.approx(t)
        assert row.speedup == pytest.approx(1.8 * plain / t)
    assert set(grid["form"]) == {"prefix-tree", "candidates"}


def test_cli(capsys):
    csv = str(Path(__file__).resolve().parents[1] / "treeopt" / "data" / "medusa_train_accuracy.csv")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "roofline",
                "candidates",
                "--model",
                "vicuna-7b",
                "--hardware",
                "a100",
                "--accuracy",
                csv,
                "--topk",
                "4,3,2,2",
                "--candidates",
                "8",
                "--batch",
                "1,8",
                "--context",
                "512",
            ]
        )
        raise SystemExit(0)
    out = capsys.readouterr().out
    assert exc.value.code in (0, None)
    assert "48 candidates, the 8 of highest" in out and "depth 4" in out and "-> tree" in out
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "roofline",
                "candidates",
                "--model",
                "vicuna-7b",
                "--hardware",
                "a100",
                "--accuracy",
                csv,
                "--topk",
                "2,2",
                "--candidates",
                "5",
            ]
        )
        raise SystemExit(0)
    assert exc.value.code == 2
