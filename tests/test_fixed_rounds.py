"""A decision from a sweep that cannot be measured again (issue 47,
docs/statistics.md#a-sweep-that-cannot-be-measured-again): on hand-built cells whose bootstrap
bounds follow by hand, the fixed-round rule ships the tree of best worst-case paired bound,
lists the trees it is not shown to be within the tolerance of, and stays undecided only where
no tree beats plain decoding at its lower bound; `treeopt select` applies it to a sweep file
on its own; a tree bigger than another is never priced as stepping faster than it. The
nondecreasing fit is checked against scipy's isotonic regression, and on noisy cells with two
trees a known amount apart the rule ships the faster. benchmarks/bench_fixed_rounds.py measures
it on synthetic sweeps with known truth."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import isotonic_regression

from treeopt.cli import main
from treeopt.selection import SWEEP_COLUMNS, add_intervals, select, write_round_samples
from treeopt.selection_types import selection_from_json
from treeopt.stats import bootstrap_speedups, decide_cell, interval, nondecreasing, shipped_confidence
from treeopt.tree import make_tree

PROPOSAL = make_tree([[0], [1], [0, 0], [2], [0, 1]])
NODES = [0, 1, 2, 4]


def one_cell(steps: np.ndarray, tau) -> tuple[pd.DataFrame, dict]:
    """A one-cell sweep (batch 1, context 128) from per-round step times (rounds, sizes 0, 1, 2, 4)."""
    overhead = np.median(steps / steps[:, :1], axis=0)
    df = pd.DataFrame(
        {
            "batch": 1,
            "context": 128,
            "nodes": NODES,
            "tau": tau,
            "tau_se": 0.0,
            "overhead": overhead,
            "speedup": np.asarray(tau) / overhead,
            "samples": len(steps),
            "unreliable": 0,
        }
    ).reindex(columns=SWEEP_COLUMNS)
    samples = {(1, 128): (NODES, steps)}
    return add_intervals(df, samples), samples


def near_tie() -> tuple[pd.DataFrame, dict]:
    """12 rounds: plain 10 ms, 1 node 10 ms (speedup 1.3 exactly), 2 nodes 12.5 ms (1.6), 4 nodes
    15 ms x (1 - 0.1) in six rounds and x (1 + 0.1) in the other six (tau 2.475: 1.833 or 1.5,
    the median 15 ms gives 1.65). A resample's median of 4 nodes' ratio is 1.35 or 1.65 when one
    kind of round is the majority (probability 0.387 each), so the 2.5% lower bounds are the
    extreme rounds': speedup(4) / speedup(2) >= 1.5 / 1.6 = 0.9375 and speedup(2) / speedup(4)
    >= 1.6 / 1.8333 = 0.8727; against 1 node and plain decoding both are far above 1."""
    swing = np.array([0.9, 1.1] * 6)
    steps = np.column_stack([np.full(12, 0.010), np.full(12, 0.010), np.full(12, 0.0125), 0.015 * swing])
    return one_cell(steps, [1.0, 1.3, 2.0, 2.475])


def test_a_near_tie_ships_the_best_worst_case_bound_and_names_the_open_rival():
    df, samples = near_tie()
    # more rounds could still change it: 2 nodes are not shown within 5% of 4 (0.873), nor 4 of 2 (0.9375)
    strict = select(df, PROPOSAL, samples=samples).cells[0]
    assert strict.reason == "undecided"
    fixed = select(df, PROPOSAL, samples=samples, fixed_rounds=True)
    cell = fixed.cells[0]
    assert (cell.nodes, cell.reason) == (4, "best bound")
    assert cell.bound == pytest.approx(1.5 / 1.6, rel=1e-6)  # worst(4) = 0.9375 > worst(2) = 0.8727
    assert cell.open_nodes == (2,)  # the one rival it is not shown within 5% of
    assert cell.rounds_needed is not None  # what more rounds would settle is still said
    assert fixed.rule.undecided == ()
    # the typed selection keeps them through its JSON, and the summary says what was guaranteed
    again = selection_from_json(json.loads(json.dumps(fixed.to_json())))
    assert again.cells[0].bound == cell.bound and again.cells[0].open_nodes == (2,)
    from treeopt.selection_text import format_selection

    text = format_selection(fixed)
    assert "DECIDED ON FIXED ROUNDS" in text and "no tree more than 7% faster, not shown as good as 2 nodes" in text


def test_every_rival_bounds_the_answer_the_smallest_tree_too():
    # 1 node 1.6 in every round, 2 nodes 1.5, 4 nodes 1.65 swinging +-10% (1.5 or 1.833) with no
    # partner: against 2 nodes, 4 is never worse (bound 1.0), but against 1 node its bound is
    # 1.5 / 1.6 = 0.9375, below 1 - 5%. worst(4) = 0.9375 > worst(1) = 1.6 / 1.833 = 0.873 >
    # worst(2) = 1.5 / 1.833 = 0.818: 4 nodes ship, their bound set by the smallest tree
    swing = np.array([0.9, 1.1] * 6)
    steps = np.column_stack([np.full(12, 0.010), np.full(12, 0.010), np.full(12, 0.0125), 0.015 * swing])
    df, samples = one_cell(steps, [1.0, 1.6, 1.875, 2.475])
    cell = select(df, PROPOSAL, samples=samples, fixed_rounds=True).cells[0]
    assert (cell.nodes, cell.reason, cell.open_nodes) == (4, "best bound", (1,))
    assert cell.bound == pytest.approx(1.5 / 1.6, rel=1e-6)


def test_a_settled_cell_is_the_same_under_either_rule():
    # 4 nodes 25% ahead of 2 in every round: settled by the usual rule, untouched
    swing = np.array([1.01, 0.99] * 6)
    steps = np.column_stack([np.full(12, 0.010), np.full(12, 0.010), 0.0125 * swing, 0.0150 * swing[::-1]])
    df, samples = one_cell(steps, [1.0, 1.3, 2.0, 3.0])
    strict, fixed = (select(df, PROPOSAL, samples=samples, fixed_rounds=f).cells[0] for f in (False, True))
    assert strict == fixed and (fixed.nodes, fixed.reason) == (4, "best")


def test_undecided_stays_where_no_tree_beats_plain_decoding_at_its_lower_bound():
    # every tree swings +-30% round by round around a speedup of 1.05-1.10: no tree's lower bound
    # clears 1 (1.10 / 1.3 < 1), nor is plain decoding shown within 5% of them (1 / (1.10 / 0.7))
    swing = np.array([0.7, 1.3] * 6)
    steps = np.column_stack([np.full(12, 0.010), 0.010 * swing, 0.010 * swing[::-1], 0.010 * swing])
    df, samples = one_cell(steps, [1.0, 1.05, 1.08, 1.10])
    cell = select(df, PROPOSAL, samples=samples, fixed_rounds=True).cells[0]
    assert (cell.nodes, cell.reason) == (0, "undecided")


def test_select_decides_a_sweep_file_on_its_rounds_unless_told_to_keep_it_open(tmp_path, monkeypatch, capsys):
    df, samples = near_tie()
    monkeypatch.chdir(tmp_path)
    df.to_csv("sweep.csv", index=False)
    meta = {
        "format": "treeopt.sweep/v1",
        "proposal": [list(p) for p in PROPOSAL.paths],
        "measurement": {"sizes": NODES, "repeats": 12, "confidence": 0.95},
    }
    (tmp_path / "sweep.meta.json").write_text(json.dumps(meta))
    write_round_samples(tmp_path / "sweep.samples.npz", samples)
    main(shlex.split("select --sweep sweep.csv --no-pooled -o fixed.json"))
    main(shlex.split("select --sweep sweep.csv --no-pooled --keep-undecided -o open.json"))
    capsys.readouterr()
    fixed = json.loads((tmp_path / "fixed.json").read_text())
    kept = json.loads((tmp_path / "open.json").read_text())
    assert (fixed["cells"][0]["nodes"], fixed["cells"][0]["reason"], fixed["cells"][0]["open_nodes"]) == (
        4,
        "best bound",
        [2],
    )
    assert kept["cells"][0]["reason"] == "undecided" and kept["undecided"] == [{"batch": 1, "context": 128}]


def bigger_tree_dips() -> tuple[pd.DataFrame, dict]:
    """12 rounds: plain 10 ms; 1 node 12 ms (T/T0 1.2, tau 1.8: speedup 1.5); 2 nodes 10 ms and
    15 ms in alternate rounds (tau 1.9; a resample's median ratio is 1.0 or 1.5 when one kind
    is the majority, probability 0.387 each, 1.25 at six and six: speedup 1.9, 1.267 or 1.52);
    4 nodes 30 ms (tau 2: 0.67, below plain decoding, no rival)."""
    swing = np.array([1.0, 1.5] * 6)
    steps = np.column_stack([np.full(12, 0.010), np.full(12, 0.012), 0.010 * swing, np.full(12, 0.030)])
    return one_cell(steps, [1.0, 1.8, 1.9, 2.0])


def test_a_bigger_tree_is_never_priced_as_stepping_faster_than_a_smaller_one():
    df, samples = bigger_tree_dips()
    # by the rounds alone: speedup(1) / speedup(2) >= 1.5 / 1.9 = 0.789 and speedup(2) /
    # speedup(1) >= 1.267 / 1.5 = 0.844, so the worst-case bound would ship 2 nodes; but the
    # resamples where 2 nodes step at 1.0 < 1.2 price them below 1 node, which does less work.
    # Fitted nondecreasing there (both at the geometric mean of 1.0 and 1.2), speedup(1) /
    # speedup(2) is tau's ratio 1.8 / 1.9 = 0.947 in them: 1 node's worst bound 0.947 beats 0.844
    assert select(df, PROPOSAL, samples=samples).cells[0].reason == "undecided"
    cell = select(df, PROPOSAL, samples=samples, fixed_rounds=True).cells[0]
    assert (cell.nodes, cell.reason, cell.open_nodes) == (1, "best bound", (2,))
    assert cell.bound == pytest.approx(1.8 / 1.9, rel=1e-6)


def test_a_size_the_sweep_flagged_is_left_out_of_the_order():
    # the same trees one size up, below them a flagged size measured at 1.6 in every round: left
    # out, 2 nodes ship against 4 with bound 1.8 / 1.9 as above. Fitted in (wrongly), it would
    # pull the others up with it and 4 nodes would ship (worst bound 0.975 against 0.947)
    swing = np.array([1.0, 1.5] * 6)
    steps = np.column_stack([np.full(12, 0.010), np.full(12, 0.016), np.full(12, 0.012), 0.010 * swing])
    df, samples = one_cell(steps, [1.0, 1.7, 1.8, 1.9])
    df.loc[df["nodes"] == 1, "unreliable"] = 1
    cell = select(df, PROPOSAL, samples=samples, fixed_rounds=True).cells[0]
    assert (cell.nodes, cell.reason, cell.open_nodes) == (2, "best bound", (4,))
    assert cell.bound == pytest.approx(1.8 / 1.9, rel=1e-6)


def test_the_nondecreasing_fit_is_the_isotonic_regression():
    assert nondecreasing([1.0, 3.0, 2.0]).tolist() == [1.0, 2.5, 2.5]  # by hand: pool the violators
    assert nondecreasing([3.0, 2.0, 1.0]).tolist() == [2.0, 2.0, 2.0]
    rows = np.random.default_rng(3).normal(size=(200, 7))
    expected = np.array([isotonic_regression(r).x for r in rows])
    np.testing.assert_allclose(nondecreasing(rows), expected, atol=1e-12)


@pytest.mark.parametrize("faster", [1, 2])
def test_of_two_trees_a_known_amount_apart_the_faster_ships(faster):
    # plain decoding and two trees whose true speedups are 1.5 and 1.5 x 0.85 (the faster either
    # the smaller or the bigger tree; T(n)/T(0) 1.07 and 1.49, or 1.25 and 1.27), measured as a
    # shared machine does: one drift per round (lognormal, sigma 0.3) times 15% noise per
    # sample, 15 rounds, tau exact. The paired log-ratio of the two medians has a standard error
    # of about 1.2533 x 0.15 x sqrt(2) / sqrt(15) = 0.069, so the data put the slower ahead with
    # probability about Phi(-ln(1 / 0.85) / 0.069) = 0.9%: the slower ships in at most 4 of 120
    # cells, and plain decoding (a third slower) in none
    tau = np.array([1.0, 1.6, 1.9])
    speedup = np.array([1.0, 1.5, 1.5]) * np.where(np.arange(3) == faster, 1.0, 0.85)
    overhead = tau / speedup
    overhead[0] = 1.0
    rng = np.random.default_rng(faster)
    shipped = []
    for seed in range(120):
        drift = np.exp(rng.normal(0.0, 0.3, size=(15, 1)))
        steps = 0.01 * overhead * drift * np.exp(rng.normal(0.0, 0.15, size=(15, 3)))
        draws = bootstrap_speedups(steps, tau, None, seed=seed, draws=1000)
        lo, hi = interval(draws.speedup, shipped_confidence(0.95, 2))
        got = decide_cell(
            draws.speedup_point, lo, hi, [True] * 3, draws=draws.speedup, fixed_rounds=True, overhead=draws.overhead
        )
        shipped.append(got.index)
    assert 0 not in shipped
    assert sum(k != faster for k in shipped) <= 4
