"""Every command against bad input: one line, exit status 2, nothing created or changed.

Each case runs `treeopt ARGS` in a fresh copy of a folder of valid inputs (plus the case's own
bad files) and asserts what a user relies on (docs/formats.md#output-safety): exit status
2, exactly one line on stderr starting with "treeopt: error:", no traceback, no file created,
changed or removed anywhere in the folder (the inputs byte-identical afterwards), and, where
the case names one, the words that say what is wrong. Most cases fail before any model loads;
the model commands use a tiny random model written once per module.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from calibration.demo_files import DEMO_MODEL_DIR
from calibration.models import tiny_model_for_tests
from roofline.hardware import load_hardware
from treeopt.accuracy import AccuracyTable
from treeopt.cli import main
from treeopt.selection import SWEEP_COLUMNS

REPO = Path(__file__).resolve().parents[1]
MEDUSA_CSV = REPO / "treeopt" / "data" / "medusa_train_accuracy.csv"
PROPOSAL = [[0], [0, 0], [1], [0, 1]]


def snapshot(folder: Path) -> dict:
    """Every file and link under `folder` with its bytes (links by their target)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = p.read_bytes()
        elif p.is_dir():
            out[rel] = "dir"
    return out


def _sweep_frame() -> pd.DataFrame:
    rows = []
    tau = [1.0, 1.6, 1.9, 2.1, 2.2]
    for b in (1, 4):
        for s in (128, 512):
            for n in range(5):
                speed = tau[n] / (1.0 + 0.1 * n * b)
                rows.append(
                    {
                        "batch": b,
                        "context": s,
                        "nodes": n,
                        "tau": tau[n],
                        "tau_independent": tau[n],
                        "overhead": tau[n] / speed,
                        "speedup": speed,
                        "step_time_s": 0.01 * tau[n] / speed,
                        "predicted_overhead": tau[n] / speed,
                        "predicted_speedup": speed,
                    }
                )
    return pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS)


def _sweep_meta() -> dict:
    return {
        "format": "treeopt.sweep/v1",
        "model": "tiny",
        "device": "cpu",
        "proposal": PROPOSAL,
        "batches": [1, 4],
        "contexts": [128, 512],
        "measurement": {"sizes": [0, 1, 2, 3, 4], "repeats": 5, "warmup": 1, "topk": 10, "seed": 0},
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder of valid inputs: every case starts from a copy of it."""
    root = tmp_path_factory.mktemp("valid")
    rng = np.random.default_rng(0)
    ranks = np.minimum(rng.geometric(0.5, size=(400, 3)) - 1, 4)
    AccuracyTable.from_ranks(ranks, 4, provenance={"model": "tiny"}).save(root / "acc.json")
    (root / "tree.json").write_text(json.dumps(PROPOSAL))
    load_hardware("a100").save(root / "hw.json")
    _sweep_frame().to_csv(root / "sweep.csv", index=False)
    (root / "sweep.meta.json").write_text(json.dumps(_sweep_meta()))
    (root / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"def f{i}(x): return x + {i}"}) + "\n" for i in range(4))
    )
    (root / "points.csv").write_text("batch,context,tokens,step_ms\n1,128,1,10\n1,128,5,11\n4,512,1,12\n4,512,5,14\n")
    shutil.copy(MEDUSA_CSV, root / "medusa.csv")
    tiny_model_for_tests(root / "tiny", num_medusa_heads=3)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        main(
            [
                "roofline",
                "speedup",
                "--model",
                "llama-7b",
                "--hardware",
                "a100",
                "--accuracy",
                "acc.json",
                "--batch",
                "1,4",
                "--context",
                "128,512",
                "--max-nodes",
                "8",
                "-o",
                "grid.csv",
            ]
        )
    finally:
        os.chdir(cwd)
    return root


# --------------------------------------------------------------------------------------------
# the cases: (id, command line, bad files to add {name: bytes | str | callable(folder)}, words)


def _write(name, content):
    return {name: content}


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


HUGE_INT = "1" + "0" * 4300


def _alpha_sidecar(*, v1: bool = False) -> dict:
    """A valid alpha sidecar of 2 depths at temperature 1
    (docs/formats.md#alpha-sidecar-namealphajson-treeoptchain_acceptancev2)."""
    doc = {"temperature": 1.0, "alpha_per_depth": [0.6, 0.5], "tau_walked": [1.0, 1.6, 1.9], "rows": 100}
    if v1:
        return {"format": "treeopt.chain_acceptance/v1", **doc}
    table = [[0.6, 0.1], [0.5, 0.1]]
    return {
        "format": "treeopt.chain_acceptance/v2",
        **doc,
        "accept_per_child": table,
        "accept_per_child_stderr": [[0.01, 0.01], [0.01, 0.01]],
        "samples": 4,
    }


CASES = [
    # ---- options that mean nothing or cannot be met ----
    (
        "accuracy-width-huge",
        "build --accuracy wide.json --nodes 4",
        {
            "wide.json": json.dumps(
                {
                    "format": "treeopt.accuracy/v1",
                    "num_heads": 1,
                    "width": 10**12,
                    "heads": [{"head": 1, "positions": 10, "hits": [1]}],
                }
            )
        },
        "expected 1000000000000 values (width), got 1 values",
    ),
    (
        "check-csv-model-without-accuracy",
        "check tree.json --engine trtllm --csv-model vicuna-7b",
        {},
        "--csv-model: only",
    ),
    (
        "gamma-max-gamma-huge",
        "roofline gamma --model llama-7b --hardware a100 --draft-model llama-7b --alpha-value 0.8 --max-gamma 1000000",
        {},
        "must be at most 256",
    ),
    # ---- output equal to an input (the list, and links to it) ----
    ("build-o-acc", "build --accuracy acc.json --nodes 4 -o acc.json", {}, "is also an input"),
    ("build-nodes-twice", "build --accuracy acc.json --nodes 4 --nodes 8 -o t.json", {}, "--nodes given 2 times"),
    ("build-tree-o-tree", "build --tree tree.json -o tree.json", {}, "is also an input"),
    (
        "build-o-link",
        "build --accuracy acc.json --nodes 4 -o link.json",
        {"link.json": ("link", "acc.json")},
        "is also an input",
    ),
    ("build-o-dotdot", "build --accuracy acc.json --nodes 4 -o tiny/../acc.json", {}, "is also an input"),
    ("buffers-o-tree", "buffers tree.json -o tree.json", {}, "is also an input"),
    ("select-o-sweep", "select --sweep sweep.csv -o sweep.csv", {}, "is also an input"),
    ("select-o-meta", "select --sweep sweep.csv -o sweep.meta.json", {}, "is also an input"),
    ("select-grid-o-grid", "select --grid grid.csv --accuracy acc.json -o grid.csv", {}, "is also an input"),
    ("select-grid-o-acc", "select --grid grid.csv --accuracy acc.json -o acc.json", {}, "is also an input"),
    (
        "speedup-o-acc",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json -o acc.json",
        {},
        "is also an input",
    ),
    (
        "speedup-select-acc",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json --select acc.json",
        {},
        "is also an input",
    ),
    (
        "speedup-o-hw",
        "roofline speedup --model llama-7b --hardware hw.json --accuracy acc.json -o hw.json",
        {},
        "is also an input",
    ),
    (
        "select-tolerance-too-large",
        "select --sweep sweep.csv --tolerance 0.7",
        {},
        "must be a fraction in [0, 0.5)",
    ),
    (
        "sweep-too-few-rounds",
        "sweep --model {tiny} --accuracy acc.json --repeats 3 -o out.csv",
        {},
        "must be at least 5, got 3 (with fewer paired rounds",
    ),
    (
        "run-too-few-rounds",
        "run --repeats 4 -o out",
        {},
        "must be at least 5, got 4",
    ),
    (
        "candidates-o-acc",
        "roofline candidates --model llama-7b --hardware a100 --accuracy acc.json --topk 4,3,2 --candidates 4 "
        "-o acc.json",
        {},
        "is also an input",
    ),
    (
        "speedup-o-equals-select",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json -o g.json --select g.json",
        {},
        "twice",
    ),
    (
        "predict-o-points",
        "roofline predict --model llama-7b --hardware a100 --points points.csv -o points.csv",
        {},
        "is also an input",
    ),
    (
        "predict-o-hw",
        "roofline predict --model llama-7b --hardware hw.json --points points.csv -o hw.json",
        {},
        "is also an input",
    ),
    (
        "fit-o-measurements",
        "hw fit --model llama-7b --hardware a100 --measurements points.csv -o points.csv",
        {},
        "is also an input",
    ),
    (
        "fit-o-hw",
        "hw fit --model llama-7b --hardware hw.json --measurements points.csv -o hw.json",
        {},
        "is also an input",
    ),
    ("calibrate-o-data", "calibrate --model {tiny} --data prompts.jsonl -o prompts.jsonl", {}, "is also an input"),
    ("calibrate-import-o-import", "calibrate --import imp.pt -o imp.pt", {"imp.pt": b"not really"}, "is also an input"),
    ("sweep-o-acc", "sweep --model {tiny} --accuracy acc.json -o acc.json", {}, "is also an input"),
    ("sweep-o-hw", "sweep --model {tiny} --accuracy acc.json --hardware hw.json -o hw.json", {}, "is also an input"),
    ("hwcal-o-hw", "hw calibrate --model {tiny} -o tiny/config.json", {}, "is also an input"),
    # ---- output locations that cannot be written ----
    ("build-o-dir", "build --accuracy acc.json --nodes 4 -o tiny", {}, "is a directory"),
    ("build-o-under-file", "build --accuracy acc.json --nodes 4 -o acc.json/x.txt", {}, "not a directory"),
    ("build-o-proc", "build --accuracy acc.json --nodes 4 -o /proc/treeopt/x.txt", {}, "cannot be written"),
    ("buffers-o-dir", "buffers tree.json -o tiny", {}, "is a directory"),
    ("select-o-dir", "select --sweep sweep.csv -o tiny", {}, "is a directory"),
    ("select-o-proc", "select --sweep sweep.csv -o /proc/treeopt/s.json", {}, "cannot be written"),
    (
        "speedup-o-proc",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json -o /proc/treeopt/g.csv",
        {},
        "cannot be written",
    ),
    (
        "speedup-select-proc",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json -o g.csv --select /proc/treeopt/s.json",
        {},
        "cannot be written",
    ),
    (
        "speedup-select-dir",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json -o g.csv --select tiny",
        {},
        "directory",
    ),
    (
        "predict-o-proc",
        "roofline predict --model llama-7b --hardware a100 --points points.csv -o /proc/treeopt/p.csv",
        {},
        "cannot be written",
    ),
    (
        "fit-o-proc",
        "hw fit --model llama-7b --hardware a100 --measurements points.csv -o /proc/treeopt/f.json",
        {},
        "cannot be written",
    ),
    ("report-o-file", "report --model llama-7b --hardware a100 --accuracy acc.json -o acc.json", {}, "is a file"),
    (
        "report-o-proc",
        "report --model llama-7b --hardware a100 --accuracy acc.json -o /proc/treeopt/r",
        {},
        "cannot be written",
    ),
    (
        "calibrate-o-proc",
        "calibrate --model {tiny} --data prompts.jsonl -o /proc/treeopt/acc.json",
        {},
        "cannot be written",
    ),
    ("calibrate-o-dir", "calibrate --model {tiny} --data prompts.jsonl -o tiny", {}, "is a directory"),
    (
        "calibrate-import-o-proc",
        "calibrate --import imp.pt -o /proc/treeopt/acc.json",
        {"imp.pt": b"x"},
        "cannot be written",
    ),
    ("sweep-o-proc", "sweep --model {tiny} --accuracy acc.json -o /proc/treeopt/s.csv", {}, "cannot be written"),
    ("sweep-o-dir", "sweep --model {tiny} --accuracy acc.json -o adir", {"adir/x": "x"}, "is a directory"),
    (
        "validate-o-file",
        "validate --model {tiny} --accuracy acc.json --data prompts.jsonl -o notes.txt",
        {"notes.txt": "x"},
        "not a directory",
    ),
    (
        "validate-o-acc",
        "validate --model {tiny} --accuracy acc.json --data prompts.jsonl -o acc.json",
        {},
        "is also an input",
    ),
    (
        "validate-o-proc",
        "validate --model {tiny} --accuracy acc.json --data prompts.jsonl -o /proc/treeopt/v",
        {},
        "cannot be written",
    ),
    (
        "run-o-file",
        "run --model {tiny} --data prompts.jsonl --validation-data prompts.jsonl -o acc.json",
        {},
        "not a directory",
    ),
    (
        "run-o-proc",
        "run --model {tiny} --data prompts.jsonl --validation-data prompts.jsonl -o /proc/treeopt/r",
        {},
        "cannot be written",
    ),
    ("hwcal-o-proc", "hw calibrate --model {tiny} -o /proc/treeopt/hw.json", {}, "cannot be written"),
    ("hwcal-o-dir", "hw calibrate --model {tiny} -o tiny", {}, "directory"),
    ("demo-train-o-file", "demo train -o acc.json", {}, "is a file"),
    ("demo-train-o-proc", "demo train -o /proc/treeopt/demo", {}, "cannot be written"),
    # ---- late validation moved up front ----
    (
        "run-validation-data-missing",
        "run --model {tiny} --data prompts.jsonl --validation-data nope.jsonl -o r",
        {},
        "nope.jsonl",
    ),
    ("run-data-missing", "run --model {tiny} --data nope.jsonl -o r", {}, "nope.jsonl"),
    (
        "run-validation-data-bad",
        "run --model {tiny} --data prompts.jsonl --validation-data bad.jsonl -o r",
        {"bad.jsonl": "{not json\n"},
        "bad.jsonl",
    ),
    ("run-mix-bad", "run --model {tiny} --data prompts.jsonl --mix 1:x -o r", {}, "mix"),
    (
        "validate-sweep-missing",
        "validate --model {tiny} --accuracy acc.json --data prompts.jsonl --sweep no.csv",
        {},
        "no.csv",
    ),
    (
        "validate-sweep-bad",
        "validate --model {tiny} --accuracy acc.json --data prompts.jsonl --sweep bad.csv",
        {"bad.csv": "batch,context\n1,2\n"},
        "bad.csv",
    ),
    ("validate-data-missing", "validate --model {tiny} --accuracy acc.json --data nope.jsonl", {}, "nope.jsonl"),
    (
        "sweep-data-missing",
        "sweep --model {tiny} --accuracy acc.json --end-to-end --data nope.jsonl -o s.csv",
        {},
        "nope.jsonl",
    ),
    (
        "sweep-hardware-missing",
        "sweep --model {tiny} --accuracy acc.json --hardware nope.json -o s.csv",
        {},
        "nope.json",
    ),
    ("decode-prompt-too-long", "decode --model {tiny} --prompt " + "a" * 1100, {}, "position"),
    (
        "decode-captured-drafting-eager",
        "decode --model {tiny} --prompt hi --drafting captured --no-graphs",
        {},
        "static",
    ),
    (
        "sweep-captured-drafting-eager",
        "sweep --model {tiny} --accuracy acc.json --drafting captured --no-graphs -o s.csv",
        {},
        "static",
    ),
    (
        "sweep-captured-drafting-candidates",
        "sweep --model {tiny} --accuracy acc.json --drafting captured --graphs --verification candidates -o s.csv",
        {},
        "candidate",
    ),
    # ---- sweeps that are damaged or incomplete ----
    (
        "select-sweep-cut-mid-line",
        "select --sweep cut.csv",
        {
            "cut.csv": lambda d: (d / "cut.csv").write_bytes((d / "sweep.csv").read_bytes()[:-7]),
            "cut.meta.json": lambda d: shutil.copy(d / "sweep.meta.json", d / "cut.meta.json"),
        },
        "cut",
    ),
    (
        "select-sweep-incomplete",
        "select --sweep part.csv",
        {
            "part.csv": lambda d: _sweep_frame().iloc[:10].to_csv(d / "part.csv", index=False),
            "part.meta.json": json.dumps(_sweep_meta()),
        },
        "incomplete",
    ),
    (
        "select-sweep-group-missing-size",
        "select --sweep part.csv",
        {
            "part.csv": lambda d: _sweep_frame().drop(index=[3]).to_csv(d / "part.csv", index=False),
            "part.meta.json": json.dumps(_sweep_meta()),
        },
        "incomplete",
    ),
    ("select-grid-binary", "select --grid bin.csv --accuracy acc.json", {"bin.csv": bytes(range(256)) * 4}, "bin.csv"),
    (
        "select-grid-header-only",
        "select --grid h.csv --accuracy acc.json",
        {"h.csv": "batch,context,nodes,speedup\n"},
        "h.csv",
    ),
    ("select-grid-empty", "select --grid e.csv --accuracy acc.json", {"e.csv": ""}, "e.csv"),
    # ---- hardware profiles ----
    (
        "hw-curve-source-number",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, gemm_efficiency_source=3)},
        "gemm_efficiency_source",
    ),
    ("hw-published-unmeasured", "hw published --hardware l4", {}, "no published measurements for l4"),
    ("hw-published-file", "hw published --hardware p.json", {"p.json": lambda d: _profile(d)}, "no published"),
    (
        "hw-gemm-null",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, gemm_efficiency=None)},
        "gemm_efficiency",
    ),
    (
        "hw-name-list",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, name=["a", "b"])},
        "name",
    ),
    (
        "hw-calibration-string",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, calibration="yes")},
        "calibration",
    ),
    (
        "hw-description-number",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, description=5)},
        "description",
    ),
    (
        "hw-kv-update-list",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, kv_cache_update=["append"])},
        "kv_cache_update",
    ),
    (
        "hw-peak-string",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, peak_flops={"bf16": "fast"})},
        "peak_flops",
    ),
    (
        "hw-bandwidth-null",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, bandwidth_bytes_per_s=None)},
        "bandwidth",
    ),
    (
        "hw-curve-string",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, gemm_efficiency="flat")},
        "gemm_efficiency",
    ),
    (
        "hw-curve-rows-null",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, gemm_efficiency={"rows": None, "values": [1]})},
        "gemm_efficiency",
    ),
    (
        "hw-attn-curve-list",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": lambda d: _profile(d, attention_efficiency=[1, 2])},
        "attention_efficiency",
    ),
    (
        "hw-source-dict",
        "roofline speedup --model llama-7b --hardware p.json --accuracy acc.json",
        {"p.json": lambda d: _profile(d, source={"a": 1})},
        "source",
    ),
    ("hw-nested-deep", "roofline ops --model llama-7b --hardware p.json", {"p.json": _deep_json(100_000)}, "p.json"),
    (
        "hw-huge-int",
        "roofline ops --model llama-7b --hardware p.json",
        {"p.json": '{"name": "x", "bandwidth_bytes_per_s": ' + HUGE_INT + "}"},
        "p.json",
    ),
    ("hw-top-list", "roofline ops --model llama-7b --hardware p.json", {"p.json": "[]"}, "p.json"),
    (
        "report-hw-gemm-null",
        "report --model llama-7b --hardware p.json --accuracy acc.json -o r",
        {"p.json": lambda d: _profile(d, gemm_efficiency=None)},
        "gemm_efficiency",
    ),
    # ---- JSON that the parser cannot take ----
    ("acc-nested-deep", "build --accuracy deep.json --nodes 4", {"deep.json": _deep_json(100_000)}, "deep.json"),
    ("acc-huge-int", "build --accuracy big.json --nodes 4", {"big.json": "[[" + HUGE_INT + "]]"}, "big.json"),
    ("tree-nested-deep", "show deep.json", {"deep.json": _deep_json(100_000)}, "deep.json"),
    ("tree-huge-int", "show big.json", {"big.json": "[[" + HUGE_INT + "]]"}, "big.json"),
    ("tree-literal-deep", "show " + _deep_json(5000), {}, "tree"),
    ("tree-rank-2-63", "show [[9223372036854775808]]", {}, "rank"),
    ("buffers-rank-2-63", "buffers [[9223372036854775807]]", {}, "rank"),
    ("buffers-huge-topk", "buffers tree.json --topk 1000000000000", {}, "topk"),
    ("build-width-1e12", "build --accuracy acc.json --nodes 4 --max-children 1000000000000", {}, "max-children"),
    ("build-nodes-1e12", "build --accuracy acc.json --nodes 1000000000000", {}, "nodes"),
    (
        "sweep-meta-deep",
        "select --sweep d.csv",
        {"d.csv": lambda d: shutil.copy(d / "sweep.csv", d / "d.csv"), "d.meta.json": _deep_json(100_000)},
        "d.meta.json",
    ),
    ("selection-cell-deep", "build --tree sel.json:mix", {"sel.json": _deep_json(100_000)}, "sel.json"),
    # ---- model and heads files ----
    (
        "model-safetensors-truncated",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, lambda m: _truncate(m / "model.safetensors", 100))},
        "--model",
    ),
    (
        "model-config-invalid",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, lambda m: (m / "config.json").write_text("{nope"))},
        "config.json",
    ),
    (
        "model-config-list",
        "calibrate --model m --data prompts.jsonl -o a.json",
        {"m": lambda d: _model_copy(d, lambda m: (m / "config.json").write_text("[1, 2]"))},
        "config.json",
    ),
    (
        "heads-config-list",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, lambda m: (m / "heads" / "config.json").write_text("[1]"))},
        "config.json",
    ),
    (
        "heads-5000",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, lambda m: _heads_config(m, medusa_num_heads=5000))},
        "5000",
    ),
    (
        "heads-layers-huge",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, lambda m: _heads_config(m, medusa_num_layers=10**6))},
        "heads",
    ),
    (
        "heads-bin-not-torch",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, _heads_as_bad_bin)},
        "heads",
    ),
    (
        "heads-pt-pickled-code",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, _heads_as_pickled_code)},
        "holds Python objects other than tensors (posix.getcwd), refused",
    ),
    (
        "sweep-context-beyond-positions",
        "sweep --model {tiny} --accuracy acc.json --batch 4096 --context 100000 -o s.csv",
        {},
        "--context: 100,000 + ",
    ),
    (
        "sweep-cell-beyond-memory",
        "sweep --model {tiny} --accuracy acc.json --batch 100000000 --context 512 -o s.csv",
        {},
        "GiB for its cache and prefill",
    ),
    (
        "fit-step-1e308-ms",
        "hw fit --model llama-7b --hardware a100 --measurements huge.csv -o f.json",
        {"huge.csv": "batch,context,tokens,step_ms\n1,128,1,20\n1,128,2,1e308\n"},
        "row 2: 'step_ms' 1e+308 is over",
    ),
    # the step file's optional tree column (docs/performance-model.md#fitting-a-profile-to-measured-steps)
    (
        "predict-tree-maybe",
        "roofline predict --model llama-3-8b --hardware h100 --engine sglang --points t.csv -o p.csv",
        {"t.csv": "batch,context,tokens,tree\n1,512,6,1\n1,512,6,maybe\n"},
        "t.csv: row 2: 'tree' must be 1/0 or true/false, not 'maybe'",
    ),
    (
        "predict-tree-2",
        "roofline predict --model llama-3-8b --hardware h100 --engine sglang --points t.csv -o p.csv",
        {"t.csv": "batch,context,tokens,tree\n1,512,6,0\n1,512,6,2\n"},
        "t.csv: row 2: 'tree' must be 1/0 or true/false, not '2'",
    ),
    (
        "predict-tree-on-plain-decoding",
        "roofline predict --model llama-3-8b --hardware h100 --engine sglang --points t.csv -o p.csv",
        {"t.csv": "batch,context,tokens,tree\n1,512,1,true\n"},
        "t.csv: row 1: 'tree' is set but 'tokens' is 1",
    ),
    (
        "predict-tree-of-two-tokens",
        "roofline predict --model llama-3-8b --hardware h100 --points t.csv -o p.csv",
        {"t.csv": "batch,context,tokens,tree\n1,512,4,1\n4,512,2,1\n"},
        "t.csv: row 2: 'tree' is set but 'tokens' is 2",
    ),
    (
        "fit-tree-maybe",
        "hw fit --model llama-7b --hardware a100 --measurements t.csv -o f.json",
        {"t.csv": "batch,context,tokens,step_ms,tree\n1,128,1,20,0\n1,128,4,25,maybe\n"},
        "t.csv: row 2: 'tree' must be 1/0 or true/false, not 'maybe'",
    ),
    (
        "hydra-heads-5000",
        "decode --model demo --heads hy --drafter hydra --prompt hi",
        {"hy": lambda d: _demo_hydra(hydra_num_heads=5000)(d)},
        "hydra_num_heads 5000, but the weights hold 4 heads",
    ),
    (
        "hydra-hidden-size-not-the-weights",
        "decode --model demo --heads hy --drafter hydra --prompt hi",
        {"hy": lambda d: _demo_hydra(hidden_size=512)(d)},
        "hidden_size 512, but the weights' head 0 projection is 4096 x 256",
    ),
    (
        "model-bin-not-torch",
        "decode --model m --prompt hi",
        {"m": lambda d: _model_copy(d, _model_as_bad_bin)},
        "--model",
    ),
    ("heads-fewer-than-tree", "decode --model {tiny} --num-heads 5 --prompt hi", {}, "--num-heads"),
    ("sweep-heads-fewer", "sweep --model {tiny} --num-heads 9 --accuracy acc.json -o s.csv", {}, "--num-heads"),
    (
        "sweep-verification-bad",
        "sweep --model {tiny} --accuracy acc.json --verification beams -o s.csv",
        {},
        "--verification",
    ),
    (
        "validate-heads-fewer",
        "validate --model {tiny} --num-heads 9 --accuracy acc.json --data prompts.jsonl",
        {},
        "--num-heads",
    ),
    # ---- validate --temperature T > 0: a draft model and its alpha sidecar, checked before decoding ----
    (
        "validate-temperature-no-sidecar",
        "validate --model {tiny} --drafter draft-model --accuracy acc.json --data prompts.jsonl --temperature 1 -o v",
        {},
        "acc.alpha.json",
    ),
    (
        "validate-temperature-v1-sidecar",
        "validate --model {tiny} --drafter draft-model --accuracy acc.json --data prompts.jsonl --temperature 1 -o v",
        {"acc.alpha.json": json.dumps(_alpha_sidecar(v1=True))},
        "per-child",
    ),
    (
        "validate-temperature-mismatch",
        "validate --model {tiny} --drafter draft-model --accuracy acc.json --data prompts.jsonl --temperature 0.7 -o v",
        {"acc.alpha.json": json.dumps(_alpha_sidecar())},
        "calibrated at temperature 1",
    ),
    (
        "validate-temperature-mismatch-sidecar",
        "validate --model {tiny} --drafter draft-model --accuracy acc.json --data prompts.jsonl --temperature 1 -o v",
        {"acc.alpha.json": json.dumps({**_alpha_sidecar(), "temperature": 0.5})},
        "calibrated at temperature 0.5",
    ),
    (
        "validate-temperature-heads",
        "validate --model {tiny} --accuracy acc.json --data prompts.jsonl --temperature 1 -o v",
        {"acc.alpha.json": json.dumps(_alpha_sidecar())},
        "validated greedily",
    ),
    (
        "validate-temperature-heads-dir",
        "validate --model {tiny} --heads tiny/heads --accuracy acc.json --data prompts.jsonl --temperature 1 -o v",
        {"acc.alpha.json": json.dumps(_alpha_sidecar())},
        "validated greedily",
    ),
    (
        "validate-temperature-sweep",
        "validate --model {tiny} --drafter draft-model --accuracy acc.json --data prompts.jsonl --temperature 1 "
        "--sweep sweep.csv",
        {"acc.alpha.json": json.dumps(_alpha_sidecar())},
        "--sweep",
    ),
    (
        "validate-temperature-negative",
        "validate --model {tiny} --drafter draft-model --accuracy acc.json --data prompts.jsonl --temperature -1",
        {"acc.alpha.json": json.dumps(_alpha_sidecar())},
        "--temperature",
    ),
    # ---- size guards: refused with an estimate before any work ----
    (
        "speedup-1m-cells",
        "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json --max-nodes 64 "
        "--batch " + ",".join(map(str, range(1, 129))) + " --context " + ",".join(map(str, range(0, 1920, 16))),
        {},
        "GiB",
    ),
    (
        "report-1m-cells",
        "report --model llama-7b --hardware a100 --accuracy acc.json --max-nodes 999999 -o r",
        {},
        "GiB",
    ),
    (
        "sweep-absurd-grid",
        "sweep --model {tiny} --accuracy acc.json -o s.csv --batch "
        + ",".join(map(str, range(1, 101)))
        + " --context "
        + ",".join(map(str, range(1, 101))),
        {},
        "hours",
    ),
    (
        "run-absurd-grid",
        "run --model {tiny} -o r --batch "
        + ",".join(map(str, range(1, 201)))
        + " --context "
        + ",".join(map(str, range(1, 101))),
        {},
        "hours",
    ),
    # ---- runs and their state ----
    (
        "run-state-corrupt-and-bad-data",
        "run --model {tiny} --data nope.jsonl -o r",
        {"r/run_state.json": "{half"},
        "nope.jsonl",
    ),
]


# Every input file of every command, damaged in the ways a file arrives damaged: missing, a
# folder, not UTF-8, not valid JSON or CSV, empty, nested too deep.
FILE_INPUTS = {
    "build-accuracy": "build --accuracy {} --nodes 4",
    "build-tree": "build --tree {}",
    "show-tree": "show {}",
    "show-accuracy": "show tree.json --accuracy {}",
    "buffers-tree": "buffers {}",
    "compare-accuracy": "compare --accuracy {} --nodes 4 greedy",
    "compare-tree": "compare --accuracy acc.json {}",
    "check-tree": "check {} --engine vllm",
    "check-accuracy": "check tree.json --engine vllm --accuracy {}",
    "select-sweep": "select --sweep {}",
    "select-grid-accuracy": "select --grid grid.csv --accuracy {}",
    "speedup-accuracy": "roofline speedup --model llama-7b --hardware a100 --accuracy {}",
    "speedup-hardware": "roofline speedup --model llama-7b --hardware {} --accuracy acc.json",
    "ops-hardware": "roofline ops --model llama-7b --hardware {}",
    "ops-model": "roofline ops --model {} --hardware a100",
    "predict-points": "roofline predict --model llama-7b --hardware a100 --points {} -o p.csv",
    "fit-measurements": "hw fit --model llama-7b --hardware a100 --measurements {} -o f.json",
    "report-accuracy": "report --model llama-7b --hardware a100 --accuracy {} -o r",
    "report-hardware": "report --model llama-7b --hardware {} --accuracy acc.json -o r",
    "sweep-accuracy": "sweep --model {tiny} --accuracy {} -o s.csv",
    "validate-accuracy": "validate --model {tiny} --accuracy {} --data prompts.jsonl",
    "decode-tree": "decode --model {tiny} --tree {} --prompt hi",
    "calibrate-data": "calibrate --model {tiny} --data {} -o a.json",
    "run-validation-data": "run --model {tiny} --data prompts.jsonl --validation-data {} -o r",
}
DAMAGE = {
    "missing": ("gone.json", None),
    "folder": ("afolder.json", lambda d: (d / "afolder.json").mkdir()),
    "not-utf8": ("latin.json", b"\xff\xfe\x00garbage\x80"),
    "bad-json": ("bad.json", '{"format": '),
    "empty": ("empty.json", ""),
    "deep": ("deep.json", _deep_json(100_000)),
}
# a folder of prompts or an empty file is a valid (if empty) prompt source for some commands,
# and a data file need not be JSON: those pairs are checked elsewhere
SKIP = {
    ("calibrate-data", "folder"),
    ("calibrate-data", "bad-json"),
    ("calibrate-data", "not-utf8"),
    ("calibrate-data", "deep"),
    ("ops-model", "folder"),
    ("ops-model", "not-utf8"),
    ("ops-model", "empty"),
    ("ops-model", "bad-json"),
    ("ops-model", "deep"),
}
for _input, _command in FILE_INPUTS.items():
    for _damage, (_name, _content) in DAMAGE.items():
        if (_input, _damage) in SKIP:
            continue
        CASES.append(
            (f"{_input}-{_damage}", _command.replace("{}", _name), {} if _content is None else {_name: _content}, None)
        )


# A damaged model reached through the commands that load one: decode (no data needed) and
# calibrate given a valid --data (without it, it stops at the --data requirement before the
# model loads). `m` is a copy of the tiny base model, `d` a copy of it used as a draft model.
DAMAGED_MODELS = {
    "safetensors-truncated": (lambda m: _truncate(m / "model.safetensors", 100), "--model: cannot load m: "),
    "safetensors-cut-short": (lambda m: _truncate(m / "model.safetensors", -100), "--model: cannot load m: "),
    "safetensors-garbage": (
        lambda m: (m / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"garbage!"),
        "--model: cannot load m: ",
    ),
    "config-invalid": (lambda m: (m / "config.json").write_text("{nope"), "config.json"),
    "bin-not-torch": (lambda m: _model_as_bad_bin(m), "--model: cannot load m: "),
    "bin-runs-code": (
        lambda m: _model_as_code_bin(m),
        "holds Python objects other than tensors (posix.mkdir), refused: it could run code",
    ),
}
DAMAGED_MODEL_COMMANDS = {
    "decode": "decode --model m --prompt hi",
    "calibrate": "calibrate --model m --data prompts.jsonl -o a.json",
}
for _damage, (_make, _words) in DAMAGED_MODELS.items():
    for _command, _line in DAMAGED_MODEL_COMMANDS.items():
        if (_command, _damage) == ("decode", "safetensors-truncated"):
            continue  # the case model-safetensors-truncated above
        CASES.append((f"model-{_damage}-{_command}", _line, {"m": lambda d, make=_make: _model_copy(d, make)}, _words))
CASES += [
    (
        "model-64-positions-calibrate",
        "calibrate --model m --data prompts.jsonl --steps 48 -o a.json",
        {"m": lambda d: _model_copy(d, lambda m: _model_config(m, max_position_embeddings=64))},
        "exceed the model's 64 positions",
    ),
    (
        "draft-model-safetensors-truncated-calibrate",
        "calibrate --model {tiny} --heads d --drafter draft-model --data prompts.jsonl -o a.json",
        {"d": lambda d: _draft_copy(d, lambda m: _truncate(m / "model.safetensors", -100))},
        "d/model.safetensors: cannot read (",
    ),
    (
        "draft-model-safetensors-truncated-decode",
        "decode --model {tiny} --heads d --drafter draft-model --prompt hi",
        {"d": lambda d: _draft_copy(d, lambda m: _truncate(m / "model.safetensors", 100))},
        "d/model.safetensors: cannot read (",
    ),
    (
        "draft-model-bin-runs-code-calibrate",
        "calibrate --model {tiny} --heads d --drafter draft-model --data prompts.jsonl -o a.json",
        {"d": lambda d: _draft_copy(d, _model_as_code_bin)},
        "d/pytorch_model.bin: cannot load the draft model (holds Python objects other than tensors (posix.mkdir), "
        "refused: it could run code)",
    ),
    (
        "draft-model-bin-plain-pickle-calibrate",
        "calibrate --model {tiny} --heads d --drafter draft-model --data prompts.jsonl -o a.json",
        {"d": lambda d: _draft_copy(d, _model_as_plain_pickle)},
        "d/pytorch_model.bin: cannot load the draft model (",
    ),
    (
        "draft-model-no-weights-calibrate",
        "calibrate --model {tiny} --heads d --drafter draft-model --data prompts.jsonl -o a.json",
        {"d": lambda d: _draft_copy(d, lambda m: (m / "model.safetensors").unlink())},
        "d: no weights (model.safetensors or pytorch_model.bin",
    ),
    (
        "draft-model-shard-missing-calibrate",
        "calibrate --model {tiny} --heads d --drafter draft-model --data prompts.jsonl -o a.json",
        {"d": lambda d: _draft_copy(d, _sharded_without_shard)},
        "d/model-00002-of-00002.safetensors: missing",
    ),
]


class _RunsCode:
    """Unpickling it calls os.mkdir("pwned") in the working folder, where the snapshot sees it."""

    def __reduce__(self):
        return (os.mkdir, ("pwned",))


def _model_as_code_bin(model: Path) -> None:
    """The weights as a torch pickle that runs code when loaded without weights_only."""
    (model / "model.safetensors").unlink()
    torch.save({"lm_head.weight": _RunsCode()}, model / "pytorch_model.bin")


def _model_as_plain_pickle(model: Path) -> None:
    """The weights as a plain pickle (protocol 4, not torch's zip) that runs code when loaded."""
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(pickle.dumps({"lm_head.weight": _RunsCode()}, protocol=4))


def _model_config(model: Path, **changes) -> None:
    doc = json.loads((model / "config.json").read_text())
    doc.update(changes)
    (model / "config.json").write_text(json.dumps(doc))


def _draft_copy(folder: Path, damage) -> None:
    """The tiny base model as a draft model in d/ (its config names a ...ForCausalLM), damaged."""
    shutil.copytree(folder / "tiny", folder / "d", ignore=shutil.ignore_patterns("heads"))
    damage(folder / "d")


def _sharded_without_shard(model: Path) -> None:
    """An index naming two shards, the second absent."""
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


def _profile(folder: Path, **changes) -> None:
    doc = json.loads((folder / "hw.json").read_text())
    doc.update(changes)
    (folder / "p.json").write_text(json.dumps(doc))


def _model_copy(folder: Path, damage) -> None:
    shutil.copytree(folder / "tiny", folder / "m")
    damage(folder / "m")


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _heads_config(model: Path, **changes) -> None:
    path = model / "heads" / "config.json"
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def _heads_as_bad_bin(model: Path) -> None:
    for p in (model / "heads").glob("medusa_lm_head.*"):
        p.unlink()
    (model / "heads" / "medusa_lm_head.pt").write_bytes(b"this is not a torch file")


def _heads_as_pickled_code(model: Path) -> None:
    """Heads whose pickle names a function (os.getcwd): a weights-only load refuses it, and
    torch's advice to load it unsafely must not reach the user."""
    for p in (model / "heads").glob("medusa_lm_head.*"):
        p.unlink()
    torch.save({"medusa_head.0.0.linear.weight": os.getcwd}, model / "heads" / "medusa_lm_head.pt")


def _demo_hydra(**changes):
    """The demo's Hydra heads copied to hy/, their config.json changed."""

    def make(folder: Path) -> None:
        shutil.copytree(DEMO_MODEL_DIR / "hydra", folder / "hy")
        doc = json.loads((folder / "hy" / "config.json").read_text())
        doc.update(changes)
        (folder / "hy" / "config.json").write_text(json.dumps(doc))

    return make


def _model_as_bad_bin(model: Path) -> None:
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(b"this is not a torch file either")


def _materialise(folder: Path, files: dict) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(folder)
        elif isinstance(content, tuple) and content[0] == "link":
            path.symlink_to(content[1])
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, base, tmp_path, monkeypatch, capsys):
    _, command, files, words = case
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    _materialise(work, files)
    monkeypatch.chdir(work)
    argv = shlex.split(command.replace("{tiny}", str(work / "tiny")))
    before = snapshot(work)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("treeopt: error: "), err
    assert "Traceback" not in err
    if words:
        assert words.lower() in lines[0].lower(), lines[0]
    assert snapshot(work) == before


# --------------------------------------------------------------------------------------------
# a closed pipe, a second writer, a damaged run state


def test_closed_pipe_is_not_an_error():
    """`treeopt hw list | head -1`: the reader goes away after one line; treeopt exits 0,
    silently."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # `true` exits before treeopt has started, so every write meets a closed pipe
    for reader in ("head -1", "true"):
        proc = subprocess.run(
            f"'{sys.executable}' -m treeopt hw list | {reader}; echo \"status ${{PIPESTATUS[0]}}\"",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        lines = proc.stdout.splitlines()
        assert lines[-1] == "status 0" and proc.stderr == "", (reader, proc.stdout, proc.stderr)
        if reader == "head -1":
            assert lines[0].split()[:2] == ["name", "bf16"]


HOLDER = """
import sys
from treeopt.fileio import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_second_sweep_to_the_same_csv_fails_before_loading_the_model(base, tmp_path, monkeypatch, capsys):
    """Another treeopt process writing sweep.csv: a second sweep to it is one line, exit 2,
    and touches nothing, before the model loads."""
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    monkeypatch.chdir(work)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(work / "sweep.csv")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(work)
        loads = []
        monkeypatch.setattr("treeopt.cli.run_cmds.load_model", lambda *a, **k: loads.append(a))
        with pytest.raises(SystemExit) as exc:
            main(["sweep", "--model", str(work / "tiny"), "--accuracy", "acc.json", "--resume", "-o", "sweep.csv"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err == (
            f"treeopt: error: sweep.csv: is being written by another treeopt process (pid {holder.pid})\n"
        )
        assert loads == [] and snapshot(work) == before
    finally:
        holder.communicate("done\n", timeout=60)


def test_damaged_run_state_counts_as_no_stage_done(tmp_path):
    """A run_state.json that is not a JSON object of stages: every stage runs again (with a
    warning), instead of a traceback that blocks the resume."""
    from treeopt.app.run import _read_state, _stage  # noqa: PLC0415 - torch-heavy module, this test only

    logged = []
    for damaged in ("{half", "[1, 2]", _deep_json(100_000), "\xff"):
        (tmp_path / "run_state.json").write_text(damaged, encoding="latin-1")
        assert _read_state(tmp_path, logged.append) == {}
        assert _stage(tmp_path, "calibrate", {"model": "demo"}, logged.append) is False
    assert len(logged) == 8 and all(line.startswith("treeopt: warning: ") for line in logged)
    (tmp_path / "run_state.json").write_text(json.dumps({"calibrate": {"model": "demo"}}))
    assert _stage(tmp_path, "calibrate", {"model": "demo"}, logged.append) is True
