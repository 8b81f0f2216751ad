"""Pick the best tree per (batch, context) from a measured sweep, or from predictions alone.

Measured speedup of tree size n = tau(n) * T(0) / T(n): expected tokens per step over the
measured step-latency ratio, or, in the (batch, context) cells where the sweep also ran the
real decoder end to end (`treeopt sweep --end-to-end`), its measured tokens per second over
plain decoding's. The predicted speedup is the same formula with the roofline's T. By measured
speedup, a cell gets the smallest tree statistically indistinguishable from the best, and "no
speculation" (0 nodes, medusa_choices []) unless the best's lower bound beats the threshold
(docs/statistics.md#choosing-a-tree-with-intervals); by prediction, the argmax (the smallest
size on ties).

The sweep file is a CSV with the columns SWEEP_COLUMNS (see calibration/sweep.py for their
meaning) and a `NAME.meta.json` beside it that holds the proposal tree: row `nodes = n`
measures `proposal.prefix(n)`.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, read_json_input
from treeopt.selection_notes import (
    mark_clamp,
    missing_prediction_reason,
    percent,
    plain_slow_only,
    raw_overheads,
    unreliable_lines,
)
from treeopt.stats import (
    CONFIDENCE,
    DEFAULT_TOLERANCE,
    MONOTONE_SLACK,
    SpeedupDraws,
    bootstrap_speedups,
    decide_cell,
    interval,
    shipped_confidence,
)
from treeopt.tau import proposal_sequence
from treeopt.tree import Tree, make_tree

__all__ = [
    "SWEEP_COLUMNS",
    "REQUIRED",
    "SELECTION_FORMAT",
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
    "sweep_samples_path",
    "read_round_samples",
    "write_round_samples",
    "add_intervals",
    "cell_draws",
]

# Columns of a sweep CSV (calibration/sweep.py writes them; all numeric):
#   batch, context, nodes          the configuration (nodes 0 = plain decoding)
#   tau_independent, tau_joint,    expected tokens per step of proposal.prefix(nodes) under
#   tau_walk                       independent heads, joint statistics, the walked rank vectors
#   tau                            the one decisions use (`TauCurve.best`): tau_walk where the
#                                  calibration kept rank vectors, else tau_joint, else
#                                  tau_independent (docs/statistics.md#which-tau-is-used-when)
#   step_time_s (+ p10, p90)       measured seconds of one decoding step (median of rounds)
#   tau_se                         standard error of tau from the calibration
#   samples, remeasured            timed rounds kept; 1 when the group was measured again
#                                  after a failed sanity check
#   overhead (+ _lo, _hi)          median over rounds of T(n) / T(0) (same-round ratio), with
#                                  its bootstrap interval (treeopt.stats)
#   speedup (+ _lo, _hi)           tau / overhead (measured), with its interval
#   unreliable                     1: failed the sanity checks twice, never selected
#   predicted_*                    the roofline's step time, overhead and speedup
#   e2e_*                          real decoder on prompts: tokens/s, tokens per step, speedup
SWEEP_COLUMNS = [
    "batch",
    "context",
    "nodes",
    "tau",
    "tau_independent",
    "tau_joint",
    "tau_walk",
    "tau_se",
    "step_time_s",
    "step_time_p10_s",
    "step_time_p90_s",
    "samples",
    "remeasured",
    "overhead",
    "overhead_lo",
    "overhead_hi",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "unreliable",
    "predicted_step_time_s",
    "predicted_overhead",
    "predicted_speedup",
    "e2e_tokens_per_s",
    "e2e_tokens_per_step",
    "e2e_speedup",
]
REQUIRED = ("batch", "context", "nodes", "speedup")
#: the columns a predicted grid (`treeopt roofline speedup -o`) must hold to be selected from
GRID_REQUIRED = ("batch", "context", "nodes", "tau", "overhead", "speedup")
#: the grid columns left empty where a configuration is ruled out (docs/formats.md#grid-csv)
GRID_OPTIONAL_EMPTY = ("overhead", "speedup")
SELECTION_FORMAT = "treeopt.selection/v1"
# A chosen tree whose speedup interval is wider than +-10% is reported as noisy: the
# difference between neighbouring tree sizes is often smaller than that
# (docs/statistics.md#choosing-a-tree-with-intervals).
NOISY_HALF_WIDTH = 0.10
SELECTION_SOURCE = {"measured": "measured sweep", "predicted": "roofline prediction (the sweep's predicted columns)"}


def sweep_meta_path(csv_path) -> Path:
    """`DIR/NAME.csv` -> `DIR/NAME.meta.json`."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + ".meta.json")


def sweep_samples_path(csv_path) -> Path:
    """`DIR/NAME.csv` -> `DIR/NAME.samples.npz` (the per-round step times)."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + ".samples.npz")


def write_round_samples(path, groups: dict) -> None:
    """Write {(batch, context): (sizes, (rounds, len(sizes)) seconds)} in long form: arrays
    batch, context, nodes, round, seconds, one entry per sample
    (docs/formats.md#sweep-csv-and-namemetajson-treeoptsweepv1)."""
    cols = {k: [] for k in ("batch", "context", "nodes", "round", "seconds")}
    for (b, s), (sizes, x) in sorted(groups.items()):
        x = np.asarray(x, dtype=float)
        rounds, n = x.shape
        cols["batch"].append(np.full(x.size, b, np.int64))
        cols["context"].append(np.full(x.size, s, np.int64))
        cols["nodes"].append(np.tile(np.asarray(sizes, np.int64), rounds))
        cols["round"].append(np.repeat(np.arange(rounds, dtype=np.int64), n))
        cols["seconds"].append(x.ravel())
    arrays = {
        k: (np.concatenate(v) if v else np.zeros(0, np.float64 if k == "seconds" else np.int64))
        for k, v in cols.items()
    }
    with atomic_path(Path(path)) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)


def read_round_samples(path) -> dict:
    """The per-round samples of `write_round_samples` ({} when the file is not there);
    UserError naming the file when it is unreadable."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as z:
            b, s, n, r, sec = (z[k] for k in ("batch", "context", "nodes", "round", "seconds"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"{path}: not a sweep samples file ({_first_line(err)})") from None
    out = {}
    for key in sorted(set(zip(b.tolist(), s.tolist(), strict=True))):
        sel = (b == key[0]) & (s == key[1])
        sizes = np.unique(n[sel])
        rounds = int(r[sel].max()) + 1
        x = np.full((rounds, sizes.size), np.nan)
        x[r[sel], np.searchsorted(sizes, n[sel])] = sec[sel]
        if np.isnan(x).any() or sizes[0] != 0:
            raise UserError(f"{path}: batch {key[0]} context {key[1]}: incomplete rounds")
        out[key] = ([int(v) for v in sizes], x)
    return out


def cell_draws(cell: pd.DataFrame, samples: np.ndarray) -> SpeedupDraws:
    """Bootstrap draws of one (batch, context) cell: `cell` its rows sorted by nodes (columns
    tau, tau_se), `samples` its (rounds, sizes) step times."""
    se = cell["tau_se"].to_numpy(dtype=float) if "tau_se" in cell.columns else None
    return bootstrap_speedups(samples, cell["tau"].to_numpy(dtype=float), se)


def add_intervals(table: pd.DataFrame, samples: dict, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """`table` with overhead_lo/hi and speedup_lo/hi at `confidence` from the cells' per-round
    samples (NaN where a cell has none)."""
    t = table.copy()
    for col in ("overhead_lo", "overhead_hi", "speedup_lo", "speedup_hi"):
        t[col] = np.nan
    for (b, s), idx in t.groupby(["batch", "context"]).groups.items():
        got = samples.get((int(b), int(s)))
        cell = t.loc[idx].sort_values("nodes")
        if got is None or list(got[0]) != cell["nodes"].astype(int).tolist():
            continue
        draws = cell_draws(cell, got[1])
        o_lo, o_hi = interval(draws.overhead, confidence)
        s_lo, s_hi = interval(draws.speedup, confidence)
        t.loc[cell.index, ["overhead_lo", "overhead_hi", "speedup_lo", "speedup_hi"]] = np.column_stack(
            [o_lo, o_hi, s_lo, s_hi]
        )
    return t


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_sweep(path) -> tuple[pd.DataFrame, dict]:
    """A sweep CSV and its .meta.json (which holds the proposal tree), validated.

    Returns (table, meta): the table has every column of SWEEP_COLUMNS (missing optional ones
    as NaN), sorted by (batch, context, nodes); `table.attrs["source"]` is the file name. Bad
    input raises UserError naming the file and the problem."""
    path = Path(path)
    df = _numeric_sweep_columns(_read_sweep_csv(path), path)
    _check_sweep_cells(df, path)
    meta_file = sweep_meta_path(path)
    if not meta_file.is_file():
        raise UserError(f"{path}: its metadata {meta_file.name} (with the proposal tree) is missing")
    meta = read_json_input(meta_file, "a sweep metadata file")
    if not isinstance(meta, dict) or "proposal" not in meta:
        raise UserError(f"{meta_file}: no 'proposal' tree (not a treeopt sweep metadata file)")
    proposal = proposal_from_meta(meta, str(meta_file))
    _check_complete(df, meta, path)
    biggest = int(df["nodes"].max())
    if biggest > proposal.size:
        raise UserError(
            f"{path}: has rows for {biggest} nodes but the proposal tree in {meta_file.name} has {proposal.size}"
        )
    df = df.sort_values(["batch", "context", "nodes"], ignore_index=True)
    df.attrs["source"] = str(path)
    return df, meta


def _read_sweep_csv(path: Path) -> pd.DataFrame:
    """The sweep CSV as written: whole, with the REQUIRED columns and at least one row."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        raw = path.read_bytes()
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as err:
        raise UserError(f"{path}: not a sweep CSV ({_first_line(err)})") from None
    if raw and not raw.endswith(b"\n"):
        # treeopt writes every row whole; a last line without its end was cut (a copy or a
        # disk that stopped midway), so its numbers cannot be trusted (docs/formats.md#output-safety)
        raise UserError(
            f"{path}: ends in the middle of a line (a cut or damaged file); measure it again "
            "or resume it with `treeopt sweep --resume`"
        )
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column '{missing[0]}' (not a treeopt sweep CSV)")
    if df.empty:
        raise UserError(f"{path}: no rows (an interrupted sweep? resume it with `treeopt sweep --resume`)")
    return df


def _numeric_sweep_columns(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Every column of SWEEP_COLUMNS as floats (missing ones NaN), batch, context and nodes as
    integers; UserError naming the first row that is not."""
    extra = [c for c in df.columns if c not in SWEEP_COLUMNS]
    df = df.reindex(columns=SWEEP_COLUMNS + extra)
    for col in SWEEP_COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() & df[col].notna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(f"{path}: row {row + 2}: column '{col}' is not a number ({df[col].iloc[row]!r})")
        df[col] = values.astype(float)
    for col, minimum in (("batch", 1), ("context", 0), ("nodes", 0)):
        v = df[col].to_numpy()
        bad = ~np.isfinite(v) | (v != np.round(v)) | (v < minimum)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise UserError(f"{path}: row {row + 2}: '{col}' must be an integer >= {minimum}, got {v[row]:g}")
        df[col] = v.astype(np.int64)
    return df


def _check_sweep_cells(df: pd.DataFrame, path: Path) -> None:
    """UserError when a configuration appears twice or a (batch, context) lacks plain decoding."""
    dup = df.duplicated(["batch", "context", "nodes"])
    if dup.any():
        r = df[dup].iloc[0]
        raise UserError(f"{path}: batch {r['batch']} context {r['context']} nodes {r['nodes']} appears twice")
    plain = set(map(tuple, df.loc[df["nodes"] == 0, ["batch", "context"]].to_numpy().tolist()))
    for b, s in df[["batch", "context"]].drop_duplicates().itertuples(index=False):
        if (b, s) not in plain:
            raise UserError(
                f"{path}: batch {b} context {s} has no row for 0 nodes (plain decoding, the baseline of every speedup)"
            )


def _check_complete(df: pd.DataFrame, meta: dict, path: Path) -> None:
    """UserError when the metadata of `treeopt sweep` lists (batch, context) groups or tree
    sizes the CSV lacks: an interrupted sweep, which `select` must not choose from."""
    batches, contexts = meta.get("batches"), meta.get("contexts")
    sizes = meta.get("measurement", {}).get("sizes") if isinstance(meta.get("measurement"), dict) else None
    if not (isinstance(batches, list) and isinstance(contexts, list)):
        return  # a sweep written by hand or by an older treeopt: nothing to compare with
    have = {(int(b), int(c)): set(g["nodes"].tolist()) for (b, c), g in df.groupby(["batch", "context"])}
    want = [(b, c) for b in batches for c in contexts]
    missing = [g for g in want if g not in have]
    if missing:
        raise UserError(
            f"{path}: incomplete sweep: {len(want) - len(missing)} of {len(want)} (batch, context) "
            f"groups measured, batch {missing[0][0]} context {missing[0][1]} missing; finish it "
            "with `treeopt sweep --resume`"
        )
    if isinstance(sizes, list):
        for (b, c), nodes in have.items():
            lacking = sorted(set(sizes) - nodes)
            if lacking:
                raise UserError(
                    f"{path}: incomplete sweep: batch {b} context {c} has no row for "
                    f"{lacking[0]} nodes; finish it with `treeopt sweep --resume`"
                )


def sweep_confidence(meta: dict) -> float:
    """The confidence a sweep's intervals were measured at (its metadata; 95% for a sweep
    written before sequential looks, or by hand)."""
    got = meta.get("measurement", {}).get("confidence") if isinstance(meta.get("measurement"), dict) else None
    return float(got) if isinstance(got, (int, float)) and 0.5 <= got < 1.0 else CONFIDENCE


def proposal_from_meta(meta: dict, source: str) -> Tree:
    """The proposal tree stored in a sweep's metadata (UserError naming `source` if invalid)."""
    if not isinstance(meta, dict) or "proposal" not in meta:
        raise UserError(f"{source}: no 'proposal' tree")
    return make_tree(meta["proposal"], allow_empty=True, source=f"{source}: proposal")


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
        rule = {"threshold": threshold, "tolerance": tolerance, "confidence": confidence}
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
    draws = cell_draws(cell, got[1]).speedup if paired else None
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
) -> dict:
    """The `treeopt.selection/v1` document from a sweep table.

    by="measured": the measured speedup (end to end where the sweep measured it, see
    `measured_speedup`), decided with its interval (`measured_decisions`): per (batch,
    context) the smallest tree within `tolerance` (a fraction of the speedup) of the best
    point estimate at `confidence`, shipped only where its lower bound beats `threshold`, and
    "undecided" where another tree may still be better by more than `tolerance`; `samples` are the sweep's per-round
    step times (`read_round_samples`) for the paired ratios. by="predicted": the roofline
    prediction stored in the sweep (for hardware you don't have), the argmax (the smallest size
    on ties). Every cell also carries `measured_speedup` and (where the sweep has predictions)
    `predicted_speedup` of the chosen size, side by side, and `measured_by`; measured
    selections the interval, rounds and reason.
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
        decisions = measured_decisions(df, measured, measured_by, samples=samples, **rule)
        grid = _decided_grid(grid, measured, measured_by, decisions)
    doc = selection_from_grid(grid, proposal, hardware, model, threshold=threshold)
    uses_e2e = bool((measured_by == "end-to-end").any())
    doc["source"] = SELECTION_SOURCE[by] + (" (end to end where measured)" if by == "measured" and uses_e2e else "")
    doc["selected_by"] = by
    doc["threshold"] = threshold
    _add_side_by_side(doc, df, measured, measured_by, predicted)
    if by == "measured":
        _add_decisions(doc, decisions, confidence)
        doc["tolerance"] = tolerance
    if threads is not None:
        doc["threads"] = int(threads)
    for cell in doc["cells"]:
        for name in ("speedup", "tau", "overhead", "speedup_lo", "speedup_hi"):  # strict JSON: no NaN
            if isinstance(cell.get(name), float) and not math.isfinite(cell[name]):
                cell[name] = None
    return doc


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


def _add_side_by_side(
    doc: dict, df: pd.DataFrame, measured: pd.Series, measured_by: pd.Series, predicted: pd.Series | None
) -> None:
    """Every cell's measured speedup, what measured it and (with predictions) its predicted
    speedup, of the chosen size."""
    key = pd.MultiIndex.from_frame(df[["batch", "context", "nodes"]])
    meas = pd.Series(measured.to_numpy(), index=key)
    meas_by = pd.Series(measured_by.to_numpy(), index=key)
    pred = pd.Series(predicted.to_numpy(), index=key) if predicted is not None else None
    pred_overhead = pd.Series(_col(df, "predicted_overhead"), index=key)
    for cell in doc["cells"]:
        k = (cell["batch"], cell["context"], cell["nodes"])
        cell["measured_speedup"] = _round(meas.get(k, np.nan)) if cell["nodes"] else 1.0
        cell["measured_by"] = str(meas_by.get(k, "step latency"))
        if pred is not None:
            cell["predicted_speedup"] = _round(pred.get(k, np.nan)) if cell["nodes"] else 1.0
            if cell["predicted_speedup"] is None:
                cell["predicted_speedup_missing"] = missing_prediction_reason(pred_overhead.get(k, np.nan))


def check_tolerance(tolerance) -> float:
    """The equivalence margin as a fraction in [0, 0.5) (UserError naming --tolerance)."""
    try:
        value = float(tolerance)
    except (TypeError, ValueError):
        raise UserError(f"--tolerance: expected a fraction such as 0.05, got {tolerance!r}") from None
    if not 0.0 <= value < 0.5:
        raise UserError(f"--tolerance: must be a fraction in [0, 0.5), such as 0.05 (5%), got {tolerance}")
    return value


def _add_decisions(doc: dict, decisions: pd.DataFrame, confidence: float = CONFIDENCE) -> None:
    """Copy each cell's interval, rounds and reason into the document, and say at the top
    which cells are undecided or too noisy to trust."""
    by_key = {(r["batch"], r["context"]): r for r in decisions.to_dict("records")}
    undecided, noisy = [], []
    for cell in doc["cells"]:
        d = by_key[(cell["batch"], cell["context"])]
        cell["speedup_lo"] = _round(d["speedup_lo"])
        cell["speedup_hi"] = _round(d["speedup_hi"])
        cell["rounds"] = d["rounds"]
        cell["reason"] = d["reason"]
        if not d["settled"]:
            need = d["rounds_needed"]
            cell["rounds_needed"] = int(need) if math.isfinite(need) else None
        cell["best_nodes"] = d["best_nodes"]
        mark_clamp(cell, d["overhead_measured"])
        if d["unreliable_nodes"]:
            cell["unreliable_nodes"] = d["unreliable_nodes"]
        if d["plain_slower_nodes"]:
            cell["plain_slower_nodes"] = d["plain_slower_nodes"]
        if d["disagree_nodes"]:
            cell["step_and_end_to_end_disagree"] = d["disagree_nodes"]
        where = {"batch": cell["batch"], "context": cell["context"]}
        if d["reason"] in ("undecided", "unreliable"):
            undecided.append(where)
        elif (
            cell["nodes"]
            and np.isfinite(d["speedup_hi"])
            and (d["speedup_hi"] - d["speedup_lo"]) / 2 > NOISY_HALF_WIDTH * cell["speedup"]
        ):
            noisy.append(where)
    doc["confidence"] = confidence
    sizes = max((len(d["sizes"]) for d in decisions.to_dict("records")), default=2)
    doc["interval_confidence"] = shipped_confidence(confidence, sizes - 1)
    doc["undecided"] = undecided
    doc["noisy"] = noisy


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
    extra: dict | None = None,
) -> dict:
    """The `treeopt.selection/v1` document: per (batch, context) the best tree size and its
    medusa_choices (proposal_tree.prefix(nodes)); nodes 0 and [] for no speculation. Cells
    where not even plain decoding fits in memory are listed under "out_of_memory" instead."""
    best = best_per_cell(grid_df, threshold=threshold)
    size = getattr(proposal_tree, "size", None)
    if size is None:
        raise UserError("selection: proposal_tree must be a treeopt Tree")
    cells, oom = [], []
    for row in best.itertuples(index=False):
        if not row.fits_memory:
            oom.append({"batch": int(row.batch), "context": int(row.context)})
            continue
        nodes = int(row.nodes)
        if nodes > size:
            raise UserError(f"selection: the grid picks {nodes} nodes but the proposal tree has {size}")
        choices = proposal_tree.prefix(nodes).to_choices() if nodes else []
        cells.append(
            {
                "batch": int(row.batch),
                "context": int(row.context),
                "nodes": nodes,
                "speedup": round(float(row.speedup), 6),
                "tau": round(float(row.tau), 6),
                "overhead": round(float(row.overhead), 6),
                "medusa_choices": choices,
            }
        )
    doc = {
        "format": SELECTION_FORMAT,
        "hardware": hardware_name,
        "model": model_name,
        "source": "roofline prediction",
        "cells": cells,
    }
    if oom:
        doc["out_of_memory"] = oom
    if extra:
        doc.update(extra)
    return doc


def selection_from_grid_file(grid_file, accuracy, *, csv_model: str | None = None, threshold: float = 1.0) -> dict:
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
        raise UserError(f"{grid_file}: cannot read ({_first_line(err)})") from None
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


def format_speedup(v) -> str:
    """A speedup for people: "1.23x", or "--" where the selection JSON has null (NaN)."""
    return "--" if v is None or not np.isfinite(v) else f"{v:.2f}x"


def format_selection(doc: dict) -> str:
    """The console summary; says plainly which cells are undecided or noisy."""
    lines = [f"best tree per (batch, context) -- {doc.get('source', '')}"]
    for c in doc["cells"]:
        what = "no speculation" if c["nodes"] == 0 else f"{c['nodes']:3d} nodes"
        extra = ""
        if c.get("speedup_lo") is not None and c["nodes"]:
            extra += f" [{c['speedup_lo']:.2f}, {c['speedup_hi']:.2f}]"
        if "measured_speedup" in c and "predicted_speedup" in c:
            extra += (
                f"  (measured {format_speedup(c['measured_speedup'])}, "
                f"predicted {format_speedup(c['predicted_speedup'])})"
            )
        if "reason" in c:
            extra += f"  {c['reason']}" + (f", {c['rounds']} rounds" if c.get("rounds") else "")
            if c["reason"] == "undecided":
                extra += f" ({rounds_needed_text(c)})"
            if c.get("decided_by"):
                extra += f", decided by the {c['decided_by']}"
            if "fit_nodes" in c:
                extra += f"; pooled fit: {c['fit_nodes']} nodes" + (
                    "" if c["fit_consistent"] else " (the fit does not describe this cell)"
                )
        lines.append(
            f"  batch {c['batch']:4d}  context {c['context']:6d}: {what}  speedup {format_speedup(c['speedup'])}{extra}"
        )
        if c.get("predicted_speedup_missing"):
            lines.append(f"      no predicted speedup: {c['predicted_speedup_missing']}")
        if c.get("measured_speedup_missing"):
            lines.append(f"      speedup not measured: {c['measured_speedup_missing']}")
        lines += [f"      {line}" for line in unreliable_lines(c)]
        if c.get("step_and_end_to_end_disagree"):
            lines.append(
                "      step latency and end-to-end throughput disagree beyond the interval at nodes "
                f"{c['step_and_end_to_end_disagree']}: selected on end-to-end"
            )
    lines += noise_summary(doc)
    return "\n".join(lines)


def noise_summary(doc: dict) -> list[str]:
    """Lines that say which cells the measurement could not decide or measured noisily."""
    out = []
    cells = ", ".join
    slow_plain = {(c["batch"], c["context"]) for c in doc.get("cells", []) if plain_slow_only(c)}
    noisy_undecided = [u for u in doc.get("undecided") or [] if (u["batch"], u["context"]) not in slow_plain]
    if noisy_undecided:
        tolerance = doc.get("tolerance")
        within = f" within {tolerance:.0%}" if tolerance is not None else ""
        out.append(
            f"UNDECIDED: the measurement could not settle the answer{within} at "
            + cells(f"batch {u['batch']} context {u['context']}" for u in noisy_undecided)
            + " (shipped: the best estimate that beats the threshold at its lower bound, else no speculation); "
            "measure again on a quieter machine or with a larger --budget"
        )
    if slow_plain:
        out.append(
            "PLAIN STEP SLOWER: at "
            + cells(f"batch {b} context {s}" for b, s in sorted(slow_plain))
            + " tree steps measured faster than plain decoding, so every tree there failed the sanity checks; "
            "plain decoding is the slow step on this stack (not noise: a quieter machine will not change it)"
        )
    if doc.get("noisy"):
        out.append(
            f"NOISY: the chosen speedup's {percent(doc.get('interval_confidence', doc.get('confidence', CONFIDENCE)))}"
            " interval is wider than "
            f"+-{NOISY_HALF_WIDTH:.0%} at " + cells(f"batch {u['batch']} context {u['context']}" for u in doc["noisy"])
        )
    return out


def rounds_needed_text(cell: dict) -> str:
    """How many rounds the observed noise would need to settle an undecided cell, in words."""
    need = cell.get("rounds_needed")
    if need is None:
        return "no number of rounds would settle it at this tolerance"
    return f"about {need} rounds would settle it"


def _round(x) -> float | None:
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


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
