"""A `save_pretrained` folder of an fp32 model declares float32; nobody serves it so.
`roofline speedup` and `report` price bfloat16 then and say so; `--dtype fp32` prices fp32
(docs/performance-model.md#which-dtype-is-priced)."""

from __future__ import annotations

import csv
import json

from calibration.demo_files import DEMO_MODEL_DIR
from tests.test_roofline_cli import CSV, run


def saved_fp32(tmp_path):
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"  # as save_pretrained writes for a model loaded in fp32
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def step_times(path):
    return [float(r["step_time_s"]) for r in csv.DictReader(path.open())]


def test_an_fp32_config_is_priced_in_bf16_and_said_so(capsys, tmp_path):
    model = saved_fp32(tmp_path)
    grids = {}
    for name, extra in (("default", []), ("bf16", ["--dtype", "bf16"]), ("fp32", ["--dtype", "fp32"])):
        grids[name] = tmp_path / f"{name}.csv"
        args = ["roofline", "speedup", "--model", str(model), "--hardware", "h100-sxm", "--accuracy", CSV]
        args += ["--csv-model", "vicuna-7b"]
        code, _, err = run(
            capsys, *args, "--batch", "1,8", "--context", "256", "--max-nodes", "4", *extra, "-o", str(grids[name])
        )
        assert code == 0
        said = "its config declares float32" in err
        assert said == (name == "default"), (name, err)
    assert step_times(grids["default"]) == step_times(grids["bf16"])
    # fp32 reads twice the weight bytes: a slower plain step than bf16 on the same board
    assert step_times(grids["fp32"])[0] > step_times(grids["bf16"])[0]


def test_the_report_states_the_dtype_it_priced(capsys, tmp_path):
    model = saved_fp32(tmp_path)
    out = tmp_path / "report"
    code, _, err = run(
        capsys,
        "report",
        "--model",
        str(model),
        "--hardware",
        "h100-sxm",
        "--batch",
        "1",
        "--context",
        "256",
        "--max-nodes",
        "4",
        "-o",
        str(out),
    )
    assert code == 0 and "priced in bfloat16" in err
    assert "priced in bfloat16" in (out / "index.md").read_text()
