"""Proposal sequences and their tau curves: the expected tokens per step of every prefix
T_0 c T_1 c ... c T_N of one nested sequence of trees (docs/builders.md#proposal-sequence,
docs/statistics.md#expected-tokens-per-step-tau).

A `TauCurve` carries up to three estimates of the same quantity, and `TauCurve.best` is the one
rule for which of them a decision uses: walked rank vectors when the calibration kept them, else
joint prefix statistics, else the product of independent per-rank accuracies
(docs/statistics.md#which-tau-is-used-when).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treeopt.acceptance import load_rank_vectors, simulated_tau_curve
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.build import greedy_tree, joint_tree, max_nodes, tau_curve
from treeopt.errors import UserError
from treeopt.tree import Tree

__all__ = ["PROPOSAL_METHODS", "TauCurve", "proposal_sequence", "tau_curves", "load_tau_curves", "first_heads"]

PROPOSAL_METHODS = ("auto", "greedy", "joint", "chain")


@dataclass(frozen=True)
class TauCurve:
    """Expected tokens per step of ``proposal.prefix(n)`` for n = 0..proposal.size.

    independent: (n+1,) from independent per-rank accuracies (always there).
    joint:       (n+1,) from joint prefix counts averaged over every position, or None.
    walked:      (n+1,) from the rank vectors walked the way the decoder steps, or None.
    """

    proposal: Tree
    independent: np.ndarray
    joint: np.ndarray | None = None
    walked: np.ndarray | None = None

    def __post_init__(self):
        expected = (self.proposal.size + 1,)
        for name in ("independent", "joint", "walked"):
            curve = getattr(self, name)
            if curve is None:
                continue
            curve = np.asarray(curve, dtype=float)
            if curve.shape != expected:
                raise UserError(
                    f"tau ({name}): expected {expected[0]} values (tree sizes 0..{expected[0] - 1}), "
                    f"got shape {curve.shape}"
                )
            curve.setflags(write=False)
            object.__setattr__(self, name, curve)

    @property
    def source(self) -> str:
        """Which estimate `best` is: 'walked', 'joint' or 'independent'."""
        return "walked" if self.walked is not None else "joint" if self.joint is not None else "independent"

    @property
    def best(self) -> np.ndarray:
        """The estimate every decision uses: walked, else joint, else independent."""
        # Walked beats joint: acceptance comes in runs and a step that accepts a run skips it,
        # so the per-position average overrates big trees (docs/statistics.md#walked-tau).
        return getattr(self, self.source)

    def describe(self) -> str:
        return {
            "walked": "walked from its rank vectors",
            "joint": "from joint statistics",
            "independent": "from independent heads",
        }[self.source]


def first_heads(table: AccuracyTable, num_heads: int | None) -> AccuracyTable:
    """The table of the first `num_heads` heads (a deployment that runs fewer heads than were
    calibrated). Joint counts describe all heads together, so they are dropped."""
    if num_heads is None or num_heads == table.num_heads:
        return table
    if isinstance(num_heads, bool) or not 1 <= int(num_heads) <= table.num_heads:
        raise UserError(f"--num-heads: {num_heads} heads asked for, the accuracy table has {table.num_heads}")
    k = int(num_heads)
    return AccuracyTable(hits=table.hits[:k], positions=table.positions[:k], joint=None, provenance=table.provenance)


def proposal_sequence(table: AccuracyTable, nodes: int, *, method: str = "auto") -> Tree:
    """A nested proposal sequence of up to `nodes` nodes: the n most frequent joint prefixes
    (method 'joint'; nested because counts never grow from parent to child), Medusa's greedy
    (method 'greedy') or the chain of each depth's top-1 guess, whose prefix of n nodes is a
    draft model's gamma = n (method 'chain', Leviathan et al. 2023); 'auto' takes joint when the
    table has joint statistics."""
    if isinstance(nodes, bool) or int(nodes) != nodes or nodes < 0:
        raise UserError(f"--max-nodes: must be a non-negative integer, got {nodes!r}")
    if method == "auto":
        method = "joint" if table.joint else "greedy"
    if method == "joint":
        if not table.joint:
            raise UserError("--method joint: the accuracy table has no joint statistics")
        observed = sum(1 for c in table.joint.values() if c > 0)
        return joint_tree(table, min(int(nodes), observed))
    if method == "greedy":
        return greedy_tree(table.accuracy, min(int(nodes), max_nodes(table.num_heads, table.width)))
    if method == "chain":
        return Tree([(0,) * d for d in range(1, min(int(nodes), table.num_heads) + 1)], name="chain")
    raise UserError(f"--method: {method!r} is not one of {', '.join(PROPOSAL_METHODS)}")


def tau_curves(table: AccuracyTable, proposal: Tree, rank_vectors=None) -> TauCurve:
    """Every tau estimate the table supports for the prefixes of `proposal`; `rank_vectors` is
    (ranks, sequence) from `treeopt.acceptance.load_rank_vectors`, or None."""
    joint = tau_curve(proposal, table, joint=True) if table.joint else None
    walked = simulated_tau_curve(proposal, *rank_vectors) if rank_vectors is not None else None
    return TauCurve(proposal, tau_curve(proposal, table), joint, walked)


def load_tau_curves(
    path, nodes: int, *, method: str = "auto", csv_model: str | None = None
) -> tuple[AccuracyTable, TauCurve]:
    """The accuracy table at `path`, its proposal sequence of up to `nodes` nodes and the tau
    curves, walked from the rank-vector sidecar `NAME.ranks.npz` when `treeopt calibrate` wrote
    one beside a JSON table."""
    table = load_accuracy(path, model=csv_model)
    proposal = proposal_sequence(table, nodes, method=method)
    vectors = load_rank_vectors(path, table=table) if str(path).endswith(".json") else None
    return table, tau_curves(table, proposal, vectors)
