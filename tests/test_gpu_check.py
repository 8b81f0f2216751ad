"""`python benchmarks/gpu_check.py` (docs/performance-model.md#checking-on-a-gpu): the one-command
check of the latency model on a GPU runs here with `--quick --device cpu`, so that it cannot rot.
The report's numbers are recomputed from its own columns: the errors, T(n)/T(0), the summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import gpu_check  # noqa: E402

from roofline.hardware import builtin_hardware, load_hardware  # noqa: E402

QUICK_CELLS = [
    (b, s, n) for b in gpu_check.QUICK["batches"] for s in gpu_check.QUICK["contexts"] for n in gpu_check.QUICK_SIZES
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "report"
    assert gpu_check.main(["--quick", "--device", "cpu", "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def cells(report):
    return pd.read_csv(report / "cells.csv")


@pytest.fixture(scope="module")
def summary(report):
    return json.loads((report / "summary.json").read_text())


def test_the_quick_check_writes_the_report(report):
    for name in ("index.md", "cells.csv", "summary.json", "hardware.json", "gemm_rows.csv", "sweep.csv"):
        assert (report / name).is_file(), name
    text = (report / "index.md").read_text()
    for heading in ("## Errors", "## Cells", "## GEMM row curve", "## Eager vs graph capture"):
        assert heading in text


def test_every_cell_is_measured_and_predicted(cells):
    assert sorted(map(tuple, cells[["batch", "context", "nodes"]].to_numpy().tolist())) == sorted(QUICK_CELLS)
    for column in ("measured_ms", "measured_ratio", "predicted_calibrated_ms", "predicted_calibrated_ratio"):
        values = cells[column].to_numpy(dtype=float)
        assert np.all(np.isfinite(values)) and np.all(values > 0), column
    assert np.all(cells["measured_p10_ms"] <= cells["measured_ms"])
    assert np.all(cells["measured_ms"] <= cells["measured_p90_ms"])


def test_t0_over_t0_is_one_in_every_group(cells):
    plain = cells[cells["nodes"] == 0]
    assert len(plain) == len(gpu_check.QUICK["batches"]) * len(gpu_check.QUICK["contexts"])
    assert np.allclose(plain["measured_ratio"], 1.0)
    assert np.allclose(plain["predicted_calibrated_ratio"], 1.0)


def test_predicted_ratios_are_over_the_same_groups_plain_step(cells):
    plain = cells[cells["nodes"] == 0].set_index(["batch", "context"])["predicted_calibrated_ms"]
    t0 = np.array([plain[(b, s)] for b, s in cells[["batch", "context"]].itertuples(index=False)])
    assert np.allclose(cells["predicted_calibrated_ratio"], cells["predicted_calibrated_ms"] / t0, rtol=1e-6)


def test_the_prediction_is_the_one_the_sweep_writes(report, cells):
    """The calibrated column is what `treeopt sweep --hardware hardware.json` predicts."""
    sweep = pd.read_csv(report / "sweep.csv").sort_values(["batch", "context", "nodes"]).reset_index(drop=True)
    mine = cells.sort_values(["batch", "context", "nodes"]).reset_index(drop=True)
    assert np.allclose(mine["predicted_calibrated_ms"], sweep["predicted_step_time_s"] * 1e3, rtol=1e-6)
    assert np.allclose(mine["measured_ms"], sweep["step_time_s"] * 1e3, rtol=1e-6)


def test_there_is_no_built_in_profile_for_a_cpu(cells, summary, report):
    for column in ("predicted_builtin_ms", "predicted_builtin_ratio", "step_error_builtin", "ratio_error_builtin"):
        assert column in cells.columns and cells[column].isna().all(), column
    builtin = summary["profiles"]["builtin"]
    assert builtin["profile"] is None and builtin["errors"] is None and "CPU" in builtin["why_absent"]
    assert "absent" in (report / "index.md").read_text()


def test_the_summary_errors_are_the_cells_errors(cells, summary):
    """Median and worst |predicted / measured - 1|, recomputed from the measured and predicted
    columns: the step time over every cell, T(n)/T(0) over the cells with a tree."""
    errors = summary["profiles"]["calibrated"]["errors"]
    step = (cells["predicted_calibrated_ms"] / cells["measured_ms"] - 1).abs()
    trees = cells[cells["nodes"] > 0]
    ratio = (trees["predicted_calibrated_ratio"] / trees["measured_ratio"] - 1).abs()
    assert errors["step_time_error"]["median"] == pytest.approx(float(np.median(step)), rel=1e-6)
    assert errors["step_time_error"]["worst"] == pytest.approx(float(step.max()), rel=1e-6)
    assert errors["step_time_error"]["cells"] == len(cells)
    assert errors["ratio_error"]["median"] == pytest.approx(float(np.median(ratio)), rel=1e-6)
    assert errors["ratio_error"]["worst"] == pytest.approx(float(ratio.max()), rel=1e-6)
    assert errors["ratio_error"]["cells"] == len(trees)
    assert np.allclose(cells["ratio_error_calibrated"].abs()[cells["nodes"] > 0], ratio, rtol=1e-6)


def test_the_calibrated_profile_and_the_gemm_rows(report, summary):
    profile = load_hardware(str(report / "hardware.json"))
    assert profile.name == summary["profiles"]["calibrated"]["profile"]
    assert "random weights" in profile.source  # the engine terms were fitted on the random model
    gemm = pd.read_csv(report / "gemm_rows.csv")
    assert list(gemm["rows"]) == [int(r) for r in profile.gemm_efficiency.rows]
    assert np.allclose(gemm["calibrated_efficiency"], profile.gemm_efficiency.values)
    assert gemm["builtin_efficiency"].isna().all()


def test_the_eager_columns_are_the_eager_sweeps(report, cells, summary):
    """Each cell is measured twice: the static-shape steps (nothing captured on a CPU) in
    sweep.csv, the eager forward in sweep-eager.csv; eager / static is recomputed from them."""
    static = json.loads((report / "sweep.meta.json").read_text())
    eager = json.loads((report / "sweep-eager.meta.json").read_text())
    assert (static["steps"], eager["steps"]) == ("static", "eager")
    sweep = pd.read_csv(report / "sweep-eager.csv").sort_values(["batch", "context", "nodes"]).reset_index(drop=True)
    mine = cells.sort_values(["batch", "context", "nodes"]).reset_index(drop=True)
    assert np.allclose(mine["eager_ms"], sweep["step_time_s"] * 1e3, rtol=1e-6)
    assert np.allclose(mine["eager_ratio"], sweep["overhead"], rtol=1e-6)
    assert np.allclose(mine["eager_over_graphs"], mine["eager_ms"] / mine["measured_ms"], rtol=1e-6)
    stats = summary["graph_capture"]["eager_over_graphs"]
    assert stats["median"] == pytest.approx(float(np.median(mine["eager_ms"] / mine["measured_ms"])), rel=1e-6)
    first = mine[mine["batch"] == 1]
    assert stats["batch1_median"] == pytest.approx(float(np.median(first["eager_ms"] / first["measured_ms"])), rel=1e-6)
    assert summary["graph_capture"]["mode"] == "static" and summary["graph_capture"]["failed_captures"] == []
    section = (report / "index.md").read_text().split("## Eager vs graph capture", 1)[1]
    assert "nothing is captured" in section and section.count("\n| ") == len(cells) + 1


def test_the_anatomy_of_a_batch_1_step(report, summary):
    """The plain step and the largest tree at batch 1 and the first context; the weights' floor
    is the model's bytes over the calibrated streaming bandwidth, recomputed here; a CPU has no
    device operations to count."""
    rows = summary["anatomy"]
    assert [(r["nodes"], r["batch"], r["context"]) for r in rows] == [(0, 1, 64), (64, 1, 64)]
    width = {"bf16": 2, "fp16": 2, "fp32": 4}[summary["model"]["dtype"]]
    bandwidth = load_hardware(str(report / "hardware.json")).bandwidth_bytes_per_s
    for r in rows:
        assert r["weights_ms"] == pytest.approx(summary["model"]["params"] * width / bandwidth * 1e3, rel=1e-9)
        assert r["step_ms"] > 0 and r["forward_ms"] > 0 and "device_ops" not in r
    assert "## Where a batch-1 step's time goes" in (report / "index.md").read_text()


def test_a_check_without_the_eager_sweep_says_so(tmp_path):
    out = tmp_path / "report"
    argv = ["--quick", "--device", "cpu", "--batch", "1", "--context", "32", "--sizes", "0,4", "--no-eager"]
    assert gpu_check.main([*argv, "-o", str(out)]) == 0
    assert not (out / "sweep-eager.csv").exists()
    cells = pd.read_csv(out / "cells.csv")
    assert cells["eager_ms"].isna().all()
    assert json.loads((out / "summary.json").read_text())["graph_capture"]["eager_over_graphs"] is None
    assert "was not run" in (out / "index.md").read_text()


def test_the_batch_1_check_against_a_built_in_profile():
    """On a GPU with a built-in profile: median and worst |error| over the batch-1 cells against
    the 20% target, by hand from three cells (the batch-2 cell does not count)."""
    cells = pd.DataFrame(
        {
            "batch": [1, 1, 1, 2],
            "context": [512, 512, 2048, 512],
            "nodes": [0, 8, 0, 0],
            "measured_ms": [10.0, 12.0, 11.0, 20.0],
            "predicted_builtin_ms": [9.0, 12.6, 13.75, 5.0],
        }
    )
    cells["step_error_builtin"] = cells["predicted_builtin_ms"] / cells["measured_ms"] - 1  # -10%, +5%, +25%
    check = gpu_check.batch1_check(cells)
    assert check["cells"] == 3 and check["median"] == pytest.approx(0.10) and check["worst"] == pytest.approx(0.25)
    assert check["mean_signed"] == pytest.approx((-0.10 + 0.05 + 0.25) / 3)
    assert check["within"] is False
    assert [p["context"] for p in check["plain"]] == [512, 2048]
    cells.loc[2, "predicted_builtin_ms"] = 12.1  # +10%
    cells["step_error_builtin"] = cells["predicted_builtin_ms"] / cells["measured_ms"] - 1
    assert gpu_check.batch1_check(cells)["within"] is True
    assert gpu_check.batch1_check(cells.assign(step_error_builtin=np.nan)) is None


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("NVIDIA A100-PCIE-40GB", None),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", None),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A40", "a40"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA B200", "b200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA A10G", None),
        ("Tesla V100-SXM2-32GB", None),
    ],
)
def test_a_gpu_name_picks_its_built_in_profile(name, profile):
    assert gpu_check.builtin_profile_for(name) == profile


def test_every_board_maps_to_a_built_in_profile():
    assert set(gpu_check._BOARDS.values()) <= set(builtin_hardware())


def test_groups_that_do_not_fit_are_left_out():
    config = SimpleNamespace(**gpu_check.QUICK_CONFIG)
    cfg = {"batches": (1, 2, 4), "contexts": (64, 256), "sizes": (0, 1, 16)}
    need = gpu_check.bench_bytes(config, 4, 256 + 17, 2)
    plan, skipped = gpu_check.sweep_plan(cfg, config, 2, int(need / gpu_check.MEMORY_SHARE) - 1)
    assert plan == {(1, 2, 4): [64], (1, 2): [256]}
    assert [(g["batch"], g["context"]) for g in skipped] == [(4, 256)]
    assert gpu_check.sweep_plan(cfg, config, 2, None) == ({(1, 2, 4): [64, 256]}, [])


def test_a_group_left_out_is_reported_and_the_rest_measured(tmp_path, monkeypatch):
    """The groups that fit are swept into one file (a resumed sweep adds the later ones) and the
    group left out is named in the report, not measured."""
    config = SimpleNamespace(**gpu_check.QUICK_CONFIG)
    free = int(gpu_check.bench_bytes(config, 2, 128 + 5, 2) / gpu_check.MEMORY_SHARE) - 1
    monkeypatch.setattr(gpu_check, "available_bytes", lambda device: free)
    out = tmp_path / "report"
    argv = ["--quick", "--device", "cpu", "--dtype", "bf16", "--batch", "1,2", "--context", "32,128", "--sizes", "0,4"]
    assert gpu_check.main([*argv, "-o", str(out)]) == 0
    cells = pd.read_csv(out / "cells.csv")
    groups = set(map(tuple, cells[["batch", "context"]].to_numpy().tolist()))
    assert groups == {(1, 32), (2, 32), (1, 128)}
    assert len(pd.read_csv(out / "sweep.csv")) == len(cells) == 6
    summary = json.loads((out / "summary.json").read_text())
    assert [(g["batch"], g["context"]) for g in summary["skipped_groups"]] == [(2, 128)]
    assert "Left out" in (out / "index.md").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--batch", "1,x"],
        ["--sizes", "-1"],
        ["--device", "tpu"],
        pytest.param(["--device", "cuda"], marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")),
        ["--dtype", "int8"],
        ["--model", "no-such-model"],
        ["--no-such-option"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, tmp_path, capsys):
    out = tmp_path / "report"
    assert gpu_check.main([*argv, "--quick", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_check: error: ")
    assert not out.exists()


def test_a_gpu_report_has_both_profiles(report, tmp_path):
    """What only a GPU run shows, on this machine's sweep: a built-in profile's column beside the
    calibrated one, its errors in the summary and its GEMM rate beside the measured one."""
    sweep = pd.read_csv(report / "sweep.csv")
    calibrated = load_hardware(str(report / "hardware.json"))
    builtin = load_hardware("h100-sxm")
    predictors = {
        "calibrated": lambda b, q, s: 1e-3 * (1 + 0.01 * q),
        "builtin": lambda b, q, s: 2e-4 * (b + 0.001 * q * s),
    }
    cells = gpu_check.cell_table(sweep, predictors)
    step = 0.2 * (cells["batch"] + 0.001 * (cells["nodes"] + 1) * cells["context"])
    assert np.allclose(cells["predicted_builtin_ms"], step)
    plain = 0.2 * (cells["batch"] + 0.001 * cells["context"])
    assert np.allclose(cells["predicted_builtin_ratio"], cells["predicted_builtin_ms"] / plain)
    stats = gpu_check.error_stats(cells, "builtin")
    trees = cells[cells["nodes"] > 0]
    ratio = (trees["predicted_builtin_ratio"] / trees["measured_ratio"] - 1).abs()
    assert stats["ratio_error"]["median"] == pytest.approx(float(np.median(ratio)))
    gemm = gpu_check.gemm_rows(calibrated, builtin, "bf16")
    rows = gemm["rows"].to_numpy(dtype=float)
    assert np.allclose(gemm["builtin_tflops"], 989 * 0.74 * builtin.gemm_efficiency(rows))
    assert np.allclose(gemm["calibrated_over_builtin"], gemm["calibrated_tflops"] / gemm["builtin_tflops"])
    text = "\n".join(gpu_check._gemm_markdown(gemm, "h100-sxm") + gpu_check._cells_markdown(cells))
    assert "No built-in profile" not in text and "(+" in text
