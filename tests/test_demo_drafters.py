"""The demo's dependent drafters: the committed Hydra heads and MLP speculator match their
recipe and the size budget, the recipe resumes, `treeopt run --drafter hydra` passes end to
end at a tiny size, and the side-by-side report reads the runs (docs/decoder.md#drafters)."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from calibration.demo_drafters import HYDRA_DIR, SPECULATOR_DIR, DrafterRecipe, train_drafters
from calibration.demo_files import DEMO_MODEL_DIR
from calibration.drafters import load_drafter
from calibration.models import load_model
from treeopt.app.compare_drafters import compare_drafters
from treeopt.cli import main
from treeopt.errors import UserError

TRAINING = json.loads((DEMO_MODEL_DIR / "drafters_training.json").read_text())


def test_committed_drafters_match_their_recipe_in_bf16_within_the_budget():
    recipe = DrafterRecipe(**TRAINING["recipe"])
    hydra = load_model("demo", device="cpu", drafter="hydra").heads
    spec = load_model("demo", device="cpu", drafter="mlp-speculator").heads
    assert (hydra.kind, hydra.num_heads, hydra.num_layers, hydra.grounded) == (
        "hydra",
        recipe.hydra_heads,
        recipe.hydra_layers,
        True,
    )
    assert (spec.kind, spec.num_heads) == ("mlp-speculator", recipe.speculator_stages)
    assert json.loads((DEMO_MODEL_DIR / SPECULATOR_DIR / "config.json").read_text())["tie_weights"] is True
    eagle = load_model("demo", device="cpu", drafter="eagle3").heads
    assert (eagle.kind, eagle.aux_layer_ids, eagle.draft_vocab_size) == ("eagle3", (1, 2, 4), recipe.eagle3_draft_vocab)
    for file in (
        DEMO_MODEL_DIR / HYDRA_DIR / "hydra_lm_head.safetensors",
        DEMO_MODEL_DIR / SPECULATOR_DIR / "model.safetensors",
        DEMO_MODEL_DIR / "eagle3" / "model.safetensors",
    ):
        with safe_open(str(file), "pt") as fh:
            # bf16 weights (EAGLE-3's d2t and t2d are integer and boolean maps)
            assert {fh.get_slice(k).get_dtype() for k in fh.keys() if k not in ("d2t", "t2d")} == {"BF16"}
    # the whole demo checkpoint: model, tokenizer, Medusa heads, Hydra heads, speculator, draft
    # model, EAGLE-3 draft: within the repository's 40 MiB for demo checkpoints (the Hydra heads
    # leave out their input embeddings, the base model's own)
    total = sum(f.stat().st_size for f in DEMO_MODEL_DIR.rglob("*") if f.is_file() and ".work" not in f.parts)
    assert total <= 40 * 2**20


@pytest.fixture
def tiny_work(tmp_path):
    """A work folder whose tokenised corpus is already there (a short random token stream), so
    the recipe trains in seconds."""
    work = tmp_path / "work"
    work.mkdir()
    rng = np.random.default_rng(0)
    np.save(work / "drafter_tokens.npy", rng.integers(0, 4096, size=4000).astype(np.int32))
    return work


TINY = DrafterRecipe(hydra_heads=2, speculator_stages=2, steps=3, warmup_steps=1, batch_size=2, seq_len=24)


def test_recipe_trains_resumes_and_refuses_another_recipe(tmp_path, tiny_work):
    out = tmp_path / "out"
    train_drafters(out, TINY, model_dir=DEMO_MODEL_DIR, work_dir=tiny_work)
    # the Hydra heads' input embeddings are the base model's (left out of their file)
    base = load_model("demo", device="cpu", dtype="float32").model.get_input_embeddings().weight
    hydra = load_drafter(out / HYDRA_DIR, input_embeddings=base)
    spec = load_drafter(out / SPECULATOR_DIR)
    assert (hydra.num_heads, spec.num_heads) == (2, 2)
    first = {k: v.clone() for k, v in hydra.state_dict().items()}
    # a rerun of the same recipe resumes from the last checkpoint: nothing more to train
    summary = train_drafters(out, TINY, model_dir=DEMO_MODEL_DIR, work_dir=tiny_work)
    again = load_drafter(out / HYDRA_DIR, input_embeddings=base).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert summary["recipe"] == asdict(TINY)
    # the EAGLE-3 draft: the inputs of layers 1, 2, 4 of the 5-layer demo model, and a draft
    # vocabulary of the corpus's most frequent tokens (the authors' d2t recipe)
    eagle = load_model("demo", heads=str(out / "eagle3"), device="cpu", dtype="float32").heads
    assert (eagle.kind, eagle.aux_layer_ids, eagle.draft_vocab_size) == ("eagle3", (1, 2, 4), TINY.eagle3_draft_vocab)
    counts = np.bincount(np.load(tiny_work / "drafter_tokens.npy"), minlength=4096)
    assert set(eagle.draft_to_target.tolist()) == set(np.argsort(-counts, kind="stable")[: TINY.eagle3_draft_vocab])
    with pytest.raises(UserError, match="another recipe"):
        train_drafters(out, replace(TINY, seed=1), model_dir=DEMO_MODEL_DIR, work_dir=tiny_work)


def test_the_recipe_never_writes_into_the_package(tmp_path, monkeypatch, tiny_work):
    """`treeopt demo train-drafters` without -o trains against the bundled demo model and
    writes a folder in the current directory; the bundled drafters are left as they are."""
    bundled = {f: f.read_bytes() for f in DEMO_MODEL_DIR.rglob("*") if f.is_file() and ".work" not in f.parts}
    monkeypatch.chdir(tmp_path)
    main(["demo", "train-drafters", "--steps", "1", "--only", "mlp-speculator", "--work-dir", str(tiny_work)])
    assert load_drafter(tmp_path / "demo_drafters" / SPECULATOR_DIR).kind == "mlp-speculator"
    assert {f: f.read_bytes() for f in bundled} == bundled


def _run(out, drafter, *extra):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                *extra,
                "--drafter",
                drafter,
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--steps",
                "8",
                "--sizes",
                "0,1,4",
                "--batch",
                "1,2",
                "--context",
                "32",
                "--repeats",
                "5",
                "--time-budget",
                "0",
                "--quick",
                "-o",
                str(out),
            ]
        )
        raise SystemExit(0)
    return exc.value.code or 0


def test_run_with_hydra_and_the_side_by_side_report(tmp_path, capsys):
    assert _run(tmp_path / "hydra", "hydra") == 0
    assert _run(tmp_path / "medusa", "medusa") == 0
    out = capsys.readouterr().out  # the validation is a result: stdout
    assert "100.00% of generated tokens identical" in out  # lossless with either drafter
    prediction = (tmp_path / "hydra" / "prediction" / "index.md").read_text()
    assert "**Drafter**: hydra: 4 heads" in prediction and "sequential, depth by depth" in prediction
    # Hydra's own code drafts a node's children as ranks 0..c-1 and expands only the first e of
    # them (docs/engines.md#hydra): the run's proposal trees are all of that family
    paths = {tuple(c) for c in json.loads((tmp_path / "hydra" / "proposal_tree.json").read_text())["medusa_choices"]}
    parents = {q[:-1] for q in paths}
    for q in paths:
        assert all(q[:-1] + (r,) in paths for r in range(q[-1])), q  # siblings 0..c-1
        if q in parents:
            assert all(q[:-1] + (r,) in parents for r in range(q[-1])), q  # expanded: the first ones
    summary = compare_drafters({"medusa": tmp_path / "medusa", "hydra": tmp_path / "hydra"}, tmp_path / "cmp")
    tau = summary["tau"]
    for kind in ("medusa", "hydra"):
        values = tau[kind].dropna().to_numpy()
        assert values[0] >= 1 and np.all(np.diff(values) >= -1e-12)  # nested trees never accept less
    index = summary["index"].read_text()
    assert "## What sequential dependence bought" in index and "Hydra heads vs Medusa heads" in index
    assert (tmp_path / "cmp" / "tau.png").is_file()
    with pytest.raises(UserError, match="not a finished"):
        compare_drafters({"hydra": tmp_path / "nothing"}, tmp_path / "cmp2")


def test_run_with_the_demos_eagle3_draft_end_to_end(tmp_path, capsys):
    from treeopt.accuracy import load_accuracy

    out = tmp_path / "eagle3"
    assert _run(out, "eagle3", "--num-heads", "4") == 0  # 4 depths: the 8 steps label them all
    assert "100.00% of generated tokens identical" in capsys.readouterr().out  # lossless: the validation is a result
    for name in ("accuracy.json", "proposal_tree.json", "sweep.csv", "selection.json", "prediction/index.md"):
        assert (out / name).is_file(), name
    assert load_accuracy(out / "accuracy.json").drafter == "eagle3"
    prediction = (out / "prediction" / "index.md").read_text()
    assert "eagle3: one decoder layer" in prediction and "sequential, depth by depth" in prediction
    summary = compare_drafters({"eagle3": out}, tmp_path / "cmp")
    assert summary["tau"]["eagle3"].dropna().to_numpy()[0] >= 1


def test_the_committed_side_by_side_tau_is_of_the_trees_each_run_measured():
    """reports/drafters-demo/tau.csv against the tau column each run's own sweep recorded for the
    sizes it measured (Hydra's trees are from Hydra's family, not the unconstrained sequence)."""
    import pandas as pd

    reports = Path(__file__).resolve().parent.parent / "reports" / "drafters-demo"
    side = pd.read_csv(reports / "tau.csv").set_index("nodes")
    for kind in ("medusa", "hydra", "mlp-speculator", "draft-model", "eagle3"):
        sweep = pd.read_csv(reports / f"run-{kind}" / "sweep.csv").drop_duplicates("nodes").set_index("nodes")
        sizes = [n for n in side.index if n in sweep.index]
        assert len(sizes) >= 6, kind
        assert side.loc[sizes, kind].to_numpy() == pytest.approx(sweep.loc[sizes, "tau"].to_numpy(), abs=6e-5), kind


def test_a_hydra_run_builds_its_proposal_in_hydras_own_family(tmp_path):
    """The committed Hydra table, through the run's proposal stage with 64 nodes: every tree has
    siblings 0..c-1 and expands only the first children of a node (docs/engines.md#hydra), where
    the unconstrained sequence of the same table does not."""
    from treeopt.app.stages.job import Job, RunSettings
    from treeopt.app.stages.proposal import build_proposal
    from treeopt.tau import proposal_sequence

    acc = Path(__file__).resolve().parent.parent / "reports" / "drafters-demo" / "run-hydra" / "accuracy.json"
    logs = []
    proposal = build_proposal(Job(RunSettings(drafter="hydra"), tmp_path, logs.append, False), acc)

    def grounded(paths):
        parents = {q[:-1] for q in paths}
        return all(
            all(q[:-1] + (r,) in paths for r in range(q[-1]))
            and (q not in parents or all(q[:-1] + (r,) in parents for r in range(q[-1])))
            for q in paths
        )

    assert proposal.tree.size == 64 and grounded(set(proposal.tree.paths))
    assert not grounded(set(proposal_sequence(proposal.table, 64).paths))
    assert any("Hydra heads: trees from the family" in m for m in logs)
