"""Do several runs' selections agree? Cell by cell, at the first run's tolerance δ.

A run folder is what `treeopt run` writes (only `AGREEMENT_FILES` are read). Two runs may ship
different trees and still agree: near the knee several sizes are within δ of each other
(docs/statistics.md#choosing-a-tree-with-intervals). Three readings of "the picks are within δ":

- **points**: in every run's own sweep, the picks' point speedups are within δ of each other
  (each run's noise counts against it, so the strictest);
- **intervals**: no run's own paired 95% interval of the ratio of two picks' speedups
  (bootstrap over that run's rounds, `treeopt.selection.cell_draws`) lies wholly outside
  [1 − δ, 1 / (1 − δ)]: no run's measurement shows the picks more than δ apart. Needs each run's
  `sweep.samples.npz` (None where one is missing);
- **pooled**: the picks' point speedups averaged over the runs' sweeps are within δ.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from treeopt.errors import UserError
from treeopt.fileio import read_json_input
from treeopt.selection_types import selection_from_json
from treeopt.stats import CONFIDENCE, interval
from treeopt.sweep_file import cell_draws, read_round_samples

AGREEMENT_FILES = ("selection.json", "sweep.csv", "sweep.meta.json", "sweep.samples.npz")


def _read_run(folder: Path) -> tuple[dict, pd.DataFrame, dict, float]:
    path = folder / "selection.json"
    if not path.is_file():
        raise UserError(f"{path}: not found (give a folder `treeopt run` wrote)")
    selection = selection_from_json(read_json_input(path, "a selection file"), str(path))
    picks = selection.chosen_nodes()
    tolerance = selection.rule.tolerance if selection.rule.tolerance is not None else 0.05
    csv = folder / "sweep.csv"
    if not csv.is_file():
        raise UserError(f"{csv}: not found (the selection was not made from a measured sweep)")
    return picks, pd.read_csv(csv), read_round_samples(folder / "sweep.samples.npz"), tolerance


def within_by_intervals(sweep: pd.DataFrame, samples: dict, key, picks, tolerance: float) -> bool | None:
    """Whether one run's own rounds leave every pair of `picks` (tree sizes) of cell `key`
    within `tolerance`: no paired 95% interval of their speedup ratio lies wholly outside
    [1 − δ, 1 / (1 − δ)] (None: the run kept no per-round samples of this cell)."""
    got = samples.get(key)
    if got is None:
        return None
    sizes, x = got
    cell = sweep[(sweep["batch"] == key[0]) & (sweep["context"] == key[1])].sort_values("nodes")
    speed = cell_draws(cell, x).speedup  # (draws, sizes): one resample of rounds per draw
    for a, b in combinations(picks, 2):
        lo, hi = interval(speed[:, sizes.index(b)] / speed[:, sizes.index(a)], CONFIDENCE)
        if hi < 1 - tolerance or lo > 1 / (1 - tolerance):
            return False
    return True


def compare_runs(folders) -> pd.DataFrame:
    """One row per (batch, context) of the first run: each run's pick (a column named after its
    folder), and the three readings: `run_ratios` (per run, the lowest pick's point speedup over
    the highest in that run's sweep), `points_ratio` (the worst of them) and `points`, `intervals`
    (None where a run has no samples), `pooled_ratio` and `pooled`. attrs["tolerance"] is δ."""
    folders = [Path(f) for f in folders]
    names = [f.name for f in folders]
    if len(set(names)) != len(names):
        raise UserError(f"runs: folder names must differ to label the columns, got {names}")
    runs = [_read_run(f) for f in folders]
    tolerance = runs[0][3]
    speedups = [sweep.set_index(["batch", "context", "nodes"])["speedup"] for _, sweep, _, _ in runs]
    rows = []
    for key in sorted(runs[0][0]):
        missing = [str(f) for f, run in zip(folders, runs, strict=True) if key not in run[0]]
        if missing:
            raise UserError(f"{missing[0]}: has no cell batch {key[0]}, context {key[1]} to compare")
        picks = sorted({run[0][key] for run in runs})
        # speed[r, j]: run r's point speedup of pick j (plain decoding is 1 by definition)
        speed = np.array([[1.0 if n == 0 else float(s.loc[(*key, n)]) for n in picks] for s in speedups])
        run_ratios = speed.min(axis=1) / speed.max(axis=1)
        points_ratio = float(run_ratios.min())
        mean = speed.mean(axis=0)
        pooled_ratio = float(mean.min() / mean.max())
        verdicts = [within_by_intervals(sweep, samples, key, picks, tolerance) for _, sweep, samples, _ in runs]
        row = {"batch": key[0], "context": key[1]}
        row.update({name: run[0][key] for name, run in zip(names, runs, strict=True)})
        row.update(
            run_ratios=tuple(round(float(r), 6) for r in run_ratios),
            points_ratio=points_ratio,
            points=points_ratio >= 1 - tolerance,
            intervals=None if None in verdicts else all(verdicts),
            pooled_ratio=pooled_ratio,
            pooled=pooled_ratio >= 1 - tolerance,
        )
        rows.append(row)
    table = pd.DataFrame(rows).set_index(["batch", "context"])
    table.attrs["tolerance"] = tolerance
    return table


def triple_agreement(folders) -> dict:
    """The check of two loaded runs against a quiet one: `folders` = [quiet, loaded A,
    loaded B]. `loaded_pair`: cells where A and B agree by the intervals reading; `points`,
    `intervals`, `pooled`: cells where, in addition, the three runs' picks agree by that
    reading; `missed_points`: the cells not counted in `points`; `cells`: how many."""
    quiet, a, b = (Path(f) for f in folders)
    pair = compare_runs([a, b])
    three = compare_runs([quiet, a, b])
    paired = pair["intervals"].fillna(False).astype(bool)
    out = {"cells": len(three), "loaded_pair": int(paired.sum())}
    for reading in ("points", "intervals", "pooled"):
        ok = paired.reindex(three.index).fillna(False) & three[reading].fillna(False).astype(bool)
        out[reading] = int(ok.sum())
        if reading == "points":
            out["missed_points"] = [key for key, good in ok.items() if not good]
    return out
