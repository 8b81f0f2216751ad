"""Compare the selections of `treeopt run` folders cell by cell (a markdown table).

    python tools/compare_runs.py RUN_DIR RUN_DIR [RUN_DIR ...]

Three readings of agreement, all at the first run's tolerance δ:
- "each sweep": the runs ship the same tree, or trees whose measured point speedups are within
  δ of each other in every run's own sweep (each run's noise counts against it);
- "intervals": in every run's own sweep, the paired 95% interval of the ratio of the picks'
  speedups (bootstrap over that run's rounds, `treeopt.selection.cell_draws`) reaches into
  [1 - δ, 1 / (1 - δ)]: no run's measurement shows the picks more than δ apart. Needs each
  run's `sweep.samples.npz`; "--" where one is missing;
- "all sweeps": the picks' point speedups averaged over the runs' sweeps are within δ of each
  other (the runs' measurements pooled, so less noisy).
"""

import json
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treeopt.selection import cell_draws, read_round_samples  # noqa: E402
from treeopt.stats import CONFIDENCE, interval  # noqa: E402


def _intervals_agree(run: str, sweep: pd.DataFrame, samples: dict, key, picks, tol: float) -> bool | None:
    """Whether `run`'s own rounds leave every pair of `picks` within δ (None: no samples)."""
    got = samples.get(key)
    if got is None:
        return None
    sizes, x = got
    cell = sweep[(sweep["batch"] == key[0]) & (sweep["context"] == key[1])].sort_values("nodes")
    speed = cell_draws(cell, x).speedup  # (draws, sizes), paired: one resample of rounds per draw
    for a, b in combinations(picks, 2):
        lo, hi = interval(speed[:, sizes.index(b)] / speed[:, sizes.index(a)], CONFIDENCE)
        if hi < 1 - tol or lo > 1 / (1 - tol):
            return False
    return True


def main(runs: list[str]) -> None:
    sel = {r: {(c["batch"], c["context"]): c for c in json.load(open(f"{r}/selection.json"))["cells"]} for r in runs}
    frames = {r: pd.read_csv(f"{r}/sweep.csv") for r in runs}
    sw = {r: frames[r].set_index(["batch", "context", "nodes"])["speedup"] for r in runs}
    samples = {r: read_round_samples(Path(r) / "sweep.samples.npz") for r in runs}
    tol = json.load(open(f"{runs[0]}/selection.json"))["tolerance"]
    names = " | ".join(r.rstrip("/").split("/")[-1] for r in runs)
    print(f"| batch | context | {names} | worst ratio, each sweep | agree | intervals | ratio, all sweeps | agree |")
    print("|---|---|" + "---|" * len(runs) + "---|---|---|---|---|")
    for key in sorted(sel[runs[0]]):
        picks = sorted({sel[r][key]["nodes"] for r in runs})
        speed = np.array([[1.0 if n == 0 else float(sw[r].loc[(*key, n)]) for n in picks] for r in runs])
        each = float((speed.min(axis=1) / speed.max(axis=1)).min())
        mean = speed.mean(axis=0)
        pooled = float(mean.min() / mean.max())
        verdicts = [_intervals_agree(r, frames[r], samples[r], key, picks, tol) for r in runs]
        within = "--" if None in verdicts else ("yes" if all(verdicts) else "NO")
        shown = " | ".join(f"{sel[r][key]['nodes']} ({sel[r][key]['reason']})" for r in runs)
        print(
            f"| {key[0]} | {key[1]} | {shown} | {each:.3f} | {'yes' if each >= 1 - tol else 'NO'} | {within} | "
            f"{pooled:.3f} | {'yes' if pooled >= 1 - tol else 'NO'} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
