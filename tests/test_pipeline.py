"""The main job end to end on the bundled demo model, at a small size."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from tests.test_strict_json import strict as strict_json
from treeopt.app.run import run_main_job
from treeopt.app.stages import calibrate as stage
from treeopt.app.stages.job import Job, RunSettings
from treeopt.cli import main
from treeopt.tree import make_tree

SMALL = RunSettings(
    steps=8,
    sizes=(0, 1, 4),
    max_nodes=4,
    batches=(1, 2),
    contexts=(32,),
    repeats=5,
    validation_sizes=(1, 4),
    validation_prompts=8,
    hw_quick=True,
    device="cpu",
)


def test_run_main_job_writes_a_consistent_report_and_resumes(tmp_path):
    out = tmp_path / "run"
    logs, said = [], []
    result = run_main_job(out, SMALL, log=logs.append, progress=False, say=said.append)
    # results (the selection, the validation, the report's path) apart from the progress lines
    assert said[-1].startswith("report: ") and any(line.startswith("best tree per") for line in said)
    assert not any(line.startswith("report: ") or line.startswith("best tree per") for line in logs)
    # every JSON file of the run is strict JSON; no calibration checkpoint is left behind
    for path in out.rglob("*.json"):
        strict_json(path.read_text())
    assert not list(out.rglob("*.partial")), "a finished run keeps no calibration checkpoint"
    # the report opens with the answer: per cell the line to paste, why and how sure
    index = (out / "index.md").read_text()
    assert index.index("## The answer: what to ship per batch size") < index.index("## 1. Head accuracies")
    answer = _markdown_table(index, "| batch | context | ship | why | how sure |")
    doc = json.loads((out / "selection.json").read_text())
    assert [(r["batch"], r["context"]) for r in answer] == [(str(c["batch"]), str(c["context"])) for c in doc["cells"]]
    for row, cell in zip(answer, doc["cells"], strict=True):
        assert row["ship"] == (f"`medusa_choices = {cell['medusa_choices']}`" if cell["nodes"] else "no speculation")

    for name in (
        "accuracy.json",
        "proposal_tree.json",
        "hardware.json",
        "sweep.csv",
        "selection.json",
        "validation_acceptance.csv",
        "validation_acceptance.png",
        "validation_latency.png",
        "index.md",
        "prediction/index.md",
        "prediction/roofline.png",
    ):
        assert (out / name).is_file(), name

    acc = json.loads((out / "accuracy.json").read_text())
    assert acc["format"] == "treeopt.accuracy/v1" and acc["num_heads"] == 4
    proposal = make_tree(json.loads((out / "proposal_tree.json").read_text())["medusa_choices"])
    assert proposal.size == 4

    selection = json.loads((out / "selection.json").read_text())
    assert selection["format"] == "treeopt.selection/v1"
    assert {(c["batch"], c["context"]) for c in selection["cells"]} == {(1, 32), (2, 32)}
    for cell in selection["cells"]:
        # every cell is a prefix of the proposal sequence, or no speculation
        assert cell["medusa_choices"] == proposal.prefix(cell["nodes"]).to_choices()
        assert (cell["nodes"] == 0) == (cell["speedup"] == 1.0)

    # measured acceptance: greedy decoding accepts at least the root's bonus token, and a
    # bigger tree (a superset) never accepts fewer tokens per step on the same prompts
    table = result["validation"].acceptance.set_index("nodes")
    assert table.loc[1, "measured_tokens_per_step"] >= 1.0
    assert table.loc[4, "measured_tokens_per_step"] >= table.loc[1, "measured_tokens_per_step"]

    index = (out / "index.md").read_text()
    assert "validation_acceptance.png" in index and "prediction/index.md" in index

    # a rerun keeps every stage done with the same settings; a traffic mix adds its tree
    logs.clear()
    run_main_job(out, replace(SMALL, mix="1:0.5,2:0.5"), log=logs.append, progress=False)
    assert any("[calibrate] done earlier" in m for m in logs)
    assert any("[hardware] done earlier" in m for m in logs)
    mix = json.loads((out / "selection.json").read_text())["mix"]
    assert [(c["batch"], c["context"], c["weight"]) for c in mix["cells"]] == [(1, 32, 0.5), (2, 32, 0.5)]
    assert mix["medusa_choices"] == proposal.prefix(mix["nodes"]).to_choices()
    # the mix tree runs one size everywhere, so it cannot beat the best measured size of every
    # cell (its own shipped answer may be a smaller tree within --tolerance of that best, or no
    # speculation where it is undecided, so per_cell_best_tokens_per_s is not a bound)
    sweep = pd.read_csv(out / "sweep.csv")
    plain = sweep[sweep["nodes"] == 0].set_index(["batch", "context"])
    bound = sum(
        c["weight"]
        * c["batch"]
        / plain.loc[(c["batch"], c["context"]), "step_time_s"]
        * max(1.0, sweep[(sweep["batch"] == c["batch"]) & (sweep["context"] == c["context"])]["speedup"].max())
        for c in mix["cells"]
    )
    # selection.json keeps six decimals: a mix tree that is every cell's best meets the bound
    # exactly and may round up to it by 5e-7
    assert mix["expected_tokens_per_s"] <= bound * (1 + 1e-9) + 5e-7
    assert "### One tree for the traffic mix" in (out / "index.md").read_text()
    assert_one_tree_per_cell(out)


def _markdown_table(text: str, header_start: str) -> list[dict]:
    """The rows of the markdown table whose header line starts with `header_start`."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    names = [c.strip() for c in lines[i].strip("|").split("|")]
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def assert_one_tree_per_cell(out):
    """index.md's cell table, its validation table and its traffic-mix block, and the
    validation CSV, all show the tree selection.json ships in each cell."""
    doc = json.loads((out / "selection.json").read_text())
    shipped = {(str(c["batch"]), str(c["context"])): c["nodes"] for c in doc["cells"]}
    index = (out / "index.md").read_text()
    cells = _markdown_table(index, "| batch | context | chosen nodes |")
    as_shown = {(r["batch"], r["context"]): r["chosen nodes"] for r in cells}
    assert as_shown == {k: str(n) if n else "no speculation" for k, n in shipped.items()}
    validation = _markdown_table(index, "| batch | context | predicted_nodes | selected_nodes |")
    assert {(r["batch"], r["context"]): int(r["selected_nodes"]) for r in validation} == shipped
    csv = pd.read_csv(out / "validation_selection.csv")
    assert {
        (str(b), str(c)): n for b, c, n in csv[["batch", "context", "selected_nodes"]].itertuples(index=False)
    } == shipped
    if "mix" in doc:
        mix = _markdown_table(index, "| batch | context | weight | best nodes |")
        for r in mix:
            n = shipped[(r["batch"], r["context"])]
            assert r["best nodes"] == (str(n) if n else "none")


def test_run_bad_option_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--sizes", "0,x", "-o", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treeopt: error: --sizes")
    assert not (tmp_path / "r").exists()


def test_run_missing_model_leaves_no_report_folder(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "run",
                "--model",
                str(tmp_path / "no-model"),
                "--data",
                "demo",
                "--validation-data",
                "demo-validation",
                "-o",
                str(tmp_path / "r"),
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("treeopt: error: --model:") and "no-model" in err[-1]
    assert not (tmp_path / "r").exists()


def test_step_predictor_charges_only_the_heads_the_tree_reaches():
    """The reference decoder runs a draft head only when the tree reaches its depth, on one token
    per sequence: a 2-node tree of depth 1 pays for one head, the same size at depth 2 for two,
    and plain decoding for none."""
    from types import SimpleNamespace

    import torch

    from roofline.hardware import load_hardware
    from roofline.latency import step_time_s
    from roofline.shapes import DraftHeadsShape
    from treeopt.app.models import shape_of
    from treeopt.app.sweep import step_predictor

    heads = SimpleNamespace(num_heads=4, num_layers=1, hidden_size=256, vocab_size=4096)
    lm = SimpleNamespace(name="demo", dtype=torch.float32, heads=heads)
    hw = load_hardware("a100")
    shape = shape_of("demo", dtype="float32")

    def direct(used_heads, tokens):
        draft = DraftHeadsShape(used_heads, 1, 256, 4096, tokens_per_sequence=1) if used_heads else None
        return float(step_time_s(shape, draft, hw, batch=2, tokens=tokens, context=64))

    wide = step_predictor(lm, make_tree([[0], [1], [0, 0]]), hw)  # prefix(2) has depth 1
    deep = step_predictor(lm, make_tree([[0], [0, 0], [1]]), hw)  # prefix(2) has depth 2
    assert wide(2, 1, 64) == deep(2, 1, 64) == direct(0, 1)
    assert wide(2, 3, 64) == direct(1, 3)
    assert deep(2, 3, 64) == direct(2, 3)
    assert deep(2, 3, 64) > wide(2, 3, 64)


BURN_SECONDS = 150
BUSY = RunSettings(
    steps=8,
    sizes=(0, 1, 2, 4),
    max_nodes=4,
    batches=(1, 2),
    contexts=(32,),
    repeats=6,
    time_budget_s=10,
    validation_sizes=(1,),
    validation_prompts=4,
    hw_quick=True,
    device="cpu",
)


@pytest.mark.slow
def test_two_runs_on_a_busy_machine_agree(tmp_path):
    """Two small main jobs while a CPU-burning process (started and stopped here) competes for
    the cores: in every cell both runs decide, their picks' speedup intervals overlap, and no
    cell reports a speedup above tau."""
    burner = subprocess.Popen(
        [sys.executable, "-c", f"import time\nend = time.time() + {BURN_SECONDS}\nwhile time.time() < end: pass"]
    )
    try:
        docs, sweeps = [], []
        for name in ("a", "b"):
            run_main_job(tmp_path / name, BUSY, log=lambda m: None, progress=False)
            docs.append(json.loads((tmp_path / name / "selection.json").read_text()))
            sweeps.append(pd.read_csv(tmp_path / name / "sweep.csv"))
    finally:
        burner.kill()
        burner.wait()
    # The two runs may pick differently where trees are statistically tied; what must agree is
    # the measurement of every tree either run picked: its speedup interval in one run overlaps
    # its interval in the other.
    decided = ("best", "tied-with-smaller", "no speculation")
    first, second = ({(c["batch"], c["context"]): c for c in d["cells"]} for d in docs)
    rows = [df.set_index(["batch", "context", "nodes"]) for df in sweeps]
    for key, a in first.items():
        b = second[key]
        if a["reason"] not in decided or b["reason"] not in decided:
            continue
        for nodes in {a["nodes"], b["nodes"]} - {0}:
            (a_lo, a_hi), (b_lo, b_hi) = (tuple(r.loc[(*key, nodes), ["speedup_lo", "speedup_hi"]]) for r in rows)
            assert a_lo <= b_hi and b_lo <= a_hi, (key, nodes, (a_lo, a_hi), (b_lo, b_hi))
    for doc in docs:
        assert doc["threads"] >= 1
        for c in doc["cells"]:
            assert c["nodes"] == 0 or c["speedup"] <= c["tau"], c
    for df in sweeps:
        ok = df[df["unreliable"] == 0]
        assert (ok["speedup"] <= ok["tau"] + 1e-12).all()


def test_run_on_a_model_of_ones_own_needs_its_own_prompts(capsys, tmp_path):
    """The demo's Python prompts stand in only for the demo model: for any other model `run`
    says at once which prompts it needs, before loading anything."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    for argv, option in (
        (["run", "--model", str(tmp_path / "m"), "-o", str(tmp_path / "r")], "--data"),
        (
            ["run", "--model", str(tmp_path / "m"), "--data", str(prompts), "-o", str(tmp_path / "r")],
            "--validation-data",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"treeopt: error: {option}: required for --model")
        assert not (tmp_path / "r").exists()


def test_a_second_run_into_the_same_folder_fails_at_once(capsys, tmp_path):
    import os

    out = tmp_path / "r"
    # a first `treeopt run -o r`, in another process (a process's own lock is re-entrant)
    hold = "import sys, time\nfrom treeopt.fileio import output_lock\nwith output_lock(sys.argv[1]):\n"
    hold += "    print('held', flush=True)\n    time.sleep(300)\n"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    first = subprocess.Popen(
        [sys.executable, "-c", hold, str(out / "run_state.json")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert first.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as exit_info:
            main(["run", "-o", str(out)])
    finally:
        first.kill()
        first.wait()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is being written by another treeopt process" in err[0]
    assert not (out / "accuracy.json").exists()


@pytest.mark.parametrize("command", ["sweep", "validate"])
def test_a_drafter_shallower_than_the_proposal_is_one_line(capsys, tmp_path, command):
    """A table calibrated for deeper heads than the loaded drafter: one line naming --heads, at
    once after the model loads, and nothing written."""
    from calibration.models import tiny_model_for_tests

    model = tiny_model_for_tests(tmp_path / "tiny", num_medusa_heads=2)
    argv = [
        command,
        "--model",
        str(model),
        "--accuracy",
        "reports/demo-cpu/accuracy.json",
        "--sizes",
        "8",
        "--device",
        "cpu",
    ]
    argv += ["--batch", "1", "--context", "8", "-o", str(tmp_path / "s.csv")] if command == "sweep" else []
    argv += ["--data", "demo-validation"] if command == "validate" else []
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("treeopt: error: --heads: the drafter of") and "need 3" in err[-1]
    assert not (tmp_path / "s.csv").exists()


def test_run_for_vllm_with_medusa_heads_measures_and_picks_only_the_chains_vllm_drafts(tmp_path):
    import pandas as pd

    from treeopt.engines import check, get_engine

    # The demo's drafter is Medusa heads, which vLLM <= 0.32 serves only through its Medusa
    # proposer, as a top-1 chain of num_speculative_tokens (docs/engines.md#drafters-and-engines):
    # the run says so and measures, picks and pastes only such chains.
    settings = replace(SMALL, sizes=(0, 1, 2, 3, 4, 8), max_nodes=8, engine="vllm@0.20")
    logs = []
    run_main_job(tmp_path / "r", settings, log=logs.append, progress=False)
    assert any("vLLM <= 0.32 serves Medusa heads as a top-1 chain" in m for m in logs)
    chain = get_engine("vllm-medusa@0.32")
    proposal = make_tree(json.loads((tmp_path / "r" / "proposal_tree.json").read_text())["medusa_choices"])
    assert proposal.paths == tuple((0,) * d for d in range(1, proposal.size + 1))
    measured = sorted(int(n) for n in pd.read_csv(tmp_path / "r" / "sweep.csv")["nodes"].unique())
    assert max(measured) <= 4  # one token per head: the demo has 4
    for n in measured:
        assert n == 0 or check(proposal.prefix(n), chain, heads=4).as_written, n
    cells = json.loads((tmp_path / "r" / "selection.json").read_text())["cells"]
    for cell in cells:
        assert cell["nodes"] == 0 or check(make_tree(cell["medusa_choices"]), chain, heads=4).as_written
    index = (tmp_path / "r" / "index.md").read_text()
    if any(c["nodes"] for c in cells):
        assert '"method": "medusa"' in index and "speculative_token_tree" not in index
    # vLLM's Medusa proposer ignores the per-batch table (only ngram, eagle, eagle3, mtp,
    # draft_model and dflash honour it): the run's answer says so under the table
    schedule = json.loads((tmp_path / "r" / "selection.json").read_text())["schedule"]
    assert schedule["engine"] == "vllm-medusa@0.32" and "config" not in schedule
    assert "Per-batch schedule: none for `vllm-medusa@0.32`" in index and "does not honour" in index


def test_the_committed_demo_report_shows_one_tree_per_cell():
    assert_one_tree_per_cell(Path(__file__).resolve().parent.parent / "reports" / "demo-cpu")


def test_run_calibrates_on_the_first_max_prompts(tmp_path):
    """`treeopt run --max-prompts N`: the calibration stage reads N prompts. With greedy labels
    over 6 generated tokens, head k has 6 - k labelled positions per prompt, so 3 prompts give
    15, 12, 9 and 6; the setting is recorded so that a rerun with another N recalibrates."""
    job = Job(RunSettings(max_prompts=3, steps=6, data="demo"), tmp_path, lambda m: None, progress=False)
    table = json.loads(stage.calibrate(job, "float32").read_text())
    assert [h["positions"] for h in table["heads"]] == [15, 12, 9, 6]
    assert stage.record(job, "float32")["max_prompts"] == 3
    assert "max_prompts" not in stage.record(replace(job, settings=replace(job.settings, max_prompts=None)), "float32")


def test_run_prints_results_on_stdout_and_progress_on_stderr(tmp_path, monkeypatch, capsys):
    """`treeopt run | tee results.txt` keeps the selection and the `report:` line; the stage
    progress goes to stderr (the wiring of the CLI; the stages' own split is checked above)."""
    import treeopt.cli.run_cmds as run_cmds

    def fake_job(out, settings, *, log, say, **kwargs):
        log("[calibrate] progress")
        say(f"report: {out}/index.md (1 s)")

    monkeypatch.setattr(run_cmds, "run_main_job", fake_job)
    main(["run", "--output", str(tmp_path / "r")])
    got = capsys.readouterr()
    assert got.out.strip().splitlines()[-1].startswith("report: ") and "[calibrate]" not in got.out
    assert "[calibrate] progress" in got.err and "report:" not in got.err
