"""Robust wall-clock timing on a noisy, shared machine (pure Python, no torch).

This VM has multi-second bursts of 5-10x slowdown (docs/performance-model.md#measured-on-the-development-machine), so
one timing loop gives a number that may be off by that
much. The helpers here take many short samples, use the median, re-measure samples that are
far above the median (a burst, not the code), and interleave several configurations so that
a burst hits all of them a little rather than one of them entirely.

`fn` must do its own synchronisation (e.g. `torch.cuda.synchronize()`) if it launches
asynchronous work.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "TimingStats",
    "calls_per_sample",
    "measure",
    "measure_interleaved",
    "interleaved_rounds",
    "sample_size",
    "duration_text",
]


@dataclass(frozen=True)
class TimingStats:
    """Seconds per call of one timed function.

    `samples` are the kept per-call times (seconds) in the order taken; `remeasured` counts
    samples that were more than `outlier_factor` x the median and were taken again.
    """

    median_s: float
    p10_s: float
    p90_s: float
    samples: tuple[float, ...]
    remeasured: int = 0

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: 0 for perfectly steady timings."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "median_s": self.median_s,
            "p10_s": self.p10_s,
            "p90_s": self.p90_s,
            "n": len(self.samples),
            "remeasured": self.remeasured,
        }


def _quantile(sorted_xs: Sequence[float], p: float) -> float:
    """Linear-interpolated quantile of an already sorted sequence, p in [0, 1]."""
    if not sorted_xs:
        raise ValueError("no samples")
    pos = p * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    frac = pos - lo
    return sorted_xs[lo] * (1 - frac) + sorted_xs[hi] * frac


def _stats(samples: list[float], remeasured: int) -> TimingStats:
    xs = sorted(samples)
    return TimingStats(
        median_s=statistics.median(xs),
        p10_s=_quantile(xs, 0.10),
        p90_s=_quantile(xs, 0.90),
        samples=tuple(samples),
        remeasured=remeasured,
    )


def duration_text(seconds: float) -> str:
    """'40 s', '3 min', '1.5 h': an estimate's precision, not a measurement's."""
    if seconds < 120:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def calls_per_sample(fn: Callable[[], object], target_s: float, clock) -> int:
    """Calls per sample so that one sample lasts about `target_s` (for microsecond functions)."""
    return sample_size(fn, target_s, clock)[0]


def sample_size(fn: Callable[[], object], target_s: float, clock) -> tuple[int, float]:
    """`calls_per_sample` and the seconds per call its last, longest loop took: what a sample
    of this function will cost, known before any round is run."""
    inner = 1
    while True:
        t0 = clock()
        for _ in range(inner):
            fn()
        dt = clock() - t0
        if dt >= target_s or inner >= 1 << 20:
            return inner, dt / inner
        inner = max(inner * 2, int(inner * target_s / max(dt, 1e-9) * 1.2))


def _sample(fn: Callable[[], object], inner: int, clock) -> float:
    t0 = clock()
    for _ in range(inner):
        fn()
    return (clock() - t0) / inner


def _replace_outliers(samples: list[float], take: Callable[[], float], factor: float, max_remeasure: int) -> int:
    """Re-take samples above factor x median (in place); returns how many were re-taken."""
    remeasured = 0
    for _ in range(3):  # a few passes: the median itself moves when bursts are replaced
        med = statistics.median(samples)
        bad = [i for i, s in enumerate(samples) if s > factor * med]
        if not bad or remeasured >= max_remeasure:
            break
        for i in bad:
            if remeasured >= max_remeasure:
                break
            samples[i] = take()
            remeasured += 1
    return remeasured


def measure(
    fn: Callable[[], object],
    *,
    repeats: int = 15,
    warmup: int = 2,
    inner: int | None = 1,
    target_sample_s: float = 2e-3,
    outlier_factor: float = 3.0,
    max_remeasure: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TimingStats:
    """Time `fn()`: `warmup` untimed calls, then `repeats` samples of `inner` calls each.

    inner=None picks the number of calls per sample so that a sample lasts about
    `target_sample_s` (use it for functions of microseconds). Samples above
    `outlier_factor` x the median are re-taken (at most `max_remeasure` times, default
    `repeats`): on this machine they are slowdown bursts, not the code.
    Returns per-call seconds.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for _ in range(max(0, warmup)):
        fn()
    if inner is None:
        inner = calls_per_sample(fn, target_sample_s, clock)
    samples = [_sample(fn, inner, clock) for _ in range(repeats)]
    remeasured = 0
    if repeats >= 3:
        remeasured = _replace_outliers(
            samples,
            lambda: _sample(fn, inner, clock),
            outlier_factor,
            repeats if max_remeasure is None else max_remeasure,
        )
    return _stats(samples, remeasured)


def measure_interleaved(
    fns: Sequence[Callable[[], object]],
    *,
    rounds: int = 15,
    warmup: int = 1,
    inner: int | Sequence[int] | None = 1,
    target_sample_s: float = 2e-3,
    outlier_factor: float = 3.0,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    after_round: Callable[[], object] | None = None,
) -> list[TimingStats]:
    """Time several functions in `rounds` rounds; each round takes one sample of every
    function in a fresh random order. A slowdown burst then lands on a few samples of many
    configurations instead of on all samples of one. Outliers (> outlier_factor x that
    function's median) are re-taken at the end. Returns one TimingStats per function.
    after_round: called once after every round (a progress bar), outside the timed samples.
    """
    fns = list(fns)
    if not fns:
        return []
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    for fn in fns:
        for _ in range(max(0, warmup)):
            fn()
    if inner is None:
        inners = [calls_per_sample(fn, target_sample_s, clock) for fn in fns]
    elif isinstance(inner, int):
        inners = [inner] * len(fns)
    else:
        inners = list(inner)
        if len(inners) != len(fns):
            raise ValueError("inner: one count per function")
    by_round = interleaved_rounds(fns, rounds=rounds, inners=inners, seed=seed, clock=clock, after_round=after_round)
    samples = [list(col) for col in zip(*by_round, strict=True)]
    out = []
    for i, fn in enumerate(fns):
        remeasured = 0
        if rounds >= 3:
            remeasured = _replace_outliers(
                samples[i], lambda fn=fn, inner=inners[i]: _sample(fn, inner, clock), outlier_factor, rounds
            )
        out.append(_stats(samples[i], remeasured))
    return out


def interleaved_rounds(
    fns: Sequence[Callable[[], object]],
    *,
    rounds: int,
    inners: Sequence[int] | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    after_round: Callable[[], object] | None = None,
) -> list[list[float]]:
    """`rounds` rounds of one sample (seconds per call) of every function, in a fresh random
    order each round: entry [r][i] is function i's sample of round r. Nothing is re-taken, so
    the samples of one round stay paired: a slowdown burst lands on the round it happened in,
    and a ratio of two functions' samples within one round cancels slow drift
    (docs/statistics.md#measured-speedup-intervals). No warm-up: the caller does it."""
    fns = list(fns)
    inners = [1] * len(fns) if inners is None else list(inners)
    rng = random.Random(seed)
    order = list(range(len(fns)))
    out: list[list[float]] = []
    for _ in range(rounds):
        rng.shuffle(order)
        row = [0.0] * len(fns)
        for i in order:
            row[i] = _sample(fns[i], inners[i], clock)
        out.append(row)
        if after_round is not None:
            after_round()
    return out
