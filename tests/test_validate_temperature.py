"""`treeopt validate --temperature T` with the bundled demo and its draft model, at a tiny size:
the decoder's measured tokens per step under rejection sampling at T against the tau the alpha
sidecar predicts, for the proposal's trees and the chains of the sizes asked.

Tolerance: measured and predicted less than 4 combined standard errors apart (the bound the
command applies, docs/statistics.md#positional-acceptance-of-a-tree); the predictions are
checked against tau summed by hand from the sidecar's table, node by node. The bad inputs
(missing, v1 or other-temperature sidecar, heads at T > 0, negative T) are in
tests/test_bad_inputs.py."""

from __future__ import annotations

import ast
import json

import numpy as np
import pandas as pd
import pytest

from treeopt.app.draft_model import REJECTION_VALIDATION_COLUMNS
from treeopt.cli import main

SIZES = (1, 2, 4)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """The demo's draft model calibrated for 3 depths: accuracy table and alpha sidecar (T = 1)."""
    root = tmp_path_factory.mktemp("cal")
    main(
        [
            "calibrate",
            "--model",
            "demo",
            "--drafter",
            "draft-model",
            "--num-heads",
            "3",
            "--device",
            "cpu",
            "--max-prompts",
            "16",
            "--steps",
            "8",
            "--quiet",
            "-o",
            str(root / "acc.json"),
        ]
    )
    assert (root / "acc.alpha.json").is_file()
    return root


def validate(root, out, capsys, *extra):
    main(
        [
            "validate",
            "--model",
            "demo",
            "--drafter",
            "draft-model",
            "--device",
            "cpu",
            "--accuracy",
            str(root / "acc.json"),
            "--temperature",
            "1",
            "--sizes",
            ",".join(map(str, SIZES)),
            "--max-prompts",
            "16",
            "--max-new-tokens",
            "16",
            "--batch-size",
            "16",
            "-o",
            str(out),
            *extra,
        ]
    )
    return capsys.readouterr().out


def tau_by_hand(choices, table) -> float:
    """1 + the sum over nodes of the product of a[depth][position] along the node's path (the
    proposal's children are at positions 0..m-1, so a node's rank is its draw position)."""
    return 1.0 + sum(float(np.prod([table[d][j] for d, j in enumerate(path)])) for path in choices)


def test_validate_at_temperature_one_matches_the_sidecar_within_the_bound(calibrated, tmp_path, capsys):
    out = tmp_path / "v"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # only the CSV is written into the folder
    printed = validate(calibrated, out, capsys)
    df = pd.read_csv(out / "validation_rejection.csv")
    assert list(df.columns) == REJECTION_VALIDATION_COLUMNS
    assert (out / "notes.txt").read_text() == "mine"

    side = json.loads((calibrated / "acc.alpha.json").read_text())
    assert side["temperature"] == 1.0
    table, alpha = side["accept_per_child"], side["alpha_per_depth"]
    choices = [ast.literal_eval(t) for t in df["tree"]]
    # the proposal's prefixes of 1, 2 and 4 nodes and the chains of 1 and 2 (3 depths: no chain
    # of 4), each tree once
    chains = sorted(sorted(c) for c in choices if all(r == 0 for path in c for r in path))
    assert chains == [[[0]], [[0], [0, 0]]]
    assert sorted(df["nodes"]) == sorted(len(c) for c in choices)
    assert {1, 2, 4} <= set(df["nodes"])
    assert len({json.dumps(sorted(c)) for c in choices}) == len(choices)
    for c, predicted in zip(choices, df["predicted_tau"], strict=True):
        assert predicted == pytest.approx(tau_by_hand(c, table), rel=1e-12)
    # the chain of 2: Leviathan et al.'s 1 + a_0 + a_0 a_1
    chain2 = df[df["tree"] == str([[0], [0, 0]])].iloc[0]
    assert chain2["predicted_tau"] == pytest.approx(1 + alpha[0] + alpha[0] * alpha[1], rel=1e-12)

    sigmas = (df["measured_tokens_per_step"] - df["predicted_tau"]).abs() / np.hypot(
        df["measured_se"], df["predicted_se"]
    )
    assert np.allclose(sigmas, df["sigmas"])
    assert (sigmas <= 4).all(), df.to_string()
    assert df["within"].all()
    assert (df["steps"] >= 100).all()
    # speculation gains: every tree keeps more than the one token of plain decoding, by far
    assert ((df["measured_tokens_per_step"] - 1) > 4 * df["measured_se"]).all()

    assert "within 4σ" in printed and f"all {len(df)} predictions within 4 combined standard errors" in printed

    # seeded: a second run writes the same bytes
    again = tmp_path / "again"
    validate(calibrated, again, capsys)
    assert (again / "validation_rejection.csv").read_bytes() == (out / "validation_rejection.csv").read_bytes()
