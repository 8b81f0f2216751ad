"""`treeopt select --sweep` brings the pooled evidence of `treeopt run` to any sweep file: one
engine profile fitted to every cell (docs/statistics.md#pooled-evidence)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import treeopt

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "reports" / "demo-cpu"


def _copy_sweep(to: Path, *, with_hardware: bool) -> Path:
    for name in ("sweep.csv", "sweep.meta.json", "sweep.samples.npz") + (("hardware.json",) if with_hardware else ()):
        shutil.copy(RUN / name, to / name)
    return to / "sweep.csv"


def test_select_on_a_run_sweep_repeats_the_runs_pooled_evidence():
    # The committed run wrote selection.json with its pooled fit from the same sweep: a second
    # selection from the sweep file alone, finding the model and the run's hardware.json from the
    # metadata, must reach the same fit and the same per-cell verdicts.
    ran = json.loads((RUN / "selection.json").read_text())
    again = treeopt.select(treeopt.load_sweep(RUN / "sweep.csv"), tolerance=ran["tolerance"]).to_dict()
    # to 1e-4: the same MAP fit, but scipy builds stop its solver at points ~1e-5 apart
    assert again["pooled_fit"]["terms"] == pytest.approx(ran["pooled_fit"]["terms"], rel=1e-4)
    keys = ("batch", "context", "nodes", "fit_nodes", "fit_consistent")
    assert [{k: c.get(k) for k in keys} for c in again["cells"]] == [{k: c.get(k) for k in keys} for c in ran["cells"]]
    assert again["pooled_fit"]["consistent_cells"] == ran["pooled_fit"]["consistent_cells"]


def _select(args, cwd):
    return subprocess.run([sys.executable, "-m", "treeopt", "select", *args], capture_output=True, text=True, cwd=cwd)


def test_a_sweep_whose_hardware_cannot_be_found_says_what_to_give(tmp_path):
    sweep = _copy_sweep(tmp_path, with_hardware=False)  # 'cpu-calibrated' is no built-in profile
    out = _select(["--sweep", str(sweep), "-o", "sel.json"], tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "sel.json").read_text())
    assert "give --hardware" in doc["pooled_fit"]["skipped"]
    assert "no profile fitted on every cell" in out.stdout
    assert all("fit_nodes" not in c for c in doc["cells"])


def test_no_pooled_leaves_the_fit_out(tmp_path):
    sweep = _copy_sweep(tmp_path, with_hardware=True)
    out = _select(["--sweep", str(sweep), "--no-pooled", "-o", "sel.json"], tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "sel.json").read_text())
    assert "pooled_fit" not in doc and all("fit_nodes" not in c for c in doc["cells"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hardware", "no-such-gpu"], "--hardware: unknown hardware 'no-such-gpu'"),
        (["--model", "no/such/model"], "no/such/model"),
    ],
)
def test_a_wrong_model_or_hardware_given_for_the_fit_is_one_line(tmp_path, args, message):
    sweep = _copy_sweep(tmp_path, with_hardware=True)
    out = _select(["--sweep", str(sweep), *args, "-o", "sel.json"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "sel.json").exists()


def test_model_and_hardware_need_a_sweep(tmp_path):
    grid = ROOT / "reports" / "demo-cpu" / "prediction" / "grid.csv"
    out = _select(["--grid", str(grid), "--accuracy", str(RUN / "accuracy.json"), "--hardware", "h100"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "treeopt: error: --model/--hardware: only meaningful with --sweep (the pooled fit of its cells)"
    )
