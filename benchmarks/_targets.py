"""The one way the speed benchmarks print their targets and turn them into an exit status."""

from __future__ import annotations


def print_time_targets(results: list[tuple[str, float, float]]) -> None:
    """Print (name, median_seconds, target_seconds) rows, one PASS/FAIL line each."""
    width = max(len(name) for name, _, _ in results)
    for name, seconds, target in results:
        verdict = "PASS" if seconds < target else "FAIL"
        print(f"{name:<{width}}  {seconds * 1e3:9.2f} ms  (target < {target * 1e3:.0f} ms)  {verdict}")


def exit_status(results: list[tuple[str, float, float]]) -> int:
    return 0 if all(seconds < target for _, seconds, target in results) else 1
