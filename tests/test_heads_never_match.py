"""Heads that never predict the model's next token (top-1 0.000 at every head: heads trained for
another model) stop `treeopt run` right after calibration with one line and exit status 2,
before the model loads for the sweep and validation (docs/architecture.md#heads-that-never-match)."""

from __future__ import annotations

import json

import pytest

from treeopt.app import run as run_module
from treeopt.app.stages import calibrate as stage
from treeopt.cli import main
from treeopt.errors import UserError

# four heads, ten ranks: never the top-1 token, now and then a lower rank (a head of another
# model still ranks some tokens; it never ranks the right one first)
NEVER = [[0.0, 0.0004, 0.0002] + [0.0] * 7 for _ in range(4)]
TRAINED = [[0.50, 0.12, 0.06] + [0.01] * 7, [0.44, 0.12, 0.06] + [0.01] * 7]


def test_a_table_whose_heads_never_match_stops_the_run(tmp_path):
    never = tmp_path / "never.json"
    never.write_text(json.dumps(NEVER))
    with pytest.raises(
        UserError, match=r"never predicted the model's next token \(top-1 accuracy 0.000 at every one of 4"
    ):
        stage.check_heads_match(never, "my-heads")
    trained = tmp_path / "trained.json"
    trained.write_text(json.dumps(TRAINED))
    stage.check_heads_match(trained, "my-heads")  # heads that match pass


def test_run_stops_before_loading_the_model_with_exit_status_2(tmp_path, monkeypatch, capsys):
    def calibrated_never(job, dtype):
        path = stage.accuracy_path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(NEVER))
        return path

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded for the sweep after heads that never match")

    monkeypatch.setattr(stage, "calibrate", calibrated_never)
    monkeypatch.setattr(run_module, "load_model", no_load)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--output", str(out), "--steps", "8", "--device", "cpu"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("treeopt: error: ") and "never predicted the model's next token" in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert (out / "accuracy.json").is_file() and not (out / "sweep.csv").exists()
