"""The predicted speedup grid: batch x context x tree size, and the selection it implies.

For a proposal sequence T_1 ⊂ T_2 ⊂ ... (docs/builders.md#proposal-sequence) with expected tokens per step
tau[n] (tau[0] = 1: plain decoding), the model predicts
    overhead(b, s, n) = T(b, q = n + 1, s) / T(b, q = 1, s)
    speedup(b, s, n)  = tau[n] / overhead(b, s, n)
where T is `roofline.latency.step_time_s`; T(b, 1, s) is plain decoding without draft heads
(unless heads_in_baseline). The best tree per (batch, context) is the n of largest speedup;
n = 0 ("no speculation") when nothing beats 1.0.

Verification "candidates" (an engine without tree attention) verifies the prefix tree of n
nodes as its root-to-leaf paths, each a sequence of its depth + 1 tokens (the root repeated):
`candidates_by_prefix` (docs/performance-model.md#verification-modes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from roofline.hardware import HardwareProfile
from roofline.latency import fits_memory, step_time_s
from roofline.ops import DraftWork
from roofline.shapes import DraftHeadsShape, ModelShape
from roofline.step_shape import ONE_GPU, GpuSplit, StepShape
from treeopt.chain_or_tree import chain_prefix_length
from treeopt.errors import UserError
from treeopt.stats import physical_speedup

__all__ = [
    "DEFAULT_BATCHES",
    "DEFAULT_CONTEXTS",
    "GRID_COLUMNS",
    "speedup_grid",
    "PerTreeSize",
    "heads_used_by_prefix",
    "candidates_by_prefix",
    "check_tau",
    "draft_rows_by_prefix",
    "parents_of",
    "candidate_forms_grid",
    "CANDIDATE_FORMS",
    "FORM_COLUMNS",
]

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192)
GRID_COLUMNS = ("batch", "context", "nodes", "tau", "step_time_s", "overhead", "speedup", "fits_memory")


def check_tau(tau_by_nodes) -> np.ndarray:
    tau = np.asarray(tau_by_nodes, dtype=float)
    if tau.ndim != 1 or tau.size < 1:
        raise UserError("tau: expected a 1-D vector indexed by tree size (tau[0] = 1 for plain decoding)")
    if np.any(~np.isfinite(tau)) or np.any(tau < 1.0 - 1e-9):
        raise UserError("tau: every expected-tokens value must be a finite number >= 1")
    if abs(tau[0] - 1.0) > 1e-9:
        raise UserError(f"tau: tau[0] must be 1 (plain decoding emits one token per step), got {tau[0]:g}")
    return tau


def _positive_ints(values, name: str, minimum: int) -> np.ndarray:
    arr = np.asarray(list(values) if not np.isscalar(values) else [values])
    if arr.size == 0:
        raise UserError(f"{name}: needs at least one value")
    if arr.dtype.kind not in "iuf" or np.any(arr != np.round(arr)) or np.any(arr < minimum):
        raise UserError(f"{name}: values must be integers >= {minimum}, got {list(arr)}")
    return np.unique(arr.astype(np.int64))


def heads_used_by_prefix(tree) -> np.ndarray:
    """(n + 1,) number of draft heads the prefix tree of m nodes needs (its depth), m = 0..n."""
    lengths = np.array([len(p) for p in tree.paths], dtype=np.int64)
    return np.concatenate(([0], np.maximum.accumulate(lengths))) if lengths.size else np.zeros(1, np.int64)


def parents_of(tree) -> tuple[np.ndarray, np.ndarray]:
    """(depth, parent), each (n,): every node's depth and its parent's index in the tree's
    order, -1 for a child of the root (a node's parent is the row of the rank matrix equal to
    its own with the last rank cleared)."""
    ranks = tree.rank_matrix
    n = ranks.shape[0]
    depth = (ranks >= 0).sum(axis=1)
    trunk = ranks.copy()
    trunk[np.arange(n), depth - 1] = -1
    same = (trunk[:, None, :] == ranks[None, :, :]).all(axis=2)
    return depth, np.where(same.any(axis=1), same.argmax(axis=1), -1)


def draft_rows_by_prefix(tree, stages: int) -> np.ndarray:
    """(n + 1, stages) rows per sequence a sequential drafter runs stage d on (0-based) for the
    prefix tree of m nodes, m = 0..n: the nodes of depth d (the root is depth 0) that have
    children in the prefix (docs/decoder.md#drafters). A node joins those rows with its
    first child, so column d counts, up to m, the nodes of depth d + 1 that are their parent's
    first child."""
    n = tree.size
    rows = np.zeros((n + 1, stages))
    if n == 0:
        return rows
    depth, parent = parents_of(tree)
    # the root's children share parent -1; a node is a first child when no earlier node shares its parent
    earlier = np.tril(parent[:, None] == parent[None, :], k=-1).any(axis=1)
    first_child = ~earlier
    opens = first_child[:, None] & (depth[:, None] - 1 == np.arange(stages)[None, :])
    rows[1:] = np.cumsum(opens, axis=0)
    return rows


def candidates_by_prefix(tree) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, candidates), each (n + 1,): what verifying the prefix of m nodes as root-to-leaf
    candidate sequences costs, m = 0..n. A candidate is a leaf's path with the root in front
    (depth + 1 tokens); m = 0 is plain decoding, one candidate of one token.

    Adding node i adds a leaf of depth d_i + 1 tokens; when it is its parent's first child the
    parent (depth d_i - 1) stops being a leaf, taking d_i tokens away."""
    n = tree.size
    if n == 0:
        return np.ones(1), np.ones(1)
    depth, parent = parents_of(tree)
    has_parent = parent >= 0
    # first child: no earlier node shares its (non-root) parent
    earlier = np.tril(parent[:, None] == parent[None, :], k=-1).any(axis=1)
    first_child = has_parent & ~earlier
    leaves = np.arange(1, n + 1) - np.cumsum(first_child)
    tokens = np.cumsum(depth + 1) - np.cumsum(np.where(first_child, depth, 0))
    return (np.concatenate(([1.0], tokens)).astype(float), np.concatenate(([1.0], leaves)).astype(float))


@dataclass(frozen=True)
class PerTreeSize:
    """Optional (N + 1,) vectors over the proposal's tree sizes n = 0..N.

    heads_used: number of heads a step with the tree of n nodes runs (e.g.
    `heads_used_by_prefix(tree)` for a decoder that runs only the heads its tree reaches);
    default: all of the heads for every n >= 1.
    draft_stages: sequential draft stages per step (e.g. the prefix depth for a drafter that
    drafts depth by depth); default: those of a `DraftWork` drafter (a sequential drafter whose
    rows_per_sequence are (N + 1, stages), `draft_rows_by_prefix`), else none.
    drafted: bool, whether the target engine drafts the tree of n nodes as written
    (`treeopt.family_build.drafted_sizes`); the speedup of the other sizes is NaN, so no
    selection picks them."""

    heads_used: np.ndarray | None = None
    draft_stages: np.ndarray | None = None
    drafted: np.ndarray | None = None


@dataclass(frozen=True)
class _GridAxes:
    """The grid's broadcast axes, batch (B, 1, 1), context (1, S, 1) and tree size
    (1, 1, N + 1), with the tokens each step verifies, the candidate sequences they form
    (None: tree verification) and whether they branch (a tree, not a chain: the sizes beyond the
    proposal's first branching node, docs/performance-model.md#close-calls)."""

    b: np.ndarray
    s: np.ndarray
    n: np.ndarray
    q: np.ndarray
    cands: np.ndarray | None
    branches: np.ndarray | bool = False

    @property
    def full(self) -> tuple[int, int, int]:
        return (self.b.shape[0], self.s.shape[1], self.n.shape[2])

    def step(self, attention: str, draft_stages=None, gpus: GpuSplit = ONE_GPU) -> StepShape:
        """The grid's steps: every tree size's tokens (and candidates) over every cell."""
        return StepShape(
            self.b,
            self.q,
            self.s,
            attention,
            self.cands,
            draft_stages,
            gpus.tensor_parallel_gpus,
            self.branches,
            expert_parallel=gpus.expert_parallel,
        )


def _grid_axes(tau: np.ndarray, batches, contexts, verification: str, tree) -> _GridAxes:
    b = _positive_ints(batches, "--batch", 1)[:, None, None]
    s = _positive_ints(contexts, "--context", 0)[None, :, None]
    n = np.arange(tau.size)[None, None, :]
    q = n + 1
    cands = None
    if verification == "candidates":
        if tree is None or tree.size < tau.size - 1:
            raise UserError("--verification candidates: needs the proposal tree of every size in the grid")
        tokens_c, leaves = candidates_by_prefix(tree.prefix(tau.size - 1))
        q, cands = tokens_c[None, None, :], leaves[None, None, :]
    elif verification != "tree":
        raise UserError(f"--verification: must be 'tree' or 'candidates', got '{verification}'")
    # under a tree mask the proposal's first sizes are chains up to its first branching node; the
    # larger ones are trees, which an engine may verify by a costlier path (tree_verify_layer_s).
    # Candidate sequences are chains each; without the proposal every size is taken as a chain.
    branches = n > chain_prefix_length(tree) if verification == "tree" and tree is not None else False
    return _GridAxes(b, s, n, q, cands, branches)


def _grid_drafter(heads_shape, tau: np.ndarray, heads_used, heads_in_baseline: bool):
    """A sequential drafter with its rows per tree size on the grid's size axis; other drafters
    as they are."""
    if not isinstance(heads_shape, DraftWork):
        return heads_shape
    if heads_used is not None or heads_in_baseline:
        raise UserError(
            "a sequential drafter runs the stages its tree reaches: --used-heads and --heads-in-baseline do not apply"
        )
    rows = np.asarray(heads_shape.rows_per_sequence, dtype=float)
    if rows.ndim != 2 or rows.shape[0] != tau.size:
        raise UserError(f"draft rows: expected ({tau.size}, stages) rows per tree size, got {rows.shape}")
    # Hydra++'s prefix layer and an EAGLE draft's cache read the tokens the step before
    # accepted: τ in the steady state
    reads_accepted = heads_shape.cost.prefix_layer or heads_shape.cost.own_cache
    prefix_tokens = tau[None, None, :] if reads_accepted else heads_shape.prefix_tokens_per_sequence
    return replace(heads_shape, rows_per_sequence=rows[None, None], prefix_tokens_per_sequence=prefix_tokens)


def _tree_step_times(shape, heads_shape, hw, axes: _GridAxes, heads_used, step: StepShape) -> np.ndarray:
    """(B, S, N + 1) seconds of the step of every tree size, memory unchecked, each size with
    the heads it runs."""

    def price(heads):
        return np.broadcast_to(step_time_s(shape, heads, hw, step, on_oom="ignore"), axes.full)

    if heads_used is None or heads_shape is None:
        return price(heads_shape)
    used = np.asarray(heads_used, dtype=np.int64)
    if used.shape != (axes.full[2],) or np.any(used < 0) or np.any(used > heads_shape.num_heads):
        raise UserError(f"heads_used: expected {axes.full[2]} counts in 0..{heads_shape.num_heads}")
    t_tree = np.empty(axes.full)
    for k in np.unique(used):  # at most K + 1 distinct head counts
        t_k = price(replace(heads_shape, num_heads=int(k)) if k else None)
        sel = np.broadcast_to((used == k)[None, None, :], axes.full)
        t_tree[sel] = t_k[sel]
    return t_tree


def _grid_fits(shape, heads_shape, base_heads, hw, axes: _GridAxes, step: StepShape) -> np.ndarray:
    """(B, S, N + 1) whether each step fits in memory; n = 0 is plain decoding."""
    fits = np.broadcast_to(fits_memory(shape, heads_shape, hw, step), axes.full).copy()
    fits[:, :, :1] = np.broadcast_to(fits_memory(shape, base_heads, hw, step.plain()), fits[:, :, :1].shape)
    return fits


def speedup_grid(
    shape: ModelShape,
    heads_shape: DraftHeadsShape | None,
    hw: HardwareProfile,
    tau_by_nodes,
    batches=DEFAULT_BATCHES,
    contexts=DEFAULT_CONTEXTS,
    *,
    attention: str = "fused",
    heads_in_baseline: bool = False,
    verification: str = "tree",
    tree=None,
    per_size: PerTreeSize = PerTreeSize(),
    gpus: GpuSplit = ONE_GPU,
) -> pd.DataFrame:
    """One row per (batch, context, nodes) with columns GRID_COLUMNS, sorted in that order.

    tau_by_nodes: (N + 1,) expected tokens per step of the proposal tree of n nodes,
    n = 0..N (greedy tau curves, joint statistics, or measured acceptance). Configurations
    that do not fit in memory have fits_memory False and NaN times/speedups.
    verification: "tree" (q = n + 1 under a tree mask) or "candidates" (the prefix's
    root-to-leaf paths as separate sequences; needs `tree`, the proposal sequence).
    per_size: the heads, draft stages and drafted sizes of each tree size (`PerTreeSize`).
    gpus: the GPUs the model is split over and how (`GpuSplit`: docs/performance-model.md#tensor-parallelism,
    #expert-parallelism).
    """
    tau = check_tau(tau_by_nodes)
    axes = _grid_axes(tau, batches, contexts, verification, tree)
    stages = None if per_size.draft_stages is None else np.asarray(per_size.draft_stages, dtype=float)[None, None, :]
    heads_shape = _grid_drafter(heads_shape, tau, per_size.heads_used, heads_in_baseline)
    grid_step = axes.step(attention, stages, gpus)
    t_tree = _tree_step_times(shape, heads_shape, hw, axes, per_size.heads_used, grid_step)
    base_heads = heads_shape if heads_in_baseline else None
    b, s = axes.b, axes.s
    t_plain = step_time_s(shape, base_heads, hw, grid_step.plain(), on_oom="ignore")
    step = t_tree.copy()
    step[:, :, :1] = np.broadcast_to(t_plain, (b.shape[0], s.shape[1], 1))  # n = 0 is plain decoding
    fits = _grid_fits(shape, heads_shape, base_heads, hw, axes, grid_step)
    step = np.where(fits, step, np.nan)
    overhead = step / step[:, :, :1]
    tau_full = np.broadcast_to(tau[None, None, :], step.shape)
    speedup = physical_speedup(tau_full, overhead)
    if per_size.drafted is not None:
        speedup = np.where(np.asarray(per_size.drafted, bool)[None, None, : speedup.shape[2]], speedup, np.nan)
    B, S, N = np.broadcast_arrays(b, s, axes.n)
    return pd.DataFrame(
        {
            "batch": B.ravel(),
            "context": S.ravel(),
            "nodes": N.ravel(),
            "tau": tau_full.ravel(),
            "step_time_s": step.ravel(),
            "overhead": overhead.ravel(),
            "speedup": speedup.ravel(),
            "fits_memory": fits.ravel(),
        }
    )


CANDIDATE_FORMS = ("prefix-tree", "candidates")
FORM_COLUMNS = (
    "batch",
    "context",
    "form",
    "tokens",
    "sequences",
    "tau",
    "step_time_s",
    "overhead",
    "speedup",
    "fits_memory",
)


def candidate_forms_grid(
    shape: ModelShape,
    draft,
    hw: HardwareProfile,
    tau: float,
    tree,
    n_candidates: int,
    batches=DEFAULT_BATCHES,
    contexts=DEFAULT_CONTEXTS,
    *,
    candidate_draft=None,
    attention: str = "fused",
) -> pd.DataFrame:
    """IBM's candidate form verified both ways (docs/builders.md#ibms-candidate-form): one
    row per (batch, context, form) with columns FORM_COLUMNS.

    "prefix-tree": the n candidates merged into `tree`, q = nodes + 1 under a tree mask, drafted
    with `draft` (a DraftWork on that tree's rows, DraftHeadsShape or None); "candidates": n
    sequences of depth + 1 tokens each (batch expansion), drafted with `candidate_draft`
    (default `draft`). Both accept the same tokens, so tau (expected tokens per step) is shared
    and the speedup differs by the step time alone."""
    b = _positive_ints(batches, "--batch", 1)[:, None, None]
    s = _positive_ints(contexts, "--context", 0)[None, :, None]
    if tau < 1:
        raise UserError(f"tau: must be >= 1, got {tau}")
    forms = {
        "prefix-tree": (tree.size + 1.0, 1.0, draft),
        "candidates": (
            n_candidates * (tree.depth + 1.0),
            float(n_candidates),
            draft if candidate_draft is None else candidate_draft,
        ),
    }
    plain = StepShape(b, 1, s, attention)
    t_plain = step_time_s(shape, None, hw, plain, on_oom="ignore")
    fits_plain = fits_memory(shape, None, hw, plain)
    frames = []
    for form, (q, c, heads) in forms.items():  # two forms
        step = plain.with_tokens(q, None if c == 1 else c)
        if form == "prefix-tree":  # the merged candidates branch unless they are one chain
            step = replace(step, tree_verify=chain_prefix_length(tree) < tree.size)
        t = step_time_s(shape, heads, hw, step, on_oom="ignore")
        fits = fits_memory(shape, heads, hw, step) & fits_plain
        t = np.where(fits, t, np.nan)
        frames.append(_form_frame(b, s, form, q, c, float(tau), t, t / t_plain, fits))
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["batch", "context", "form"], kind="stable").reset_index(drop=True)


def _form_frame(b, s, form: str, q, c, tau: float, t, overhead, fits) -> pd.DataFrame:
    """The FORM_COLUMNS rows of one verification form over the (batch, context) cells."""
    B, S = np.broadcast_arrays(b, s)
    return pd.DataFrame(
        {
            "batch": B.ravel(),
            "context": S.ravel(),
            "form": form,
            "tokens": q,
            "sequences": c,
            "tau": tau,
            "step_time_s": np.broadcast_to(t, B.shape).ravel(),
            "overhead": np.broadcast_to(overhead, B.shape).ravel(),
            "speedup": tau / np.broadcast_to(overhead, B.shape).ravel(),
            "fits_memory": np.broadcast_to(fits, B.shape).ravel(),
        }
    )
