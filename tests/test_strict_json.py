"""Every JSON document treeopt writes is strict JSON (RFC 8259 has no NaN or Infinity): a
strict parser reads it, and a number that cannot be computed is null with its reason beside it
(docs/formats.md#strict-json)."""

from __future__ import annotations

import json

import numpy as np

from tests.test_selection import PROPOSAL, by_cell, hand_sweep
from treeopt.app.run_index import _cell_notes
from treeopt.fileio import json_rows, write_json
from treeopt.selection import format_selection, select


def strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as JavaScript's JSON.parse does."""

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_written_json_has_no_nan_or_infinity(tmp_path):
    doc = {"a": float("nan"), "b": [1.0, np.float64("inf"), -np.inf], "c": {"d": np.nan}, "e": 2.5}
    write_json(tmp_path / "x.json", doc)
    assert strict((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.0, None, None], "c": {"d": None}, "e": 2.5}
    assert strict(json_rows({"rows": [[1.0, float("nan")], [2.0, 3.0]]})) == {"rows": [[1.0, None], [2.0, 3.0]]}


def test_a_prediction_the_profile_cannot_make_is_null_with_its_reason(tmp_path):
    # the profile prices the 2-node tree step at 0.9 of the plain step: no tree step costs less
    # than the plain step it contains, so the sweep has no predicted speedup there
    df = hand_sweep()
    row = (df["batch"] == 1) & (df["context"] == 128) & (df["nodes"] == 2)
    df.loc[row, "predicted_overhead"] = 0.9
    df.loc[row, "predicted_speedup"] = np.nan
    chosen = select(df, PROPOSAL)
    doc = chosen.to_json()
    write_json(tmp_path / "selection.json", doc)
    cell = by_cell(strict((tmp_path / "selection.json").read_text()))[(1, 128)]
    assert cell["nodes"] == 2 and cell["predicted_speedup"] is None
    assert "cheaper than the plain step" in cell["predicted_speedup_missing"]
    assert "0.900" in cell["predicted_speedup_missing"]
    # a cell whose prediction exists carries no reason
    assert "predicted_speedup_missing" not in by_cell(doc)[(4, 128)]
    console = format_selection(chosen)
    assert "predicted --" in console and "no predicted speedup: the hardware profile predicts" in console
    report = "\n".join(_cell_notes(chosen.cells))
    assert "batch 1 context 128, predicted speedup `--` (2 nodes): the hardware profile predicts" in report


def test_the_speedup_plot_marks_the_sizes_without_a_prediction():
    from roofline.plots import measured_speedup_figure

    df = hand_sweep()
    row = (df["batch"] == 1) & (df["context"] == 128) & (df["nodes"] == 2)
    df.loc[row, "predicted_overhead"] = 0.9
    df.loc[row, "predicted_speedup"] = np.nan
    fig = measured_speedup_figure(df, select(df, PROPOSAL))
    marked = [
        tuple(p)
        for ax in fig.axes
        for coll in ax.collections
        if getattr(coll, "get_paths", None) and coll.get_offsets().shape[0]
        for p in np.asarray(coll.get_offsets())
        if tuple(p) == (2.0, 1.0)
    ]
    assert marked, "the 2-node tree without a prediction is marked at speedup 1"
    legend = fig.axes[-1].get_legend()
    assert any("no prediction" in t.get_text() for t in legend.get_texts())
