"""Close calls of a predicted grid (treeopt/close_calls.py, docs/performance-model.md#close-calls):
per (batch, context), speculation against plain decoding and the best chain against the best
tree, with the model's stated resolution. Expected values are worked by hand from the hand-made
grid below: cost per token is T / tau, so two configurations' costs per token stand in the
inverse ratio of their speedups."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from treeopt.close_calls import close_calls, format_close_calls

ROOT = Path(__file__).resolve().parents[1]

# sizes 1 and 2 are chains, 3 and 4 trees (chain_nodes = 2)
CELLS = {
    # best chain 2 (1.15x), best tree 3 (1.30x): 1.30 / 1.15 - 1 = 13.04% apart; speculation
    # 1.30x against plain: 30% apart
    (1, 512): [1.0, 1.10, 1.15, 1.30, 1.28],
    # best speculation 4 nodes (1.02x): 2% over plain; best chain 0.97x, tree 1.02x: 5.15% apart
    (8, 512): [1.0, 0.95, 0.97, 0.90, 1.02],
    # plain is 1 / 0.70 - 1 = 42.9% cheaper per token than the best (0.70x); chain and tree 1.4% apart
    (64, 512): [1.0, 0.69, 0.70, 0.60, 0.69],
}


def _grid(cells=CELLS) -> pd.DataFrame:
    rows = [
        {"batch": b, "context": s, "nodes": n, "speedup": v}
        for (b, s), speed in cells.items()
        for n, v in enumerate(speed)
    ]
    return pd.DataFrame(rows)


def test_close_calls_by_hand():
    cells = {(c["batch"], c["context"]): c for c in close_calls(_grid(), chain_nodes=2, resolution=0.10)}
    one = cells[(1, 512)]
    assert one["on_off"]["pick"] == "speculation" and one["on_off"]["gap"] == pytest.approx(0.30)
    assert not one["on_off"]["close"]
    assert one["chain_or_tree"]["pick"] == "tree" and one["chain_or_tree"]["nodes"] == {"tree": 3, "chain": 2}
    assert one["chain_or_tree"]["gap"] == pytest.approx(1.30 / 1.15 - 1, abs=1e-4)
    assert not one["chain_or_tree"]["close"]  # 13.0% > 10%
    eight = cells[(8, 512)]
    assert eight["on_off"]["pick"] == "speculation" and eight["on_off"]["nodes"]["speculation"] == 4
    assert eight["on_off"]["gap"] == pytest.approx(0.02) and eight["on_off"]["close"]
    assert eight["chain_or_tree"]["gap"] == pytest.approx(1.02 / 0.97 - 1, abs=1e-4) and eight["chain_or_tree"]["close"]
    far = cells[(64, 512)]
    assert far["on_off"]["pick"] == "plain" and far["on_off"]["gap"] == pytest.approx(1 / 0.70 - 1, abs=1e-4)
    assert not far["on_off"]["close"] and far["chain_or_tree"]["close"]
    # a wider resolution makes batch 1's chain-or-tree close too; the gap itself does not move
    wide = close_calls(_grid(), chain_nodes=2, resolution=0.15)[0]
    assert wide["chain_or_tree"]["close"] and wide["chain_or_tree"]["gap"] == one["chain_or_tree"]["gap"]


def test_only_chains_or_no_speculative_size_give_no_chain_or_tree_call():
    chains_only = close_calls(_grid(), chain_nodes=4, resolution=0.10)
    assert all("chain_or_tree" not in c for c in chains_only)
    unpriced = _grid({(1, 0): [1.0, float("nan"), float("nan")]})
    assert close_calls(unpriced, chain_nodes=1, resolution=0.10) == []


def test_one_line_per_cell_with_a_close_call_and_none_where_plain_wins_clearly():
    section = {"resolution": 0.10, "cells": close_calls(_grid(), chain_nodes=2, resolution=0.10)}
    lines = format_close_calls(section).splitlines()
    # batch 1: nothing close; batch 8: both calls; batch 64: plain wins by 42.9%, so its close
    # chain-or-tree call does not matter and is not printed
    assert lines[0].startswith("close calls, within ±10.0% per token") and "treeopt sweep" in lines[0]
    assert lines[1:] == [
        "  batch    8, on or off: context 512 speculation 4 nodes 1.02x ~ plain 1.00x",
        "  batch    8, chain or tree: context 512 tree 4 nodes 1.02x ~ chain 2 nodes 0.97x",
    ]
    assert format_close_calls({"resolution": 0.01, "cells": close_calls(_grid(), chain_nodes=2, resolution=0.01)}) == ""


def test_roofline_speedup_reports_close_calls_with_the_stored_resolution(tmp_path, capsys):
    """The command's selection carries the section, with the resolution the data file states; a
    cell whose best tree is within it of plain decoding gets its line."""
    from tests.test_engine_presets import SPEEDUP, run

    stored = json.loads((ROOT / "roofline" / "data" / "call_resolution.json").read_text(encoding="utf-8"))
    select = tmp_path / "sel.json"
    args = ("--batch", "1,128,192", "--context", "256", "--engine", "vllm", "--select", str(select))
    out = run(capsys, *SPEEDUP[:-4], *args)  # its own batches and context, not SPEEDUP's (given once)
    section = json.loads(select.read_text(encoding="utf-8"))["close_calls"]
    assert section["resolution"] == stored["fraction"]
    assert {(c["batch"], c["context"]) for c in section["cells"]} == {(1, 256), (128, 256), (192, 256)}
    assert any(c["on_off"]["close"] for c in section["cells"])  # batch 192's one node is priced near 1x
    for cell in section["cells"]:
        on_off = cell["on_off"]
        speeds = sorted(on_off["speedup"].values())
        assert on_off["close"] == (speeds[1] / speeds[0] - 1 < stored["fraction"])
        if on_off["close"]:
            assert f"  batch {cell['batch']:4d}, on or off: context {cell['context']} speculation" in out


def test_the_selection_of_a_prediction_carries_its_close_calls_by_brute_force():
    """`treeopt.select` on a prediction (Medusa's tree proposal, no engine): per cell, the best
    speculative size against plain decoding and the best chain (the proposal's first sizes up to
    its first branching node) against the best larger size, each gap worked from the grid."""
    import numpy as np

    import treeopt
    from tests.test_python_api import ACC
    from treeopt.chain_or_tree import chain_prefix_length

    prediction = treeopt.predict("vicuna-7b", "a100-80gb-sxm", ACC, batches=[1, 32], contexts=[512])
    section = treeopt.select(prediction).to_dict()["close_calls"]
    grid, chain = prediction.to_frame(), chain_prefix_length(prediction.proposal)
    assert 0 < chain < prediction.proposal.size and len(section["cells"]) == 2
    for cell in section["cells"]:
        rows = grid[(grid["batch"] == cell["batch"]) & (grid["context"] == cell["context"])]
        spec = rows[rows["nodes"] > 0]
        best = float(np.nanmax(spec["speedup"]))
        assert cell["on_off"]["gap"] == pytest.approx(max(best, 1.0) / min(best, 1.0) - 1, abs=1e-4)
        c = float(np.nanmax(spec[spec["nodes"] <= chain]["speedup"]))
        t = float(np.nanmax(spec[spec["nodes"] > chain]["speedup"]))
        assert cell["chain_or_tree"]["gap"] == pytest.approx(max(c, t) / min(c, t) - 1, abs=1e-4)
        assert cell["chain_or_tree"]["close"] == (max(c, t) / min(c, t) - 1 < section["resolution"])
