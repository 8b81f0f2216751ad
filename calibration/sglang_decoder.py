"""The reference decoder drafting as SGLang does: a tree drawn every step from the drafter's own
probabilities (`calibration.sglang_drafting`), different per sequence, verified greedily and
losslessly under its own tree mask (docs/decoder.md#sglangs-dynamic-tree).

`SGLangTreeDecoder` is `calibration.decoder.TreeDecoder` with two parts replaced: the drafting
(`SGLangDrafting`: SGLang's pool and draft, then the tree's per-sequence parents and depths)
and the verifier (`DynamicTreeVerifier`: the tree mask, positions and acceptance from those
per-sequence tensors instead of one static tree's buffers). Everything else (prefill, the
draft's own cache, keeping the accepted path, holes, finished sequences) is the decoder's.
"""

from __future__ import annotations

import torch

from calibration.decoder import TreeDecoder
from calibration.model_calls import additive_mask, fast_argmax
from calibration.sglang_drafting import check_triple, draft_pool, select_draft
from calibration.verification import GREEDY, AcceptanceRule, Accepted, TreeVerifier
from treeopt.dynamic_tree import forced_draft_tokens
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError
from treeopt.tree import make_tree

__all__ = ["DynamicTreeVerifier", "SGLangDrafting", "SGLangTreeDecoder"]


class DynamicTreeVerifier(TreeVerifier):
    """Tree verification of q tokens whose tree is set per step and per sequence (`set_tree`);
    greedy acceptance only (SGLang's greedy verify_tree_greedy)."""

    def __init__(self, q: int, steps: int, forward, dtype: torch.dtype, device: torch.device):
        self.model_forward, self.dtype, self.device = forward, dtype, device
        self.q, self.steps, self.appends = q, steps, q

    def set_tree(self, parent: torch.Tensor, depth: torch.Tensor, orphan: torch.Tensor) -> None:
        """This step's trees: parent (b, q) tree index of each node's parent (the root's is
        itself), depth (b, q), orphan (b, q) nodes whose parent is not drafted (never accepted)."""
        b, q = parent.shape
        ancestor = torch.eye(q, dtype=torch.bool, device=self.device).repeat(b, 1, 1)
        cur = torch.arange(q, device=self.device).expand(b, q)
        for _ in range(self.steps):  # a loop over depth: every node's next ancestor at once
            cur = parent.gather(1, cur)
            ancestor.scatter_(2, cur[:, :, None], True)
        self.parent, self.depth, self.orphan = parent, depth, orphan
        self.tree_mask_add = additive_mask(ancestor, self.dtype)[:, None]  # (b, 1, q, q)

    def layout(self, valid: torch.Tensor, next_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, c = valid.shape
        mask = torch.cat(
            [additive_mask(valid, self.dtype)[:, None, None, :].expand(b, 1, self.q, c), self.tree_mask_add], dim=-1
        )
        return mask, next_pos[:, None] + self.depth

    def accept(self, tokens: torch.Tensor, logits: torch.Tensor, rule: AcceptanceRule = GREEDY) -> Accepted:
        """A node is accepted when it is the base model's argmax after its parent and its parent
        is accepted; siblings hold distinct tokens (one top-k), so the accepted nodes are one
        path from the root (docs/decoder.md#greedy-acceptance)."""
        if not rule.greedy:
            raise UserError("SGLang's dynamic tree: the reference decoder verifies it greedily only (temperature 0)")
        pred = fast_argmax(logits)  # (b, q)
        match = (tokens == pred.gather(1, self.parent)) & ~self.orphan
        match[:, 0] = True
        accepted = match
        for _ in range(self.steps):
            accepted = match & accepted.gather(1, self.parent)
        n_keep = accepted.sum(1)
        last = torch.where(accepted, self.depth, -1).argmax(1)
        slot = torch.where(accepted, self.depth, self.steps + 1)
        path = torch.zeros((len(tokens), self.steps + 2), dtype=torch.long, device=self.device)
        path.scatter_(1, slot, torch.arange(self.q, device=self.device).expand_as(slot))
        rows = torch.arange(len(tokens), device=self.device)
        return Accepted(path[:, : self.steps + 1], n_keep, last, pred[rows, last])


class SGLangDrafting:
    """SGLang's draft of `num_draft_tokens` (root included) from `steps` steps of `topk`; lays
    the drawn trees out in `verifier`."""

    def __init__(self, heads, steps: int, topk: int, num_draft_tokens: int, verifier: DynamicTreeVerifier):
        self.heads, self.steps, self.topk, self.n = heads, steps, topk, num_draft_tokens
        self.verifier = verifier

    def propose(self, hidden: torch.Tensor, root: torch.Tensor):
        return draft_pool(self.heads, self.heads.begin(hidden, root), len(root), self.steps, self.topk)

    def tree_tokens(self, root: torch.Tensor, pool) -> torch.Tensor:
        """The tree tokens (b, q): the root, then the drafted nodes in pool order (a parent
        before its children); sets the verifier's per-sequence tree."""
        b, device = len(root), root.device
        chosen = select_draft(pool, self.n)  # (b, n - 1)
        index = torch.arange(1, self.n, device=device).expand(b, -1)
        tree_index = torch.full_like(pool.parent, -1).scatter_(1, chosen, index)
        parent_pool = pool.parent.gather(1, chosen)
        parent = torch.where(parent_pool < 0, 0, tree_index.gather(1, parent_pool.clamp(min=0)))
        zero = torch.zeros((b, 1), dtype=torch.long, device=device)
        orphan = torch.cat([zero.bool(), parent < 0], 1)
        depth = torch.cat([zero, pool.depth[chosen].long()], 1)
        self.verifier.set_tree(torch.cat([zero, parent.clamp(min=0)], 1), depth, orphan)
        return torch.cat([root[:, None], pool.tokens.gather(1, chosen)], 1)


class SGLangTreeDecoder(TreeDecoder):
    """Greedy decoding with `model` and a sequential drafter (an EAGLE draft: SGLang's EAGLE
    worker) drafting SGLang's dynamic tree for (steps, topk, num_draft_tokens); num_draft_tokens
    is forced to steps + 1 when topk is 1, as SGLang does. `attention` as `TreeDecoder`'s (the
    split path takes each sequence's own tree block). For `generate` (acceptance); not for
    timing `verify_forward`."""

    def __init__(
        self,
        model,
        heads,
        steps: int,
        topk: int,
        num_draft_tokens: int,
        *,
        timing: bool = False,
        attention: str | None = None,
    ):
        check_triple(heads, steps, topk)
        n = forced_draft_tokens(steps, topk, num_draft_tokens)
        pool = sglang_pool_size(steps, topk)
        if not 2 <= n <= pool + 1:
            raise UserError(
                f"--speculative-num-draft-tokens: {n} is outside 2..{pool + 1} for {steps} steps of topk {topk}"
            )
        # why: a stand-in tree of n - 1 nodes sizes the step (q = n) and the cache's room; the
        # tree itself is drawn every step
        stand_in = make_tree([(r,) for r in range(n - 1)])
        super().__init__(model, heads, stand_in, topk=n - 1, timing=timing, graphs=False, attention=attention)
        self.verifier = DynamicTreeVerifier(self.q, steps, self._forward, self.dtype, self.device)
        self.drafting = SGLangDrafting(heads, steps, topk, n, self.verifier)
