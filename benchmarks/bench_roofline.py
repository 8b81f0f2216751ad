"""Speed of the roofline model (issue 3). Run:

    python benchmarks/bench_roofline.py

Target: the full default speedup grid -- batch 1..64 (powers of 2) x context 128..8192
(powers of 2) x 65 tree sizes (0..64) for Vicuna-7B with 5 heads on an A100 -- computes in
under 1 s, including the greedy proposal sequence, tau, the best tree per cell and the
selection document. Also timed: the bare vectorised grid, and step_time_s over 100,000
(batch, tokens, context) configurations. Medians of repeated runs (treeopt.timing.measure),
since this shared VM has bursts of slowdown.

`main()` returns [(name, seconds, target_seconds), ...] for run_all.py; prints PASS/FAIL.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _targets import exit_status, print_time_targets  # noqa: E402

from roofline.grid import speedup_grid  # noqa: E402
from roofline.hardware import load_hardware  # noqa: E402
from roofline.latency import step_time_s  # noqa: E402
from roofline.shapes import draft_heads_shape, model_shape  # noqa: E402
from treeopt.accuracy import load_accuracy  # noqa: E402
from treeopt.selection import selection_from_grid  # noqa: E402
from treeopt.tau import proposal_sequence, tau_curves  # noqa: E402
from treeopt.timing import measure  # noqa: E402

CSV = Path(__file__).resolve().parents[1] / "treeopt" / "data" / "medusa_train_accuracy.csv"


def main(repeats: int = 9) -> list[tuple[str, float, float]]:
    shape = model_shape("vicuna-7b")
    heads = draft_heads_shape(shape, 5)
    hw = load_hardware("a100-80gb-sxm")
    table = load_accuracy(CSV, model="vicuna-7b")

    def proposal_from_accuracy(table, nodes):
        curves = tau_curves(table, proposal_sequence(table, nodes, method="greedy"))
        return curves.proposal, curves.best

    def full():
        tree, tau = proposal_from_accuracy(table, 64)
        grid = speedup_grid(shape, heads, hw, tau)
        selection_from_grid(grid, tree, hw.name, shape.name)
        return grid

    grid = full()
    assert len(grid) == 7 * 7 * 65, len(grid)
    _, tau = proposal_from_accuracy(table, 64)
    rng = np.random.default_rng(0)
    b = rng.integers(1, 65, 100_000)
    q = rng.integers(1, 66, 100_000)
    s = rng.integers(0, 8193, 100_000)

    results = [
        (
            "full default grid 7 x 7 x 65 (proposal, tau, grid, best, selection)",
            measure(full, repeats=repeats, warmup=1).median_s,
            1.0,
        ),
        (
            "speedup_grid alone, 7 x 7 x 65",
            measure(lambda: speedup_grid(shape, heads, hw, tau), repeats=repeats, warmup=1).median_s,
            0.2,
        ),
        (
            "step_time_s over 100,000 configurations",
            measure(
                lambda: step_time_s(shape, heads, hw, batch=b, tokens=q, context=s), repeats=repeats, warmup=1
            ).median_s,
            1.0,
        ),
    ]
    print_time_targets(results)
    return results + memory_check()


def memory_check() -> list[tuple]:
    """Size guard: a grid the CLI accepts fits in 1 GiB (the largest one, 64 x 160 x 65 cells,
    with the best tree per cell and the selection, peak traced memory), and 1M cells are
    refused at once with an estimate."""
    import tracemalloc  # noqa: PLC0415 - only this check traces allocations

    from treeopt.app.prediction import GRID_MEMORY_LIMIT_BYTES, check_grid_size  # noqa: PLC0415
    from treeopt.errors import UserError  # noqa: PLC0415

    shape, hw = model_shape("vicuna-7b"), load_hardware("a100-80gb-sxm")
    heads = draft_heads_shape(shape, 5)
    table = load_accuracy(CSV, model="vicuna-7b")
    tree = proposal_sequence(table, 64, method="greedy")
    tau = tau_curves(table, tree).independent
    batches, contexts = list(range(1, 65)), list(range(0, 160 * 16, 16))
    check_grid_size(batches, contexts, 64)
    tracemalloc.start()
    grid = speedup_grid(shape, heads, hw, tau, batches, contexts, tree=tree)
    selection_from_grid(grid, tree, hw.name, shape.name)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{len(grid):,} grid cells (the largest the CLI accepts): peak {peak / 2**30:.2f} GiB")
    try:
        check_grid_size(list(range(1, 129)), list(range(0, 120 * 16, 16)), 64)
        refused = False
    except UserError as err:
        refused = "GiB" in str(err)
        print(f"1M cells refused before any work: {err}")
    return [
        (
            f"roofline speedup, {len(grid):,} cells: peak memory",
            peak / 2**30,
            GRID_MEMORY_LIMIT_BYTES / 2**30,
            "GiB",
            True,
        ),
        ("roofline speedup, 1M cells refused with an estimate", float(refused), 1.0, "bool", False),
    ]


if __name__ == "__main__":
    rows = main()
    timed, checked = rows[:-2], rows[-2:]
    ok = all((m <= t) if lower else (m >= t) for _, m, t, _, lower in checked)
    sys.exit(exit_status(timed) or (0 if ok else 1))
