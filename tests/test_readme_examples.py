"""The README's `$ treeopt ...` examples print what the README shows.

Every line the README shows under an example must appear in what the command prints today
(a line of `...` stands for lines left out). Examples that run a model are left to
`treeopt run` and the reports, since their timings change from run to run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from treeopt.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# commands that only read files and compute: their output is the same on every machine
PURE = {"check", "build", "compare", "show", "buffers", "roofline", "hw"}
EXIT_NOTE = "(exit status 2)"


def examples() -> list[tuple[str, list[str]]]:
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, re.S):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, shown = part.partition("\n")
            if command.endswith("\\"):  # continued on the next line: a model-running example
                continue
            argv = shlex.split(command)
            if argv[0] == "treeopt" and argv[1] in PURE:
                found.append((command, shown.rstrip("\n").splitlines()))
    return found


EXAMPLES = examples()


def test_the_readme_has_the_examples_this_test_reads():
    commands = [c for c, _ in EXAMPLES]
    assert len(commands) >= 12
    assert any(c.startswith("treeopt hw fit") for c in commands)
    assert any(c.startswith("treeopt build") and "--engine vllm" in c for c in commands)


def test_the_hw_fit_example_reads_the_demo_sweep_as_the_readme_says():
    """reports/demo-cpu/demo_steps.csv is that run's sweep.csv rewritten as tokens = nodes + 1,
    step_ms = 1000 x step_time_s."""
    sweep = pd.read_csv(ROOT / "reports" / "demo-cpu" / "sweep.csv")
    steps = pd.read_csv(ROOT / "reports" / "demo-cpu" / "demo_steps.csv")
    assert list(steps.columns) == ["batch", "context", "tokens", "step_ms"]
    assert (steps["batch"] == sweep["batch"]).all() and (steps["context"] == sweep["context"]).all()
    assert (steps["tokens"] == sweep["nodes"] + 1).all()
    assert np.allclose(steps["step_ms"], 1000 * sweep["step_time_s"], rtol=1e-12)


@pytest.mark.parametrize("command,shown", EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_readme_example_prints_what_the_readme_shows(command, shown, tmp_path, monkeypatch, capsys):
    # the README runs from the repository root; outputs go to a scratch copy of that layout
    (tmp_path / "reports").symlink_to(ROOT / "reports")
    (tmp_path / "treeopt").symlink_to(ROOT / "treeopt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    try:
        main(shlex.split(command)[1:])
        status = 0
    except SystemExit as stopped:
        status = stopped.code
    out, err = capsys.readouterr()
    printed = set((out + err).splitlines())
    expected = [line for line in shown if line.strip() not in ("...", EXIT_NOTE)]
    assert status == (2 if EXIT_NOTE in shown else 0), err
    missing = [line for line in expected if line not in printed]
    assert not missing, f"{command}: the README shows lines it no longer prints:\n" + "\n".join(missing)


def _readme_demo_rows() -> list[list[str]]:
    """The rows of the README's table of the committed demo run ("What the main job finds")."""
    section = README.split("### What the main job finds on the demo", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if re.match(r"^\| \d+ \| \d+ \|", line)]
    return [[cell.strip() for cell in row] for row in rows]


def test_the_readme_demo_table_is_the_committed_runs_selection():
    """Every number of the README's demo table is reports/demo-cpu/selection.json's, rounded as
    shown, and the interval's level is the one the selection states: a README regenerated from
    one run, not a copy of an older one."""
    import json

    selection = json.loads((ROOT / "reports" / "demo-cpu" / "selection.json").read_text(encoding="utf-8"))
    level = f"{100 * selection['interval_confidence']:.1f}% interval"
    assert level in README.split("### What the main job finds on the demo", 1)[1].split("\n## ", 1)[0]
    cells = {(c["batch"], c["context"]): c for c in selection["cells"]}
    rows = _readme_demo_rows()
    assert len(rows) == len(cells)
    for batch, context, tree, speedup, rounds, predicted in rows:
        c = cells[(int(batch), int(context))]
        nodes = int(c["nodes"])
        assert tree == ("no speculation" if nodes == 0 else f"{nodes} node" + ("s" if nodes != 1 else ""))
        shown = f"{c['speedup']:.2f}× ({c['speedup_lo']:.2f}–{c['speedup_hi']:.2f})"
        assert speedup == shown, (batch, context)
        assert int(rounds) == c["rounds"] and predicted == f"{c['predicted_speedup']:.2f}×"


def test_the_readme_demo_validation_numbers_are_the_committed_runs():
    """The README's sentences on the demo's validation quote reports/demo-cpu's own tables:
    tokens per step against the walked and joint statistics, agreement with plain decoding,
    the roofline's step-latency ratio, the tree picked by prediction and the batch-1 fit."""
    import math

    section = README.split("### What the main job finds on the demo", 1)[1].split("\n## ", 1)[0]
    text = " ".join(section.split())
    run = ROOT / "reports" / "demo-cpu"
    acc = pd.read_csv(run / "validation_acceptance.csv")
    lat = pd.read_csv(run / "validation_latency.csv")["overhead_error"].abs()
    sel = pd.read_csv(run / "validation_selection.csv")

    def quoted(pattern: str) -> tuple[str, ...]:
        found = re.search(pattern, text)
        assert found, pattern
        return found.groups()

    assert quoted(r"within ([\d.]+)% of the calibration's statistics walked") == (
        f"{100 * acc['error_walk'].abs().max():.1f}",
    )
    assert quoted(r"overrates big trees by up to ([\d.]+)%") == (f"{100 * acc['error_joint'].max():.1f}",)
    assert quoted(r"([\d.]+)% of the generated tokens are identical") == (f"{100 * acc['agreement'].min():.1f}",)
    assert quoted(r"within (\d+)% of measured \(median ([\d.]+)%\) over (\d+) configurations") == (
        f"{math.ceil(100 * lat.max())}",
        f"{100 * lat.median():.1f}",
        f"{len(lat)}",
    )
    assert quoted(r"at least ([\d.]+)% of the measured speedup") == (f"{100 * sel['fraction_of_selected'].min():.1f}",)
    transfer = " ".join((run / "fit_transfer.md").read_text(encoding="utf-8").split())
    shown = quoted(r"predicts the other batches' T\(n\)/T\(0\) within a median ([\d.]+)% \(worst ([\d.]+)%\)")
    assert f"off by a median {shown[0]}% (worst {shown[1]}%)" in transfer
