"""Compare the selections of `treeopt run` folders cell by cell (a markdown table).

    python tools/compare_runs.py RUN_DIR RUN_DIR [RUN_DIR ...]

Two columns of agreement, both at the first run's tolerance δ:
- "each sweep": the runs ship the same tree, or trees whose measured point speedups are within
  δ of each other in every run's own sweep (each run's noise counts against it);
- "all sweeps": the picks' point speedups averaged over the runs' sweeps are within δ of each
  other (the runs' measurements pooled, so less noisy).
"""

import json
import sys

import numpy as np
import pandas as pd


def main(runs: list[str]) -> None:
    sel = {r: {(c["batch"], c["context"]): c for c in json.load(open(f"{r}/selection.json"))["cells"]} for r in runs}
    sw = {r: pd.read_csv(f"{r}/sweep.csv").set_index(["batch", "context", "nodes"])["speedup"] for r in runs}
    tol = json.load(open(f"{runs[0]}/selection.json"))["tolerance"]
    names = " | ".join(r.rstrip("/").split("/")[-1] for r in runs)
    print(f"| batch | context | {names} | worst ratio, each sweep | agree | ratio, all sweeps | agree |")
    print("|---|---|" + "---|" * len(runs) + "---|---|---|---|")
    for key in sorted(sel[runs[0]]):
        picks = sorted({sel[r][key]["nodes"] for r in runs})
        speed = np.array([[1.0 if n == 0 else float(sw[r].loc[(*key, n)]) for n in picks] for r in runs])
        each = float((speed.min(axis=1) / speed.max(axis=1)).min())
        mean = speed.mean(axis=0)
        pooled = float(mean.min() / mean.max())
        shown = " | ".join(f"{sel[r][key]['nodes']} ({sel[r][key]['reason']})" for r in runs)
        print(
            f"| {key[0]} | {key[1]} | {shown} | {each:.3f} | {'yes' if each >= 1 - tol else 'NO'} | "
            f"{pooled:.3f} | {'yes' if pooled >= 1 - tol else 'NO'} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
