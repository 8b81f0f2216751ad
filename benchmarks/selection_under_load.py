"""Do default `treeopt run`s on the demo agree when the machine is busy?

    python benchmarks/selection_under_load.py [--quiet 3] [--loaded 3] [-o reports/selection-under-load]

Runs `treeopt run` with its defaults on the bundled demo, alternately quiet and beside one
CPU-bound process (`python -c "while True: pass"`, started before the run and stopped after
it), each into OUT/runs/<name>, and writes OUT/index.md: for every quiet run and every pair of
loaded runs, in how many cells the loaded runs agree with each other within their intervals and
both agree with the quiet run within the tolerance (`treeopt.agreement`; the check of
docs/statistics.md#choosing-a-tree-with-intervals). Runs alternate so that a slow drift of the
machine lands on both kinds. A run already finished (listed in OUT/runs.json) is kept, so an
interrupted study continues where it stopped; only the files the comparison reads are kept of
each run (selection.json, sweep.csv, sweep.meta.json, sweep.samples.npz). About 80 s per run
on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from treeopt.agreement import AGREEMENT_FILES, compare_runs, triple_agreement  # noqa: E402
from treeopt.selection import sweep_confidence  # noqa: E402

BUSY_LOOP = "while True: pass"


def run_names(quiet: int, loaded: int) -> list[str]:
    """quiet-1, loaded-1, quiet-2, ... alternating, the rest of the larger kind at the end."""
    names = []
    for i in range(max(quiet, loaded)):
        if i < quiet:
            names.append(f"quiet-{i + 1}")
        if i < loaded:
            names.append(f"loaded-{i + 1}")
    return names


def _one_run(out: Path, name: str) -> dict:
    """`treeopt run` into out/runs/name (beside a busy process for a loaded run): the seconds it
    took and the device its hardware calibration names (the CPU model decides the step costs)."""
    folder = out / "runs" / name
    hog = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if name.startswith("loaded") else None
    start = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-m", "treeopt", "run", "-o", str(folder)], check=True, cwd=ROOT)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    seconds = time.perf_counter() - start
    device = json.loads((folder / "hardware.json").read_text()).get("calibration", {}).get("device", "?")
    for path in folder.iterdir():  # keep what the comparison reads
        if path.name not in AGREEMENT_FILES:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return {"seconds": round(seconds, 1), "device": device}


def _table(rows, columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    return lines


def load_effect(quiet: list[Path], loaded: list[Path]) -> list[str]:
    """Lines comparing the runs: how often one run's interval of T(n)/T(0) holds the mean of all
    runs, step times (loaded mean over quiet mean, per sweep row) and the median |log|
    difference of T(n)/T(0) between two runs of each kind and across kinds."""
    read = [pd.read_csv(f / "sweep.csv").set_index(["batch", "context", "nodes"]) for f in quiet + loaded]
    steps = np.array([r["step_time_s"].to_numpy() for r in read])
    trees = read[0].index.get_level_values("nodes") > 0  # plain decoding's T(0)/T(0) is 1 in every run
    overhead = np.log(np.array([r["overhead"].to_numpy()[trees] for r in read]))
    kinds = ["quiet"] * len(quiet) + ["loaded"] * len(loaded)
    ratio = steps[len(quiet) :].mean(axis=0) / steps[: len(quiet)].mean(axis=0)

    def spread(first: str, second: str) -> str:
        pairs = [
            (i, j)
            for i, j in combinations(range(len(read)), 2)
            if sorted((kinds[i], kinds[j])) == sorted((first, second))
        ]
        return f"{np.median([np.abs(overhead[i] - overhead[j]) for i, j in pairs]):.3f}" if pairs else "--"

    # does one run's interval hold what all the runs measured? (sizes no run flagged unreliable)
    unreliable = np.array([r["unreliable"].to_numpy()[trees] for r in read]).any(axis=0)
    level = sweep_confidence(json.loads((quiet[0] / "sweep.meta.json").read_text()))
    mean_overhead = np.exp(overhead).mean(axis=0)
    lo = np.array([r["overhead_lo"].to_numpy()[trees] for r in read])
    hi = np.array([r["overhead_hi"].to_numpy()[trees] for r in read])
    held = ((lo <= mean_overhead) & (mean_overhead <= hi))[:, ~unreliable]
    return [
        f"- One run's {level:.1%} interval of T(n)/T(0) holds the mean over all {len(read)} runs in "
        f"{held.mean():.1%} of {held.size} (run, tree size) pairs (sizes no run flagged).",
        f"- Step times beside the busy process over quiet ones (mean over the runs of each kind, per "
        f"sweep row): median {np.median(ratio):.3f}, from {ratio.min():.3f} to {ratio.max():.3f}.",
        "- T(n)/T(0) of the trees, median |log ratio| between two runs: "
        f"two quiet ones {spread('quiet', 'quiet')}, two loaded ones {spread('loaded', 'loaded')}, "
        f"a quiet and a loaded one {spread('quiet', 'loaded')}.",
    ]


def write_index(out: Path, done: dict) -> str:
    quiet = sorted(n for n in done if n.startswith("quiet"))
    loaded = sorted(n for n in done if n.startswith("loaded"))
    folder = {n: out / "runs" / n for n in done}
    cells = compare_runs([folder[n] for n in quiet + loaded])
    tol = cells.attrs["tolerance"]
    lines = [
        "# Default runs beside a busy process against quiet ones",
        "",
        f"`python benchmarks/selection_under_load.py` on the bundled demo: {len(quiet)} quiet and {len(loaded)} "
        "loaded `treeopt run`s with their defaults, alternating; a loaded run has one CPU-bound "
        "process beside it. Device: "
        + ", ".join(sorted({done[n].get("device", "?") for n in done}))
        + ". Seconds per run: "
        + ", ".join(f"{n} {done[n]['seconds']:.0f}" for n in quiet + loaded)
        + ".",
        "",
        f"## The tree each run ships (δ = {tol:g})",
        "",
    ]
    picks = [{"batch": b, "context": c, **{n: cells.loc[(b, c), n] for n in quiet + loaded}} for b, c in cells.index]
    lines += _table(picks, ["batch", "context", *quiet, *loaded])
    lines += [
        "",
        "## Agreement",
        "",
        "One row per quiet run and pair of loaded runs (the issue's check): **loaded pair** counts the "
        "cells where the two loaded runs ship the same tree or trees that no run's own paired 95% "
        "interval shows more than δ apart; **with quiet, points** the cells where, in addition, both "
        "loaded picks are within δ of the quiet run's pick by the point speedups of every one of the "
        "three sweeps; **intervals** and **pooled** the same with the other two readings of "
        "`treeopt.agreement` (no sweep's interval shows them more than δ apart; the three sweeps' "
        "speedups averaged).",
        "",
    ]
    rows = []
    for q in quiet:
        for a, b in combinations(loaded, 2):
            got = triple_agreement([folder[q], folder[a], folder[b]])
            n = got["cells"]
            rows.append(
                {
                    "quiet": q,
                    "loaded pair": f"{a}, {b}",
                    "loaded agree": f"{got['loaded_pair']}/{n}",
                    "with quiet, points": f"{got['points']}/{n}",
                    "intervals": f"{got['intervals']}/{n}",
                    "pooled": f"{got['pooled']}/{n}",
                    "cells missed (points)": ", ".join(f"{b_}/{c_}" for b_, c_ in got["missed_points"]) or "--",
                }
            )
    lines += _table(rows, list(rows[0]) if rows else ["quiet"])
    lines += [
        "",
        "## All runs together",
        "",
        "The best estimate of the truth is every run's measurement at once: per cell, the lowest over the "
        "highest of the picks' point speedups averaged over all the runs' sweeps (**pooled ratio**; every "
        f"pick is within δ of every other where it is at least {1 - tol:g}), and the worst over the runs "
        "of the same ratio in one sweep (**points ratio**; **each run** lists it run by run, in the order "
        "of the first table).",
        "",
    ]
    overall = [
        {
            "batch": b,
            "context": c,
            "picks": ", ".join(str(n) for n in sorted({int(cells.loc[(b, c), r]) for r in quiet + loaded})),
            "pooled ratio": f"{cells.loc[(b, c), 'pooled_ratio']:.3f}",
            "within δ": "yes" if cells.loc[(b, c), "pooled"] else "NO",
            "points ratio": f"{cells.loc[(b, c), 'points_ratio']:.3f}",
            "each run": ", ".join(f"{x:.3f}" for x in cells.loc[(b, c), "run_ratios"]),
        }
        for b, c in cells.index
    ]
    lines += _table(overall, list(overall[0]))
    lines += [
        "",
        "## What the load changes, and what one run's intervals hold",
        "",
        *load_effect([folder[n] for n in quiet], [folder[n] for n in loaded]),
    ]
    text = "\n".join(lines) + "\n"
    (out / "index.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quiet", type=int, default=3, help="quiet runs [3]")
    ap.add_argument("--loaded", type=int, default=3, help="runs beside a busy process [3]")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "reports" / "selection-under-load")
    args = ap.parse_args(argv)
    if args.quiet < 1 or args.loaded < 2:
        ap.error("needs at least 1 quiet and 2 loaded runs")
    out = args.output
    (out / "runs").mkdir(parents=True, exist_ok=True)
    record = out / "runs.json"
    done = json.loads(record.read_text()) if record.is_file() else {}
    for name in run_names(args.quiet, args.loaded):
        if name in done:
            continue
        print(f"== {name}", flush=True)
        done[name] = _one_run(out, name)
        record.write_text(json.dumps(done, indent=1) + "\n")
    print(write_index(out, done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
