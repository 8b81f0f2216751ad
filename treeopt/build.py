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
            raise UserError(param="max_children", message=f"{len(max_children)} values for max depth {D} (one per depth needed)")
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
        raise UserError(param="nodes", message=f"{nodes} exceeds the {cap} nodes a tree can have with max depth {D} "
                                               f"and max children {','.join(map(str, widths))}")
    return int(nodes)


def greedy_tree(acc, nodes: int, *, max_depth=None, max_children=None) -> Tree:
    """Medusa's greedy (docs/builders.md "Medusa's greedy"); the paths are the proposal sequence, so
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


def _maxplus(old: np.ndarray, h: np.ndarray, diff: np.ndarray, valid: np.ndarray):
    """new[m] = max_j old[m - j] + h[j], and the maximising j (the smallest on ties)."""
    vals = np.where(valid, old[diff] + h[None, :], -np.inf)
    pick = np.argmax(vals, axis=1)
    return vals[np.arange(len(old)), pick], pick


def optimal_tree(acc, nodes: int, *, max_depth=None, max_children=None) -> Tree:
    """The tree of exactly `nodes` nodes with the greatest tau under independent heads.

    Tree knapsack: every value below a node scales with the node's value, so the best total
    g[d][m] of m nodes below a depth-d node depends only on (d, m). A depth-d node's children
    are ranks r < max_children[d]; giving child r a subtree of j nodes is worth
    acc[d][r] * (1 + g[d+1][j-1]), independent of its siblings, so the children combine as a
    grouped knapsack (max-plus convolution over ranks). Non-monotone accuracies are fine: a
    rank may be used without the ranks before it.
    Paths come out in decreasing value (ties: shallower, then smaller path), so every prefix
    is a valid tree, though only the full size is guaranteed optimal.
    """
    a = _check_acc(acc)
    D, widths = _limits(*a.shape, max_depth, max_children)
    n = _check_nodes(nodes, D, widths)
    if n == 0:
        return Tree((), name="optimal")
    size = n + 1
    ms = np.arange(size)
    diff = ms[:, None] - ms[None, :]
    valid = diff >= 0
    diff = np.where(valid, diff, 0)

    g = np.full(size, -np.inf)  # below a depth-D node nothing fits
    g[0] = 0.0
    picks: list[list[np.ndarray]] = [None] * D  # picks[d][r][m]: nodes under child r
    for d in range(D - 1, -1, -1):
        inner = 1.0 + g[:-1]  # child subtree of j nodes: itself + j-1 below it
        best = np.full(size, -np.inf)
        best[0] = 0.0
        stage = []
        finite = np.isfinite(inner)  # multiply only there: 0 * -inf would be nan
        for r in range(widths[d]):
            h = np.full(size, -np.inf)
            h[0] = 0.0
            np.multiply(a[d, r], inner, out=h[1:], where=finite)
            best, pick = _maxplus(best, h, diff, valid)
            stage.append(pick)
        picks[d] = stage
        g = best
    if not np.isfinite(g[n]):  # cannot happen once _check_nodes passed; keep the guard cheap
        raise UserError(param="nodes", message=f"no tree of {n} nodes fits the limits")

    out: list[tuple[float, tuple[int, ...]]] = []
    stack = [((), 1.0, n)]  # (node path, its value, nodes to place below it)
    while stack:
        path, value, m = stack.pop()
        d = len(path)
        if m == 0:
            continue
        # Undo the knapsack stages last rank first: picks[d][r] was chosen after ranks < r.
        for r in reversed(range(widths[d])):
            j = int(picks[d][r][m])
            if j:
                child = path + (r,)
                v = value * a[d, r]
                out.append((v, child))
                stack.append((child, v, j - 1))
                m -= j
    out.sort(key=lambda vp: (-vp[0], len(vp[1]), vp[1]))
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
        (p, c)
        for p, c in table.joint.items()
        if c > 0 and len(p) <= D and all(r < widths[j] for j, r in enumerate(p))
    ]
    if n > len(items):
        raise UserError(param="nodes", message=f"{n} exceeds the {len(items)} prefixes observed in {src}'s joint "
                                               "statistics within the limits")
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
