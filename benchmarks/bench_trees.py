"""Speed targets of the tree builders (issues 2 and 13: the exact optimum on wide tables). Run:

    python benchmarks/bench_trees.py

Prints each target with the median of several timed runs and PASS/FAIL; exits 1 on a FAIL.
`main()` returns [(name, median_seconds, target_seconds), ...] for benchmarks/run_all.py.
Medians over repeats because this shared machine has multi-second slowdown bursts.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from _targets import exit_status, print_time_targets

from treeopt.accuracy import AccuracyTable, joint_counts_from_ranks
from treeopt.build import greedy_tree, joint_tree, optimal_tree


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up: imports, allocator, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _accuracy(heads: int, width: int, seed: int = 0) -> np.ndarray:
    """Realistic shape: decaying with rank and head, with noisy non-monotone tails."""
    rng = np.random.default_rng(seed)
    top1 = 0.6 * 0.7 ** np.arange(heads)
    decay = 0.55 ** np.arange(width)
    acc = top1[:, None] * decay[None, :] * rng.uniform(0.8, 1.2, size=(heads, width))
    return acc / np.maximum(acc.sum(axis=1, keepdims=True), 1.0)


def _ranks(positions: int, heads: int, width: int, seed: int = 0) -> np.ndarray:
    """Rank of the label under each head; correlated heads (a shared per-position
    difficulty), ranks >= width are misses."""
    rng = np.random.default_rng(seed)
    hardness = rng.exponential(1.0, size=(positions, 1))
    scale = hardness * (1.0 + 0.8 * np.arange(heads))[None, :]
    return np.floor(rng.exponential(scale)).astype(np.int64)


def main(repeats: int = 7) -> list[tuple[str, float, float]]:
    results = []

    acc = _accuracy(5, 10)
    t = _median_time(lambda: greedy_tree(acc, 1024), repeats)
    results.append(("greedy proposal sequence, 1024 nodes, 5 heads x 10 ranks", t, 0.050))

    t = _median_time(lambda: optimal_tree(acc, 256, max_depth=5), repeats)
    results.append(("optimal tree, 256 nodes, depth 5, 10 ranks", t, 1.0))

    wide = _accuracy(8, 1000, seed=1)
    t = _median_time(lambda: optimal_tree(wide, 2048), max(3, repeats // 2))
    results.append(("optimal tree, 2048 nodes, 8 heads x 1000 ranks (non-monotone tails)", t, 5.0))

    ranks = _ranks(1_000_000, 5, 10)

    def joint():
        positions = np.full(5, float(len(ranks)))
        table = AccuracyTable(hits=np.ones((5, 10)), positions=positions, joint=joint_counts_from_ranks(ranks, 10))
        return joint_tree(table, 256)

    t = _median_time(joint, max(3, repeats // 2))
    results.append(("joint tree from 1,000,000 positions (counting + 256 nodes)", t, 1.0))

    print_time_targets(results)
    return results


if __name__ == "__main__":
    sys.exit(exit_status(main()))
