"""The tree-level calls of `treeopt.api` (build, tau, engine check and export): numpy and the
core only, so that the tree commands (`build`, `show`, `buffers`, `check`, `compare`) answer in
milliseconds without loading pandas, scipy or torch (docs/architecture.md#code-shape).
`treeopt.api` re-exports every name here; import them from `treeopt`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.accuracy import expected_tokens as _expected_tokens
from treeopt.build import build_tree as _build_tree
from treeopt.engines import EngineCheck, EngineExport, eagle_draft, engine_for_drafter, export_for, get_engine
from treeopt.engines import check as _check
from treeopt.errors import UserError
from treeopt.family_build import build_for_engine
from treeopt.tree import Tree, load_tree, make_tree

__all__ = ["EngineCheck", "build_tree", "check", "engine_for_table", "expected_tokens", "export_tree", "serving_engine"]


def _table(accuracy) -> AccuracyTable:
    return accuracy if isinstance(accuracy, AccuracyTable) else load_accuracy(accuracy)


def _tree(tree) -> Tree:
    return tree if isinstance(tree, Tree) else load_tree(tree) if isinstance(tree, str) else make_tree(tree)


def engine_for_table(engine: str, table: AccuracyTable | None, *, note=None) -> str | None:
    """The engine whose line serves the drafter `table` was measured from, when `engine` was
    asked for (`treeopt.engines.engine_for_drafter`): vLLM serves Medusa heads, an MLP
    speculator or a draft model only as a top-1 chain, SGLang none of the heads; `note(line)`
    gets the one line saying so. None: that engine cannot serve this drafter at all. A table
    that does not name its drafter leaves `engine` as asked."""
    kind = table.drafter if table is not None else None
    if kind is None:
        return engine
    target, why = engine_for_drafter(engine, kind)
    if why is not None and note is not None:
        note(why)
    return target


def serving_engine(engine: str, table: AccuracyTable | None, *, note=None) -> str:
    """`engine_for_table`, with an engine that cannot serve the table's drafter at all refused in
    one line: the one rule build, check, export, speedup, report and run share
    (docs/engines.md#drafters-and-engines)."""
    lines: list[str] = []
    target = engine_for_table(engine, table, note=lines.append)
    if target is None:
        raise UserError(lines[0])
    if note is not None:
        for line in lines:
            note(line)
    return target


def build_tree(
    accuracy: AccuracyTable | str | Path,
    nodes: int,
    *,
    method: str = "greedy",
    engine: str | None = None,
    heads: int | None = None,
    max_depth: int | None = None,
    max_children: int | list[int] | None = None,
) -> Tree:
    """The `method` tree ("greedy": Medusa's; "optimal": the exact optimum under independent
    heads; "joint": the most frequent joint prefixes) of `nodes` nodes from an accuracy table.

    `engine` (a name of `treeopt.engines.ENGINE_NAMES`): search only the trees that engine drafts
    as written, with `heads` draft heads (default: the table's); its family sets the limits, so
    `max_depth` and `max_children` (ranks < W, one value or one per depth) go without it."""
    table = _table(accuracy)
    if engine is None:
        if heads is not None:
            raise UserError("heads: only meaningful with an engine (the draft heads it runs)")
        return _build_tree(table, nodes, method, max_depth=max_depth, max_children=max_children)
    if max_depth is not None or max_children is not None:
        raise UserError("--engine: the engine's family sets the limits; leave out --max-depth/--max-children")
    return build_for_engine(table, nodes, method, get_engine(serving_engine(engine, table)), heads=heads)


def expected_tokens(tree: Tree | str | list, accuracy: AccuracyTable | str | Path, *, joint: bool = False) -> float:
    """Expected tokens per step of `tree` under the table (joint: its joint prefix counts).
    Nodes the table did not measure (deeper than its heads, ranks past its width) count as never
    accepted."""
    return _expected_tokens(_tree(tree), _table(accuracy), joint=joint, strict=False)


def check(
    tree: Tree | str | list,
    engine: str,
    *,
    accuracy: AccuracyTable | str | Path | None = None,
    heads: int | None = None,
    topk: int | None = None,
) -> EngineCheck:
    """Whether `engine` drafts `tree` as written (docs/engines.md); if not, what it drafts.
    `heads`: the draft heads the engine runs (default: the table's, else unbounded); `topk`:
    candidates per head of treeopt's own decoder. SGLang needs `accuracy`."""
    tree = _tree(tree)
    table = _table(accuracy) if accuracy is not None else None
    target = get_engine(engine, topk=topk)
    heads = heads or (table.num_heads if table is not None else None)
    result = _check(tree, target, heads=heads, accuracy=table.accuracy if table is not None else None)
    if table is None:
        return result
    return replace(
        result,
        tau=_expected_tokens(tree, table, strict=False),
        tau_drafted=_expected_tokens(result.drafted, table, strict=False),
    )


def export_tree(
    tree: Tree | str | list,
    engine: str,
    *,
    accuracy: AccuracyTable | str | Path | None = None,
    heads: int | None = None,
) -> EngineExport:
    """What `engine` takes for `tree` (docs/engines.md#exports): `.line`, one line to paste
    (the flag or config), and `.text`, everything (TensorRT-LLM adds its LLM-API config).
    `heads`: the checkpoint's draft heads (default: the table's, else the tree's depth); SGLang
    needs `accuracy`. A tree the engine does not draft as written is refused: build it with
    `engine=` instead."""
    tree = _tree(tree)
    table = _table(accuracy) if accuracy is not None else None
    target = get_engine(engine)
    heads = heads or (table.num_heads if table is not None else None)
    acc = table.accuracy if table is not None else None
    drafted = _check(tree, target, heads=heads, accuracy=acc)
    if not drafted.as_written:
        raise UserError(
            f"--engine {target.name}: {tree.name}: not drafted as written ({drafted.reason}); "
            f"build it with --engine {target.name}"
        )
    return export_for(target, tree, heads=heads, accuracy=acc, drafter=eagle_draft(table))
