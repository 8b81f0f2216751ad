"""Uncertainty of measured speedups and the decision that uses it
(docs/statistics.md#measured-speedup-intervals, docs/statistics.md#sanity-checks-of-a-measurement,
docs/statistics.md#choosing-a-tree-with-intervals).

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
    "physical_speedup",
    "same_round_ratios",
    "bootstrap_speedups",
    "interval",
    "impossible_sizes",
    "DEFAULT_TOLERANCE",
    "MIN_ROUNDS",
    "CellDecision",
    "decide_cell",
    "best_bound_decision",
    "nondecreasing",
    "ordered_speedups",
    "ratio_lower_bounds",
    "sequential_confidence",
    "shipped_confidence",
    "consistent_with_fit",
    "tau_stderr",
    "tau_stderr_independent_positions",
]

CONFIDENCE = 0.95
BOOTSTRAP_DRAWS = 2000
# A bigger tree does more work, so a step time that falls as the tree grows is a disturbed
# measurement; 1% leaves room for timer resolution (docs/statistics.md#sanity-checks-of-a-measurement).
MONOTONE_SLACK = 0.01
# Two trees whose speedups are within 5% of each other are the same answer: finer margins
# leave most cells undecided at the noise of a shared machine, while no cell is then decided
# on a tree more than 5% worse than the best (benchmarks/bench_selection.py;
# docs/statistics.md#choosing-a-tree-with-intervals).
DEFAULT_TOLERANCE = 0.05
# Fewer paired rounds than this and the percentile interval of a median covers far below its
# stated level (docs/statistics.md#measured-speedup-intervals).
MIN_ROUNDS = 5
REASONS = ("best", "within-tolerance", "best bound", "undecided", "no speculation", "unreliable")


def physical_speedup(tau, overhead) -> np.ndarray:
    """tau / overhead where that is physical: NaN (never selected) where a tree step is priced
    below the plain step beyond the slack, since it does the plain step's work and more; an
    overhead within the slack below 1 counts as 1, so no speedup exceeds tau
    (docs/statistics.md#sanity-checks-of-a-measurement)."""
    tau = np.asarray(tau, dtype=float)
    overhead = np.asarray(overhead, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.where(overhead < 1.0 - MONOTONE_SLACK, np.nan, tau / np.maximum(overhead, 1.0))


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
    # (docs/statistics.md#measured-speedup-intervals)
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
    """The answer for one cell. `index` into the sizes is what ships (0 = no speculation);
    `reason` one of REASONS; `best` the index of the largest point speedup among reliable trees
    (0 when none); `settled` False when more rounds could change the answer by more than the
    tolerance; `rounds_needed` (settled cells: the rounds measured) how many rounds in all the
    observed noise would need to settle it (inf: no number of rounds would, at this tolerance).
    A cell decided on fixed rounds (reason "best bound", `decide_cell(fixed_rounds=True)`):
    `bound` the shipped tree's worst paired lower bound of speedup(shipped) / speedup(rival)
    over every rival, and `open_sizes` the rivals (indices) it is not shown to be within the
    tolerance of; NaN and () elsewhere."""

    index: int
    reason: str
    best: int
    settled: bool = True
    rounds_needed: float = 0.0
    bound: float = float("nan")
    open_sizes: tuple[int, ...] = ()


def ratio_lower_bounds(draws: np.ndarray, confidence: float = CONFIDENCE) -> np.ndarray:
    """(sizes, sizes): entry [i, j] is the lower bound of the paired interval of
    speedup(i) / speedup(j), from `draws` (draws, sizes) that share their resampled rounds and
    tau draw column by column."""
    d = np.asarray(draws, dtype=float)
    ratio = d[:, :, None] / d[:, None, :]
    return np.quantile(ratio, (1.0 - confidence) / 2, axis=0)


def decide_cell(
    speedup,
    lo,
    hi,
    reliable,
    *,
    draws=None,
    threshold: float = 1.0,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = CONFIDENCE,
    rounds: int = 0,
    fixed_rounds: bool = False,
    overhead=None,
) -> CellDecision:
    """The smallest tree as good as the best within `tolerance`, shipped only where it beats
    `threshold` at its lower bound (docs/statistics.md#choosing-a-tree-with-intervals).

    Arrays over the sizes in ascending order, index 0 = plain decoding, whose value is the
    threshold (a tree must beat it to ship). `draws` (draws, sizes): paired bootstrap draws of
    the speedups (`SpeedupDraws.speedup`; None: the ratio bounds are lo(i) / hi(j), which is
    conservative), a tree's own lower bound taken at `shipped_confidence`. Size i is *as good
    as* size j when the lower bound of speedup(i) / speedup(j) is at least 1 - tolerance. No
    speculation when plain decoding is as good as every reliable tree that may beat the
    threshold (hi above it). Otherwise the answer is the smallest tree as good as the best point
    estimate among those whose own lower bound beats the threshold: reason "best" or
    "within-tolerance" when it is also as good as every tree that may pay (settled),
    "undecided" when one of them may still be better by more than the tolerance. Where no tree
    that beats the threshold is as good as the best, "undecided" with the one of largest point
    speedup (plain decoding where none beats it); "unreliable" when every tree was flagged.

    `fixed_rounds`: the rounds measured are all there will be (a finished sweep), so an open
    cell ships the tree of best worst-case bound (`best_bound_decision`, reason "best bound",
    `rounds_needed` still said; docs/statistics.md#a-sweep-that-cannot-be-measured-again), on
    draws whose step times do not fall as the tree grows where `overhead`, the T(n)/T(0) draws
    paired with `draws`, is given (`ordered_speedups`); "undecided" stays only where no tree
    beats the threshold at its lower bound."""
    speedup = np.asarray(speedup, dtype=float)
    size = speedup.size
    lo = np.where(np.isfinite(lo), lo, speedup)
    hi = np.where(np.isfinite(hi), hi, speedup)
    reliable = np.asarray(reliable, dtype=bool)
    trees = np.arange(size) > 0
    candidate = trees & reliable & np.isfinite(speedup)
    if not candidate.any():
        reason = "unreliable" if (trees & ~reliable).any() else "no speculation"
        return CellDecision(0, reason, 0, True, float(rounds))
    best = int(np.argmax(np.where(candidate, speedup, -np.inf)))  # first maximum: the smallest on ties
    point = np.where(trees, speedup, threshold)
    if draws is None:
        low = np.where(trees, lo, threshold)[:, None] / np.where(trees, hi, threshold)[None, :]
        # the sizes every answer must be as good as: plain decoding and the trees that may pay
        rivals = ~trees | (candidate & (hi > threshold))
        shippable = ~trees | (candidate & (lo > threshold))
    else:
        values = np.array(draws, dtype=float)
        values[:, 0] = threshold
        low, rivals, shippable = _paired_bounds(values, candidate, threshold, confidence)
    within = (low >= 1.0 - tolerance) | np.eye(size, dtype=bool)
    # settled[i]: no size that may pay can be more than the tolerance better than i
    settled = (within | ~rivals[None, :]).all(axis=1)
    if settled[0]:
        return CellDecision(0, "no speculation", best, True, float(rounds))
    # the smallest tree that can ship and is as good as the best point estimate; where none
    # is, the tree of largest point speedup that can ship (plain decoding where none can)
    as_good = shippable & trees & within[:, best]
    if as_good.any():
        chosen = int(np.flatnonzero(as_good)[0])
    else:
        chosen = int(np.argmax(np.where(shippable, point, -np.inf)))
    if as_good.any() and settled[chosen]:
        return CellDecision(chosen, "best" if chosen == best else "within-tolerance", best, True, float(rounds))
    answers = np.isin(np.arange(size), (0, chosen, best))
    more = _rounds_needed(point, low, rivals, answers, tolerance, rounds)
    if fixed_rounds and draws is not None and overhead is not None:
        # why: a bigger tree never steps faster (docs/statistics.md#a-sweep-that-cannot-be-measured-again)
        ordered = ordered_speedups(values, overhead, candidate)
        low, rivals, shippable = _paired_bounds(ordered, candidate, threshold, confidence)
    if fixed_rounds and (shippable & trees).any():
        return best_bound_decision(low, rivals, shippable & trees, tolerance, best, more)
    return CellDecision(chosen, "undecided", best, False, more)


def _paired_bounds(values: np.ndarray, candidate: np.ndarray, threshold: float, confidence: float):
    """(low, rivals, shippable) of `decide_cell` from paired draws `values` (draws, sizes;
    column 0 the threshold): the ratio lower bounds, the sizes every answer must be as good as
    (plain decoding and the candidates whose upper bound beats the threshold), and those that
    can ship (plain decoding and the candidates whose lower bound beats it)."""
    trees = np.arange(values.shape[1]) > 0
    low = ratio_lower_bounds(values, confidence)
    _, hi = interval(values, confidence)
    # why: the shipped tree is picked from all sizes, so its own interval is taken at the
    # level spent over them, which holds whichever size is picked
    lo, _ = interval(values, shipped_confidence(confidence, values.shape[1] - 1))
    return low, ~trees | (candidate & (hi > threshold)), ~trees | (candidate & (lo > threshold))


def nondecreasing(values) -> np.ndarray:
    """The least-squares nondecreasing fit along the last axis, equal weights (isotonic
    regression): entry i is max over a <= i of min over b >= i of mean(values[a..b])
    (the max-min formula: Barlow, Bartholomew, Bremner and Brunk, Statistical Inference under
    Order Restrictions, 1972, ch. 1)."""
    y = np.asarray(values, dtype=float)
    n = y.shape[-1]
    total = np.concatenate([np.zeros(y.shape[:-1] + (1,)), np.cumsum(y, axis=-1)], axis=-1)
    a, b = np.arange(n)[:, None], np.arange(n)[None, :]
    span = np.where(b >= a, b - a + 1, 1)
    mean = np.where(b >= a, (total[..., b + 1] - total[..., a]) / span, np.inf)  # [..., a, b]
    tail_min = np.flip(np.minimum.accumulate(np.flip(mean, -1), axis=-1), -1)  # min over b' >= b
    return np.where(a <= b, tail_min, -np.inf).max(axis=-2)


def ordered_speedups(speedup, overhead, keep) -> np.ndarray:
    """(draws, sizes) speedup draws whose T(n)/T(0) draws (`overhead`, paired column by column)
    are replaced, over the sizes in `keep` (bool, ascending tree sizes), by their nondecreasing
    least-squares fit in logs: a bigger tree of the same proposal does a smaller one's work and
    more, so its step is not faster (docs/statistics.md#a-sweep-that-cannot-be-measured-again).
    Each draw keeps its tau draw (speedup x overhead); the other sizes are unchanged."""
    speedup = np.array(speedup, dtype=float)
    overhead = np.asarray(overhead, dtype=float)
    keep = np.asarray(keep, dtype=bool)
    if keep.sum() < 2:
        return speedup
    tau = speedup[:, keep] * overhead[:, keep]
    speedup[:, keep] = tau / np.exp(nondecreasing(np.log(overhead[:, keep])))
    return speedup


def best_bound_decision(low, rivals, shippable, tolerance: float, best: int, rounds_needed: float) -> CellDecision:
    """The fixed-round answer (docs/statistics.md#a-sweep-that-cannot-be-measured-again): of the
    trees that can ship (`shippable`, bool over the sizes), the one whose worst paired lower bound
    low[i, j] of speedup(i) / speedup(j) over every rival j (`rivals`: plain decoding and the
    trees that may pay) is the highest, the smallest on ties. That bound is what the data
    guarantee about it: at the comparisons' confidence no rival is more than 1 - bound faster,
    and no other tree can be guaranteed more. The rivals it is not shown to be within
    `tolerance` of are listed in `open_sizes`."""
    low = np.asarray(low, dtype=float)
    others = rivals[None, :] & ~np.eye(low.shape[0], dtype=bool)
    worst = np.where(others, low, np.inf).min(axis=1)
    chosen = int(np.argmax(np.where(shippable, worst, -np.inf)))  # first maximum: the smallest on ties
    open_sizes = np.flatnonzero(others[chosen] & (low[chosen] < 1.0 - tolerance))
    return CellDecision(
        chosen, "best bound", best, False, rounds_needed, float(worst[chosen]), tuple(int(j) for j in open_sizes)
    )


def _rounds_needed(point, low, rivals, answers, tolerance: float, rounds: int) -> float:
    """Rounds in all after which one of `answers` (the tree shipped, the best point estimate or
    plain decoding) would be settled, if the point ratios stayed and the log-interval half-widths shrank as
    1 / sqrt(rounds): the fewest over those answers of the most any of its conditions needs
    (inf: neither can)."""
    if rounds <= 0:
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.log(point[:, None] / point[None, :])  # the point log-ratio of i over j
        h = p - np.log(low)  # the half-width of its interval, in logs
        target = np.full_like(p, np.log1p(-tolerance))
        target[1:, 0] = np.maximum(target[1:, 0], 1e-9)  # a tree must beat the threshold
        need = np.where(p > target, rounds * (h / (p - target)) ** 2, np.inf)
    need = np.where(p - h >= target, rounds, need)
    need = np.where(np.eye(point.size, dtype=bool) | ~rivals[None, :], rounds, need)
    per_answer = np.where(answers, need.max(axis=1), np.inf)
    return float(np.ceil(per_answer.min())) if np.isfinite(per_answer.min()) else float("inf")


def consistent_with_fit(
    measured_overhead, fit_overhead, *, tolerance: float = DEFAULT_TOLERANCE, confidence: float = CONFIDENCE
) -> np.ndarray:
    """(sizes,) bool: the cell's measured T(n)/T(0) does not differ from a pooled fit's by more
    than `tolerance` beyond the noise (docs/statistics.md#pooled-evidence).

    `measured_overhead` (draws, sizes): the cell's bootstrap over its own rounds;
    `fit_overhead` (fit_draws, sizes): the fit's bootstrap. The two are independent, so draw k of
    the one is paired with draw k mod fit_draws of the other. A size is consistent when the
    interval of log(measured / fit), at `confidence` spent over the sizes (Bonferroni), reaches
    the band +-log(1 + tolerance)."""
    m = np.log(np.asarray(measured_overhead, dtype=float))
    f = np.log(np.asarray(fit_overhead, dtype=float))
    diff = m - f[np.arange(m.shape[0]) % f.shape[0]]
    level = sequential_confidence(m.shape[1], confidence)
    lo, hi = interval(diff, level)
    band = np.log1p(tolerance)
    return (lo <= band) & (hi >= -band)


def shipped_confidence(confidence: float, trees: int) -> float:
    """The level of a shipped tree's own interval: `confidence` spent over the `trees` sizes it
    is picked from (Bonferroni), so that the interval holds whichever size the rule picks
    (docs/statistics.md#choosing-a-tree-with-intervals)."""
    return sequential_confidence(max(int(trees), 1), confidence)


def sequential_confidence(looks: int, confidence: float = CONFIDENCE) -> float:
    """The per-look confidence that keeps `confidence` for the final interval of a measurement
    that may stop after any of `looks` looks (Bonferroni: each look spends alpha / looks;
    docs/statistics.md#measuring-until-the-answer-is-known)."""
    return 1.0 - (1.0 - confidence) / max(int(looks), 1)


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
