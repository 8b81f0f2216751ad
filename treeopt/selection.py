"""Pick the best tree per (batch, context) from a measured sweep, or from predictions alone.

Measured speedup of tree size n = tau(n) * T(0) / T(n): expected tokens per step over the
measured step-latency ratio, or, in the (batch, context) cells where the sweep also ran the
real decoder end to end (`treeopt sweep --end-to-end`), its measured tokens per second over
plain decoding's. The predicted speedup is the same formula with the roofline's T. By measured
speedup, a cell gets the smallest tree statistically indistinguishable from the best, and "no
speculation" (0 nodes, medusa_choices []) unless the best's lower bound beats the threshold
(docs/statistics.md#choosing-a-tree-with-intervals); by prediction, the argmax (the smallest
size on ties).

The sweep file and its reader: `treeopt.sweep_file`; the `Selection` this module builds and
its JSON: `treeopt.selection_types`; its text: `treeopt.selection_text`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.errors import UserError
from treeopt.selection_notes import mark_clamp, missing_prediction_reason, raw_overheads
from treeopt.selection_text import (
    NOISY_HALF_WIDTH,
    best_bound_text,
    format_selection,
    format_speedup,
    noise_summary,
    rounds_needed_text,
)
from treeopt.selection_types import SELECTION_FORMAT, Provenance, Selection, SelectionCell, SelectionRule
from treeopt.stats import CONFIDENCE, DEFAULT_TOLERANCE, MONOTONE_SLACK, decide_cell, interval, shipped_confidence
from treeopt.sweep_file import (
    REQUIRED,
    SWEEP_COLUMNS,
    add_intervals,
    cell_draws,
    first_line,
    proposal_from_meta,
    read_round_samples,
    read_sweep,
    sweep_confidence,
    sweep_meta_path,
    sweep_samples_path,
    write_round_samples,
)
from treeopt.tau import proposal_sequence
from treeopt.tree import Tree

# the sweep file's and the selection text's names are re-exported: callers import them from here
__all__ = [
    "SWEEP_COLUMNS",
    "REQUIRED",
    "SELECTION_FORMAT",
    "Selection",
    "read_sweep",
    "select",
    "measured_speedup",
    "prediction_regret",
    "proposal_from_meta",
    "sweep_confidence",
    "check_tolerance",
    "sweep_meta_path",
    "best_per_cell",
    "selection_from_grid",
    "format_selection",
    "format_speedup",
    "selection_from_grid_file",
    "read_grid_with_proposal",
    "measured_decisions",
    "noise_summary",
    "rounds_needed_text",
    "best_bound_text",
    "sweep_samples_path",
    "read_round_samples",
    "write_round_samples",
    "add_intervals",
    "cell_draws",
]

#: the columns a predicted grid (`treeopt roofline speedup -o`) must hold to be selected from
GRID_REQUIRED = ("batch", "context", "nodes", "tau", "overhead", "speedup")
#: the grid columns left empty where a configuration is ruled out (docs/formats.md#grid-csv)
GRID_OPTIONAL_EMPTY = ("overhead", "speedup")
SELECTION_SOURCE = {"measured": "measured sweep", "predicted": "roofline prediction (the sweep's predicted columns)"}


def _has(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and bool(df[col].notna().any())


def measured_speedup(sweep: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(speedup, by) per row: the end-to-end speedup in the (batch, context) cells where every
    row has one, else tau / measured step overhead; `by` is "end-to-end" or "step latency".
    Plain decoding (nodes 0) is 1.0 by definition."""
    speed = sweep["speedup"].astype(float)
    by = pd.Series("step latency", index=sweep.index, dtype=object)
    if _has(sweep, "e2e_speedup"):
        full = sweep["e2e_speedup"].notna().groupby([sweep["batch"], sweep["context"]]).transform("all")
        speed = speed.where(~full, sweep["e2e_speedup"].astype(float))
        by = by.where(~full, "end-to-end")
    speed = speed.where(sweep["nodes"] != 0, 1.0)
    return speed, by


def _check_columns(sweep: pd.DataFrame, source: str) -> None:
    if not isinstance(sweep, pd.DataFrame):
        raise UserError(f"{source}: expected a sweep table")
    missing = [c for c in REQUIRED if c not in sweep.columns]
    if missing:
        raise UserError(f"{source}: missing column '{missing[0]}' (not a treeopt sweep)")
    if sweep.empty:
        raise UserError(f"{source}: no rows")


def measured_decisions(
    df: pd.DataFrame,
    measured: pd.Series,
    measured_by: pd.Series,
    *,
    threshold: float = 1.0,
    samples: dict | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = CONFIDENCE,
    fixed_rounds: bool = False,
) -> pd.DataFrame:
    """Per (batch, context) the decision on measured speedups (`treeopt.stats.decide_cell`,
    docs/statistics.md#choosing-a-tree-with-intervals): columns batch, context, nodes,
    reason, best_nodes, speedup_lo, speedup_hi, rounds, settled, rounds_needed,
    unreliable_nodes, disagree_nodes.

    Where the cell's per-round `samples` are given, the intervals and the paired ratio bounds
    are bootstrapped from them at `confidence`; else the sweep's speedup_lo/hi are used and
    ratios bounded by lo(i) / hi(j) (end-to-end cells: points). A speedup above tau beyond
    tau's error, or a size the sweep flagged `unreliable`, is never chosen. `disagree_nodes`:
    sizes whose end-to-end speedup lies outside their step-latency interval."""
    rows = []
    samples = samples or {}
    for (b, s), idx in sorted(df.groupby(["batch", "context"]).groups.items()):
        cell = df.loc[idx].sort_values("nodes")
        speed = measured.loc[cell.index].to_numpy(dtype=float)
        e2e = (measured_by.loc[cell.index] == "end-to-end").to_numpy()
        rule = {"threshold": threshold, "tolerance": tolerance, "confidence": confidence, "fixed_rounds": fixed_rounds}
        decided = _decide_measured_cell(cell, speed, e2e, samples.get((int(b), int(s))), **rule)
        rows.append({"batch": int(b), "context": int(s), **decided})
    return pd.DataFrame(rows)


def _reliable_sizes(cell: pd.DataFrame, nodes: np.ndarray, speed: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """(sizes,) bool: neither flagged `unreliable` by the sweep nor measured above tau beyond
    tau's error."""
    tau = _col(cell, "tau")
    tau_hi = tau + 1.96 * np.nan_to_num(_col(cell, "tau_se"))
    # why: a step emits at most tau tokens on average, so a speedup above tau means the
    # plain step was timed slow (docs/statistics.md#sanity-checks-of-a-measurement)
    above_tau = np.where(np.isfinite(lo), lo, speed) > tau_hi * (1 + MONOTONE_SLACK)
    flagged = np.nan_to_num(_col(cell, "unreliable")) > 0
    return ~(flagged | (above_tau & (nodes > 0)))


def _decide_measured_cell(
    cell: pd.DataFrame,
    speed: np.ndarray,
    e2e: np.ndarray,
    got,
    *,
    threshold: float,
    tolerance: float,
    confidence: float,
    fixed_rounds: bool,
) -> dict:
    """One row of `measured_decisions` but batch and context: `cell` its sweep rows sorted by
    nodes, `speed` their measured speedups, `e2e` where the end-to-end speedup decides, `got`
    the cell's per-round samples (or None)."""
    nodes = cell["nodes"].to_numpy(dtype=np.int64)
    step_lo = _col(cell, "speedup_lo")
    step_hi = _col(cell, "speedup_hi")
    lo = np.where(e2e, speed, step_lo)
    hi = np.where(e2e, speed, step_hi)
    reliable = _reliable_sizes(cell, nodes, speed, lo)
    paired = got is not None and not e2e.any() and list(got[0]) == nodes.tolist()
    paired_draws = cell_draws(cell, got[1]) if paired else None
    draws = paired_draws.speedup if paired else None
    if draws is not None:
        lo, hi = interval(draws, shipped_confidence(confidence, len(nodes) - 1))
    rounds = int(np.nanmax(_col(cell, "samples"), initial=0))
    decision = decide_cell(
        speed,
        lo,
        hi,
        reliable,
        draws=draws,
        threshold=threshold,
        tolerance=tolerance,
        confidence=confidence,
        rounds=rounds,
        fixed_rounds=fixed_rounds,
        overhead=paired_draws.overhead if paired else None,
    )
    step_speed = cell["speedup"].to_numpy(dtype=float)
    disagree = e2e & np.isfinite(step_lo) & ((speed < step_lo) | (speed > step_hi)) & (nodes > 0)
    k = decision.index
    raw = raw_overheads(cell, got[1] if paired else None)
    return {
        "overhead_measured": raw[k] if k else 1.0,
        "plain_slower_nodes": nodes[(nodes > 0) & (raw < 1.0 - MONOTONE_SLACK) & ~reliable].tolist(),
        "nodes": int(nodes[k]),
        "reason": decision.reason,
        "best_nodes": int(nodes[decision.best]),
        "speedup_lo": lo[k] if k else 1.0,
        "speedup_hi": hi[k] if k else 1.0,
        "step_speedup": step_speed[k] if k else 1.0,
        "rounds": rounds,
        "sizes": nodes.tolist(),
        "settled": decision.settled,
        "rounds_needed": decision.rounds_needed,
        "unreliable_nodes": nodes[~reliable].tolist(),
        "disagree_nodes": nodes[disagree].tolist(),
        "bound": decision.bound,
        "open_nodes": nodes[list(decision.open_sizes)].tolist(),
    }


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy(dtype=float) if name in df.columns else np.full(len(df), np.nan)


def select(
    sweep: pd.DataFrame,
    proposal: Tree,
    *,
    by: str = "measured",
    hardware: str = "",
    model: str = "",
    threshold: float = 1.0,
    source: str | None = None,
    samples: dict | None = None,
    threads: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = CONFIDENCE,
    fixed_rounds: bool = False,
) -> Selection:
    """The selection from a sweep table.

    by="measured": the measured speedup (end to end where the sweep measured it, see
    `measured_speedup`), decided with its interval (`measured_decisions`): per (batch,
    context) the smallest tree within `tolerance` (a fraction of the speedup) of the best
    point estimate at `confidence`, shipped only where its lower bound beats `threshold`, and
    "undecided" where another tree may still be better by more than `tolerance`; `samples` are the sweep's per-round
    step times (`read_round_samples`) for the paired ratios. by="predicted": the roofline
    prediction stored in the sweep (for hardware you don't have), the argmax (the smallest size
    on ties). Every cell also carries `measured_speedup` and (where the sweep has predictions)
    `predicted_speedup` of the chosen size, side by side, and `measured_by`; measured
    selections the interval, rounds and reason. `fixed_rounds`: the sweep is finished, so a
    cell more rounds could settle is decided on the rounds there are where a tree beats the
    threshold at its lower bound (reason "best bound", `treeopt.stats.decide_cell`).
    """
    source = source or sweep.attrs.get("source", "sweep")
    threshold, tolerance = _check_rule(by, threshold, tolerance)
    _check_columns(sweep, source)
    df = sweep.reset_index(drop=True).copy()
    for col in ("tau", "overhead"):
        if col not in df.columns:
            df[col] = np.nan
    if int(df["nodes"].max()) > proposal.size:
        raise UserError(f"{source}: has rows for {int(df['nodes'].max())} nodes, the proposal tree has {proposal.size}")
    measured, measured_by = measured_speedup(df)
    has_pred = _has(df, "predicted_speedup")
    predicted = df["predicted_speedup"].astype(float).where(df["nodes"] != 0, 1.0) if has_pred else None
    grid = df[["batch", "context", "nodes", "tau", "overhead"]].copy()
    if by == "predicted":
        grid = _predicted_grid(df, grid, predicted, source)
    else:
        rule = {"threshold": threshold, "tolerance": tolerance, "confidence": confidence}
        decisions = measured_decisions(df, measured, measured_by, samples=samples, fixed_rounds=fixed_rounds, **rule)
        grid = _decided_grid(grid, measured, measured_by, decisions)
    chosen = selection_from_grid(grid, proposal, hardware, model, threshold=threshold)
    uses_e2e = bool((measured_by == "end-to-end").any())
    provenance = replace(
        chosen.provenance,
        source=SELECTION_SOURCE[by] + (" (end to end where measured)" if by == "measured" and uses_e2e else ""),
        selected_by=by,
        threads=int(threads) if threads is not None else None,
    )
    cells = _side_by_side(chosen.cells, df, measured, measured_by, predicted)
    rule = SelectionRule(threshold=threshold)
    if by == "measured":
        cells, rule = _with_decisions(cells, decisions, threshold, tolerance, confidence)
    return replace(chosen, provenance=provenance, cells=cells, rule=rule)


def _predicted_grid(df: pd.DataFrame, grid: pd.DataFrame, predicted: pd.Series | None, source: str) -> pd.DataFrame:
    """The grid of the sweep's predicted speedups (and predicted overheads where it has them)."""
    if predicted is None:
        raise UserError(f"{source}: has no predicted speedups to select by (sweep with --hardware)")
    grid = grid.copy()
    grid["speedup"] = predicted
    if _has(df, "predicted_overhead"):
        grid["overhead"] = df["predicted_overhead"].astype(float).where(df["nodes"] != 0, 1.0)
    return grid


def _check_rule(by: str, threshold, tolerance) -> tuple[float, float]:
    """(threshold, tolerance) as numbers; UserError naming the option that is not one."""
    if by not in ("measured", "predicted"):
        raise UserError(f"--by: must be 'measured' or 'predicted', got '{by}'")
    try:
        threshold = float(threshold)
    except (TypeError, ValueError):
        raise UserError(f"--threshold: expected a number, got {threshold!r}") from None
    if not math.isfinite(threshold):
        raise UserError(f"--threshold: must be finite, got {threshold}")
    return threshold, check_tolerance(tolerance)


def _decided_grid(
    grid: pd.DataFrame, measured: pd.Series, measured_by: pd.Series, decisions: pd.DataFrame
) -> pd.DataFrame:
    """The grid of the measured speedups cut to the decided rows and plain decoding, so that
    the argmax of `selection_from_grid` returns the decision."""
    grid = grid.copy()
    grid["speedup"] = measured
    # Where the end-to-end speedup decides, the cell's overhead is the effective one
    # (tau / speedup), so that speedup = tau / overhead holds in every cell.
    grid["overhead"] = grid["overhead"].where(measured_by == "step latency", grid["tau"] / measured)
    chosen = grid.merge(decisions[["batch", "context", "nodes"]], on=["batch", "context", "nodes"])
    plain = grid[grid["nodes"] == 0]
    grid = pd.concat([chosen, plain]).drop_duplicates(["batch", "context", "nodes"])
    grid.loc[grid["nodes"] == 0, "speedup"] = 1.0
    return grid


def _side_by_side(
    cells: tuple[SelectionCell, ...],
    df: pd.DataFrame,
    measured: pd.Series,
    measured_by: pd.Series,
    predicted: pd.Series | None,
) -> tuple[SelectionCell, ...]:
    """Every cell with its measured speedup, what measured it and (with predictions) its
    predicted speedup, of the chosen size."""
    key = pd.MultiIndex.from_frame(df[["batch", "context", "nodes"]])
    meas = pd.Series(measured.to_numpy(), index=key)
    meas_by = pd.Series(measured_by.to_numpy(), index=key)
    pred = pd.Series(predicted.to_numpy(), index=key) if predicted is not None else None
    pred_overhead = pd.Series(_col(df, "predicted_overhead"), index=key)
    out = []
    for cell in cells:
        k = (cell.batch, cell.context, cell.nodes)
        cell = replace(
            cell,
            measured_speedup=_round(meas.get(k, np.nan)) if cell.nodes else 1.0,
            measured_by=str(meas_by.get(k, "step latency")),
        )
        if pred is not None:
            figure = _round(pred.get(k, np.nan)) if cell.nodes else 1.0
            missing = None if math.isfinite(figure) else missing_prediction_reason(pred_overhead.get(k, np.nan))
            cell = replace(cell, predicted_speedup=figure, predicted_speedup_missing=missing)
        out.append(cell)
    return tuple(out)


def check_tolerance(tolerance) -> float:
    """The equivalence margin as a fraction in [0, 0.5) (UserError naming --tolerance)."""
    try:
        value = float(tolerance)
    except (TypeError, ValueError):
        raise UserError(f"--tolerance: expected a fraction such as 0.05, got {tolerance!r}") from None
    if not 0.0 <= value < 0.5:
        raise UserError(f"--tolerance: must be a fraction in [0, 0.5), such as 0.05 (5%), got {tolerance}")
    return value


def _with_decisions(
    cells: tuple[SelectionCell, ...], decisions: pd.DataFrame, threshold: float, tolerance: float, confidence: float
) -> tuple[tuple[SelectionCell, ...], SelectionRule]:
    """Each cell with its interval, rounds and reason, and the rule that says which cells are
    undecided or too noisy to trust."""
    by_key = {(r["batch"], r["context"]): r for r in decisions.to_dict("records")}
    undecided, noisy, out = [], [], []
    for cell in cells:
        d = by_key[cell.key]
        need = d["rounds_needed"]
        cell = replace(
            cell,
            speedup_lo=_round(d["speedup_lo"]),
            speedup_hi=_round(d["speedup_hi"]),
            rounds=d["rounds"],
            reason=d["reason"],
            rounds_needed=None if d["settled"] else (float(int(need)) if math.isfinite(need) else math.inf),
            best_nodes=d["best_nodes"],
            unreliable_nodes=tuple(d["unreliable_nodes"]),
            plain_slower_nodes=tuple(d["plain_slower_nodes"]),
            step_and_end_to_end_disagree=tuple(d["disagree_nodes"]),
            bound=_round(d["bound"]) if math.isfinite(d["bound"]) else None,
            open_nodes=tuple(d["open_nodes"]),
        )
        cell = mark_clamp(cell, d["overhead_measured"])
        out.append(cell)
        if d["reason"] in ("undecided", "unreliable"):
            undecided.append(cell.key)
        elif (
            cell.nodes
            and np.isfinite(d["speedup_hi"])
            and (d["speedup_hi"] - d["speedup_lo"]) / 2 > NOISY_HALF_WIDTH * cell.speedup
        ):
            noisy.append(cell.key)
    sizes = max((len(d["sizes"]) for d in decisions.to_dict("records")), default=2)
    rule = SelectionRule(
        threshold=threshold,
        confidence=confidence,
        interval_confidence=shipped_confidence(confidence, sizes - 1),
        undecided=tuple(undecided),
        noisy=tuple(noisy),
        tolerance=tolerance,
    )
    return tuple(out), rule


def best_per_cell(grid: pd.DataFrame, *, threshold: float = 1.0) -> pd.DataFrame:
    """Per (batch, context): the tree size of largest speedup (the smallest on ties), or 0 when
    no tree beats `threshold`. Columns batch, context, nodes, tau, overhead, speedup,
    fits_memory (False: not even plain decoding fits; nodes 0, speedup NaN)."""
    missing = [c for c in ("batch", "context", "nodes", "speedup") if c not in grid.columns]
    if missing:
        raise UserError(f"grid: missing column '{missing[0]}'")
    g = grid.copy()
    if "tau" not in g.columns:
        g["tau"] = np.nan
    if "overhead" not in g.columns:
        g["overhead"] = np.nan
    key = g["speedup"].fillna(-np.inf).to_numpy()
    g = g.assign(_key=key).sort_values(
        ["batch", "context", "_key", "nodes"], ascending=[True, True, False, True], kind="mergesort"
    )
    best = g.groupby(["batch", "context"], sort=True).head(1).copy()
    plain = grid[grid["nodes"] == 0].drop_duplicates(["batch", "context"]).set_index(["batch", "context"])
    out = []
    for row in best.itertuples(index=False):
        speed = row.speedup
        fits = bool(np.isfinite(speed))
        if not fits or speed <= threshold or row.nodes == 0:
            # no plain-decoding row (a grid of trees only): plain decoding is taken to fit
            p = plain.loc[(row.batch, row.context)] if (row.batch, row.context) in plain.index else None
            plain_ok = p is None or bool(np.isfinite(p["speedup"]))
            out.append(
                {
                    "batch": int(row.batch),
                    "context": int(row.context),
                    "nodes": 0,
                    "tau": 1.0,
                    "overhead": 1.0 if plain_ok else np.nan,
                    "speedup": 1.0 if plain_ok else np.nan,
                    "fits_memory": bool(plain_ok),
                }
            )
        else:
            out.append(
                {
                    "batch": int(row.batch),
                    "context": int(row.context),
                    "nodes": int(row.nodes),
                    "tau": float(row.tau),
                    "overhead": float(row.overhead),
                    "speedup": float(speed),
                    "fits_memory": True,
                }
            )
    return pd.DataFrame(out, columns=["batch", "context", "nodes", "tau", "overhead", "speedup", "fits_memory"])


def selection_from_grid(
    grid_df: pd.DataFrame,
    proposal_tree,
    hardware_name: str,
    model_name: str,
    *,
    threshold: float = 1.0,
    provenance: dict | None = None,
) -> Selection:
    """The selection of a grid: per (batch, context) the best tree size and its
    medusa_choices (proposal_tree.prefix(nodes)); nodes 0 and [] for no speculation. Cells
    where not even plain decoding fits in memory are listed under `out_of_memory` instead.
    `provenance`: further fields of `Provenance` (heads, attention, verification)."""
    best = best_per_cell(grid_df, threshold=threshold)
    size = getattr(proposal_tree, "size", None)
    if size is None:
        raise UserError("selection: proposal_tree must be a treeopt Tree")
    cells, oom = [], []
    for row in best.itertuples(index=False):
        if not row.fits_memory:
            oom.append((int(row.batch), int(row.context)))
            continue
        nodes = int(row.nodes)
        if nodes > size:
            raise UserError(f"selection: the grid picks {nodes} nodes but the proposal tree has {size}")
        choices = proposal_tree.prefix(nodes).to_choices() if nodes else []
        cells.append(
            SelectionCell(
                batch=int(row.batch),
                context=int(row.context),
                nodes=nodes,
                speedup=round(float(row.speedup), 6),
                tau=round(float(row.tau), 6),
                overhead=round(float(row.overhead), 6),
                medusa_choices=tuple(tuple(p) for p in choices),
            )
        )
    origin = Provenance(hardware=hardware_name, model=model_name, source="roofline prediction", **(provenance or {}))
    return Selection(origin, tuple(cells), tuple(oom))


def selection_from_grid_file(grid_file, accuracy, *, csv_model: str | None = None, threshold: float = 1.0) -> Selection:
    """The selection from a predicted grid CSV (`treeopt roofline speedup -o`) and the accuracy
    table whose greedy proposal sequence it was computed for."""
    grid, proposal = read_grid_with_proposal(grid_file, accuracy, csv_model=csv_model)
    return selection_from_grid(grid, proposal, "", "", threshold=threshold)


def read_grid_with_proposal(grid_file, accuracy, *, csv_model: str | None = None) -> tuple[pd.DataFrame, Tree]:
    """A predicted grid CSV and the greedy proposal sequence of the accuracy table it used
    (a file, or an `AccuracyTable` already loaded)."""
    if accuracy is None:
        raise UserError("--grid: needs --accuracy (the table whose proposal sequence the grid used)")
    try:
        grid = pd.read_csv(grid_file)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UserError(f"{grid_file}: cannot read ({first_line(err)})") from None
    for col in GRID_REQUIRED:
        if col not in grid.columns:
            raise UserError(f"{grid_file}: missing column '{col}' (not a treeopt grid CSV)")
    if grid.empty:
        raise UserError(f"{grid_file}: no rows (not a finished treeopt grid CSV)")
    for col in GRID_REQUIRED:
        values = pd.to_numeric(grid[col], errors="coerce")
        v = values.to_numpy(dtype=float)
        # an empty overhead or speedup is a configuration the grid ruled out (it does not fit in
        # memory, or the engine does not draft that tree); text or an infinity is damage
        bad = np.isinf(v) | (values.isna() & grid[col].notna()).to_numpy()
        if col not in GRID_OPTIONAL_EMPTY:
            bad |= np.isnan(v)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise UserError(f"{grid_file}: row {row + 2}: column '{col}' is not a number ({grid[col].iloc[row]!r})")
        grid[col] = values
    table = accuracy if isinstance(accuracy, AccuracyTable) else load_accuracy(accuracy, model=csv_model)
    return grid, proposal_sequence(table, int(grid["nodes"].max()), method="greedy")


def _round(x) -> float:
    """A figure as the selection stores it: 6 decimals (NaN stays NaN, written as null)."""
    x = float(x)
    return round(x, 6) if math.isfinite(x) else math.nan


def _pick(nodes: np.ndarray, speed: np.ndarray, threshold: float = 1.0) -> int:
    """The size of largest speedup (nodes sorted ascending: first = smallest on ties), 0 unless
    it beats threshold. NaN speedups never win."""
    key = np.where(np.isfinite(speed), speed, -np.inf)
    i = int(np.argmax(key))
    return int(nodes[i]) if key[i] > threshold else 0


def prediction_regret(sweep: pd.DataFrame, *, threshold: float = 1.0, chosen: dict | None = None) -> pd.DataFrame:
    """Per (batch, context): the size the prediction picks, the selected size, the measured
    speedup of each (1 for no speculation) and their ratio `fraction_of_selected` (1.0 = the
    prediction picked the selected tree, or one measured as fast). `chosen` {(batch,
    context): nodes} is the selection's answer per cell (`select`), so that a report compares
    the prediction with the tree it ships; without it, the size of largest measured speedup."""
    source = sweep.attrs.get("source", "sweep")
    _check_columns(sweep, source)
    if not _has(sweep, "predicted_speedup"):
        raise UserError(f"{source}: has no predicted speedups (sweep with --hardware)")
    df = sweep.sort_values(["batch", "context", "nodes"], ignore_index=True)
    measured, _ = measured_speedup(df)
    predicted = df["predicted_speedup"].astype(float).where(df["nodes"] != 0, 1.0)
    rows = []
    for (b, s), idx in sorted(df.groupby(["batch", "context"]).groups.items()):
        nodes = df.loc[idx, "nodes"].to_numpy()
        meas = measured.loc[idx].to_numpy(dtype=float)
        n_pred = _pick(nodes, predicted.loc[idx].to_numpy(dtype=float), threshold)
        n_sel = (chosen or {}).get((int(b), int(s)))
        if n_sel is None:
            n_sel = _pick(nodes, meas, threshold)
        got = 1.0 if n_pred == 0 else float(meas[nodes == n_pred][0])
        sel = 1.0 if n_sel == 0 else float(meas[nodes == n_sel][0])
        rows.append(
            {
                "batch": int(b),
                "context": int(s),
                "predicted_nodes": n_pred,
                "selected_nodes": int(n_sel),
                "measured_speedup_of_predicted": got,
                "measured_speedup_of_selected": sel,
                "fraction_of_selected": got / sel,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "batch",
            "context",
            "predicted_nodes",
            "selected_nodes",
            "measured_speedup_of_predicted",
            "measured_speedup_of_selected",
            "fraction_of_selected",
        ],
    )
