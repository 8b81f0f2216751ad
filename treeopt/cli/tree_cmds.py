"""`treeopt build | show | buffers | compare | check`: trees from accuracy tables, their buffers
and what each engine drafts. numpy and the core only: no pandas, scipy or torch is loaded, so each
answers in milliseconds (`select` is in select_cmds)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np

from treeopt import tree_api as api
from treeopt.accuracy import expected_tokens, load_accuracy, node_values, unmeasured_nodes
from treeopt.build import METHODS, build_tree
from treeopt.cli.options import OLD_HEADS_OPTION, TOPK, AtLeast
from treeopt.cli.safety import check_outputs, input_files
from treeopt.drafter_cost import MAX_HEADS
from treeopt.engines import ENGINE_NAMES, check, get_engine
from treeopt.errors import UserError
from treeopt.export import FORMATS, compact_json, draw_tree, format_tree, text_table
from treeopt.family_build import build_for_engine
from treeopt.fileio import dumps, write_text
from treeopt.tree import Tree, load_tree, tree_buffers


class Widths(click.ParamType):
    """--max-children: one width for every depth, or one per depth ('3' or '4,2,1')."""

    name = "widths"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, list)):
            return value
        try:
            widths = [int(p.strip()) for p in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        for w in widths:
            if w < 0:
                self.fail(f"{w} is negative", param, ctx)
        return widths[0] if len(widths) == 1 else widths


def _can_draw_unicode() -> bool:
    try:
        "├└│─".encode(sys.stdout.encoding or "ascii")
        return True
    except (UnicodeEncodeError, LookupError):
        return False


def _emit(text: str, output: str | None, what: str = "") -> None:
    """stdout, or an atomic write to `output` (nothing is left behind on failure)."""
    if output is None:
        click.echo(text, nl=False)
        return
    write_output(output, lambda: write_text(output, text))
    click.echo(f"treeopt: wrote {output}{what}", err=True)


def write_output(output, write) -> None:
    """`write()`, with a failure of the file system (full disk, a folder removed meanwhile) as
    one line naming the output."""
    try:
        write()
    except OSError as err:
        raise UserError(f"{output}: cannot write: {err.strerror or err}") from None


def load_table(path, csv_model):
    if path is None:
        raise UserError("--accuracy FILE is required")
    return load_accuracy(path, model=csv_model)


def engine_serving_table(engine: str | None, table) -> tuple[str | None, list[str]]:
    """The engine that serves the table's drafter (`tree_api.engine_for_table`) and the notes
    that say so, for stderr once the command's work has succeeded (a bad input stays one line);
    an engine that cannot serve the drafter at all is an error."""
    if engine is None:
        return None, []
    notes: list[str] = []
    served = api.engine_for_table(engine, table, note=notes.append)
    if served is None:
        raise UserError(notes[0])
    return served, notes


def echo_notes(notes: list[str]) -> None:
    for line in notes:
        click.echo(f"note: {line}", err=True)


def _table_label(table) -> str:
    prov = table.provenance
    label = prov.get("source", "accuracy table")
    if prov.get("model"):
        label += f" ({prov['model']})"
    return label


def _coverage_notes(tree, table) -> list[str]:
    deep, wide = unmeasured_nodes(tree, table.num_heads, table.width)
    notes = []
    if wide:
        notes.append(
            f"note: {tree.name}: {wide} node(s) use a rank >= the table's width {table.width}: "
            "unmeasured, counted as never accepted"
        )
    if deep:
        notes.append(
            f"note: {tree.name}: {deep} node(s) are deeper than the table's {table.num_heads} heads: "
            "unmeasured, counted as never accepted"
        )
    return notes


def _stats(tree) -> dict:
    return {
        "size": tree.size,
        "depth": tree.depth,
        "depth_histogram": list(tree.depth_histogram),
        "max_rank_per_depth": list(tree.max_rank_per_depth),
        "leaves": tree.num_leaves,
    }


def _display_name(name: str, width: int = 28) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Commands


@click.command("build")
@click.option(
    "--accuracy",
    "accuracy_path",
    metavar="FILE",
    help="[required] Accuracy table: treeopt.accuracy/v1 JSON, per-rank matrix JSON, or cumulative top-k CSV.",
)
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV (e.g. vicuna-7b).")
@click.option(
    "--nodes", metavar="N", type=AtLeast(1), help="[required without --tree] Tree size (tokens per step = N + 1)."
)
@click.option(
    "--tree",
    "tree_spec",
    metavar="TREE",
    help="Re-export this tree instead of building one (a reference name, a JSON file, a list literal, "
    "or a selection cell such as selection.json:batch=8,context=1024 or selection.json:mix).",
)
@click.option(
    "--method",
    default="greedy",
    show_default=True,
    type=click.Choice(METHODS),
    help="Medusa's greedy, the exact optimum under independent heads, or the most frequent joint prefixes.",
)
@click.option("--max-depth", metavar="D", type=AtLeast(1), help="Deepest level (default: the number of heads).")
@click.option(
    "--max-children",
    metavar="W[,W...]",
    type=Widths(),
    help="Ranks allowed per depth (< W), one value for all depths or one per depth.",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Search only the trees this engine drafts as written, and end with the line it takes.",
)
@click.option(
    "--num-heads",
    "engine_heads",
    metavar="K",
    type=AtLeast(1, MAX_HEADS),
    default=None,
    help="With --engine: the draft heads the engine runs [default: the table's].",
)
@OLD_HEADS_OPTION
@click.option(
    "--format",
    "fmt",
    default="text",
    show_default=True,
    type=click.Choice(FORMATS + ("engine",)),
    help="Output format; 'engine': only what --engine takes.",
)
@click.option("-o", "--output", metavar="FILE", help="Write to FILE instead of stdout.")
def build_cmd(
    accuracy_path, csv_model, nodes, tree_spec, method, max_depth, max_children, engine, engine_heads, fmt, output
):
    """Build a tree of N nodes from an accuracy table (or, with --tree, write a given tree in
    another format)."""
    check_outputs([output], input_files(accuracy_path, tree_spec))
    if tree_spec is not None:
        _export_given_tree(tree_spec, accuracy_path, csv_model, nodes, fmt, output)
        return
    if nodes is None:
        raise UserError("--nodes N is required (or give --tree TREE to re-export a tree)")
    table = load_table(accuracy_path, csv_model)
    if method == "joint" and table.joint is None:
        raise UserError(f"{accuracy_path}: has no joint statistics, which --method joint needs")
    if engine is None and (fmt == "engine" or engine_heads is not None):
        raise UserError("--format engine and --num-heads need --engine E")
    engine, notes = engine_serving_table(engine, table)
    target = get_engine(engine) if engine else None
    tree = api.build_tree(
        table, nodes, method=method, engine=engine, heads=engine_heads, max_depth=max_depth, max_children=max_children
    )
    joint = method == "joint"
    tau = expected_tokens(tree, table, joint=joint)
    paste = api.export_tree(tree, engine, accuracy=table, heads=engine_heads) if target is not None else None
    if fmt == "engine":
        text = paste.text
    elif fmt != "text":
        text = format_tree(tree, fmt, tau=tau, method=method, provenance=table.provenance)
    else:
        tau_kind = "joint statistics" if joint else "independent heads"
        family = f" within {target.name}'s family" if target is not None else ""
        head = (
            f"{method} tree of {tree.size} nodes{family} from {_table_label(table)}: depth {tree.depth}, "
            f"tau = {tau:.4f} expected tokens per step ({tau_kind})\n"
        )
        if table.joint is not None and not joint:
            head += f"tau under the table's joint statistics: {expected_tokens(tree, table, joint=True):.4f}\n"
        drawing = format_tree(
            tree,
            "text",
            tau=tau,
            values=node_values(tree, table, joint=joint),
            ascii=output is None and not _can_draw_unicode(),
        )
        if paste is None:
            text = head + drawing + f"medusa_choices = {tree.to_choices()}\n"
        else:
            text = head + drawing + f"for {target.title}:\n" + paste.text
    echo_notes(notes)
    _emit(text, output, f" ({tree.size} nodes, tau = {tau:.4f})")


def _export_given_tree(tree_spec, accuracy_path, csv_model, nodes, fmt, output):
    """`build --tree`: the tree as given (cut to --nodes), with tau when a table is given."""
    tree = load_tree(tree_spec)
    if nodes is not None and tree.size > nodes:
        tree = tree.prefix(nodes)
    table = load_table(accuracy_path, csv_model) if accuracy_path is not None else None
    tau = expected_tokens(tree, table, strict=False) if table is not None else None
    if fmt != "text":
        text = format_tree(tree, fmt, tau=tau, provenance=table.provenance if table is not None else None)
    else:
        values = node_values(tree, table, strict=False) if table is not None else None
        head = (
            f"{tree.name}: {tree.size} nodes, depth {tree.depth}"
            + (
                f", tau = {tau:.4f} expected tokens per step ({_table_label(table)}, independent heads)"
                if tau is not None
                else ""
            )
            + "\n"
        )
        text = (
            head
            + format_tree(tree, "text", tau=tau, values=values, ascii=output is None and not _can_draw_unicode())
            + f"medusa_choices = {tree.to_choices()}\n"
        )
    _emit(text, output, f" ({tree.size} nodes)")


@click.command("show")
@click.argument("tree_spec", metavar="TREE")
@click.option("--accuracy", "accuracy_path", metavar="FILE", help="Accuracy table for node values and tau.")
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV.")
@click.option("--topk", metavar="K", type=TOPK, help="Check ranks against this candidate width.")
@click.option("--num-heads", metavar="K", type=AtLeast(1, MAX_HEADS), help="Check depth against this number of heads.")
@click.option("--json", "as_json", is_flag=True, help="Statistics as JSON.")
def show_cmd(tree_spec, accuracy_path, csv_model, topk, num_heads, as_json):
    """Draw TREE (a reference name such as mc_sim_7b_63, a JSON file, or a list literal) with
    its statistics, and tau when an accuracy table is given."""
    tree = load_tree(tree_spec, topk=topk, num_heads=num_heads)
    table = load_table(accuracy_path, csv_model) if accuracy_path is not None else None
    if table is None and csv_model is not None:
        raise UserError("--csv-model: only meaningful with --accuracy")
    tau = tau_joint = values = None
    notes = []
    if table is not None:
        values = node_values(tree, table, strict=False)
        tau = 1.0 + float(values.sum())
        if table.joint is not None:
            tau_joint = expected_tokens(tree, table, joint=True, strict=False)
        notes = _coverage_notes(tree, table)
    if as_json:
        doc = {"name": tree.name, "medusa_choices": tree.to_choices(), **_stats(tree)}
        if table is not None:
            doc["expected_tokens_per_step"] = tau
            doc["expected_tokens_per_step_joint"] = tau_joint
            doc["accuracy"] = table.provenance
            doc["notes"] = [n.removeprefix("note: ") for n in notes]
        click.echo(compact_json(doc), nl=False)
        return
    s = _stats(tree)
    lines = [
        f"{tree.name}: {s['size']} nodes ({s['size'] + 1} tokens per step), depth {s['depth']}, {s['leaves']} leaves",
        f"nodes per depth:    {', '.join(map(str, s['depth_histogram'])) or '-'}",
        f"max rank per depth: {', '.join(map(str, s['max_rank_per_depth'])) or '-'}",
    ]
    if table is not None:
        lines.append(f"tau = {tau:.4f} expected tokens per step ({_table_label(table)}, independent heads)")
        if tau_joint is not None:
            lines.append(f"tau = {tau_joint:.4f} under the table's joint statistics")
        lines += notes
    click.echo("\n".join(lines))
    click.echo(draw_tree(tree, tau=tau, values=values, ascii=not _can_draw_unicode()), nl=False)


@click.command("buffers")
@click.argument("tree_spec", metavar="TREE")
@click.option("--topk", default=10, show_default=True, metavar="K", type=TOPK, help="Candidates per head (TOPK).")
@click.option(
    "--json", "as_json", is_flag=True, help="JSON: attention_mask, position_ids, tree_indices, retrieve_indices."
)
@click.option("-o", "--output", metavar="FILE", help="Write to FILE instead of stdout.")
def buffers_cmd(tree_spec, topk, as_json, output):
    """Medusa's verification buffers for TREE (token 0 the root, nodes in (depth, path) order)."""
    check_outputs([output], input_files(tree_spec))
    k = topk
    tree = load_tree(tree_spec, topk=k, allow_empty=True)
    buf = tree_buffers(tree, k)
    if as_json:
        text = dumps(buf.to_dict()) + "\n"
    else:
        with np.printoptions(threshold=sys.maxsize, linewidth=200):
            text = (
                f"{tree.name}: {tree.size} nodes, q = {tree.size + 1} tokens, topk = {k}\n"
                f"tree_indices     {buf.tree_indices}\n"
                f"position_ids     {buf.position_ids}\n"
                f"retrieve_indices ({buf.retrieve_indices.shape[0]} leaves x {buf.retrieve_indices.shape[1]})\n"
                f"{buf.retrieve_indices}\n"
                f"attention_mask ({buf.attention_mask.shape[0]} x {buf.attention_mask.shape[1]}, 1 = attends)\n"
                + "\n".join("".join("1" if x else "." for x in row) for row in buf.attention_mask)
                + "\n"
            )
    _emit(text, output)


@click.command("compare")
@click.argument("tree_specs", metavar="TREE...", nargs=-1)
@click.option("--accuracy", "accuracy_path", metavar="FILE", help="[required] Accuracy table used for every tree.")
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV.")
@click.option(
    "--nodes",
    metavar="N",
    type=AtLeast(1),
    help="Truncate each tree to its first N nodes; size of the trees built by greedy/optimal/joint.",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Build greedy/optimal/joint within this engine's family; add what it drafts of each tree.",
)
@click.option("--json", "as_json", is_flag=True, help="The comparison as JSON.")
def compare_cmd(tree_specs, accuracy_path, csv_model, nodes, engine, as_json):
    """tau of each TREE under one accuracy table, side by side.

    TREE is a reference name (mc_sim_7b_63, ...), a JSON file, a list literal, or one of
    greedy, optimal, joint: the tree that builder makes from the table with --nodes N.
    """
    if not tree_specs:
        raise UserError("TREE: give at least one tree to compare")
    table = load_table(accuracy_path, csv_model)
    target = get_engine(engine) if engine else None
    trees = [_compared_tree(spec, table, nodes, target, accuracy_path) for spec in tree_specs]
    rows, notes = [], []
    for tree in trees:
        rows.append(_compare_row(tree, table, target))
        notes += _coverage_notes(tree, table)
    if as_json:
        doc = {"accuracy": table.provenance, "trees": rows, "notes": [x.removeprefix("note: ") for x in notes]}
        click.echo(dumps(doc, indent=1))
        return
    cols = ["nodes", "depth", "leaves", "tau"] + (["tau_joint"] if table.joint is not None else [])
    if target is not None:
        cols += ["as_written", "drafted", "tau_drafted"]
    click.echo(
        f"accuracy: {_table_label(table)}: {table.num_heads} heads, width {table.width}; "
        "tau = expected tokens per step"
        + (
            " (independent heads; tau_joint from joint statistics)"
            if table.joint is not None
            else " (independent heads)"
        )
        + (f"; as_written, drafted, tau_drafted: what {target.name} drafts" if target is not None else "")
    )
    click.echo(
        text_table(
            ["<tree"] + cols,
            [[_display_name(r["tree"])] + [f"{r[c]:.4f}" if c.startswith("tau") else r[c] for c in cols] for r in rows],
            ascii=not _can_draw_unicode(),
        ),
        nl=False,
    )
    if notes:
        click.echo("\n".join(notes))


def _compared_tree(spec: str, table, nodes: int | None, target, accuracy_path) -> Tree:
    """A TREE of `treeopt compare`: built by the builder it names (within `target`'s family),
    or read and cut to its first `nodes` nodes."""
    if spec in METHODS and not Path(spec).is_file():
        if nodes is None:
            raise UserError(f"TREE {spec}: building a tree for comparison needs --nodes N")
        if spec == "joint" and table.joint is None:
            raise UserError(f"{accuracy_path}: has no joint statistics, which TREE joint needs")
        return build_for_engine(table, nodes, spec, target) if target else build_tree(table, nodes, spec)
    tree = load_tree(spec)
    return tree.prefix(nodes) if nodes is not None and tree.size > nodes else tree


def _compare_row(tree: Tree, table, target) -> dict:
    """One row of `treeopt compare`: the tree's shape and tau, and what `target` drafts of it."""
    row = {
        "tree": tree.name,
        "nodes": tree.size,
        "depth": tree.depth,
        "leaves": tree.num_leaves,
        "tau": expected_tokens(tree, table, strict=False),
    }
    if table.joint is not None:
        row["tau_joint"] = expected_tokens(tree, table, joint=True, strict=False)
    if target is not None:
        drafted = check(tree, target, heads=table.num_heads, accuracy=table.accuracy)
        row["as_written"] = "yes" if drafted.as_written else ("refused" if drafted.refused else "no")
        row["drafted"] = drafted.drafted.size
        row["tau_drafted"] = expected_tokens(drafted.drafted, table, strict=False)
    return row


@click.command("check")
@click.argument("tree_spec", metavar="TREE")
@click.option("--engine", required=True, type=click.Choice(ENGINE_NAMES), help="The engine that gets the tree.")
@click.option(
    "--accuracy",
    "accuracy_path",
    metavar="FILE",
    help="Accuracy table: tau of the tree and of what the engine drafts (SGLang needs it).",
)
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV.")
@click.option(
    "--num-heads",
    "engine_heads",
    metavar="K",
    type=AtLeast(1, MAX_HEADS),
    default=None,
    help="Draft heads the engine runs [default: the table's, else unbounded].",
)
@OLD_HEADS_OPTION
@click.option("--topk", metavar="K", type=TOPK, default=None, help="treeopt's decoder: candidates per head.")
@click.option("--json", "as_json", is_flag=True, help="The answer as JSON.")
def check_cmd(tree_spec, engine, accuracy_path, csv_model, engine_heads, topk, as_json):
    """Whether ENGINE drafts TREE as written; if not, what it drafts instead, with tau of both."""
    tree = load_tree(tree_spec)
    table = load_table(accuracy_path, csv_model) if accuracy_path is not None else None
    if table is None and csv_model is not None:
        raise UserError("--csv-model: only meaningful with --accuracy")
    engine, notes = engine_serving_table(engine, table)
    result = api.check(tree, engine, accuracy=table, heads=engine_heads, topk=topk)
    target = get_engine(engine, topk=topk)
    paste = None
    if result.as_written:
        paste = api.export_tree(tree, engine, accuracy=table, heads=engine_heads)
    echo_notes(notes)
    if as_json:
        doc = result.to_dict()
        if table is None:
            del doc["tau"], doc["tau_drafted"]
        sglang = doc.pop("sglang_flags")
        doc["paste"] = paste.line if paste else None
        if sglang is not None:
            doc["sglang_flags"] = sglang
        click.echo(compact_json(doc), nl=False)
        return
    verdict = (
        "drafts it as written"
        if result.as_written
        else "refuses it"
        if result.refused
        else "does NOT draft it as written"
    )
    lines = [f"{tree.name}: {tree.size} nodes; {target.title} {verdict}", f"  {result.reason}"]
    if target.note:  # what this release does with the line (docs/engines.md#releases)
        lines.append(f"  {target.note}")
    if not result.as_written:
        lines.append(f"  drafted instead: {result.drafted.size} nodes {result.drafted.to_choices()}")
    if table is not None:
        lines.append(
            f"  tau = {result.tau:.4f} as written, {result.tau_drafted:.4f} as drafted "
            f"({_table_label(table)}, independent heads)"
        )
    if paste is not None:
        lines.append(paste.text.rstrip("\n"))
    click.echo("\n".join(lines))
