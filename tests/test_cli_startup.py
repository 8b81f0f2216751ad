"""What every command does before its own work: the tree commands answer without loading the
heavy libraries (their work takes milliseconds; pandas and scipy alone take 1 s quiet and up to
14 s on a loaded machine), and an environment that would break a library import is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ACCURACY = ROOT / "reports" / "demo-cpu" / "accuracy.json"
DRAFT_ACCURACY = ROOT / "reports" / "drafters-demo" / "run-draft-model" / "accuracy.json"
HEAVY = ("pandas", "scipy", "matplotlib", "torch", "transformers")
TREE = "[[0],[1],[0,0],[0,1],[1,0]]"


def _loaded_after(argv: list[str], cwd: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    code = (
        "import sys\n"
        "from treeopt.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "finally:\n"
        f"    print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
    line = [x for x in out.stdout.splitlines() if x.startswith("LOADED")]
    assert line, out.stdout + out.stderr
    return eval(line[-1].removeprefix("LOADED ")), out


@pytest.mark.parametrize(
    "argv",
    [
        ["show", TREE, "--accuracy", str(ACCURACY)],
        ["buffers", TREE],
        ["check", TREE, "--engine", "trtllm", "--accuracy", str(ACCURACY)],
        ["check", TREE, "--engine", "sglang-standalone", "--accuracy", str(DRAFT_ACCURACY)],
        ["build", "--accuracy", str(ACCURACY), "--nodes", "12", "--engine", "trtllm"],
        ["compare", TREE, "[[0],[0,0]]", "--accuracy", str(ACCURACY)],
    ],
    ids=lambda a: a[0] + ("-" + a[a.index("--engine") + 1] if "--engine" in a else ""),
)
def test_tree_commands_load_no_heavy_library(argv, tmp_path):
    loaded, out = _loaded_after(argv, tmp_path)
    assert out.returncode == 0, out.stderr
    assert loaded == [], f"{argv[0]} loaded {loaded}"


def test_select_still_works_from_its_own_module(tmp_path):
    # Moving `select` out of the tree commands must not lose it: its help and its refusal of a
    # call with neither source are the documented ones.
    out = subprocess.run([sys.executable, "-m", "treeopt", "select"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == "treeopt: error: select: give exactly one of --sweep or --grid"


def _build_with_epoch(value: str, cwd: Path) -> subprocess.CompletedProcess:
    """`treeopt build ... -o t.json` with SOURCE_DATE_EPOCH set to `value`."""
    argv = [sys.executable, "-m", "treeopt", "build", "--accuracy", str(ACCURACY), "--nodes", "4", "-o", "t.json"]
    # a bare environment, but the repository under test first on the path (tools/mutants.py
    # tests a copy of it)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "SOURCE_DATE_EPOCH": value}
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env)


@pytest.mark.parametrize("value", ["abc", "", "1.5", "1e9"])
def test_a_source_date_epoch_that_is_no_unix_time_is_one_line(value, tmp_path):
    # The reproducible-builds specification: SOURCE_DATE_EPOCH is a decimal integer of seconds.
    # numpy reads it with int() when scipy is imported, which would be a traceback mid-command.
    out = _build_with_epoch(value, tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "SOURCE_DATE_EPOCH" in out.stderr, out.stderr
    assert not (tmp_path / "t.json").exists()


def test_a_valid_source_date_epoch_is_taken(tmp_path):
    out = _build_with_epoch("1700000000", tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "t.json").exists()
