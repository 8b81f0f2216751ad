"""A tree in the formats people paste it into (docs/trees.md#formats), and as readable text."""

from __future__ import annotations

import io
import json

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text
from rich.tree import Tree as RichTree

from treeopt.errors import UserError
from treeopt.fileio import dumps
from treeopt.tree import TREE_FORMAT, Tree, _node_str

FORMATS = ("text", "python", "json", "trtllm", "vllm")


def format_tree(
    tree: Tree,
    fmt: str,
    *,
    tau: float | None = None,
    method: str | None = None,
    provenance: dict | None = None,
    values: np.ndarray | None = None,
    ascii: bool = False,
) -> str:
    """The tree as `fmt`, ending in a newline.

    python: Medusa's list literal, insertion order. json: a treeopt.tree/v1 document.
    trtllm: the TensorRT-LLM `--medusa_choices="..."` argument. vllm: the
    `speculative_token_tree` string (tuples, canonical (depth, path) order, as vLLM sorts it).
    text: the tree drawn with each node's value (`values`, insertion order) and tau.
    """
    choices = tree.to_choices()
    if fmt == "python":
        return f"{choices}\n"
    if fmt == "trtllm":
        return f'--medusa_choices="{choices}"\n'
    if fmt == "vllm":
        return f"{list(tree.sorted_paths)}\n"
    if fmt == "json":
        doc = {
            "format": TREE_FORMAT,
            "medusa_choices": choices,
            "expected_tokens_per_step": tau,
            "method": method,
            "nodes": tree.size,
            "accuracy": provenance,
        }
        return compact_json(doc)
    if fmt == "text":
        return draw_tree(tree, tau=tau, values=values, ascii=ascii)
    raise UserError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")


def compact_json(doc: dict) -> str:
    """A JSON object with one key per line and compact values: a 63-node list stays one line."""
    body = ",\n".join(f" {json.dumps(k)}: {dumps(v)}" for k, v in doc.items())
    return "{\n" + body + "\n}\n"


class _AsciiText(io.StringIO):
    """A text buffer that tells rich it cannot encode box-drawing characters."""

    encoding = "ascii"


def render(renderable, *, ascii: bool = False, width: int = 200) -> str:
    """A rich renderable (tree, table) as plain text: no colour, no markup, no wrapping of
    long rows (`width`)."""
    buffer = _AsciiText() if ascii else io.StringIO()
    console = Console(
        file=buffer, width=width, color_system=None, force_terminal=False, highlight=False, emoji=False, soft_wrap=True
    )
    console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def draw_tree(tree: Tree, *, tau=None, values=None, ascii: bool = False) -> str:
    """The tree drawn with its children in rank order, each node with its value when given."""
    value_of = {} if values is None else dict(zip(tree.paths, np.asarray(values, dtype=float)))
    root = RichTree(Text("root" + (f"  (tau = {tau:.4f} expected tokens per step)" if tau is not None else "")))
    drawn = {(): root}
    for path in tree.sorted_paths:  # (depth, path) order: a parent before its children, siblings by rank
        label = _node_str(path) + (f"  {value_of[path]:.4f}" if path in value_of else "")
        drawn[path] = drawn[path[:-1]].add(Text(label))
    return render(root, ascii=ascii)


def text_table(columns, rows, *, title: str | None = None, ascii: bool = False) -> str:
    """Rows of already formatted cells as an aligned plain-text table; a column named with a
    leading '<' is left-aligned (the rest are right-aligned numbers)."""
    table = RichTable(
        box=box.ASCII if ascii else box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title, title_justify="left"
    )
    for name in columns:
        left = name.startswith("<")
        table.add_column(name.lstrip("<"), justify="left" if left else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    return render(table, ascii=ascii, width=1000)
