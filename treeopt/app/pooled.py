"""Pooled evidence: one engine profile fitted to every cell of a sweep, with its uncertainty
from a bootstrap over rounds, checked against each cell and used to decide the cells the
measurement left open (docs/statistics.md#pooled-evidence).

A cell measures its own tree sizes with a few dozen rounds; the profile pools all cells'
rounds into a few engine terms, so its T(n)/T(0) is far less noisy than one cell's, as long as
the engine behaves as the latency model says. Where a cell's measurement differs from the fit
by more than the tolerance beyond the noise, the model does not describe that cell and the
cell's own answer stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.hardware import HardwareProfile, builtin_hardware, hardware_aliases, load_hardware
from roofline.profile_fit import fit_profile, predict_step_s, sweep_step_points
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt.app.models import draft_cost_of, heads_of, heads_shape_of_drafter, shape_of
from treeopt.dtypes import torch_dtype_name
from treeopt.errors import UserError
from treeopt.selection_notes import missing_prediction_reason
from treeopt.selection_types import PooledEvidence, Selection, SelectionCell
from treeopt.stats import (
    CONFIDENCE,
    DEFAULT_TOLERANCE,
    SpeedupDraws,
    consistent_with_fit,
    decide_cell,
    interval,
    shipped_confidence,
)
from treeopt.sweep_file import cell_draws
from treeopt.tree import Tree

#: bootstrap refits of the pooled profile: each costs one least-squares fit (about 0.5 s for the
#: demo's 64 rows on the development CPU), and the fit's spread is a small part of a cell's
POOLED_DRAWS = 40


@dataclass(frozen=True)
class PooledFit:
    """The profile fitted to every row of a sweep and its bootstrap over rounds.

    `terms`: the fitted engine terms (seconds or efficiencies, by name); `term_intervals`:
    their 95% percentile intervals over the refits; `overhead_point[(batch, context)]`: the
    fit's T(n)/T(0) per size of the cell (sizes ascending, `sizes[(batch, context)]`),
    `overhead_draws[(batch, context)]`: (draws, sizes) the same from every refit."""

    terms: dict
    term_intervals: dict
    sizes: dict = field(repr=False)
    overhead_point: dict = field(repr=False)
    overhead_draws: dict = field(repr=False)
    draws: int = POOLED_DRAWS
    status: dict = field(default_factory=dict)  # the fit's TermStatus of each term


def _cell_overheads(sweep: pd.DataFrame, step_s: np.ndarray) -> dict:
    """{(batch, context): T(n)/T(0) per size ascending} from per-row step seconds."""
    frame = sweep[["batch", "context", "nodes"]].assign(step_s=step_s)
    out = {}
    for (b, s), cell in frame.groupby(["batch", "context"]):
        cell = cell.sort_values("nodes")
        out[(int(b), int(s))] = cell["step_s"].to_numpy() / float(cell["step_s"].iloc[0])
    return out


def fit_pooled(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    base: HardwareProfile,
    sweep: pd.DataFrame,
    samples: dict,
    heads_by_nodes,
    *,
    draws: int = POOLED_DRAWS,
    seed: int = 0,
) -> PooledFit:
    """Fit `base`'s engine terms to every row of `sweep` (median step times) and refit on
    `draws` bootstrap resamples of each cell's paired rounds (`samples`, as
    `treeopt.selection.read_round_samples` returns them)."""
    sweep = sweep.sort_values(["batch", "context", "nodes"], ignore_index=True)
    points = sweep_step_points(sweep, heads_by_nodes)
    fit = fit_profile(shape, heads, base, points, leave_one_out=False, source="the sweep's rows")
    point = _cell_overheads(sweep, predict_step_s(shape, heads, fit.profile, points))
    rng = np.random.default_rng(seed)
    rows = {key: np.flatnonzero((sweep["batch"] == key[0]) & (sweep["context"] == key[1])) for key in samples}
    terms, overheads = [], []
    for _ in range(draws):
        step = sweep["step_time_s"].to_numpy(dtype=float).copy()
        for key, (sizes, x) in samples.items():
            pick = rng.integers(0, x.shape[0], size=x.shape[0])  # whole rounds, as the cells' own bootstrap
            if len(rows[key]) == len(sizes):
                step[rows[key]] = np.median(x[pick], axis=0)
        refit = fit_profile(shape, heads, base, replace(points, step_s=step), leave_one_out=False, noise=fit.noise)
        terms.append(refit.terms)
        overheads.append(_cell_overheads(sweep, predict_step_s(shape, heads, refit.profile, points)))
    intervals = {
        name: tuple(float(v) for v in np.quantile([t[name] for t in terms], [0.025, 0.975])) for name in fit.terms
    }
    sizes = {
        (int(b), int(s)): cell["nodes"].astype(int).tolist() for (b, s), cell in sweep.groupby(["batch", "context"])
    }
    stacked = {key: np.stack([o[key] for o in overheads]) for key in point}
    status = {name: fit.status[name] for name in fit.terms}
    return PooledFit(dict(fit.terms), intervals, sizes, point, stacked, draws, status)


def add_pooled_evidence(
    selection: Selection,
    sweep: pd.DataFrame,
    samples: dict,
    pooled: PooledFit,
    proposal: Tree,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = CONFIDENCE,
    threshold: float = 1.0,
) -> Selection:
    """`selection` with the pooled fit's pick and its consistency in every measured cell, and
    the undecided cells (and those decided on fixed rounds, reason "best bound") whose
    measurement is consistent with the fit decided from it
    (`decided_by: "pooled fit"`); a cell the fit does not describe keeps its own answer
    (`fit_consistent: false`)."""
    table = sweep.sort_values(["batch", "context", "nodes"], ignore_index=True)
    rng = np.random.default_rng(1)
    rule = {"tolerance": tolerance, "confidence": confidence, "threshold": threshold}
    decided, consistent_cells, cells = [], 0, []
    for cell in selection.cells:
        key = cell.key
        rows = table[(table["batch"] == key[0]) & (table["context"] == key[1])]
        got = samples.get(key)
        sizes = rows["nodes"].astype(int).tolist()
        if got is None or list(got[0]) != sizes or key not in pooled.overhead_draws or cell.measured_by == "end-to-end":
            cells.append(cell)
            continue
        measured = cell_draws(rows, got[1])
        by_fit, consistent = _fit_decision(
            rows, measured, pooled.overhead_point[key], pooled.overhead_draws[key], rng, **rule
        )
        consistent_cells += consistent
        cell = replace(cell, fit_nodes=sizes[by_fit.index], fit_consistent=consistent)
        # the fit settles what the cell's own rounds could not, before the fixed-round rule guesses
        if cell.reason in ("undecided", "best bound") and consistent and by_fit.settled:
            cell = _take_fit_decision(cell, rows, by_fit, measured, proposal, confidence)
            decided.append(key)
        cells.append(cell)
    undecided = selection.rule.undecided
    if undecided is not None:
        undecided = tuple(u for u in undecided if u not in decided)
    evidence = PooledEvidence(
        terms={k: float(v) for k, v in pooled.terms.items()},
        term_intervals={k: tuple(v) for k, v in pooled.term_intervals.items()},
        term_status=dict(pooled.status),
        draws=pooled.draws,
        consistent_cells=int(consistent_cells),
        decided_cells=len(decided),
    )
    return replace(selection, cells=tuple(cells), rule=replace(selection.rule, undecided=undecided), pooled=evidence)


def _fit_decision(
    rows: pd.DataFrame,
    measured: SpeedupDraws,
    overhead_point: np.ndarray,
    overhead_draws: np.ndarray,
    rng: np.random.Generator,
    *,
    tolerance: float,
    confidence: float,
    threshold: float,
):
    """(the cell's decision on the fit's speedups, whether the cell's measured overheads are
    consistent with the fit's): `rows` the cell's sweep rows by nodes, `measured` its own
    bootstrap, `overhead_point`/`overhead_draws` the fit's T(n)/T(0) and their refits."""
    fit_overhead = np.maximum(overhead_draws, 1.0)
    tau = rows["tau"].to_numpy(dtype=float)
    se = np.nan_to_num(rows["tau_se"].to_numpy(dtype=float)) if "tau_se" in rows else np.zeros_like(tau)
    # one tau draw per refit, shared by every size, as in the cells' own bootstrap
    tau_draws = np.maximum(tau[None, :] + se[None, :] * rng.standard_normal((fit_overhead.shape[0], 1)), 1.0)
    fit_speed = tau_draws / fit_overhead
    lo, hi = interval(fit_speed, confidence)
    point = tau / np.maximum(overhead_point, 1.0)
    reliable = ~(np.nan_to_num(rows["unreliable"].to_numpy(dtype=float)) > 0)
    by_fit = decide_cell(
        point, lo, hi, reliable, draws=fit_speed, threshold=threshold, tolerance=tolerance, confidence=confidence
    )
    consistent = bool(
        consistent_with_fit(
            measured.overhead[:, 1:], fit_overhead[:, 1:], tolerance=tolerance, confidence=confidence
        ).all()
    )
    return by_fit, consistent


def _take_fit_decision(
    cell: SelectionCell, rows: pd.DataFrame, by_fit, measured: SpeedupDraws, proposal: Tree, confidence: float
) -> SelectionCell:
    """The undecided selection `cell` with the size the fit settles on, and the cell's own
    measured numbers and interval for it (`decided_by: "pooled fit"`)."""
    i = by_fit.index
    n = int(rows["nodes"].iloc[i])
    own_lo, own_hi = interval(measured.speedup, shipped_confidence(confidence, len(rows) - 1))
    row = rows.iloc[i]

    def figure(value) -> float:
        return round(float(value), 6) if n else 1.0

    taken = replace(
        cell,
        nodes=n,
        medusa_choices=tuple(tuple(p) for p in proposal.prefix(n).to_choices()) if n else (),
        speedup=figure(row["speedup"]),
        measured_speedup=figure(row["speedup"]),
        tau=figure(row["tau"]),
        overhead=figure(row["overhead"]),
        speedup_lo=figure(own_lo[i]),
        speedup_hi=figure(own_hi[i]),
        reason=by_fit.reason,
        decided_by="pooled fit",
        rounds_needed=None,
        bound=None,
        open_nodes=(),
    )
    if cell.predicted_speedup is not None:
        predicted = round(float(row["predicted_speedup"]), 6) if n else 1.0
        missing = None if math.isfinite(predicted) else missing_prediction_reason(row.get("predicted_overhead", np.nan))
        taken = replace(taken, predicted_speedup=predicted, predicted_speedup_missing=missing)
    return taken


def pooled_from_sweep(lm, proposal: Tree, hardware: HardwareProfile, sweep: pd.DataFrame, samples: dict) -> PooledFit:
    """`fit_pooled` for the loaded model and its draft heads (the heads a tree of n nodes runs:
    those its depth reaches, as `treeopt.app.sweep.fit_from_sweep` counts them)."""
    shape = shape_of(lm.name, dtype=torch_dtype_name(lm.dtype))
    heads = heads_shape_of_drafter(lm.heads)
    depth = [proposal.prefix(n).depth for n in range(proposal.size + 1)]
    return fit_pooled(shape, heads, hardware, sweep, samples, depth)


@dataclass(frozen=True)
class SweepModel:
    """What a pooled fit of a sweep file needs beside its rows: the model's roofline `shape`,
    its drafter's `heads`, the `hardware` profile whose terms are fitted; or, when the sweep's
    metadata does not name them well enough, `missing` says what to give."""

    shape: ModelShape | None = None
    heads: DraftHeadsShape | None = None
    hardware: HardwareProfile | None = None
    missing: str | None = None


def _sweep_hardware(meta: dict, sweep_path: Path, hardware) -> HardwareProfile | None:
    """`hardware` when given; else the sweep's: a built-in name, the profile file the sweep
    recorded (`hardware_file`, relative to its folder), or the profile file `treeopt run` writes
    beside its sweep (`hardware.json`), each when it carries the name the sweep recorded."""
    if hardware is not None:
        return load_hardware(hardware)
    name = str(meta.get("hardware") or "")
    if name.lower() in builtin_hardware() or name.lower() in hardware_aliases():
        return load_hardware(name)
    recorded = [sweep_path.parent / str(meta["hardware_file"])] if meta.get("hardware_file") else []
    for candidate in recorded + [sweep_path.parent / "hardware.json"]:
        if name and candidate.is_file():
            profile = load_hardware(candidate)
            if profile.name == name:
                return profile
    return None


def _sweep_drafter(meta: dict, model: str, shape: ModelShape) -> DraftHeadsShape | str:
    """The drafter shape the pooled fit charges (as `pooled_from_sweep` charges a loaded one),
    from the calibration's `heads` ("KIND:SPEC" for a drafter other than Medusa heads); a
    string says why there is none."""
    heads_spec = str((meta.get("accuracy") or {}).get("heads") or "")
    kind = heads_spec.split(":", 1)[0] if ":" in heads_spec else "medusa"
    if kind == "draft-model":
        return "a draft model's steps are not the heads' latency model (as in treeopt run)"
    if kind == "medusa":
        return replace(heads_of(model, shape), tokens_per_sequence=1)
    cost = draft_cost_of(model, shape, drafter=kind)
    return DraftHeadsShape(cost.stages, cost.layers, shape.hidden, shape.vocab, tokens_per_sequence=1)


def sweep_model(meta: dict, sweep_path, *, model=None, hardware=None) -> SweepModel:
    """The model, drafter and hardware of a sweep file for its pooled fit: `model` and
    `hardware` when given (errors are the user's), else what its metadata names (what it cannot
    resolve becomes `missing`)."""
    sweep_path = Path(sweep_path)
    spec = model if model is not None else meta.get("model")
    if not spec:
        return SweepModel(missing="the sweep names no model: give --model")
    try:
        shape = shape_of(spec, dtype=meta.get("dtype"))
    except UserError:
        if model is not None:
            raise
        return SweepModel(missing=f"its model {spec!r} is neither built in nor found here: give --model")
    profile = _sweep_hardware(meta, sweep_path, hardware)
    if profile is None and not meta.get("hardware"):
        return SweepModel(missing="the sweep names no hardware profile (measured without --hardware): give --hardware")
    if profile is None:
        return SweepModel(
            missing=f"its hardware {meta['hardware']!r} is neither built in, nor the profile file it recorded, nor "
            "the hardware.json beside it: give --hardware"
        )
    heads = _sweep_drafter(meta, spec, shape)
    if isinstance(heads, str):
        return SweepModel(missing=heads)
    return SweepModel(shape, heads, profile)


def add_sweep_pooled_evidence(
    selection: Selection, sweep: pd.DataFrame, samples: dict, proposal: Tree, found: SweepModel, *, rule: dict
) -> Selection:
    """The pooled evidence of `treeopt run` for a sweep file (`select --sweep`): fit, check and
    decide as `add_pooled_evidence`; `rule` holds tolerance, confidence and threshold. Where
    the fit cannot be made, its `pooled.skipped` says why."""
    if found.missing is not None or not samples:
        return replace(selection, pooled=PooledEvidence(skipped=found.missing or "the sweep has no per-round samples"))
    depth = [proposal.prefix(n).depth for n in range(proposal.size + 1)]
    pooled = fit_pooled(found.shape, found.heads, found.hardware, sweep, samples, depth)
    return add_pooled_evidence(selection, sweep, samples, pooled, proposal, **rule)
