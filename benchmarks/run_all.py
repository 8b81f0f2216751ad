"""Run every benchmark and check the speed targets: `python benchmarks/run_all.py`.

Each benchmark module exposes main() -> list of (name, measured, target, unit, lower_is_better).
Timings on a shared VM are noisy: the modules take medians of many repeats.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

MODULES = [
    "bench_trees",
    "bench_roofline",
    "bench_profile_fit",
    "bench_published_steps",
    "bench_gemm_shapes",
    "bench_selection",
    "bench_calibration",
    "bench_decoder",
]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    wanted = argv or MODULES
    failed = 0
    rows = []
    for name in wanted:
        module = importlib.import_module(name)
        print(f"== {name}", flush=True)
        for row in module.main():
            rows.append((name, *row))
    print("\nsummary")
    for _module, name, measured, target, *rest in rows:
        lower_is_better = rest[1] if len(rest) > 1 else True
        unit = rest[0] if rest else "s"
        ok = measured <= target if lower_is_better else measured >= target
        failed += not ok
        rel = "<=" if lower_is_better else ">="
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {measured:.4g} {unit} (target {rel} {target:g} {unit})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
