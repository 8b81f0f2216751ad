"""Builders that search within an engine's family of trees (docs/engines.md#building-within-a-family): greedy, optimal
and joint, each returning a tree the engine drafts as written.

- static families without sibling rules (treeopt, medusa): the core builders with the
  engine's rank and depth limits (docs/builders.md).
- left-closed siblings (trtllm at depth 1, hydra everywhere) and hydra's grounded expansion:
  an exact tree knapsack whose children stage admits only ranks 0..c-1 (and, grounded, only
  ranks 0..e-1 with children of their own); greedy and joint add the best admissible node
  one at a time, so every prefix is in the family.
- vLLM: every uniform tree of the size (one child count per level) is enumerated.
- SGLang: every (steps, topk) is simulated; the draft of num_draft_tokens is the best
  num_draft_tokens - 1 of its candidates, so one pair gives a nested sequence of trees.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from treeopt.accuracy import AccuracyTable, expected_tokens
from treeopt.build import build_tree, greedy_tree, max_nodes, tau_curve
from treeopt.engines import ENGINES, Engine, beam_fits, check, sglang_candidates, uniform_tree
from treeopt.errors import UserError
from treeopt.tree import Tree

__all__ = [
    "FamilyLimits",
    "family_limits",
    "build_for_engine",
    "engine_proposal",
    "optimal_in_family",
    "greedy_in_family",
    "uniform_counts",
    "best_uniform",
    "best_sglang",
]


@dataclass(frozen=True)
class FamilyLimits:
    """A static family resolved against an accuracy table: depth, ranks allowed (< width),
    left-closed siblings at depths 1..left_closed_depth, grounded expansion."""

    depth: int
    width: int
    left_closed_depth: int
    grounded: bool

    @property
    def widths(self) -> list[int]:
        return [self.width] * self.depth


def _maxplus(old: np.ndarray, h: np.ndarray, diff: np.ndarray, valid: np.ndarray):
    """new[m] = max_j old[m - j] + h[j] (a max-plus convolution step of the tree knapsack), and
    the maximising j (the smallest on ties)."""
    vals = np.where(valid, old[diff] + h[None, :], -np.inf)
    pick = np.argmax(vals, axis=1)
    return vals[np.arange(len(old)), pick], pick


def family_limits(engine: Engine, num_heads: int, width: int, heads: int | None = None) -> FamilyLimits:
    if heads is not None and not 1 <= int(heads) <= num_heads:
        raise UserError(f"--heads: {heads} heads asked for, the accuracy table has {num_heads}")
    depth = engine.depth_bound(num_heads if heads is None else int(heads))
    return FamilyLimits(int(depth), int(engine.width_bound(width)), engine.left_closed_depth, engine.grounded)


def _joint_value(table: AccuracyTable):
    src = table.provenance.get("source", "accuracy table")
    if table.joint is None:
        raise UserError(f"{src}: has no joint statistics (the joint method needs them)")

    def value(path):
        return table.joint.get(path, 0) / table.positions[len(path) - 1]

    return value


def _independent_value(acc: np.ndarray):
    def value(path):
        return float(np.prod(acc[np.arange(len(path)), list(path)]))

    return value


# ---------------------------------------------------------------------------------------------
# Static families


def greedy_in_family(
    value, nodes: int, limits: FamilyLimits, *, name: str = "greedy", observed_only: bool = False, up_to: bool = False
) -> Tree:
    """Add the admissible node of greatest value (ties: shallower, then smaller path) `nodes`
    times. A node is admissible when its parent is in, it fits the depth and width, at a
    left-closed depth it is its parent's next rank, and, grounded, a parent of rank r > 0 gets
    its first child only once its previous sibling has one. `observed_only`: never add a node
    of value 0 (joint statistics: an unobserved prefix). `up_to`: stop early, without an error,
    when no admissible node is left."""
    chosen: list[tuple[int, ...]] = []
    have: set[tuple[int, ...]] = set()
    children: dict[tuple[int, ...], int] = defaultdict(int)
    for _ in range(nodes):
        best = None
        for q in [(), *chosen]:
            d = len(q)
            if d >= limits.depth or limits.width == 0:
                continue
            if limits.grounded and d >= 1 and q[-1] > 0 and children[q] == 0 and children[q[:-1] + (q[-1] - 1,)] == 0:
                continue
            if d + 1 <= limits.left_closed_depth:
                ranks = [children[q]] if children[q] < limits.width else []
            else:
                ranks = [r for r in range(limits.width) if q + (r,) not in have]
            for r in ranks:
                p = q + (r,)
                v = value(p)
                if observed_only and v <= 0:
                    continue
                key = (-v, len(p), p)
                if best is None or key < best:
                    best = key
        if best is None and up_to:
            break
        if best is None:
            what = "observed prefixes" if observed_only else "nodes"
            raise UserError(
                param="nodes", message=f"{nodes} exceeds the {len(chosen)} {what} the engine's family admits here"
            )
        p = best[2]
        chosen.append(p)
        have.add(p)
        children[p[:-1]] += 1
    return Tree(tuple(chosen), name=name)


class _Stage:
    """The children of one node at depth d (their ranks < width, accuracies a_row): best[m] is
    the greatest value of m nodes below the node, and `split(m)` the (rank, subtree size) pairs
    that achieve it."""

    def __init__(self, a_row: np.ndarray, inner: np.ndarray, width: int, left_closed: bool, grounded: bool, size: int):
        ms = np.arange(size)
        diff = ms[:, None] - ms[None, :]
        valid = diff >= 0
        diff = np.where(valid, diff, 0)
        empty = np.full(size, -np.inf)
        empty[0] = 0.0
        finite = np.isfinite(inner)
        h = np.full((width, size), -np.inf)  # h[r, j]: child r with a subtree of j nodes
        for r in range(width):
            np.multiply(a_row[r], inner, out=h[r, 1:], where=finite)
        self.width, self.left_closed, self.grounded = width, left_closed, grounded
        self.picks: list[np.ndarray] = []
        if not left_closed:
            # Any subset of ranks: the core's grouped knapsack (docs/builders.md#exact-optimum).
            best = empty
            for r in range(width):
                hr = h[r].copy()
                hr[0] = 0.0
                best, pick = _maxplus(best, hr, diff, valid)
                self.picks.append(pick)
            self.best = best
            return
        min_size = 2 if grounded else 1  # grounded: ranks 0..e-1 each have a child of their own
        expanded = [empty]
        for r in range(width):
            hr = h[r].copy()
            hr[:min_size] = -np.inf
            nxt, pick = _maxplus(expanded[-1], hr, diff, valid)
            expanded.append(nxt)
            self.picks.append(pick)
        if not grounded:
            stack = np.stack(expanded)  # (c + 1, size): exactly ranks 0..c-1
            self.count = np.argmax(stack, axis=0)
            self.best = stack[self.count, ms]
            return
        # Grounded: ranks 0..e-1 with children, then ranks e..e+k-1 as leaves (each worth
        # a_row[r] * (1 + g(0)) = a_row[r] * inner[0]).
        best = np.full(size, -np.inf)
        self.e_of = np.zeros(size, dtype=np.int64)
        self.k_of = np.zeros(size, dtype=np.int64)
        for e in range(width + 1):
            leaves = np.full(size, -np.inf)
            k_max = min(width - e, size - 1)
            leaves[0] = 0.0
            leaves[1 : k_max + 1] = np.cumsum(a_row[e : e + k_max] * inner[0])
            total, k = _maxplus(expanded[e], leaves, diff, valid)
            better = total > best
            best = np.where(better, total, best)
            self.e_of = np.where(better, e, self.e_of)
            self.k_of = np.where(better, k, self.k_of)
        self.best = best

    def split(self, m: int) -> list[tuple[int, int]]:
        out = []
        if not self.left_closed:
            for r in reversed(range(self.width)):
                j = int(self.picks[r][m])
                if j:
                    out.append((r, j))
                    m -= j
            return out
        if self.grounded:
            e, k = int(self.e_of[m]), int(self.k_of[m])
            out += [(r, 1) for r in range(e, e + k)]
            m -= k
            count = e
        else:
            count = int(self.count[m])
        for r in reversed(range(count)):
            j = int(self.picks[r][m])
            out.append((r, j))
            m -= j
        return out


def optimal_in_family(acc, nodes: int, limits: FamilyLimits, *, name: str = "optimal") -> Tree:
    """The tree of exactly `nodes` nodes with the greatest tau under independent heads among the
    trees of `limits` (the tree knapsack of docs/builders.md#exact-optimum with a children
    stage that keeps siblings left-closed, and grounded when asked)."""
    a = np.asarray(acc, dtype=np.float64)
    D, W = limits.depth, limits.width
    cap = max_nodes(a.shape[0], a.shape[1], max_depth=D, max_children=W)
    if not 0 <= nodes <= cap:
        raise UserError(
            param="nodes",
            message=f"{nodes} exceeds the {cap} nodes a tree can have with max depth {D} and max children {W}",
        )
    if nodes == 0:
        return Tree((), name=name)
    size = nodes + 1
    g = np.full(size, -np.inf)
    g[0] = 0.0
    stages: list[_Stage] = [None] * D
    for d in range(D - 1, -1, -1):
        stages[d] = _Stage(a[d], 1.0 + g[:-1], W, d + 1 <= limits.left_closed_depth, limits.grounded, size)
        g = stages[d].best
    if not np.isfinite(g[nodes]):
        raise UserError(param="nodes", message=f"no tree of {nodes} nodes fits the engine's family")
    out: list[tuple[float, tuple[int, ...]]] = []
    stack = [((), 1.0, nodes)]
    while stack:
        path, value, m = stack.pop()
        if m == 0:
            continue
        for r, j in stages[len(path)].split(m):
            child = path + (r,)
            v = value * a[len(path), r]
            out.append((v, child))
            stack.append((child, v, j - 1))
    out.sort(key=lambda vp: (-vp[0], len(vp[1]), vp[1]))
    return Tree(tuple(p for _, p in out), name=name)


# ---------------------------------------------------------------------------------------------
# vLLM and SGLang


def uniform_counts(nodes: int, depth: int, width: int):
    """Every child-count vector (c_1, ..., c_L), L <= depth, 1 <= c_l <= width, whose uniform
    tree has exactly `nodes` nodes (sum over l of c_1 * ... * c_l)."""

    def grow(prefix, level, total):
        if total == nodes:
            yield tuple(prefix)
            return
        if len(prefix) == depth:
            return
        for c in range(1, width + 1):
            if total + level * c > nodes:
                break
            yield from grow(prefix + [c], level * c, total + level * c)

    yield from grow([], 1, 0)


def best_uniform(
    table: AccuracyTable, nodes: int, depth: int, width: int, *, joint: bool = False, name: str = "uniform"
) -> Tree:
    """The uniform tree of `nodes` nodes with the greatest tau (joint statistics when `joint`)."""
    best, best_tau = None, -np.inf
    for counts in uniform_counts(nodes, depth, width):
        tree = uniform_tree(counts, name=name)
        tau = expected_tokens(tree, table, joint=joint)
        if tau > best_tau:
            best, best_tau = tree, tau
    if best is None:
        raise UserError(
            param="nodes",
            message=f"no uniform tree of {nodes} nodes has depth <= {depth} and <= {width} children per node",
        )
    return best


def best_sglang(
    table: AccuracyTable, nodes: int, depth: int, width: int, *, joint: bool = False, engine: Engine | None = None
) -> tuple[Tree, tuple[int, int, int]]:
    """The SGLang draft of `nodes` nodes with the greatest tau over every (steps, topk) with
    steps <= depth and topk <= width, and its (steps, topk, num_draft_tokens); with a beam
    `engine`, only the sizes it takes (`beam_fits`: TensorRT-LLM's dynamic tree)."""
    fits = beam_fits(engine if engine is not None else ENGINES["sglang"])
    best, best_tau, triple = None, -np.inf, None
    for steps in range(1, depth + 1):
        for topk in range(1, width + 1):
            if not fits(nodes, steps, topk):
                continue
            paths, _ = sglang_candidates(table.accuracy, steps, topk)
            tree = Tree(tuple(paths[:nodes]), name="sglang")
            tau = expected_tokens(tree, table, joint=joint)
            if tau > best_tau:
                best, best_tau, triple = tree, tau, (steps, topk, nodes + 1)
    if best is None:
        raise UserError(
            param="nodes", message=f"no SGLang draft of {nodes} nodes with at most {depth} steps and topk {width}"
        )
    return best, triple


# ---------------------------------------------------------------------------------------------
# Dispatch


def build_for_engine(
    table: AccuracyTable, nodes: int, method: str, engine: Engine, *, heads: int | None = None
) -> Tree:
    """The `method` tree of `nodes` nodes within `engine`'s family (docs/engines.md#building-within-a-family). For
    vLLM and SGLang every method searches the whole family; joint
    ranks its members by the joint statistics."""
    if method not in ("greedy", "optimal", "joint"):
        raise UserError(f"method: {method!r} is not one of greedy, optimal, joint")
    limits = family_limits(engine, table.num_heads, table.width, heads)
    joint = method == "joint"
    if joint:
        _joint_value(table)  # the error message when the table has none
    if engine.family == "uniform":
        return best_uniform(table, nodes, limits.depth, limits.width, joint=joint, name=method)
    if engine.family == "beam":
        tree, _ = best_sglang(table, nodes, limits.depth, limits.width, joint=joint, engine=engine)
        return Tree(tree.paths, name=method)
    if not limits.left_closed_depth and not limits.grounded:
        return build_tree(table, nodes, method, max_depth=limits.depth, max_children=limits.width)
    if method == "optimal":
        return optimal_in_family(table.accuracy, nodes, limits)
    if method == "greedy" and not limits.grounded:
        # Medusa's greedy proposes a sibling only after the previous rank: left-closed already.
        return greedy_tree(table.accuracy, nodes, max_depth=limits.depth, max_children=limits.width)
    value = _joint_value(table) if joint else _independent_value(table.accuracy)
    return greedy_in_family(value, nodes, limits, name=method, observed_only=joint)


def engine_proposal(
    table: AccuracyTable, nodes: int, engine: Engine, *, method: str = "auto", heads: int | None = None
) -> Tree:
    """A nested proposal sequence of up to `nodes` nodes every prefix of which `engine` drafts
    as written: the family's greedy (joint: most frequent admissible prefixes) for static
    families; for SGLang the candidates of the (steps, topk) pair with the greatest mean tau
    over the sizes. vLLM's uniform trees of different sizes are not prefixes of one another, so
    it gets a nested sequence of uniform trees instead (`uniform_proposal`), whose prefixes at
    the block boundaries (`drafted_sizes`) are the sizes it drafts as written."""
    if method == "auto":
        method = "joint" if table.joint else "greedy"
    limits = family_limits(engine, table.num_heads, table.width, heads)
    if engine.family == "uniform":
        return uniform_proposal(table, nodes, limits, joint=method == "joint")
    if engine.family == "beam":
        return _sglang_proposal(table, nodes, limits, joint=method == "joint", fits=beam_fits(engine))
    cap = max_nodes(table.num_heads, table.width, max_depth=limits.depth, max_children=limits.width)
    n = min(int(nodes), cap)
    if method == "joint":
        observed = sum(1 for p, c in table.joint.items() if c > 0 and len(p) <= limits.depth and max(p) < limits.width)
        n = min(n, observed)
        if not limits.left_closed_depth and not limits.grounded:
            return build_tree(table, n, "joint", max_depth=limits.depth, max_children=limits.width)
        return greedy_in_family(_joint_value(table), n, limits, name="joint", observed_only=True, up_to=True)
    return build_for_engine(table, n, "greedy", engine, heads=heads)


def uniform_proposal(table: AccuracyTable, nodes: int, limits: FamilyLimits, *, joint: bool = False) -> Tree:
    """A nested sequence of uniform trees (vLLM's family: every node of a level has the same
    number of children, the top ranks) of up to `nodes` nodes: starting from the root, each
    step adds one child per node at one level, with the subtrees the deeper levels then
    require, choosing the step of largest tau gained per node added
    (docs/engines.md#building-within-a-family). Every prefix is a tree; the prefixes that
    end a step are uniform trees (`drafted_sizes`)."""
    children: list[int] = []
    paths: list[tuple[int, ...]] = []
    have: set[tuple[int, ...]] = set()
    current = 1.0
    while True:
        best = None
        for level in range(min(len(children) + 1, limits.depth)):
            trial = (
                children + [1]
                if level == len(children)
                else children[:level] + [children[level] + 1] + children[level + 1 :]
            )
            if trial[level] > limits.width:
                continue
            added = [p for p in uniform_tree(trial).paths if p not in have]
            if not added or len(paths) + len(added) > nodes:
                continue
            tau = expected_tokens(Tree(tuple(paths + added), name="uniform"), table, joint=joint)
            gain = (tau - current) / len(added)
            if best is None or gain > best[0] + 1e-15:
                best = (gain, trial, added, tau)
        if best is None:
            return Tree(tuple(paths), name="uniform")
        _, children, added, current = best
        paths += added  # in (depth, path) order: parents before their children
        have.update(added)


def drafted_sizes(proposal: Tree, engine: Engine, *, heads: int | None = None, accuracy=None) -> np.ndarray:
    """(n+1,) bool: whether `engine` drafts `proposal.prefix(n)` as written, n = 0..size (plain
    decoding, n = 0, always)."""
    drafted = np.ones(proposal.size + 1, bool)
    for n in range(1, proposal.size + 1):
        drafted[n] = check(proposal.prefix(n), engine, heads=heads, accuracy=accuracy).as_written
    return drafted


def _sglang_proposal(table: AccuracyTable, nodes: int, limits: FamilyLimits, *, joint: bool, fits) -> Tree:
    best, best_score = None, -np.inf
    for steps in range(1, limits.depth + 1):
        for topk in range(2, limits.width + 1):  # topk 1 fixes the size: not a sequence
            paths, _ = sglang_candidates(table.accuracy, steps, topk)
            # the most nodes the engine drafts from this pool (TensorRT-LLM: topk * steps); every
            # shorter prefix is drafted by fewer steps (docs/engines.md#tensorrt-llm-eagle-3)
            most = max(n for n in range(1, len(paths) + 1) if fits(n, steps, topk))
            seq = Tree(tuple(paths[: min(nodes, most)]), name="sglang")
            taus = tau_curve(seq, table, joint=joint)[1:]
            # Mean tau over sizes 1..nodes; a shorter pool repeats its last tree's tau.
            score = float(np.concatenate([taus, np.full(nodes - seq.size, taus[-1])]).mean())
            if score > best_score:
                best, best_score = seq, score
    if best is None:
        raise UserError(
            "--engine sglang: the accuracy table is one rank wide; SGLang needs topk >= 2 for a sequence of tree sizes"
        )
    return best
