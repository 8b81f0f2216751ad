"""One decoding step's operators (`treeopt roofline ops`): the model, its drafter and the
hardware resolved from their specs, every operator's predicted time and binding roof, and the
memory the step needs (docs/performance-model.md#operators)."""

from __future__ import annotations

from dataclasses import dataclass

from roofline.hardware import HardwareProfile, load_hardware
from roofline.latency import StepTerms, candidates_of, memory_required_bytes, step_terms
from roofline.ops import DraftWork, drafter_work
from roofline.shapes import DraftHeadsShape, ModelShape
from roofline.step_shape import StepShape
from treeopt.app.models import draft_cost_of, heads_of, shape_of
from treeopt.drafter_cost import DraftCost
from treeopt.errors import UserError

__all__ = ["StepConfig", "StepOperators", "step_operators"]


@dataclass(frozen=True)
class StepConfig:
    """One decoding step: b sequences of q new tokens over s cached ones, its attention kernel,
    how the tokens are verified (candidates: sequences they are split into with "candidates"
    verification) and the sequential draft stages it runs (None: those its drafter runs)."""

    batch: int = 1
    tokens: int = 1
    context: int = 0
    attention: str = "fused"
    verification: str = "tree"
    candidates: int | None = None
    draft_stages: int | None = None


@dataclass(frozen=True)
class StepOperators:
    """A priced step: the model, hardware and drafter it ran with, the candidate sequences
    the operators saw (None: tree verification), its terms and the memory it needs."""

    shape: ModelShape
    hardware: HardwareProfile
    drafter: DraftHeadsShape | DraftWork
    step: StepConfig
    candidates: int | None
    terms: StepTerms
    memory_bytes: float

    @property
    def total_s(self) -> float:
        return float(self.terms.total_s)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.hardware.capacity_bytes

    def rows(self) -> list[dict]:
        """One dict per operator, then the framework and the engine terms when they cost
        anything (the JSON of `treeopt roofline ops`)."""
        rows = [_operator_row(t) for t in self.terms.timings]
        framework, engine = float(self.terms.framework_s), float(self.terms.speculation_s)
        if framework > 0:
            rows.append(_overhead_row("framework", framework, "framework"))
        if engine > 0:
            rows.append(_overhead_row("speculation", engine, "engine"))
        return rows


def _operator_row(t) -> dict:
    flops, nbytes = float(t.op.flops), float(t.op.bytes)
    return {
        "name": t.op.name,
        "count": t.op.count,
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes if nbytes else None,
        "time_s": float(t.time_s),
        "bound": str(t.bound),
        "compute_s": float(t.compute_s),
        "memory_s": float(t.memory_s),
        "overhead_s": float(t.overhead_s),
        "kernels": float(t.op.kernels),
        "kind": t.op.kind,
    }


def _overhead_row(name: str, seconds: float, kind: str) -> dict:
    return {
        "name": name,
        "count": 1,
        "flops": 0.0,
        "bytes": 0.0,
        "intensity": None,
        "time_s": seconds,
        "bound": "overhead",
        "compute_s": 0.0,
        "memory_s": 0.0,
        "overhead_s": seconds,
        "kernels": 0,
        "kind": kind,
    }


def _step_drafter(heads: DraftHeadsShape, cost: DraftCost | None, tokens: int, draft_rows):
    """The drafter the step runs: a sequential drafter on `draft_rows` rows per stage (default:
    a chain of tokens - 1 nodes, one row per stage it reaches), the heads of a drafter config,
    else the heads options' (plain decoding runs no drafter config's heads)."""
    if draft_rows is not None and (cost is None or not cost.sequential):
        raise UserError(
            "--draft-rows: only with a sequential drafter (--drafter hydra|mlp-speculator or --drafter-config)"
        )
    if cost is None or (not cost.sequential and tokens == 1):
        return heads
    if draft_rows is not None and len(draft_rows) > cost.stages:
        raise UserError(f"--draft-rows: {len(draft_rows)} values for a drafter of {cost.stages} stages")
    rows = list(draft_rows) if draft_rows is not None else [1] * min(tokens - 1, cost.stages)
    return drafter_work(cost, rows_per_stage=rows, heads_run=cost.stages, tokens_per_sequence=heads.tokens_per_sequence)


def step_operators(
    model,
    hardware,
    step: StepConfig,
    *,
    dtype: str | None = None,
    heads: dict | None = None,
    drafter: dict | None = None,
    draft_rows=None,
) -> StepOperators:
    """Every operator of one decoding step of `model` (a spec) on `hardware` (a name or
    profile file). `heads`: keyword arguments of `roofline.shapes.resolve_heads` (plain decoding
    runs none unless num_heads is given); `drafter`: those of
    `treeopt.app.models.draft_cost_of`; draft_rows: a sequential drafter's rows per sequence
    per stage."""
    shape = shape_of(model, dtype)
    hw = load_hardware(hardware)
    head_options = dict(heads or {})
    if head_options.get("num_heads") is None and step.tokens == 1:
        head_options["num_heads"] = 0  # plain decoding runs no heads unless asked
    head_shape = heads_of(model, shape, **head_options)
    cost = draft_cost_of(model, shape, **(drafter or {}))
    draft = _step_drafter(head_shape, cost, step.tokens, draft_rows)
    if step.candidates is not None and step.verification != "candidates":
        raise UserError("--candidates: only with --verification candidates")
    cands = candidates_of(step.verification, step.tokens, step.candidates)
    priced = StepShape(step.batch, step.tokens, step.context, step.attention, cands, step.draft_stages)
    terms = step_terms(shape, draft, hw, priced)
    need = float(memory_required_bytes(shape, draft, priced))
    return StepOperators(shape, hw, draft, step, cands, terms, need)
