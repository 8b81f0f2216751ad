"""A tree step measured no slower than plain decoding: the sweep clamps T(n)/T(0) at 1, so the
speedup it ships is tau itself. The selection must say so instead of reporting tau as a
measured speedup, and where plain decoding is the slow step in every round it must say that,
not advise a quieter machine (docs/statistics.md#when-the-plain-step-is-the-slow-one)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from treeopt.app.run_index import _cell_notes
from treeopt.selection import SWEEP_COLUMNS, add_intervals, format_selection, noise_summary, select
from treeopt.stats import impossible_sizes, same_round_ratios
from treeopt.tree import make_tree

PROPOSAL = make_tree([[0], [1], [0, 0], [2], [0, 1]])
TAU = [1.0, 1.3, 2.0, 2.4]
SWING = np.array([1.003, 0.997] * 5)  # 10 rounds, +-0.3% from round to round


def clamped_sweep(ratios):
    """A one-cell sweep (batch 1, context 128, sizes 0, 1, 2, 4) whose tree steps take `ratios`
    of the 10 ms plain step, with the overhead clamped at 1 and the sizes flagged as
    `treeopt sweep` stores them."""
    x = 0.010 * np.column_stack([np.ones(10)] + [r * (SWING if i % 2 else SWING[::-1]) for i, r in enumerate(ratios)])
    overhead = np.maximum(np.median(same_round_ratios(x), axis=0), 1.0)
    df = pd.DataFrame(
        {
            "batch": 1,
            "context": 128,
            "nodes": [0, 1, 2, 4],
            "tau": TAU,
            "tau_se": 0.0,
            "overhead": overhead,
            "speedup": np.asarray(TAU) / overhead,
            "step_time_s": np.median(x, axis=0),
            "samples": 10,
            "unreliable": impossible_sizes(x).astype(int),  # the sweep's sanity checks
        }
    ).reindex(columns=SWEEP_COLUMNS)
    samples = {(1, 128): ([0, 1, 2, 4], x)}
    return add_intervals(df, samples), samples


def test_a_shipped_speedup_that_is_tau_is_not_called_measured():
    # 4 nodes measured at 0.995 of the plain step: its overhead is clamped at 1 and its
    # speedup is tau = 2.4 exactly, the largest; the measured ratio itself is 0.995
    df, samples = clamped_sweep([1.0, 0.995, 0.995])
    chosen = select(df, PROPOSAL, samples=samples)
    doc = chosen.to_json()
    (cell,) = doc["cells"]
    assert cell["nodes"] == 4 and cell["speedup"] == 2.4 == cell["tau"]
    assert cell["measured_speedup"] is None
    assert abs(cell["overhead_measured"] - 0.995) < 1e-3
    assert (
        "0.995" in cell["measured_speedup_missing"] and "plain step is the slow one" in cell["measured_speedup_missing"]
    )
    assert "speedup not measured" in format_selection(chosen)
    report = "\n".join(_cell_notes(chosen.cells))
    assert "batch 1 context 128, measured speedup `= τ`: T(n)/T(0) measured 0.995" in report


def test_a_tree_measured_slower_than_plain_keeps_its_measured_speedup():
    # 4 nodes at 1.2 x plain: 2.4 / 1.2 = 2.0, measured
    df, samples = clamped_sweep([1.0, 1.1, 1.2])
    (cell,) = select(df, PROPOSAL, samples=samples).to_json()["cells"]
    assert cell["nodes"] == 4 and abs(cell["measured_speedup"] - 2.0) < 1e-6
    assert "measured_speedup_missing" not in cell and "overhead_measured" not in cell


def test_plain_decoding_slower_than_every_tree_is_named_not_blamed_on_noise():
    # every tree step at 0.90-0.95 of the plain step in every round: all flagged by the sanity
    # checks; the cause is the plain step, which a quieter machine does not change
    df, samples = clamped_sweep([0.90, 0.92, 0.95])
    chosen = select(df, PROPOSAL, samples=samples)
    (cell,) = chosen.to_json()["cells"]
    assert cell["reason"] == "unreliable" and cell["nodes"] == 0
    assert cell["plain_slower_nodes"] == [1, 2, 4]
    summary = "\n".join(noise_summary(chosen))
    assert "PLAIN STEP SLOWER" in summary and "measure again on a quieter machine" not in summary
    assert "UNDECIDED" not in summary
    console = format_selection(chosen)
    assert "the plain step is the slow one on this stack" in console
    assert "unreliable (failed the sanity checks" not in console
    assert "the plain step is the slow one on this stack" in "\n".join(_cell_notes(chosen.cells))
