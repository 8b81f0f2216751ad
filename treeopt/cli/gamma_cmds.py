"""`treeopt roofline gamma`: the predicted best draft length gamma of draft-model speculative
decoding per batch size and context, and the best tree of draft-model tokens where the alpha
sidecar has the per-child acceptance (or a proposal tree is given), or none
(roofline/speculative.py). numpy only."""

from __future__ import annotations

import click

from treeopt.app.gamma import DEFAULT_TREE_NODES, GammaPrediction, predict_gamma
from treeopt.cli.options import AtLeast, FiniteAtLeast, apply
from treeopt.cli.roofline_options import GRID_OPTIONS, HARDWARE_OPTION, MODEL_OPTIONS
from treeopt.cli.safety import check_outputs, input_files
from treeopt.export import text_table
from treeopt.fileio import atomic_path


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
    # the chain's operators are priced for every gamma at once (memory grows with its square);
    # engines draft at most a few dozen tokens a step
    type=AtLeast(0, maximum=256),
    default=None,
    help="Longest chain, at most 256 [default: the depths the sidecar covers; 8 with --alpha-value].",
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
    prediction = predict_gamma(
        model,
        draft,
        hardware,
        dtype=dtype,
        alpha_file=alpha_file,
        alpha_value=alpha_value,
        batches=batches,
        contexts=contexts,
        max_gamma=max_gamma,
        tree_spec=tree_spec,
        max_nodes=max_nodes,
        require_trees=bool(tree_out),
    )
    for path, frame in ((out, prediction.grid), (tree_out, prediction.trees and prediction.trees.grid)):
        if path:
            with atomic_path(path) as tmp:
                frame.to_csv(tmp, index=False, float_format="%.6g")
    _echo_gamma(prediction, batches, contexts)
    if out:
        click.echo(f"wrote grid {out}")
    if tree_out:
        click.echo(f"wrote tree grid {tree_out}")


def _best_table(best, batches, contexts, what: str) -> str:
    cell = {
        (int(b), int(c)): "none" if n == 0 else f"{int(n)} ({s:.2f}x)"
        for b, c, n, s in best[["batch", "context", what, "speedup"]].itertuples(index=False)
    }
    return text_table(
        ["batch"] + [str(c) for c in contexts],
        [[b] + [cell.get((int(b), int(c)), "OOM") for c in contexts] for b in batches],
    )


def _echo_gamma(prediction: GammaPrediction, batches, contexts) -> None:
    p = prediction
    click.echo(f"target {p.target.describe()}; draft {p.draft.describe()}; hardware {p.hardware.name}; {p.label}")
    click.echo("tau of a chain of gamma: " + ", ".join(f"{g}: {t:.3f}" for g, t in enumerate(p.tau)))
    click.echo("best gamma (predicted speedup) per batch (rows) and context (columns):")
    click.echo(_best_table(p.best, batches, contexts, "gamma"), nl=False)
    if p.trees is not None:
        proposal = p.trees.proposal
        click.echo(
            f"trees: the prefixes of {proposal.name or 'the proposal'} ({proposal.size} nodes), recursive rejection "
            f"sampling; tau at {proposal.size} nodes {p.trees.tau[-1]:.3f}"
        )
        click.echo("best tree (nodes, predicted speedup) per batch (rows) and context (columns):")
        click.echo(_best_table(p.trees.best, batches, contexts, "nodes"), nl=False)
