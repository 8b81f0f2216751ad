"""`treeopt roofline gamma`: the predicted best draft length gamma of draft-model speculative
decoding per batch size and context, and the best tree of draft-model tokens where the alpha
sidecar has the per-child acceptance (or a proposal tree is given), or none
(roofline/speculative.py). numpy only."""

from __future__ import annotations

from pathlib import Path

import click

from roofline.hardware import load_hardware
from roofline.speculative import best_gamma, gamma_grid, tree_grid
from treeopt.app.models import shape_of
from treeopt.chain import alpha_path, chain_tau, load_chain_acceptance, rejection_proposal, rejection_tau_curve
from treeopt.cli.options import AtLeast, FiniteAtLeast, apply
from treeopt.cli.roofline_cmds import GRID_OPTIONS, HARDWARE_OPTION, MODEL_OPTIONS
from treeopt.cli.safety import check_outputs, input_files
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import atomic_path
from treeopt.tree import load_tree

#: nodes of the tree proposal built from the per-child acceptance when no --tree is given
DEFAULT_TREE_NODES = 32


def _alphas(alpha_file, alpha_value, max_gamma):
    """Per-depth alpha, where it came from, and the sidecar (None for --alpha-value): a sidecar
    (or the accuracy table beside it), or one constant alpha for every depth."""
    if (alpha_file is None) == (alpha_value is None):
        raise UserError("give the draft's acceptance with --alpha FILE or --alpha-value A (one of them)")
    if alpha_value is not None:
        if alpha_value > 1:
            raise UserError(f"--alpha-value: must be in [0, 1], got {alpha_value:g}")
        return [alpha_value] * (max_gamma or 8), f"alpha {alpha_value:g} at every depth", None
    path = Path(alpha_file)
    if not path.name.endswith(".alpha.json") and path.suffix == ".json":
        path = alpha_path(path)  # an accuracy table: its sidecar
    side = load_chain_acceptance(path)
    return list(side.alpha_per_depth), f"alpha of {path} (T={side.temperature:g}, {side.rows} positions)", side


def _tree_proposal(side, tree_spec, max_nodes):
    """The proposal whose prefixes are the candidate trees and their tau under recursive
    rejection sampling, or None when there is no per-child acceptance and no --tree."""
    if side is None or side.accept_per_child is None:
        if tree_spec is not None:
            raise UserError(
                "--tree: needs the per-child acceptance of a treeopt.chain_acceptance/v2 sidecar (--alpha FILE)"
            )
        return None
    table = side.per_child
    if tree_spec is not None:
        proposal = load_tree(tree_spec, allow_empty=True)
    else:
        proposal = rejection_proposal(table, DEFAULT_TREE_NODES if max_nodes is None else max_nodes)
    return proposal, rejection_tau_curve(proposal, table)


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
@click.option(
    "--tree",
    "tree_spec",
    default=None,
    metavar="FILE|CHOICES",
    help="A proposal tree whose prefixes are the candidate draft trees [default: the proposal built from "
    "the sidecar's per-child acceptance, when it has one].",
)
@click.option(
    "--max-nodes",
    type=AtLeast(0),
    default=None,
    help=f"Nodes of the proposal built from the per-child acceptance [default: {DEFAULT_TREE_NODES}].",
)
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False), help="Grid CSV to write.")
@click.option(
    "--tree-out", default=None, type=click.Path(dir_okay=False), help="Grid CSV of the candidate trees to write."
)
def roofline_gamma(
    model,
    dtype,
    hardware,
    draft,
    alpha_file,
    alpha_value,
    batches,
    contexts,
    max_gamma,
    tree_spec,
    max_nodes,
    out,
    tree_out,
):
    """Predicted speedup of draft-model speculative decoding for every batch x context x gamma,
    and the best gamma per cell ("none" when no chain beats plain decoding); with a v2 alpha
    sidecar (per-child acceptance) or --tree, the best tree of draft tokens per cell too."""
    check_outputs([out, tree_out], input_files(model, hardware, draft, alpha_file, tree_spec))
    alpha, label, side = _alphas(alpha_file, alpha_value, max_gamma)
    trees = _tree_proposal(side, tree_spec, max_nodes)
    if tree_out and trees is None:
        raise UserError("--tree-out: no trees to write (needs a v2 alpha sidecar or --tree)")
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
    if trees is not None:
        proposal, tree_tau = trees
        tgrid = tree_grid(target, draft_shape, hw, proposal, tree_tau, batches=batches, contexts=contexts)
        if tree_out:
            with atomic_path(tree_out) as tmp:
                tgrid.to_csv(tmp, index=False, float_format="%.6g")
        click.echo(
            f"trees: the prefixes of {proposal.name or 'the proposal'} ({proposal.size} nodes), recursive rejection "
            f"sampling; tau at {proposal.size} nodes {tree_tau[-1]:.3f}"
        )
        click.echo("best tree (nodes, predicted speedup) per batch (rows) and context (columns):")
        tcell = {
            (int(r.batch), int(r.context)): "none" if r.nodes == 0 else f"{int(r.nodes)} ({r.speedup:.2f}x)"
            for r in best_gamma(tgrid).itertuples(index=False)
        }
        click.echo(
            text_table(
                ["batch"] + [str(c) for c in contexts],
                [[b] + [tcell.get((int(b), int(c)), "OOM") for c in contexts] for b in batches],
            ),
            nl=False,
        )
    if out:
        click.echo(f"wrote grid {out}")
    if tree_out:
        click.echo(f"wrote tree grid {tree_out}")
