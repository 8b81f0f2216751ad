"""The cost of draft-model speculative decoding: gamma sequential passes of the draft model
(its own shape, the same batch, its own cache of the same context), then one verification pass
of the target over gamma + 1 tokens (docs/performance-model.md#draft-model-steps;
Leviathan et al. 2023, section 3.4).

    step(gamma)    = sum_{j < gamma} T_draft(b, q = 1, s + j) + T_target(b, q = gamma + 1, s)
    speedup(gamma) = tau(gamma) x T_target(b, 1, s) / step(gamma)

gamma = 0 is plain decoding (speedup 1). tau(gamma) comes from the core
(`treeopt.chain.chain_tau`).

A tree of draft-model tokens (`draft_model_tree_step_time_s`) is drafted depth by depth: pass d
runs the draft on the w_{d-1} nodes of depth d - 1 (w_0 = 1, the root) over its cache of the
context plus the tokens read by the passes before, then the target verifies the n + 1 tokens
with tree attention; a chain of gamma (every w_d = 1) is `draft_model_step_time_s`. tau of a
tree under recursive rejection sampling comes from `treeopt.chain.rejection_tau`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from roofline.hardware import HardwareProfile
from roofline.latency import memory_required_bytes, step_time_s
from roofline.shapes import ModelShape
from roofline.step_shape import StepShape
from treeopt.chain import chain_tau
from treeopt.errors import UserError
from treeopt.tree import Tree

GAMMA_COLUMNS = [
    "batch",
    "context",
    "gamma",
    "tau",
    "draft_s",
    "verify_s",
    "step_time_s",
    "plain_step_s",
    "speedup",
    "fits_memory",
]
TREE_COLUMNS = [
    "batch",
    "context",
    "nodes",
    "depth",
    "tau",
    "draft_s",
    "verify_s",
    "step_time_s",
    "plain_step_s",
    "speedup",
    "fits_memory",
]


def draft_model_step_time_s(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    *,
    batch: int,
    gamma,
    context: int,
    attention: str = "fused",
):
    """Predicted seconds of one draft-model step for each gamma (an int or an array of ints):
    gamma draft passes of one token per sequence, the j-th over a cache of context + j tokens,
    plus the target's verification of gamma + 1 tokens. NaN where the two models' weights, KV
    caches and activations together exceed the profile's memory."""
    g = np.asarray(gamma, dtype=np.int64)
    if np.any(g < 0):
        raise UserError(f"gamma: must be >= 0, got {gamma!r}")
    longest = int(g.max(initial=0))
    passes = np.arange(longest)
    # why: the draft is autoregressive, each pass reads one more cached token than the last
    # (docs/performance-model.md#draft-model-steps)
    per_pass = (
        np.atleast_1d(step_time_s(draft, None, hw, StepShape(batch, 1, context + passes, attention), on_oom="ignore"))
        if longest
        else np.zeros(0)
    )
    drafting = np.concatenate([[0.0], np.cumsum(per_pass)])[g]
    verification = StepShape(batch, g + 1, context, attention)
    verify = step_time_s(target, None, hw, verification, on_oom="ignore")
    need = memory_required_bytes(target, None, verification) + memory_required_bytes(
        draft, None, StepShape(batch, 1, context + g, attention)
    )
    total = np.where(need <= hw.capacity_bytes, drafting + verify, np.nan)
    return float(total) if total.ndim == 0 else total


def draft_model_tree_step_time_s(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    *,
    batch: int,
    level_widths,
    context: int,
    attention: str = "fused",
):
    """Predicted seconds of one draft-model step over a tree with `level_widths` nodes at depths
    1..D (one tree (D,), or trees (T, D) zero-padded to a common depth): pass d reads the w_{d-1}
    nodes of depth d - 1 of every sequence (w_0 = 1) over context + the tokens the passes before
    read, then the target verifies n + 1 tokens. A float for one tree, else (T,). NaN where
    the two models' weights, KV caches and activations together exceed the profile's memory.
    Every w_d = 1 is a chain: `draft_model_step_time_s` of gamma = D."""
    widths = np.asarray(level_widths, dtype=np.int64)
    if widths.ndim not in (1, 2) or np.any(widths < 0):
        raise UserError(f"level widths: expected non-negative node counts per depth, got {level_widths!r}")
    w = np.atleast_2d(widths)
    # why: pass d reads the nodes of depth d - 1 (the root for d = 1) to draft depth d; its cache
    # holds the context and every token the earlier passes read (docs/performance-model.md#draft-model-trees)
    reads = np.concatenate([np.ones((len(w), 1), np.int64), w[:, :-1]], axis=1)
    runs = w > 0
    read_before = np.concatenate([np.zeros((len(w), 1), np.int64), np.cumsum(reads * runs, axis=1)[:, :-1]], axis=1)
    per_pass = step_time_s(
        draft, None, hw, StepShape(batch, np.maximum(reads, 1), context + read_before, attention), on_oom="ignore"
    )
    drafting = np.cumsum(np.where(runs, per_pass, 0.0), axis=1)[:, -1] if w.shape[1] else np.zeros(len(w))
    nodes = w.sum(1)
    # a tree wider than one node at some depth branches (docs/performance-model.md#engine-terms-of-a-speculative-step)
    verification = StepShape(batch, nodes + 1, context, attention, tree_verify=nodes > (w > 0).sum(1))
    verify = step_time_s(target, None, hw, verification, on_oom="ignore")
    widest_reads = np.where(runs, reads, 1).max(1, initial=1)
    widest_pass = StepShape(batch, widest_reads, context + (reads * runs).sum(1), attention)
    need = memory_required_bytes(target, None, verification) + memory_required_bytes(draft, None, widest_pass)
    total = np.where(need <= hw.capacity_bytes, drafting + verify, np.nan)
    return float(total[0]) if widths.ndim == 1 else total


def level_widths_by_prefix(proposal: Tree) -> np.ndarray:
    """(n + 1, D) nodes per depth of proposal.prefix(m), m = 0 .. n, zero-padded."""
    depth = np.array([len(p) for p in proposal.paths], dtype=np.int64)
    onehot = np.zeros((proposal.size + 1, max(proposal.depth, 1)), np.int64)
    onehot[np.arange(1, proposal.size + 1), depth - 1] = 1
    return np.cumsum(onehot, axis=0)


def _prefix_grid(target, draft, hw, widths: np.ndarray, tau: np.ndarray, batches, contexts, attention) -> pd.DataFrame:
    """Every (batch, context, prefix) of the prefixes whose level widths are `widths` (m, D):
    columns `TREE_COLUMNS`, the step from `draft_model_tree_step_time_s` (a chain's equals
    `draft_model_step_time_s`), its verification alone, plain decoding's step, and
    speedup = tau x plain / step."""
    nodes = widths.sum(1)
    depth = (widths > 0).sum(1)
    frames = []
    for b in batches:  # loop over grid cells; each cell is vectorised over the prefixes
        for s in contexts:
            step = draft_model_tree_step_time_s(
                target, draft, hw, batch=int(b), level_widths=widths, context=int(s), attention=attention
            )
            verify = step_time_s(
                target,
                None,
                hw,
                StepShape(int(b), nodes + 1, int(s), attention, tree_verify=nodes > depth),
                on_oom="ignore",
            )
            plain = float(verify[0])
            frames.append(
                pd.DataFrame(
                    {
                        "batch": int(b),
                        "context": int(s),
                        "nodes": nodes,
                        "depth": depth,
                        "tau": tau,
                        "draft_s": step - verify,
                        "verify_s": verify,
                        "step_time_s": step,
                        "plain_step_s": plain,
                        "speedup": tau * plain / step,
                        "fits_memory": np.isfinite(step),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)[TREE_COLUMNS]


def tree_grid(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    proposal: Tree,
    tau,
    *,
    batches,
    contexts,
    attention: str = "fused",
) -> pd.DataFrame:
    """Every (batch, context, prefix of `proposal`), columns `TREE_COLUMNS`: tau of each prefix
    (`tau`, n + 1 values, from `treeopt.chain.rejection_tau_curve`), the step's draft and
    verification seconds (`draft_model_tree_step_time_s`), plain decoding's step and
    speedup = tau x plain / step."""
    tau = np.asarray(tau, dtype=np.float64)
    if tau.shape != (proposal.size + 1,):
        raise UserError(f"tau: expected {proposal.size + 1} values (tree sizes 0..{proposal.size}), got {tau.shape}")
    return _prefix_grid(target, draft, hw, level_widths_by_prefix(proposal), tau, batches, contexts, attention)


def gamma_grid(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    alpha_per_depth,
    *,
    batches,
    contexts,
    max_gamma: int | None = None,
    attention: str = "fused",
) -> pd.DataFrame:
    """Every (batch, context, gamma) for gamma = 0 .. max_gamma (default: the depths alpha
    covers), columns `GAMMA_COLUMNS`: tau(gamma) from `alpha_per_depth`, the step's draft and
    verification seconds, plain decoding's step and speedup = tau x plain / step."""
    tau = chain_tau(alpha_per_depth)
    top = len(tau) - 1 if max_gamma is None else int(max_gamma)
    if not 0 <= top < len(tau):
        raise UserError(f"--max-gamma: {max_gamma} needs alpha for {max_gamma} depths, the sidecar has {len(tau) - 1}")
    # the chain of gamma drafts is the tree with one node at each of its gamma depths
    chains = np.tri(top + 1, max(top, 1), -1, dtype=np.int64)
    grid = _prefix_grid(target, draft, hw, chains, tau[: top + 1], batches, contexts, attention)
    return grid.rename(columns={"nodes": "gamma"})[GAMMA_COLUMNS]


def best_gamma(grid: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, context) the row of the fastest gamma (of a `gamma_grid`) or tree (of a
    `tree_grid`); gamma 0 / 0 nodes (no speculation) where none beats plain decoding, and rows
    that do not fit memory are never chosen."""
    ok = grid[grid["fits_memory"]]
    idx = ok.groupby(["batch", "context"])["speedup"].idxmax()
    return ok.loc[idx].sort_values(["batch", "context"], ignore_index=True)
