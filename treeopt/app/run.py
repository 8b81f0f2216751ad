"""`treeopt run`: the whole loop on one model, each stage kept in the output folder so that a
rerun resumes where the last one stopped: calibrate -> proposal trees -> hardware profile ->
prediction -> measured sweep -> selection -> validation -> report (docs/architecture.md
"The main job")."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from calibration.models import load_model
from calibration.runner import run_calibration
from calibration.sweep import SweepSettings
from calibration.threads import default_threads
from roofline.hardware import load_hardware
from roofline.plots import plot_measured_speedup
from roofline.report import build_report
from roofline.shapes import DraftHeadsShape
from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.app.draft_model import chain_tau_curves, write_gamma_prediction
from treeopt.app.hwcalibrate import calibrate_hardware
from treeopt.app.models import draft_cost_of_drafter, draft_shape_of, is_demo, shape_of
from treeopt.app.pooled import add_pooled_evidence, format_pooled, pooled_from_sweep
from treeopt.app.sweep import (
    DEMO_VALIDATION,
    check_prompt_source,
    fit_from_sweep,
    format_transfer,
    load_prompt_texts,
    sweep,
)
from treeopt.app.validation import ValidationResult, format_validation, validate
from treeopt.candidates import candidate_proposal
from treeopt.engines import export_for, get_engine
from treeopt.errors import UserError
from treeopt.export import format_tree
from treeopt.family_build import drafted_sizes, engine_proposal
from treeopt.fileio import atomic_outputs, output_lock, write_json, write_text
from treeopt.forms import choose_form
from treeopt.mix import choose_mix_tree, format_mix, mix_grid_from_sweep, mix_section, parse_mix
from treeopt.selection import (
    format_selection,
    format_speedup,
    noise_summary,
    read_round_samples,
    rounds_needed_text,
    select,
    sweep_samples_path,
)
from treeopt.stats import DEFAULT_TOLERANCE
from treeopt.tau import TauCurve, load_tau_curves, tau_curves
from treeopt.tree import Tree

_DRAFT_UNITS = {"medusa": "Medusa heads", "hydra": "Hydra heads", "mlp-speculator": "MLP speculator stages"}


@dataclass(frozen=True)
class RunSettings:
    model: str = "demo"
    heads: str | None = None
    drafter: str | None = None  # drafter kind; None: read from the drafter's config
    num_heads: int | None = None  # heads used of those the weights hold; None: the config's
    data: str | None = None  # calibration prompts; None: the demo's, for the demo only
    validation_data: str | None = None  # held-out prompts; None: the demo's, for the demo only
    device: str = "auto"
    dtype: str = "auto"
    steps: int = 32  # generated tokens per calibration prompt
    topk: int = 10
    max_nodes: int = 64
    method: str = "auto"  # proposal sequence: joint when available, else greedy
    sizes: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] = (128, 512)
    repeats: int = 10
    time_budget_s: float = 60.0  # extra sweep rounds for the cells whose answer is still open
    tolerance: float = DEFAULT_TOLERANCE  # speedups within this fraction are the same answer
    validation_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    validation_prompts: int | None = None
    hw_quick: bool = False
    threads: int | None = None  # torch CPU threads; None: 1 for small models on CPU
    seed: int = 0
    engine: str | None = None  # proposal trees from this engine's family (docs/engines.md)
    mix: str | None = None  # traffic mix (CSV or inline spec): also choose one tree for it


def _read_state(out: Path, log=None) -> dict:
    """The stages recorded in `out/run_state.json`; a file that is not a JSON object of stages
    (damaged by hand or by a full disk) counts as no stage done, with a warning: every stage
    then runs again, which is slower but never wrong."""
    state_file = out / "run_state.json"
    if not state_file.is_file():
        return {}
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        state = err
    if not isinstance(state, dict):
        if log is not None:
            log(
                f"treeopt: warning: {state_file}: not a run state ({str(state).splitlines()[0][:80]}); "
                "every stage runs again"
            )
        return {}
    return state


def _stage(out: Path, name: str, settings: dict, log) -> bool:
    """Whether stage `name` is already done in `out` with these settings (a rerun resumes)."""
    state = _read_state(out, log)
    done = state.get(name) == settings
    if done:
        log(f"[{name}] done earlier with the same settings: kept")
    return done


def _mark(out: Path, name: str, settings: dict, writing: dict | None = None) -> None:
    """Record stage `name` as done, together with the outputs it writes (`writing`: final path
    -> function that writes a file): all land or none does, so an interrupted run never keeps
    a stage record without its outputs, nor outputs that a rerun would redo
    (docs/formats.md "Output safety")."""
    state = _read_state(out)
    state[name] = settings
    with atomic_outputs() as outputs:
        for final, write in (writing or {}).items():
            write(outputs.path(final))
        write_json(outputs.path(out / "run_state.json"), state)


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16 in the CPU flags of
    /proc/cpuinfo; False where the flags cannot be read). Without them bf16 GEMMs are converted
    to float32 and slower than float32 itself (docs/performance-model.md "CPU facts measured on
    the dev machine")."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def run_dtype(dtype: str, device: str) -> str:
    """The dtype of the main job: `dtype` unless "auto"; on a CPU, bfloat16 where it is native
    (`cpu_has_fast_bf16`), else float32. Why bf16: verifying a few extra tokens is nearly free
    only where a step is bound by streaming the weights, as on a GPU; in bf16 this holds on such
    a CPU too, while float32 makes the step cost grow with every token (docs/statistics.md
    "The demo's regime")."""
    if dtype != "auto":
        return dtype
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available() and not mps):
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    return "auto"


def run_main_job(out_dir, settings: RunSettings = RunSettings(), *, log=print, progress: bool = True) -> dict:
    """calibrate -> proposal trees -> hardware profile -> prediction -> sweep -> selection ->
    validation -> report, all into `out_dir`. Each stage's result is kept; a rerun (after an
    interruption) skips the stages already done with the same settings."""
    out = Path(out_dir)
    fresh = not out.exists()
    settings = _with_data(settings)
    try:
        with output_lock(out / "run_state.json"):  # a second run into the same folder fails at once
            return _run_main_job(out, settings, log=log, progress=progress)
    except UserError:
        # bad input found before anything was written: leave no empty report folder behind
        if fresh and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


@dataclass(frozen=True)
class OtherForm:
    """Another way of drafting and verifying that the main job measures beside its proposal
    trees, because the drafter's own published form might beat them (docs/architecture.md,
    "Forms the main job compares"):

    name:          "chain" (a draft model's gamma drafts, Leviathan et al. 2023), "merged" or
                   "candidates" (IBM's n best full-length candidates, Wertheimer et al. 2024,
                   merged into their prefix tree or verified as n sequences);
    tau:           its proposal sequence and expected tokens per step;
    sizes:         the proposal sizes measured (nodes; 0 is plain decoding);
    verification:  how the target checks it: "tree" attention or "candidates" sequences;
    labels:        nodes -> how a user names that size ("gamma 3", "4 candidates").
    """

    name: str
    tau: TauCurve
    sizes: tuple[int, ...]
    verification: str
    labels: dict


#: per drafter, the forms `choose_form` compares, preferred first where intervals overlap
#: (docs/architecture.md, "Forms the main job compares")
FORM_ORDER = {"draft-model": ("chain", "tree"), "mlp-speculator": ("tree", "merged", "candidates")}


def other_forms(lm, table: AccuracyTable, acc_file, s: RunSettings) -> list[OtherForm]:
    """The forms the drafter's authors publish, beside the proposal trees: chains for a draft
    model; for an MLP speculator, IBM's candidate sets (its config's `top_k_tokens_per_head`
    and `n_candidates`, at most `max_nodes` nodes) merged into their prefix tree and as
    candidate sequences; none for the others."""
    kind = lm.heads.kind
    if kind == "draft-model":
        _, tau = chain_tau_curves(acc_file, s.max_nodes)
        sizes = sorted({0} | {min(int(n), tau.proposal.size) for n in s.sizes})
        return [OtherForm("chain", tau, tuple(sizes), "tree", {n: f"gamma {n}" for n in sizes if n})]
    if kind != "mlp-speculator":
        return []
    topk = [min(int(k), table.width) for k in lm.heads.top_k_tokens_per_head[: table.num_heads]]
    most = min(int(lm.heads.n_candidates), int(np.prod(topk)))
    proposal, nodes = candidate_proposal(table.accuracy, topk, most)
    counts = [m for m in range(1, most + 1) if nodes[m - 1] <= s.max_nodes and (m & (m - 1) == 0 or m == most)]
    if not counts:
        return []
    proposal = proposal.prefix(nodes[counts[-1] - 1])
    vectors = load_rank_vectors(acc_file, table=table) if str(acc_file).endswith(".json") else None
    tau = tau_curves(table, proposal, vectors)
    labels = {nodes[m - 1]: f"{m} candidate{'s' if m > 1 else ''}" for m in counts}
    return [
        OtherForm(name, tau, (0, *labels), name if name == "candidates" else "tree", labels)
        for name in ("merged", "candidates")
    ]


def _sweep_settings(s: RunSettings, sizes, verification: str = "tree") -> SweepSettings:
    """The sweep of `sizes` the run's settings ask for (every form is measured alike)."""
    return SweepSettings(
        sizes,
        s.batches,
        s.contexts,
        repeats=s.repeats,
        topk=s.topk,
        time_budget_s=s.time_budget_s,
        verification=verification,
        tolerance=s.tolerance,
    )


def _measure_form(
    lm, table, form: OtherForm, s: RunSettings, out: Path, hw, threads: int, acc_file, log, progress
) -> dict:
    """Sweep `form` like the proposal trees (`sweep-NAME.csv`, `selection-NAME.json`,
    `proposal-NAME.json`); returns its selection."""
    csv = out / f"sweep-{form.name}.csv"
    settings = _sweep_settings(s, form.sizes, form.verification)
    log(
        f"[sweep] {form.name}: {', '.join(form.labels.values())} ({form.verification} verification) x batch "
        f"{list(s.batches)} x context {list(s.contexts)}"
    )
    df = sweep(
        lm, table, form.tau, settings, csv, hardware=hw, resume="auto", progress=progress, accuracy_path=acc_file
    )
    chosen = select(
        df,
        form.tau.proposal,
        by="measured",
        hardware=hw.name,
        model=s.model,
        samples=read_round_samples(sweep_samples_path(csv)),
        threads=threads,
        tolerance=s.tolerance,
        confidence=settings.confidence,
    )
    chosen["verification"] = form.verification
    chosen["labels"] = {str(n): label for n, label in form.labels.items()}
    write_json(out / f"selection-{form.name}.json", chosen)
    write_text(
        out / f"proposal-{form.name}.json",
        format_tree(form.tau.proposal, "json", tau=float(form.tau.best[-1]), method=form.name),
    )
    return chosen


def _measure_other_forms(
    lm, table, forms: list[OtherForm], selection: dict, s: RunSettings, out: Path, hw, threads, acc_file, log, progress
) -> dict:
    """Sweep every form of `forms` (`_measure_form`) and choose, per cell, between them and the
    trees' selection (`treeopt.forms.choose_form`, in the drafter's `FORM_ORDER`)."""
    chosen = {f.name: _measure_form(lm, table, f, s, out, hw, threads, acc_file, log, progress) for f in forms}
    doc = choose_form({"tree": selection, **chosen}, order=FORM_ORDER[lm.heads.kind])
    doc["labels"] = {name: sel["labels"] for name, sel in chosen.items()}
    return doc


def _drafted(sizes, proposal, target) -> tuple[int, ...]:
    """The sizes to measure: for an engine that drafts only some prefixes of the proposal as
    written (vLLM's uniform trees), each size becomes the largest such prefix not above it."""
    if target is None or target.family != "uniform":
        return tuple(sizes)
    ok = np.flatnonzero(drafted_sizes(proposal, target))
    return tuple(sorted({int(ok[ok <= min(n, proposal.size)].max()) for n in sizes}))


def _with_data(s: RunSettings) -> RunSettings:
    """The demo's own prompts stand in only for the demo: any other model is calibrated and
    validated on prompts from its own use, which the user must name."""
    if is_demo(s.model):
        return replace(s, data=s.data or "demo", validation_data=s.validation_data or DEMO_VALIDATION)
    for option, value in (("--data", s.data), ("--validation-data", s.validation_data)):
        if value is None:
            raise UserError(
                f"{option}: required for --model {s.model} (the demo prompts are Python code; "
                "give prompts from your model's own use, the validation ones disjoint from --data)"
            )
    return s


def _run_main_job(out: Path, settings: RunSettings, *, log, progress: bool) -> dict:
    s = settings
    mix = parse_mix(s.mix) if s.mix is not None else None  # bad input fails before any work
    check_prompt_source(s.data, "--data")
    load_prompt_texts(s.validation_data)  # read now, not at stage 7 after hours of work
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings = {}

    # 1. calibration statistics, in the dtype every later stage runs in
    dtype = run_dtype(s.dtype, s.device)
    t0 = time.perf_counter()
    cal_settings = (
        {
            "model": s.model,
            "heads": s.heads,
            "data": s.data,
            "steps": s.steps,
            "topk": s.topk,
            "dtype": dtype,
            "seed": s.seed,
        }
        | ({"num_heads": s.num_heads} if s.num_heads else {})
        | ({"drafter": s.drafter} if s.drafter else {})
    )
    done = _stage(out, "calibrate", cal_settings, log)
    acc_file = out / "accuracy.json"
    if not (done and acc_file.is_file()):
        log(f"[calibrate] {s.model} on {s.data}: {s.steps} greedy tokens per prompt, top-{s.topk}")
        run_calibration(
            s.model,
            s.heads,
            s.data,
            output=acc_file,
            device=s.device,
            dtype=dtype,
            num_heads=s.num_heads,
            drafter=s.drafter,
            steps=s.steps,
            topk=s.topk,
            seed=s.seed,
            resume=True,
            progress=progress,
            threads=s.threads,
        )
        _mark(out, "calibrate", cal_settings)
    timings["calibrate_s"] = time.perf_counter() - t0

    # 2. proposal trees
    lm = load_model(s.model, s.heads, device=s.device, dtype=dtype, num_heads=s.num_heads, drafter=s.drafter)
    target = get_engine(s.engine, topk=s.topk) if s.engine else None
    if target is None:
        table, tau = load_tau_curves(acc_file, s.max_nodes, method=s.method)
    else:
        table = load_accuracy(acc_file)
        tau = tau_curves(
            table,
            engine_proposal(table, s.max_nodes, target, method=s.method),
            load_rank_vectors(acc_file, table=table),
        )
    proposal = tau.proposal
    method = "joint" if (s.method == "auto" and table.joint) else ("greedy" if s.method == "auto" else s.method)
    write_text(
        out / "proposal_tree.json",
        format_tree(
            proposal,
            "json",
            tau=float(tau.joint[-1] if tau.joint is not None else tau.independent[-1]),
            method=method,
            provenance=table.provenance,
        ),
    )
    log(
        f"[trees] {method} proposal sequence of {proposal.size} nodes; tau({proposal.size}) = "
        f"{tau.independent[-1]:.3f} independent"
        + (f", {tau.joint[-1]:.3f} joint" if tau.joint is not None else "")
        + (f", {tau.walked[-1]:.3f} walked" if tau.walked is not None else "")
    )

    threads = torch.get_num_threads()
    if lm.device.type == "cpu":
        # One thread count for every measurement of the run (profile, sweep, validation).
        threads = s.threads or default_threads(lm.model, lm.device) or torch.get_num_threads()
        torch.set_num_threads(threads)
    log(f"[setup] {lm.device}, {str(lm.dtype).replace('torch.', '')}, {threads} torch thread(s)")
    dtype_name = str(lm.dtype).replace("torch.", "")
    shape = shape_of(s.model, dtype=dtype_name)

    # 3. hardware profile of this machine
    t0 = time.perf_counter()
    hw_settings = {"device": str(lm.device), "dtype": dtype_name, "model": s.model, "quick": s.hw_quick}
    done = _stage(out, "hardware", hw_settings, log)
    hw_file = out / "hardware.json"
    if not (done and hw_file.is_file()):
        log(f"[hardware] microbenchmarks on {lm.device} ({dtype_name})")
        hw = calibrate_hardware(lm.device.type, shape, dtype=dtype_name, quick=s.hw_quick, progress=progress)
        _mark(out, "hardware", hw_settings, writing={hw_file: hw.save})
    hw = load_hardware(hw_file)
    timings["hardware_s"] = time.perf_counter() - t0

    # 4. prediction: the roofline report for this machine, for the trees and tau the sweep uses
    t0 = time.perf_counter()
    # Medusa's heads run in parallel on the accepted token; a sequential drafter's stages are
    # charged depth by depth (docs/performance-model.md, "Drafter cost")
    heads_shape = DraftHeadsShape(
        lm.heads.num_heads,
        getattr(lm.heads, "num_layers", 1),
        lm.heads.hidden_size,
        lm.heads.vocab_size,
        tokens_per_sequence=1,
    )
    if lm.heads.kind == "draft-model":
        write_gamma_prediction(
            shape,
            draft_shape_of(lm.heads, dtype=dtype_name),
            hw,
            chain_tau_curves(acc_file, s.max_nodes)[1],
            s.batches,
            s.contexts,
            out / "prediction",
            title=f"Predicted: {s.model} with its draft model on {hw.name}",
            tree=tau,
        )
    else:
        build_report(
            shape,
            heads_shape,
            hw,
            out / "prediction",
            accuracy=table,
            accuracy_label=f"calibrated on {s.data} ({acc_file.name})",
            batches=s.batches,
            contexts=s.contexts,
            max_nodes=s.max_nodes,
            joint=table.joint is not None,
            proposal=proposal,
            tau=tau.best,
            used_heads=True,
            tau_source=f"The {method} proposal sequence of {proposal.size} nodes the sweep measures; τ "
            + tau.describe(),
            title=f"Predicted: {s.model} with {lm.heads.num_heads} {_DRAFT_UNITS[lm.heads.kind]} on {hw.name}",
            engine=target,
            draft_cost=draft_cost_of_drafter(lm.heads),
        )
    timings["predict_s"] = time.perf_counter() - t0

    # 5. measured sweep
    t0 = time.perf_counter()
    sizes = _drafted(tuple(n for n in s.sizes if n <= proposal.size), proposal, target)
    sw = _sweep_settings(s, sizes)
    log(
        f"[sweep] sizes {list(sizes)} x batch {list(s.batches)} x context {list(s.contexts)}, "
        f"{s.repeats} rounds each (+ up to {s.time_budget_s:g} s of extra rounds where the answer is open), "
        f"{dtype_name}"
    )
    sweep_df = sweep(
        lm, table, tau, sw, out / "sweep.csv", hardware=hw, resume="auto", progress=progress, accuracy_path=acc_file
    )
    timings["sweep_s"] = time.perf_counter() - t0
    if len(set(s.batches)) > 1 and 1 in s.batches and lm.heads.kind != "draft-model":
        log(f"[fit] {format_transfer(fit_from_sweep(lm, proposal, hw, sweep_df, out))}")

    # 6. selection, with the evidence of a profile fitted to every cell
    round_samples = read_round_samples(sweep_samples_path(out / "sweep.csv"))
    selection = select(
        sweep_df,
        proposal,
        by="measured",
        hardware=hw.name,
        model=s.model,
        samples=round_samples,
        threads=threads,
        tolerance=s.tolerance,
        confidence=sw.confidence,
    )
    if lm.heads.kind != "draft-model" and round_samples:
        t0 = time.perf_counter()
        pooled = pooled_from_sweep(lm, proposal, hw, sweep_df, round_samples)
        add_pooled_evidence(
            selection, sweep_df, round_samples, pooled, proposal, tolerance=s.tolerance, confidence=sw.confidence
        )
        log(f"[pooled] {format_pooled(selection)}")
        timings["pooled_fit_s"] = time.perf_counter() - t0
    selection["dtype"] = dtype_name
    forms = other_forms(lm, table, acc_file, s)
    if forms:
        t0 = time.perf_counter()
        selection["forms"] = _measure_other_forms(
            lm, table, forms, selection, s, out, hw, threads, acc_file, log, progress
        )
        timings["forms_s"] = time.perf_counter() - t0
    if mix is not None:
        chosen = {(c["batch"], c["context"]): c["nodes"] for c in selection["cells"]}
        choice = choose_mix_tree(mix_grid_from_sweep(sweep_df), mix, source=str(out / "sweep.csv"), chosen=chosen)
        selection["mix"] = mix_section(choice, proposal, mix)
    plot_measured_speedup(sweep_df, selection, out / "measured_speedup.png")
    write_json(out / "selection.json", selection)
    log(format_selection(selection))
    if mix is not None:
        log(format_mix(selection["mix"]))

    # 7. validation on held-out prompts
    t0 = time.perf_counter()
    val_sizes = tuple(n for n in _drafted(s.validation_sizes, proposal, target) if 0 < n <= proposal.size)
    log(f"[validate] decoder on {s.validation_data}, tree sizes {list(val_sizes)}")
    result = validate(
        lm,
        tau,
        val_sizes,
        s.validation_data,
        sweep_df=sweep_df,
        max_new_tokens=s.steps,
        max_prompts=s.validation_prompts,
        topk=s.topk,
        out_dir=out,
        progress=progress,
        selection=selection,
    )
    log(format_validation(result))
    timings["validate_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start

    write_text(
        out / "index.md",
        _run_index(
            s,
            table,
            proposal,
            hw,
            selection,
            result,
            sweep_df,
            timings,
            method,
            regime=f"{dtype_name}, {threads} torch thread(s)",
            draft_model=lm.heads.kind == "draft-model",
        ),
    )
    log(f"report: {out / 'index.md'} ({timings['total_s']:.0f} s)")
    return {"selection": selection, "validation": result, "timings": timings}


def _mix_markdown(mix: dict) -> str:
    """The traffic-mix tree and what it loses, cell by cell, against each cell's own best
    (docs/builders.md "One tree for a traffic mix")."""
    n = mix["nodes"]
    if n:
        off = mix["off_from_batch"]
        where = f"speculation on up to batch {mix['speculate_up_to_batch']}" + (
            f", off from batch {off}" if off is not None else " (every batch of the mix)"
        )
        what = f"**{n} nodes**, {where}: `medusa_choices = {mix['medusa_choices']}`"
    else:
        what = "**no speculation**: no tree pays on this mix"
    ratio = mix["expected_tokens_per_s"] / mix["per_cell_best_tokens_per_s"]
    L = [
        "### One tree for the traffic mix",
        "",
        f"For the mix `{mix['source']}`, the one static tree of largest expected throughput is {what}. "
        f"Expected {mix['expected_tokens_per_s']:.4g} tokens/s, {ratio:.1%} of every cell with its own best "
        f"tree ({mix['per_cell_best_tokens_per_s']:.4g}); plain decoding {mix['plain_tokens_per_s']:.4g}.",
        "",
        "| batch | context | weight | best nodes | best speedup | mix tree nodes | mix tree speedup | loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in mix["cells"]:
        L.append(
            f"| {c['batch']} | {c['context']} | {c['weight']:.3f} | {c['best_nodes'] or 'none'} | "
            f"{format_speedup(c['best_speedup'])} | {c['mix_nodes'] or 'off'} | "
            f"{format_speedup(c['mix_speedup'])} | {c['loss_fraction']:.1%} |"
        )
    return "\n".join(L)


_FORM_TITLES = {
    "tree": "proposal tree (tree attention)",
    "chain": "chain of gamma drafts",
    "merged": "IBM's candidates merged into their prefix tree (tree attention)",
    "candidates": "IBM's candidates as sequences (batch expansion)",
}


def _forms_markdown(forms: dict) -> str:
    """Per cell the form to serve with and each form's measured best (docs/builders.md,
    "Choosing the verification form")."""
    labels = {name: {int(n): v for n, v in d.items()} for name, d in forms.get("labels", {}).items()}

    def size(form: str, nodes: int) -> str:
        if not nodes:
            return "no speculation"
        return labels.get(form, {}).get(nodes) or f"{nodes} node{'s' if nodes != 1 else ''}"

    names = forms["forms"]
    L = [
        "### Which form",
        "",
        "The same cells measured in each form the drafter is served in ("
        + "; ".join(f"`{f}`: {_FORM_TITLES.get(f, f)}" for f in names)
        + "). A form competes where its speedup's lower bound is above 1; the highest lower bound wins, "
        "and where intervals overlap the form listed first wins (`selection.json`, `forms`).",
        "",
        "| batch | context | serve | speedup | interval | reason | " + " | ".join(f"best {f}" for f in names) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(names),
    ]
    for c in forms["cells"]:
        chosen = f"{c['form']}: {size(c['form'], c['nodes'])}" if c["form"] else "no speculation"
        span = f"{c['speedup_lo']:.2f}–{c['speedup_hi']:.2f}" if c["form"] else "--"
        each = [
            f"{size(f, c['by_form'][f]['nodes'])}, {format_speedup(c['by_form'][f]['speedup'])}"
            if c["by_form"][f]["nodes"]
            else "no speculation"
            for f in names
        ]
        L.append(
            f"| {c['batch']} | {c['context']} | {chosen} | {format_speedup(c['speedup'])} | {span} | "
            f"{c['reason']} | " + " | ".join(each) + " |"
        )
    return "\n".join(L)


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


def _percent(confidence: float) -> str:
    """95%, or 98.75% where the sweep spent its error rate over several looks."""
    return f"{confidence * 100:.4g}%"


def _reason_text(cell: dict) -> str:
    reason = cell.get("reason", "--")
    if reason == "undecided":
        return f"undecided: {rounds_needed_text(cell)}"
    if cell.get("decided_by"):
        return f"{reason}, decided by the {cell['decided_by']}"
    return reason


def _fit_text(cell: dict) -> str:
    if "fit_nodes" not in cell:
        return "--"
    return f"{cell['fit_nodes']}" + ("" if cell["fit_consistent"] else " (the fit does not describe this cell)")


def _rerun_command(s: RunSettings) -> str:
    """The `treeopt run` command line of the settings that differ from the CLI's defaults
    (those a report of the demo is made with; others read the full settings in run_state.json)."""
    parts = ["treeopt run"]
    if not is_demo(s.model):
        parts.append(f"--model {s.model}")
    if s.drafter:
        parts.append(f"--drafter {s.drafter}")
    if s.engine:
        parts.append(f"--engine {s.engine}")
    if s.hw_quick:
        parts.append("--quick")
    return " ".join(parts + ["-o <dir>"])


def _run_index(
    s: RunSettings,
    table: AccuracyTable,
    proposal: Tree,
    hw,
    selection: dict,
    result: ValidationResult,
    sweep_df: pd.DataFrame,
    timings: dict,
    method: str,
    regime: str = "",
    draft_model: bool = False,
) -> str:
    acc = table.accuracy
    K = table.num_heads
    L = (
        [
            f"# treeopt run: {s.model} on {hw.name}",
            "",
            "Calibrate the draft heads, build the proposal trees, calibrate this machine's roofline profile, "
            "predict, measure, select, and check the predictions against measurements on held-out prompts.",
            "",
            f"Regenerate with `{_rerun_command(s)}`.",
            "",
            f"Measured in {regime}." if regime else "",
            "",
        ]
        + [f"**{line}**" for line in noise_summary(selection)]
        + [
            "",
            "## 1. Head accuracies",
            "",
            f"Greedy-label calibration on `{s.data}` ({int(table.positions[0])} positions for head 1), "
            f"per-rank accuracy, top-1 and top-{table.width} (in `accuracy.json`):",
            "",
            "| head | top-1 | top-" + str(table.width) + " | positions |",
            "|---|---|---|---|",
        ]
    )
    for k in range(K):
        L.append(f"| {k + 1} | {acc[k, 0]:.3f} | {acc[k].sum():.3f} | {int(table.positions[k])} |")
    L += [
        "",
        "## 2. Proposal trees",
        "",
        f"{method} proposal sequence of {proposal.size} nodes (`proposal_tree.json`); every prefix is the "
        "tree of that size.",
        "",
        "## 3. Selection: the best tree per batch size on this machine",
        "",
        "By measured speedup τ·T(0)/T(n) (bootstrap over paired rounds, τ's calibration error included; "
        f"comparisons at {_percent(selection.get('confidence', 0.95))}, each shipped tree's own interval at "
        f"{_percent(selection.get('interval_confidence', selection.get('confidence', 0.95)))}, spent over the "
        "tree sizes so that it holds whichever is picked): the smallest tree within "
        f"{selection.get('tolerance', 0):.0%} of the best point estimate at the lower bound of their paired ratio, "
        "shipped only where its own lower bound is above 1; `undecided` "
        "where another tree may still be better by more than that (`selection.json`; `sweep.csv` and "
        "`sweep.samples.npz` hold every measurement):",
        "",
        "| batch | context | chosen nodes | measured speedup | interval | rounds | reason | largest point speedup at "
        "| pooled fit's pick | predicted speedup |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in selection["cells"]:
        span = (
            f"{c['speedup_lo']:.2f}–{c['speedup_hi']:.2f}" if c.get("speedup_lo") is not None and c["nodes"] else "--"
        )
        L.append(
            f"| {c['batch']} | {c['context']} | {c['nodes'] or 'no speculation'} | "
            f"{format_speedup(c['measured_speedup'])} | {span} | {c.get('rounds', '--')} | "
            f"{_reason_text(c)} | {c.get('best_nodes', '--')} | {_fit_text(c)} | "
            f"{format_speedup(c.get('predicted_speedup'))} |"
        )
    if "pooled_fit" in selection:
        L += ["", f"Pooled evidence: the {format_pooled(selection)} (`selection.json` `pooled_fit`)."]
    L += [
        "",
        "Measured speedup against tree size per batch size, with its interval band, the pick marked "
        "and the prediction beside it:",
        "",
        "![measured speedup](measured_speedup.png)",
    ]
    if s.engine:
        target = get_engine(s.engine, topk=s.topk)
        L += [
            "",
            f"Paste-ready for {target.title} (the proposal trees are from its family):",
            "",
            "| batch | context | line |",
            "|---|---|---|",
        ]
        for c in selection["cells"]:
            line = (
                "no speculation"
                if not c["nodes"]
                else "`" + export_for(target, proposal.prefix(c["nodes"]), heads=K, accuracy=acc).line + "`"
            )
            L.append(f"| {c['batch']} | {c['context']} | {line} |")
    if "forms" in selection:
        L += ["", _forms_markdown(selection["forms"])]
    if "mix" in selection:
        L += ["", _mix_markdown(selection["mix"])]
    L += [
        "",
        "## 4. Validation on held-out prompts",
        "",
        "Measured tokens per step of the reference decoder against τ predicted from the table:",
        "",
        "![acceptance](validation_acceptance.png)",
        "",
        _md_table(
            result.acceptance[
                [
                    "nodes",
                    "measured_tokens_per_step",
                    "tau_independent",
                    "error_independent",
                    "tau_joint",
                    "error_joint",
                    "tau_walk",
                    "error_walk",
                    "steps",
                ]
            ]
        ),
        "",
        "tau_independent multiplies per-head per-rank accuracies; tau_joint averages the calibration's joint "
        "rank-vector statistics over every position; tau_walk walks the same rank vectors the way the decoder "
        "steps (after accepting A tokens the next step starts A positions on), which removes the length bias "
        "of a per-position average where acceptance comes in runs.",
        "",
    ]
    if result.latency is not None:
        err = result.latency["overhead_error"].abs()
        L += [
            "Step-latency ratio T(n)/T(0), measured against the roofline prediction for this machine's "
            f"calibrated profile: median |error| {err.median():.1%}, max {err.max():.1%} over {len(err)} "
            "configurations.",
            "",
            "![latency](validation_latency.png)",
            "",
        ]
    if result.regret is not None:
        L += [
            "Tree chosen by prediction alone against the tree the selection ships (fraction of its measured speedup):",
            "",
            _md_table(result.regret),
            "",
        ]
    L += [
        "## 5. The prediction for this machine",
        "",
        "The roofline report of this machine's profile: [prediction/index.md](prediction/index.md).",
        "",
    ]
    if not draft_model:  # a draft model's prediction is a table over gamma, without plots
        L += ["![roofline](prediction/roofline.png)", "", "![speedup](prediction/speedup.png)", ""]
    L += ["## Run time", "", ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in timings.items()), ""]
    return "\n".join(L)
