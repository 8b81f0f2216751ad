"""`treeopt build | show | buffers | compare`: trees from accuracy tables, and their buffers.

Options are parsed here rather than by click types so that every bad value ends as one
`treeopt: error:` line naming the option (click's own errors print a usage block).
"""

from __future__ import annotations

import contextlib
import json
import sys

import click
import numpy as np

from treeopt.cli import cli
from treeopt.cli.options import parse_int
from treeopt.errors import UserError

_BUILDERS = ("greedy", "optimal", "joint")


# ---------------------------------------------------------------------------------------------
# Option parsing and output


def _int_option(value, name: str, *, minimum: int) -> int | None:
    return None if value is None else parse_int(value, name, minimum=minimum)


def _children_option(value) -> list[int] | int | None:
    if value is None:
        return None
    parts = [p.strip() for p in str(value).split(",")]
    try:
        widths = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"--max-children: {value!r} is not a comma-separated list of integers") from None
    for w in widths:
        if w < 0:
            raise UserError(f"--max-children: {w} is negative")
    return widths[0] if len(widths) == 1 else widths


def _choice(value: str, name: str, choices) -> str:
    if value not in choices:
        raise UserError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return value


@contextlib.contextmanager
def _option_names():
    """Library errors name parameters (max_depth:); on the command line say --max-depth:."""
    try:
        yield
    except UserError as err:
        msg = str(err)
        for lib, opt in (("max_depth:", "--max-depth:"), ("max_children:", "--max-children:"), ("nodes:", "--nodes:")):
            if msg.startswith(lib):
                raise UserError(opt + msg[len(lib):]) from None
        raise


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
    from treeopt.fileio import write_text

    try:
        write_text(output, text)
    except OSError as err:
        raise UserError(f"{output}: cannot write: {err.strerror or err}") from None
    click.echo(f"treeopt: wrote {output}{what}", err=True)


def _load_table(path, csv_model):
    from treeopt.accuracy import load_accuracy

    if path is None:
        raise UserError("--accuracy FILE is required")
    return load_accuracy(path, model=csv_model)


def _table_label(table) -> str:
    prov = table.provenance
    label = prov.get("source", "accuracy table")
    if prov.get("model"):
        label += f" ({prov['model']})"
    return label


def _coverage_notes(tree, table) -> list[str]:
    from treeopt.accuracy import unmeasured_nodes

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


@cli.command("build")
@click.option("--accuracy", "accuracy_path", metavar="FILE",
              help="[required] Accuracy table: treeopt.accuracy/v1 JSON, per-rank matrix JSON, or cumulative top-k CSV.")
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV (e.g. vicuna-7b).")
@click.option("--nodes", metavar="N", help="[required] Tree size (tokens per step = N + 1).")
@click.option("--method", default="greedy", show_default=True, metavar="greedy|optimal|joint",
              help="Medusa's greedy, the exact optimum under independent heads, or the most frequent joint prefixes.")
@click.option("--max-depth", metavar="D", help="Deepest level (default: the number of heads).")
@click.option("--max-children", metavar="W[,W...]",
              help="Ranks allowed per depth (< W), one value for all depths or one per depth.")
@click.option("--format", "fmt", default="text", show_default=True, metavar="text|python|json|trtllm|vllm",
              help="Output format.")
@click.option("-o", "--output", metavar="FILE", help="Write to FILE instead of stdout.")
def build_cmd(accuracy_path, csv_model, nodes, method, max_depth, max_children, fmt, output):
    """Build a tree of N nodes from an accuracy table."""
    from treeopt.accuracy import expected_tokens, node_values
    from treeopt.build import build_tree
    from treeopt.export import FORMATS, format_tree

    method = _choice(method, "--method", _BUILDERS)
    fmt = _choice(fmt, "--format", FORMATS)
    if nodes is None:
        raise UserError("--nodes N is required")
    n = _int_option(nodes, "--nodes", minimum=1)
    depth = _int_option(max_depth, "--max-depth", minimum=1)
    widths = _children_option(max_children)
    table = _load_table(accuracy_path, csv_model)
    if method == "joint" and table.joint is None:
        raise UserError(f"{accuracy_path}: has no joint statistics, which --method joint needs")
    with _option_names():
        tree = build_tree(table, n, method, max_depth=depth, max_children=widths)
    joint = method == "joint"
    tau = expected_tokens(tree, table, joint=joint)
    if fmt != "text":
        text = format_tree(tree, fmt, tau=tau, method=method, provenance=table.provenance)
    else:
        tau_kind = "joint statistics" if joint else "independent heads"
        head = (
            f"{method} tree of {tree.size} nodes from {_table_label(table)}: depth {tree.depth}, "
            f"tau = {tau:.4f} expected tokens per step ({tau_kind})\n"
        )
        if table.joint is not None and not joint:
            head += f"tau under the table's joint statistics: {expected_tokens(tree, table, joint=True):.4f}\n"
        drawing = format_tree(
            tree, "text", tau=tau, values=node_values(tree, table, joint=joint),
            ascii=output is None and not _can_draw_unicode(),
        )
        text = head + drawing + f"medusa_choices = {tree.to_choices()}\n"
    _emit(text, output, f" ({tree.size} nodes, tau = {tau:.4f})")


@cli.command("show", short_help="Draw a tree with its statistics, and tau given --accuracy.")
@click.argument("tree_spec", metavar="TREE")
@click.option("--accuracy", "accuracy_path", metavar="FILE", help="Accuracy table for node values and tau.")
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV.")
@click.option("--topk", metavar="K", help="Check ranks against this candidate width.")
@click.option("--num-heads", metavar="K", help="Check depth against this number of heads.")
@click.option("--json", "as_json", is_flag=True, help="Statistics as JSON.")
def show_cmd(tree_spec, accuracy_path, csv_model, topk, num_heads, as_json):
    """Draw TREE (a reference name such as mc_sim_7b_63, a JSON file, or a list literal) with
    its statistics, and tau when an accuracy table is given."""
    from treeopt.accuracy import expected_tokens, node_values
    from treeopt.export import compact_json, draw_tree
    from treeopt.tree import load_tree

    tree = load_tree(
        tree_spec,
        topk=_int_option(topk, "--topk", minimum=1),
        num_heads=_int_option(num_heads, "--num-heads", minimum=1),
    )
    table = _load_table(accuracy_path, csv_model) if accuracy_path is not None else None
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


@cli.command("buffers", short_help="Medusa's verification buffers of a tree, as text or JSON.")
@click.argument("tree_spec", metavar="TREE")
@click.option("--topk", default="10", show_default=True, metavar="K", help="Candidates per head (TOPK).")
@click.option("--json", "as_json", is_flag=True, help="JSON: attention_mask, position_ids, tree_indices, retrieve_indices.")
@click.option("-o", "--output", metavar="FILE", help="Write to FILE instead of stdout.")
def buffers_cmd(tree_spec, topk, as_json, output):
    """Medusa's verification buffers for TREE (token 0 the root, nodes in (depth, path) order)."""
    from treeopt.tree import load_tree, tree_buffers

    k = _int_option(topk, "--topk", minimum=1)
    tree = load_tree(tree_spec, topk=k, allow_empty=True)
    buf = tree_buffers(tree, k)
    if as_json:
        text = json.dumps(buf.to_dict()) + "\n"
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


@cli.command("compare", short_help="tau of several trees under one accuracy table, side by side.")
@click.argument("tree_specs", metavar="TREE...", nargs=-1)
@click.option("--accuracy", "accuracy_path", metavar="FILE", help="[required] Accuracy table used for every tree.")
@click.option("--csv-model", metavar="NAME", help="Row set of a multi-model CSV.")
@click.option("--nodes", metavar="N",
              help="Truncate each tree to its first N nodes; size of the trees built by greedy/optimal/joint.")
@click.option("--json", "as_json", is_flag=True, help="The comparison as JSON.")
def compare_cmd(tree_specs, accuracy_path, csv_model, nodes, as_json):
    """tau of each TREE under one accuracy table, side by side.

    TREE is a reference name (mc_sim_7b_63, ...), a JSON file, a list literal, or one of
    greedy, optimal, joint: the tree that builder makes from the table with --nodes N.
    """
    from treeopt.accuracy import expected_tokens
    from treeopt.build import build_tree
    from treeopt.tree import load_tree

    if not tree_specs:
        raise UserError("TREE: give at least one tree to compare")
    n = _int_option(nodes, "--nodes", minimum=1)
    table = _load_table(accuracy_path, csv_model)
    trees = []
    for spec in tree_specs:
        if spec in _BUILDERS and not _is_file(spec):
            if n is None:
                raise UserError(f"TREE {spec}: building a tree for comparison needs --nodes N")
            if spec == "joint" and table.joint is None:
                raise UserError(f"{accuracy_path}: has no joint statistics, which TREE joint needs")
            with _option_names():
                trees.append(build_tree(table, n, spec))
            continue
        tree = load_tree(spec)
        if n is not None and tree.size > n:
            tree = tree.prefix(n)
        trees.append(tree)
    rows, notes = [], []
    for tree in trees:
        row = {
            "tree": tree.name,
            "nodes": tree.size,
            "depth": tree.depth,
            "leaves": tree.num_leaves,
            "tau": expected_tokens(tree, table, strict=False),
        }
        if table.joint is not None:
            row["tau_joint"] = expected_tokens(tree, table, joint=True, strict=False)
        rows.append(row)
        notes += _coverage_notes(tree, table)
    if as_json:
        doc = {"accuracy": table.provenance, "trees": rows, "notes": [x.removeprefix("note: ") for x in notes]}
        click.echo(json.dumps(doc, indent=1))
        return
    name_w = max(4, *(len(_display_name(r["tree"])) for r in rows))
    cols = ["nodes", "depth", "leaves", "tau"] + (["tau_joint"] if table.joint is not None else [])
    lines = [
        f"accuracy: {_table_label(table)}: {table.num_heads} heads, width {table.width}; "
        "tau = expected tokens per step" + (" (independent heads; tau_joint from joint statistics)"
                                            if table.joint is not None else " (independent heads)"),
        f"{'tree':<{name_w}}" + "".join(f"{c:>10}" for c in cols),
    ]
    for r in rows:
        cells = "".join(f"{r[c]:>10.4f}" if c.startswith("tau") else f"{r[c]:>10}" for c in cols)
        lines.append(f"{_display_name(r['tree']):<{name_w}}" + cells)
    click.echo("\n".join(lines + notes))


def _is_file(spec: str) -> bool:
    from pathlib import Path

    return Path(spec).is_file()
