"""`treeopt roofline ops|speedup|predict`, `treeopt report`: the analytical half (roofline/);
the `treeopt hw` commands are in `treeopt/cli/hw_cmds.py`, the options they share in
`treeopt/cli/roofline_options.py`. numpy only: no torch is loaded."""

from __future__ import annotations

from dataclasses import replace

import click
import pandas as pd

from roofline.engine_presets import DRAFTER_KINDS, builtin_base, step_costs
from roofline.hardware import GIB, builtin_hardware, load_hardware
from roofline.ops import DraftWork
from roofline.profile_fit import error_summary
from roofline.published import (
    knee_note,
)
from roofline.published_checks import plain_step_regime
from roofline.report import ReportRequest, build_report
from roofline.step_shape import GpuSplit
from treeopt import api
from treeopt.app.grid_outputs import close_call_section, grid_selection, mix_choice, with_mix_cells
from treeopt.app.models import draft_cost_of, heads_of, serving_dtype, shape_of
from treeopt.app.prediction import (
    PredictionOptions,
    check_grid_size,
    greedy_proposal,
    heads_with_cost,
    load_table,
    predict_speedup,
)
from treeopt.app.step_ops import StepConfig, StepOperators, step_operators
from treeopt.cli.options import OLD_HEADS_OPTION, AtLeast, IntList, apply, command_line
from treeopt.cli.roofline_options import (
    DRAFTER_OPTIONS,
    ENGINE_COSTS_OPTION,
    ENGINE_OPTION,
    GPU_OPTIONS,
    GRID_OPTIONS,
    HARDWARE_OPTION,
    HEADS_OPTIONS,
    MODEL_OPTIONS,
    SEQUENTIAL_DRAFT_OPTION,
    VERIFICATION_OPTION,
    drafter_dir,
)
from treeopt.cli.safety import check_outputs, input_files, require_file
from treeopt.cli.tree_cmds import echo_notes
from treeopt.close_calls import format_close_calls
from treeopt.drafter_cost import MAX_HEAD_LAYERS, MAX_HEADS
from treeopt.engines import ENGINE_NAMES, get_engine
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import atomic_folder, atomic_outputs, atomic_path, dumps
from treeopt.mix import format_mix, parse_mix
from treeopt.schedules import format_schedule
from treeopt.selection import best_per_cell
from treeopt.selection_types import MixSection, selection_to_json
from treeopt.tree_api import serving_engine


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
        drafter={"drafter": drafter, "drafter_config": drafter_dir(heads_dir, drafter_config)},
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
@apply(GPU_OPTIONS)
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
    expert_parallel,
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
    dtype, dtype_note = serving_dtype(model, dtype)
    echo_notes([dtype_note] if dtype_note else [])
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
        drafter={"drafter": drafter, "drafter_config": drafter_dir(heads_dir, drafter_config)},
        options=PredictionOptions(
            verification=verification,
            attention=attention,
            joint=joint,
            heads_in_baseline=heads_in_baseline,
            used_heads=used_heads,
            sequential_draft=sequential_draft,
            engine_costs=engine_costs,
            tensor_parallel=tensor_parallel,
            expert_parallel=expert_parallel,
        ),
    )
    mix_doc = mix_choice(prediction, mix)
    closes = close_call_section(prediction)
    chosen = replace(grid_selection(prediction, mix_doc), close_calls=closes) if select else None
    if chosen is not None and prediction.engine is not None:  # as treeopt.select(prediction) gives it
        chosen = api.with_engine(chosen, prediction.engine, table, grid=prediction.grid, proposal=prediction.proposal)
    with atomic_outputs() as files:  # the grid and the selection from it: both or neither
        if out:
            prediction.grid.to_csv(files.path(out), index=False, float_format="%.6g")
        if chosen is not None:
            files.path(select).write_text(dumps(selection_to_json(chosen), indent=1) + "\n", encoding="utf-8")
    _echo_speedup(prediction, label, mix_doc)
    _echo_after_grid(closes, chosen, {"grid": out, "selection": select})
    _echo_knee_note(prediction.hardware)


def _echo_after_grid(closes, chosen, written: dict) -> None:
    """After the grid's table: its close calls, the engine's schedule where one was chosen, and
    the files written."""
    if text := format_close_calls(closes):
        click.echo(text)
    if chosen is not None and chosen.schedule is not None:
        click.echo(_engine_cells(chosen))
        click.echo(format_schedule(chosen.schedule))
    for what, path in written.items():
        if path:
            click.echo(f"wrote {what} {path}")


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


def _engine_cells(sel) -> str:
    """Each cell's line for the selection's engine, one per line."""
    lines = [f"{sel.provenance.engine} line per (batch, context):"]
    for c in sel.cells:
        lines.append(f"  batch {c.batch:4d}  context {c.context:6d}: {c.engine_line or 'no speculation'}")
    return "\n".join(lines)


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
    dtype, dtype_note = serving_dtype(model, dtype)
    echo_notes([dtype_note] if dtype_note else [])
    notes = (*notes, dtype_note) if dtype_note else notes
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
    cost = draft_cost_of(model, shape, drafter=drafter, drafter_config=drafter_dir(heads_dir, drafter_config))
    heads = heads_with_cost(cost, heads)
    if table is not None and heads.num_heads < 1:
        raise UserError("--num-heads: a speedup report needs at least one draft head")
    if plot_context is not None and plot_context not in contexts:
        raise UserError(f"--plot-context: {plot_context} is not one of the --context values")
    proposal = tau = None
    if engine and table is not None:  # the one drafter rule (docs/engines.md#drafters-and-engines)
        engine = serving_engine(engine, table, note=lambda line: click.echo(f"note: {line}", err=True))
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


@click.command("predict")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@click.option(
    "--points",
    "points_path",
    required=True,
    metavar="POINTS.csv",
    help="Rows of batch, context, tokens [, candidates, draft_stages, tree, step_ms]: the steps to predict "
    "(tree 1: the verified tokens branch; docs/performance-model.md#fitting-a-profile-to-measured-steps).",
)
@OLD_HEADS_OPTION
@click.option(
    "--num-heads",
    "num_heads",
    type=AtLeast(0, MAX_HEADS),
    default=0,
    show_default=True,
    metavar="K",
    help="Draft heads a speculative step runs (the value the profile was fitted with).",
)
@click.option("--head-layers", type=AtLeast(0, MAX_HEAD_LAYERS), default=None, help="ResBlocks per head [default: 1].")
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
@apply(GPU_OPTIONS)
@click.option(
    "--drafter",
    "drafter_kind",
    type=click.Choice(DRAFTER_KINDS),
    default=None,
    help="Drafter kind whose cost per drafted depth (draft_stages) the preset charges [default: the one it was "
    "fitted on].",
)
def roofline_predict(
    model,
    dtype,
    hardware,
    points_path,
    num_heads,
    head_layers,
    attention,
    out,
    engine,
    engine_costs,
    tensor_parallel,
    expert_parallel,
    drafter_kind,
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
        gpus=GpuSplit(tensor_parallel, expert_parallel),
    )
    frame["predicted_step_ms"] = predicted * 1e3
    measured = "step_ms" in frame.columns
    if measured:
        frame["error"] = frame["predicted_step_ms"] / pd.to_numeric(frame["step_ms"], errors="coerce") - 1.0
    with atomic_path(out) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")
    spread = " (experts spread whole)" if expert_parallel else ""
    click.echo(
        f"predicted {len(frame)} steps of {shape.name} on {hw.name}"
        + (f" x {tensor_parallel}{spread}" if tensor_parallel > 1 else "")
        + (f"; against step_ms: {error_summary(frame['error'])}" if measured else "")
    )
    if measured:
        _echo_priced_regime(frame)
    click.echo(f"wrote {out}")


def _echo_priced_regime(frame: pd.DataFrame) -> None:
    """Say which measured plain steps (tokens 1) the profile does not price at all: beyond
    PRICED_REGIME_FACTOR of the prediction either way, the run carries a cost no term holds, and
    its speculative steps carry it too (docs/performance-model.md#the-priced-regime)."""
    step_ms = pd.to_numeric(frame["step_ms"], errors="coerce")
    plain = frame[(pd.to_numeric(frame["tokens"], errors="coerce") == 1) & (step_ms > 0)]
    if plain.empty:
        return
    regime = plain_step_regime(step_ms[plain.index], plain["predicted_step_ms"])
    if not regime.outside.any():
        return
    rows = ", ".join(f"{i + 1} ({f:.2f}x)" for i, f in zip(plain.index[regime.outside], regime.factor[regime.outside]))
    click.echo(
        f"{int(regime.outside.sum())} of {len(plain)} plain steps measured beyond {regime.bound:g}x the prediction "
        f"either way (data rows {rows}): this profile does not price that run (a host-bound engine, or a batch "
        "that never filled), so ratios and calls at those batches test nothing; fit the profile to your steps "
        "(treeopt hw fit) before trusting them (docs/performance-model.md#the-priced-regime)"
    )
