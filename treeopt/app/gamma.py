"""The predicted best draft length gamma of draft-model speculative decoding per batch size and
context, and the best tree of draft-model tokens where the alpha sidecar has the per-child
acceptance (or a proposal tree is given) (`treeopt roofline gamma`; roofline/speculative.py,
docs/performance-model.md#draft-model-steps). numpy only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.hardware import HardwareProfile, load_hardware
from roofline.shapes import ModelShape
from roofline.speculative import best_gamma, gamma_grid, tree_grid
from treeopt.app.models import shape_of
from treeopt.chain import alpha_path, chain_tau, load_chain_acceptance, rejection_proposal, rejection_tau_curve
from treeopt.errors import UserError
from treeopt.tree import Tree, load_tree

__all__ = ["DEFAULT_TREE_NODES", "GammaPrediction", "GammaTrees", "predict_gamma"]

#: nodes of the tree proposal built from the per-child acceptance when no --tree is given
DEFAULT_TREE_NODES = 32


@dataclass(frozen=True)
class GammaTrees:
    """The proposal whose prefixes are the candidate draft trees, tau of each prefix under
    recursive rejection sampling, the grid of every (batch, context, prefix) and its best
    tree per cell."""

    proposal: Tree
    tau: np.ndarray
    grid: pd.DataFrame
    best: pd.DataFrame


@dataclass(frozen=True)
class GammaPrediction:
    """The gamma grid (`roofline.speculative.gamma_grid`), its best gamma per cell, tau of a
    chain of every gamma, where alpha came from, and the trees when there are any."""

    target: ModelShape
    draft: ModelShape
    hardware: HardwareProfile
    label: str
    tau: np.ndarray
    grid: pd.DataFrame
    best: pd.DataFrame
    trees: GammaTrees | None


def _alphas(alpha_file, alpha_value, max_gamma):
    """Per-depth alpha, where it came from, and the sidecar (None for --alpha-value): a sidecar
    (or the accuracy table beside it), or one constant alpha for every depth."""
    if (alpha_file is None) == (alpha_value is None):
        raise UserError("give the draft's acceptance with --alpha FILE or --alpha-value A (one of them)")
    if alpha_value is not None:
        if alpha_value > 1:
            raise UserError(f"--alpha-value: must be in [0, 1], got {alpha_value:g}")
        return [alpha_value] * (max_gamma or 8), f"alpha {alpha_value:g} at every depth", None
    path = Path(alpha_file)
    if not path.name.endswith(".alpha.json") and path.suffix == ".json":
        path = alpha_path(path)  # an accuracy table: its sidecar
    side = load_chain_acceptance(path)
    return list(side.alpha_per_depth), f"alpha of {path} (T={side.temperature:g}, {side.rows} positions)", side


def _tree_proposal(side, tree_spec, max_nodes):
    """The proposal whose prefixes are the candidate trees and their tau under recursive
    rejection sampling, or None when there is no per-child acceptance and no --tree."""
    if side is None or side.accept_per_child is None:
        if tree_spec is not None:
            raise UserError(
                "--tree: needs the per-child acceptance of a treeopt.chain_acceptance/v2 sidecar (--alpha FILE)"
            )
        return None
    table = side.per_child
    if tree_spec is not None:
        proposal = load_tree(tree_spec, allow_empty=True)
    else:
        proposal = rejection_proposal(table, DEFAULT_TREE_NODES if max_nodes is None else max_nodes)
    return proposal, rejection_tau_curve(proposal, table)


def predict_gamma(
    model,
    draft,
    hardware,
    *,
    dtype: str | None = None,
    alpha_file=None,
    alpha_value: float | None = None,
    batches,
    contexts,
    max_gamma: int | None = None,
    tree_spec=None,
    max_nodes: int | None = None,
    require_trees: bool = False,
) -> GammaPrediction:
    """The gamma grid of a draft model `draft` for `model` (specs) on `hardware`, the draft's
    acceptance from a sidecar (`alpha_file`) or one `alpha_value`; with a v2 sidecar's
    per-child acceptance (or `tree_spec`, a proposal tree) the tree grid too. require_trees:
    a UserError when there are no trees."""
    alpha, label, side = _alphas(alpha_file, alpha_value, max_gamma)
    trees = _tree_proposal(side, tree_spec, max_nodes)
    if require_trees and trees is None:
        raise UserError("--tree-out: no trees to write (needs a v2 alpha sidecar or --tree)")
    target, draft_shape = shape_of(model, dtype), shape_of(draft, dtype)
    hw = load_hardware(hardware)
    grid = gamma_grid(target, draft_shape, hw, alpha, batches=batches, contexts=contexts, max_gamma=max_gamma)
    tree_result = None
    if trees is not None:
        proposal, tree_tau = trees
        tgrid = tree_grid(target, draft_shape, hw, proposal, tree_tau, batches=batches, contexts=contexts)
        tree_result = GammaTrees(proposal, tree_tau, tgrid, best_gamma(tgrid))
    taus = chain_tau(alpha)[: int(grid["gamma"].max()) + 1]
    return GammaPrediction(target, draft_shape, hw, label, taus, grid, best_gamma(grid), tree_result)
