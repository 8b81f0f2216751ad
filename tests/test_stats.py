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
    paired_ties,
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
    ones = np.ones(3, dtype=bool)
    # the best's lower bound above 1: the best; a tied smaller tree wins
    d = decide_cell([1.0, 1.3, 1.35], [1.0, 1.2, 1.25], [1.0, 1.4, 1.45], ones)
    assert (d.index, d.reason, d.best) == (1, "tied-with-smaller", 2)
    d = decide_cell([1.0, 1.1, 1.5], [1.0, 1.05, 1.4], [1.0, 1.15, 1.6], ones)
    assert (d.index, d.reason) == (2, "best")
    # the interval straddles 1: undecided, no speculation chosen
    d = decide_cell([1.0, 1.05, 1.02], [1.0, 0.95, 0.9], [1.0, 1.15, 1.1], ones)
    assert (d.index, d.reason) == (0, "undecided")
    # every tree clearly slower: no speculation
    d = decide_cell([1.0, 0.9, 0.8], [1.0, 0.85, 0.7], [1.0, 0.95, 0.9], ones)
    assert (d.index, d.reason) == (0, "no speculation")
    # a flagged size is never chosen, however fast it looks; all flagged: unreliable
    d = decide_cell([1.0, 1.3, 2.5], [1.0, 1.2, 2.4], [1.0, 1.4, 2.6], [True, True, False])
    assert (d.index, d.reason) == (1, "best")
    d = decide_cell([1.0, 1.3, 2.5], [1.0, 1.2, 2.4], [1.0, 1.4, 2.6], [True, False, False])
    assert (d.index, d.reason) == (0, "unreliable")


def test_paired_ties_see_through_common_noise():
    # both trees move together round to round (wide marginal intervals), but size 2 is
    # 8% faster in every round: the paired test separates them, the overlap test would not
    rng = np.random.default_rng(3)
    drift = np.exp(np.abs(rng.normal(0, 0.3, size=(15, 1))))
    plain = 0.01 * np.exp(rng.normal(0, 0.2, size=(15, 1)))
    x = np.hstack([plain, plain * 1.3 * drift, plain * 1.2 * drift])
    draws = bootstrap_speedups(x, np.array([1.0, 1.5, 1.5]))
    lo, hi = interval(draws.speedup)
    assert hi[1] >= lo[2]  # the marginal intervals overlap
    assert not paired_ties(draws, best=2)[1]


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
