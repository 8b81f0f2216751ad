"""The whole loop, as library calls: calibrate -> proposal trees -> hardware profile ->
prediction -> measured sweep -> selection -> validation -> report. `treeopt run` and the
sweep/select/validate commands are thin wrappers over these functions.

Torch-using modules (calibration.*) are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.build import greedy_tree, joint_tree, max_nodes, tau_curve
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_json, write_text
from treeopt.tree import Tree

DEMO_VALIDATION = "demo-validation"


# ---- proposal trees -------------------------------------------------------------------------

def proposal_sequence(table: AccuracyTable, nodes: int, *, method: str = "auto") -> Tree:
    """A nested proposal sequence T_1 c T_2 c ... of up to `nodes` nodes: the n most frequent
    prefixes under joint statistics (nested: counts never grow from parent to child), or
    Medusa's greedy under independent per-rank accuracies."""
    if method == "auto":
        method = "joint" if table.joint else "greedy"
    if method == "joint":
        if not table.joint:
            raise UserError("--method joint: the accuracy table has no joint statistics")
        observed = sum(1 for p, c in table.joint.items() if c > 0)
        return joint_tree(table, min(nodes, observed))
    if method == "greedy":
        return greedy_tree(table.accuracy, min(nodes, max_nodes(table.num_heads, table.width)))
    raise UserError(f"--method: unknown method '{method}'")


def proposal_from_accuracy(path, nodes: int, *, method: str = "auto", csv_model: str | None = None):
    """(table, proposal tree, tau_independent, tau_joint or None, tau_walk or None), each tau
    (n+1,) over the proposal's prefixes.

    tau_walk: the calibration's per-position rank vectors (the sidecar `NAME.ranks.npz` that
    `treeopt calibrate` writes) walked the way the decoder steps: after accepting A tokens
    it starts its next step A positions on. Joint tau averages over every position instead,
    which overrates trees where acceptance comes in runs (length-biased sampling).
    """
    from treeopt.acceptance import load_rank_vectors, simulated_tau_curve

    table = load_accuracy(path, model=csv_model)
    proposal = proposal_sequence(table, nodes, method=method)
    tau_ind = tau_curve(proposal, table)
    tau_joint = tau_curve(proposal, table, joint=True) if table.joint else None
    vectors = load_rank_vectors(path, table=table) if str(path).endswith(".json") else None
    tau_walk = simulated_tau_curve(proposal, *vectors) if vectors is not None else None
    return table, proposal, tau_ind, tau_joint, tau_walk


# ---- the measured sweep ---------------------------------------------------------------------

def sweep_settings(sizes, batches, contexts, *, repeats: int = 15, topk: int = 10):
    from calibration.sweep import SweepSettings

    return SweepSettings(tuple(sizes), tuple(batches), tuple(contexts), repeats=repeats, topk=topk)


def step_predictor(lm, proposal: Tree, hardware):
    """predict(batch, tokens, context) -> seconds of one decoding step as the reference
    decoder runs it: base model over q tokens, plus (q > 1) the heads the tree uses, on one
    token per sequence."""
    from roofline.hardware import load_hardware
    from roofline.latency import step_time_s
    from roofline.shapes import DraftHeadsShape, model_shape

    hw = load_hardware(hardware) if isinstance(hardware, (str, Path)) else hardware
    dtype = str(lm.dtype).replace("torch.", "")
    shape = model_shape("demo" if lm.name == "demo" else lm.name, dtype=dtype)
    heads = lm.heads

    def predict(batch: int, tokens: int, context: int) -> float:
        n = tokens - 1
        used = proposal.prefix(n).depth if n else 0
        draft = DraftHeadsShape(used, heads.num_layers, heads.hidden_size, heads.vocab_size,
                                tokens_per_sequence=1) if used else None
        return float(step_time_s(shape, draft, hw, batch=batch, tokens=tokens, context=context,
                                 on_oom="ignore"))

    return predict, hw


def sweep(lm, table: AccuracyTable, proposal: Tree, tau_ind, tau_joint, settings, output, *,
          hardware=None, resume: bool = False, progress: bool = True, tau_walk=None) -> pd.DataFrame:
    from calibration.sweep import run_sweep

    predictor, meta = None, {"accuracy": table.provenance}
    if hardware is not None:
        predictor, hw = step_predictor(lm, proposal, hardware)
        meta["hardware"] = hw.name
    return run_sweep(lm, proposal, tau_ind, tau_joint, settings, output, predictor=predictor,
                     meta=meta, resume=resume, progress=progress, tau_walk=tau_walk)


def load_prompt_texts(data: str) -> list[str]:
    from calibration.data import read_jsonl_prompts
    from calibration.models import DEMO_PROMPTS

    if data == DEMO_VALIDATION:
        return read_jsonl_prompts(DEMO_PROMPTS.with_name("demo_prompts_validation.jsonl"))
    if data == "demo":
        return read_jsonl_prompts(DEMO_PROMPTS)
    return read_jsonl_prompts(data)


def add_end_to_end(lm, proposal: Tree, df: pd.DataFrame, settings, data: str, max_new_tokens: int,
                   output, *, max_prompts: int = 32, progress: bool = True) -> pd.DataFrame:
    from calibration.sweep import SWEEP_COLUMNS, measure_end_to_end

    prompts = load_prompt_texts(data)[:max_prompts]
    e2e = measure_end_to_end(lm, proposal, settings.sizes, settings.batches, prompts,
                             max_new_tokens=max_new_tokens, topk=settings.topk, progress=progress)
    df = df.drop(columns=["e2e_tokens_per_s", "e2e_tokens_per_step", "e2e_speedup"], errors="ignore")
    df = df.merge(e2e, on=["batch", "nodes"], how="left").reindex(columns=SWEEP_COLUMNS)
    with atomic_path(output) as tmp:
        df.to_csv(tmp, index=False)
    return df


def format_sweep(df: pd.DataFrame) -> str:
    cols = ["batch", "context", "nodes", "tau", "step_time_s", "overhead", "speedup"]
    if df["predicted_overhead"].notna().any():
        cols += ["predicted_overhead", "predicted_speedup"]
    if df["e2e_speedup"].notna().any():
        cols += ["e2e_tokens_per_s", "e2e_speedup"]
    view = df[cols].copy()
    view["step_time_ms"] = view.pop("step_time_s") * 1e3
    return view.to_string(index=False, float_format=lambda v: f"{v:.3f}")


# ---- selection ------------------------------------------------------------------------------

def select_from_files(sweep_file, grid_file, accuracy, *, by: str = "measured", threshold: float = 1.0,
                      csv_model: str | None = None) -> dict:
    from treeopt.selection import proposal_from_meta, read_sweep, select

    if sweep_file is not None:
        df, meta = read_sweep(sweep_file)
        proposal = proposal_from_meta(meta, str(sweep_file))
        return select(df, proposal, by=by, hardware=meta.get("hardware", meta.get("device", "")),
                      model=meta.get("model", ""), threshold=threshold)
    from roofline.grid import selection_from_grid

    if accuracy is None:
        raise UserError("--grid: needs --accuracy (the table whose proposal sequence the grid used)")
    try:
        grid = pd.read_csv(grid_file)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(f"{grid_file}: cannot read ({str(err).splitlines()[0]})") from None
    if "nodes" not in grid.columns:
        raise UserError(f"{grid_file}: missing column 'nodes' (not a treeopt grid CSV)")
    _, proposal, _, _, _ = proposal_from_accuracy(accuracy, int(grid["nodes"].max()), method="greedy",
                                                  csv_model=csv_model)
    return selection_from_grid(grid, proposal, "", "", threshold=threshold)


def _x(v) -> str:
    """A speedup for people: "1.23x", or "--" where the selection JSON has null (NaN)."""
    return "--" if v is None or not np.isfinite(v) else f"{v:.2f}x"


def format_selection(doc: dict) -> str:
    lines = [f"best tree per (batch, context) -- {doc.get('source', '')}"]
    for c in doc["cells"]:
        what = "no speculation" if c["nodes"] == 0 else f"{c['nodes']:3d} nodes"
        extra = ""
        if "measured_speedup" in c and "predicted_speedup" in c:
            extra = f"  (measured {_x(c['measured_speedup'])}, predicted {_x(c['predicted_speedup'])})"
        lines.append(f"  batch {c['batch']:4d}  context {c['context']:6d}: {what}  speedup {_x(c['speedup'])}{extra}")
    return "\n".join(lines)


# ---- validation -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ValidationResult:
    acceptance: pd.DataFrame        # per tree size: measured tokens/step vs tau
    latency: pd.DataFrame | None    # per (batch, context, size): measured vs predicted overhead
    regret: pd.DataFrame | None     # per (batch, context): prediction's pick vs measured best


def validate(lm, table: AccuracyTable, proposal: Tree, tau_ind, tau_joint, sizes, data, *, tau_walk=None,
             sweep_file=None, sweep_df=None, max_new_tokens: int = 32, batch_size: int = 8,
             max_prompts=None, topk: int = 10, out_dir=None, progress: bool = True) -> ValidationResult:
    from calibration.validate import latency_errors, measure_acceptance
    from treeopt.selection import prediction_regret, read_sweep

    prompts = load_prompt_texts(data)
    if max_prompts:
        prompts = prompts[:max_prompts]
    sizes = [n for n in sizes if n <= proposal.size]
    acceptance = measure_acceptance(lm, proposal, sizes, prompts, tau_independent=tau_ind,
                                    tau_joint=tau_joint, tau_walk=tau_walk, max_new_tokens=max_new_tokens,
                                    batch_size=batch_size, topk=topk, progress=progress)
    if sweep_df is None and sweep_file is not None:
        sweep_df, _ = read_sweep(sweep_file)
    latency = regret = None
    if (sweep_df is not None and "predicted_overhead" in sweep_df.columns
            and sweep_df["predicted_overhead"].notna().any()):
        latency = latency_errors(sweep_df)
        regret = prediction_regret(sweep_df)
    result = ValidationResult(acceptance, latency, regret)
    if out_dir is not None:
        write_validation(result, out_dir)
    return result


def write_validation(result: ValidationResult, out_dir) -> list[str]:
    """CSV files and the validation plots; returns the PNG names written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, df in (("validation_acceptance.csv", result.acceptance),
                     ("validation_latency.csv", result.latency),
                     ("validation_selection.csv", result.regret)):
        if df is not None:
            with atomic_path(out_dir / name) as tmp:
                df.to_csv(tmp, index=False)
    return plot_validation(result, out_dir)


def plot_validation(result: ValidationResult, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    acc = result.acceptance
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    ax.plot(acc["nodes"], acc["measured_tokens_per_step"], "o-", color="black", label="measured (decoder)")
    ax.plot(acc["nodes"], acc["tau_independent"], "s--", label="predicted, independent heads")
    if acc["tau_joint"].notna().any():
        ax.plot(acc["nodes"], acc["tau_joint"], "^--", label="predicted, joint statistics (per position)")
    if "tau_walk" in acc.columns and acc["tau_walk"].notna().any():
        ax.plot(acc["nodes"], acc["tau_walk"], "D--", label="predicted, joint statistics walked step by step")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree size (nodes)")
    ax.set_ylabel("tokens per step")
    ax.set_title("Acceptance on held-out prompts: measured vs predicted")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out_dir / "validation_acceptance.png") as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    written.append("validation_acceptance.png")

    if result.latency is not None:
        lat = result.latency
        contexts = sorted(lat["context"].unique())
        fig, axes = plt.subplots(1, len(contexts), figsize=(5.2 * len(contexts), 4.4), dpi=120,
                                 squeeze=False, sharey=True)
        for ax, s in zip(axes[0], contexts):
            sub = lat[lat["context"] == s]
            for i, (b, g) in enumerate(sub.groupby("batch")):
                color = f"C{i}"
                ax.plot(g["nodes"], g["overhead"], "o-", color=color, label=f"batch {b} measured")
                ax.plot(g["nodes"], g["predicted_overhead"], "x--", color=color, label=f"batch {b} predicted")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tree size (nodes)")
            ax.set_title(f"context {s} tokens")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("step latency / plain decoding step")
        axes[0][-1].legend(fontsize=7, ncol=2)
        fig.suptitle("Step-latency overhead: measured vs roofline prediction")
        fig.tight_layout()
        with atomic_path(out_dir / "validation_latency.png") as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
        written.append("validation_latency.png")
    return written


def format_validation(result: ValidationResult) -> str:
    acc = result.acceptance
    lines = ["acceptance (tokens per step) on held-out prompts:",
             "  nodes  measured  tau_indep (err)    tau_joint (err)    tau_walk (err)    steps"]
    for r in acc.itertuples(index=False):
        joint = f"{r.tau_joint:8.3f} ({r.error_joint:+6.1%})" if np.isfinite(r.tau_joint) else "      --          "
        walk = f"{r.tau_walk:8.3f} ({r.error_walk:+6.1%})" if np.isfinite(r.tau_walk) else "      --          "
        lines.append(f"  {r.nodes:5d}  {r.measured_tokens_per_step:8.3f}  {r.tau_independent:8.3f} "
                     f"({r.error_independent:+6.1%})  {joint}  {walk}  {r.steps:6d}")
    if result.latency is not None:
        err = result.latency["overhead_error"].abs()
        lines.append(f"step-latency overhead, predicted vs measured over {len(err)} configurations: "
                     f"median |error| {err.median():.1%}, max {err.max():.1%}")
    if result.regret is not None:
        worst = result.regret["fraction_of_best"].min()
        lines.append(f"tree picked by prediction alone reaches >= {worst:.1%} of the measured best "
                     f"speedup in every (batch, context) cell")
    return "\n".join(lines)


# ---- the main job ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSettings:
    model: str = "demo"
    heads: str | None = None
    data: str = "demo"
    validation_data: str = DEMO_VALIDATION
    device: str = "auto"
    dtype: str = "auto"
    steps: int = 32                       # generated tokens per calibration prompt
    topk: int = 10
    max_nodes: int = 64
    method: str = "auto"                  # proposal sequence: joint when available, else greedy
    sizes: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] = (128, 512)
    repeats: int = 10
    validation_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    validation_prompts: int | None = None
    hw_quick: bool = False
    threads: int | None = None            # torch CPU threads; None: 1 for small models on CPU
    seed: int = 0


def _stage(out: Path, name: str, settings: dict, log) -> bool:
    """Whether stage `name` is already done in `out` with these settings (a rerun resumes)."""
    state_file = out / "run_state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    done = state.get(name) == settings
    if done:
        log(f"[{name}] done earlier with the same settings: kept")
    return done


def _mark(out: Path, name: str, settings: dict) -> None:
    state_file = out / "run_state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    state[name] = settings
    write_json(state_file, state)


def run_main_job(out_dir, settings: RunSettings = RunSettings(), *, log=print, progress: bool = True) -> dict:
    """calibrate -> proposal trees -> hardware profile -> prediction -> sweep -> selection ->
    validation -> report, all into `out_dir`. Each stage's result is kept; a rerun (after an
    interruption) skips the stages already done with the same settings."""
    out = Path(out_dir)
    fresh = not out.exists()
    try:
        return _run_main_job(out, settings, log=log, progress=progress)
    except UserError:
        # bad input found before anything was written: leave no empty report folder behind
        if fresh and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _run_main_job(out: Path, settings: RunSettings, *, log, progress: bool) -> dict:
    from calibration.models import load_model
    from calibration.runner import run_calibration
    from roofline.report import build_report
    from roofline.shapes import DraftHeadsShape, model_shape
    from treeopt.app.hwcalibrate import calibrate_hardware

    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings = {}
    s = settings

    # 1. calibration statistics
    t0 = time.perf_counter()
    cal_settings = {"model": s.model, "heads": s.heads, "data": s.data, "steps": s.steps, "topk": s.topk,
                    "dtype": s.dtype, "seed": s.seed}
    done = _stage(out, "calibrate", cal_settings, log)
    acc_file = out / "accuracy.json"
    if not (done and acc_file.is_file()):
        log(f"[calibrate] {s.model} on {s.data}: {s.steps} greedy tokens per prompt, top-{s.topk}")
        run_calibration(s.model, s.heads, s.data, output=acc_file, device=s.device, dtype=s.dtype,
                        steps=s.steps, topk=s.topk, seed=s.seed, resume=True, progress=progress)
        _mark(out, "calibrate", cal_settings)
    timings["calibrate_s"] = time.perf_counter() - t0

    # 2. proposal trees
    table, proposal, tau_ind, tau_joint, tau_walk = proposal_from_accuracy(acc_file, s.max_nodes, method=s.method)
    method = "joint" if (s.method == "auto" and table.joint) else ("greedy" if s.method == "auto" else s.method)
    from treeopt.export import format_tree

    write_text(out / "proposal_tree.json",
               format_tree(proposal, "json", tau=float(tau_joint[-1] if tau_joint is not None else tau_ind[-1]),
                           method=method, provenance=table.provenance))
    log(f"[trees] {method} proposal sequence of {proposal.size} nodes; tau(64) = "
        f"{tau_ind[-1]:.3f} independent" + (f", {tau_joint[-1]:.3f} joint" if tau_joint is not None else "")
        + (f", {tau_walk[-1]:.3f} walked" if tau_walk is not None else ""))

    lm = load_model(s.model, s.heads, device=s.device, dtype=s.dtype)
    if lm.device.type == "cpu":
        import torch

        # One thread count for every measurement of the run (profile, sweep, validation): a
        # small model is fastest on one thread, and on a busy machine a second OpenMP thread
        # waits for the other core on every op.
        small = sum(p.numel() for p in lm.model.parameters()) < 100_000_000
        threads = s.threads or (1 if small else torch.get_num_threads())
        torch.set_num_threads(threads)
        log(f"[setup] {threads} torch thread(s) on the CPU")
    dtype_name = str(lm.dtype).replace("torch.", "")
    shape = model_shape("demo" if s.model == "demo" else s.model, dtype=dtype_name)

    # 3. hardware profile of this machine
    t0 = time.perf_counter()
    hw_settings = {"device": str(lm.device), "dtype": dtype_name, "model": s.model, "quick": s.hw_quick}
    done = _stage(out, "hardware", hw_settings, log)
    hw_file = out / "hardware.json"
    if not (done and hw_file.is_file()):
        log(f"[hardware] microbenchmarks on {lm.device} ({dtype_name})")
        hw = calibrate_hardware(lm.device.type, shape, dtype=dtype_name, quick=s.hw_quick,
                                progress=progress)
        hw.save(hw_file)
        _mark(out, "hardware", hw_settings)
    from roofline.hardware import load_hardware

    hw = load_hardware(hw_file)
    timings["hardware_s"] = time.perf_counter() - t0

    # 4. prediction: the roofline report for this machine, for the trees and tau the sweep uses
    best_tau = next(t for t in (tau_walk, tau_joint, tau_ind) if t is not None)
    t0 = time.perf_counter()
    heads_shape = DraftHeadsShape(lm.heads.num_heads, lm.heads.num_layers, lm.heads.hidden_size,
                                  lm.heads.vocab_size, tokens_per_sequence=1)
    build_report(shape, heads_shape, hw, out / "prediction", accuracy=table,
                 accuracy_label=f"calibrated on {s.data} ({acc_file.name})", batches=s.batches,
                 contexts=s.contexts, max_nodes=s.max_nodes, joint=table.joint is not None,
                 proposal=proposal, tau=best_tau, used_heads=True,
                 tau_source=f"The {method} proposal sequence of {proposal.size} nodes the sweep measures; τ "
                            + ("walked from its rank vectors" if tau_walk is not None else
                               "from joint statistics" if tau_joint is not None else "from independent heads"),
                 title=f"Predicted: {s.model} with {lm.heads.num_heads} Medusa heads on {hw.name}")
    timings["predict_s"] = time.perf_counter() - t0

    # 5. measured sweep
    t0 = time.perf_counter()
    sizes = tuple(n for n in s.sizes if n <= proposal.size)
    sw = sweep_settings(sizes, s.batches, s.contexts, repeats=s.repeats, topk=s.topk)
    log(f"[sweep] sizes {list(sizes)} x batch {list(s.batches)} x context {list(s.contexts)}, "
        f"{s.repeats} rounds each")
    sweep_df = sweep(lm, table, proposal, tau_ind, tau_joint, sw, out / "sweep.csv", hardware=hw, tau_walk=tau_walk,
                     resume="auto", progress=progress)
    timings["sweep_s"] = time.perf_counter() - t0

    # 6. selection
    from treeopt.selection import select

    selection = select(sweep_df, proposal, by="measured", hardware=hw.name, model=s.model)
    write_json(out / "selection.json", selection)
    log(format_selection(selection))

    # 7. validation on held-out prompts
    t0 = time.perf_counter()
    val_sizes = tuple(n for n in s.validation_sizes if n <= proposal.size)
    log(f"[validate] decoder on {s.validation_data}, tree sizes {list(val_sizes)}")
    result = validate(lm, table, proposal, tau_ind, tau_joint, val_sizes, s.validation_data, tau_walk=tau_walk,
                      sweep_df=sweep_df, max_new_tokens=s.steps, max_prompts=s.validation_prompts,
                      topk=s.topk, out_dir=out, progress=progress)
    log(format_validation(result))
    timings["validate_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start

    write_text(out / "index.md", _run_index(s, table, proposal, hw, selection, result, sweep_df, timings, method))
    log(f"report: {out / 'index.md'} ({timings['total_s']:.0f} s)")
    return {"selection": selection, "validation": result, "timings": timings}


def _md_table(df: pd.DataFrame, floatfmt: str = "{:.3f}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, (float, np.floating)):
                cells.append(floatfmt.format(v) if np.isfinite(v) else "--")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run_index(s: RunSettings, table: AccuracyTable, proposal: Tree, hw, selection: dict,
               result: ValidationResult, sweep_df: pd.DataFrame, timings: dict, method: str) -> str:
    acc = table.accuracy
    K = table.num_heads
    L = [f"# treeopt run: {s.model} on {hw.name}", "",
         "Calibrate the draft heads, build the proposal trees, calibrate this machine's roofline profile, "
         "predict, measure, select, and check the predictions against measurements on held-out prompts.", "",
         "Regenerate with `treeopt run" + ("" if s.model == "demo" else f" --model {s.model}") + f" -o <dir>`.", "",
         "## 1. Head accuracies", "",
         f"Greedy-label calibration on `{s.data}` ({int(table.positions[0])} positions for head 1), "
         f"per-rank accuracy, top-1 and top-{table.width} (in `accuracy.json`):", "",
         "| head | top-1 | top-" + str(table.width) + " | positions |", "|---|---|---|---|"]
    for k in range(K):
        L.append(f"| {k + 1} | {acc[k, 0]:.3f} | {acc[k].sum():.3f} | {int(table.positions[k])} |")
    L += ["", "## 2. Proposal trees", "",
          f"{method} proposal sequence of {proposal.size} nodes (`proposal_tree.json`); every prefix is the "
          "tree of that size.", "",
          "## 3. Selection: the best tree per batch size on this machine", "",
          f"By measured speedup τ·T(0)/T(n) (`selection.json`; `sweep.csv` has every measurement):", "",
          "| batch | context | best nodes | measured speedup | predicted speedup |", "|---|---|---|---|---|"]
    for c in selection["cells"]:
        L.append(f"| {c['batch']} | {c['context']} | {c['nodes'] or 'no speculation'} | "
                 f"{_x(c['measured_speedup'])} | {_x(c.get('predicted_speedup'))} |")
    L += ["", "## 4. Validation on held-out prompts", "",
          "Measured tokens per step of the reference decoder against τ predicted from the table:", "",
          "![acceptance](validation_acceptance.png)", "",
          _md_table(result.acceptance[["nodes", "measured_tokens_per_step", "tau_independent", "error_independent",
                                       "tau_joint", "error_joint", "tau_walk", "error_walk", "steps"]]), "",
          "tau_independent multiplies per-head per-rank accuracies; tau_joint averages the calibration's joint "
          "rank-vector statistics over every position; tau_walk walks the same rank vectors the way the decoder "
          "steps (after accepting A tokens the next step starts A positions on), which removes the length bias "
          "of a per-position average where acceptance comes in runs.", ""]
    if result.latency is not None:
        err = result.latency["overhead_error"].abs()
        L += ["Step-latency ratio T(n)/T(0), measured against the roofline prediction for this machine's "
              f"calibrated profile: median |error| {err.median():.1%}, max {err.max():.1%} over {len(err)} "
              "configurations.", "", "![latency](validation_latency.png)", ""]
    if result.regret is not None:
        L += ["Tree chosen by prediction alone against the measured best (fraction of the best measured "
              "speedup):", "", _md_table(result.regret), ""]
    L += ["## 5. The prediction for this machine", "",
          "The roofline report of this machine's profile: [prediction/index.md](prediction/index.md).", "",
          "![roofline](prediction/roofline.png)", "", "![speedup](prediction/speedup.png)", "",
          "## Run time", "", ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in timings.items()), ""]
    return "\n".join(L)
