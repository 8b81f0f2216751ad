"""`treeopt hw list|published|fit`, `treeopt roofline ops|speedup|predict`, `treeopt report`: the
analytical half (roofline/). numpy only: no torch is loaded."""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from roofline.engine_presets import DRAFTER_KINDS, FAMILIES, builtin_base, load_presets, step_costs
from roofline.grid import DEFAULT_BATCHES, DEFAULT_CONTEXTS
from roofline.hardware import GIB, VERIFICATION_MODES, builtin_hardware, hardware_aliases, load_hardware
from roofline.ops import DraftWork
from roofline.profile_fit import error_summary, term_text
from roofline.published import (
    KNEE_TOLERANCE,
    PUBLISHED_STEPS,
    compare_steps,
    knee_checks,
    knee_note,
    knee_ratios,
    knee_summary,
    knee_verdict,
)
from roofline.published_gemms import FITTED_CURVES, GEMM_SOURCES, GEMM_TOLERANCE, gemm_bands, published_gemms
from roofline.report import ReportRequest, build_report
from treeopt import api
from treeopt.app.grid_outputs import grid_selection, mix_choice, with_mix_cells
from treeopt.app.models import draft_cost_of, heads_of, shape_of
from treeopt.app.prediction import (
    PredictionOptions,
    check_grid_size,
    greedy_proposal,
    heads_with_cost,
    load_table,
    predict_speedup,
)
from treeopt.app.step_ops import StepConfig, StepOperators, step_operators
from treeopt.cli.options import OLD_HEADS_OPTION, AtLeast, HeadsCount, IntList, apply, command_line
from treeopt.cli.safety import check_outputs, input_files, require_file
from treeopt.drafter_cost import DRAFTER_NAMES
from treeopt.engines import ENGINE_NAMES, get_engine
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import atomic_folder, atomic_outputs, atomic_path, dumps
from treeopt.mix import format_mix, parse_mix
from treeopt.selection import best_per_cell
from treeopt.selection_types import MixSection, selection_to_json


def _drafter_dir(heads_dir: str | None, drafter_config: str | None) -> str | None:
    """The drafter directory of --heads or --drafter-config (the same thing, named as other
    commands name it, or as a config file)."""
    if heads_dir is not None and drafter_config is not None:
        raise UserError("--heads: give the drafter as --heads DIR or --drafter-config PATH, not both")
    return heads_dir if heads_dir is not None else drafter_config


MODEL_OPTIONS = [
    click.option(
        "--model",
        "model",
        required=True,
        metavar="NAME|CONFIG|DIR|demo",
        help="Built-in shape (llama-7b, vicuna-7b, llama-3-8b, mistral-7b, ...), a config.json, "
        "a model directory, or demo.",
    ),
    click.option(
        "--dtype", default=None, metavar="DTYPE", help="Compute dtype (fp32, bf16, fp16) [default: the model's]."
    ),
]
HARDWARE_OPTION = click.option(
    "--hardware",
    "hardware",
    required=True,
    metavar="NAME|PROFILE.json",
    help="Built-in profile (see `treeopt hw list`) or a profile JSON from `treeopt hw calibrate`.",
)


HEADS_OPTIONS = [
    click.option(
        "--heads",
        "heads_dir",
        type=HeadsCount(directory=True),
        default=None,
        metavar="DIR",
        help="Drafter directory (Medusa heads, Hydra heads or an MLP speculator), as on every command: the "
        "cost shape the roofline charges (as --drafter-config) [default: the Medusa heads next to the model].",
    ),
    click.option(
        "--num-heads",
        "num_heads",
        type=AtLeast(0),
        default=None,
        metavar="K",
        help="Number of draft heads K [default: the accuracy table's, else the Medusa heads config "
        "next to the model, else 5]; 0 = none.",
    ),
    click.option("--head-layers", type=AtLeast(0), default=None, help="ResBlocks per head [default: 1]."),
    click.option(
        "--head-tokens",
        type=AtLeast(1),
        default=None,
        help="Tokens per sequence the heads run on [default: all q, as Medusa's code; a decoder "
        "that runs them on the accepted token only: 1].",
    ),
]
ENGINE_OPTION = click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Trees only from this engine's family, priced with its engine family's step costs on a built-in "
    "profile (docs/performance-model.md#engine-presets); the report shows the line it takes.",
)
ENGINE_COSTS_OPTION = click.option(
    "--engine-costs",
    "engine_costs",
    type=click.Choice(FAMILIES),
    default=None,
    help="Price the steps with this engine family's preset (`treeopt hw list`) on a built-in profile "
    "[default: --engine's family, else ideal]. ibm-tgis has no tree engine: costs only.",
)
VERIFICATION_OPTION = click.option(
    "--verification",
    type=click.Choice(VERIFICATION_MODES),
    default="tree",
    show_default=True,
    help="tree: the tree's tokens under a tree mask, one read of the context; candidates: its root-to-leaf "
    "paths as separate sequences that each re-read the context (engines without tree attention).",
)
SEQUENTIAL_DRAFT_OPTION = click.option(
    "--sequential-draft",
    is_flag=True,
    help="The drafter drafts depth by depth: a tree pays the profile's draft_stage_s once per level of depth.",
)
DRAFTER_OPTIONS = [
    click.option(
        "--drafter",
        type=click.Choice(DRAFTER_NAMES),
        default=None,
        help="Drafter kind: its directory next to the model gives its cost shape [default: Medusa heads "
        "from the heads options].",
    ),
    click.option(
        "--drafter-config",
        default=None,
        metavar="PATH",
        help="A drafter's config.json (or its directory; Medusa, Hydra or MLP speculator): the cost "
        "shape the roofline charges (docs/performance-model.md#drafter-cost).",
    ),
]


GRID_OPTIONS = [
    click.option(
        "--batch",
        "batches",
        type=IntList(1),
        default=",".join(map(str, DEFAULT_BATCHES)),
        show_default=True,
        help="Comma-separated batch sizes.",
    ),
    click.option(
        "--context",
        "contexts",
        type=IntList(0),
        default=",".join(map(str, DEFAULT_CONTEXTS)),
        show_default=True,
        help="Comma-separated context lengths.",
    ),
]


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def hw_list(as_json: bool) -> None:
    """List the built-in hardware profiles."""
    profiles = builtin_hardware()
    if as_json:
        click.echo(dumps([p.to_dict() for p in profiles.values()], indent=1))
        return
    aliases: dict[str, list[str]] = {}
    for a, n in hardware_aliases().items():
        aliases.setdefault(n, []).append(a)
    rows = []
    for name, p in profiles.items():
        fp32 = p.peak_flops.get("fp32")
        fp8 = p.peak_flops.get("fp8")
        al = f" (alias {', '.join(aliases[name])})" if name in aliases else ""
        rows.append(
            [
                name,
                f"{p.peak('bf16') / 1e12:.4g}",
                f"{fp8 / 1e12:.4g}" if fp8 else "-",
                f"{fp32 / 1e12:.4g}" if fp32 else "-",
                f"{p.bandwidth_bytes_per_s / 1e9:.0f}",
                f"{p.capacity_gib:.0f}",
                knee_summary(name),
                p.description + al,
            ]
        )
    headers = ["<name", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp32 TFLOP/s", "GB/s", "GiB", "<knee", "<description"]
    click.echo(text_table(headers, rows), nl=False)
    p = next(iter(profiles.values()))
    click.echo(
        f"\nAll: eta_compute {p.eta_compute}, eta_memory {p.eta_memory}, {p.kernel_overhead_s * 1e6:g} us "
        "per kernel, their die's row-dependent GEMM efficiency, no engine costs beyond the forward pass; memory "
        'as sold ("80 GB" = 80 GiB). knee: how that row curve compares with public step times and GEMM timings '
        "(`treeopt hw published`). Fit a profile to your engine's step times with `treeopt hw fit`, or "
        "calibrate this machine with `treeopt hw calibrate`."
    )
    _echo_presets()


_PRESET_COLUMNS = {
    "forward_overhead_s": "per forward",
    "layer_overhead_s": "per layer",
    "spec_step_overhead_s": "per spec. step",
    "verified_token_s": "per verified token",
    "draft_stage_s": "per drafted depth",
}


def _preset_value(preset, field: str) -> str:
    if field not in preset.terms:
        return "-" if not preset.priced else "(ideal)"
    lo, hi = preset.ranges[field]
    return f"{_ms(preset.terms[field])} ({_ms(lo)}-{_ms(hi)})"


def _ms(seconds: float) -> str:
    return "0" if seconds == 0 else f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def _echo_presets() -> None:
    """The engine presets (docs/performance-model.md#engine-presets): what `--engine` (or
    `--engine-costs`) sets on a built-in profile."""
    rows = [
        [p.family, "yes" if p.measured else f"carried ({p.carried_from})" if p.carried_from else "no"]
        + [_preset_value(p, f) for f in _PRESET_COLUMNS]
        for p in load_presets().values()
    ]
    headers = ["<family", "<measured"] + [f"<{c}" for c in _PRESET_COLUMNS.values()]
    click.echo("")
    click.echo(text_table(headers, rows, title="Engine presets (value, range)"), nl=False)
    for p in load_presets().values():
        if p.drafting:
            kinds = ", ".join(f"{k} {_ms(v)}" for k, v in p.drafting.items())
            click.echo(f"drafting per depth by drafter kind ({p.family}): {kinds}")
    click.echo(
        "A preset sets these terms on a built-in profile (attention's KV bandwidth stays ideal: no published step "
        "constrains it); the roofs stay the GPU's. per drafted depth: the fitted drafter's (EAGLE for vllm); "
        "--drafter picks its kind's cost (0 where the roofline prices the drafter as operators). (ideal): not "
        "identifiable from the published steps; carried: no published step of that engine, the closest family's "
        "terms with ranges widened 2x; unmeasured families keep the ideal terms. --engine picks its family's preset "
        "(medusa, hydra, treeopt: hf-eager; trtllm; vllm*; sglang*), --engine-costs any family; a profile file "
        "keeps its own terms. Sources: `treeopt hw published`; held-out errors: benchmarks/bench_published_steps.py; "
        "docs/performance-model.md#engine-presets."
    )


def _echo_published_steps(name: str, sources: list) -> None:
    rows = []
    for c in compare_steps(name):
        m = c.measurement
        if m.source not in sources:
            sources.append(m.source)
        rows.append(
            [
                m.model,
                m.dtype,
                str(m.batch),
                str(m.tokens),
                str(m.context_tokens),
                m.measured_as,
                f"{m.step_ms:.3g}",
                f"{c.predicted_ms:.3g}",
                f"{c.error * 100:+.0f}%",
                f"[{sources.index(m.source) + 1}]",
            ]
        )
    if not rows:
        return
    headers = ["<model", "<dtype", "batch", "tokens", "cached", "<measured as", "ms", "predicted", "error", "source"]
    click.echo(text_table(headers, rows, title=f"{name}: one forward pass"), nl=False)
    knee_rows = [
        [
            f"T({k.tokens}) / T({k.reference_tokens})",
            k.release,
            k.model,
            f"{k.measured_ratio:.3g}",
            f"{k.predicted_ratio:.3g}",
            f"{k.error * 100:+.0f}%",
        ]
        for k in knee_checks(name)
    ]
    headers = ["<ratio", "<release", "<model", "measured", "predicted", "error"]
    click.echo(text_table(headers, knee_rows, title=f"{name}: knee in step times"), nl=False)
    for r in knee_ratios(name):
        of = f"{r.measurements} measurement" + ("s" if r.measurements > 1 else "")
        state = "matches" if r.matches else "does not match"
        click.echo(
            f"T({r.tokens}) / T({r.reference_tokens}): median error {r.median_error * 100:+.0f}% over {of}, "
            f"{state} (tolerance ±{KNEE_TOLERANCE[r.reference_tokens] * 100:.0f}%)"
        )


def _echo_published_gemms(name: str, sources: list) -> None:
    bands = gemm_bands(name)
    if not bands:
        return
    source = GEMM_SOURCES[name]
    if source not in sources:
        sources.append(source)
    (reference_rows,) = {b.reference_rows for b in bands}
    fitted = load_hardware(name).gemm_efficiency == FITTED_CURVES.get(name)
    rows = [
        [
            f"{b.lo} < r <= {b.hi}",
            str(b.row_counts),
            f"{b.median_error * 100:+.0f}%",
            f"{b.worst_error * 100:+.0f}%",
            "fitted" if fitted else ("matches" if b.matches else "does not match"),
        ]
        for b in bands
    ]
    title = (
        f"{name}: T(r) / T({reference_rows}) of Llama-2-7B's four weight GEMMs in fp16, predicted against measured "
        f"[{sources.index(source) + 1}]"
    )
    headers = ["<rows", "row counts", "median error", "worst", "<state"]
    click.echo(text_table(headers, rows, title=title), nl=False)
    click.echo(
        "its row curve was fitted to these timings: they show the fit, not a check"
        if fitted
        else f"a band matches when its median error is within ±{GEMM_TOLERANCE * 100:.0f}%"
    )


@click.command("published")
@click.option(
    "--hardware",
    "hardware",
    default=None,
    metavar="NAME",
    help="A built-in profile with published measurements [default: every one that has them].",
)
def hw_published(hardware) -> None:
    """Public step times of optimised engines and GEMM timings beside what the built-in profiles
    predict."""
    names = sorted({m.hardware for m in PUBLISHED_STEPS} | {g.hardware for g in published_gemms()})
    if hardware is not None:
        # built-in names only: a profile file is the user's own, whatever name it carries
        name = hardware_aliases().get(hardware.lower(), hardware.lower())
        if name not in names:
            raise UserError(
                f"--hardware: no published measurements for {hardware} (there are some for {', '.join(names)})"
            )
        names = [name]
    sources = []
    for name in names:
        click.echo(f"== {name}: knee {knee_verdict(name)}")
        _echo_published_steps(name, sources)
        _echo_published_gemms(name, sources)
        click.echo("")
    if hardware is None:
        _echo_preset_sources()
    for i, source in enumerate(sources, 1):
        click.echo(f"[{i}] {source}")


def _echo_preset_sources() -> None:
    """Which published speculative steps each engine preset was fitted on and which were held out."""
    click.echo("== engine presets: published speculative steps (roofline/data/published_speculative_steps.json)")
    for p in load_presets().values():
        if p.family == "ideal":
            continue
        if p.carried_from:
            click.echo(f"{p.family}: no published measurement; the {p.carried_from} preset's terms, ranges widened.")
            continue
        if not p.measured:
            click.echo(f"{p.family}: no published measurement; ideal terms. {p.not_known[0]}")
            continue
        click.echo(f"{p.family}: {p.source_text()}")
        click.echo(f"  fitted on {p.fit_rows}; held out: {p.held_out}")
    click.echo(
        "Held-out T(n)/T(0) errors of each preset beside the ideal engine: python benchmarks/bench_published_steps.py "
        "(docs/performance-model.md#engine-presets)."
    )
    click.echo("")


@click.command("ops")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@apply(HEADS_OPTIONS)
@click.option("--batch", "batch", type=AtLeast(1), default=1, show_default=True, help="Sequences b.")
@click.option(
    "--tokens",
    "tokens",
    type=AtLeast(1),
    default=1,
    show_default=True,
    help="New tokens per sequence q (1 = decode, n+1 = tree of n nodes, prompt length = prefill).",
)
@click.option("--context", "context", type=AtLeast(0), default=0, show_default=True, help="Cached tokens s.")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@VERIFICATION_OPTION
@click.option(
    "--candidates",
    type=AtLeast(1),
    default=None,
    help="With --verification candidates: candidate sequences the tokens are split into "
    "[default: every token its own].",
)
@click.option(
    "--draft-stages",
    type=AtLeast(0),
    default=None,
    help="Sequential draft stages of this step (the profile's draft_stage_s each) [default: those a "
    "sequential drafter runs, else 0].",
)
@apply(DRAFTER_OPTIONS)
@click.option(
    "--draft-rows",
    type=IntList(0, ordered=True),
    default=None,
    metavar="R1,R2,...",
    help="A sequential drafter: rows per sequence each stage runs on (the nodes of the depth above "
    "with children) [default: a chain of tokens - 1 nodes, one row per stage it reaches].",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of operators.")
def roofline_ops(
    model,
    dtype,
    hardware,
    heads_dir,
    num_heads,
    head_layers,
    head_tokens,
    batch,
    tokens,
    context,
    attention,
    verification,
    candidates,
    draft_stages,
    drafter,
    drafter_config,
    draft_rows,
    as_json,
) -> None:
    """Every operator of one forward pass: FLOPs, bytes, intensity, predicted time, binding roof."""
    ops = step_operators(
        model,
        hardware,
        StepConfig(batch, tokens, context, attention, verification, candidates, draft_stages),
        dtype=dtype,
        heads={"num_heads": num_heads, "num_layers": head_layers, "tokens_per_sequence": head_tokens},
        drafter={"drafter": drafter, "drafter_config": _drafter_dir(heads_dir, drafter_config)},
        draft_rows=draft_rows,
    )
    if not ops.fits:
        click.echo(
            f"treeopt: warning: this configuration needs {ops.memory_bytes / GIB:.1f} GiB but {ops.hardware.name} "
            f"has {ops.hardware.capacity_text()}: it does not fit; times below are what it would take",
            err=True,
        )
    if as_json:
        click.echo(dumps(ops.rows(), indent=1))
        return
    _echo_operators(ops)


def _echo_operators(ops: StepOperators) -> None:
    shape, hw, heads, step, total = ops.shape, ops.hardware, ops.drafter, ops.step, ops.total_s
    rows = ops.rows()
    click.echo(f"{shape.describe()}")
    if heads.num_heads:
        click.echo(f"draft {'heads' if not isinstance(heads, DraftWork) else 'stages'}: {heads.describe()}")
    click.echo(f"hardware: {hw.describe()}")
    split = f" in {ops.candidates} candidates" if ops.candidates is not None else ""
    click.echo(
        f"b={step.batch} q={step.tokens}{split} s={step.context} attention={step.attention}; "
        f"memory needed {ops.memory_bytes / GIB:.2f} GiB"
    )
    click.echo(
        text_table(
            ["<operator", "count", "GFLOP", "MB", "FLOP/B", "time/us", "total/us", "share", "<bound"],
            [
                [
                    row["name"],
                    row["count"],
                    f"{row['flops'] / 1e9:.4g}",
                    f"{row['bytes'] / 1e6:.4g}",
                    f"{row['intensity']:.1f}" if row["intensity"] is not None else "-",
                    f"{row['time_s'] * 1e6:.2f}",
                    f"{row['time_s'] * row['count'] * 1e6:.1f}",
                    f"{row['time_s'] * row['count'] / total:.1%}",
                    row["bound"],
                ]
                for row in rows
            ],
        ),
        nl=False,
    )
    tot_flops = sum(r["flops"] * r["count"] for r in rows)
    tot_bytes = sum(r["bytes"] * r["count"] for r in rows)
    click.echo(
        f"step: {total * 1e3:.3f} ms; {tot_flops / 1e9:.4g} GFLOP, {tot_bytes / 1e6:.4g} MB moved, "
        f"intensity {tot_flops / tot_bytes:.1f} FLOP/B (ridge {hw.ridge_intensity(shape.dtype):.0f})"
    )


@click.command("speedup")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@click.option(
    "--accuracy",
    "accuracy",
    required=True,
    metavar="FILE",
    help="Accuracy table (treeopt.accuracy/v1 JSON, per-rank matrix JSON, or cumulative top-k CSV).",
)
@click.option("--csv-model", default=None, help="Row set of a CSV holding several models [default: --model].")
@apply(HEADS_OPTIONS)
@apply(GRID_OPTIONS)
@click.option("--max-nodes", type=AtLeast(0), default=64, show_default=True, help="Largest tree size.")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--joint", is_flag=True, help="tau from the table's joint prefix counts.")
@click.option("--heads-in-baseline", is_flag=True, help="Plain decoding (n = 0) also runs the heads.")
@click.option("--used-heads", is_flag=True, help="A tree runs only the heads it reaches (its depth), not all K.")
@VERIFICATION_OPTION
@SEQUENTIAL_DRAFT_OPTION
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False), help="Grid CSV to write.")
@ENGINE_OPTION
@ENGINE_COSTS_OPTION
@click.option(
    "--tensor-parallel",
    "tensor_parallel",
    type=AtLeast(1),
    default=1,
    show_default=True,
    help="GPUs the model is split over (tensor parallelism: weights and KV split, two all-reduces per layer; "
    "docs/performance-model.md#tensor-parallelism).",
)
@click.option(
    "--select",
    "select",
    default=None,
    type=click.Path(dir_okay=False),
    help="Selection JSON (treeopt.selection/v1) to write.",
)
@click.option(
    "--mix",
    "mix_spec",
    default=None,
    metavar="FILE.csv|SPEC",
    help="Also choose one tree for this traffic mix (CSV batch,context,weight or '1:0.5,8@2048:0.5'); "
    "its cells join the grid.",
)
@apply(DRAFTER_OPTIONS)
def roofline_speedup(
    model,
    dtype,
    hardware,
    accuracy,
    csv_model,
    heads_dir,
    num_heads,
    head_layers,
    head_tokens,
    batches,
    contexts,
    max_nodes,
    attention,
    joint,
    heads_in_baseline,
    used_heads,
    engine,
    engine_costs,
    tensor_parallel,
    verification,
    sequential_draft,
    out,
    select,
    mix_spec,
    drafter,
    drafter_config,
) -> None:
    """Predicted overhead, tau and speedup for every batch x context x tree size, and the best
    tree per cell ("none" when no tree beats plain decoding)."""
    check_outputs([out, select], input_files(model, hardware, accuracy, mix_spec))
    mix = parse_mix(mix_spec) if mix_spec is not None else None
    batches, contexts = with_mix_cells(batches, contexts, mix)
    check_grid_size(batches, contexts, max_nodes)
    table, label = load_table(accuracy, csv_model, model)
    prediction = predict_speedup(
        model,
        hardware,
        table,
        dtype=dtype,
        batches=batches,
        contexts=contexts,
        max_nodes=max_nodes,
        engine=engine,
        heads={"num_heads": num_heads, "num_layers": head_layers, "tokens_per_sequence": head_tokens},
        drafter={"drafter": drafter, "drafter_config": _drafter_dir(heads_dir, drafter_config)},
        options=PredictionOptions(
            verification=verification,
            attention=attention,
            joint=joint,
            heads_in_baseline=heads_in_baseline,
            used_heads=used_heads,
            sequential_draft=sequential_draft,
            engine_costs=engine_costs,
            tensor_parallel=tensor_parallel,
        ),
    )
    mix_doc = mix_choice(prediction, mix)
    with atomic_outputs() as files:  # the grid and the selection from it: both or neither
        if out:
            prediction.grid.to_csv(files.path(out), index=False, float_format="%.6g")
        if select:
            doc = selection_to_json(grid_selection(prediction, mix_doc))
            files.path(select).write_text(dumps(doc, indent=1) + "\n", encoding="utf-8")
    _echo_speedup(prediction, label, mix_doc)
    for path, what in ((out, "grid"), (select, "selection")):
        if path:
            click.echo(f"wrote {what} {path}")
    _echo_knee_note(prediction.hardware)


def _echo_speedup(prediction, label: str, mix_doc: MixSection | None) -> None:
    tau, hw, best = prediction.tau, prediction.hardware, best_per_cell(prediction.grid)
    click.echo(f"{prediction.model.describe()}; {prediction.drafter}; hardware {hw.name}; accuracy {label}")
    click.echo(prediction.step_costs)
    click.echo(
        "tau of the greedy proposal sequence: "
        + ", ".join(f"n={n}: {tau[n]:.3f}" for n in (1, 4, 16, 32, 64) if n < len(tau))
    )
    click.echo("best tree size (predicted speedup) per batch (rows) and context (columns):")
    ctxs = sorted(best["context"].unique())
    cell = {
        (int(b), int(c)): ("OOM" if not fits else "none" if n == 0 else f"{int(n)} ({s:.2f}x)")
        for b, c, n, s, fits in best[["batch", "context", "nodes", "speedup", "fits_memory"]].itertuples(index=False)
    }
    click.echo(
        text_table(
            ["batch"] + [str(c) for c in ctxs],
            [[b] + [cell[(int(b), int(c))] for c in ctxs] for b in sorted(best["batch"].unique())],
        ),
        nl=False,
    )
    if not best["fits_memory"].all():
        click.echo(f"OOM: not even plain decoding fits in {hw.capacity_text()}", err=True)
    if mix_doc is not None:
        click.echo(format_mix(mix_doc))


def _echo_knee_note(hw) -> None:
    note = knee_note(builtin_base(hw) or hw)  # a preset's terms leave the knee as it was
    if note:
        click.echo(note, err=True)


@click.command("report")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@click.option(
    "--accuracy",
    "accuracy",
    default=None,
    metavar="FILE",
    help="Accuracy table; without it the report has no tau, speedup or best-tree plots.",
)
@click.option("--csv-model", default=None, help="Row set of a CSV holding several models [default: --model].")
@apply(HEADS_OPTIONS)
@apply(GRID_OPTIONS)
@click.option("--plot-context", type=AtLeast(0), default=None, help="Context of the speedup curves [default: ~1024].")
@click.option("--max-nodes", type=AtLeast(0), default=64, show_default=True)
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--joint", is_flag=True, help="tau from the table's joint prefix counts.")
@click.option("--used-heads", is_flag=True, help="A tree runs only the heads it reaches (its depth), not all K.")
@ENGINE_OPTION
@ENGINE_COSTS_OPTION
@VERIFICATION_OPTION
@SEQUENTIAL_DRAFT_OPTION
@click.option("--title", default=None, help="Report title.")
@click.option("--note", "notes", multiple=True, help="A note for index.md (repeatable).")
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False), help="Report directory.")
@apply(DRAFTER_OPTIONS)
def report_cmd(
    model,
    dtype,
    hardware,
    accuracy,
    csv_model,
    heads_dir,
    num_heads,
    head_layers,
    head_tokens,
    batches,
    contexts,
    plot_context,
    max_nodes,
    attention,
    joint,
    used_heads,
    engine,
    engine_costs,
    verification,
    sequential_draft,
    title,
    notes,
    out,
    drafter,
    drafter_config,
) -> None:
    """Write a report directory: roofline chart, speedup curves, best-tree heatmaps (PNG),
    grid.csv, selection.json and an index.md stating inputs and assumptions."""
    check_outputs(inputs=input_files(model, hardware, accuracy), folders=[out])
    check_grid_size(batches, contexts, max_nodes)
    shape = shape_of(model, dtype)
    costs = step_costs(load_hardware(hardware), engine=engine, family=engine_costs)
    hw = costs.profile
    table, label = (None, "")
    if accuracy:
        table, label = load_table(accuracy, csv_model, model)
    heads = heads_of(
        model,
        shape,
        num_heads=num_heads,
        num_layers=head_layers,
        accuracy_heads=table.num_heads if table is not None else None,
        tokens_per_sequence=head_tokens,
    )
    cost = draft_cost_of(model, shape, drafter=drafter, drafter_config=_drafter_dir(heads_dir, drafter_config))
    heads = heads_with_cost(cost, heads)
    if table is not None and heads.num_heads < 1:
        raise UserError("--num-heads: a speedup report needs at least one draft head")
    if plot_context is not None and plot_context not in contexts:
        raise UserError(f"--plot-context: {plot_context} is not one of the --context values")
    proposal = tau = None
    if table is not None:
        depth = min(heads.num_heads, cost.stages) if cost is not None else heads.num_heads
        proposal, tau = greedy_proposal(table, max_nodes, depth, joint, get_engine(engine) if engine else None)
    with atomic_folder(out) as folder:  # the whole report or none of it
        request = ReportRequest(
            shape,
            heads,
            hw,
            accuracy=table,
            accuracy_label=label,
            batches=batches,
            contexts=contexts,
            max_nodes=max_nodes,
            attention=attention,
            plot_context=plot_context,
            command=command_line(click.get_current_context()),
            title=title,
            joint=joint,
            used_heads=used_heads,
            notes=notes,
            proposal=proposal,
            tau=tau,
            save_hardware=hw.name not in builtin_hardware(),
            engine=get_engine(engine) if engine else None,
            verification=verification,
            sequential_draft=sequential_draft,
            draft_cost=cost,
            step_costs=costs.line,
            engine_costs=costs.family,
        )
        summary = build_report(request, folder)
    click.echo(costs.line)
    click.echo(f"wrote {out}/index.md with " + ", ".join(v for k, v in summary["files"].items() if k != "index"))
    _echo_knee_note(hw)


@click.command("fit")
@apply(MODEL_OPTIONS)
@click.option(
    "--hardware",
    "hardware",
    required=True,
    metavar="NAME|PROFILE.json",
    help="The base profile whose roofs are kept: the GPU's built-in name, or a profile JSON.",
)
@click.option(
    "--measurements",
    required=True,
    multiple=True,
    metavar="FILE",
    help="Measured step times, repeatable (the steps are joined): a CSV with columns batch, context, tokens, "
    "step_ms [, candidates, draft_stages] (docs/performance-model.md#fitting-a-profile-to-measured-steps), or an "
    "engine's benchmark output: SGLang bench_one_batch JSONL, vLLM latency JSON, trtllm-bench report JSON "
    "(docs/performance-model.md#engine-benchmark-files).",
)
@click.option(
    "--batch",
    type=AtLeast(1),
    default=None,
    metavar="B",
    help="Sequences decoding together, for a file that does not record it (vLLM latency JSON: the run's "
    "--batch-size; trtllm-bench throughput report).",
)
@click.option(
    "--input-len",
    "input_len",
    type=AtLeast(0),
    default=None,
    metavar="S",
    help="Prompt tokens per sequence, for a vLLM latency JSON (the run's --input-len).",
)
@click.option(
    "--output-len",
    "output_len",
    type=AtLeast(1),
    default=None,
    metavar="N",
    help="Generated tokens per sequence, for a vLLM latency JSON (the run's --output-len).",
)
@click.option(
    "--tokens",
    type=AtLeast(1),
    default=None,
    metavar="Q",
    help="Tokens verified per sequence per step, root included, for a speculative trtllm-bench report "
    "(draft tokens + 1), which does not record it. Files that record it, or are plain decoding, need none "
    "[default: 1 = plain decoding].",
)
@OLD_HEADS_OPTION
@click.option(
    "--num-heads",
    "num_heads",
    type=AtLeast(0),
    default=0,
    show_default=True,
    metavar="K",
    help="Draft heads whose operators the prediction of a speculative step includes (0: the drafting "
    "cost is left to the fitted engine terms). Use the same value wherever the profile is used.",
)
@click.option("--head-layers", type=AtLeast(0), default=None, help="ResBlocks per head [default: 1].")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--name", default=None, help="Profile name [default: BASE-fitted].")
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write.")
def hw_fit(
    model,
    dtype,
    hardware,
    measurements,
    batch,
    input_len,
    output_len,
    tokens,
    num_heads,
    head_layers,
    attention,
    name,
    out,
) -> None:
    """Fit a hardware profile's engine terms to measured step times of any engine."""
    check_outputs([out], input_files(model, hardware, *measurements))
    for path in measurements:
        require_file(path, "--measurements")
    result = api.fit_profile(
        model,
        hardware,
        list(measurements),
        heads=num_heads,
        head_layers=head_layers,
        attention=attention,
        name=name,
        dtype=dtype,
        batch=batch,
        input_len=input_len,
        output_len=output_len,
        tokens=tokens,
    )
    points, fit = result.points, result.profile.calibration["fit"]
    result.profile.save(out)
    click.echo(f"fitted {len(points)} steps of {fit['model']} over {fit['base']}; free terms: {', '.join(result.free)}")
    rows = []
    for k, v in result.values().items():
        lo, hi = result.intervals[k]
        span = f"{lo * 1e3:.3g}-{hi * 1e3:.3g} ms" if k.endswith("_s") else f"{lo:.3g}-{hi:.3g}"
        rows.append([k, _term_text(k, v), span, _status_text(result, k)])
    click.echo(text_table(["<term", "<value", "<95% interval", "<status"], rows), nl=False)
    click.echo(
        "determined: the rows narrowed the prior to under half its width; prior: they did not (or cannot see "
        "the term: not fitted); at bound: held at the edge of its physical range"
    )
    click.echo(f"in-sample: {error_summary(result.in_sample_error)}")
    if result.loo_error is not None:
        click.echo(f"leave-one-out: {error_summary(result.loo_error)}")
        worst = int(np.argmax(np.abs(result.loo_error)))
        click.echo(
            f"worst row (leave-one-out): batch {int(points.batch[worst])}, "
            f"context {int(points.context[worst])}, tokens {int(points.tokens[worst])}: "
            f"{result.loo_error[worst] * 100:+.1f}%"
        )
    click.echo(f"wrote profile {out} (use it as --hardware {out})")


def _term_text(name: str, value: float) -> str:
    return term_text(name, value)


def _status_text(result, name: str) -> str:
    """A term's status, with which bound holds it or that it was not fitted."""
    status, prior = result.status[name], result.priors[name]
    if status == "at bound":
        edge = prior.lower if result.values()[name] <= prior.lower else prior.upper
        return f"at bound ({'lower' if edge == prior.lower else 'upper'}, {_term_text(name, edge)})"
    if name not in result.free:
        return f"{status} (not fitted)"
    return status


@click.command("predict")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@click.option(
    "--points",
    "points_path",
    required=True,
    metavar="POINTS.csv",
    help="Rows of batch, context, tokens [, candidates, draft_stages, step_ms]: the steps to predict.",
)
@OLD_HEADS_OPTION
@click.option(
    "--num-heads",
    "num_heads",
    type=AtLeast(0),
    default=0,
    show_default=True,
    metavar="K",
    help="Draft heads a speculative step runs (the value the profile was fitted with).",
)
@click.option("--head-layers", type=AtLeast(0), default=None, help="ResBlocks per head [default: 1].")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="CSV to write: the rows with predicted_step_ms (and error, when step_ms is given).",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Price the steps with this engine's family preset on a built-in profile "
    "(docs/performance-model.md#engine-presets).",
)
@ENGINE_COSTS_OPTION
@click.option(
    "--drafter",
    "drafter_kind",
    type=click.Choice(DRAFTER_KINDS),
    default=None,
    help="Drafter kind whose cost per drafted depth (draft_stages) the preset charges [default: the one it was "
    "fitted on].",
)
def roofline_predict(
    model, dtype, hardware, points_path, num_heads, head_layers, attention, out, engine, engine_costs, drafter_kind
) -> None:
    """Predicted step_ms for every row of a step CSV (compare any prediction with any measurement)."""
    check_outputs([out], input_files(model, hardware, points_path))
    require_file(points_path, "--points")
    shape = shape_of(model, dtype)
    costs = step_costs(load_hardware(hardware), engine=engine, family=engine_costs, drafter=drafter_kind)
    hw = costs.profile
    click.echo(costs.line)
    try:
        frame = pd.read_csv(points_path, comment="#", skipinitialspace=True)
    except FileNotFoundError:
        raise UserError(f"--points: {points_path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UserError(f"--points: {points_path}: not a CSV ({str(err).splitlines()[0]})") from None
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    predicted = api.predict_steps(
        model,
        hw,
        frame,
        source=f"--points: {points_path}",
        heads=num_heads,
        head_layers=head_layers,
        attention=attention,
        dtype=dtype,
    )
    frame["predicted_step_ms"] = predicted * 1e3
    measured = "step_ms" in frame.columns
    if measured:
        frame["error"] = frame["predicted_step_ms"] / pd.to_numeric(frame["step_ms"], errors="coerce") - 1.0
    with atomic_path(out) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")
    click.echo(
        f"predicted {len(frame)} steps of {shape.name} on {hw.name}"
        + (f"; against step_ms: {error_summary(frame['error'])}" if measured else "")
    )
    click.echo(f"wrote {out}")
