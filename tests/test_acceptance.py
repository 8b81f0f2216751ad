"""Accepted lengths from rank vectors and the walked (decoder-like) tokens per step: against a
per-position brute force, hand-walked sequences, and the identity mean_t A_T(t) = joint tau."""

from __future__ import annotations

import numpy as np
import pytest

from treeopt.acceptance import (
    accepted_lengths,
    load_rank_vectors,
    rank_vectors_path,
    save_rank_vectors,
    simulate_tokens_per_step,
    simulated_tau_curve,
)
from treeopt.accuracy import AccuracyTable, expected_tokens
from treeopt.build import joint_tree
from treeopt.errors import UserError
from treeopt.tree import Tree


def brute_lengths(ranks, tree):
    nodes = set(tree.paths)
    out = []
    for row in ranks.tolist():
        d = 0
        while d < len(row) and tuple(row[: d + 1]) in nodes:
            d += 1
        out.append(1 + d)
    return np.array(out)


def brute_walk(lengths, seq):
    rec = []
    for s in np.unique(seq):
        rows = np.flatnonzero(seq == s)
        t = 0
        while t < len(rows):
            rec.append(lengths[rows[t]])
            t += lengths[rows[t]]
    return sum(rec) / len(rec), len(rec)


def random_tree(rng, size, width, depth):
    """A prefix-closed tree grown node by node (every node after its parent)."""
    paths, seen = [], set()
    size = min(size, sum(width**d for d in range(1, depth + 1)))  # all the nodes there are
    while len(paths) < size:
        parent = () if not paths or rng.random() < 0.3 else paths[rng.integers(len(paths))]
        if len(parent) >= depth:
            continue
        child = parent + (int(rng.integers(width)),)
        if child not in seen:
            seen.add(child)
            paths.append(child)
    return Tree(tuple(paths))


def random_ranks(rng, n, k, width, p=0.5):
    """Geometric ranks (some beyond width: misses), some positions without labels (-1), and
    correlated rows (repeated blocks) so that walks differ from position means."""
    r = rng.geometric(p, size=(n, k)) - 1
    r[rng.random((n, k)) < 0.1] = -1
    r[rng.random((n, k)) < 0.05] = width + int(rng.integers(5))
    return r


@pytest.mark.parametrize("seed", range(40))
def test_accepted_lengths_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 6))
    W = int(rng.integers(1, 8))
    tree = random_tree(rng, int(rng.integers(0, 30)), W, int(rng.integers(1, K + 3)))  # may be deeper than K
    ranks = random_ranks(rng, int(rng.integers(1, 300)), K, W, p=float(rng.uniform(0.3, 0.9)))
    got = accepted_lengths(ranks, tree)
    np.testing.assert_array_equal(got, brute_lengths(ranks, tree))
    seq = np.sort(rng.integers(0, 6, size=len(ranks))).astype(np.int32)
    mean, steps = simulate_tokens_per_step(ranks.astype(np.int16), seq, tree)
    ref_mean, ref_steps = brute_walk(got, seq)
    assert steps == ref_steps and mean == pytest.approx(ref_mean, rel=1e-15)


def test_hand_walked_sequences():
    tree = Tree(((0,), (0, 0), (1,)))
    hit3, hit2, miss = [0, 0], [1, 0], [2, 2]  # A = 3, 2, 1
    # A = [3,1,1,1,3,1,1,1]: steps start at t = 0 (3), 3 (1), 4 (3), 7 (1): 8 / 4 = 2.0,
    # the mean over positions is 12 / 8 = 1.5
    ranks = np.array([hit3, miss, miss, miss, hit3, miss, miss, miss])
    np.testing.assert_array_equal(accepted_lengths(ranks, tree), [3, 1, 1, 1, 3, 1, 1, 1])
    assert simulate_tokens_per_step(ranks, np.zeros(8, int), tree) == (2.0, 4)
    # an easy stretch then a hard one, A = [3,3,3,1,1,1]: steps at 0 (3), 3, 4, 5 (1 each):
    # 6 / 4 = 1.5 while the position mean (tau) is 12 / 6 = 2.0
    ranks = np.array([hit3, hit3, hit3, miss, miss, miss])
    assert accepted_lengths(ranks, tree).mean() == 2.0
    assert simulate_tokens_per_step(ranks, np.zeros(6, int), tree) == (1.5, 4)
    # two sequences: the walk never crosses into the next one. Sequence 7: A = [3, 3]: one step
    # of 3 runs past its end; sequence 9: A = [1, 2, 1]: steps at 0 (1) and 1 (2). 6 / 3.
    ranks = np.array([hit3, hit3, miss, hit2, miss])
    assert simulate_tokens_per_step(ranks, np.array([7, 7, 9, 9, 9]), tree) == (2.0, 3)
    # prefixes: [] -> 1; [[0]] -> A = [2,2,1,1,1]: seq 7 one step of 2, seq 9: 1,1,1 -> 5/4;
    # [[0],[0,0]] -> as the full tree without [1]: seq 7 (3), seq 9: 1, 1, 1 -> 6/4
    curve = simulated_tau_curve(tree, ranks, np.array([7, 7, 9, 9, 9]))
    np.testing.assert_array_equal(curve, [1.0, 5 / 4, 6 / 4, 2.0])
    # start_rows: steps start only in the first rows of each sequence, their acceptance may
    # read beyond. Sequence 7 (rows 0-1), sequence 9 (rows 2-4), start_rows=2: seq 7 (3),
    # seq 9: 1, then 2 from its row 1 -> (3 + 1 + 2) / 3; start_rows=1: one step each, 3 and 1
    seq = np.array([7, 7, 9, 9, 9])
    assert simulate_tokens_per_step(ranks, seq, tree, start_rows=2) == (2.0, 3)
    assert simulate_tokens_per_step(ranks, seq, tree, start_rows=1) == (2.0, 2)
    np.testing.assert_array_equal(simulated_tau_curve(tree, ranks, seq, start_rows=1), [1.0, 1.5, 2.0, 2.0])
    # no label (-1) and ranks beyond the tree never match; depth beyond K never matches
    ranks = np.array([[-1, 0], [0, -1], [0, 5], [7, 0]])
    np.testing.assert_array_equal(accepted_lengths(ranks, tree), [1, 2, 2, 1])
    np.testing.assert_array_equal(accepted_lengths(ranks[:, :1], Tree(((0,), (0, 0)))), [1, 2, 2, 1])


def test_empty_tree_gives_one():
    rng = np.random.default_rng(1)
    ranks = random_ranks(rng, 50, 3, 4)
    seq = np.repeat(np.arange(5), 10)
    empty = Tree(())
    np.testing.assert_array_equal(accepted_lengths(ranks, empty), np.ones(50))
    assert simulate_tokens_per_step(ranks, seq, empty) == (1.0, 50)
    assert simulated_tau_curve(empty, ranks, seq).tolist() == [1.0]


def test_position_mean_is_joint_tau():
    """With every head labelled at every position, joint tau (1 + sum of prefix frequencies) is
    exactly the mean over positions of A_T: the identity behind the joint statistics."""
    rng = np.random.default_rng(2)
    K, W, N = 4, 6, 5000
    # autocorrelated: an easy/hard state per stretch of positions
    easy = np.repeat(rng.random(N // 25) < 0.5, 25)
    p = np.where(easy, 0.8, 0.25)[:, None]
    ranks = (rng.geometric(np.broadcast_to(p, (N, K))) - 1).astype(np.int16)
    table = AccuracyTable.from_ranks(ranks, W)
    assert (table.positions == N).all()
    tree = joint_tree(table, 40)
    seq = np.repeat(np.arange(N // 50), 50)
    for m in (0, 1, 5, 17, 40):
        sub = tree.prefix(m)
        assert accepted_lengths(ranks, sub).mean() == pytest.approx(expected_tokens(sub, table, joint=True), rel=1e-12)
    curve = simulated_tau_curve(tree, ranks, seq)
    assert curve.shape == (41,) and curve[0] == 1.0
    cut = simulated_tau_curve(tree, ranks, seq, start_rows=37)
    for m in range(41):
        assert curve[m] == simulate_tokens_per_step(ranks, seq, tree.prefix(m))[0]
        assert cut[m] == simulate_tokens_per_step(ranks, seq, tree.prefix(m), start_rows=37)[0]
    # length-biased sampling: the walk lands on hard stretches more often than tau assumes
    tau = expected_tokens(tree, table, joint=True)
    assert curve[-1] < tau - 0.05


def test_bad_inputs():
    tree = Tree(((0,),))
    with pytest.raises(UserError, match="non-decreasing.*row 2 has sequence 0 after 1"):
        simulate_tokens_per_step(np.zeros((3, 2), int), np.array([0, 1, 0]), tree)
    with pytest.raises(UserError, match=r"expected shape \(3,\)"):
        simulate_tokens_per_step(np.zeros((3, 2), int), np.array([0, 1]), tree)
    with pytest.raises(UserError, match="start_rows: must be an integer >= 1"):
        simulate_tokens_per_step(np.zeros((3, 2), int), np.zeros(3, int), tree, start_rows=0)
    with pytest.raises(UserError, match="no positions"):
        simulate_tokens_per_step(np.zeros((0, 2), int), np.zeros(0, int), tree)
    with pytest.raises(UserError, match=r"expected an \(N, K\) array"):
        accepted_lengths(np.zeros(3, int), tree)
    child_first = Tree(((0, 0), (0,)))
    np.testing.assert_array_equal(accepted_lengths(np.array([[0, 0]]), child_first), [3])
    with pytest.raises(UserError, match=r"node \[0, 0\] comes before its parent"):
        simulated_tau_curve(child_first, np.array([[0, 0]]), np.zeros(1, int))


def test_sidecar_roundtrip_and_errors(tmp_path):
    rng = np.random.default_rng(3)
    ranks = random_ranks(rng, 40, 3, 5).astype(np.int16)
    ranks = np.minimum(ranks, 5)
    seq = np.repeat(np.arange(4), 10).astype(np.int32)
    acc = tmp_path / "acc.json"
    assert rank_vectors_path(acc) == tmp_path / "acc.ranks.npz"
    assert rank_vectors_path(tmp_path / "acc") == tmp_path / "acc.ranks.npz"
    assert load_rank_vectors(acc) is None  # no sidecar
    table = AccuracyTable.from_ranks(ranks, 5)
    table.save(acc)
    save_rank_vectors(rank_vectors_path(acc), ranks, seq, 5, {"model": "x"})
    first = rank_vectors_path(acc).read_bytes()
    save_rank_vectors(rank_vectors_path(acc), ranks, seq, 5, {"model": "x"})
    assert rank_vectors_path(acc).read_bytes() == first  # deterministic bytes
    got_ranks, got_seq = load_rank_vectors(acc)
    assert got_ranks.dtype == np.int16 and got_seq.dtype == np.int32
    np.testing.assert_array_equal(got_ranks, ranks)
    np.testing.assert_array_equal(got_seq, seq)
    with np.load(rank_vectors_path(acc)) as z:  # a plain npz
        assert int(z["width"]) == 5 and '"model": "x"' in str(z["fingerprint"])
    # a table from another run beside it
    AccuracyTable.from_ranks(ranks[:30], 5).save(acc)
    with pytest.raises(UserError, match=r"acc\.ranks\.npz: does not belong to the accuracy table"):
        load_rank_vectors(acc)
    assert load_rank_vectors(acc, table=table)[0].shape == (40, 3)
    rank_vectors_path(acc).write_bytes(b"garbage")
    with pytest.raises(UserError, match=r"acc\.ranks\.npz: not a readable rank-vector file"):
        load_rank_vectors(acc)
    np.savez(rank_vectors_path(acc), ranks=ranks)
    with pytest.raises(UserError, match=r"acc\.ranks\.npz: not a rank-vector file \(no 'sequence'"):
        load_rank_vectors(acc)
