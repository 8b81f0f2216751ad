"""A measured sweep on disk: its CSV (one row per batch, context and tree size), the
`NAME.meta.json` beside it that holds the proposal tree (row `nodes = n` measures
`proposal.prefix(n)`), and the per-round step times `NAME.samples.npz` behind its intervals
(docs/formats.md#sweep-csv-and-namemetajson-treeoptsweepv1). `SWEEP_COLUMNS` is the one list of
its columns: `calibration/sweep.py` writes them, `read_sweep` reads them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from treeopt.errors import UserError
from treeopt.fileio import atomic_path, read_json_input
from treeopt.npz_input import read_npz
from treeopt.stats import CONFIDENCE, SpeedupDraws, bootstrap_speedups, interval
from treeopt.tree import Tree, make_tree

__all__ = [
    "SWEEP_COLUMNS",
    "MEASURED_COLUMNS",
    "E2E_COLUMNS",
    "REQUIRED",
    "read_sweep",
    "sweep_meta_path",
    "sweep_samples_path",
    "read_round_samples",
    "write_round_samples",
    "add_intervals",
    "cell_draws",
    "sweep_confidence",
    "proposal_from_meta",
    "first_line",
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
KEY_COLUMNS = ["batch", "context", "nodes"]
TAU_COLUMNS = ["tau", "tau_independent", "tau_joint", "tau_walk", "tau_se"]
#: what the timed rounds of one size give (calibration/sweep.py writes them per row)
STEP_COLUMNS = ["step_time_s", "step_time_p10_s", "step_time_p90_s", "samples", "remeasured", "overhead"]
SPEEDUP_COLUMNS = ["overhead_lo", "overhead_hi", "speedup", "speedup_lo", "speedup_hi"]
FLAG_COLUMNS = ["unreliable"]
PREDICTED_COLUMNS = ["predicted_step_time_s", "predicted_overhead", "predicted_speedup"]
E2E_COLUMNS = ["e2e_tokens_per_s", "e2e_tokens_per_step", "e2e_speedup"]
#: the columns a measurement writes for each size
MEASURED_COLUMNS = STEP_COLUMNS + FLAG_COLUMNS
#: every column, in the order a sweep CSV holds them
SWEEP_COLUMNS = (
    KEY_COLUMNS + TAU_COLUMNS + STEP_COLUMNS + SPEEDUP_COLUMNS + FLAG_COLUMNS + PREDICTED_COLUMNS + E2E_COLUMNS
)
REQUIRED = ("batch", "context", "nodes", "speedup")


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
    if not path.exists():
        return {}
    b, s, n, r, sec = _sample_columns(read_npz(path, "a sweep samples file"), path)
    out = {}
    for key in sorted(set(zip(b.tolist(), s.tolist(), strict=True))):
        sel = (b == key[0]) & (s == key[1])
        sizes = np.unique(n[sel])
        rounds = int(r[sel].max()) + 1
        if rounds * sizes.size != int(sel.sum()):  # before allocating what the round index claims
            raise UserError(f"{path}: batch {key[0]} context {key[1]}: incomplete rounds")
        x = np.full((rounds, sizes.size), np.nan)
        x[r[sel], np.searchsorted(sizes, n[sel])] = sec[sel]
        if np.isnan(x).any() or sizes[0] != 0:
            raise UserError(f"{path}: batch {key[0]} context {key[1]}: incomplete rounds")
        out[key] = ([int(v) for v in sizes], x)
    return out


def _sample_columns(z: dict, path: Path) -> tuple[np.ndarray, ...]:
    """The five columns of a samples file, checked: equally long, integers >= 0 (nodes, round,
    batch and context), seconds finite and > 0."""
    missing = [k for k in ("batch", "context", "nodes", "round", "seconds") if k not in z]
    if missing:
        raise UserError(f"{path}: not a sweep samples file (no '{missing[0]}' array)")
    columns = [z[k] for k in ("batch", "context", "nodes", "round", "seconds")]
    if len({c.shape for c in columns}) != 1 or columns[0].ndim != 1:
        raise UserError(f"{path}: the arrays batch, context, nodes, round, seconds must be equally long vectors")
    for k, c in zip(("batch", "context", "nodes", "round"), columns[:4], strict=True):
        if c.dtype.kind not in "iu" or (c.size and c.min() < 0):
            raise UserError(f"{path}: '{k}' must hold integers >= 0")
    seconds = columns[4]
    if seconds.dtype.kind != "f" or not np.all(np.isfinite(seconds) & (seconds > 0)):
        raise UserError(f"{path}: 'seconds' must hold finite step times > 0")
    return tuple(columns)


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


def first_line(err: BaseException) -> str:
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
    _check_measurement(meta, meta_file)
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
        raise UserError(f"{path}: not a sweep CSV ({first_line(err)})") from None
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


#: the metadata format this version reads and writes (docs/formats.md#sweep-csv-and-namemetajson-treeoptsweepv1)
SWEEP_FORMAT = "treeopt.sweep/v1"


def _check_measurement(meta: dict, meta_file: Path) -> None:
    """UserError naming the field of a sweep's metadata that cannot be what a sweep wrote: a
    format of another (newer) version, a confidence outside [0.5, 1), repeats below 1."""
    fmt = meta.get("format", SWEEP_FORMAT)
    if fmt != SWEEP_FORMAT:
        raise UserError(f"{meta_file}: format {str(fmt)[:40]!r}, this treeopt reads {SWEEP_FORMAT} (from a newer one?)")
    measurement = meta.get("measurement", {})
    if not isinstance(measurement, dict):
        raise UserError(f"{meta_file}: 'measurement' must be an object")
    confidence = measurement.get("confidence")
    if confidence is not None and not (_is_number(confidence) and 0.5 <= confidence < 1):
        raise UserError(f"{meta_file}: measurement.confidence must be in [0.5, 1), got {confidence!r}")
    repeats = measurement.get("repeats")
    if repeats is not None and not (isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1):
        raise UserError(f"{meta_file}: measurement.repeats must be a whole number >= 1, got {repeats!r}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_samples_cells(samples: dict, table: pd.DataFrame, path) -> None:
    """UserError when the round samples beside a sweep hold a cell its CSV has not (a samples
    file of another sweep) or other tree sizes than the CSV's rows of that cell."""
    for (b, s), (sizes, _) in samples.items():
        rows = table[(table["batch"] == b) & (table["context"] == s)]
        if rows.empty:
            raise UserError(f"{path}: has samples of batch {b} context {s}, a cell the sweep CSV has not")
        if sorted(rows["nodes"].astype(int)) != list(sizes):
            raise UserError(f"{path}: batch {b} context {s}: samples of other tree sizes than the sweep CSV's rows")


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
