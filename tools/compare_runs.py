"""Compare the selections of `treeopt run` folders cell by cell (a markdown table).

    python tools/compare_runs.py RUN_DIR RUN_DIR [RUN_DIR ...]

Two runs agree in a cell when they ship the same tree, or trees whose measured point speedups
are within the first run's tolerance of each other in every run's own sweep.
"""

import json
import sys

import pandas as pd

runs = sys.argv[1:]
sel = {r: {(c["batch"], c["context"]): c for c in json.load(open(f"{r}/selection.json"))["cells"]} for r in runs}
sw = {r: pd.read_csv(f"{r}/sweep.csv").set_index(["batch", "context", "nodes"])["speedup"] for r in runs}
tol = json.load(open(f"{runs[0]}/selection.json"))["tolerance"]
cells = sorted(sel[runs[0]])
print(
    "| batch | context | " + " | ".join(r.split("/")[-1] for r in runs) + " | worst ratio in any run's sweep | agree |"
)
print("|---|---|" + "---|" * len(runs) + "---|---|")
for key in cells:
    picks = [sel[r][key]["nodes"] for r in runs]
    worst = 1.0
    for r in runs:
        sp = [1.0 if n == 0 else float(sw[r].loc[(key[0], key[1], n)]) for n in picks]
        worst = min(worst, min(sp) / max(sp))
    ok = worst >= 1 - tol
    shown = [f"{sel[r][key]['nodes']} ({sel[r][key]['reason']})" for r in runs]
    print(f"| {key[0]} | {key[1]} | " + " | ".join(shown) + f" | {worst:.3f} | {'yes' if ok else 'NO'} |")
