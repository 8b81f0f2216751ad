"""IBM's candidate form (Wertheimer et al. 2024, section 3; fms-extras' ``generate_suffixes``):
the speculator keeps the top k_d tokens at each stage d, forms the product of these choices
(k_1 x ... x k_D full-length candidates), and keeps the n with the highest summed
log-probability. An engine verifies them either as n candidate sequences of D + 1 tokens
(batch expansion) or merged into their prefix tree under a tree mask (docs/builders.md#ibms-candidate-form).

Both forms accept the same tokens: a candidate sequence is accepted up to its first mismatch,
and the longest such run over the n candidates is the deepest accepted node of their prefix
tree. Only the cost differs. treeopt's trees are static, ranks rather than tokens, so the
per-step choice by log-probability is replaced by its calibrated expectation: a candidate's
score is the summed log of the per-rank accuracies of its ranks (the probability that the true
token has that rank at that depth), and the static candidate set is the n best of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from treeopt.errors import UserError
from treeopt.tree import Tree

__all__ = [
    "candidate_proposal",
    "candidate_rank_paths",
    "candidate_tokens",
    "merged_candidate_tree",
    "speculator_draft_rows",
]


def _check(acc: np.ndarray, topk: Sequence[int], n: int) -> tuple[int, ...]:
    topk = tuple(int(k) for k in topk)
    if not topk or any(k < 1 for k in topk):
        raise UserError(f"--topk: expected positive integers, one per stage, got {list(topk)}")
    if len(topk) > acc.shape[0]:
        raise UserError(f"--topk: {len(topk)} stages, the accuracy table has {acc.shape[0]} heads")
    if max(topk) > acc.shape[1]:
        raise UserError(f"--topk: rank {max(topk) - 1} asked for, the accuracy table has {acc.shape[1]} ranks")
    if isinstance(n, bool) or int(n) != n or not 1 <= n <= int(np.prod(topk)):
        raise UserError(f"--candidates: must be in 1..{int(np.prod(topk))} (the product of --topk), got {n!r}")
    return topk


def candidate_rank_paths(acc, topk: Sequence[int], n: int) -> np.ndarray:
    """(n, D) ranks of the n full-length candidates of highest summed log-accuracy among the
    product of ranks 0..k_d - 1 per depth; `acc` (K, R) is the per-rank accuracy of each head.
    Ties keep lexicographic order (lower ranks first)."""
    acc = np.asarray(acc, dtype=float)
    topk = _check(acc, topk, n)
    depth = len(topk)
    product = np.indices(topk).reshape(depth, -1).T  # (prod k, D), lexicographic
    with np.errstate(divide="ignore"):
        score = np.log(acc[np.arange(depth)[None, :], product]).sum(axis=1)
    order = np.argsort(-score, kind="stable")
    return product[order[: int(n)]]


def merged_candidate_tree(paths) -> Tree:
    """The prefix tree of candidate rank paths (n, D): every prefix of every candidate, by depth
    and then rank (each node after its parent)."""
    paths = np.asarray(paths, dtype=np.int64)
    nodes = []
    for d in range(1, paths.shape[1] + 1):  # one pass per depth, each vectorised over candidates
        nodes.extend(tuple(int(r) for r in p) for p in np.unique(paths[:, :d], axis=0))
    return Tree(nodes, name=f"{paths.shape[0]} candidates merged")


def candidate_proposal(acc, topk: Sequence[int], n: int) -> tuple[Tree, tuple[int, ...]]:
    """IBM's candidate sets for 1..n candidates as one proposal sequence: the merged tree of the
    n best candidates with its nodes in the order the candidates first reach them, and
    `sizes[m - 1]`, the node count of the merged tree of the m best. The m-candidate set is
    then `tree.prefix(sizes[m - 1])`, whose leaves are exactly those m candidates (each is a
    full-length path, so none is a prefix of another): a sweep measures every candidate count
    on one proposal, in either verification form (docs/builders.md#ibms-candidate-form)."""
    paths = candidate_rank_paths(acc, topk, n)
    nodes: dict[tuple[int, ...], None] = {}
    sizes = []
    for path in paths:  # one pass per candidate; a candidate adds at most D nodes
        for d in range(1, len(path) + 1):
            nodes.setdefault(tuple(int(r) for r in path[:d]))
        sizes.append(len(nodes))
    return Tree(list(nodes), name=f"{len(paths)} candidates, top-k {list(topk)}"), tuple(sizes)


def candidate_tokens(n: int, depth: int) -> tuple[int, int]:
    """(tokens, sequences) per sequence when n candidates of depth D are verified as sequences:
    each is the root and its D tokens."""
    return int(n) * (int(depth) + 1), int(n)


def speculator_draft_rows(topk: Sequence[int]) -> np.ndarray:
    """(D,) rows per sequence each stage of IBM's speculator runs on when it drafts the whole
    product: stage d expands every state kept so far, k_1 x ... x k_{d-1} of them."""
    topk = np.asarray(topk, dtype=float)
    return np.concatenate(([1.0], np.cumprod(topk)[:-1]))
