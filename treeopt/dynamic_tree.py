"""tau of SGLang's dynamic EAGLE tree for a (steps, topk, num_draft_tokens) triple, from the
drafter's own scores recorded at calibration positions (docs/statistics.md#dynamic-trees).

SGLang drafts a new tree every step from the drafter's probabilities (docs/engines.md#sglang):
step 1 takes the root's top-`topk` children, every later step expands the `topk` best-scored
nodes of the previous level by their top-`topk` children (score = product of the drafter's
probabilities along the path), and the draft is the ``num_draft_tokens - 1`` best-scored
nodes of that pool. Which nodes are drafted depends on the scores of nodes off the base
model's path, so the calibration drafts the whole pool at each position
(`calibration.sglang_drafting.pool_records`) and records, per position t:

- ``scores`` (N, M): the pool's scores in SGLang's order (level 1's topk, then each later
  level's topk * topk, beam-major), M = `sglang_pool_size` of the deepest steps recorded;
- ``on_path`` (N, S): the pool index of the node at depth d = 1..S whose path is the base
  model's greedy continuation after t, -1 where the pool holds no such node (its parent was
  not a beam, its rank was not in the top-topk, or the continuation has no label there).

A step that starts at t accepts the on-path nodes down to the first one not drafted; a node is
drafted when it is in the pool of the first `steps` levels and fewer than
``num_draft_tokens - 1`` pool nodes score strictly higher (ties count in the node's favour,
like the ranks' convention, docs/statistics.md#labels; SGLang's torch.topk breaks exact ties
either way). The next step starts at t + accepted + 1: the walk of
`treeopt.acceptance.walked_tokens_per_step`.

numpy only.
"""

from __future__ import annotations

import numpy as np

from treeopt.acceptance import walked_tokens_per_step
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError

__all__ = ["dynamic_accepted", "dynamic_tau", "forced_draft_tokens"]

#: groups of whole sequences for tau's standard error (as `treeopt.stats.tau_stderr`)
GROUPS = 20


def forced_draft_tokens(steps: int, topk: int, num_draft_tokens: int) -> int:
    """SGLang forces num_draft_tokens to steps + 1 for a chain (topk 1; docs/engines.md#sglang)."""
    return steps + 1 if topk == 1 else num_draft_tokens


def _check(scores: np.ndarray, on_path: np.ndarray, steps: int, topk: int, num_draft_tokens: int) -> int:
    if scores.ndim != 2 or on_path.ndim != 2 or scores.shape[0] != on_path.shape[0]:
        raise UserError(
            f"scores {scores.shape} and on_path {on_path.shape}: expected (N, M) and (N, S) over the same positions"
        )
    if not 1 <= steps <= on_path.shape[1]:
        raise UserError(f"--speculative-num-steps: {steps} is outside 1..{on_path.shape[1]} (the steps recorded)")
    pool = sglang_pool_size(steps, topk)
    if pool > scores.shape[1]:
        raise UserError(
            f"--speculative-eagle-topk: {steps} steps of topk {topk} need a pool of {pool} scores, "
            f"the records hold {scores.shape[1]} (recorded for another topk?)"
        )
    if not 2 <= num_draft_tokens <= pool + 1:
        raise UserError(
            f"--speculative-num-draft-tokens: {num_draft_tokens} is outside 2..{pool + 1} "
            f"for {steps} steps of topk {topk}"
        )
    return pool


def dynamic_accepted(scores, on_path, steps: int, topk: int, num_draft_tokens: int) -> np.ndarray:
    """(N,) nodes a step starting at each recorded position accepts under SGLang's triple
    (module doc); `num_draft_tokens` is forced to steps + 1 when topk is 1. Vectorised over
    positions and pool nodes."""
    scores = np.asarray(scores, dtype=np.float64)
    on_path = np.asarray(on_path, dtype=np.int64)
    num_draft_tokens = forced_draft_tokens(steps, topk, num_draft_tokens)
    pool = _check(scores, on_path, steps, topk, num_draft_tokens)
    s = scores[:, :pool]
    idx = on_path[:, :steps]
    present = (idx >= 0) & (idx < pool)
    mine = np.take_along_axis(s, np.where(present, idx, 0), axis=1)  # (N, steps)
    higher = (s[:, :, None] > mine[:, None, :]).sum(1)  # pool nodes scoring strictly higher
    drafted = present & (higher < num_draft_tokens - 1)
    return np.cumprod(drafted, axis=1).sum(1)


def dynamic_tau(
    scores, on_path, sequence_ids, steps: int, topk: int, num_draft_tokens: int, *, start_rows: int | None = None
) -> tuple[float, float, int]:
    """The decoder's mean tokens per step under SGLang's triple, walked over the recorded
    calibration sequences like the decoder (`dynamic_accepted` + 1 per step), its standard
    error from batch means over up to `GROUPS` groups of whole sequences (acceptance comes in
    runs along a sequence; `treeopt.stats.tau_stderr`), and the steps walked. `start_rows` as
    in `treeopt.acceptance.simulate_tokens_per_step`."""
    lengths = 1 + dynamic_accepted(scores, on_path, steps, topk, num_draft_tokens)
    seq = np.asarray(sequence_ids)
    tau, walked = walked_tokens_per_step(lengths, seq, start_rows=start_rows)
    ids = np.unique(seq)
    g = min(GROUPS, ids.size)
    if g < 2:
        return tau, float("nan"), walked
    group = (np.arange(ids.size) * g // ids.size)[np.searchsorted(ids, seq)]
    means = [walked_tokens_per_step(lengths[group == k], seq[group == k], start_rows=start_rows)[0] for k in range(g)]
    return tau, float(np.std(means, ddof=1) / np.sqrt(g)), walked
