"""A step file's optional `tree` column: the rows it marks pay the engine's tree verification
term (docs/performance-model.md#engine-terms-of-a-speculative-step), the others price as chains,
exactly as before the column existed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from roofline.engine_presets import step_costs
from roofline.hardware import load_hardware
from roofline.latency import step_time_s
from roofline.profile_fit import fit_profile, predict_step_s, step_points_frame
from roofline.shapes import model_shape
from treeopt.cli import main

# Llama-3-8B: 32 decoder layers (its config.json, num_hidden_layers); the sglang preset's
# tree_verify_layer_s: 31.81 us, the mean of SpecBundle's four tree-minus-chain pairs per layer
# (25.1, 30.4, 34.3, 37.5 us; roofline/data/engine_presets.json, docs/performance-model.md#engine-presets)
LAYERS, SGLANG_TREE_S = 32, 3.181e-05


def _predict(tmp_path, csv: str, *extra) -> pd.DataFrame:
    points, out = tmp_path / "points.csv", tmp_path / "predicted.csv"
    points.write_text(csv)
    main(
        ["roofline", "predict", "--model", "llama-3-8b", "--hardware", "h100", "--points", str(points)]
        + ["-o", str(out), *extra]
    )
    return pd.read_csv(out)


def test_a_tree_row_pays_layers_times_the_presets_term_and_a_chain_does_not(tmp_path):
    csv = "batch,context,tokens,tree\n1,512,6,1\n1,512,6,0\n8,2048,10,true\n8,2048,10,false\n4,1024,1,\n"
    got = _predict(tmp_path, csv, "--engine", "sglang", "--drafter", "eagle3")["predicted_step_ms"].to_numpy()
    # the output keeps 6 significant digits of ~8 ms: 1e-4 ms
    assert got[0] - got[1] == pytest.approx(LAYERS * SGLANG_TREE_S * 1e3, abs=2e-4)
    assert got[2] - got[3] == pytest.approx(LAYERS * SGLANG_TREE_S * 1e3, abs=2e-4)  # once per step, any batch
    # the chains and the plain row price as a file without the column
    plain = _predict(
        tmp_path, "batch,context,tokens\n1,512,6\n8,2048,10\n4,1024,1\n", "--engine", "sglang", "--drafter", "eagle3"
    )["predicted_step_ms"].to_numpy()
    assert got[[1, 3, 4]].tolist() == plain.tolist()


def test_a_file_without_the_column_prices_its_rows_as_chains(tmp_path):
    # the ideal engine prices a tree as a chain too, so the column moves nothing there
    got = _predict(tmp_path, "batch,context,tokens,tree\n1,512,6,1\n2,64,4,0\n")["predicted_step_ms"]
    hw, shape = load_hardware("h100"), model_shape("llama-3-8b")
    assert got.tolist() == pytest.approx(
        [
            step_time_s(shape, None, hw, batch=1, tokens=6, context=512) * 1e3,
            step_time_s(shape, None, hw, batch=2, tokens=4, context=64) * 1e3,
        ],
        rel=1e-5,
    )
    # under the preset, a file of old (column-free) rows prices each as a chain of its tokens
    sglang = step_costs(load_hardware("h100"), engine="sglang", drafter="eagle3").profile
    old = _predict(tmp_path, "batch,context,tokens\n1,512,6\n", "--engine", "sglang", "--drafter", "eagle3")
    chain = step_time_s(shape, None, sglang, batch=1, tokens=6, context=512, tree_verify=False) * 1e3
    assert old["predicted_step_ms"].tolist() == pytest.approx([chain], rel=1e-5)


def test_hw_fit_keeps_the_term_and_predicts_tree_rows_with_it(tmp_path, capsys):
    base = load_hardware("a100").with_(tree_verify_layer_s=3e-5, spec_step_overhead_s=2e-3)
    shape = model_shape("llama-7b")  # 32 layers
    frame = pd.DataFrame(
        {"batch": [1, 1, 4, 4, 1, 4], "context": [128, 128, 512, 512, 1024, 1024], "tokens": [1, 6, 1, 6, 6, 6]}
    )
    frame["tree"] = [0, 1, 0, 1, 0, 0]
    frame["step_ms"] = 1.0
    points = step_points_frame(frame, source="steps")
    frame["step_ms"] = predict_step_s(shape, None, base, points) * 1e3
    tree_rows = frame["tree"].to_numpy() == 1
    # generated with the term on the marked rows only: 32 x 30 us = 0.96 ms above their chains
    chains = predict_step_s(shape, None, base, step_points_frame(frame.drop(columns="tree"), source="s"))
    assert (frame["step_ms"].to_numpy() - chains * 1e3)[tree_rows] == pytest.approx(0.96, rel=1e-9)
    assert (frame["step_ms"].to_numpy() - chains * 1e3)[~tree_rows] == pytest.approx(0.0, abs=1e-12)
    fit = fit_profile(shape, None, base, step_points_frame(frame, source="steps"), leave_one_out=False)
    assert fit.profile.tree_verify_layer_s == 3e-5
    assert np.max(np.abs(fit.in_sample_error)) < 1e-3  # the tree rows' term was priced, not fitted away
    steps = tmp_path / "steps.csv"
    frame.to_csv(steps, index=False)
    out = tmp_path / "fit.json"
    profile = tmp_path / "base.json"
    base.save(profile)
    main(["hw", "fit", "--model", "llama-7b", "--hardware", str(profile), "--measurements", str(steps), "-o", str(out)])
    text = capsys.readouterr().out
    assert "tree_verify_layer_s stays the base's" in text and "the 2 rows marked tree pay it" in text
    assert load_hardware(str(out)).tree_verify_layer_s == 3e-5
