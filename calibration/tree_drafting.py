"""How the reference decoder drafts a static tree from a drafter (docs/decoder.md#drafters).

- `MedusaDrafting` (a drafter that ignores the path): head k (1..D) guesses the k-th token after
  the root from the hidden state of the token that produced the root (Medusa paper section
  2.1.1); their top-k fill Medusa's flat candidate vector ``[root, head 1 top-TOPK, head 2
  top-TOPK, ...]`` and the tree tokens are ``flat[tree_indices]``;
- `SequentialDrafting` (Hydra, MLP speculator, draft models: `calibration.drafters`) drafts depth
  by depth: at depth d the drafter runs once on all nodes of depth d - 1 that have children, of
  all sequences together, and each node takes its children's ranks from its own top-k.

Both split a draft into `propose(hidden, root)`, the drafter's model work, and
`tree_tokens(root, proposal)`, the tree's tokens (b, q) laid out from it: the decoder times the
first with the verification and the second as the draft phase (docs/decoder.md#timing-a-step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibration.drafters.base import select_rows
from calibration.model_calls import run_heads
from treeopt.tree import TreeBuffers

__all__ = ["DraftLevel", "MedusaDrafting", "SequentialDrafting", "draft_levels"]


class MedusaDrafting:
    """Medusa heads over a tree of `num_heads` depths, candidates from each head's top-`topk`;
    `tree_indices` (q,) on the decoder's device. Only the ranks the tree uses (`topk_used`) are
    sorted out of each head's logits (docs/trees.md#buffers)."""

    def __init__(self, heads, tree_indices: torch.Tensor, num_heads: int, topk: int, topk_used: int):
        self.heads, self.tree_indices = heads, tree_indices
        self.num_heads, self.topk, self.topk_used = num_heads, topk, topk_used
        self._layouts: dict[int, torch.Tensor] = {}

    def propose(self, hidden: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """The heads' logits (D, ..., V) on hidden (..., h)."""
        return run_heads(self.heads, hidden, self.num_heads)

    def tree_tokens(self, root: torch.Tensor, head_logits: torch.Tensor) -> torch.Tensor:
        """The tree tokens (b, q) from the heads' logits (D, b, V) at the token that produced
        `root` (b,): Medusa's ``flat[tree_indices]`` over ``flat = [root, head 1 top-TOPK, head 2
        top-TOPK, ...]``, read straight out of the heads' top-k and the roots (`layout`)."""
        if not self.num_heads:
            return root[:, None].clone()
        top = head_logits.topk(self.topk_used, dim=-1).indices  # (D, b, r)
        return torch.cat([top.view(-1), root])[self.layout(root.shape[0])]

    def layout(self, b: int) -> torch.Tensor:
        """(b, q) int64: where each tree token of each sequence lies in ``[top-k indices (D, b, r)
        flattened | the b roots]``, made once per batch size (a step indexes once instead of
        padding, permuting and concatenating Medusa's flat vector)."""
        layout = self._layouts.get(b)
        if layout is None:
            r = self.topk_used
            seq = torch.arange(b, device=self.tree_indices.device)[:, None]
            flat = self.tree_indices[1:] - 1  # (q - 1,) (head - 1) * topk + rank
            nodes = (flat // self.topk * b * r + flat % self.topk)[None] + seq * r
            layout = self._layouts[b] = torch.cat([self.num_heads * b * r + seq, nodes], dim=1)
        return layout


@dataclass(frozen=True)
class DraftLevel:
    """One depth of sequential drafting (tensors on the decoder's device).

    nodes:       (n,) tree indices of the nodes of this depth, in tree order.
    parents:     how many nodes of the previous depth have children (the drafter's rows per
                 sequence).
    parent_slot: (n,) each node's parent's index among those rows.
    rank:        (n,) each node's rank among its parent's children.
    width:       1 + the largest rank (the top-k the drafter's logits are cut to).
    expand:      indices into `nodes` of the nodes that have children themselves.
    """

    nodes: torch.Tensor
    parents: int
    parent_slot: torch.Tensor
    rank: torch.Tensor
    width: int
    expand: torch.Tensor


def draft_levels(depth: np.ndarray, parent: np.ndarray, rank: np.ndarray, to_device) -> list[DraftLevel]:
    """The levels of sequential drafting of a tree given per node (tree order, root = 0) its
    depth, parent (-1 for the root) and rank."""
    has_children = np.zeros(len(depth), bool)
    has_children[parent[parent >= 0]] = True
    levels = []
    for d in range(1, int(depth.max()) + 1 if len(depth) > 1 else 1):
        nodes = np.flatnonzero(depth == d)
        expanded_above = np.flatnonzero((depth == d - 1) & has_children)
        slot = np.searchsorted(expanded_above, parent[nodes])
        levels.append(
            DraftLevel(
                to_device(nodes),
                len(expanded_above),
                to_device(slot),
                to_device(rank[nodes]),
                int(rank[nodes].max()) + 1,
                to_device(np.flatnonzero(has_children[nodes])),
            )
        )
    return levels


class SequentialDrafting:
    """A drafter that reads the path, over the tree of `buffers` (ranks in `tree.sorted_paths`
    order: `ranks`), on `device`."""

    def __init__(self, heads, buffers: TreeBuffers, ranks: np.ndarray, device: torch.device):
        def t(a):
            return torch.from_numpy(np.array(a, copy=True)).to(device)

        self.heads, self.device = heads, device
        self.q = len(buffers.depth)
        self.levels = draft_levels(buffers.depth, buffers.parent, ranks, t)

    def propose(self, hidden: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """The tree tokens (b, q) the drafter drafts from `hidden` (b, h), the base model's
        hidden state at the token that produced `root` (b,): depth by depth, one drafter call
        per depth on the nodes of the previous depth that have children, of all sequences
        together."""
        b = root.shape[0]
        tokens = root.new_zeros((b, self.q))
        tokens[:, 0] = root
        state = self.heads.begin(hidden, root)  # one row per sequence: the root
        for d, level in enumerate(self.levels):
            logits, carry = self.heads.depth_logits(state, d)  # rows (sequence, expanded node)
            top = logits.topk(level.width, dim=-1).indices.view(b, level.parents, level.width)
            children = top[:, level.parent_slot, level.rank]  # (b, nodes of depth d + 1)
            tokens[:, level.nodes] = children
            if level.expand.numel():
                rows = (
                    torch.arange(b, device=self.device)[:, None] * level.parents + level.parent_slot[level.expand][None]
                ).reshape(-1)
                state = self.heads.child_state(select_rows(carry, rows), d, children[:, level.expand].reshape(-1))
        return tokens

    def tree_tokens(self, root: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The drafted tokens are the tree's already."""
        return tokens
