"""`treeopt select`: the best tree per (batch, context) from a measured sweep or a predicted grid,
and one tree for a traffic mix. Apart from the tree commands because it reads sweeps with pandas."""

from __future__ import annotations

import click

from treeopt import api
from treeopt.cli.options import FiniteAtLeast, tolerance_option
from treeopt.cli.safety import check_outputs, input_files
from treeopt.cli.tree_cmds import echo_notes, engine_serving_table, load_table, write_output
from treeopt.dynamic_schedule import read_dynamic_taus
from treeopt.engines import ENGINE_NAMES
from treeopt.errors import UserError
from treeopt.fileio import dumps
from treeopt.selection import sweep_meta_path, sweep_samples_path
from treeopt.selection_text import selection_summary


@click.command("select")
@click.option("--sweep", "sweep_file", default=None, metavar="FILE.csv", help="A sweep from `treeopt sweep`.")
@click.option(
    "--grid",
    "grid_file",
    default=None,
    metavar="FILE.csv",
    help="Or a predicted grid from `treeopt roofline speedup` (needs --accuracy).",
)
@click.option(
    "--accuracy", default=None, metavar="FILE", help="With --grid: the table whose proposal sequence the grid used."
)
@click.option("--csv-model", default=None, metavar="NAME", help="With --grid: row set of a multi-model accuracy CSV.")
@click.option(
    "--by",
    type=click.Choice(["measured", "predicted"]),
    default="measured",
    show_default=True,
    help="Select by the measured speedup or by the roofline prediction stored in the sweep.",
)
@click.option(
    "--threshold",
    type=FiniteAtLeast(0),
    default=1.0,
    show_default=True,
    help="A tree must beat this speedup, else no speculation.",
)
@tolerance_option()
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Add each cell's tree as the line this engine takes (engine_line); SGLang needs --accuracy.",
)
@click.option(
    "--mix",
    "mix_spec",
    default=None,
    metavar="FILE.csv|SPEC",
    help="Also choose one tree for this traffic mix: a CSV batch,context,weight or inline "
    "'1:0.5,8:0.3,32@2048:0.2' (BATCH[@CONTEXT]:WEIGHT).",
)
@click.option(
    "--verification",
    type=click.Choice(["tree", "candidates"]),
    default=None,
    help="How the engine verifies the trees, recorded in the selection: a sweep knows its own and "
    "refuses another; a grid does not, so give the one `roofline speedup --verification` used "
    "[default: the sweep's, else tree].",
)
@click.option(
    "--pooled/--no-pooled",
    default=True,
    show_default=True,
    help="With --sweep: fit one engine profile to every cell and decide from it the cells their own "
    "rounds leave open, as `treeopt run` does (docs/statistics.md).",
)
@click.option(
    "--fixed-rounds/--keep-undecided",
    default=True,
    show_default=True,
    help="With --sweep: its rounds are all there will be, so a cell they cannot settle ships the tree "
    "of best worst-case bound (a bigger tree taken to step no faster than a smaller one) where a tree "
    "beats --threshold at its lower bound, listing the trees it "
    "is not shown to be within --tolerance of (docs/statistics.md#a-sweep-that-cannot-be-measured-again); "
    "--keep-undecided leaves such cells undecided.",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME|CONFIG|DIR|demo",
    help="With --sweep: the model whose profile is fitted [default: the sweep's].",
)
@click.option(
    "--hardware",
    default=None,
    metavar="NAME|PROFILE.json",
    help="With --sweep: the profile whose terms are fitted [default: the sweep's, when built in or "
    "the hardware.json beside it].",
)
@click.option(
    "--dynamic-tau",
    "dynamic_tau",
    default=None,
    metavar="FILE.csv",
    help="With --engine trtllm-eagle3-dynamic: tau per (steps, topk, draft tokens) from the draft's own scores "
    "(`treeopt sglang-tau -o`); the dynamic-tree config is priced from it and the step times of as many nodes.",
)
@click.option("-o", "--output", default=None, metavar="FILE.json", help="Selection JSON [default: stdout].")
def select_cmd(
    sweep_file,
    grid_file,
    accuracy,
    csv_model,
    by,
    threshold,
    tolerance,
    engine,
    mix_spec,
    verification,
    pooled,
    fixed_rounds,
    model,
    hardware,
    dynamic_tau,
    output,
):
    """Pick the best tree per (batch, context): from a measured sweep, or from predictions
    alone for hardware you don't have."""
    if (sweep_file is None) == (grid_file is None):
        raise UserError("select: give exactly one of --sweep or --grid")
    sweep_inputs = (
        [sweep_file, sweep_meta_path(sweep_file), sweep_samples_path(sweep_file)] if sweep_file is not None else []
    )
    if sweep_file is None and (model is not None or hardware is not None):
        raise UserError("--model/--hardware: only meaningful with --sweep (the pooled fit of its cells)")
    check_outputs([output], input_files(*sweep_inputs, grid_file, accuracy, mix_spec, hardware, dynamic_tau))
    table = load_table(accuracy, csv_model) if accuracy is not None else None
    engine, notes = engine_serving_table(engine, table)
    if dynamic_tau is not None:
        if engine != "trtllm-eagle3-dynamic":
            raise UserError("--dynamic-tau: prices TensorRT-LLM's dynamic tree; give --engine trtllm-eagle3-dynamic")
        read_dynamic_taus(dynamic_tau)  # one line for a bad file, before the sweep is read
    if sweep_file is not None:
        source = api.load_sweep(sweep_file)
    else:
        if table is None:
            raise UserError("--grid: needs --accuracy (the table whose proposal sequence the grid used)")
        source = api.load_grid(grid_file, table)
    selection = api.select(
        source,
        by=by,
        threshold=threshold,
        tolerance=tolerance,
        engine=engine,
        accuracy=table,
        mix=mix_spec,
        verification=verification,
        pooled=pooled and sweep_file is not None,
        model=model,
        hardware=hardware,
        fixed_rounds=fixed_rounds,
    )
    if dynamic_tau is not None:
        selection = api.with_dynamic_tau(selection, source, dynamic_tau, table, by)
    echo_notes(notes)
    if output:
        write_output(output, lambda: selection.save(output))
        click.echo(selection_summary(selection))
        click.echo(f"wrote {output}")
    else:  # stdout is the JSON alone, so that it can be piped; the summary goes to stderr
        click.echo(selection_summary(selection), err=True)
        click.echo(dumps(selection.to_json(), indent=1))
