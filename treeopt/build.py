"""Tree builders: Medusa's greedy, the exact optimum under independent heads, and the most
frequent prefixes under joint statistics (docs/builders.md).

Limits shared by all builders: `max_depth` (default: the number of heads) and `max_children`,
an int or one int per depth: at depth d only ranks < max_children[d-1] may be used. That is
Medusa's rule (a sibling is proposed only while last rank + 1 < max children), so it bounds
the children of each node at depth d-1 as well.
"""

from __future__ import annotations

import heapq

import numpy as np

from treeopt.accuracy import AccuracyTable, node_values
from treeopt.errors import UserError
from treeopt.tree import Tree

METHODS = ("greedy", "optimal", "joint")


def _check_acc(acc) -> np.ndarray:
    a = np.asarray(acc.accuracy if isinstance(acc, AccuracyTable) else acc, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise UserError(f"accuracy: expected a (heads, width) matrix, got shape {a.shape}")
    if not np.isfinite(a).all() or (a < 0).any() or (a > 1).any():
        raise UserError("accuracy: every per-rank accuracy must be a number in [0, 1]")
    return a


def _limits(K: int, R: int, max_depth, max_children) -> tuple[int, list[int]]:
    """Resolve (depth, allowed ranks per depth) and check them against the table's shape."""
    if max_children is not None and not isinstance(max_children, (int, np.integer)):
        max_children = [int(c) for c in max_children]
        if max_depth is None:
            max_depth = min(K, len(max_children))
    if max_depth is None:
        max_depth = K
    if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)) or max_depth < 1:
        raise UserError(param="max_depth", message=f"must be a positive integer, got {max_depth!r}")
    if max_depth > K:
        raise UserError(param="max_depth", message=f"{max_depth} exceeds the accuracy table's {K} heads")
    D = int(max_depth)
    if max_children is None:
        widths = [R] * D
    elif isinstance(max_children, (int, np.integer)):
        widths = [int(max_children)] * D
    else:
        if len(max_children) < D:
            raise UserError(
                param="max_children", message=f"{len(max_children)} values for max depth {D} (one per depth needed)"
            )
        widths = max_children[:D]
    for d, w in enumerate(widths, start=1):
        if w < 0:
            raise UserError(param="max_children", message=f"{w} at depth {d} is negative")
        if w > R:
            raise UserError(param="max_children", message=f"{w} at depth {d} exceeds the accuracy table's width {R}")
    return D, widths


def _capacity(widths: list[int]) -> int:
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


def max_nodes(num_heads: int, width: int, *, max_depth=None, max_children=None) -> int:
    """The largest tree the limits allow: the builders accept at most this many nodes."""
    return _capacity(_limits(num_heads, width, max_depth, max_children)[1])


def _check_nodes(nodes, D: int, widths: list[int]) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 0:
        raise UserError(param="nodes", message=f"must be a non-negative integer, got {nodes!r}")
    cap = _capacity(widths)
    if nodes > cap:
        raise UserError(
            param="nodes",
            message=f"{nodes} exceeds the {cap} nodes a tree can have with max depth {D} "
            f"and max children {','.join(map(str, widths))}",
        )
    return int(nodes)


def greedy_tree(acc, nodes: int, *, max_depth=None, max_children=None) -> Tree:
    """Medusa's greedy (docs/builders.md#medusas-greedy); the paths are the proposal sequence, so
    `.prefix(n)` is the greedy tree of n nodes.

    Every node is proposed by exactly one chosen node (its previous sibling, or its parent if
    it has rank 0), so the frontier lives in a heap keyed by (-value, proposer's insertion
    index, sibling before child): the strictly greatest value, ties to the earliest proposal
    of the walk, in O(n log n) instead of re-walking all chosen nodes every round.
    """
    a = _check_acc(acc)
    D, widths = _limits(*a.shape, max_depth, max_children)
    n = _check_nodes(nodes, D, widths)
    if n == 0:
        return Tree((), name="greedy")
    paths: list[tuple[int, ...]] = []
    values: list[float] = []
    # (neg value, proposer index, kind, path, parent value)
    heap = [(-a[0, 0], -1, 0, (0,), 1.0)]
    while len(paths) < n:
        neg, _, _, path, pv = heapq.heappop(heap)
        i = len(paths)
        paths.append(path)
        values.append(-neg)
        d = len(path)
        r = path[-1]
        if r + 1 < widths[d - 1]:
            heapq.heappush(heap, (-(pv * a[d - 1, r + 1]), i, 0, path[:-1] + (r + 1,), pv))
        if d < D and widths[d] > 0:
            heapq.heappush(heap, (-(-neg * a[d, 0]), i, 1, path + (0,), -neg))
    return Tree(tuple(paths), name="greedy")


def optimal_tree(acc, nodes: int, *, max_depth=None, max_children=None) -> Tree:
    """The tree of exactly `nodes` nodes with the greatest tau under independent heads
    (docs/builders.md#exact-optimum).

    Exactness: a node's value is the product of the accuracies along its path, so
    - a child is worth at most its parent (accuracies are <= 1);
    - relabelling the ranks of one depth by a permutation maps trees to trees (the allowed
      ranks at depth d are a set, ranks < max_children[d-1], whatever the parent) and keeps
      every node's value, only moving it.
    Sort the allowed ranks of every depth by decreasing accuracy. In the sorted labels a
    sibling of sorted rank s+1 is worth at most the one of rank s, and a child at most its
    parent, so every node's proposer (previous sibling, or parent for sorted rank 0) is worth
    at least the node itself: Medusa's greedy then takes the n largest values among all
    admissible nodes (docs/builders.md#when-the-top-n-nodes-are-optimal), and no n-node
    tree can have more. Mapping the sorted labels back gives an optimal tree of the original
    ranks; non-monotone accuracies are handled by the sort, a rank may be used without the
    ranks before it.

    Cost: O(D R log R) for the sort and O(n log n) for the greedy, O(n + D R) memory: a
    table of 8 heads x 1,000 ranks at 2,048 nodes takes milliseconds.
    Paths come out in decreasing value (ties: shallower, then smaller path), so every prefix
    is a valid tree, and an optimal one of its size: it holds the largest admissible values.
    """
    a = _check_acc(acc)
    D, widths = _limits(*a.shape, max_depth, max_children)
    n = _check_nodes(nodes, D, widths)
    if n == 0:
        return Tree((), name="optimal")
    # order[d][s] = the original rank of sorted rank s at depth d+1 (ties: smaller rank first);
    # ranks beyond max_children stay in place and the greedy never reaches them.
    R = a.shape[1]
    order = np.tile(np.arange(R), (D, 1))
    for d in range(D):
        order[d, : widths[d]] = np.argsort(-a[d, : widths[d]], kind="stable")
    ranked = np.take_along_axis(a[:D], order, axis=1)
    sorted_tree = greedy_tree(ranked, n, max_depth=D, max_children=widths)
    sorted_ranks = sorted_tree.rank_matrix  # (n, depth), -1 past each node's depth
    used = sorted_ranks >= 0
    depth_of_column = np.arange(sorted_ranks.shape[1])[None, :]
    ranks = np.where(used, order[depth_of_column, np.maximum(sorted_ranks, 0)], -1)
    factors = np.where(used, a[depth_of_column, np.maximum(ranks, 0)], 1.0)
    values = np.ones(len(ranks))
    for d in range(factors.shape[1]):  # root to leaf, as the greedy multiplies: a child never
        values *= factors[:, d]  # rounds above its parent, so value order is tree order
    paths = [tuple(r for r in row if r >= 0) for row in ranks.tolist()]
    out = sorted(zip(values.tolist(), paths, strict=True), key=lambda vp: (-vp[0], len(vp[1]), vp[1]))
    return Tree(tuple(p for _, p in out), name="optimal")


def joint_tree(table: AccuracyTable, nodes: int, *, max_depth=None, max_children=None) -> Tree:
    """The `nodes` most frequent observed prefixes (ties: shallower, then smaller path).

    Counts never grow from parent to child, so the selection is prefix-closed and, with equal
    per-depth denominators, maximises the joint tau. Unobserved prefixes are never added:
    asking for more nodes than were observed within the limits is an error.
    """
    src = table.provenance.get("source", "accuracy table")
    if table.joint is None:
        raise UserError(f"{src}: has no joint statistics (the joint method needs them)")
    D, widths = _limits(table.num_heads, table.width, max_depth, max_children)
    n = _check_nodes(nodes, D, widths)
    items = [
        (p, c) for p, c in table.joint.items() if c > 0 and len(p) <= D and all(r < widths[j] for j, r in enumerate(p))
    ]
    if n > len(items):
        raise UserError(
            param="nodes",
            message=f"{n} exceeds the {len(items)} prefixes observed in {src}'s joint statistics within the limits",
        )
    top = heapq.nsmallest(n, items, key=lambda pc: (-pc[1], len(pc[0]), pc[0]))
    return Tree(tuple(p for p, _ in top), name="joint")


def build_tree(table: AccuracyTable, nodes: int, method: str = "greedy", **limits) -> Tree:
    """Dispatch to greedy_tree / optimal_tree (per-rank accuracies) or joint_tree."""
    if method == "greedy":
        return greedy_tree(table.accuracy, nodes, **limits)
    if method == "optimal":
        return optimal_tree(table.accuracy, nodes, **limits)
    if method == "joint":
        return joint_tree(table, nodes, **limits)
    raise UserError(f"method: {method!r} is not one of {', '.join(METHODS)}")


def tau_curve(tree: Tree, table_or_acc, *, joint: bool = False, strict: bool = True) -> np.ndarray:
    """(n+1,) tau of prefix(m) for m = 0..n: 1 + cumulative node values in insertion order."""
    vals = node_values(tree, table_or_acc, joint=joint, strict=strict)
    return np.concatenate(([1.0], 1.0 + np.cumsum(vals)))
