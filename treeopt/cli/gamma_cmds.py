"""`treeopt roofline gamma`: the predicted best draft length gamma of draft-model speculative
decoding per batch size and context, or none (roofline/speculative.py). numpy only."""

from __future__ import annotations

from pathlib import Path

import click

from roofline.hardware import load_hardware
from roofline.speculative import best_gamma, gamma_grid
from treeopt.app.models import shape_of
from treeopt.chain import alpha_path, chain_tau, load_chain_acceptance
from treeopt.cli.options import AtLeast, FiniteAtLeast, apply
from treeopt.cli.roofline_cmds import GRID_OPTIONS, HARDWARE_OPTION, MODEL_OPTIONS
from treeopt.cli.safety import check_outputs, input_files
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import atomic_path


def _alphas(alpha_file, alpha_value, max_gamma):
    """Per-depth alpha and where it came from: a sidecar (or the accuracy table beside it), or
    one constant alpha for every depth."""
    if (alpha_file is None) == (alpha_value is None):
        raise UserError("give the draft's acceptance with --alpha FILE or --alpha-value A (one of them)")
    if alpha_value is not None:
        if alpha_value > 1:
            raise UserError(f"--alpha-value: must be in [0, 1], got {alpha_value:g}")
        return [alpha_value] * (max_gamma or 8), f"alpha {alpha_value:g} at every depth"
    path = Path(alpha_file)
    if not path.name.endswith(".alpha.json") and path.suffix == ".json":
        path = alpha_path(path)  # an accuracy table: its sidecar
    side = load_chain_acceptance(path)
    return list(side.alpha_per_depth), f"alpha of {path} (T={side.temperature:g}, {side.rows} positions)"


@click.command("gamma")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@click.option(
    "--draft-model",
    "draft",
    required=True,
    metavar="NAME|CONFIG|DIR",
    help="The draft model's shape: a built-in name, a config.json or a model directory.",
)
@click.option(
    "--alpha",
    "alpha_file",
    default=None,
    metavar="FILE",
    help="Alpha sidecar (NAME.alpha.json from `calibrate --drafter draft-model`) or its accuracy table.",
)
@click.option(
    "--alpha-value",
    type=FiniteAtLeast(0.0),
    default=None,
    metavar="A",
    help="One acceptance alpha for every depth (Leviathan et al.'s i.i.d. model).",
)
@apply(GRID_OPTIONS)
@click.option(
    "--max-gamma",
    type=AtLeast(0),
    default=None,
    help="Longest chain [default: the depths the sidecar covers; 8 with --alpha-value].",
)
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False), help="Grid CSV to write.")
def roofline_gamma(model, dtype, hardware, draft, alpha_file, alpha_value, batches, contexts, max_gamma, out):
    """Predicted speedup of draft-model speculative decoding for every batch x context x gamma,
    and the best gamma per cell ("none" when no chain beats plain decoding)."""
    check_outputs([out], input_files(model, hardware, draft, alpha_file))
    alpha, label = _alphas(alpha_file, alpha_value, max_gamma)
    target, draft_shape = shape_of(model, dtype), shape_of(draft, dtype)
    hw = load_hardware(hardware)
    grid = gamma_grid(target, draft_shape, hw, alpha, batches=batches, contexts=contexts, max_gamma=max_gamma)
    best = best_gamma(grid)
    if out:
        with atomic_path(out) as tmp:
            grid.to_csv(tmp, index=False, float_format="%.6g")
    click.echo(f"target {target.describe()}; draft {draft_shape.describe()}; hardware {hw.name}; {label}")
    top = int(grid["gamma"].max())
    taus = chain_tau(alpha)[: top + 1]
    click.echo("tau of a chain of gamma: " + ", ".join(f"{g}: {t:.3f}" for g, t in enumerate(taus)))
    click.echo("best gamma (predicted speedup) per batch (rows) and context (columns):")
    cell = {
        (int(r.batch), int(r.context)): "none" if r.gamma == 0 else f"{int(r.gamma)} ({r.speedup:.2f}x)"
        for r in best.itertuples(index=False)
    }
    click.echo(
        text_table(
            ["batch"] + [str(c) for c in contexts],
            [[b] + [cell.get((int(b), int(c)), "OOM") for c in contexts] for b in batches],
        ),
        nl=False,
    )
    if out:
        click.echo(f"wrote grid {out}")
