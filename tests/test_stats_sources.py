"""The statistics every measured-speedup interval depends on, against independent sources
(docs/statistics.md#measured-speedup-intervals, docs/statistics.md#sanity-checks-of-a-measurement): tau's
standard error by batch means against a brute-force bootstrap over whole calibration
sequences, the tau draw shared by every tree size recovered from the speedup draws and its
consequence for paired ratios derived by hand, and the 1% slack of the physics checks on
step times made by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd

from treeopt.acceptance import simulated_tau_curve
from treeopt.stats import bootstrap_speedups, impossible_sizes, tau_stderr, tau_stderr_independent_positions
from treeopt.tree import make_tree

SEQUENCES, POSITIONS, HEADS = 200, 40, 3
GROUPS = 20
RESAMPLES = 300


def correlated_rank_vectors(rng) -> np.ndarray:
    """(sequences, positions, heads) ranks: each sequence has its own easiness e (uniform in
    0.05..0.95); every head is top-1 with probability e, else top-2 with probability 0.4, else
    a miss. Easy sequences stay easy, so acceptance comes in runs."""
    easy = rng.uniform(0.05, 0.95, size=(SEQUENCES, 1, 1))
    u = rng.uniform(size=(SEQUENCES, POSITIONS, HEADS))
    return np.where(u < easy, 0, np.where(u < easy + (1 - easy) * 0.4, 1, 9)).astype(np.int64)


def test_tau_stderr_matches_a_bootstrap_over_whole_sequences():
    rng = np.random.default_rng(0)
    tree = make_tree([[0], [0, 0], [1], [0, 0, 0]])
    ranks = correlated_rank_vectors(rng)
    sequence = np.repeat(np.arange(SEQUENCES), POSITIONS)
    flat = ranks.reshape(-1, HEADS)
    tau = simulated_tau_curve(tree, flat, sequence)
    got = tau_stderr(tree, tau, positions=flat.shape[0], rank_vectors=(flat, sequence), groups=GROUPS)

    # the reference: resample whole sequences with replacement and walk every resample
    curves = np.stack(
        [
            simulated_tau_curve(tree, ranks[rng.integers(0, SEQUENCES, SEQUENCES)].reshape(-1, HEADS), sequence)
            for _ in range(RESAMPLES)
        ]
    )
    reference = curves.std(axis=0, ddof=1)
    assert got[0] == 0.0 and reference[0] == 0.0  # prefix 0 is plain decoding: tau = 1 exactly

    # why this bound: the batch-means SE over g = 20 groups is a sample SD of 20 group curves,
    # so got / true SE ~ sqrt(chi2_19 / 19), whose 0.05% and 99.95% quantiles are 0.53 and 1.54
    # (relative SD ~ 1 / sqrt(2 (g - 1)) = 16%); the reference from 300 resamples adds ~4%.
    # The prefixes are strongly correlated, so checking all of them is about one such test.
    # Wrong scalings (/ g, no division, / sqrt(sequences)) are off by 3.2x to 4.5x.
    ratio = got[1:] / reference[1:]
    assert np.all((ratio > 0.55) & (ratio < 1.5)), ratio

    # acceptance comes in runs: the positions-as-independent formula is far too small here
    # (about 3.5x below the bootstrap on this data), the reason for batching whole sequences
    independent = tau_stderr_independent_positions(tau, [1, 2, 1, 3], flat.shape[0])
    assert np.all(reference[1:] > 2.0 * independent[1:]), (reference, independent)


def test_one_tau_draw_is_shared_by_every_tree_size():
    # step times without noise: every overhead draw is exactly (1, 1.1, 1.3)
    overhead = np.array([1.0, 1.1, 1.3])
    samples = 0.01 * np.tile(overhead, (12, 1))
    tau = np.array([1.0, 1.6, 1.9])
    rel = np.array([0.0, 0.02, 0.03])  # tau's relative standard error per size
    se = rel * tau
    draws = bootstrap_speedups(samples, tau, se, draws=2000, seed=5)
    assert np.allclose(draws.overhead, overhead[None, :], rtol=0, atol=1e-12)

    # z per size from the draws: speedup * overhead = max(tau + se z, 1); no clipping at 1
    # happens here (it would need z below -18.75 for size 1)
    z = (draws.speedup[:, 1:] * overhead[1:] - tau[1:]) / se[1:]
    np.testing.assert_allclose(z[:, 0], z[:, 1], rtol=0, atol=1e-9)
    assert 0.9 < z[:, 0].std() < 1.1  # and it is a standard normal draw

    # the consequence: the paired ratio speedup(2) / speedup(1) = (o1 / o2) (tau2 / tau1)
    # (1 + r2 z) / (1 + r1 z), so to first order its log moves by (r2 - r1) z: spread |r2 - r1|
    # = 0.01 with one shared z, sqrt(r1^2 + r2^2) = 0.036 with independent draws per size
    log_ratio = np.log(draws.speedup[:, 2] / draws.speedup[:, 1])
    shared = abs(rel[2] - rel[1])
    # 10%: the SD of 2000 normal draws is within ~5% (3 sigma); the second-order term
    # (r2^2 - r1^2) z^2 / 2 adds ~0.00035, 3.5% of 0.01
    np.testing.assert_allclose(log_ratio.std(), shared, rtol=0.1)
    assert log_ratio.std() < 0.5 * np.hypot(rel[1], rel[2])


def step_rounds(rng, multipliers, rounds: int = 12) -> np.ndarray:
    """Nearly noise-free paired rounds: a 3x drift common to each round (cancels in every
    same-round ratio) and 0.01% noise per sample, around the given step-time multipliers."""
    m = np.asarray(multipliers, dtype=float)
    drift = np.exp(rng.uniform(0.0, np.log(3.0), size=(rounds, 1)))
    noise = np.exp(rng.normal(0.0, 1e-4, size=(rounds, m.size)))
    return 0.01 * drift * m[None, :] * noise


def test_monotonicity_slack_is_one_percent():
    rng = np.random.default_rng(7)
    # a tree 0.5% faster than plain in every round: within timer resolution, not flagged
    assert impossible_sizes(step_rounds(rng, [1.0, 0.995, 1.1])).tolist() == [False, False, False]
    # 2% faster than plain in every round: flagged (the tree, never plain)
    assert impossible_sizes(step_rounds(rng, [1.0, 0.98, 1.1])).tolist() == [False, True, False]
    # the next tree 0.5% faster than the smaller one: not flagged; 2% faster: both flagged
    assert impossible_sizes(step_rounds(rng, [1.0, 1.05, 1.05 * 0.995, 1.2])).tolist() == [False] * 4
    assert impossible_sizes(step_rounds(rng, [1.0, 1.05, 1.05 * 0.98, 1.2])).tolist() == [False, True, True, False]
    # exactly noise-free rounds give the same answers
    assert not impossible_sizes(np.tile([1.0, 0.995, 1.1], (10, 1))).any()
    assert impossible_sizes(np.tile([1.0, 0.98, 1.1], (10, 1))).tolist() == [False, True, False]


def test_speedup_above_tau_has_the_same_slack_at_selection():
    # imported here: selection.py changes often, and the tests above should not depend on it
    from treeopt.selection import measured_decisions

    # one cell: plain and one tree with tau = 1.5 exactly (tau_se 0), its measured speedup an
    # exact point (lo = hi = speedup) 0.5% or 2% above tau
    def unreliable_nodes(speedup: float) -> list[int]:
        df = pd.DataFrame(
            {
                "batch": [1, 1],
                "context": [128, 128],
                "nodes": [0, 4],
                "tau": [1.0, 1.5],
                "tau_se": [0.0, 0.0],
                "speedup": [1.0, speedup],
                "speedup_lo": [1.0, speedup],
                "speedup_hi": [1.0, speedup],
            }
        )
        measured = df["speedup"].copy()
        measured_by = pd.Series(["step-latency"] * 2, index=df.index)
        out = measured_decisions(df, measured, measured_by)
        return list(out["unreliable_nodes"].iloc[0])

    assert unreliable_nodes(1.5 * 1.005) == []
    assert unreliable_nodes(1.5 * 1.02) == [4]
