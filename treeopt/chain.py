"""Chains and trees of draft-model tokens verified by rejection sampling: the expected tokens per
step of a chain of any gamma from the per-depth acceptance alpha, of any tree from the per-depth
positional acceptance of each child, and the alpha sidecar calibration writes beside the
accuracy table (docs/statistics.md#draft-model-acceptance, "Positional acceptance of a
tree"; format: docs/formats.md#alpha-sidecar-namealphajson-treeoptchain_acceptancev2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from treeopt.accuracy import AccuracyTable
from treeopt.build import greedy_tree, max_nodes, optimal_tree
from treeopt.errors import UserError
from treeopt.fileio import read_json_input, write_json
from treeopt.tree import Tree

CHAIN_ACCEPTANCE_FORMAT = "treeopt.chain_acceptance/v1"
#: v2 adds the positional acceptance of each child
# (docs/formats.md#alpha-sidecar-namealphajson-treeoptchain_acceptancev2)
CHAIN_ACCEPTANCE_FORMAT_V2 = "treeopt.chain_acceptance/v2"
ALPHA_SUFFIX = ".alpha.json"


def chain_tau(alpha_per_depth) -> np.ndarray:
    """tau(gamma) for gamma = 0 .. K: 1 + sum_{k<=gamma} prod_{j<k} alpha_j, alpha_j the
    acceptance at depth j given that depths < j were accepted (docs/statistics.md#draft-model-acceptance). Constant
    alpha gives Leviathan et al. 2023's (1 - a^(g+1)) / (1 - a)."""
    alpha = np.asarray(alpha_per_depth, dtype=np.float64)
    if alpha.ndim != 1 or np.any(~np.isfinite(alpha)) or np.any((alpha < 0) | (alpha > 1)):
        raise UserError(f"alpha: expected per-depth acceptances in [0, 1], got {alpha_per_depth!r}")
    # why: the chain reaches depth k only when every earlier draft was kept, and a step emits
    # the kept drafts plus one target token (docs/statistics.md#draft-model-acceptance)
    return 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(alpha))])


@dataclass(frozen=True)
class ChainAcceptance:
    """A draft model's acceptance at one sampling temperature, per depth.

    temperature:       the T of p and q (0: greedy, alpha = argmax agreement).
    alpha_per_depth:   alpha_d = E[sum_x min(p, q)] at depth d over positions whose depths < d
                       were accepted, i.e. tau(d + 1) - tau(d) = prod_{j<=d} alpha_j.
    tau_walked:        tau(gamma), gamma = 0 .. K, walked over the calibration rows.
    rows:              calibration positions with every depth labelled.
    accept_per_child:  None, or (K, C): a_{d, j}, the probability that the j-th child tried at
                       depth d (in draw order, recursive rejection sampling) is the one kept,
                       over the same positions and weights as alpha; column 0 is
                       alpha_per_depth (docs/statistics.md#positional-acceptance-of-a-tree).
    accept_per_child_stderr: None, or (K, C) standard errors of those estimates.
    samples:           draw orders per position behind columns 1.. (0: none).
    """

    temperature: float
    alpha_per_depth: tuple[float, ...]
    tau_walked: tuple[float, ...]
    rows: int
    accept_per_child: tuple[tuple[float, ...], ...] | None = None
    accept_per_child_stderr: tuple[tuple[float, ...], ...] | None = None
    samples: int = 0

    @classmethod
    def from_rows(
        cls, alpha_rows: np.ndarray, temperature: float, *, child_rows: np.ndarray | None = None, samples: int = 0
    ) -> ChainAcceptance:
        """From (N, K) per-position alphas (NaN: no label): the rows with all K depths; with
        `child_rows` (N, K, C) per-position positional acceptances, also the per-child table."""
        a = np.asarray(alpha_rows, dtype=np.float64)
        complete = np.all(np.isfinite(a), axis=1)
        a = a[complete]
        if not len(a):
            raise UserError("alpha: no calibration position has every depth labelled (longer prompts needed)")
        reach = np.cumprod(a, axis=1).mean(0)  # P(chain reaches depth d + 1), walked over rows
        tau = 1.0 + np.concatenate([[0.0], np.cumsum(reach)])
        # the conditional alphas whose chain_tau is exactly the walked tau
        alpha = (reach / np.concatenate([[1.0], reach[:-1]]).clip(min=1e-300)).clip(0, 1)
        per_child = stderr = None
        if child_rows is not None:
            per_child, stderr = _per_child_table(a, np.asarray(child_rows, dtype=np.float64)[complete], alpha)
        return cls(
            float(temperature),
            tuple(float(x) for x in alpha),
            tuple(float(x) for x in tau),
            len(a),
            _nested(per_child),
            _nested(stderr),
            int(samples) if per_child is not None else 0,
        )

    def tau(self) -> np.ndarray:
        return chain_tau(self.alpha_per_depth)

    @property
    def per_child(self) -> np.ndarray:
        """(K, C) the positional acceptance table; an error for a v1 sidecar (chains only)."""
        if self.accept_per_child is None:
            raise UserError(
                "alpha sidecar: no per-child acceptance (a treeopt.chain_acceptance/v1 file covers chains only; "
                "calibrate again to predict trees)"
            )
        return np.array(self.accept_per_child, dtype=np.float64)

    def acceptance_table(self) -> AccuracyTable:
        """The per-child table as an `AccuracyTable` (positions 1, hits = a_{d, j}), so that the
        builders and `treeopt.build.tau_curve` apply to trees whose children are ranks 0..m-1
        of each node (docs/statistics.md#positional-acceptance-of-a-tree)."""
        a = self.per_child
        return AccuracyTable(
            hits=a,
            positions=np.ones(a.shape[0]),
            provenance={"source": "alpha sidecar (per-child acceptance)", "temperature": self.temperature},
        )

    def save(self, path) -> None:
        doc = {
            "format": CHAIN_ACCEPTANCE_FORMAT if self.accept_per_child is None else CHAIN_ACCEPTANCE_FORMAT_V2,
            "temperature": self.temperature,
            "alpha_per_depth": list(self.alpha_per_depth),
            "tau_walked": list(self.tau_walked),
            "rows": self.rows,
        }
        if self.accept_per_child is not None:
            doc["accept_per_child"] = [list(r) for r in self.accept_per_child]
            doc["accept_per_child_stderr"] = [list(r) for r in self.accept_per_child_stderr or ()]
            doc["samples"] = self.samples
        write_json(path, doc)


def _nested(a: np.ndarray | None):
    return None if a is None else tuple(tuple(float(x) for x in row) for row in a)


def _per_child_table(alpha_rows: np.ndarray, child_rows: np.ndarray, alpha: np.ndarray):
    """(K, C) positional acceptance and standard errors from per-row values (N, K) and (N, K, C):
    at depth d each row weighs by its probability of reaching depth d along the chain,
    prod_{i<d} alpha(row, i), the weights that make column 0 the conditional alpha of
    `ChainAcceptance.from_rows`. Standard error of a weighted mean over independent rows."""
    n, k = alpha_rows.shape
    # why: a node at depth d is tried only when its ancestors were kept; the chain's walk weighs
    # each position by that probability (docs/statistics.md#positional-acceptance-of-a-tree)
    weight = np.concatenate([np.ones((n, 1)), np.cumprod(alpha_rows, axis=1)[:, :-1]], axis=1)
    total = weight.sum(0).clip(min=1e-300)
    table = (weight[..., None] * child_rows).sum(0) / total[:, None]
    spread = (weight[..., None] * (child_rows - table[None])) ** 2
    stderr = np.sqrt(spread.sum(0)) / total[:, None]
    table = table.clip(0, 1)
    table[:, 0] = alpha  # the same weighted mean; the chain's own number, bit for bit
    # a row of probabilities of disjoint events sums to at most 1; rounding may overshoot
    rest = table[:, 1:].sum(1, keepdims=True)
    table[:, 1:] *= np.minimum(1.0, (1.0 - table[:, :1]) / np.maximum(rest, 1e-300))
    return table, stderr


def packed_tree(tree: Tree) -> Tree:
    """The tree recursive rejection sampling runs: each node's rank replaced by its position
    among its siblings in rank order (the decoder tries a node's children in draw order, the
    j-th draw filling the j-th child, whatever its rank; docs/decoder.md#draft-models)."""
    siblings: dict[tuple[int, ...], list[int]] = {}
    for p in tree.paths:
        siblings.setdefault(p[:-1], []).append(p[-1])
    position = {parent + (r,): j for parent, ranks in siblings.items() for j, r in enumerate(sorted(ranks))}
    paths = tuple(tuple(position[p[: i + 1]] for i in range(len(p))) for p in tree.paths)
    return Tree(paths, name=tree.name)


def _packed_factors(tree: Tree, accept_per_child) -> tuple[np.ndarray, np.ndarray]:
    """(packed rank matrix (n, D), per-node factor a_{d, j} along each path (n, D), 1 past the
    node's depth)."""
    a = np.asarray(accept_per_child, dtype=np.float64)
    m = packed_tree(tree).rank_matrix
    if tree.depth > a.shape[0]:
        raise UserError(f"tree: depth {tree.depth} exceeds the {a.shape[0]} depths the per-child acceptance covers")
    if m.size and int(m.max()) >= a.shape[1]:
        raise UserError(f"tree: a node has {int(m.max()) + 1} children, the per-child acceptance covers {a.shape[1]}")
    depth = np.arange(m.shape[1])[None, :]
    factors = np.where(m >= 0, a[depth, np.maximum(m, 0)], 1.0)
    return m, factors


def rejection_tau(tree: Tree, accept_per_child) -> float:
    """Expected tokens per step of `tree` under recursive rejection sampling: 1 + sum over nodes
    of prod along the path of a_{depth, position among siblings} (docs/statistics.md#positional-acceptance-of-a-tree).
    A chain gives `chain_tau` of column 0."""
    if tree.size == 0:
        return 1.0
    _, factors = _packed_factors(tree, accept_per_child)
    # why: a node is kept when each ancestor was the child kept at its depth (Chen et al. 2024,
    # Sequoia, section 3), so its probability is the product of positional acceptances
    return float(1.0 + np.prod(factors, axis=1).sum())


def rejection_tau_stderr(tree: Tree, accept_per_child, stderr) -> float:
    """First-order (delta-method) standard error of `rejection_tau`, the table's entries taken
    as independent: sqrt(sum_{d,j} (d tau / d a_{d,j})^2 se_{d,j}^2)."""
    if tree.size == 0:
        return 0.0
    m, factors = _packed_factors(tree, accept_per_child)
    se = np.asarray(stderr, dtype=np.float64)
    # product of the other factors of each node's path: d value / d factor
    before = np.concatenate([np.ones((len(m), 1)), np.cumprod(factors, axis=1)[:, :-1]], axis=1)
    after = np.concatenate([np.cumprod(factors[:, ::-1], axis=1)[:, ::-1][:, 1:], np.ones((len(m), 1))], axis=1)
    grad = np.zeros_like(se)
    used = m >= 0
    depth = np.broadcast_to(np.arange(m.shape[1])[None, :], m.shape)
    np.add.at(grad, (depth[used], m[used]), (before * after)[used])
    return float(np.sqrt(((grad * se) ** 2).sum()))


def rejection_tau_curve(proposal: Tree, accept_per_child) -> np.ndarray:
    """(n + 1,) `rejection_tau` of proposal.prefix(m), m = 0 .. n (each prefix packed on its
    own: a later, smaller-ranked sibling moves its elder siblings down the draw order)."""
    return np.array([rejection_tau(proposal.prefix(m), accept_per_child) for m in range(proposal.size + 1)])


def rejection_proposal(accept_per_child, nodes: int) -> Tree:
    """A nested proposal sequence of up to `nodes` nodes for recursive rejection sampling, each
    prefix's children at positions 0..m-1: the exact optimum (`treeopt.build.optimal_tree`)
    when a_{d, j} does not grow with j at any depth, else Medusa's greedy (which proposes
    child j + 1 only after child j) (docs/builders.md#exact-optimum)."""
    a = np.asarray(accept_per_child, dtype=np.float64)
    n = min(int(nodes), max_nodes(*a.shape))
    # why: with non-increasing rows the optimum never uses a position without the ones before
    # it, so its ranks are the decoder's draw positions (docs/statistics.md#positional-acceptance-of-a-tree)
    if np.all(np.diff(a, axis=1) <= 0):
        return optimal_tree(a, n)
    return greedy_tree(a, n)


def alpha_path(accuracy_path) -> Path:
    """``acc.json`` -> ``acc.alpha.json`` (beside it)."""
    p = Path(accuracy_path)
    return p.with_suffix(ALPHA_SUFFIX) if p.suffix else p.with_name(p.name + ALPHA_SUFFIX)


def load_chain_acceptance(path) -> ChainAcceptance:
    """A v1 (chains) or v2 (chains and trees) alpha sidecar."""
    data = read_json_input(path, "an alpha sidecar")
    if not isinstance(data, dict) or data.get("format") not in (CHAIN_ACCEPTANCE_FORMAT, CHAIN_ACCEPTANCE_FORMAT_V2):
        raise UserError(f"{path}: not a {CHAIN_ACCEPTANCE_FORMAT} or {CHAIN_ACCEPTANCE_FORMAT_V2} file")
    try:
        alpha = tuple(float(x) for x in data["alpha_per_depth"])
        tau = tuple(float(x) for x in data["tau_walked"])
        temperature, rows = float(data["temperature"]), int(data["rows"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: missing or invalid field ({err})") from None
    if not alpha or not all(math.isfinite(x) and 0 <= x <= 1 for x in alpha):
        raise UserError(f"{path}: alpha_per_depth must be a non-empty list of numbers in [0, 1]")
    if data["format"] == CHAIN_ACCEPTANCE_FORMAT:
        return ChainAcceptance(temperature, alpha, tau, rows)
    per_child = _matrix(data.get("accept_per_child"), len(alpha), path, "accept_per_child")
    stderr = _matrix(data.get("accept_per_child_stderr"), len(alpha), path, "accept_per_child_stderr")
    if per_child.shape != stderr.shape:
        raise UserError(f"{path}: accept_per_child_stderr must have the shape of accept_per_child")
    if np.any(per_child > 1) or np.any(per_child.sum(1) > 1 + 1e-9):
        raise UserError(f"{path}: accept_per_child: each depth's acceptances must lie in [0, 1] and sum to at most 1")
    if np.any(np.abs(per_child[:, 0] - np.array(alpha)) > 1e-9):
        raise UserError(f"{path}: accept_per_child: the first column must equal alpha_per_depth")
    try:
        samples = int(data.get("samples", 0))
    except (TypeError, ValueError):
        raise UserError(f"{path}: samples must be an integer") from None
    return ChainAcceptance(temperature, alpha, tau, rows, _nested(per_child), _nested(stderr), samples)


def _matrix(value, depths: int, path, key: str) -> np.ndarray:
    """A (depths, C >= 1) matrix of finite non-negative numbers from the sidecar's `key`."""
    try:
        a = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        a = np.zeros(0)
    if a.ndim != 2 or a.shape[0] != depths or a.shape[1] < 1 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise UserError(f"{path}: {key} must be {depths} rows (one per depth) of non-negative numbers, one per child")
    return a
