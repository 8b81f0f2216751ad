"""Validation (calibration.validate): measured tokens per step of the decoder against tau,
with oracle heads that always propose the true greedy continuation (a chain of 3 must then
make 4 tokens per step) and with random heads; latency errors by hand; `treeopt validate`
and `treeopt sweep` on a tiny model."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from calibration.greedy import greedy_decode
from calibration.heads import MedusaHeads
from calibration.model_calls import model_forward_hidden
from calibration.models import load_model, tiny_model_for_tests
from calibration.sweep import measure_end_to_end
from calibration.validate import ACCEPTANCE_COLUMNS, latency_errors, measure_acceptance, relative_error
from treeopt.accuracy import AccuracyTable
from treeopt.errors import UserError
from treeopt.tau import TauCurve
from treeopt.tree import make_tree

VOCAB, NUM_HEADS = 64, 3
CHAIN = make_tree([[0], [0, 0], [0, 0, 0]])
PROMPTS = ["def f(x):\n", "import os", "a = [1, 2]", "class A:", "x"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"),
        vocab=VOCAB,
        hidden=32,
        layers=2,
        heads=4,
        kv_heads=2,
        num_medusa_heads=NUM_HEADS,
        seed=1,
    )
    torch.set_num_threads(1)
    return path, load_model(str(path), device="cpu", dtype="float32")


class _OracleHead(torch.nn.Module):
    def __init__(self, owner, k):
        super().__init__()
        self.owner, self.k = [owner], k  # a list: not a submodule

    def forward(self, hidden):
        return self.owner[0].logits(hidden, self.k)


class OracleHeads(MedusaHeads):
    """Head k's top-1 is the true greedy token t+k+2 whenever the hidden state is one of the
    greedy continuation's (found by nearest neighbour in a teacher-forced run); random
    logits otherwise."""

    def __init__(self, lm, prompts, max_new_tokens):
        model = lm.model
        super().__init__(model.config.hidden_size, VOCAB, NUM_HEADS, 0)
        for k in range(NUM_HEADS):
            self[k] = _OracleHead(self, k)
        self.proj = torch.randn(model.config.hidden_size, VOCAB, generator=torch.Generator().manual_seed(0))
        keys, targets = [], []
        with torch.inference_mode():
            for text in prompts:
                ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
                cont = greedy_decode(model, ids, max_new_tokens=max_new_tokens + NUM_HEADS + 2)[0]
                seq = ids[0].tolist() + cont
                h = model_forward_hidden(
                    model,
                    torch.tensor([seq]),
                    attention_mask=None,
                    position_ids=torch.arange(len(seq))[None],
                    cache=None,
                )[0]
                for t in range(ids.shape[1] - 1, len(seq) - NUM_HEADS - 1):
                    keys.append(h[t])
                    targets.append([seq[t + k + 2] for k in range(NUM_HEADS)])
        self.keys = torch.stack(keys)
        self.targets = torch.tensor(targets)
        self.hits = 0

    def logits(self, hidden, k):
        flat = hidden.reshape(-1, hidden.shape[-1]).float()
        out = flat @ self.proj
        dist = torch.cdist(flat, self.keys, compute_mode="donot_use_mm_for_euclid_dist")
        near, j = dist.min(-1)
        ok = near < 1e-3
        rows = ok.nonzero()[:, 0]
        out[rows, self.targets[j[rows], k]] = out[rows].max(-1).values + 1.0
        self.hits += int(ok.sum())
        return out.reshape(*hidden.shape[:-1], VOCAB).to(hidden.dtype)


@pytest.fixture(scope="module")
def oracle_lm(tiny):
    _, lm = tiny
    return dataclasses.replace(lm, heads=OracleHeads(lm, PROMPTS, max_new_tokens=13))


def test_oracle_heads_make_a_chain_accept_everything(oracle_lm):
    tau = np.array([1.0, 1.9, 2.6, 3.2])
    df = measure_acceptance(
        oracle_lm, TauCurve(CHAIN, tau, None), [0, 1, 2, 3], PROMPTS, max_new_tokens=13, batch_size=2, progress=False
    )
    assert list(df.columns) == ACCEPTANCE_COLUMNS and df["nodes"].tolist() == [0, 1, 2, 3]
    assert oracle_lm.heads.hits > 0
    # a chain of n nodes whose every proposal is right: n + 1 tokens per step
    np.testing.assert_allclose(df["measured_tokens_per_step"], [1.0, 2.0, 3.0, 4.0], atol=0.05)
    assert df["measured_tokens_per_step"].iloc[0] == 1.0
    # 12 tokens after the prefill's first: 12 / (n + 1) steps per prompt
    assert df["steps"].iloc[0] == 12 * len(PROMPTS) and df["steps"].iloc[3] == pytest.approx(3 * len(PROMPTS), abs=1)
    np.testing.assert_allclose(
        df["error_independent"], (tau - df["measured_tokens_per_step"]) / df["measured_tokens_per_step"], rtol=1e-12
    )
    assert df["error_independent"].iloc[1] == pytest.approx((1.9 - 2.0) / 2.0, abs=0.03)
    assert df["tau_joint"].isna().all() and df["error_joint"].isna().all()

    # the same through the end-to-end measurement, batch 1 and batch 2
    e2e = measure_end_to_end(oracle_lm, CHAIN, [0, 3], [1, 2], PROMPTS[:4], max_new_tokens=13, progress=False)
    np.testing.assert_allclose(e2e["e2e_tokens_per_step"], [1.0, 4.0, 1.0, 4.0], atol=0.05)


def test_random_heads_acceptance(tiny):
    _, lm = tiny
    tree = make_tree([[0], [1], [0, 0], [2], [0, 1], [0, 0, 0]])
    tau_i = np.array([1.0, 1.2, 1.3, 1.35, 1.4, 1.42, 1.43])
    tau_j = tau_i * 0.95
    tau_j[0] = 1.0
    df = measure_acceptance(
        lm, TauCurve(tree, tau_i, tau_j), [0, 2, 6], PROMPTS, max_new_tokens=8, batch_size=3, progress=False
    )
    m = df["measured_tokens_per_step"].to_numpy()
    assert m[0] == 1.0 and (m >= 1.0).all() and (m <= 1 + np.array([0, 2, 3])).all()
    assert (df["steps"] >= len(PROMPTS)).all()
    np.testing.assert_allclose(df["error_joint"], (tau_j[[0, 2, 6]] - m) / m, rtol=1e-12)
    assert df["error_independent"].iloc[0] == 0.0
    with pytest.raises(UserError, match="--sizes: 9 nodes"):
        measure_acceptance(lm, TauCurve(tree, tau_i, None), [9], PROMPTS, max_new_tokens=4)
    with pytest.raises(UserError, match="max-new-tokens"):
        measure_acceptance(lm, TauCurve(tree, tau_i, None), [1], PROMPTS, max_new_tokens=1)


def test_latency_errors_by_hand():
    sweep = pd.DataFrame(
        {
            "batch": [1, 1, 1, 2, 2],
            "context": [8, 8, 8, 8, 8],
            "nodes": [0, 1, 4, 0, 4],
            "overhead": [1.0, 1.2, 1.5, 1.0, 2.0],
            "predicted_overhead": [1.0, 1.32, 1.2, 1.0, 2.5],
            "step_time_s": [0.010, 0.012, 0.015, 0.020, 0.040],
            "predicted_step_time_s": [0.005, 0.0066, 0.006, 0.01, 0.025],
        }
    )
    err = latency_errors(sweep)
    assert err[["batch", "nodes"]].values.tolist() == [[1, 1], [1, 4], [2, 4]]
    np.testing.assert_allclose(err["overhead_error"], [0.1, -0.2, 0.25])
    np.testing.assert_allclose(err["step_time_error"], [-0.45, -0.6, -0.375])
    assert relative_error(3.0, 2.0) == 0.5 and np.isnan(relative_error(1.0, 0.0))
    with pytest.raises(UserError, match="predicted_overhead"):
        latency_errors(sweep.drop(columns=["predicted_overhead"]))


@pytest.fixture()
def inputs(tmp_path):
    acc = tmp_path / "acc.json"
    AccuracyTable(
        hits=[[60, 20, 10, 5], [40, 20, 10, 5], [30, 15, 10, 5]],
        positions=[100, 100, 100],
        provenance={"model": "tiny"},
    ).save(acc)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return acc, data


def test_sweep_select_validate_cli(tiny, inputs, tmp_path, capsys):
    from treeopt.cli import main

    path, _ = tiny
    acc, data = inputs
    out = tmp_path / "sweep.csv"
    model = ["--model", str(path), "--device", "cpu"]
    main(
        [
            "sweep",
            *model,
            "--accuracy",
            str(acc),
            "--sizes",
            "0,1,3",
            "--batch",
            "1,2",
            "--context",
            "8",
            "--repeats",
            "5",
            "--end-to-end",
            "--data",
            str(data),
            "--max-new-tokens",
            "4",
            "-o",
            str(out),
        ]
    )
    assert f"wrote {out}" in capsys.readouterr().out
    df = pd.read_csv(out)
    assert df[["batch", "nodes"]].values.tolist() == [[1, 0], [1, 1], [1, 3], [2, 0], [2, 1], [2, 3]]
    assert df["e2e_tokens_per_s"].notna().all() and (df.loc[df["nodes"] == 0, "e2e_speedup"] == 1.0).all()
    assert (df.loc[df["nodes"] == 0, "e2e_tokens_per_step"] == 1.0).all()

    sel = tmp_path / "sel.json"
    main(["select", "--sweep", str(out), "-o", str(sel)])
    doc = json.loads(sel.read_text())
    assert doc["format"] == "treeopt.selection/v1" and len(doc["cells"]) == 2
    assert all(c["measured_by"] == "end-to-end" for c in doc["cells"])
    capsys.readouterr()

    report = tmp_path / "validation"
    main(
        [
            "validate",
            *model,
            "--accuracy",
            str(acc),
            "--data",
            str(data),
            "--sizes",
            "1,3",
            "--max-new-tokens",
            "5",
            "--batch-size",
            "2",
            "--sweep",
            str(out),
            "-o",
            str(report),
        ]
    )
    text = capsys.readouterr().out
    assert "acceptance (tokens per step)" in text
    acc_df = pd.read_csv(report / "validation_acceptance.csv")
    assert acc_df["nodes"].tolist() == [1, 3] and (acc_df["measured_tokens_per_step"] >= 1).all()
    assert (report / "validation_acceptance.png").is_file()
    assert not (report / "validation_latency.csv").exists()  # the sweep has no predictions

    with pytest.raises(SystemExit) as exc:
        main(["validate", *model, "--accuracy", str(tmp_path / "none.json"), "--data", str(data)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.json" in err[0]
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "sweep",
                *model,
                "--accuracy",
                str(acc),
                "--sizes",
                "0,1",
                "--batch",
                "1",
                "--context",
                "8",
                "--repeats",
                "6",
                "--resume",
                "-o",
                str(out),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "cannot resume" in err[0]
