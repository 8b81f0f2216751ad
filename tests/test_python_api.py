"""treeopt from Python (docs/python.md): the page's examples run as written, every exported name
resolves, and the API gives what the command line gives for the same input (the CLI calls it,
so the two cannot drift)."""

from __future__ import annotations

import doctest
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import calibration
import roofline
import treeopt
from treeopt.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python.md"
ACC = ROOT / "reports" / "demo-cpu" / "accuracy.json"
SWEEP = ROOT / "reports" / "demo-cpu" / "sweep.csv"


@dataclass
class Ran:
    exit_code: int
    output: str  # stdout
    errors: str  # stderr


@pytest.fixture
def cli(capsys):
    """Runs `treeopt ARGS...` in this process as the console script does."""

    def run(*args) -> Ran:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            status = 0
        except SystemExit as stopped:
            status = stopped.code
        out, err = capsys.readouterr()
        return Ran(status, out, err)

    return run


def test_the_pages_examples_print_what_the_page_shows(tmp_path, monkeypatch):
    """Every `>>>` example of docs/python.md, in order, in one session, from a scratch copy of
    the repository root (the page writes selection.json, figures and a profile there)."""
    (tmp_path / "reports").symlink_to(ROOT / "reports")
    monkeypatch.chdir(tmp_path)
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 10 and all(b.lstrip().startswith(">>>") for b in blocks)
    parser = doctest.DocTestParser()
    test = parser.get_doctest("\n".join(blocks), {}, "docs/python.md", str(PAGE), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    failed, tries = runner.run(test, out=report.append)
    assert failed == 0, "".join(report)
    assert tries >= 40
    for name in ("selection.json", "speedup.png", "best.png", "measured.png", "demo-fitted.json"):
        assert (tmp_path / name).is_file(), name


def test_the_readmes_python_example_runs_and_says_true(tmp_path, monkeypatch):
    (tmp_path / "reports").symlink_to(ROOT / "reports")
    monkeypatch.chdir(tmp_path)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    space: dict = {}
    exec(compile(block, "README.md", "exec"), space)  # noqa: S102 - the README's own example
    assert "tau 2.4188" in block and round(treeopt.expected_tokens(space["tree"], space["table"]), 4) == 2.4188
    assert "# 30: what vLLM <= 0.20 drafted" in block
    assert treeopt.check("mc_sim_7b_63", "vllm@0.20", accuracy=space["table"]).drafted.size == 30
    assert space["selection"].cells and space["prediction"].engine == "trtllm"


@pytest.mark.parametrize("package", [treeopt, roofline, calibration], ids=lambda p: p.__name__)
def test_every_exported_name_resolves(package):
    assert package.__all__, package.__name__
    missing = [name for name in package.__all__ if getattr(package, name, None) is None]
    assert not missing, missing


def test_the_readme_tour_names_are_the_api():
    # the short names the page documents are the top-level ones, not submodules of the same name
    for name in ("build_tree", "expected_tokens", "check", "export_tree", "predict", "select", "fit_profile"):
        assert callable(getattr(treeopt, name)), name


def test_import_treeopt_and_tree_calls_load_neither_torch_nor_matplotlib():
    code = (
        "import sys, treeopt\n"
        "t = treeopt.load_accuracy(sys.argv[1])\n"
        "treeopt.export_tree(treeopt.build_tree(t, 8, engine='trtllm'), 'trtllm', accuracy=t)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ACC)], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_library_code_exits_the_interpreter():
    found = []
    for package in ("treeopt", "roofline", "calibration"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(ROOT / "treeopt" / "cli") or path.name == "__main__.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"\bsys\.exit\(|raise SystemExit|\bexit\(", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}")
    assert not found, found


# ---------------------------------------------------------------------------------------------
# Against hand-derived values


def test_expected_tokens_of_a_chain_and_a_fork_by_hand():
    table = treeopt.load_accuracy(ACC)
    a = table.accuracy  # a[k, r]: head k's rank-r proposal is the label (independent heads)
    chain = treeopt.make_tree([[0], [0, 0], [0, 0, 0]])
    assert treeopt.expected_tokens(chain, table) == pytest.approx(
        1 + a[0, 0] + a[0, 0] * a[1, 0] + a[0, 0] * a[1, 0] * a[2, 0]
    )
    fork = [[0], [1], [1, 2]]  # a literal list is taken as medusa_choices
    assert treeopt.expected_tokens(fork, table) == pytest.approx(1 + a[0, 0] + a[0, 1] + a[0, 1] * a[1, 2])
    # joint: each node counts the positions whose first ranks are its path, over its head's positions
    counts, positions = table.joint, table.positions
    joint = 1 + sum(counts.get(tuple(p), 0) / positions[len(p) - 1] for p in fork)
    assert treeopt.expected_tokens(fork, table, joint=True) == pytest.approx(joint)
    assert joint != pytest.approx(treeopt.expected_tokens(fork, table))


def test_the_selection_of_a_prediction_is_the_argmax_of_its_grid():
    """Brute force over the grid: per cell the largest speedup, the smallest size on ties, none
    unless it beats 1; sizes the engine does not draft (NaN) never win."""
    prediction = treeopt.predict("vicuna-7b", "a100-80gb-sxm", ACC, batches=[1, 4, 32], contexts=[512, 4096])
    selection = treeopt.select(prediction)
    grid = prediction.to_frame()
    for cell in selection.to_dict()["cells"]:
        rows = grid[(grid["batch"] == cell["batch"]) & (grid["context"] == cell["context"])]
        speed = rows["speedup"].to_numpy()
        best = int(rows["nodes"].to_numpy()[np.nanargmax(speed)])
        expected = best if np.nanmax(speed) > 1.0 else 0
        assert cell["nodes"] == expected, cell
        assert cell["medusa_choices"] == prediction.tree(expected).to_choices()


def test_a_prediction_for_vllm_picks_only_sizes_vllm_drafts():
    # the table's Medusa heads: vLLM <= 0.32 serves them as a top-1 chain
    prediction = treeopt.predict("vicuna-7b", "h100-sxm", ACC, batches=[1, 8, 64], contexts=[1024], engine="vllm@0.20")
    assert prediction.engine == "vllm-medusa@0.32"
    for cell in treeopt.select(prediction).to_dict()["cells"]:
        if cell["nodes"]:
            assert treeopt.check(cell["medusa_choices"], "vllm-medusa@0.32").as_written, cell


# ---------------------------------------------------------------------------------------------
# The same answers as the command line


def test_predict_and_select_give_what_roofline_speedup_writes(tmp_path, cli):
    args = ["--model", "vicuna-7b", "--hardware", "h100-sxm", "--accuracy", ACC, "--batch", "1,8,64"]
    args += ["--context", "512,2048", "--engine", "trtllm"]
    result = cli("roofline", "speedup", *args, "-o", tmp_path / "grid.csv", "--select", tmp_path / "sel.json")
    assert result.exit_code == 0, result.output
    prediction = treeopt.predict(
        "vicuna-7b", "h100-sxm", ACC, batches=[1, 8, 64], contexts=[512, 2048], engine="trtllm"
    )
    written = pd.read_csv(tmp_path / "grid.csv")
    ours = prediction.to_frame()
    np.testing.assert_allclose(written["speedup"], ours["speedup"], rtol=1e-5)
    cli_doc = json.loads((tmp_path / "sel.json").read_text())
    api_doc = treeopt.select(prediction, engine=None).to_dict()
    for theirs, mine in zip(cli_doc["cells"], api_doc["cells"], strict=True):
        assert (theirs["batch"], theirs["context"], theirs["nodes"]) == (mine["batch"], mine["context"], mine["nodes"])
    # and the grid read back selects the same cells as `treeopt select --grid`
    result = cli("select", "--grid", tmp_path / "grid.csv", "--accuracy", ACC, "-o", tmp_path / "g.json")
    assert result.exit_code == 0, result.output
    from_grid = treeopt.select(treeopt.load_grid(tmp_path / "grid.csv", ACC)).to_dict()
    assert from_grid == json.loads((tmp_path / "g.json").read_text())


def test_select_on_a_sweep_gives_what_treeopt_select_writes(tmp_path, cli):
    out = tmp_path / "sel.json"
    # the pooled fit's own agreement with `treeopt run` is tests/test_select_pooled.py's; here it
    # is left out on both sides to keep the comparison quick
    mix = "1@128:0.7,8@512:0.3"
    result = cli(
        "select", "--sweep", SWEEP, "--engine", "trtllm", "--accuracy", ACC, "--mix", mix, "--no-pooled", "-o", out
    )
    assert result.exit_code == 0, result.output
    doc = treeopt.select(treeopt.load_sweep(SWEEP), engine="trtllm", accuracy=ACC, mix=mix, pooled=False).to_dict()
    assert doc == json.loads(out.read_text())
    assert all(c["engine_line"].startswith("--medusa_choices=") for c in doc["cells"] if c["nodes"])


def test_check_and_export_give_what_the_commands_print(cli):
    tree = "[[0], [1], [0, 0], [2]]"
    result = cli("check", tree, "--engine", "trtllm", "--accuracy", ACC, "--json")
    assert result.exit_code == 0, result.output
    cli = json.loads(result.output)
    api = treeopt.check(json.loads(tree), "trtllm", accuracy=ACC)
    assert (cli["as_written"], cli["drafted"], cli["tau"]) == (api.as_written, api.drafted.to_choices(), api.tau)
    assert cli["paste"] == treeopt.export_tree(json.loads(tree), "trtllm", accuracy=ACC).line


def test_fit_profile_from_a_frame_equals_the_fit_from_its_csv(tmp_path, cli):
    frame = treeopt.load_sweep(SWEEP).to_frame()
    steps = pd.DataFrame({"batch": frame["batch"], "context": frame["context"], "tokens": frame["nodes"] + 1}).assign(
        step_ms=1e3 * frame["step_time_s"]
    )[lambda d: d["batch"] <= 2]
    steps.to_csv(tmp_path / "steps.csv", index=False)
    hardware = ROOT / "reports" / "demo-cpu" / "hardware.json"
    from_frame = treeopt.fit_profile("demo", hardware, steps, dtype="bf16")
    from_file = treeopt.fit_profile("demo", hardware, tmp_path / "steps.csv", dtype="bf16")
    assert from_frame.terms == pytest.approx(from_file.terms)
    result = cli(
        "hw", "fit", "--model", "demo", "--dtype", "bf16", "--hardware", hardware,
        "--measurements", tmp_path / "steps.csv", "-o", tmp_path / "fitted.json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "fitted.json").read_text())
    assert saved["calibration"]["fit"]["terms"] == pytest.approx(from_file.terms)


# ---------------------------------------------------------------------------------------------
# Errors and figures


@pytest.mark.parametrize(
    "call,argv",
    [
        (lambda: treeopt.build_tree(ACC, 8, engine="vllm@0.20", max_children=2),
         ["build", "--accuracy", ACC, "--nodes", 8, "--engine", "vllm@0.20", "--max-children", 2]),
        (lambda: treeopt.predict("vicuna-7b", "no-such-gpu", ACC),
         ["roofline", "speedup", "--model", "vicuna-7b", "--hardware", "no-such-gpu", "--accuracy", ACC]),
        (lambda: treeopt.load_accuracy("missing.json"), ["build", "--accuracy", "missing.json", "--nodes", 4]),
        (lambda: treeopt.export_tree("mc_sim_7b_63", "vllm"), None),
    ],
    ids=["engine-limits", "unknown-gpu", "missing-table", "export-not-drafted"],
)  # fmt: skip
def test_bad_input_raises_the_projects_error_with_the_clis_message(call, argv, cli):
    with pytest.raises(treeopt.UserError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    if argv is not None:
        result = cli(*argv)
        assert result.exit_code == 2
        assert result.errors == f"treeopt: error: {message}\n"


def test_plots_are_returned_not_saved_or_shown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prediction = treeopt.predict("vicuna-7b", "l4", ACC, batches=[1, 8], contexts=[512, 1024])
    figures = [prediction.plot(), prediction.plot_best(), treeopt.plot_selection(treeopt.select(prediction))]
    sweep = treeopt.load_sweep(SWEEP)
    figures.append(sweep.plot())
    assert all(isinstance(f, Figure) for f in figures)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(treeopt.UserError, match="context: 333"):
        prediction.plot(context=333)
