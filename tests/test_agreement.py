"""treeopt.agreement: whether runs' selections agree within δ, by three readings, on run
folders written by hand with known speedups (the expected verdicts are worked out below)."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from treeopt.agreement import compare_runs, triple_agreement, within_by_intervals
from treeopt.errors import UserError
from treeopt.selection import read_round_samples, write_round_samples

SIZES = [0, 1, 4]
TAU = {0: 1.0, 1: 1.6, 4: 2.0}


def write_run(folder, picks: dict, speedups: dict, *, noise=0.002, rounds=20, samples=True, tolerance=0.05):
    """A run folder: `picks` {(batch, context): nodes}, `speedups` {(batch, context): {nodes:
    speedup}}. Step times T(0) = 1 ms, T(n) = T(0)·τ(n)/speedup(n), times lognormal noise."""
    folder.mkdir(parents=True)
    cells = [{"batch": b, "context": c, "nodes": n} for (b, c), n in picks.items()]
    (folder / "selection.json").write_text(json.dumps({"cells": cells, "tolerance": tolerance}))
    rows, groups = [], {}
    rng = np.random.default_rng(sum(map(ord, folder.name)))  # the same draws wherever tmp_path is
    for (b, c), speed in speedups.items():
        times = np.array([1e-3 * TAU[n] / speed[n] for n in SIZES])
        groups[(b, c)] = (SIZES, times * np.exp(noise * rng.standard_normal((rounds, len(SIZES)))))
        rows += [
            f"{b},{c},{n},{TAU[n]},0,{speed[n]},{t},{t / times[0]},{0.95 * t / times[0]},{1.05 * t / times[0]},0"
            for n, t in zip(SIZES, times, strict=True)
        ]
    (folder / "sweep.csv").write_text(
        "batch,context,nodes,tau,tau_se,speedup,step_time_s,overhead,overhead_lo,overhead_hi,unreliable\n"
        + "\n".join(rows)
        + "\n"
    )
    (folder / "sweep.meta.json").write_text(json.dumps({"measurement": {"confidence": 0.95}}))
    if samples:
        write_round_samples(folder / "sweep.samples.npz", groups)
    return folder


def test_three_readings_by_hand(tmp_path):
    # cell (1, 128): A ships 1 node, B 4 nodes. A measured 1.50 and 1.60 (ratio 0.9375 < 0.95:
    # apart by A's points); B measured 1.55 and 1.58. Averaged: 1.525 and 1.59, ratio 0.959
    # (pooled: within). Noise 0.2%: each run's interval sits on its points, so A's own interval
    # of 1.50/1.60 lies below 0.95 (intervals: apart). Cell (2, 128): both ship 4 nodes.
    same = {0: 1, 1: 1.2, 4: 1.5}
    a = write_run(tmp_path / "A", {(1, 128): 1, (2, 128): 4}, {(1, 128): {0: 1, 1: 1.50, 4: 1.60}, (2, 128): same})
    b = write_run(tmp_path / "B", {(1, 128): 4, (2, 128): 4}, {(1, 128): {0: 1, 1: 1.55, 4: 1.58}, (2, 128): same})
    table = compare_runs([a, b])
    first = table.loc[(1, 128)]
    assert (first["A"], first["B"]) == (1, 4)
    assert first["run_ratios"] == pytest.approx((1.50 / 1.60, 1.55 / 1.58), abs=1e-6)
    assert first["points_ratio"] == pytest.approx(1.50 / 1.60)
    assert not first["points"]
    assert first["pooled_ratio"] == pytest.approx(1.525 / 1.59)
    assert first["pooled"]
    assert first["intervals"] is not None and not first["intervals"]
    second = table.loc[(2, 128)]
    assert second["points_ratio"] == 1.0 and second["points"] and second["intervals"] and second["pooled"]
    assert table.attrs["tolerance"] == 0.05


def test_intervals_reading_is_paired_over_rounds(tmp_path):
    # 1.57 against 1.60: ratio 0.981, within δ = 5% even with 5% noise per sample, as long as the
    # interval is the paired one; and 1.40 against 1.60 (0.875) is apart by the interval too.
    run = write_run(tmp_path / "R", {(1, 128): 4}, {(1, 128): {0: 1, 1: 1.57, 4: 1.60}}, noise=0.05, rounds=30)
    sweep = pd.read_csv(run / "sweep.csv")
    samples = read_round_samples(run / "sweep.samples.npz")
    assert within_by_intervals(sweep, samples, (1, 128), [1, 4], 0.05) is True
    far = write_run(tmp_path / "F", {(1, 128): 4}, {(1, 128): {0: 1, 1: 1.40, 4: 1.60}}, rounds=30)
    far_samples = read_round_samples(far / "sweep.samples.npz")
    assert within_by_intervals(pd.read_csv(far / "sweep.csv"), far_samples, (1, 128), [1, 4], 0.05) is False
    # and whichever of the two is the faster: here the smaller tree, 1.60 against 1.40
    low = write_run(tmp_path / "L", {(1, 128): 1}, {(1, 128): {0: 1, 1: 1.60, 4: 1.40}}, rounds=30)
    low_samples = read_round_samples(low / "sweep.samples.npz")
    assert within_by_intervals(pd.read_csv(low / "sweep.csv"), low_samples, (1, 128), [1, 4], 0.05) is False
    assert within_by_intervals(sweep, {}, (1, 128), [1, 4], 0.05) is None


def test_triple_agreement_counts_the_issue_check(tmp_path):
    even = {(1, 128): {0: 1, 1: 1.60, 4: 1.60}}
    quiet = write_run(tmp_path / "quiet", {(1, 128): 4}, even)
    loaded_a = write_run(tmp_path / "la", {(1, 128): 4}, {(1, 128): {0: 1, 1: 1.50, 4: 1.60}})
    loaded_b = write_run(tmp_path / "lb", {(1, 128): 1}, even)
    got = triple_agreement([quiet, loaded_a, loaded_b])
    # A measured 1 node 1.50/1.60 = 0.9375 of 4 nodes (apart by its own interval), so the loaded
    # runs disagree, although the three runs' speedups averaged, 1.5667 and 1.60 (0.979), are
    # within δ: a cell counts only where the loaded pair agrees
    assert got == {"cells": 1, "loaded_pair": 0, "points": 0, "missed_points": [(1, 128)], "intervals": 0, "pooled": 0}
    assert bool(compare_runs([quiet, loaded_a, loaded_b]).loc[(1, 128), "pooled"])
    # noisy loaded runs 1.50/1.60 = 0.9375 apart by their points, but 6% noise per sample
    # leaves each paired interval reaching 0.95: the loaded pair agrees by its intervals, and
    # only the points reading (not the pair's rule) misses the cell
    noisy = {(1, 128): {0: 1, 1: 1.50, 4: 1.60}}
    na = write_run(tmp_path / "na", {(1, 128): 4}, noisy, noise=0.06)
    nb = write_run(tmp_path / "nb", {(1, 128): 1}, noisy, noise=0.06)
    near = triple_agreement([quiet, na, nb])
    assert (near["loaded_pair"], near["points"], near["intervals"]) == (1, 0, 1)
    twin = shutil.copytree(loaded_b, tmp_path / "lb2")
    agree = triple_agreement([quiet, loaded_b, twin])
    assert (agree["loaded_pair"], agree["points"], agree["intervals"], agree["pooled"]) == (1, 1, 1, 1)


def test_missing_files_are_one_line_naming_the_file(tmp_path):
    run = write_run(tmp_path / "A", {(1, 128): 4}, {(1, 128): {0: 1, 1: 1.5, 4: 1.6}})
    with pytest.raises(UserError, match="nowhere/selection.json: not found"):
        compare_runs([run, tmp_path / "nowhere"])
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "selection.json").write_text("{}")
    with pytest.raises(UserError, match="B/selection.json: not a selection"):
        compare_runs([run, tmp_path / "B"])
    other = write_run(tmp_path / "C", {(2, 128): 4}, {(2, 128): {0: 1, 1: 1.5, 4: 1.6}})
    with pytest.raises(UserError, match="C: has no cell batch 1, context 128"):
        compare_runs([run, other])


def test_study_alternates_runs_and_reports_every_triple(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import selection_under_load as study

    assert study.run_names(2, 3) == ["quiet-1", "loaded-1", "quiet-2", "loaded-2", "loaded-3"]
    speeds = {(1, 128): {0: 1, 1: 1.50, 4: 1.62}}
    for name, pick in (("quiet-1", 4), ("loaded-1", 4), ("loaded-2", 1)):
        write_run(tmp_path / "runs" / name, {(1, 128): pick}, speeds)
    done = {n: {"seconds": 80.0, "device": "Test CPU"} for n in ("quiet-1", "loaded-1", "loaded-2")}
    text = study.write_index(tmp_path, done)
    assert (tmp_path / "index.md").read_text() == text
    assert "Device: Test CPU. Seconds per run: quiet-1 80, loaded-1 80, loaded-2 80." in text
    # one triple; the loaded runs ship 4 and 1 nodes, 1.50/1.62 = 0.926 apart: no cell agrees
    assert "| quiet-1 | loaded-1, loaded-2 | 0/1 | 0/1 | 0/1 | 0/1 | 1/128 |" in text
    assert "| 1 | 128 | 1, 4 | 0.926 | NO | 0.926 | 0.926, 0.926, 0.926 |" in text
    # the runs' step times are the same: the load changed nothing; one quiet run has no quiet pair
    assert "median 1.000, from 1.000 to 1.000." in text
    assert "two quiet ones --, two loaded ones 0.000, a quiet and a loaded one 0.000." in text


def test_study_counts_the_intervals_that_hold_the_mean_of_all_runs(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import selection_under_load as study

    # T(n)/T(0) = τ(n)/speedup(n): 1.0 and 1.25 in two runs; a third run's trees cost 10% more
    # (speedups / 1.1), so the mean of the three is 1.0333 and 1.2917. Each run's interval is
    # its point ±5% (write_run): the first two hold the mean (0.95–1.05 and 1.1875–1.3125), the
    # third (1.045–1.155 and 1.306–1.444) does not: 4 of the 6 (run, size) pairs.
    even = {(1, 128): {0: 1, 1: 1.6, 4: 1.6}}
    slow = {(1, 128): {0: 1, 1: 1.6 / 1.1, 4: 1.6 / 1.1}}
    quiet = [write_run(tmp_path / "q1", {(1, 128): 1}, even), write_run(tmp_path / "q2", {(1, 128): 1}, even)]
    loaded = [write_run(tmp_path / "l1", {(1, 128): 1}, slow)]
    lines = study.load_effect(quiet, loaded)
    assert lines[0].startswith("- One run's 95.0% interval of T(n)/T(0) holds the mean over all 3 runs in 66.7% of 6 ")
    # the busy run's steps: T(0) as quiet, the trees 1.1x: median over the three rows 1.100
    assert "median 1.100, from 1.000 to 1.100." in lines[1]
    # trees 30% dearer in the busy run: the mean, 1.1 and 1.375, lies above both quiet intervals
    # and below both of the busy run's (1.235–1.365, 1.544–1.706): none of the 6 holds it
    slower = [write_run(tmp_path / "l2", {(1, 128): 1}, {(1, 128): {0: 1, 1: 1.6 / 1.3, 4: 1.6 / 1.3}})]
    assert " in 0.0% of 6 " in study.load_effect(quiet, slower)[0]
