"""Check the latency model on the accelerator at hand, in one command
(docs/performance-model.md#checking-on-a-gpu). Run:

    python benchmarks/gpu_check.py                                   # on a CUDA GPU: Llama-2-7B shapes, bf16
    python benchmarks/gpu_check.py --quick --device cpu -o DIR       # small shape, seconds (part of the tests)

It detects the device, picks the built-in hardware profile of the GPU's name (none for a CPU or
an unknown GPU, and says so), calibrates a profile on the device (`treeopt hw calibrate` with
its engine terms on a random-weight model: `treeopt.app.hwcalibrate`), sweeps a random-weight
model of the shape (`treeopt sweep --random-weights`: `treeopt.app.sweep`) over batch sizes x
contexts x tree sizes, and predicts every measured step with the built-in profile and with the
calibrated one (`treeopt.app.sweep.step_predictor`, the prediction `treeopt sweep --hardware`
writes). It writes DIR/index.md (the report), DIR/cells.csv (one row per cell, measured and
predicted), DIR/gemm_rows.csv (the GEMM row curve measured on the die against the built-in
one), DIR/hardware.json (the calibrated profile), DIR/summary.json (the headline numbers) and
the sweep itself (DIR/sweep.csv with its .meta.json and .samples.npz, readable by `treeopt
select`). Progress goes to stderr.

Errors are relative, predicted / measured - 1, of the step time (every cell) and of the ratio
T(n)/T(0) (the cells with a tree, n > 0; T(0)/T(0) = 1 by construction). Measured T(n)/T(0) is
the sweep's `overhead`: the median over rounds of the same-round ratio. Predicted T(n)/T(0) is
the profile's prediction of the cell over its prediction of the plain step of the same batch
and context.

Every cell is measured twice, in separate sweeps: with the decoder's static-shape steps
(`treeopt sweep --graphs`: captured once per shape and replayed as CUDA graphs on CUDA, run
eagerly in the same static shapes elsewhere; DIR/sweep.csv, what the profiles are compared with)
and with the eager forward (`--no-graphs`; DIR/sweep-eager.csv), unless --no-eager. The report
is written after each sweep, so a check stopped during the eager one still has its answer;
--resume continues a stopped check in the same folder (the calibrated profile kept, each sweep
resumed where it stopped).

The weights, drafter, prompts and tree are fixed by --seed; the timings are measurements.
Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from calibration.device_memory import available_bytes, bench_bytes  # noqa: E402
from calibration.hwbench import device_name  # noqa: E402
from calibration.model_calls import synchronizer  # noqa: E402
from calibration.models import resolve_device, resolve_dtype  # noqa: E402
from calibration.static_steps import CAPTURE_FAILURES, step_mode  # noqa: E402
from calibration.sweep import SweepSettings, effective_sizes, step_bench  # noqa: E402
from calibration.threads import default_threads, torch_threads  # noqa: E402
from roofline.hardware import HardwareProfile, load_hardware  # noqa: E402
from roofline.shapes import normalize_dtype  # noqa: E402
from treeopt.app.hwcalibrate import (  # noqa: E402
    ENGINE_BATCHES,
    calibrate_engine_terms,
    calibrate_hardware,
    engine_bench_positions,
)
from treeopt.app.models import shape_of  # noqa: E402
from treeopt.app.random_weights import check_random_bench, load_random, random_model  # noqa: E402
from treeopt.app.sweep import step_predictor, sweep  # noqa: E402
from treeopt.errors import UserError, first_line  # noqa: E402
from treeopt.fileio import atomic_path, write_json, write_text  # noqa: E402
from treeopt.tau import load_tau_curves  # noqa: E402

#: the tree: Medusa-1's published head accuracies for Vicuna-7B (5 heads); tau does not enter
#: the step time, only which nodes each tree size holds
ACCURACY = ROOT / "treeopt" / "data" / "medusa_train_accuracy.csv"
ACCURACY_MODEL = "vicuna-7b"
#: the full check (a GPU): a 7B shape, batch 1..64, two contexts, trees of 0..128 nodes
FULL = {"model": "llama-2-7b", "batches": (1, 2, 4, 8, 16, 32, 64), "contexts": (512, 2048)}
FULL_SIZES = (0, 1, 2, 4, 8, 16, 32, 64, 128)
#: --quick: a small Llama (grouped like Llama-2-7B: MLP 2.6875 x hidden, head size 64) that a
#: 2-core CPU steps in a few milliseconds; written as DIR/quick-model/config.json
QUICK_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
QUICK = {"batches": (1, 2, 4), "contexts": (64, 256)}
QUICK_SIZES = (0, 1, 4, 16, 64)
#: share of the device's free memory a sweep group's cache and prefill may take
MEMORY_SHARE = 0.9
PROFILES = ("builtin", "calibrated")
#: the two ways a cell is measured: SweepSettings.graphs and the sweep's file
MODES = {"graphs": (True, "sweep.csv"), "eager": (False, "sweep-eager.csv")}
#: the bar for the built-in profile on a 7B step at batch 1, captured
BATCH1_TARGET = 0.20
#: calls timed (and profiled) per step in the anatomy of a batch-1 step
ANATOMY_CALLS = 20

# ---- GPU name -> built-in profile ----------------------------------------------------------

#: words of a device name that say nothing about the board
_NOISE = frozenset({"nvidia", "geforce", "tesla", "amd", "instinct", "hbm3", "hbm3e", "hbm2e"})
#: the remaining words of a device name (as torch.cuda.get_device_name prints it), exactly,
#: for each built-in profile; any other name (an H100 NVL, a GH200, an A100 40GB PCIe, an L40,
#: an A10G) has no built-in profile: its clocks, memory or bandwidth differ
_BOARDS = {
    frozenset({"h100", "80gb"}): "h100-sxm",  # NVIDIA H100 80GB HBM3
    frozenset({"h100", "sxm5", "80gb"}): "h100-sxm",
    frozenset({"h100", "pcie"}): "h100-pcie",
    frozenset({"h100", "pcie", "80gb"}): "h100-pcie",
    frozenset({"h200"}): "h200",
    frozenset({"h200", "sxm", "141gb"}): "h200",
    frozenset({"a100", "sxm4", "80gb"}): "a100-80gb-sxm",
    frozenset({"a100", "sxm4", "40gb"}): "a100-40gb-sxm",
    frozenset({"a100", "80gb", "pcie"}): "a100-80gb-pcie",
    frozenset({"a40"}): "a40",
    frozenset({"rtx", "a6000"}): "rtx-a6000",
    frozenset({"l4"}): "l4",
    frozenset({"l40s"}): "l40s",
    frozenset({"rtx", "4090"}): "rtx-4090",
    frozenset({"b200"}): "b200",
    frozenset({"mi300x"}): "mi300x",
    frozenset({"mi300x", "vf"}): "mi300x",  # a virtual function of the same board
}


def builtin_profile_for(device_name: str) -> str | None:
    """The built-in hardware profile (`roofline.hardware.builtin_hardware`) of a GPU named as
    `torch.cuda.get_device_name` names it ('NVIDIA H100 80GB HBM3' -> 'h100-sxm'), or None
    when no built-in profile describes that board."""
    words = frozenset(w for w in re.split(r"[\s_\-]+", device_name.strip().lower()) if w) - _NOISE
    return _BOARDS.get(words)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


# ---- options -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other bad input
        raise UserError(message)


def _ints(text: str, option: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise UserError(f"{option}: expected integers separated by commas, got '{text}'") from None
    if not values or min(values) < minimum:
        raise UserError(f"{option}: expected integers >= {minimum}, got '{text}'")
    return tuple(sorted(set(values)))


def parse_args(argv) -> argparse.Namespace:
    p = _Parser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto, cuda, cuda:N, cpu or mps [default: auto]")
    p.add_argument("--quick", action="store_true", help="a small model shape and fewer cells (seconds on a CPU)")
    p.add_argument("-o", "--out", default=None, help="report folder [default: reports/gpu-check-DEVICE-NAME]")
    p.add_argument("--model", default=None, help="built-in shape name or config.json [default: llama-2-7b]")
    p.add_argument("--dtype", default=None, help="bf16, fp16, fp32 or auto [default: bf16 on CUDA, else auto]")
    p.add_argument("--batch", default=None, help="batch sizes, e.g. 1,8,64")
    p.add_argument("--context", default=None, help="cached tokens per sequence, e.g. 512,2048")
    p.add_argument("--sizes", default=None, help="tree sizes (0 = plain decoding), e.g. 0,1,4,16")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and rounds [default: 0]")
    p.add_argument("--no-eager", action="store_true", help="skip the eager sweep (graph-captured steps only)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a stopped check in -o: keep its hardware.json, resume its sweeps",
    )
    args = p.parse_args(argv)
    if args.device.split(":")[0] not in ("auto", "cuda", "cpu", "mps"):
        raise UserError(f"--device: must be auto, cuda, cuda:N, cpu or mps, got '{args.device}'")
    return args


def resolve_settings(args: argparse.Namespace) -> dict:
    """Device, names, dtype, model and grid of the check, every input checked (UserError)."""
    dev = resolve_device(args.device)
    name = device_name(dev)
    builtin = builtin_profile_for(name) if dev.type == "cuda" else None
    dtype = args.dtype or ("bf16" if dev.type == "cuda" else "auto")
    if dtype != "auto":
        dtype = normalize_dtype(dtype, what="--dtype")
        if dtype not in ("fp32", "bf16", "fp16"):
            raise UserError(f"--dtype: the check runs fp32, bf16 or fp16, not {dtype}")
    dt = normalize_dtype(str(resolve_dtype(dtype, dev)), what="--dtype")
    grid = QUICK if args.quick else FULL
    default_out = ROOT / "reports" / f"gpu-check-{slug(name) if dev.type == 'cuda' else dev.type}"
    out = Path(args.out) if args.out else default_out
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} is a file, not a folder")
    if args.model or not args.quick:
        random_model(args.model or FULL["model"])  # an unknown model: one line, before anything is written
    return {
        "device": dev,
        "device_name": name,
        "builtin": builtin,
        "dtype": dt,
        "model": args.model,
        "batches": _ints(args.batch, "--batch", 1) if args.batch else grid["batches"],
        "contexts": _ints(args.context, "--context", 1) if args.context else grid["contexts"],
        "sizes": tuple(sorted(set(_ints(args.sizes, "--sizes", 0)) | {0}))
        if args.sizes
        else (QUICK_SIZES if args.quick else FULL_SIZES),
        "quick": args.quick,
        "seed": args.seed,
        "out": out,
        "modes": ("graphs",) if args.no_eager else ("graphs", "eager"),
        "resume": args.resume,
    }


def _model_spec(cfg: dict) -> str:
    """The model the check times: --model, else a quick config written into the report folder
    (--quick), else the 7B shape."""
    if cfg["model"]:
        return cfg["model"]
    if not cfg["quick"]:
        return FULL["model"]
    folder = cfg["out"] / "quick-model"
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", QUICK_CONFIG)
    return str(folder)


def _say(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


# ---- the measurements ----------------------------------------------------------------------


def calibrate(cfg: dict, spec) -> tuple[HardwareProfile, object]:
    """`treeopt hw calibrate --random-weights`: the microbenchmarks on a device holding nothing
    else, then the engine terms from the random model's tree steps. Returns the profile and the
    loaded random model. With --resume, the profile of an earlier run in the folder instead."""
    dev = str(cfg["device"])
    kept = cfg["out"] / "hardware.json"
    if cfg["resume"] and kept.is_file():
        _say(f"resuming: the calibrated profile of {kept}")
        return load_hardware(str(kept)), load_random(spec, dev, cfg["dtype"])
    prof = calibrate_hardware(dev, cfg["model_spec"], dtype=cfg["dtype"], quick=cfg["quick"], seed=cfg["seed"])
    if cfg["device"].type == "cuda":
        torch.cuda.empty_cache()  # the microbenchmarks' buffers, before the model takes its place
    lm = load_random(spec, dev, cfg["dtype"])
    with torch_threads(lm.model, lm.device, None):
        fit = calibrate_engine_terms(lm, prof, repeats=5 if cfg["quick"] else 9, seed=cfg["seed"])
    return fit.profile, lm


def sweep_plan(cfg: dict, config, element_bytes: int, free: int | None) -> tuple[dict, list[dict]]:
    """{batches: contexts} of the (batch, context) groups whose cache and prefill fit
    MEMORY_SHARE of `free` bytes, and the groups left out (with what they need)."""
    positions = max(cfg["sizes"]) + 1
    plan, skipped = {}, []
    for s in cfg["contexts"]:
        fits = []
        for b in cfg["batches"]:
            need = bench_bytes(config, b, s + positions, element_bytes)
            if free is not None and need > MEMORY_SHARE * free:
                skipped.append({"batch": b, "context": s, "need_gib": need / 2**30, "free_gib": free / 2**30})
            else:
                fits.append(b)
        if fits:
            plan.setdefault(tuple(fits), []).append(s)
    if not plan:
        raise UserError("--batch x --context: no (batch, context) group fits the device's free memory")
    return plan, skipped


def measure(cfg: dict, lm, calibrated: HardwareProfile, table, tau, mode: str) -> tuple[pd.DataFrame, list[dict]]:
    """The sweep of every group that fits, with the steps `mode` says (`MODES`), into its file
    (one file: later groups are added as a resumed sweep adds them; with --resume the file of
    a stopped run is continued)."""
    element = next(lm.model.parameters()).element_size()
    plan, skipped = sweep_plan(cfg, lm.model.config, element, available_bytes(lm.device))
    for group in skipped:
        _say(
            f"skipping batch {group['batch']} at context {group['context']}: its cache and prefill need "
            f"{group['need_gib']:.1f} GiB, {group['free_gib']:.1f} GiB free"
        )
    graphs, name = MODES[mode]
    df = None
    with torch_threads(lm.model, lm.device, None):
        for i, (batches, contexts) in enumerate(plan.items()):
            settings = SweepSettings(cfg["sizes"], batches, tuple(contexts), seed=cfg["seed"], graphs=graphs)
            resume = True if i > 0 else ("auto" if cfg["resume"] else False)
            df = sweep(lm, table, tau, settings, cfg["out"] / name, hardware=calibrated, resume=resume)
    return df, skipped


def _median_ms(fn, calls: int) -> float:
    """Median milliseconds of `calls` calls of `fn` (which waits for the device itself)."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def _device_work(fn, device, calls: int) -> dict:
    """Device operations (kernels, copies) per call of `fn` and their summed device time, from
    torch.profiler's CUDA activity over `calls` calls; {} off CUDA; {"error": why} where the
    profiler gives nothing."""
    if device.type != "cuda":
        return {}
    try:
        from torch.profiler import ProfilerActivity, profile  # only here: a CUDA diagnostic

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
        ops = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        if not ops:
            return {"error": "the profiler recorded no device operation"}
        return {
            "device_ops": len(ops) / calls,
            "device_ms": sum(e.time_range.elapsed_us() for e in ops) / calls / 1e3,
        }
    except Exception as err:  # noqa: BLE001 - a diagnostic: say why, do not stop the check
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}


def step_anatomy(cfg: dict, lm, proposal, calibrated: HardwareProfile) -> list[dict]:
    """Where a batch-1 step's time goes, for the plain step and the largest tree at the first
    context, with the main sweep's steps: `step_ms`, the step as the sweep times it (the input
    copies, the forward and lm_head, the drafter's eager work, a device sync); `forward_ms`,
    the forward and lm_head alone (the captured graph replayed, or the static function where
    nothing is captured) and a sync; on CUDA the device operations per step and their summed
    device time (torch.profiler); `weights_ms`, the weights' bytes over the calibrated
    streaming bandwidth, below which no step can go."""
    context = cfg["contexts"][0]
    sizes = effective_sizes((0, max(cfg["sizes"])), proposal)
    bench = step_bench(lm, proposal, sizes, 1, context, seed=cfg["seed"], graphs=MODES["graphs"][0])
    sync = synchronizer(lm.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    rows = []
    with torch.inference_mode():
        for n, fn in zip(bench.sizes, bench.fns):
            for _ in range(3):
                fn()
            captured = next(iter(bench.runners[n]._steps.values()))  # one shape: the window is exact

            def forward(captured=captured):
                captured.run()
                sync()

            rows.append(
                {
                    "nodes": int(n),
                    "batch": 1,
                    "context": int(context),
                    "step_ms": _median_ms(fn, ANATOMY_CALLS),
                    "forward_ms": _median_ms(forward, ANATOMY_CALLS),
                    "weights_ms": weight_bytes / calibrated.bandwidth_bytes_per_s * 1e3,
                    **_device_work(fn, lm.device, ANATOMY_CALLS),
                }
            )
    if bench.cached_tokens() != context:  # every call crops what it appended
        raise RuntimeError(f"anatomy: the cache holds {bench.cached_tokens()} tokens, expected {context}")
    return rows


# ---- the comparison ------------------------------------------------------------------------


def _measured(df: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """A sweep's measured columns as the cell table names them: `measured_*` for the
    graph-captured sweep, `eager_*` for the eager one."""
    return pd.DataFrame(
        {
            "batch": df["batch"].astype(int),
            "context": df["context"].astype(int),
            "nodes": df["nodes"].astype(int),
            f"{prefix}_ms": df["step_time_s"] * 1e3,
            f"{prefix}_p10_ms": df["step_time_p10_s"] * 1e3,
            f"{prefix}_p90_ms": df["step_time_p90_s"] * 1e3,
            f"{prefix}_ratio": df["overhead"],
            f"{prefix}_ratio_lo": df["overhead_lo"],
            f"{prefix}_ratio_hi": df["overhead_hi"],
            f"{prefix}_rounds": df["samples"].astype(int),
        }
    ).reset_index(drop=True)


def cell_table(df: pd.DataFrame, predictors: dict, eager: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cell of the graph-captured sweep `df`: the measurement, and per profile
    (None: no such profile) the predicted step time and T(n)/T(0) with their relative errors;
    then the eager sweep's measurement of the same cell (NaN where it has none), how many
    times the captured step it takes, and the built-in profile's errors against it."""
    cells = _measured(df, "measured").rename(columns={"measured_rounds": "rounds"})
    for name in PROFILES:
        predict = predictors.get(name)
        if predict is None:
            step = plain = np.full(len(cells), np.nan)
        else:
            keys = cells[["batch", "context", "nodes"]].itertuples(index=False)
            step = np.array([predict(b, n + 1, s) for b, s, n in keys], dtype=float)
            plain = np.array([predict(b, 1, s) for b, s in cells[["batch", "context"]].itertuples(index=False)])
        cells[f"predicted_{name}_ms"] = step * 1e3
        cells[f"predicted_{name}_ratio"] = step / plain
        cells[f"step_error_{name}"] = cells[f"predicted_{name}_ms"] / cells["measured_ms"] - 1
        cells[f"ratio_error_{name}"] = cells[f"predicted_{name}_ratio"] / cells["measured_ratio"] - 1
    other = _measured(df.iloc[:0] if eager is None else eager, "eager")
    cells = cells.merge(other, on=["batch", "context", "nodes"], how="left")
    cells["eager_over_graphs"] = cells["eager_ms"] / cells["measured_ms"]
    cells["step_error_builtin_eager"] = cells["predicted_builtin_ms"] / cells["eager_ms"] - 1
    cells["ratio_error_builtin_eager"] = cells["predicted_builtin_ratio"] / cells["eager_ratio"] - 1
    return cells


def error_stats(cells: pd.DataFrame, name: str, suffix: str = "") -> dict:
    """Median and worst |error| of one profile: the step time over every cell, T(n)/T(0) over
    the cells with a tree (n > 0); against the captured steps, or with suffix "_eager" the
    eager ones."""
    out = {}
    for kind, column, rows in (
        ("step_time_error", f"step_error_{name}{suffix}", cells),
        ("ratio_error", f"ratio_error_{name}{suffix}", cells[cells["nodes"] > 0]),
    ):
        err = rows[column].abs().dropna()
        out[kind] = {
            "median": float(err.median()) if len(err) else None,
            "worst": float(err.max()) if len(err) else None,
            "cells": len(err),
        }
    return out


def batch1_check(cells: pd.DataFrame) -> dict | None:
    """The built-in profile on the captured steps at batch 1, every tree size and context, against
    BATCH1_TARGET (None without a built-in profile or a batch-1 cell): median and worst
    |error|, the mean signed error (its direction), and the plain step per context."""
    rows = cells[(cells["batch"] == 1) & cells["step_error_builtin"].notna()]
    if rows.empty:
        return None
    err = rows["step_error_builtin"]
    plain = rows[rows["nodes"] == 0]
    return {
        "target": BATCH1_TARGET,
        "cells": len(rows),
        "median": float(err.abs().median()),
        "worst": float(err.abs().max()),
        "mean_signed": float(err.mean()),
        "within": bool(err.abs().max() <= BATCH1_TARGET),
        "plain": [
            {
                "context": int(r.context),
                "measured_ms": float(r.measured_ms),
                "predicted_ms": float(r.predicted_builtin_ms),
            }
            for r in plain.itertuples(index=False)
        ],
    }


def eager_stats(cells: pd.DataFrame) -> dict | None:
    """How many times the captured step the eager step takes: median, least and most over the
    cells both sweeps measured, and the median at batch 1 (None: no eager cell)."""
    both = cells.dropna(subset=["eager_ms"])
    if both.empty:
        return None
    ratio = both["eager_over_graphs"]
    first = both[both["batch"] == 1]["eager_over_graphs"]
    return {
        "cells": len(both),
        "median": float(ratio.median()),
        "least": float(ratio.min()),
        "most": float(ratio.max()),
        "batch1_median": float(first.median()) if len(first) else None,
    }


def gemm_rows(calibrated: HardwareProfile, builtin: HardwareProfile | None, dtype: str) -> pd.DataFrame:
    """The GEMM row curve measured on the device against the built-in one, at the measured row
    counts: relative efficiency and the compute rate each profile gives the model's GEMMs
    (peak x eta_compute x efficiency; the calibrated peak is the best rate measured, the
    built-in one the datasheet's)."""
    curve = calibrated.gemm_efficiency
    rows = np.asarray(curve.rows, dtype=float)
    bound = calibrated.calibration.get("gemm_compute_bound") or [None] * len(rows)
    measured_rate = calibrated.peak(dtype) * calibrated.eta_compute * curve(rows)
    table = pd.DataFrame(
        {
            "rows": rows.astype(int),
            "compute_bound": bound if len(bound) == len(rows) else [None] * len(rows),
            "calibrated_efficiency": curve(rows),
            "calibrated_tflops": measured_rate / 1e12,
        }
    )
    if builtin is None:
        table["builtin_efficiency"] = table["builtin_tflops"] = table["calibrated_over_builtin"] = np.nan
    else:
        rate = builtin.peak(dtype) * builtin.eta_compute * builtin.gemm_efficiency(rows)
        table["builtin_efficiency"] = builtin.gemm_efficiency(rows)
        table["builtin_tflops"] = rate / 1e12
        table["calibrated_over_builtin"] = measured_rate / rate
    return table


# ---- the report ----------------------------------------------------------------------------


def _pct(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}%"


def _num(x, fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _with_error(value, error) -> str:
    text = _num(value, ".3f")
    return f"{text} ({_pct(error)})" if text else ""


def _cells_markdown(cells: pd.DataFrame) -> list[str]:
    lines = [
        "| batch | context | nodes | measured ms (p10–p90) | measured T(n)/T(0) (interval) | built-in ms (error) | "
        "built-in T(n)/T(0) (error) | calibrated ms (error) | calibrated T(n)/T(0) (error) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cells.itertuples(index=False):
        lines.append(
            f"| {r.batch} | {r.context} | {r.nodes} | {r.measured_ms:.3f} ({r.measured_p10_ms:.3f}–"
            f"{r.measured_p90_ms:.3f}) | {r.measured_ratio:.3f} ({_num(r.measured_ratio_lo, '.3f')}–"
            f"{_num(r.measured_ratio_hi, '.3f')}) | {_with_error(r.predicted_builtin_ms, r.step_error_builtin)} | "
            f"{_with_error(r.predicted_builtin_ratio, r.ratio_error_builtin)} | "
            f"{_with_error(r.predicted_calibrated_ms, r.step_error_calibrated)} | "
            f"{_with_error(r.predicted_calibrated_ratio, r.ratio_error_calibrated)} |"
        )
    return lines


def _error_row(label: str, errors: dict) -> str:
    st, ra = errors["step_time_error"], errors["ratio_error"]
    if not st["cells"]:
        return f"| {label} | no cells measured | | | |"
    return (
        f"| {label} | {_num(st['median'] * 100, '.1f')}% ({st['cells']} cells) | {_num(st['worst'] * 100, '.1f')}% | "
        f"{_num(ra['median'] * 100, '.1f')}% ({ra['cells']} cells) | {_num(ra['worst'] * 100, '.1f')}% |"
    )


def _errors_markdown(summary: dict, steps: str) -> list[str]:
    lines = [
        "| profile, against | step time: median | worst | T(n)/T(0): median | worst |",
        "|---|---|---|---|---|",
    ]
    for name in PROFILES:
        p = summary["profiles"][name]
        label = "built-in" if name == "builtin" else "calibrated"
        if p["profile"] is None:
            lines.append(f"| {label} | absent: {p['why_absent']} | | | |")
            continue
        lines.append(_error_row(f"{label} `{p['profile']}`, {steps} steps", p["errors"]))
    builtin = summary["profiles"]["builtin"]
    if builtin["profile"] is not None and builtin["errors_eager"] is not None:
        lines.append(_error_row(f"built-in `{builtin['profile']}`, eager steps", builtin["errors_eager"]))
    return lines


def _headline(summary: dict, steps: str) -> list[str]:
    """The check's answers in a few lines, each from summary.json."""
    out = []
    b1 = summary["batch1_builtin"]
    if b1 is not None:
        plain = "; ".join(
            f"context {p['context']}: {p['measured_ms']:.2f} ms measured, {p['predicted_ms']:.2f} ms predicted"
            for p in b1["plain"]
        )
        verdict = "within" if b1["within"] else "NOT within"
        out.append(
            f"- **Batch 1, {steps} steps, against the built-in profile**: median |error| {b1['median'] * 100:.1f}%, "
            f"worst {b1['worst'] * 100:.1f}% over {b1['cells']} cells (mean signed error {_pct(b1['mean_signed'])}): "
            f"{verdict} the {b1['target'] * 100:.0f}% target. The plain step: {plain}."
        )
    for name in PROFILES:
        p = summary["profiles"][name]
        if p["profile"] is not None and p["errors"]["ratio_error"]["cells"]:
            ra = p["errors"]["ratio_error"]
            out.append(
                f"- **T(n)/T(0), {'built-in' if name == 'builtin' else 'calibrated'} `{p['profile']}`**: median "
                f"|error| {ra['median'] * 100:.1f}%, worst {ra['worst'] * 100:.1f}% over {ra['cells']} cells."
            )
    failed = summary["graph_capture"]["failed_captures"]
    if failed:
        out.append(
            f"- **{len(failed)} captures FAILED** and their steps ran eagerly, so the captured columns mix in "
            f"eager steps; the first failure: {failed[0]}."
        )
    eager = summary["graph_capture"]["eager_over_graphs"]
    if eager is not None:
        at1 = "" if eager["batch1_median"] is None else f"; at batch 1, {eager['batch1_median']:.2f}x"
        out.append(
            f"- **Eager vs {steps}**: an eager step takes {eager['median']:.2f}x the {steps} step (median over "
            f"{eager['cells']} cells, {eager['least']:.2f}x to {eager['most']:.2f}x{at1})."
        )
    return out or ["- No built-in profile and no eager sweep: see the tables."]


def _graph_markdown(cells: pd.DataFrame, steps: str) -> list[str]:
    if cells["eager_ms"].isna().all():
        return ["The eager sweep was not run (--no-eager) or has not finished: nothing to compare yet."]
    lines = [
        f"| batch | context | nodes | {steps} ms | eager ms | eager / {steps} | T(n)/T(0) {steps} | "
        "T(n)/T(0) eager | built-in T(n)/T(0) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cells.itertuples(index=False):
        lines.append(
            f"| {r.batch} | {r.context} | {r.nodes} | {r.measured_ms:.3f} | {_num(r.eager_ms, '.3f')} | "
            f"{_num(r.eager_over_graphs, '.2f')} | {r.measured_ratio:.3f} | {_num(r.eager_ratio, '.3f')} | "
            f"{_num(r.predicted_builtin_ratio, '.3f')} |"
        )
    return lines


def _anatomy_markdown(rows: list[dict], steps: str) -> list[str]:
    if not rows:
        return ["Not measured."]
    profiled = any("device_ms" in r for r in rows)
    lines = [
        f"| nodes | step ms | forward + lm_head ms ({steps}) | the rest of the step ms | "
        + ("device ops per step | device time ms | device idle ms | " if profiled else "")
        + "weights / stream bandwidth ms |",
        "|---|---|---|---|" + ("---|---|---|" if profiled else "") + "---|",
    ]
    for r in rows:
        device = ""
        if profiled:
            device = (
                f"{_num(r.get('device_ops'), '.0f')} | {_num(r.get('device_ms'), '.3f')} | "
                f"{_num(r['step_ms'] - r['device_ms'] if 'device_ms' in r else None, '.3f')} | "
            )
        lines.append(
            f"| {r['nodes']} | {r['step_ms']:.3f} | {r['forward_ms']:.3f} | {r['step_ms'] - r['forward_ms']:.3f} | "
            f"{device}{r['weights_ms']:.3f} |"
        )
    errors = sorted({r["error"] for r in rows if "error" in r})
    if errors:
        lines += ["", f"The profiler gave no device times: {errors[0]}."]
    return lines


def _gemm_markdown(gemm: pd.DataFrame, builtin: str | None) -> list[str]:
    lines = [
        "| rows | compute bound (measured) | calibrated efficiency | calibrated TFLOP/s | built-in efficiency | "
        "built-in TFLOP/s | calibrated / built-in |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in gemm.itertuples(index=False):
        bound = {True: "yes", False: "no"}.get(r.compute_bound, "")
        lines.append(
            f"| {r.rows} | {bound} | {r.calibrated_efficiency:.3f} | {r.calibrated_tflops:.3g} | "
            f"{_num(r.builtin_efficiency, '.3f')} | {_num(r.builtin_tflops, '.3g')} | "
            f"{_num(r.calibrated_over_builtin, '.2f')} |"
        )
    if builtin is None:
        lines.append("")
        lines.append("No built-in profile for this device: the built-in columns are empty.")
    return lines


def write_report(cfg: dict, summary: dict, cells: pd.DataFrame, gemm: pd.DataFrame) -> None:
    out = cfg["out"]
    with atomic_path(out / "cells.csv") as tmp:
        cells.to_csv(tmp, index=False, float_format="%.9g")
    with atomic_path(out / "gemm_rows.csv") as tmp:
        gemm.to_csv(tmp, index=False, float_format="%.9g")
    write_json(out / "summary.json", summary)
    m, s = summary["machine"], summary["model"]
    shape = s["shape"]
    builtin = summary["profiles"]["builtin"]
    steps = _STEPS[summary["graph_capture"]["mode"]]
    lines = [
        f"# Checking the latency model on {m['device_name']}",
        "",
        f"Written by `{' '.join(['python benchmarks/gpu_check.py', *summary['argv']])}` in {summary['seconds']:.0f} s "
        "(docs/performance-model.md#checking-on-a-gpu).",
        "",
        f"- **Machine**: {m['device_name']}, device `{m['device']}`; torch {m['torch']}, {m['framework']}; "
        f"torch CPU threads: {m['threads']}.",
        f"- **Built-in profile**: {builtin['profile'] or 'none: ' + builtin['why_absent']}.",
        f"- **Calibrated profile**: [hardware.json](hardware.json), `hw calibrate{' --quick' if cfg['quick'] else ''}` "
        "with its engine terms fitted on the random model's tree steps.",
        f"- **Model**: {s['spec']} with random weights (seed {cfg['seed']}), {s['dtype']}: {shape['layers']} layers, "
        f"hidden {shape['hidden']}, MLP {shape['intermediate']}, {shape['heads']} heads / {shape['kv_heads']} KV "
        f"heads of {shape['head_dim']}, vocabulary {shape['vocab']}; {s['params'] / 1e6:,.1f}M parameters; a "
        f"random drafter of {s['drafter_heads']} Medusa heads.",
        f"- **Tree**: the proposal tree of {s['accuracy']} (tau does not enter a step's time).",
        f"- **Cells**: batch {_list(cfg['batches'])} x context {_list(cfg['contexts'])} x tree size "
        f"{_list(cfg['sizes'])}, each measured with {_STEP_WORDS[summary['graph_capture']['mode']]} "
        "([sweep.csv](sweep.csv)) and with the eager forward ([sweep-eager.csv](sweep-eager.csv)); every cell in "
        "[cells.csv](cells.csv).",
    ]
    for g in summary["skipped_groups"]:
        lines.append(
            f"- **Left out**: batch {g['batch']} at context {g['context']}, whose cache and prefill need "
            f"{g['need_gib']:.1f} GiB with {g['free_gib']:.1f} GiB free."
        )
    lines += ["", "## Headline", ""] + _headline(summary, steps)
    lines += ["", "## Errors", "", "Relative error = predicted / measured - 1; median and worst of |error|.", ""]
    lines += _errors_markdown(summary, steps)
    lines += ["", f"## Cells ({steps} steps)", "", _CELLS_TEXT, ""] + _cells_markdown(cells)
    lines += ["", "## Where a batch-1 step's time goes", "", _ANATOMY_TEXT, ""]
    lines += _anatomy_markdown(summary["anatomy"], steps)
    lines += ["", "## GEMM row curve", "", _GEMM_TEXT, ""] + _gemm_markdown(gemm, builtin["profile"])
    lines += ["", "## Eager vs graph capture", "", _GRAPH_TEXT[summary["graph_capture"]["mode"]], ""]
    lines += _graph_markdown(cells, steps)
    write_text(out / "index.md", "\n".join(lines))


#: what the report calls the steps of the main sweep, by `calibration.static_steps.step_mode`
_STEPS = {"cuda-graphs": "captured", "static": "static"}
_STEP_WORDS = {
    "cuda-graphs": "its steps captured once per shape and replayed as CUDA graphs",
    "static": "the static-shape steps run eagerly (nothing is captured on this device)",
}
_CELLS_TEXT = (
    "Step times in ms: the median over rounds, with the 10th and 90th percentiles. Measured T(n)/T(0) is the "
    "median of the same-round ratio (at least 1), with its bootstrap interval; predicted T(n)/T(0) is the "
    "profile's prediction over its prediction of the plain step at the same batch and context. Errors are "
    "predicted / measured - 1."
)
_ANATOMY_TEXT = (
    "The plain step and the largest tree at batch 1 and the first context, timed again on their own "
    f"({ANATOMY_CALLS} calls each, medians): the step as the sweep times it; the forward and lm_head alone "
    "(the same captured graph replayed, without the input copies and the drafter); the rest of the step is the "
    "decoder's own work outside the graph (copying the inputs in, the draft heads and their top-k, run eagerly, "
    "a device sync). On CUDA, torch.profiler's device operations per step and their summed device time: the "
    "step minus that is time the GPU sat idle. The last column is the weights' bytes over the calibrated "
    "streaming bandwidth: no step reads less."
)
_GEMM_TEXT = (
    "The calibrated profile's efficiency by rows, measured with the model's weight shapes on this device "
    "([gemm_rows.csv](gemm_rows.csv)), against the built-in profile's row curve for the die. TFLOP/s is the "
    "rate each profile gives the model's GEMMs at that row count: peak x eta_compute x efficiency (the "
    "calibrated peak is the best GEMM rate measured here, the built-in one the datasheet's). Rows that are "
    "not compute bound are flat below the first compute-bound row count."
)
_GRAPH_TEXT = {
    "cuda-graphs": (
        "The same cells timed twice in separate sweeps: each step captured as a CUDA graph once per (batch, "
        "context, size) and replayed (the static-shape step, docs/decoder.md#static-shape-steps), and the eager "
        "forward, one kernel launch per operator with Python between them. Where the eager step takes several "
        "times the captured one, it is launch-bound: its T(n)/T(0) then says verification is nearly free and "
        "would pick trees for an engine nobody serves."
    ),
    "static": (
        "On this device nothing is captured: the static-shape steps (what a GPU captures) run eagerly, and the "
        "comparison shows what the fixed window and the input copies cost against the eager forward."
    ),
}


def _list(values) -> str:
    return ",".join(str(v) for v in values)


# ---- main ----------------------------------------------------------------------------------


def run_check(cfg: dict, argv: list[str]) -> dict:
    started = time.perf_counter()
    dev = cfg["device"]
    why = "no built-in profile describes a CPU"
    if dev.type == "cuda":
        why = f"no built-in profile for '{cfg['device_name']}'"
    _say(f"device {dev} ({cfg['device_name']}); built-in profile: {cfg['builtin'] or 'none (' + why + ')'}")
    table, tau = load_tau_curves(ACCURACY, max(cfg["sizes"]), csv_model=ACCURACY_MODEL)
    cfg["out"].mkdir(parents=True, exist_ok=True)
    cfg["model_spec"] = _model_spec(cfg)
    spec = random_model(cfg["model_spec"], seed=cfg["seed"])
    # the weights and the engine terms' steps must fit; the sweep leaves out the groups that do not
    check_random_bench(spec, str(dev), cfg["dtype"], batch=max(ENGINE_BATCHES), positions=engine_bench_positions())
    stages = 1 + len(cfg["modes"])
    _say(f"[1/{stages}] calibrating {dev} for {cfg['model_spec']} in {cfg['dtype']} (hw calibrate)")
    t0 = time.perf_counter()
    calibrated, lm = calibrate(cfg, spec)
    calibrated.save(cfg["out"] / "hardware.json")
    stage = {"calibrate_s": time.perf_counter() - t0}
    builtin = load_hardware(cfg["builtin"]) if cfg["builtin"] else None
    predictors = {"calibrated": step_predictor(lm, tau.proposal, calibrated)}
    if builtin is not None:
        predictors["builtin"] = step_predictor(lm, tau.proposal, builtin)
    gemm = gemm_rows(calibrated, builtin, cfg["dtype"])
    sweeps, skipped, summary = {}, [], None
    for i, mode in enumerate(cfg["modes"]):
        _say(
            f"[{2 + i}/{stages}] sweeping ({mode}) batch {_list(cfg['batches'])} x context {_list(cfg['contexts'])} "
            f"x size {_list(cfg['sizes'])}"
        )
        t0 = time.perf_counter()
        sweeps[mode], skipped = measure(cfg, lm, calibrated, table, tau, mode)
        stage[f"sweep_{mode}_s"] = time.perf_counter() - t0
        if mode == "graphs":
            with torch_threads(lm.model, lm.device, None):
                anatomy = step_anatomy(cfg, lm, tau.proposal, calibrated)
        # the report after every sweep: a check stopped during the next one keeps this answer
        cells = cell_table(sweeps["graphs"], predictors, sweeps.get("eager"))
        summary = _summary(cfg, argv, lm, calibrated, cells, gemm, skipped, why, stage)
        summary["anatomy"] = anatomy
        summary["seconds"] = time.perf_counter() - started
        write_report(cfg, summary, cells, gemm)
    return summary


def _summary(cfg, argv, lm, calibrated, cells, gemm, skipped, why, stage) -> dict:
    shape = shape_of(cfg["model_spec"], dtype=cfg["dtype"])
    profiles = {}
    for name in PROFILES:
        profile = cfg["builtin"] if name == "builtin" else calibrated.name
        profiles[name] = {
            "profile": profile,
            "why_absent": None if profile else why,
            "errors": error_stats(cells, name) if profile else None,
        }
    eager = eager_stats(cells)
    profiles["builtin"]["errors_eager"] = (
        error_stats(cells, "builtin", "_eager") if cfg["builtin"] and eager is not None else None
    )
    threads = default_threads(lm.model, lm.device) or torch.get_num_threads()
    return {
        "format": "treeopt.gpu-check/v2",
        "argv": list(argv),
        "machine": {
            "device": str(cfg["device"]),
            "device_name": cfg["device_name"],
            "torch": torch.__version__,
            "threads": threads,
            "framework": calibrated.calibration.get("framework", ""),
        },
        "model": {
            "spec": cfg["model_spec"] if cfg["model"] or not cfg["quick"] else "quick-model/config.json",
            "dtype": cfg["dtype"],
            "shape": {k: getattr(shape, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads")}
            | {"head_dim": shape.head_dim, "vocab": shape.vocab},
            "params": int(sum(p.numel() for p in lm.model.parameters())),
            "drafter_heads": int(lm.heads.num_heads),
            "accuracy": f"{ACCURACY.relative_to(ROOT)} ({ACCURACY_MODEL})",
            "seed": cfg["seed"],
        },
        "grid": {"batches": list(cfg["batches"]), "contexts": list(cfg["contexts"]), "sizes": list(cfg["sizes"])},
        "skipped_groups": skipped,
        "cells": len(cells),
        "profiles": profiles,
        "batch1_builtin": batch1_check(cells),
        "gemm_rows": json.loads(gemm.to_json(orient="records")),
        "graph_capture": {
            "mode": step_mode(True, lm.device),
            "failed_captures": list(CAPTURE_FAILURES),
            "eager_over_graphs": eager,
        },
        "stages": stage,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = resolve_settings(parse_args(argv))
        summary = run_check(cfg, argv)
    except UserError as err:
        print(f"gpu_check: error: {first_line(err)}", file=sys.stderr)
        return 2
    cal = summary["profiles"]["calibrated"]["errors"]["ratio_error"]
    _say(
        f"T(n)/T(0) error of the calibrated profile: median {cal['median'] * 100:.1f}%, worst "
        f"{cal['worst'] * 100:.1f}% over {cal['cells']} cells; wrote {cfg['out'] / 'index.md'} "
        f"({summary['seconds']:.0f} s)"
    )
    b1 = summary["batch1_builtin"]
    if b1 is not None:
        _say(
            f"batch 1 against the built-in profile: median |error| {b1['median'] * 100:.1f}%, worst "
            f"{b1['worst'] * 100:.1f}% over {b1['cells']} cells ({'within' if b1['within'] else 'NOT within'} "
            f"{b1['target'] * 100:.0f}%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
