"""A decision from a sweep that cannot be measured again: the fixed-round rule beside the
sequential one, on synthetic sweeps with known truth.

    python benchmarks/bench_fixed_rounds.py              # the report (reports/fixed-round-decisions)
    python benchmarks/bench_fixed_rounds.py --cells 60   # quicker, noisier figures
    python benchmarks/bench_fixed_rounds.py --seed 1     # other cells of the same kind
    python benchmarks/bench_fixed_rounds.py --seeds 0    # without the row repeated on other cells

The cells are benchmarks/bench_selection.py's (true T(n)/T(0) = 1 + c n, half with a knee; the
demo's tau with its calibration error; one lognormal drift per round, sigma 0.3, times each
sample's own lognormal noise), measured with a fixed number of rounds (15, 25, 40: the user's
own measurements, or a finished budget) or sequentially (10 rounds, doubled while open, at most
40, the confidence spent over the 3 looks, as `treeopt sweep --budget` measures). Each
measured cell is decided twice on the same bootstrap draws: by the rule that leaves a cell
undecided while more rounds could change the answer (`decide_cell`), and by the fixed-round
rule `treeopt select` applies to a finished sweep (`decide_cell(fixed_rounds=True)`: the tree
of best worst-case paired bound, on draws whose step times do not fall as the tree grows, where
a tree beats plain decoding at its lower bound;
docs/statistics.md#a-sweep-that-cannot-be-measured-again).

The row closest to the target, 15% noise and 15 rounds by the fixed-round rule, is measured
again on `--seeds` other sets of as many cells (seeds 1, 2, ...): each set's share, and the
share over all of them with its one-sided 95% upper bound (Clopper-Pearson), so the target is
met with the sampling error of the cells counted, not on one lucky set.

Counted per row, over all cells (targets of issue 47):
- bad: decided on a tree whose true speedup is more than 5% below the true best's (plain
  decoding, 1.0, counts as a candidate); target at most 5% in every row, and the 95% upper
  bound of the repeated row's share at most 5%;
- undecided: cells left undecided; target at most 25% at 5% noise and 15 rounds (fixed-round rule);
- coverage: decided cells with a tree whose interval holds its true speedup; target >= 90% in
  every row with at least 20 decided cells.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import beta

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_selection import BAD_REGRET, SIZES, TAU, TAU_SE, draw_rounds, true_overhead  # noqa: E402

from treeopt.stats import (  # noqa: E402
    CONFIDENCE,
    DEFAULT_TOLERANCE,
    bootstrap_speedups,
    decide_cell,
    interval,
    sequential_confidence,
    shipped_confidence,
)

MEASUREMENTS = {"15": (15,), "25": (25,), "40": (40,), "10->40 sequential": (10, 20, 40)}
RULES = ("undecided stays", "fixed-round")
MIN_DECIDED_FOR_COVERAGE = 20
REPEATED = (0.15, "15")  # the noisiest and shortest measurement: the fixed-round rule's hardest row


def decide_both(samples, tau_hat, *, confidence: float, seed: int, last: bool):
    """(strict decision, fixed-round decision, lo, hi) of one cell on one set of draws; the
    fixed-round rule only differs where the strict one is open, and is asked only at the `last`
    look (before it, an open cell is measured again)."""
    draws = bootstrap_speedups(samples, tau_hat, TAU_SE, seed=seed)
    lo, hi = interval(draws.speedup, shipped_confidence(confidence, SIZES.size - 1))
    args = (draws.speedup_point, lo, hi, np.ones(SIZES.size, dtype=bool))
    rule = {"draws": draws.speedup, "confidence": confidence, "tolerance": DEFAULT_TOLERANCE}
    strict = decide_cell(*args, rounds=samples.shape[0], **rule)
    fixed = strict
    if last and not strict.settled:
        fixed = decide_cell(*args, rounds=samples.shape[0], fixed_rounds=True, overhead=draws.overhead, **rule)
    return strict, fixed, lo, hi


def one_cell(rng, noise: float, schedule: tuple[int, ...], seed: int) -> dict:
    """Per rule (bad, undecided, covered or None) of one synthetic cell measured on `schedule`."""
    overhead = true_overhead(rng)
    truth = TAU / overhead
    best = max(float(truth.max()), 1.0)
    tau_hat = TAU + TAU_SE * rng.standard_normal()
    confidence = sequential_confidence(len(schedule)) if len(schedule) > 1 else CONFIDENCE
    samples = draw_rounds(rng, overhead, schedule[0], noise)
    for i, total in enumerate(schedule):  # a sequential sweep extends while the strict rule is open
        if samples.shape[0] < total:
            samples = np.vstack([samples, draw_rounds(rng, overhead, total - samples.shape[0], noise)])
        last = i == len(schedule) - 1
        strict, fixed, lo, hi = decide_both(samples, tau_hat, confidence=confidence, seed=seed + i, last=last)
        if strict.settled:
            break
    out = {}
    for name, decision in zip(RULES, (strict, fixed)):
        decided = decision.reason != "undecided"
        k = decision.index
        shipped = truth[k] if k else 1.0
        covered = bool(lo[k] <= truth[k] <= hi[k]) if (decided and k) else None
        out[name] = (decided and shipped < (1.0 - BAD_REGRET) * best, not decided, covered)
    return out


def measured(cells: int, seed: int, noise: float, name: str) -> list[dict]:
    """Per cell of one row, per rule (bad, undecided, covered or None)."""
    schedule = MEASUREMENTS[name]
    rng = np.random.default_rng([seed, int(noise * 1000), len(name), schedule[-1]])
    return [one_cell(rng, noise, schedule, seed + 7 * i) for i in range(cells)]


def upper_bound(bad: int, cells: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound of a share seen as `bad` of `cells`."""
    return float(beta.ppf(confidence, bad + 1, cells - bad)) if bad < cells else 1.0


def repeated_row(cells: int, seeds: int, seed: int) -> list[int]:
    """Cells decided on a tree >5% worse by the fixed-round rule in the REPEATED row, on each
    of `seeds` further sets of `cells` cells (seeds seed + 1, ...)."""
    noise, name = REPEATED
    return [sum(g["fixed-round"][0] for g in measured(cells, seed + k, noise, name)) for k in range(1, seeds + 1)]


def rows(cells: int, seed: int = 0) -> list[dict]:
    table = []
    for noise in (0.05, 0.10, 0.15):
        for name in MEASUREMENTS:
            got = measured(cells, seed, noise, name)
            for rule in RULES:
                per = [g[rule] for g in got]
                covered = [c for _, _, c in per if c is not None]
                table.append(
                    {
                        "noise": noise,
                        "rounds": name,
                        "rule": rule,
                        "cells": cells,
                        "bad": float(np.mean([b for b, _, _ in per])),
                        "undecided": float(np.mean([u for _, u, _ in per])),
                        "coverage": float(np.mean(covered)) if covered else float("nan"),
                        "decided": len(covered),
                    }
                )
    return table


def repeated_bad(table: list[dict]) -> int:
    """Cells of the REPEATED row decided on a tree >5% worse by the fixed-round rule."""
    noise, name = REPEATED
    row = next(r for r in table if r["rule"] == "fixed-round" and r["noise"] == noise and r["rounds"] == name)
    return round(row["bad"] * row["cells"])


def checks(table: list[dict], repeated: list[int]) -> list[tuple[str, float, float, bool]]:
    """(what, measured, target, at most) for the issue's three targets."""
    fixed = [r for r in table if r["rule"] == "fixed-round"]
    judged = [r for r in table if r["decided"] >= MIN_DECIDED_FOR_COVERAGE]
    cells = table[0]["cells"]
    bad = [repeated_bad(table), *repeated]
    return [
        (
            "share of cells decided on a tree >5% worse (worst row, both rules)",
            max(r["bad"] for r in table),
            0.05,
            True,
        ),
        (
            f"95% upper bound of that share at {REPEATED[0]:.0%} noise and {REPEATED[1]} rounds, fixed-round rule, "
            f"{len(bad)} sets of {cells} cells",
            upper_bound(sum(bad), cells * len(bad)),
            0.05,
            True,
        ),
        (
            "share undecided at 5% noise and 15 rounds (fixed-round rule)",
            next(r["undecided"] for r in fixed if r["noise"] == 0.05 and r["rounds"] == "15"),
            0.25,
            True,
        ),
        (
            f"coverage of the shipped interval (worst row with >= {MIN_DECIDED_FOR_COVERAGE} decided cells)",
            min((r["coverage"] for r in judged), default=float("nan")),  # nan: too few cells to judge
            0.90,
            False,
        ),
    ]


def main(cells: int, seed: int = 0, seeds: int = 4) -> int:
    t0 = time.perf_counter()
    table = rows(cells, seed)
    repeated = repeated_row(cells, seeds, seed)
    print(f"{cells} cells per row (seed {seed}), tolerance {DEFAULT_TOLERANCE:.0%}, 95% comparisons")
    print()
    print("| noise | rounds | rule | bad | undecided | coverage | decided cells |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['noise']:.0%} | {r['rounds']} | {r['rule']} | {r['bad']:.1%} | {r['undecided']:.1%} "
            f"| {r['coverage']:.1%} | {r['decided']} |"
        )
    print()
    noise, name = REPEATED
    bad = [repeated_bad(table), *repeated]
    print(f"The {noise:.0%} noise, {name} rounds row by the fixed-round rule on {len(bad)} sets of {cells} cells:")
    print()
    print("| seed | bad | 95% upper bound |")
    print("|---|---|---|")
    for k, b in enumerate(bad):
        print(f"| {seed + k} | {b / cells:.2%} ({b} cells) | {upper_bound(b, cells):.2%} |")
    total, counted = sum(bad), cells * len(bad)
    print(f"| all | {total / counted:.2%} ({total} of {counted}) | {upper_bound(total, counted):.2%} |")
    print()
    failed = 0
    for what, value, target, at_most in checks(table, repeated):
        ok = value <= target if at_most else value >= target
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {value:.3f} (target {'<=' if at_most else '>='} {target})")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=400, help="cells per row [default: 400]")
    parser.add_argument("--seed", type=int, default=0, help="draws other cells [default: 0, the report's]")
    parser.add_argument("--seeds", type=int, default=4, help="further sets of cells for the hardest row [default: 4]")
    args = parser.parse_args()
    sys.exit(main(args.cells, args.seed, args.seeds))
