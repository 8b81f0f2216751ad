"""`treeopt demo train-drafters` and `treeopt demo compare-drafters`: the demo's Hydra heads
and MLP speculator, and the side-by-side report of the demo's drafters."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from calibration.demo_drafters import DrafterRecipe, train_drafters
from calibration.demo_files import DEMO_MODEL_DIR
from treeopt.app.compare_drafters import compare_drafters
from treeopt.cli.options import AtLeast
from treeopt.cli.safety import check_outputs, input_files
from treeopt.errors import UserError


@click.command("train-drafters")
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="demo_drafters",
    show_default=True,
    help="Where the drafters go (OUT/hydra, OUT/mlp_speculator, OUT/eagle3); a folder in the current directory by "
    "default: the installed package is never written (copy the result over calibration/demo_model to "
    "replace the bundled drafters).",
)
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The demo model they draft for [default: OUT when it holds one, else the bundled demo model].",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Checkpoints and the tokenised corpus [default: OUT/.work].",
)
@click.option("--steps", type=AtLeast(1), default=None, help="Training steps per drafter.")
@click.option(
    "--only", type=click.Choice(["hydra", "mlp-speculator", "eagle3"]), default=None, help="Train one drafter."
)
@click.option("--seed", type=AtLeast(0), default=0, show_default=True)
@click.option("--fresh", is_flag=True, help="Ignore checkpoints in --work-dir and start over.")
def demo_train_drafters(out_dir, model_dir, work_dir, steps, only, seed, fresh) -> None:
    """Train the demo's Hydra heads, MLP speculator and EAGLE-3 draft on the demo model (a few
    minutes each on 2 CPU cores). The repository already ships the result; this is the recipe."""
    check_outputs(folders=[out_dir, work_dir])
    recipe = DrafterRecipe(seed=seed)
    if steps:
        recipe = dataclasses.replace(recipe, steps=steps)
    out = Path(out_dir)
    if model_dir is None:
        model_dir = out if (out / "config.json").is_file() else DEMO_MODEL_DIR
    which = (only,) if only else ("hydra", "mlp-speculator", "eagle3")
    train_drafters(out, recipe, model_dir=model_dir, work_dir=work_dir, resume=not fresh, which=which)
    click.echo(f"drafters in {out}: " + ", ".join(which))


@click.command("compare-drafters")
@click.argument("runs", nargs=-1, required=True, metavar="KIND=RUN_DIR...")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Report directory.")
def demo_compare_drafters(runs, out_dir) -> None:
    """One report of `treeopt run` folders of several drafters side by side: tau against tree
    size, measured speedup per batch, the best tree of each."""
    parsed = {}
    for item in runs:
        kind, sep, path = item.partition("=")
        if not sep or not kind or not path:
            raise UserError(f"RUNS: expected KIND=RUN_DIR (e.g. hydra=reports/run-hydra), got {item!r}")
        parsed[kind] = Path(path)
    check_outputs(inputs=input_files(*parsed.values()), folders=[out_dir])
    command = "treeopt demo compare-drafters " + " ".join(runs) + f" -o {out_dir}"
    summary = compare_drafters(parsed, out_dir, command=command)
    click.echo(f"wrote {summary['index']}")
