"""Compare the selections of `treeopt run` folders cell by cell (a markdown table).

    python tools/compare_runs.py RUN_DIR RUN_DIR [RUN_DIR ...]

The three readings of agreement at the first run's tolerance δ (points, intervals, pooled) are
`treeopt.agreement`'s; `benchmarks/selection_under_load.py` uses the same to check runs on a
busy machine against quiet ones.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treeopt.agreement import compare_runs  # noqa: E402
from treeopt.errors import UserError  # noqa: E402


def _yes(value) -> str:
    return "--" if value is None else ("yes" if value else "NO")


def main(runs: list[str]) -> int:
    try:
        table = compare_runs(runs)
    except UserError as err:
        print(f"compare_runs: error: {err}", file=sys.stderr)
        return 2
    names = [Path(r).name for r in runs]
    print(f"| batch | context | {' | '.join(names)} | points ratio | agree | intervals | pooled ratio | agree |")
    print("|---|---|" + "---|" * len(runs) + "---|---|---|---|---|")
    for (batch, context), row in table.iterrows():
        picks = " | ".join(str(row[n]) for n in names)
        print(
            f"| {batch} | {context} | {picks} | {row['points_ratio']:.3f} | {_yes(row['points'])} | "
            f"{_yes(row['intervals'])} | {row['pooled_ratio']:.3f} | {_yes(row['pooled'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
