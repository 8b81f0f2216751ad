"""SGLang's dynamic EAGLE tree drafted from the drafter's own probabilities
(docs/decoder.md#sglangs-dynamic-tree, docs/statistics.md#dynamic-trees).

SGLang's EAGLE worker (python/sglang/srt/speculative/: `select_top_k_tokens` and
`organize_draft_results` in eagle_utils.py, sgl-project/sglang commit 003ddbce) drafts each
step as follows, for (steps, topk, num_draft_tokens):

1. the root's children: the drafter's softmax over its vocabulary, top-`topk` (probability p,
   token); they are the first `topk` beams, score = p;
2. each later step runs the drafter on the `topk` beams, takes each beam's top-`topk` children,
   scores them beam score x p (topk x topk candidates, beam-major) and keeps the `topk` best of
   them as the next beams; every candidate of every step stays in the pool;
3. the draft is the ``num_draft_tokens - 1`` best-scored nodes of the pool (torch.topk), in
   pool order; a node's parent is the beam it was expanded from.

`draft_pool` is that loop for a batch of roots (one drafter call per step on all beams of all
rows: the loop runs over steps, never over nodes). `pool_records` drafts the pool at every
calibration position, teacher-forced along the base model's greedy continuation, and records
the scores and where the continuation lies in the pool: what `treeopt.dynamic_tree` predicts
tau from. `calibration.sglang_decoder` verifies the drawn tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibration.batching import label_rows
from calibration.drafters.base import select_rows
from calibration.labels import drafter_inputs
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError

__all__ = ["Pool", "check_triple", "draft_pool", "pool_records", "select_draft"]

#: calibration rows drafted at once (each drafts topk rows per step)
ROWS_PER_CHUNK = 256


@dataclass(frozen=True)
class Pool:
    """The candidates of one SGLang drafting, per row, in SGLang's pool order (M nodes).

    scores: (b, M) float32, the product of the drafter's probabilities along each path.
    tokens: (b, M) the nodes' tokens (target ids).
    parent: (b, M) the pool index of each node's parent, -1 for the root's children.
    depth:  (M,) each node's depth, 1 for the root's children.
    """

    scores: torch.Tensor
    tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor


def check_triple(heads, steps: int, topk: int) -> None:
    """One line for a (steps, topk) the drafter cannot draft."""
    if not getattr(heads, "sequential", False):
        raise UserError(
            f"SGLang's dynamic tree drafts with an EAGLE-style drafter; {heads.kind} heads are not sequential"
        )
    if not 1 <= steps <= heads.num_heads:
        raise UserError(f"--speculative-num-steps: {steps} is outside 1..{heads.num_heads} (the drafter's depths)")
    if not 1 <= topk <= heads.vocab_size:
        raise UserError(f"--speculative-eagle-topk: {topk} is outside 1..{heads.vocab_size}")


def _top(drafter, state, depth: int, topk: int):
    """(probabilities, tokens) (rows, topk) of the drafter's top-`topk` children, and the carry."""
    logits, carry = drafter.depth_logits(state, depth)
    p, tokens = torch.softmax(logits.float(), dim=-1).topk(topk, dim=-1)
    return p, tokens, carry


def draft_pool(drafter, state, rows: int, steps: int, topk: int) -> Pool:
    """SGLang's pool (module doc) for `rows` roots whose drafter state is `state`."""
    device = state[0].device
    p, tokens, carry = _top(drafter, state, 0, topk)
    scores, all_tokens = [p], [tokens]
    parents = [torch.full((rows, topk), -1, dtype=torch.long, device=device)]
    beam_score, beam_index = p, torch.arange(topk, device=device).expand(rows, topk)
    beam_rows = torch.arange(rows, device=device).repeat_interleave(topk)
    beam_tokens = tokens
    offset = topk
    row_base = torch.arange(rows, device=device)[:, None] * topk
    for d in range(1, steps):
        state = drafter.child_state(select_rows(carry, beam_rows), d - 1, beam_tokens.reshape(-1))
        p, tokens, carry = _top(drafter, state, d, topk)  # rows (row, beam)
        expanded = (beam_score[:, :, None] * p.view(rows, topk, topk)).reshape(rows, topk * topk)
        tokens = tokens.view(rows, topk * topk)
        scores.append(expanded)
        all_tokens.append(tokens)
        parents.append(beam_index.repeat_interleave(topk, dim=1))
        # why: the next beams are the best topk of this step's candidates, not of the whole
        # pool (SGLang's select_top_k_tokens)
        beam_score, best = expanded.topk(topk, dim=-1)
        beam_index = offset + best
        beam_rows = (row_base + best // topk).reshape(-1)
        beam_tokens = tokens.gather(1, best)
        offset += topk * topk
    depth = torch.cat([torch.full((len(s[0]),), i + 1, device=device) for i, s in enumerate(scores)])
    return Pool(torch.cat(scores, 1), torch.cat(all_tokens, 1), torch.cat(parents, 1), depth)


def select_draft(pool: Pool, num_draft_tokens: int) -> torch.Tensor:
    """(b, num_draft_tokens - 1) pool indices of the draft: the best-scored nodes, in pool order
    (SGLang's organize_draft_results)."""
    return pool.scores.topk(num_draft_tokens - 1, dim=-1).indices.sort(dim=-1).values


def _on_path(pool: Pool, labels: torch.Tensor, topk: int) -> torch.Tensor:
    """(n, steps) pool index of the node at each depth whose path is `labels` (n, steps) (-1:
    no label), -1 once the path left the pool."""
    n, steps = labels.shape
    out = torch.full((n, steps), -1, dtype=torch.long, device=labels.device)
    cur = torch.full((n,), -1, dtype=torch.long, device=labels.device)  # the root
    lo = 0
    for d in range(steps):
        hi = lo + (topk if d == 0 else topk * topk)
        match = (pool.tokens[:, lo:hi] == labels[:, d, None]) & (pool.parent[:, lo:hi] == cur[:, None])
        match &= (labels[:, d] >= 0)[:, None]
        found = match.any(1)
        cur = torch.where(found, lo + match.long().argmax(1), -2)  # -2: no node has it as parent
        out[:, d] = torch.where(found, cur, -1)
        lo = hi
    return out


@torch.inference_mode()
def pool_records(model, heads, sequences, starts, *, steps: int, topk: int, pad_id: int = 0, inputs=None):
    """SGLang's pool at every counted position of `sequences` (rows as `label_rows(lengths,
    starts, steps)`), each root's drafter teacher-forced on the sequence before it, as
    `calibration.labels.label_ranks` does. Returns (scores (N, M) float32 with M =
    `sglang_pool_size(steps, topk)`, on_path (N, steps) int64: the pool index of the node whose
    path is the sequence's continuation, -1 where the pool has none), the inputs of
    `treeopt.dynamic_tree.dynamic_tau`. `inputs`: as `calibration.labels.label_ranks` takes
    them (the calibration ranks and drafts from one forward of the base model)."""
    check_triple(heads, steps, topk)
    lengths = [len(s) for s in sequences]
    seq, t, has = label_rows(lengths, starts, steps)
    scores = np.zeros((len(seq), sglang_pool_size(steps, topk)), np.float32)
    on_path = np.full((len(seq), steps), -1, np.int64)
    if len(seq) == 0:
        return scores, on_path
    own = inputs is None
    hidden, ids, pos = drafter_inputs(model, heads, sequences, pad_id=pad_id) if own else inputs
    device = hidden.device
    col = (ids.shape[1] - np.asarray(lengths, np.int64))[seq] + t
    try:
        for lo in range(0, len(seq), ROWS_PER_CHUNK):
            hi = min(lo + ROWS_PER_CHUNK, len(seq))
            b = torch.from_numpy(seq[lo:hi]).to(device)
            c = torch.from_numpy(col[lo:hi]).to(device)
            if hasattr(heads, "begin_at"):
                state = heads.begin_at(hidden[b, c], ids[b, c + 1], b, c, pos[b, c])
            else:
                state = heads.begin(hidden[b, c], ids[b, c + 1])
            pool = draft_pool(heads, state, hi - lo, steps, topk)
            cols = c[:, None] + torch.arange(steps, device=device)[None] + 2
            labelled = torch.from_numpy(has[lo:hi]).to(device)
            labels = torch.where(labelled, ids[b[:, None], cols.clamp(max=ids.shape[1] - 1)], -1)
            scores[lo:hi] = pool.scores.cpu().numpy()
            on_path[lo:hi] = _on_path(pool, labels, topk).cpu().numpy()
    finally:
        if own and hasattr(heads, "set_context"):
            heads.set_context(None)
    return scores, on_path
