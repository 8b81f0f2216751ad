"""`treeopt roofline candidates`: IBM's candidate form, verified as n candidate sequences or
merged into a prefix tree, side by side for every batch and context
(docs/builders.md#ibms-candidate-form). numpy only: no torch is loaded."""

from __future__ import annotations

import click
import numpy as np

from roofline.grid import candidate_forms_grid, draft_rows_by_prefix
from roofline.hardware import load_hardware
from roofline.ops import DraftWork
from roofline.shapes import DraftHeadsShape
from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import load_accuracy
from treeopt.app.models import draft_cost_of, shape_of
from treeopt.candidates import candidate_rank_paths, merged_candidate_tree, speculator_draft_rows
from treeopt.cli.options import AtLeast, IntList, apply
from treeopt.cli.roofline_options import DRAFTER_OPTIONS, GRID_OPTIONS, HARDWARE_OPTION, MODEL_OPTIONS
from treeopt.cli.safety import check_outputs, input_files
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import atomic_path
from treeopt.tau import tau_curves


def _rows(rows, stages: int) -> np.ndarray:
    rows = np.asarray(rows, dtype=float)[:stages]
    return np.concatenate((rows, np.zeros(stages - rows.size)))


@click.command("candidates")
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@click.option("--accuracy", required=True, metavar="FILE", help="Accuracy table of the drafter (treeopt calibrate).")
@click.option("--csv-model", default=None, help="Row set of a CSV holding several models [default: --model].")
@apply(DRAFTER_OPTIONS)
@click.option(
    "--topk",
    "topk",
    type=IntList(1, ordered=True),
    default=None,
    metavar="K1,K2,...",
    help="Tokens kept per stage [default: the speculator config's top_k_tokens_per_head].",
)
@click.option(
    "--candidates",
    "n_candidates",
    type=AtLeast(1),
    default=None,
    metavar="N",
    help="Full-length candidates kept [default: the speculator config's n_candidates].",
)
@apply(GRID_OPTIONS)
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False), help="CSV of both forms per cell.")
def candidates_cmd(
    model,
    dtype,
    hardware,
    accuracy,
    csv_model,
    drafter,
    drafter_config,
    topk,
    n_candidates,
    batches,
    contexts,
    attention,
    out,
) -> None:
    """IBM's candidate form: the n best of the product of per-stage top-k, verified as n
    candidate sequences or merged into a prefix tree; predicted speedup of both per cell and
    the form to use."""
    check_outputs([out], input_files(model, hardware, accuracy, drafter_config))
    shape = shape_of(model, dtype)
    hw = load_hardware(hardware)
    table = load_accuracy(accuracy, model=csv_model, default_model=None if csv_model else str(model).lower())
    cost = draft_cost_of(model, shape, drafter=drafter, drafter_config=drafter_config)
    topk, n_candidates = _candidate_shape(cost, topk, n_candidates)
    tree = merged_candidate_tree(candidate_rank_paths(table.accuracy, topk, n_candidates))
    vectors = load_rank_vectors(accuracy, table=table) if accuracy.endswith(".json") else None
    curves = tau_curves(table, tree, vectors)
    tau = float(curves.best[-1])
    draft, candidate_draft = _draft_work(cost, shape, tree, topk)
    grid = candidate_forms_grid(
        shape,
        draft,
        hw,
        tau,
        tree,
        n_candidates,
        batches,
        contexts,
        candidate_draft=candidate_draft,
        attention=attention,
    )
    if out:
        with atomic_path(out) as tmp:
            grid.to_csv(tmp, index=False, float_format="%.6g")
    click.echo(f"{shape.describe()}; hardware {hw.name}; drafter {(cost.describe() if cost else 'Medusa heads')}")
    click.echo(
        f"top-k per stage {list(topk)}: {int(np.prod(topk))} candidates, the {n_candidates} of highest summed "
        f"log-accuracy kept; merged: {tree.size} nodes, depth {tree.depth}"
    )
    click.echo(f"medusa_choices: {tree.to_choices()}")
    click.echo(f"tau {tau:.3f} ({curves.describe()}; the same for both forms)")
    click.echo("predicted speedup per batch (rows) and context (columns), prefix tree / candidate sequences:")
    click.echo(_forms_table(grid), nl=False)
    if out:
        click.echo(f"wrote {out}")


def _candidate_shape(cost, topk, n_candidates) -> tuple[tuple[int, ...], int]:
    """(top-k per stage, candidates kept): the options', else the drafter config's."""
    topk = topk or (cost.topk_per_stage if cost is not None else ())
    n_candidates = n_candidates or (cost.n_candidates if cost is not None else 0)
    if not topk or not n_candidates:
        raise UserError(
            "--topk and --candidates: needed (the drafter's config does not set top_k_tokens_per_head and n_candidates)"
        )
    if cost is not None and len(topk) > cost.stages:
        raise UserError(f"--topk: {len(topk)} stages, the drafter has {cost.stages}")
    return topk, n_candidates


def _draft_work(cost, shape, tree, topk):
    """(the merged tree's drafting, the candidate sequences' drafting): a sequential drafter's
    rows per stage, else Medusa-style heads, one per stage."""
    if cost is not None and cost.sequential:
        draft = DraftWork(cost, draft_rows_by_prefix(tree, cost.stages)[-1])
        return draft, DraftWork(cost, _rows(speculator_draft_rows(topk), cost.stages))
    heads = DraftHeadsShape(len(topk), cost.layers if cost else 1, shape.hidden, shape.vocab, tokens_per_sequence=1)
    return heads, heads


def _forms_table(grid) -> str:
    """Per batch (rows) and context (columns): both forms' speedups and the faster form."""
    cells = {}
    for (b, c), g in grid.groupby(["batch", "context"]):
        sp = dict(zip(g["form"], g["speedup"], strict=True))
        tree_s, cand_s = sp["prefix-tree"], sp["candidates"]
        pick = (
            "OOM"
            if not (np.isfinite(tree_s) or np.isfinite(cand_s))
            else "tree"
            if not np.isfinite(cand_s) or tree_s >= cand_s
            else "cand"
        )
        cells[(int(b), int(c))] = f"{tree_s:.2f}x / {cand_s:.2f}x -> {pick}"
    ctxs = sorted({c for _, c in cells})
    return text_table(
        ["batch"] + [str(c) for c in ctxs],
        [[b] + [cells[(b, c)] for c in ctxs] for b in sorted({b for b, _ in cells})],
    )
