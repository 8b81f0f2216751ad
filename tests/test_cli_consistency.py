"""One meaning per option across the commands: --dtype auto, --heads, --device mps, and the
command a report shows to regenerate it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from calibration.models import resolve_dtype
from treeopt.app.run_index import _rerun_command
from treeopt.app.stages.job import RunSettings
from treeopt.cli import cli, main
from treeopt.cli.calibration_cmds import hw_calibrate
from treeopt.cli.roofline_cmds import report_cmd
from treeopt.cli.run_cmds import run_cmd

ROOT = Path(__file__).resolve().parents[1]
CSV = str(ROOT / "treeopt" / "data" / "medusa_train_accuracy.csv")
DEMO_HEADS = str(ROOT / "calibration" / "demo_model" / "heads")

# /proc/cpuinfo flag lines as they read on CPUs with and without native bf16
SAPPHIRE_RAPIDS = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile"
COOPER_LAKE = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16"
SKYLAKE = "flags\t\t: fpu sse2 avx2 avx512f avx512bw"
ZEN2 = "flags\t\t: fpu sse2 avx2 sha_ni"

#: --dtype auto by device and CPU flags, written from the rule the docs give
#: (docs/statistics.md#the-demos-regime, docs/performance-model.md#measured-on-the-development-machine)
AUTO = [
    ("cpu", SAPPHIRE_RAPIDS, torch.bfloat16),
    ("cpu", COOPER_LAKE, torch.bfloat16),
    ("cpu", SKYLAKE, torch.float32),
    ("cpu", ZEN2, torch.float32),
    ("cpu", "", torch.float32),
    ("mps", ZEN2, torch.float16),
]


@pytest.mark.parametrize("device, cpuinfo, expected", AUTO)
def test_auto_dtype_is_one_rule(device, cpuinfo, expected):
    assert resolve_dtype("auto", torch.device(device), cpuinfo=cpuinfo) == expected


@pytest.mark.parametrize("bf16, expected", [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_dtype_on_cuda(monkeypatch, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_dtype("auto", torch.device("cuda"), cpuinfo=SAPPHIRE_RAPIDS) == expected


def test_run_and_the_standalone_commands_pick_the_same_dtype():
    from treeopt.app.stages.calibrate import run_dtype

    assert run_dtype("auto", "cpu") == str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    assert run_dtype("bf16", "cpu") == "bfloat16"


#: every command that runs a model, by its words after `treeopt`
MODEL_COMMANDS = [
    ("calibrate",),
    ("hw", "calibrate"),
    ("decode",),
    ("sweep",),
    ("validate",),
    ("run",),
    ("sglang-tau",),
]
#: what their --dtype help says auto is, written by hand from the rule above
AUTO_HELP = (
    "auto: bfloat16 on a CPU that multiplies it natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo), "
    "else float32; bfloat16 on CUDA (float16 on a GPU without bf16); float16 on MPS"
)


def _option_help(words, option: str) -> str:
    """The help text of `option` in `treeopt WORDS --help`, joined into one line."""
    out = CliRunner().invoke(cli, [*words, "--help"], terminal_width=400).output
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(option + " "))
    text = [lines[start].strip()]
    for line in lines[start + 1 :]:
        if line.strip().startswith("-") or not line.strip():
            break
        text.append(line.strip())
    return " ".join(text)


@pytest.mark.parametrize("words", MODEL_COMMANDS, ids=" ".join)
def test_every_dtype_help_states_the_one_default(words):
    text = _option_help(words, "--dtype")
    default = re.search(r"\[default: (.*)\]", text)
    assert default is not None, text
    assert default.group(1) == AUTO_HELP


def test_report_heads_is_a_directory_and_the_count_is_num_heads(tmp_path, capsys):
    base = ["report", "--model", "vicuna-7b", "--hardware", "a100", "--accuracy", CSV, "--batch", "1"]
    for words in (base, ["hw", "fit", "--model", "demo", "--hardware", "a100", "--measurements", "m.csv"]):
        with pytest.raises(SystemExit) as stop:
            main([*words, "--heads", "5", "-o", str(tmp_path / "r")])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("treeopt: error: --heads:") and "--num-heads 5" in err[0]
    assert not (tmp_path / "r").exists()
    main([*base, "--num-heads", "4", "-o", str(tmp_path / "k")])
    assert "with 4 draft heads" in (tmp_path / "k" / "index.md").read_text()
    # --heads DIR: the drafter's directory, as on the commands that run a model (the demo's 4 heads)
    main(["report", "--model", "demo", "--hardware", "a100", "--heads", DEMO_HEADS, "-o", str(tmp_path / "d")])
    assert "with 4 draft heads" in (tmp_path / "d" / "index.md").read_text()


def _shown_command(index: Path) -> str:
    text = index.read_text()
    return text.split("Regenerate with:\n\n```\n", 1)[1].split("\n```", 1)[0]


def test_the_report_regenerate_command_repeats_every_option(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "my report"
    argv = [
        "report",
        "--model",
        "vicuna-7b",
        "--dtype",
        "fp16",
        "--hardware",
        "h100",
        "--accuracy",
        CSV,
        "--csv-model",
        "vicuna-7b",
        "--num-heads",
        "3",
        "--batch",
        "1,4",
        "--context",
        "256,2048",
        "--max-nodes",
        "16",
        "--used-heads",
        "--engine",
        "vllm@0.20",
        "--note",
        "it's $HOME; `x`",
        "--note",
        "two",
        "-o",
        str(out),
    ]
    main(argv)
    words = shlex.split(_shown_command(out / "index.md"))
    assert words[:2] == ["treeopt", "report"]
    # what the user gave, parsed by the command itself: the same settings
    given = report_cmd.make_context("report", argv[1:]).params
    shown = report_cmd.make_context("report", words[2:]).params
    assert shown == given
    assert shown["notes"] == ("it's $HOME; `x`", "two") and shown["batches"] == (1, 4)


RUN_SETTINGS = RunSettings(
    model="/models/my vicuna",
    heads="/models/heads dir",
    drafter="hydra",
    num_heads=3,
    data="chat data.json",
    validation_data="held out.jsonl",
    device="cpu",
    dtype="bfloat16",
    threads=2,
    steps=16,
    max_prompts=100,
    sizes=(0, 1, 4),
    batches=(1, 8),
    contexts=(256,),
    repeats=12,
    time_budget_s=30.0,
    tolerance=0.02,
    hw_quick=True,
    engine="vllm",
    mix="1@256:0.5,8@256:0.5",
    output="reports/it's mine",
)
#: RUN_SETTINGS as `treeopt run` options: the values a user types for them
RUN_EXPECTED = {
    "model": "/models/my vicuna",
    "heads": "/models/heads dir",
    "drafter": "hydra",
    "num_heads": 3,
    "data": "chat data.json",
    "validation_data": "held out.jsonl",
    "device": "cpu",
    "dtype": "bfloat16",
    "threads": 2,
    "steps": 16,
    "max_prompts": 100,
    "sizes": (0, 1, 4),
    "batches": (1, 8),
    "contexts": (256,),
    "repeats": 12,
    "time_budget": 30.0,
    "tolerance": 0.02,
    "quick": True,
    "engine": "vllm",
    "mix": "1@256:0.5,8@256:0.5",
    "output": "reports/it's mine",
}


def test_the_run_regenerate_command_repeats_every_setting():
    words = shlex.split(_rerun_command(RUN_SETTINGS))
    assert words[:2] == ["treeopt", "run"]
    params = run_cmd.make_context("run", words[2:]).params
    assert {k: params[k] for k in RUN_EXPECTED} == RUN_EXPECTED
    # the demo with every default: nothing beyond the output folder
    assert shlex.split(_rerun_command(RunSettings(output="reports/run"))) == [
        "treeopt",
        "run",
        "--output",
        "reports/run",
    ]


def test_hw_calibrate_takes_mps_and_says_when_it_is_not_there(tmp_path, capsys):
    ctx = hw_calibrate.make_context("calibrate", ["--device", "mps"])
    assert ctx.params["device"] == "mps"
    if torch.backends.mps.is_available():
        pytest.skip("MPS is available here: the refusal cannot be seen")
    out = tmp_path / "hw.json"
    with pytest.raises(SystemExit) as stop:
        main(["hw", "calibrate", "--device", "mps", "--quick", "-o", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["treeopt: error: --device: 'mps' asked for but MPS is not available here"]
    assert not out.exists()


def test_hw_calibrate_refuses_an_unknown_device(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["hw", "calibrate", "--device", "tpu", "--quick"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treeopt: error: --device:") and "mps" in err[0]
