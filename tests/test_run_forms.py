"""`treeopt run` with an MLP speculator measures IBM's candidate form beside its proposal trees:
the candidate sets are the speculator config's top-k products cut to the best n (brute force
here), swept merged into their prefix tree and as candidate sequences, and the choice per cell
is one form's own pick (docs/builders.md#choosing-the-verification-form)."""

import itertools
import json

import numpy as np

from treeopt.accuracy import load_accuracy
from treeopt.app.run import run_main_job
from treeopt.app.stages.job import RunSettings
from treeopt.selection import read_sweep

SPECULATOR_SMALL = RunSettings(
    steps=8,
    sizes=(0, 1, 4),
    max_nodes=8,
    batches=(1, 2),
    contexts=(32,),
    repeats=5,
    time_budget_s=0.0,
    validation_sizes=(1, 4),
    validation_prompts=8,
    hw_quick=True,
    device="cpu",
    drafter="mlp-speculator",
)


def test_run_with_an_mlp_speculator_measures_candidate_sequences_and_picks_a_form(tmp_path):
    out = tmp_path / "run"
    run_main_job(out, SPECULATOR_SMALL, log=lambda _: None, progress=False)
    config = json.loads(open("calibration/demo_model/mlp_speculator/config.json").read())
    topk = config["top_k_tokens_per_head"]

    # the candidate proposal: its full-depth paths are the best candidates of the top-k product
    # by the product of per-rank accuracies (brute force), as many as fit in max_nodes = 8
    acc = load_accuracy(out / "accuracy.json").accuracy
    ranked = sorted(
        itertools.product(*(range(k) for k in topk)),
        key=lambda p: -np.prod([acc[d, r] for d, r in enumerate(p)]),
    )
    choices = json.loads((out / "proposal-candidates.json").read_text())["medusa_choices"]
    full = [tuple(p) for p in choices if len(p) == len(topk)]
    assert len(choices) <= SPECULATOR_SMALL.max_nodes
    assert set(full) == set(ranked[: len(full)])

    df, meta = read_sweep(out / "sweep-candidates.csv")
    assert meta["verification"] == "candidates"
    merged, merged_meta = read_sweep(out / "sweep-merged.csv")  # the same sets, tree attention
    assert merged_meta["verification"] == "tree" and set(merged["nodes"]) == set(df["nodes"])
    assert json.loads((out / "proposal-merged.json").read_text())["medusa_choices"] == choices
    # measured at 1, 2, 4, ... candidates: each size's prefix has exactly that many full paths
    selection = json.loads((out / "selection-candidates.json").read_text())
    for nodes, label in selection["labels"].items():
        m = int(label.split()[0])
        assert sum(len(p) == len(topk) for p in choices[: int(nodes)]) == m
    assert set(df["nodes"]) == {0} | {int(n) for n in selection["labels"]}

    forms = json.loads((out / "selection.json").read_text())["forms"]
    assert forms["forms"] == ["tree", "merged", "candidates"]
    own = {
        "tree": json.loads((out / "selection.json").read_text()),
        "merged": json.loads((out / "selection-merged.json").read_text()),
        "candidates": selection,
    }
    for cell in forms["cells"]:
        if cell["form"] is None:
            assert cell["nodes"] == 0
            continue
        mine = next(
            c for c in own[cell["form"]]["cells"] if (c["batch"], c["context"]) == (cell["batch"], cell["context"])
        )
        assert cell["nodes"] == mine["nodes"] and cell["speedup_lo"] > 1.0
    assert "### Which form" in (out / "index.md").read_text()
