"""Fitting a profile to a measured sweep (docs/performance-model.md#fitting-a-profile-to-measured-steps). Run:

    python benchmarks/bench_profile_fit.py [SWEEP_DIR]

A benchmark, not a test: it reads the committed demo sweep measured on this CPU
(reports/demo-cpu: sweep.csv, sweep.meta.json, hardware.json), fits the engine terms of the
calibrated profile on the batch-1 rows only (roofline.profile_fit.batch_transfer), predicts the
other batch sizes, and prints per (batch, context) cell the median and worst error of T(n)/T(0)
and whether the predicted best tree is within one swept size of the measured best. The same
for the calibrated profile without the fit, for comparison.

`main()` returns [(name, value, target, unit, lower_is_better), ...] for run_all.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roofline.hardware import load_hardware  # noqa: E402
from roofline.profile_fit import batch_transfer, error_summary  # noqa: E402
from treeopt.app.models import heads_of, shape_of  # noqa: E402
from treeopt.tree import Tree  # noqa: E402

SWEEP_DIR = Path(__file__).resolve().parents[1] / "reports" / "demo-cpu"


def main(sweep_dir: Path = SWEEP_DIR) -> list[tuple]:
    sweep = pd.read_csv(sweep_dir / "sweep.csv")
    meta = json.loads((sweep_dir / "sweep.meta.json").read_text())
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(meta.get("dtype"), None)
    shape = shape_of(meta.get("model", "demo"), dtype)
    heads = heads_of(meta.get("model", "demo"), shape, tokens_per_sequence=1)
    proposal = Tree(tuple(tuple(p) for p in meta["proposal"]))
    depth = np.concatenate(([0], np.maximum.accumulate([len(p) for p in proposal.paths])))
    base = load_hardware(sweep_dir / "hardware.json")
    results = {}
    for label, free in (("calibrated profile + fit on batch 1", None), ("calibrated profile alone", ())):
        result = batch_transfer(shape, heads, base, sweep, np.minimum(depth, heads.num_heads), fit_terms=free)
        results[label] = result
        cells = result.cells
        terms = ", ".join(f"{k}={v:.3g}" for k, v in result.fit.terms.items()) or "none"
        print(f"\n{label}: fitted terms {terms}")
        print(f"  fit rows (batch 1): {error_summary(result.fit.in_sample_error)}")
        print(cells.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(
            f"  T(n)/T(0) over the other batch sizes: median of cell medians "
            f"{cells['median_ratio_error'].median() * 100:.1f}%, "
            f"worst {cells['worst_ratio_error'].max() * 100:.1f}%; "
            f"best tree within one step in {int(cells['within_one_step'].sum())} of {len(cells)} cells"
        )
    fitted = results["calibrated profile + fit on batch 1"].cells
    return [
        (
            "fit on batch 1: worst T(n)/T(0) error on other batches",
            float(fitted["worst_ratio_error"].max()),
            0.5,
            "",
            True,
        ),
        (
            "fit on batch 1: cells whose best tree is within one step",
            float(fitted["within_one_step"].mean()),
            0.5,
            "",
            False,
        ),
    ]


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else SWEEP_DIR)
