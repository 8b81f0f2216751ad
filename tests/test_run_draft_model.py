"""`treeopt run --drafter draft-model` end to end on the bundled demo and its draft model, at a
small size: it measures the proposal trees and the chains of gamma drafts and picks, per cell,
the form that is faster (or no speculation)."""

import json

import numpy as np
import pandas as pd
import pytest

from calibration import demo_draft
from calibration.models import load_model, tiny_model_for_tests
from treeopt.app.draft_model import chain_tree
from treeopt.app.run import run_main_job
from treeopt.app.stages.job import RunSettings
from treeopt.cli import main

# tests/test_pipeline.py's small run, with the demo's draft model drafting up to 4 tokens
DRAFT_SMALL = RunSettings(
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
    drafter="draft-model",
    num_heads=4,
)


def test_chain_tree_is_one_top1_guess_per_depth():
    assert chain_tree(3).to_choices() == [[0], [0, 0], [0, 0, 0]]


def test_run_with_a_draft_model_measures_chains_and_trees_and_picks_a_form(tmp_path):
    out = tmp_path / "run"
    logs = []
    result = run_main_job(out, DRAFT_SMALL, log=logs.append, progress=False)

    for name in (
        "accuracy.json",
        "accuracy.alpha.json",
        "proposal_tree.json",
        "proposal-chain.json",
        "hardware.json",
        "sweep.csv",
        "sweep-chain.csv",
        "selection.json",
        "selection-chain.json",
        "validation_acceptance.csv",
        "index.md",
        "prediction/index.md",
        "prediction/gamma.csv",
        "prediction/tree.csv",
    ):
        assert (out / name).is_file(), name
    chain = json.loads((out / "proposal-chain.json").read_text())
    assert chain["medusa_choices"] == [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]
    tree = json.loads((out / "proposal_tree.json").read_text())["medusa_choices"]
    assert len(tree) == 4 and tree[0] == [0]

    # the chain form's own selection picks chains (or nothing); the choice between the forms is
    # per cell one form's own pick, with that form's measured speedup
    chain_selection = json.loads((out / "selection-chain.json").read_text())
    for cell in chain_selection["cells"]:
        assert cell["medusa_choices"] == [[0] * d for d in range(1, cell["nodes"] + 1)]
    selection = json.loads((out / "selection.json").read_text())
    forms = selection["forms"]
    assert forms["forms"] == ["chain", "tree"]
    assert {(c["batch"], c["context"]) for c in forms["cells"]} == {(1, 32), (2, 32)}
    own = {"chain": chain_selection, "tree": selection}
    for cell in forms["cells"]:
        assert cell["form"] in ("chain", "tree", None)
        if cell["form"] is None:
            assert cell["nodes"] == 0
            continue
        mine = next(
            c for c in own[cell["form"]]["cells"] if (c["batch"], c["context"]) == (cell["batch"], cell["context"])
        )
        assert (cell["nodes"], cell["medusa_choices"]) == (mine["nodes"], mine["medusa_choices"])
        assert cell["speedup_lo"] > 1.0
    assert "### Which form" in (out / "index.md").read_text()

    # the sweeps' predictions are the draft-model steps of the report's prediction: a chain of
    # gamma drafts in sweep-chain.csv / gamma.csv, the proposal tree's prefixes in sweep.csv /
    # tree.csv; every extra chain draft adds a pass and a verified token, so its step grows
    for sweep_file, grid_file, column in (
        ("sweep-chain.csv", "gamma.csv", "gamma"),
        ("sweep.csv", "tree.csv", "nodes"),
    ):
        sweep = pd.read_csv(out / sweep_file)
        grid = pd.read_csv(out / "prediction" / grid_file)
        for (b, ctx), cell in sweep.groupby(["batch", "context"]):
            same = grid[(grid["batch"] == b) & (grid["context"] == ctx)].set_index(column)["step_time_s"]
            cell = cell.set_index("nodes")["predicted_step_time_s"]
            np.testing.assert_allclose(cell.to_numpy(), same.loc[cell.index].to_numpy(), rtol=1e-5)
        np.testing.assert_allclose(grid["speedup"], grid["tau"] * grid["plain_step_s"] / grid["step_time_s"], rtol=1e-5)
    for _, cell in pd.read_csv(out / "sweep-chain.csv").groupby(["batch", "context"]):
        steps = cell.sort_values("nodes")["predicted_step_time_s"].to_numpy()
        assert np.all(np.isfinite(steps)) and np.all(np.diff(steps) > 0)
    assert sorted(pd.read_csv(out / "prediction" / "gamma.csv")["gamma"].unique()) == [0, 1, 2, 3, 4]

    # greedy verification is lossless; a tree of n nodes and depth D emits at most D + 1 tokens
    # per step, and one node at most 2
    acceptance = result["validation"].acceptance.set_index("nodes")
    assert (acceptance["agreement"] == 1.0).all()
    assert 1.0 <= acceptance.loc[1, "measured_tokens_per_step"] <= 2.0
    depth = max(len(p) for p in tree)
    assert acceptance.loc[1, "measured_tokens_per_step"] <= acceptance.loc[4, "measured_tokens_per_step"] <= depth + 1
    index = (out / "index.md").read_text()
    assert "prediction/index.md" in index and "prediction/roofline.png" not in index


def test_run_draft_model_option_reaches_the_pipeline(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--drafter", "draft-model", "--steps", "2", "-o", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("treeopt: error: --steps")


def test_demo_train_draft_writes_only_its_output_folder(tmp_path, monkeypatch, capsys):
    root = tmp_path / "stdlib"
    root.mkdir()
    body = "".join(f"def function_{i}(x):\n    return x * {i} + len(str(x))\n\n" for i in range(40))
    names = [f"mod{i}.py" for i in range(6)]
    for name in names:
        (root / name).write_text(f"# {name}\n" + body)
    monkeypatch.setattr(demo_draft, "stdlib_files", lambda: (root, names))
    target = tiny_model_for_tests(tmp_path / "target", vocab=48, hidden=32, layers=2, heads=4, kv_heads=2)
    before = sorted(str(p) for p in target.rglob("*"))
    out = tmp_path / "draft"
    main(["demo", "train-draft", "--target", str(target), "-o", str(out), "--steps", "2"])
    assert "after 2 steps" in capsys.readouterr().out
    assert sorted(str(p) for p in target.rglob("*")) == before  # the target is only read
    assert {"config.json", "model.safetensors", "training.json", ".work/draft.pt"} <= {
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
    }
    # the result is a draft model of the target's vocabulary that its loader takes
    lm = load_model(str(target), str(out), device="cpu", dtype="float32", drafter="draft-model", num_heads=2)
    assert lm.heads.kind == "draft-model" and lm.heads.vocab_size == 48


def test_demo_train_draft_without_a_target_tokenizer_is_one_line(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "train-draft", "--target", str(tmp_path / "t"), "-o", str(tmp_path / "d")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treeopt: error: --target:") and "tokenizer.json" in err[0]
    assert not (tmp_path / "d").exists()
