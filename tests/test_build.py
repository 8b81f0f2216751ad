from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeopt.accuracy import AccuracyTable, expected_tokens, load_accuracy
from treeopt.build import build_tree, greedy_tree, joint_tree, max_nodes, optimal_tree, tau_curve
from treeopt.errors import UserError
from treeopt.tau import proposal_sequence, tau_curves
from treeopt.tree import Tree, make_tree, reference_trees

MEDUSA_CSV = str(resources.files("treeopt").joinpath("data/medusa_train_accuracy.csv"))


def value(path, acc):
    v = 1.0
    for j, r in enumerate(path):
        v *= acc[j][r]
    return v


def greedy_reference(acc, n, max_depth, max_children):
    """docs/builders.md#medusas-greedy, word for word: walk the chosen nodes in insertion order, propose the
    next sibling then the first child, skip chosen ones, keep the strictly greatest."""
    chosen = [(0,)]
    while len(chosen) < n:
        best, best_v = None, None
        for node in chosen:
            proposals = []
            if node[-1] + 1 < max_children[len(node) - 1]:
                proposals.append(node[:-1] + (node[-1] + 1,))
            if len(node) < max_depth:
                proposals.append(node + (0,))
            for p in proposals:
                if p in chosen:
                    continue
                v = value(p, acc)
                if best is None or v > best_v:
                    best, best_v = p, v
        chosen.append(best)
    return chosen[:n]


def all_trees_best(acc, max_depth, widths, n_max):
    """Brute force: the best tau of every prefix-closed node set of each size <= n_max."""
    nodes = []
    level = [()]
    for d in range(max_depth):
        level = [p + (r,) for p in level for r in range(widths[d])]
        nodes += level
    best = [-1.0] * (n_max + 1)

    def walk(i, chosen, total):
        if total > best[len(chosen)]:
            best[len(chosen)] = total
        if len(chosen) == n_max:
            return
        for j in range(i, len(nodes)):
            p = nodes[j]
            # Nodes are added in canonical order, so each set is visited once.
            if len(p) == 1 or p[:-1] in chosen:
                chosen.add(p)
                walk(j + 1, chosen, total + value(p, acc))
                chosen.remove(p)

    walk(0, set(), 1.0)
    return best


@st.composite
def acc_matrices(draw, max_heads=4, max_width=4, ties=False):
    K = draw(st.integers(1, max_heads))
    R = draw(st.integers(1, max_width))
    elems = st.sampled_from([0.0, 0.1, 0.2, 0.3]) if ties else st.floats(0.0, 1.0)
    a = np.array(draw(st.lists(st.lists(elems, min_size=R, max_size=R), min_size=K, max_size=K)))
    # Each head's ranks sum to at most 1, as probabilities of disjoint events do.
    return a / np.maximum(a.sum(axis=1, keepdims=True), 1.0)


# --- greedy -----------------------------------------------------------------------------------


def test_greedy_small_case_by_hand():
    acc = np.array([[0.6, 0.2, 0.1], [0.5, 0.3, 0.1]])
    t = greedy_tree(acc, 6)
    # [0]=.6; [0,0]=.3 beats [1]=.2; then [1]=.2; then [0,1]=.18 beats [2]=[1,0]=.1; then the
    # tie [2] vs [1,0] (both exactly 0.1): both are proposed by [1], its sibling first.
    assert t.paths == ((0,), (0, 0), (1,), (0, 1), (2,), (1, 0))
    assert t.name == "greedy"


def test_greedy_reproduces_the_published_tree_order():
    # Medusa's greedy on the authors' own vicuna-7b accuracies reproduces mc_sim_7b_63's
    # first 13 nodes exactly; node 14 is [0, 5], a rank the 5-wide published table lacks.
    acc = load_accuracy(MEDUSA_CSV, model="vicuna-7b").accuracy
    mc = reference_trees()["mc_sim_7b_63"]
    assert greedy_tree(acc, 13).paths == mc.paths[:13]
    assert mc.paths[13] == (0, 5)


@settings(max_examples=100, deadline=None)
@given(acc_matrices(ties=True), st.data())
def test_greedy_matches_the_design_text(acc, data):
    K, R = acc.shape
    depth = data.draw(st.integers(1, K))
    widths = data.draw(st.lists(st.integers(1, R), min_size=depth, max_size=depth))
    cap = max_nodes(K, R, max_depth=depth, max_children=widths)
    n = data.draw(st.integers(0, min(cap, 30)))
    t = greedy_tree(acc, n, max_depth=depth, max_children=widths)
    assert list(t.paths) == (greedy_reference(acc, n, depth, widths) if n else [])
    for m in range(n + 1):  # every prefix is a tree (prefix() validates) and the greedy tree
        assert t.prefix(m).size == m


def test_greedy_limits():
    acc = np.full((3, 4), 0.2)
    t = greedy_tree(acc, max_nodes(3, 4, max_depth=2, max_children=[3, 2]), max_depth=2, max_children=[3, 2])
    assert t.size == 3 + 6 and t.depth == 2 and t.max_rank_per_depth == (2, 1)
    assert greedy_tree(acc, 0).size == 0
    # One int applies to all depths; a list sets the depth when max_depth is not given.
    assert greedy_tree(acc, 14, max_children=2).size == 14
    assert greedy_tree(acc, 6, max_children=[2, 2]).depth == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"nodes": 100, "max_depth": 2},
            "nodes: 100 exceeds the 20 nodes a tree can have with max depth 2 and max children 4,4",
        ),
        ({"nodes": 3, "max_depth": 4}, "max_depth: 4 exceeds the accuracy table's 3 heads"),
        ({"nodes": 3, "max_depth": 0}, "max_depth: must be a positive integer"),
        ({"nodes": 3, "max_children": [4, 5, 1]}, "max_children: 5 at depth 2 exceeds the accuracy table's width 4"),
        ({"nodes": 3, "max_children": [4, -1, 1]}, "max_children: -1 at depth 2 is negative"),
        ({"nodes": 3, "max_depth": 3, "max_children": [4, 4]}, "max_children: 2 values for max depth 3"),
        ({"nodes": -1}, "nodes: must be a non-negative integer"),
        ({"nodes": 2.5}, "nodes: must be a non-negative integer"),
    ],
)
@pytest.mark.parametrize("builder", [greedy_tree, optimal_tree])
def test_builder_errors(builder, kwargs, message):
    with pytest.raises(UserError) as err:
        builder(np.full((3, 4), 0.2), **kwargs)
    assert message in str(err.value)


def test_bad_accuracy_matrix():
    for acc in (np.full((2, 3), 1.5), np.array([0.5, 0.2]), np.array([[np.nan]])):
        with pytest.raises(UserError, match="accuracy"):
            greedy_tree(acc, 1)


# --- optimal ----------------------------------------------------------------------------------


def test_optimal_uses_a_rank_without_its_predecessor():
    acc = np.array([[0.1, 0.5, 0.05], [0.9, 0.0, 0.0]])
    t = optimal_tree(acc, 2)
    assert set(t.paths) == {(1,), (1, 0)}  # tau 1 + .5 + .45 ; greedy must start with [0]
    assert expected_tokens(t, acc) == pytest.approx(1.95)
    assert expected_tokens(greedy_tree(acc, 2), acc) == pytest.approx(1 + 0.1 + 0.5)
    assert t.paths == ((1,), (1, 0))  # decreasing value: every prefix is a tree


@settings(max_examples=80, deadline=None)
@given(acc_matrices(max_heads=3, max_width=3), st.data())
def test_optimal_matches_brute_force(acc, data):
    K, R = acc.shape
    depth = data.draw(st.integers(1, K))
    widths = data.draw(st.lists(st.integers(1, R), min_size=depth, max_size=depth))
    cap = max_nodes(K, R, max_depth=depth, max_children=widths)
    n_max = min(cap, 6)
    best = all_trees_best(acc, depth, widths, n_max)
    for n in range(n_max + 1):
        t = optimal_tree(acc, n, max_depth=depth, max_children=widths)
        assert t.size == n and t.depth <= depth
        assert all(p[j] < widths[j] for p in t.paths for j in range(len(p)))
        assert expected_tokens(t, acc) == pytest.approx(best[n], rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(acc_matrices(max_heads=5, max_width=6), st.integers(1, 60), st.booleans())
def test_optimal_never_worse_than_greedy_and_equal_when_monotone(acc, n, monotone):
    if monotone:
        acc = -np.sort(-acc, axis=1)
    n = min(n, max_nodes(*acc.shape))
    g = expected_tokens(greedy_tree(acc, n), acc)
    o = expected_tokens(optimal_tree(acc, n), acc)
    assert o >= g - 1e-12
    if monotone:
        assert o == pytest.approx(g, rel=1e-12, abs=1e-12)


def test_optimal_equals_greedy_on_medusa_accuracies():
    for model in ("vicuna-7b", "vicuna-13b", "vicuna-33b"):
        acc = load_accuracy(MEDUSA_CSV, model=model).accuracy  # non-increasing per head
        for n in (1, 16, 63, 200):
            assert expected_tokens(optimal_tree(acc, n), acc) == pytest.approx(
                expected_tokens(greedy_tree(acc, n), acc), rel=1e-12
            )


# --- joint ------------------------------------------------------------------------------------


def joint_table(seed=0, n=400, K=3, R=3):
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 2, size=(n, 1))  # correlated heads: independence is wrong here
    ranks = np.minimum(shared + rng.geometric(0.6, size=(n, K)) - 1, R + 1)
    return AccuracyTable.from_ranks(ranks, R)


def test_joint_tree_takes_the_most_frequent_prefixes():
    ranks = np.array([[0, 0]] * 5 + [[1, 0]] * 3 + [[0, 1]] * 3 + [[2, 9]] * 1)
    t = AccuracyTable.from_ranks(ranks, 3)
    # counts: [0]=8, [0,0]=5, [1]=3, [1,0]=3, [0,1]=3, [2]=1; ties: shallower, then earlier
    assert joint_tree(t, 5).paths == ((0,), (0, 0), (1,), (0, 1), (1, 0))
    assert joint_tree(t, 6).paths[-1] == (2,)
    assert joint_tree(t, 3, max_depth=1).paths == ((0,), (1,), (2,))
    assert joint_tree(t, 3, max_children=[2, 1]).paths == ((0,), (0, 0), (1,))
    with pytest.raises(UserError, match="nodes: 7 exceeds the 6 prefixes observed"):
        joint_tree(t, 7)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 1000), st.integers(1, 6))
def test_joint_tree_is_optimal_under_joint_tau(seed, n):
    # Every head labels every position here, so values are counts / N and the most frequent
    # prefixes maximise the joint tau: compare with brute force over all trees.
    t = joint_table(seed)
    n = min(n, len([c for c in t.joint.values() if c > 0]))
    tree = joint_tree(t, n)
    best = -1.0
    observed = sorted(t.joint, key=lambda p: (len(p), p))

    def walk(i, chosen):
        nonlocal best
        if len(chosen) == n:
            best = max(best, expected_tokens(Tree(tuple(chosen)), t, joint=True))
            return
        for j in range(i, len(observed)):
            p = observed[j]
            if len(p) == 1 or p[:-1] in chosen:
                walk(j + 1, chosen + [p])

    walk(0, [])
    assert expected_tokens(tree, t, joint=True) == pytest.approx(best)


def test_joint_tree_needs_joint_statistics():
    t = load_accuracy(MEDUSA_CSV, model="vicuna-7b")
    with pytest.raises(UserError, match="medusa_train_accuracy.csv: has no joint statistics"):
        joint_tree(t, 3)


# --- dispatch and curves ----------------------------------------------------------------------


def test_build_tree_dispatch():
    t = joint_table()
    assert build_tree(t, 5).paths == greedy_tree(t.accuracy, 5).paths
    assert build_tree(t, 5, "optimal", max_depth=2).paths == optimal_tree(t.accuracy, 5, max_depth=2).paths
    assert build_tree(t, 5, "joint").paths == joint_tree(t, 5).paths
    with pytest.raises(UserError, match="method: 'beam' is not one of greedy, optimal, joint"):
        build_tree(t, 5, "beam")


def test_tau_curve_is_tau_of_each_prefix():
    t = joint_table()
    tree = greedy_tree(t.accuracy, 20)
    curve = tau_curve(tree, t)
    assert curve.shape == (21,) and curve[0] == 1.0
    for m in (0, 1, 7, 20):
        assert curve[m] == pytest.approx(expected_tokens(tree.prefix(m), t))
    joint_curve = tau_curve(tree, t, joint=True)
    assert joint_curve[20] == pytest.approx(expected_tokens(tree, t, joint=True))
    assert np.all(np.diff(curve) >= 0)


def test_max_nodes():
    assert max_nodes(5, 10) == 10 + 100 + 1000 + 10_000 + 100_000
    assert max_nodes(5, 10, max_depth=2, max_children=[3, 2]) == 3 + 6
    assert max_nodes(3, 4, max_children=[2, 0, 4]) == 2


def test_trees_are_valid_medusa_choices():
    acc = load_accuracy(MEDUSA_CSV, model="vicuna-13b").accuracy
    for builder in (greedy_tree, optimal_tree):
        t = builder(acc, 63)
        assert make_tree(t.to_choices(), topk=5, num_heads=5).paths == t.paths


def test_chain_proposal_is_one_top1_guess_per_depth():
    # rank vectors by hand: each head's guess is right (rank 0) at 3 of the 4 positions; a chain
    # of gamma accepts depth d only when every depth before it was right
    ranks = np.array([[0, 0, 0], [0, 0, 1], [0, 2, 0], [1, 0, 0]])
    table = AccuracyTable.from_ranks(ranks, 3)
    chain = proposal_sequence(table, 5, method="chain")
    assert chain.paths == ((0,), (0, 0), (0, 0, 0))  # capped at the 3 heads calibrated
    # independent heads: 1 + a1 + a1 a2 + a1 a2 a3 with a = 3/4, 3/4, 3/4 (rank 0 counts)
    a = [3 / 4, 3 / 4, 3 / 4]
    want = [1, 1 + a[0], 1 + a[0] + a[0] * a[1], 1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2]]
    np.testing.assert_allclose(tau_curves(table, chain).independent, want)
