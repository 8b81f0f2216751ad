"""Selection from a sweep (treeopt.selection): argmax per (batch, context) with the smallest
size on ties, "no speculation" below the threshold, by measured / predicted / end-to-end
speedup, the regret of choosing by prediction, sweep-file validation, and `treeopt select`."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from treeopt.errors import UserError
from treeopt.selection import SWEEP_COLUMNS, add_intervals, measured_speedup, prediction_regret, read_sweep
from treeopt.selection import select as _select
from treeopt.stats import same_round_ratios
from treeopt.tree import make_tree

PROPOSAL = make_tree([[0], [1], [0, 0], [2], [0, 1]])


def select(*args, **kwargs) -> dict:
    """The selection's `treeopt.selection/v1` document: what these tests read."""
    return _select(*args, **kwargs).to_json()


TAU = {0: 1.0, 1: 1.6, 2: 2.1, 4: 2.6}
# (batch, context) -> {nodes: (measured speedup, predicted speedup)}
CELLS = {
    (1, 128): {0: (1.0, 1.0), 1: (1.5, 1.4), 2: (1.8, 1.7), 4: (1.6, 1.9)},
    (1, 512): {0: (1.0, 1.0), 1: (0.9, 0.8), 2: (0.95, 0.9), 4: (1.0, 0.95)},
    (4, 128): {0: (1.0, 1.0), 1: (1.3, 1.1), 2: (1.3, 1.2), 4: (1.2, 1.2)},
    (4, 512): {0: (1.0, 1.0), 1: (1.1, 1.0), 2: (1.05, 1.2), 4: (0.7, 1.25)},
}


def hand_sweep() -> pd.DataFrame:
    rows = []
    for (b, s), cell in CELLS.items():
        for n, (meas, pred) in cell.items():
            rows.append(
                {
                    "batch": b,
                    "context": s,
                    "nodes": n,
                    "tau": TAU[n],
                    "tau_independent": TAU[n],
                    "overhead": TAU[n] / meas,
                    "speedup": meas,
                    "predicted_overhead": TAU[n] / pred,
                    "predicted_speedup": pred,
                    "step_time_s": 0.01 * TAU[n] / meas,
                }
            )
    return pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS)


def write_sweep(tmp_path, df=None, meta=None, name="sweep.csv"):
    path = tmp_path / name
    (hand_sweep() if df is None else df).to_csv(path, index=False)
    meta = (
        {"format": "treeopt.sweep/v1", "model": "tiny", "device": "cpu", "proposal": PROPOSAL.to_choices()}
        if meta is None
        else meta
    )
    if meta is not False:
        path.with_name(path.stem + ".meta.json").write_text(json.dumps(meta))
    return path


def by_cell(doc):
    return {(c["batch"], c["context"]): c for c in doc["cells"]}


def test_select_measured_argmax_threshold_and_ties():
    doc = select(hand_sweep(), PROPOSAL, hardware="cpu-test", model="tiny")
    assert doc["format"] == "treeopt.selection/v1"
    assert doc["hardware"] == "cpu-test" and doc["model"] == "tiny" and doc["selected_by"] == "measured"
    assert [(c["batch"], c["context"]) for c in doc["cells"]] == sorted(CELLS)
    cells = by_cell(doc)
    # argmax; nothing beats 1.0 (1.0 itself does not); tie 1.3 / 1.3 -> the smaller tree
    assert {k: c["nodes"] for k, c in cells.items()} == {(1, 128): 2, (1, 512): 0, (4, 128): 1, (4, 512): 1}
    c = cells[(1, 128)]
    assert c["speedup"] == 1.8 and c["measured_speedup"] == 1.8 and c["predicted_speedup"] == 1.7
    assert c["tau"] == 2.1 and c["overhead"] == pytest.approx(2.1 / 1.8)
    assert c["medusa_choices"] == [[0], [1]] == PROPOSAL.prefix(2).to_choices()
    assert c["measured_by"] == "step latency"
    none = cells[(1, 512)]
    assert none["medusa_choices"] == [] and none["speedup"] == 1.0
    assert none["measured_speedup"] == 1.0 and none["predicted_speedup"] == 1.0
    assert cells[(4, 512)]["measured_speedup"] == 1.1 and cells[(4, 512)]["predicted_speedup"] == 1.0
    json.dumps(doc, allow_nan=False)  # strict JSON

    # a higher threshold leaves only the 1.8x cell
    doc = select(hand_sweep(), PROPOSAL, threshold=1.7)
    assert [c["nodes"] for c in doc["cells"]] == [2, 0, 0, 0] and doc["threshold"] == 1.7


def test_select_by_prediction():
    doc = select(hand_sweep(), PROPOSAL, by="predicted")
    cells = by_cell(doc)
    # predicted: 1.9 at 4; nothing > 1; tie 1.2 / 1.2 -> 2; 1.25 at 4
    assert {k: c["nodes"] for k, c in cells.items()} == {(1, 128): 4, (1, 512): 0, (4, 128): 2, (4, 512): 4}
    assert cells[(1, 128)]["speedup"] == 1.9 and cells[(1, 128)]["predicted_speedup"] == 1.9
    assert cells[(1, 128)]["measured_speedup"] == 1.6  # what that choice really measured
    assert cells[(1, 128)]["overhead"] == pytest.approx(2.6 / 1.9)
    assert cells[(4, 512)]["measured_speedup"] == 0.7
    assert cells[(1, 128)]["medusa_choices"] == PROPOSAL.prefix(4).to_choices()
    assert doc["selected_by"] == "predicted" and "prediction" in doc["source"]

    no_pred = hand_sweep().drop(columns=["predicted_speedup", "predicted_overhead"])
    with pytest.raises(UserError, match="no predicted speedups"):
        select(no_pred, PROPOSAL, by="predicted")
    doc = select(no_pred, PROPOSAL)  # measured works; cells then carry no predicted figure
    assert all("predicted_speedup" not in c for c in doc["cells"])
    with pytest.raises(UserError, match="--by"):
        select(hand_sweep(), PROPOSAL, by="fastest")


def test_select_end_to_end_where_measured():
    df = hand_sweep()
    e2e = {0: 1.0, 1: 1.1, 2: 1.05, 4: 1.25}
    cell = (df["batch"] == 1) & (df["context"] == 128)
    df.loc[cell, "e2e_speedup"] = df.loc[cell, "nodes"].map(e2e)
    # a cell with end-to-end numbers for only some sizes keeps the step-based speedup
    part = (df["batch"] == 4) & (df["context"] == 128) & (df["nodes"] == 4)
    df.loc[part, "e2e_speedup"] = 9.0
    speed, how = measured_speedup(df)
    assert speed[cell].tolist() == [1.0, 1.1, 1.05, 1.25]
    assert how[cell].eq("end-to-end").all() and how[~cell].eq("step latency").all()
    cells = by_cell(select(df, PROPOSAL))
    c = cells[(1, 128)]
    assert c["nodes"] == 4 and c["speedup"] == 1.25 and c["measured_speedup"] == 1.25
    assert c["measured_by"] == "end-to-end" and c["predicted_speedup"] == 1.9
    assert c["overhead"] == pytest.approx(2.6 / 1.25)  # effective: speedup = tau / overhead
    assert cells[(4, 128)]["nodes"] == 1 and cells[(4, 128)]["measured_by"] == "step latency"


def test_prediction_regret_by_hand():
    reg = prediction_regret(hand_sweep()).set_index(["batch", "context"])
    assert reg.loc[(1, 128)].to_dict() == pytest.approx(
        {
            "predicted_nodes": 4,
            "selected_nodes": 2,
            "measured_speedup_of_predicted": 1.6,
            "measured_speedup_of_selected": 1.8,
            "fraction_of_selected": 1.6 / 1.8,
        }
    )
    assert reg.loc[(1, 512)].to_dict() == pytest.approx(
        {
            "predicted_nodes": 0,
            "selected_nodes": 0,
            "measured_speedup_of_predicted": 1.0,
            "measured_speedup_of_selected": 1.0,
            "fraction_of_selected": 1.0,
        }
    )
    assert reg.loc[(4, 128)].to_dict() == pytest.approx(
        {
            "predicted_nodes": 2,
            "selected_nodes": 1,
            "measured_speedup_of_predicted": 1.3,
            "measured_speedup_of_selected": 1.3,
            "fraction_of_selected": 1.0,
        }
    )
    assert reg.loc[(4, 512)].to_dict() == pytest.approx(
        {
            "predicted_nodes": 4,
            "selected_nodes": 1,
            "measured_speedup_of_predicted": 0.7,
            "measured_speedup_of_selected": 1.1,
            "fraction_of_selected": 0.7 / 1.1,
        }
    )
    with pytest.raises(UserError, match="no predicted speedups"):
        prediction_regret(hand_sweep().drop(columns=["predicted_speedup"]))


def test_read_sweep_round_trip(tmp_path):
    path = write_sweep(tmp_path)
    df, meta = read_sweep(path)
    assert list(df.columns) == SWEEP_COLUMNS and len(df) == 16 and df.attrs["source"] == str(path)
    assert df["nodes"].dtype == np.int64 and meta["model"] == "tiny"
    assert by_cell(select(df, PROPOSAL)) == by_cell(select(hand_sweep(), PROPOSAL))
    # only the required columns: the others come back as NaN
    small = hand_sweep()[["batch", "context", "nodes", "speedup"]]
    df, _ = read_sweep(write_sweep(tmp_path, small, name="small.csv"))
    assert list(df.columns) == SWEEP_COLUMNS and df["predicted_speedup"].isna().all()
    assert [c["nodes"] for c in select(df, PROPOSAL)["cells"]] == [2, 0, 1, 1]


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing file", "no such file"),
        ("missing column", "missing column 'speedup'"),
        ("missing meta", "sweep.meta.json .*is missing"),
        ("bad meta json", "not valid JSON"),
        ("meta without proposal", "no 'proposal' tree"),
        ("bad proposal", "has no parent"),
        ("proposal too small", "rows for 4 nodes but the proposal tree"),
        ("not a number", "row 3: column 'speedup' is not a number"),
        ("no plain row", "batch 1 context 128 has no row for 0 nodes"),
        ("duplicate", "appears twice"),
        ("fractional batch", "'batch' must be an integer"),
        ("empty", "no rows"),
        ("binary", "not a sweep CSV"),
    ],
)
def test_read_sweep_errors_name_the_file(tmp_path, case, match):
    df = hand_sweep()
    meta = None
    if case == "missing column":
        df = df.drop(columns=["speedup"])
    elif case == "not a number":
        df["speedup"] = df["speedup"].astype(object)
        df.loc[1, "speedup"] = "fast"
    elif case == "no plain row":
        df = df.drop(index=0)
    elif case == "duplicate":
        df = pd.concat([df, df.iloc[[3]]])
    elif case == "fractional batch":
        df["batch"] = df["batch"].astype(float)
        df.loc[2, "batch"] = 1.5
    elif case == "empty":
        df = df.iloc[:0]
    elif case == "meta without proposal":
        meta = {"format": "treeopt.sweep/v1"}
    elif case == "bad proposal":
        meta = {"proposal": [[0, 1]]}
    elif case == "proposal too small":
        meta = {"proposal": [[0], [1]]}
    path = write_sweep(tmp_path, df, False if case == "missing meta" else meta)
    if case == "missing file":
        path = tmp_path / "nothere.csv"
    elif case == "bad meta json":
        path.with_name("sweep.meta.json").write_text("{not json")
    elif case == "binary":
        path.write_bytes(b"\xff\xfe\x00batch\n\x81\x82")
    with pytest.raises(UserError, match=match) as exc:
        read_sweep(path)
    assert path.name in str(exc.value) or "sweep.meta.json" in str(exc.value)


def test_select_cli(tmp_path, capsys):
    from treeopt.cli import main

    path = write_sweep(tmp_path)
    out = tmp_path / "sel.json"
    main(["select", "--sweep", str(path), "-o", str(out)])
    doc = json.loads(out.read_text())
    assert doc.pop("verification") == "tree"  # a sweep without the key was measured before candidates existed
    # no pooled fit: the sweep's model is not one treeopt can find
    assert doc.pop("pooled_fit") == {"skipped": "its model 'tiny' is neither built in nor found here: give --model"}
    # the chain against the tree per cell (docs/engines.md#chain-or-tree): the proposal's chain is [0]
    assert doc.pop("chain_or_tree")["chain_nodes_measured"] == 1
    assert doc == json.loads(json.dumps(select(read_sweep(path)[0], PROPOSAL, hardware="cpu", model="tiny")))
    assert [c["nodes"] for c in doc["cells"]] == [2, 0, 1, 1]
    assert doc["cells"][0]["medusa_choices"] == [[0], [1]]
    assert "wrote" in capsys.readouterr().out

    # the verification a sweep was measured with travels into the selection; another is refused
    meta = {"format": "treeopt.sweep/v1", "model": "tiny", "device": "cpu", "proposal": PROPOSAL.to_choices()}
    candidates = write_sweep(tmp_path, meta=meta | {"verification": "candidates"}, name="cand.csv")
    main(["select", "--sweep", str(candidates), "-o", str(out)])
    assert json.loads(out.read_text())["verification"] == "candidates"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["select", "--sweep", str(candidates), "--verification", "tree", "-o", str(tmp_path / "no.json")])
    assert exc.value.code == 2 and not (tmp_path / "no.json").exists()
    assert "cand.csv was measured with candidates verification" in capsys.readouterr().err

    main(["select", "--sweep", str(path), "--by", "predicted", "-o", str(out)])
    assert [c["nodes"] for c in json.loads(out.read_text())["cells"]] == [4, 0, 2, 4]
    capsys.readouterr()

    bad_col = write_sweep(tmp_path, hand_sweep().drop(columns=["nodes"]), name="bad.csv")
    no_meta = write_sweep(tmp_path, meta=False, name="lonely.csv")
    no_pred = write_sweep(tmp_path, hand_sweep().drop(columns=["predicted_speedup"]), name="nopred.csv")
    for args, name in (
        [["--sweep", str(tmp_path / "missing.csv")], "missing.csv"],
        [["--sweep", str(bad_col)], "bad.csv"],
        [["--sweep", str(no_meta)], "lonely.csv"],
        [["--sweep", str(no_pred), "--by", "predicted"], "nopred.csv"],
    ):
        target = tmp_path / "new.json"
        with pytest.raises(SystemExit) as exc:
            main(["select", *args, "-o", str(target)])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("treeopt: error: ") and name in err[0], err
        assert not target.exists()
        assert not list(tmp_path.glob(".new.json.*"))  # no temporary file either


def interval_sweep(x, tau):
    """A one-cell sweep table from per-round step times `x` (rounds, sizes 0, 1, 2, 4)."""
    overhead = np.median(same_round_ratios(x), axis=0)
    nodes = [0, 1, 2, 4]
    df = pd.DataFrame(
        {
            "batch": 1,
            "context": 128,
            "nodes": nodes,
            "tau": tau,
            "tau_se": 0.0,
            "overhead": overhead,
            "speedup": np.asarray(tau) / overhead,
            "samples": len(x),
            "unreliable": 0,
        }
    ).reindex(columns=SWEEP_COLUMNS)
    samples = {(1, 128): (nodes, np.asarray(x))}
    return add_intervals(df, samples), samples


def test_ties_resolve_to_the_smaller_tree():
    # 12 rounds; sizes 2 and 4 swing +-1% in opposite directions round by round, so their
    # medians are exactly 1.25 and 1.5 x plain: speedups 2.0 / 1.25 = 1.6 and 2.412 / 1.5 =
    # 1.608. Their paired ratio is at worst 1.6 / 1.608 x 0.99 / 1.01 = 0.975, within the 5%
    # tolerance: the smaller tree is as good as the best, and chosen
    swing = np.array([1.01, 0.99] * 6)
    x = np.column_stack([np.full(12, 0.010), np.full(12, 0.010), 0.0125 * swing, 0.0150 * swing[::-1]])
    df, samples = interval_sweep(x, [1.0, 1.3, 2.0, 2.412])
    cell = select(df, PROPOSAL, samples=samples)["cells"][0]
    assert cell["nodes"] == 2 and cell["reason"] == "within-tolerance" and cell["best_nodes"] == 4
    # a swing of +-2% puts the worst ratio at 0.956: at a 3% tolerance the data cannot say
    # the smaller tree is as good, and the best point estimate ships, undecided
    wide = np.array([1.02, 0.98] * 6)
    x2 = np.column_stack([np.full(12, 0.010), np.full(12, 0.010), 0.0125 * wide, 0.0150 * wide[::-1]])
    df2, samples2 = interval_sweep(x2, [1.0, 1.3, 2.0, 2.412])
    cell = select(df2, PROPOSAL, samples=samples2, tolerance=0.03)["cells"][0]
    assert cell["nodes"] == 4 and cell["reason"] == "undecided"
    # at the default 5% the same data settle on the smaller tree
    cell = select(df2, PROPOSAL, samples=samples2)["cells"][0]
    assert cell["nodes"] == 2 and cell["reason"] == "within-tolerance"
    # 4 nodes 25% ahead: the best
    df, samples = interval_sweep(x, [1.0, 1.3, 2.0, 3.0])
    cell = select(df, PROPOSAL, samples=samples)["cells"][0]
    assert cell["nodes"] == 4 and cell["reason"] == "best" and cell["rounds"] == 12
    assert cell["speedup_lo"] <= cell["speedup"] == 2.0 <= cell["speedup_hi"]


def test_select_from_a_grid_file_with_ruled_out_rows(tmp_path, capsys):
    """A grid as `treeopt roofline speedup -o` writes it: rows that do not fit in memory, or
    trees the engine does not draft, have empty times and speedups, and select skips them."""
    from treeopt.cli import main

    acc = tmp_path / "acc.json"
    # one head of width 2: the proposal is [0], then [1]
    head = {"head": 1, "positions": 100, "hits": [50, 20]}
    acc.write_text(json.dumps({"format": "treeopt.accuracy/v1", "num_heads": 1, "width": 2, "heads": [head]}))
    grid = tmp_path / "grid.csv"
    grid.write_text(
        "batch,context,nodes,tau,step_time_s,overhead,speedup,fits_memory\n"
        # batch 1: 2 nodes is best (1.6 / 1.1)
        "1,128,0,1,0.01,1,1,True\n"
        "1,128,1,1.5,0.0105,1.05,1.428571,True\n"
        "1,128,2,1.7,0.011,1.1,1.545455,True\n"
        # batch 8: the 2-node tree is ruled out (not drafted), so 1 node wins
        "8,128,0,1,0.02,1,1,True\n"
        "8,128,1,1.5,0.025,1.25,1.2,True\n"
        "8,128,2,1.7,,,,True\n"
        # batch 64: the tree sizes do not fit, plain decoding does: no speculation
        "64,128,0,1,0.05,1,1,True\n"
        "64,128,1,1.5,,,,False\n"
        "64,128,2,1.7,,,,False\n"
        # batch 512: not even plain decoding fits
        "512,128,0,1,,,,False\n"
        "512,128,1,1.5,,,,False\n"
        "512,128,2,1.7,,,,False\n"
    )
    out = tmp_path / "sel.json"
    main(["select", "--grid", str(grid), "--accuracy", str(acc), "-o", str(out)])
    doc = json.loads(out.read_text())
    assert [(c["batch"], c["nodes"]) for c in doc["cells"]] == [(1, 2), (8, 1), (64, 0)]
    assert doc["cells"][0]["medusa_choices"] == [[0], [1]] and doc["cells"][1]["medusa_choices"] == [[0]]
    assert doc["cells"][0]["speedup"] == pytest.approx(1.545455)
    assert doc["out_of_memory"] == [{"batch": 512, "context": 128}]
    assert doc["verification"] == "tree"  # a grid does not say; the user does
    main(["select", "--grid", str(grid), "--accuracy", str(acc), "--verification", "candidates", "-o", str(out)])
    assert json.loads(out.read_text())["verification"] == "candidates"
    capsys.readouterr()

    damaged = tmp_path / "damaged.csv"
    damaged.write_text(grid.read_text().replace("1,1.5,0.0105,1.05,1.428571", "1,1.5,0.0105,1.05,fast"))
    infinite = tmp_path / "infinite.csv"
    infinite.write_text(grid.read_text().replace("1,1.5,0.0105,1.05,1.428571", "1,1.5,0.0105,1.05,inf"))
    no_tau = tmp_path / "no_tau.csv"
    no_tau.write_text(grid.read_text().replace("8,128,1,1.5,", "8,128,1,,"))
    for path, words in ((damaged, "row 3: column 'speedup'"), (infinite, "row 3"), (no_tau, "row 6: column 'tau'")):
        target = tmp_path / "new.json"
        with pytest.raises(SystemExit) as exc:
            main(["select", "--grid", str(path), "--accuracy", str(acc), "-o", str(target)])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and path.name in err[0] and words in err[0], err
        assert not target.exists()
