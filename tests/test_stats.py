"""Intervals and decisions of treeopt.stats against independent sources: coverage on synthetic
experiments whose true speedup is known, the second moment of a chain of accepted nodes
enumerated by hand, and the decision rules on hand-made intervals."""

from __future__ import annotations

import numpy as np
import pytest

from treeopt.stats import (
    bootstrap_speedups,
    decide_cell,
    impossible_sizes,
    interval,
    physical_speedup,
    ratio_lower_bounds,
    tau_stderr_independent_positions,
)

EXPERIMENTS = 200
CONFIDENCE = 0.95
# three binomial standard deviations of the coverage of 200 experiments at 95%
TOLERANCE = 3 * np.sqrt(CONFIDENCE * (1 - CONFIDENCE) / EXPERIMENTS)


def synthetic_rounds(rng, rounds: int, true_overhead: np.ndarray) -> np.ndarray:
    """Paired rounds: a drift common to the round (slow machine phases), times each size's own
    lognormal noise whose median is 1, so the median same-round ratio is the true overhead."""
    drift = np.exp(rng.normal(0.0, 0.3, size=(rounds, 1)))
    noise = np.exp(rng.normal(0.0, 0.05, size=(rounds, true_overhead.size)))
    return 0.01 * drift * true_overhead[None, :] * noise


def test_speedup_interval_covers_the_truth_at_the_stated_rate():
    rng = np.random.default_rng(1)
    true_overhead = np.array([1.0, 1.05, 1.3])
    tau = np.array([1.0, 1.5, 1.9])
    tau_se = np.array([0.0, 0.02, 0.03])
    truth = tau / true_overhead
    hits = np.zeros(3)
    overhead_hits = np.zeros(3)
    for e in range(EXPERIMENTS):
        x = synthetic_rounds(rng, 20, true_overhead)
        tau_hat = tau + tau_se * rng.standard_normal()  # the calibration's own error
        draws = bootstrap_speedups(x, tau_hat, tau_se, draws=1000, seed=e)
        lo, hi = interval(draws.speedup, CONFIDENCE)
        hits += (lo <= truth) & (truth <= hi)
        o_lo, o_hi = interval(draws.overhead, CONFIDENCE)
        overhead_hits += (o_lo <= true_overhead) & (true_overhead <= o_hi)
    coverage = hits[1:] / EXPERIMENTS
    assert np.all(np.abs(coverage - CONFIDENCE) <= TOLERANCE), coverage
    assert np.all(np.abs(overhead_hits[1:] / EXPERIMENTS - CONFIDENCE) <= TOLERANCE), overhead_hits


def test_drift_between_rounds_cancels_in_the_same_round_ratio():
    # a 3x slowdown of whole rounds (both steps) leaves every same-round ratio at 1.2
    x = np.array([[1.0, 1.2], [3.0, 3.6], [1.0, 1.2], [3.0, 3.6], [1.0, 1.2]])
    draws = bootstrap_speedups(x, np.array([1.0, 1.5]))
    assert draws.overhead_point[1] == pytest.approx(1.2)
    assert draws.speedup_point[1] == pytest.approx(1.25)
    assert np.allclose(draws.overhead[:, 1], 1.2)


def test_tau_standard_error_by_enumeration():
    # chain [0], [0, 0] with P(head 1 right) = a, P(head 2 right | head 1) = b: accepted nodes
    # M = 0, 1, 2 with probabilities 1 - a, a (1 - b), a b
    a, b, positions = 0.6, 0.5, 400
    tau = np.array([1.0, 1.0 + a, 1.0 + a + a * b])
    mean = np.array([0.0, a, a + a * b])
    second = np.array([0.0, a, a * (1 - b) + 4 * a * b])
    expected = np.sqrt((second - mean**2) / positions)
    got = tau_stderr_independent_positions(tau, [1, 2], positions)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # siblings [0], [1] (p0, p1): M is 0 or 1, a Bernoulli of p0 + p1
    p0 = 0.5
    got = tau_stderr_independent_positions(np.array([1.0, 1.5, 1.7]), [1, 1], positions)
    np.testing.assert_allclose(got[2], np.sqrt(0.7 * 0.3 / positions), rtol=1e-12)
    np.testing.assert_allclose(got[1], np.sqrt(p0 * (1 - p0) / positions), rtol=1e-12)


def test_decision_rules():
    # Hand-made intervals without draws: size i is as good as j when lo(i) / hi(j) >= 1 - 0.05.
    ones = np.ones(3, dtype=bool)
    # 1.295 / 1.315 = 0.985: the smaller tree is within 5% of the best, and ships
    d = decide_cell([1.0, 1.30, 1.31], [1.0, 1.295, 1.305], [1.0, 1.305, 1.315], ones)
    assert (d.index, d.reason, d.best, d.settled) == (1, "within-tolerance", 2, True)
    # 1.08 / 1.52 = 0.71: only the best is as good as the best
    d = decide_cell([1.0, 1.1, 1.5], [1.0, 1.08, 1.48], [1.0, 1.12, 1.52], ones)
    assert (d.index, d.reason) == (2, "best")
    # intervals that straddle 1 and overlap: nothing is settled, and nothing that may be a
    # slowdown ships
    d = decide_cell([1.0, 1.05, 1.02], [1.0, 0.95, 0.9], [1.0, 1.15, 1.1], ones)
    assert (d.index, d.reason, d.settled) == (0, "undecided", False)
    # undecided between two trees that both beat 1: the best point estimate ships, marked
    d = decide_cell([1.0, 1.3, 1.4], [1.0, 1.25, 1.1], [1.0, 1.35, 1.7], ones)
    assert (d.index, d.reason, d.settled) == (2, "undecided", False)
    # every tree clearly slower: no speculation, settled
    d = decide_cell([1.0, 0.9, 0.8], [1.0, 0.85, 0.7], [1.0, 0.95, 0.9], ones)
    assert (d.index, d.reason, d.settled) == (0, "no speculation", True)
    # a sure 1% gain is within the 5% tolerance of plain decoding: not worth a tree; with no
    # tolerance it is
    tiny = ([1.0, 1.01], [1.0, 1.005], [1.0, 1.015], [True, True])
    assert decide_cell(*tiny).reason == "no speculation"
    assert (decide_cell(*tiny, tolerance=0.0).index, decide_cell(*tiny, tolerance=0.0).reason) == (1, "best")
    # a tree that cannot reach the threshold is no rival of plain decoding
    d = decide_cell([1.0, 1.15], [1.0, 1.14], [1.0, 1.16], [True, True], threshold=1.2)
    assert (d.index, d.reason) == (0, "no speculation")
    # a flagged size is never chosen, however fast it looks; all flagged: unreliable
    d = decide_cell([1.0, 1.3, 2.5], [1.0, 1.2, 2.4], [1.0, 1.4, 2.6], [True, True, False])
    assert (d.index, d.reason) == (1, "best")
    d = decide_cell([1.0, 1.3, 2.5], [1.0, 1.2, 2.4], [1.0, 1.4, 2.6], [True, False, False])
    assert (d.index, d.reason) == (0, "unreliable")


def test_rounds_needed_by_hand():
    # one tree at 1.2 [0.9, 1.6] after 10 rounds: its lower bound reaches 1 once the log
    # half-width ln(1.2 / 0.9) shrinks below ln 1.2, i.e. after 10 (ln(1.2/0.9) / ln 1.2)^2 =
    # 24.9 rounds; plain decoding can never be within 5% of a 1.2x point estimate
    d = decide_cell([1.0, 1.2], [1.0, 0.9], [1.0, 1.6], [True, True], rounds=10)
    assert d.reason == "undecided"
    assert d.rounds_needed == np.ceil(10 * (np.log(1.2 / 0.9) / np.log(1.2)) ** 2) == 25


def test_paired_ratios_see_through_common_noise():
    # both trees move together round to round (wide marginal intervals), but size 2 is
    # 8% faster in every round: the paired ratio separates them, the marginal intervals cannot
    rng = np.random.default_rng(3)
    drift = np.exp(np.abs(rng.normal(0, 0.3, size=(15, 1))))
    plain = 0.01 * np.exp(rng.normal(0, 0.2, size=(15, 1)))
    x = np.hstack([plain, plain * 1.3 * drift, plain * 1.2 * drift])
    draws = bootstrap_speedups(x, np.array([1.0, 2.5, 2.5]))
    lo, hi = interval(draws.speedup)
    assert hi[1] >= lo[2]  # the marginal intervals overlap
    low = ratio_lower_bounds(draws.speedup)
    assert low[2, 1] == pytest.approx(1.3 / 1.2)  # the same ratio in every round
    assert low[1, 2] < 0.95
    reliable = np.ones(3, dtype=bool)
    paired = decide_cell(draws.speedup_point, lo, hi, reliable, draws=draws.speedup, rounds=15)
    unpaired = decide_cell(draws.speedup_point, lo, hi, reliable, rounds=15)
    assert paired.settled and paired.index == 2
    assert not unpaired.settled


def test_step_time_falling_with_the_tree_is_flagged():
    rng = np.random.default_rng(4)
    good = 0.01 * np.array([1.0, 1.02, 1.1, 1.4]) * np.exp(rng.normal(0, 0.02, size=(12, 4)))
    assert not impossible_sizes(good).any()
    bad = good.copy()
    bad[:, 2] *= 0.5  # size 2 measured at half the time of size 1
    assert impossible_sizes(bad).tolist() == [False, True, True, False]
    fast = good.copy()
    fast[:, 1:] *= 0.3  # every tree faster than plain: the plain step is never the one flagged
    flags = impossible_sizes(fast)
    assert not flags[0] and flags[1]


def test_no_speedup_above_tau():
    # overhead 0.5 (a tree step at half the plain step's cost) is impossible: NaN, never
    # selected; 0.995 is within the 1% slack and counts as 1, so the speedup is tau itself
    got = physical_speedup([1.0, 2.0, 2.0, 2.0], [1.0, 0.5, 0.995, 1.25])
    assert np.isnan(got[1])
    np.testing.assert_allclose(got[[0, 2, 3]], [1.0, 2.0, 1.6])
