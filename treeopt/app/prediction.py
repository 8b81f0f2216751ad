"""The predicted speedup grid for a model, a drafter, an accelerator and an accuracy table: what
`treeopt roofline speedup`, `treeopt report` and `treeopt.predict` share.

The proposal is Medusa's greedy sequence (within the engine's family when one is given) and
its tau curve; the step costs come from the roofline (`roofline.grid.speedup_grid`,
docs/performance-model.md). The result is a `Prediction`: the grid with its inputs named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from roofline.engine_presets import step_costs
from roofline.grid import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    PerTreeSize,
    draft_rows_by_prefix,
    heads_used_by_prefix,
    speedup_grid,
)
from roofline.hardware import GIB, HardwareProfile, load_hardware
from roofline.ops import DraftWork, drafter_work
from roofline.shapes import DraftHeadsShape, ModelShape
from roofline.step_shape import GpuSplit
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.app.models import draft_cost_of, heads_of, shape_of
from treeopt.chain_counts import describe_window, window_of_table
from treeopt.drafter_cost import DraftCost
from treeopt.engines import Engine, get_engine
from treeopt.errors import UserError
from treeopt.family_build import drafted_sizes, engine_proposal
from treeopt.selection import best_per_cell
from treeopt.tau import first_heads, proposal_sequence, tau_curves
from treeopt.tree import Tree
from treeopt.tree_api import serving_engine

#: peak memory per (batch, context, nodes) cell of a predicted grid, with the best tree per
#: cell and the selection: 1.07 KB measured with tracemalloc (llama-7b, 16 x 16 and 64 x 64 x 65
#: cells), rounded up for pandas' copies; benchmarks/bench_roofline.py checks it
GRID_BYTES_PER_CELL = 1536
#: the most memory a grid may take: above it the command refuses with its estimate
GRID_MEMORY_LIMIT_BYTES = 2**30


def check_grid_size(batches, contexts, max_nodes: int) -> None:
    """UserError with the estimate, before any work, when the grid would take more memory than
    GRID_MEMORY_LIMIT_BYTES."""
    cells = len(batches) * len(contexts) * (max_nodes + 1)
    need = cells * GRID_BYTES_PER_CELL
    if need > GRID_MEMORY_LIMIT_BYTES:
        raise UserError(
            f"--batch x --context x --max-nodes: {len(batches)} x {len(contexts)} x {max_nodes + 1} = "
            f"{cells:,} cells would take about {need / GIB:.1f} GiB (limit "
            f"{GRID_MEMORY_LIMIT_BYTES / GIB:.0f} GiB, {GRID_MEMORY_LIMIT_BYTES // GRID_BYTES_PER_CELL:,} "
            "cells); predict fewer values"
        )


def greedy_proposal(
    table: AccuracyTable, max_nodes: int, num_heads: int, joint: bool, engine: Engine | None = None
) -> tuple[Tree, np.ndarray]:
    """Medusa's greedy proposal sequence over the first `num_heads` heads and its tau (joint:
    from the table's joint prefix counts); with `engine`, the greedy within its family."""
    if joint and table.joint is None:
        raise UserError("--joint: the accuracy table has no joint prefix counts")
    if joint and num_heads < table.num_heads:
        raise UserError("--joint: cannot cut a table with joint counts to fewer heads")
    table = first_heads(table, num_heads)
    proposal = (
        engine_proposal(table, max_nodes, engine, method="greedy")
        if engine is not None
        else proposal_sequence(table, max_nodes, method="greedy")
    )
    curves = tau_curves(table, proposal)
    return curves.proposal, curves.joint if joint else curves.independent


def sequential_work(cost: DraftCost | None, tree: Tree) -> DraftWork | None:
    """A sequential drafter's work on every prefix of `tree` (None for Medusa's parallel heads)."""
    if cost is None or not cost.sequential:
        return None
    return DraftWork(cost, draft_rows_by_prefix(tree, cost.stages))


def heads_with_cost(cost: DraftCost | None, heads: DraftHeadsShape) -> DraftHeadsShape:
    """Medusa heads read from a drafter config replace those of the heads options."""
    if cost is None or cost.sequential:
        return heads
    return drafter_work(cost, rows_per_stage=(), heads_run=cost.stages, tokens_per_sequence=heads.tokens_per_sequence)


@dataclass(frozen=True, eq=False)
class Prediction:
    """A predicted speedup grid and what it was computed from.

    `grid`: one row per (batch, context, nodes) with `roofline.grid.GRID_COLUMNS` (step_time_s:
    seconds per decoding step of the whole batch; overhead = T(n) / T(0); speedup = tau /
    overhead; NaN where the configuration does not fit in memory or the engine does not draft
    that size). `proposal`: the nested proposal
    sequence whose prefix of n nodes is the tree of row n; `tau[n]`: its expected tokens per step.
    """

    model: ModelShape | None  # None for a grid read back from a CSV
    hardware: HardwareProfile | None  # likewise
    proposal: Tree
    tau: np.ndarray = field(repr=False)
    grid: pd.DataFrame = field(repr=False)
    accuracy: AccuracyTable | None = field(default=None, repr=False)
    engine: str | None = None
    verification: str = "tree"
    attention: str = "fused"
    draft_heads: int = 0  # the draft heads (stages) the prediction charges
    drafter: str = ""  # what priced the drafting, as its `describe()` says it
    source: str = "the grid"  # how messages name it: a grid file's path
    step_costs: str = ""  # which engine preset priced the steps, one line (roofline.engine_presets)

    def __repr__(self) -> str:
        g = self.grid
        model, hardware = getattr(self.model, "name", None), getattr(self.hardware, "name", None)
        return (
            f"Prediction(model={model!r}, hardware={hardware!r}, engine={self.engine!r}, "
            f"proposal of {self.proposal.size} nodes, {g['batch'].nunique()} batches x "
            f"{g['context'].nunique()} contexts x {g['nodes'].nunique()} sizes)"
        )

    def to_frame(self) -> pd.DataFrame:
        """The grid, one row per (batch, context, nodes) (a copy)."""
        return self.grid.copy()

    def best(self, *, threshold: float = 1.0) -> pd.DataFrame:
        """Per (batch, context): the size of largest predicted speedup (nodes 0 when none beats
        `threshold`), with tau, overhead, speedup and fits_memory."""
        return best_per_cell(self.grid, threshold=threshold)

    def tree(self, nodes: int) -> Tree:
        """The proposal's tree of `nodes` nodes (the tree of the grid's rows with that size)."""
        if not 0 <= int(nodes) <= self.proposal.size:
            raise UserError(f"nodes: {nodes} is not between 0 and the proposal's {self.proposal.size}")
        return self.proposal.prefix(int(nodes))

    def plot(self, context: int | None = None, *, title: str | None = None):
        """Predicted speedup and overhead against tree size at one context (default: the largest
        context of the grid up to 1024 tokens), one curve per batch; a matplotlib Figure."""
        # matplotlib loads when a figure is asked for, not with the library
        from roofline.plots import speedup_curves_figure

        contexts = sorted(int(c) for c in self.grid["context"].unique())
        if context is None:
            context = max([c for c in contexts if c <= 1024] or contexts[:1])
        if context not in contexts:
            raise UserError(f"context: {context} is not one of the grid's contexts {contexts}")
        return speedup_curves_figure(self.grid, context=context, title=title)

    def plot_best(self, *, threshold: float = 1.0, title: str | None = None):
        """The best tree size and its predicted speedup over batch x context; a matplotlib Figure."""
        # matplotlib loads when a figure is asked for, not with the library
        from roofline.plots import best_heatmaps_figure

        return best_heatmaps_figure(self.best(threshold=threshold), title=title)


@dataclass(frozen=True)
class PredictionOptions:
    """How a predicted step is priced and which tau it uses: the knobs most predictions leave
    at their defaults (docs/performance-model.md).

    verification: "tree" (one sequence under a tree mask) or "candidates" (each root-to-leaf
    path its own sequence, re-reading the context). attention: "fused" or "unfused". joint:
    tau from the table's joint prefix counts. heads_in_baseline: plain decoding (n = 0) also
    runs the heads. used_heads: a tree runs only the heads its depth reaches, not all of them.
    sequential_draft: the drafter drafts depth by depth, one draft stage per level.
    engine_costs: the engine family whose preset prices the steps on a built-in profile
    (`roofline.engine_presets.FAMILIES`; default: the family of the prediction's engine, else the
    ideal engine; docs/performance-model.md#engine-presets). tensor_parallel: GPUs the model is
    split over (docs/performance-model.md#tensor-parallelism); expert_parallel: its routed
    experts spread whole over them (docs/performance-model.md#expert-parallelism)."""

    verification: str = "tree"
    attention: str = "fused"
    joint: bool = False
    heads_in_baseline: bool = False
    used_heads: bool = False
    sequential_draft: bool = False
    engine_costs: str | None = None
    tensor_parallel: int = 1
    expert_parallel: bool = False


def predict_speedup(
    model: str | ModelShape,
    hardware: str | HardwareProfile,
    accuracy: AccuracyTable,
    *,
    dtype: str | None = None,
    batches=DEFAULT_BATCHES,
    contexts=DEFAULT_CONTEXTS,
    max_nodes: int = 64,
    engine: str | None = None,
    heads: dict | None = None,
    drafter: dict | None = None,
    options: PredictionOptions = PredictionOptions(),
) -> Prediction:
    """The predicted grid of every batch x context x tree size (docs/performance-model.md).

    `heads`: keyword arguments of `roofline.shapes.resolve_heads` (num_heads, num_layers,
    tokens_per_sequence); `drafter`: those of `treeopt.app.models.draft_cost_of` (drafter,
    drafter_config); `options`: how the step is priced (`PredictionOptions`)."""
    check_grid_size(batches, contexts, max_nodes)
    shape = model if isinstance(model, ModelShape) else shape_of(model, dtype)
    spec = shape.name if isinstance(model, ModelShape) else model
    head_shape = heads_of(spec, shape, accuracy_heads=accuracy.num_heads, **(heads or {}))
    cost = draft_cost_of(spec, shape, **(drafter or {}))
    # the preset charges a drafter kind's cost per drafted depth; without a drafter config, the
    # depth-by-depth drafter it was fitted on (docs/performance-model.md#engine-presets)
    kind = cost.drafter if cost is not None else None
    costs = step_costs(load_hardware(hardware), engine=engine, family=options.engine_costs, drafter=kind)
    hw = costs.profile
    head_shape = heads_with_cost(cost, head_shape)
    if head_shape.num_heads < 1:
        raise UserError("--num-heads: a speedup grid needs at least one draft head")
    depth = min(head_shape.num_heads, cost.stages) if cost is not None else head_shape.num_heads
    target = get_engine(serving_engine(engine, accuracy)) if engine else None
    tree, tau = greedy_proposal(accuracy, max_nodes, depth, options.joint, target)
    work = sequential_work(cost, tree)
    # sizes the engine would not draft as written are never picked (vLLM's uniform trees)
    drafted = drafted_sizes(tree, target) if target is not None and target.family == "uniform" else None
    grid = speedup_grid(
        shape,
        work or head_shape,
        hw,
        tau,
        batches,
        contexts,
        attention=options.attention,
        heads_in_baseline=options.heads_in_baseline,
        verification=options.verification,
        tree=tree,
        per_size=PerTreeSize(
            heads_used=heads_used_by_prefix(tree) if options.used_heads and work is None else None,
            draft_stages=heads_used_by_prefix(tree) if options.sequential_draft and work is None else None,
            drafted=drafted,
        ),
        gpus=GpuSplit(options.tensor_parallel, options.expert_parallel),
    )
    return Prediction(
        model=shape,
        hardware=hw,
        proposal=tree,
        tau=tau,
        grid=grid,
        accuracy=accuracy,
        engine=target.name if target is not None else None,
        verification=options.verification,
        attention=options.attention,
        draft_heads=head_shape.num_heads,
        drafter=(work or head_shape).describe(),
        step_costs=costs.line,
    )


def load_table(path, csv_model: str | None, model_name: str) -> tuple[AccuracyTable, str]:
    """The table and how to name it; a CSV of several models gives the rows named like the model."""
    table = load_accuracy(path, model=csv_model, default_model=None if csv_model else str(model_name).lower())
    rows = table.provenance.get("model")
    window = window_of_table(table, str(path))
    if window is not None:  # an engine's own counts: say which engine, window and counts
        return table, f"`{path}` (engine-reported chain acceptance: {describe_window(window)})"
    return table, f"`{path}` (rows of {rows})" if rows and str(path).lower().endswith(".csv") else f"`{path}`"
