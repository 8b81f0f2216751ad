"""A tree in the formats people paste it into (DESIGN section 2), and as readable text."""

from __future__ import annotations

import json

import numpy as np

from treeopt.errors import UserError
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
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items())
    return "{\n" + body + "\n}\n"


def draw_tree(tree: Tree, *, tau=None, values=None, ascii: bool = False) -> str:
    """Indented drawing, children in rank order, each node with its value when given."""
    tee, last, bar, gap = ("|- ", "`- ", "|  ", "   ") if ascii else ("├─ ", "└─ ", "│  ", "   ")
    value_of = {} if values is None else dict(zip(tree.paths, np.asarray(values, dtype=float)))
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for p in tree.sorted_paths:
        children.setdefault(p[:-1], []).append(p)
    lines = ["root" + (f"  (tau = {tau:.4f} expected tokens per step)" if tau is not None else "")]
    # Explicit stack, not recursion: depth is small but trees can be wide.
    stack = [(c, "", i == len(children.get((), [])) - 1) for i, c in enumerate(children.get((), []))][::-1]
    while stack:
        path, indent, is_last = stack.pop()
        label = _node_str(path)
        if path in value_of:
            label += f"  {value_of[path]:.4f}"
        lines.append(indent + (last if is_last else tee) + label)
        kids = children.get(path, [])
        sub = indent + (gap if is_last else bar)
        stack.extend([(c, sub, i == len(kids) - 1) for i, c in enumerate(kids)][::-1])
    return "\n".join(lines) + "\n"
