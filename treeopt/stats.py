"""Uncertainty of measured speedups and the decision that uses it (docs/statistics.md
"Measured speedup intervals", "Sanity checks of a measurement", "Choosing a tree with
intervals").

Step times come as paired rounds: row r of a (rounds, sizes) array holds one sample of every
tree size, taken back to back in a random order, column 0 the plain step. The overhead of
size n is the median over rounds of the same-round ratio T_r(n) / T_r(0); its interval comes
from a percentile bootstrap over rounds (rows resampled whole, so the pairing survives).
tau's own sampling error enters as a normal draw around tau with the standard error from the
calibration (`tau_stderr`), the same draw for every size of a draw (nested prefixes share
almost all their nodes, so their tau errors move together).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treeopt.acceptance import simulated_tau_curve
from treeopt.tree import Tree

__all__ = [
    "CONFIDENCE",
    "BOOTSTRAP_DRAWS",
    "MONOTONE_SLACK",
    "REASONS",
    "SpeedupDraws",
    "same_round_ratios",
    "bootstrap_speedups",
    "interval",
    "impossible_sizes",
    "CellDecision",
    "decide_cell",
    "paired_ties",
    "tau_stderr",
    "tau_stderr_independent_positions",
]

CONFIDENCE = 0.95
BOOTSTRAP_DRAWS = 2000
# A bigger tree does more work, so a step time that falls as the tree grows is a disturbed
# measurement; 1% leaves room for timer resolution (docs/statistics.md "Sanity checks of a
# measurement").
MONOTONE_SLACK = 0.01
REASONS = ("best", "tied-with-smaller", "undecided", "no speculation", "unreliable")


def same_round_ratios(samples: np.ndarray) -> np.ndarray:
    """(rounds, sizes) step times, column 0 plain -> T_r(n) / T_r(0) per round."""
    samples = np.asarray(samples, dtype=float)
    return samples / samples[:, :1]


@dataclass(frozen=True)
class SpeedupDraws:
    """Bootstrap draws of one (batch, context) cell; `overhead` and `speedup` are
    (draws, sizes); `overhead_point` / `speedup_point` the estimates from all rounds."""

    overhead_point: np.ndarray
    speedup_point: np.ndarray
    overhead: np.ndarray
    speedup: np.ndarray
    rounds: int


def bootstrap_speedups(samples, tau, tau_se=None, *, draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> SpeedupDraws:
    """Percentile-bootstrap draws over rounds of the overhead (median of same-round ratios)
    and of the speedup tau / overhead, with tau drawn as tau + tau_se * z (z ~ N(0, 1), one z
    per draw shared by every size; tau_se None or 0: tau taken as exact)."""
    ratios = same_round_ratios(samples)
    rounds = ratios.shape[0]
    tau = np.asarray(tau, dtype=float)
    se = np.zeros_like(tau) if tau_se is None else np.nan_to_num(np.asarray(tau_se, dtype=float))
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, rounds, size=(draws, rounds))
    # why: a tree step does the plain step's work and more, so an overhead below 1 is noise
    # (docs/statistics.md "Measured speedup intervals")
    overhead = np.maximum(np.median(ratios[pick], axis=1), 1.0)  # (draws, sizes)
    z = rng.standard_normal((draws, 1))
    tau_draws = np.maximum(tau[None, :] + se[None, :] * z, 1.0)  # at least the bonus token
    point = np.maximum(np.median(ratios, axis=0), 1.0)
    return SpeedupDraws(point, tau / point, overhead, tau_draws / overhead, rounds)


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over axis 0."""
    alpha = 1.0 - confidence
    lo, hi = np.quantile(draws, [alpha / 2, 1 - alpha / 2], axis=0)
    return lo, hi


def impossible_sizes(
    samples, *, confidence: float = CONFIDENCE, draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> np.ndarray:
    """(sizes,) bool: tree sizes measured faster than the plain step beyond the noise (the
    upper bound of the median same-round ratio T(n) / T(0) is below 1 - MONOTONE_SLACK), and
    both sizes of a pair of consecutive trees a < b whose step time falls as the tree grows
    beyond the noise (the same test on T(b) / T(a)). The plain step (column 0) is never
    flagged: a tree faster than it flags the tree."""
    x = np.asarray(samples, dtype=float)
    rounds, sizes = x.shape
    flags = np.zeros(sizes, dtype=bool)
    if sizes < 2:
        return flags
    # columns: T(n)/T(0) for n = 1.., then T(k+1)/T(k) for consecutive trees k = 1..
    ratios = np.hstack([x[:, 1:] / x[:, :1], x[:, 2:] / x[:, 1:-1]])
    rng = np.random.default_rng(seed + 1)
    pick = rng.integers(0, rounds, size=(draws, rounds))
    _, hi = interval(np.median(ratios[pick], axis=1), confidence)
    falls = hi < 1.0 - MONOTONE_SLACK
    flags[1:] |= falls[: sizes - 1]
    flags[2:] |= falls[sizes - 1 :]
    flags[1:-1] |= falls[sizes - 1 :]
    return flags


@dataclass(frozen=True)
class CellDecision:
    """The pick of one cell: `index` into the sizes (0 = no speculation), `reason` one of
    REASONS, `best` the index of the largest point speedup among reliable trees (or 0)."""

    index: int
    reason: str
    best: int


def decide_cell(speedup, lo, hi, reliable, *, tied=None, threshold: float = 1.0) -> CellDecision:
    """The smallest tree statistically indistinguishable from the best, or no speculation.

    Arrays over the sizes in ascending order, index 0 = plain decoding. `tied[i]`: size i's
    speedup is indistinguishable from the best's (paired test); None -> their intervals
    overlap (hi[i] >= lo[best]). Reasons: "best" / "tied-with-smaller" when the best's lower
    bound is above `threshold`; "no speculation" when its upper bound is not; "undecided"
    (no speculation picked, for safety) in between; "unreliable" when every tree was flagged.
    """
    speedup = np.asarray(speedup, dtype=float)
    lo = np.where(np.isfinite(lo), lo, speedup)
    hi = np.where(np.isfinite(hi), hi, speedup)
    reliable = np.asarray(reliable, dtype=bool)
    trees = np.arange(speedup.size) > 0
    candidate = trees & reliable & np.isfinite(speedup)
    if not candidate.any():
        return CellDecision(0, "unreliable" if (trees & ~reliable).any() else "no speculation", 0)
    key = np.where(candidate, speedup, -np.inf)
    best = int(np.argmax(key))  # first maximum: the smallest size on exact ties
    if lo[best] > threshold:
        same = (hi >= lo[best]) if tied is None else np.asarray(tied, dtype=bool)
        chosen = int(np.flatnonzero(candidate & (same | (np.arange(speedup.size) == best)))[0])
        return CellDecision(chosen, "best" if chosen == best else "tied-with-smaller", best)
    if hi[best] <= threshold:
        return CellDecision(0, "no speculation", best)
    return CellDecision(0, "undecided", best)


def paired_ties(draws: SpeedupDraws, best: int, confidence: float = CONFIDENCE) -> np.ndarray:
    """(sizes,) bool: the paired bootstrap interval of speedup(best) - speedup(i), both from
    the same resampled rounds and tau draw, reaches 0 (i cannot be told apart from the best)."""
    diff = draws.speedup[:, [best]] - draws.speedup
    lo, _ = interval(diff, confidence)
    return lo <= 0.0


# ---- tau's sampling error -------------------------------------------------------------------


def tau_stderr_independent_positions(tau, depths, positions: float) -> np.ndarray:
    """Standard error of tau(prefix n), n = 0..N, from `positions` calibration positions taken
    as independent; `tau` is the prefix curve of a nested proposal sequence and `depths[j]`
    the depth of its node j (j = 0..N-1).

    Accepted nodes M at a position form a chain from the root, so node j matching implies its
    depths[j] - 1 ancestors match: E[M^2] = sum_j v_j (2 depths[j] - 1) with v_j = tau(j + 1) -
    tau(j) the node's value; Var(M) = E[M^2] - (tau - 1)^2 and se = sqrt(Var / positions)."""
    tau = np.asarray(tau, dtype=float)
    v = np.diff(tau)
    weight = 2 * np.asarray(depths, dtype=float) - 1
    second = np.concatenate([[0.0], np.cumsum(v * weight)])
    var = np.maximum(second - (tau - 1.0) ** 2, 0.0)
    return np.sqrt(var / max(float(positions), 1.0))


def tau_stderr(proposal: Tree, tau, *, positions: float, rank_vectors=None, groups: int = 20) -> np.ndarray:
    """Standard error of the tau curve a decision uses.

    With the calibration's rank vectors (ranks, sequence): batch means over `groups` groups of
    whole calibration sequences, each walked like the decoder (acceptance comes in runs, so
    positions of one sequence are not independent: whole sequences are the unit). Without
    them: `tau_stderr_independent_positions`."""
    tau = np.asarray(tau, dtype=float)
    depths = np.array([len(p) for p in proposal.paths], dtype=float)
    if rank_vectors is None:
        return tau_stderr_independent_positions(tau, depths, positions)
    ranks, sequence = rank_vectors
    ids = np.unique(sequence)
    g = min(groups, ids.size)
    if g < 2:
        return tau_stderr_independent_positions(tau, depths, positions)
    group_of_sequence = np.arange(ids.size) * g // ids.size
    group = group_of_sequence[np.searchsorted(ids, sequence)]
    curves = np.stack([simulated_tau_curve(proposal, ranks[group == k], sequence[group == k]) for k in range(g)])
    return curves.std(axis=0, ddof=1) / np.sqrt(g)
