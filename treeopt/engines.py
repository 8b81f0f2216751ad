"""Serving engines as targets: which trees each one drafts as written, what it drafts instead,
and the line a user pastes into it (docs/engines.md).

A static tree is only worth what the engine really drafts. Each `Engine` names its family of
trees (`family`):

- "static": the engine takes `medusa_choices` as written, within its limits: ranks below
  `rank_limit`, depth at most `depth_limit` and the draft heads, siblings left-closed (ranks
  0..c-1) at depths up to `left_closed_depth`, and, when `grounded`, only the first children
  of a node expanded (docs/engines.md#hydra).
- "uniform": vLLM's EAGLE proposer gives every node of level l-1 the same number of children,
  always the top ranks (docs/engines.md#vllm).
- "beam": SGLang builds its tree each step from three numbers (docs/engines.md#sglang).

`verification` is how the engine checks a draft: "tree" (one tree-attention pass over the
drafted nodes) for every engine here; "candidates" is kept for engines that verify flat
candidate sequences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from treeopt.errors import UserError
from treeopt.tree import Tree, _node_str

__all__ = [
    "Engine",
    "EngineDraft",
    "ENGINES",
    "ENGINE_NAMES",
    "get_engine",
    "check",
    "uniform_tree",
    "child_counts",
    "sglang_candidates",
    "sglang_tree",
    "sglang_pool_size",
    "sglang_triple_for",
    "export_for",
    "EngineExport",
]

GROUNDED_ALL_DEPTHS = 1 << 30  # left-closed at every depth


@dataclass(frozen=True)
class Engine:
    """One engine code path and the family of trees it drafts as written.

    rank_limit: ranks must be < this (None: only the accuracy table's width bounds them).
    depth_limit: depth must be <= this besides the number of draft heads (None: heads only).
    left_closed_depth: at depths 1..left_closed_depth the children of a node are ranks 0..c-1.
    grounded: the children of a node that have children of their own are ranks 0..e-1.
    max_children: uniform family only: the most children per node (1 for top-1 chains).
    """

    name: str
    title: str
    family: str  # "static", "uniform" or "beam"
    export_kind: str
    rank_limit: int | None = None
    depth_limit: int | None = None
    left_closed_depth: int = 0
    grounded: bool = False
    max_children: int | None = None
    verification: str = "tree"
    method_name: str = ""  # vLLM's --speculative-config "method"

    def depth_bound(self, heads: int | None) -> int | None:
        """The deepest level a tree may use with `heads` draft heads."""
        bounds = [b for b in (self.depth_limit, heads) if b is not None]
        return min(bounds) if bounds else None

    def width_bound(self, width: int | None) -> int | None:
        """The ranks a tree may use (< this) with an accuracy table `width` ranks wide."""
        bounds = [b for b in (self.rank_limit, self.max_children, width) if b is not None]
        return min(bounds) if bounds else None


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        # why (docs/engines.md#medusa-reference-code): TOPK = 10 indexes the candidates by rank
        Engine("medusa", "Medusa reference code (medusa_choices, TOPK = 10)", "static", "medusa", rank_limit=10),
        # why (docs/engines.md#tensorrt-llm): C++ runtime ranks <= 15, depth <= 16; Python runtime
        # drafts depth-1 ranks 0..k-1
        Engine(
            "trtllm",
            "TensorRT-LLM Medusa (--medusa_choices, LLM API speculative_config)",
            "static",
            "trtllm",
            rank_limit=16,
            depth_limit=16,
            left_closed_depth=1,
        ),
        # why (docs/engines.md#vllm): the EAGLE proposer's speculative_token_tree
        Engine(
            "vllm",
            "vLLM EAGLE-family proposer (--speculative-config speculative_token_tree)",
            "uniform",
            "vllm",
            method_name="eagle",
        ),
        # why (docs/engines.md#vllm): its Medusa path drafts the top-1 chain only
        Engine(
            "vllm-medusa",
            "vLLM Medusa proposer (top-1 chain, num_speculative_tokens)",
            "uniform",
            "vllm",
            max_children=1,
            method_name="medusa",
        ),
        # why (docs/engines.md#sglang): no static tree, three flags
        Engine("sglang", "SGLang EAGLE (--speculative-num-steps/-eagle-topk/-num-draft-tokens)", "beam", "sglang"),
        Engine("treeopt", "treeopt's reference decoder (any tree within heads and topk)", "static", "python"),
        # why (docs/engines.md#hydra): grounded heads expand only the first children of a node
        Engine(
            "hydra",
            "Hydra grounded (sequentially dependent) heads",
            "static",
            "python",
            left_closed_depth=GROUNDED_ALL_DEPTHS,
            grounded=True,
        ),
    )
}
ENGINE_NAMES = tuple(ENGINES)


def get_engine(name: str, *, topk: int | None = None) -> Engine:
    """The engine named `name`; `topk` bounds the ranks of treeopt's own decoder."""
    if name not in ENGINES:
        raise UserError(f"--engine: {name!r} is not one of {', '.join(ENGINE_NAMES)}")
    engine = ENGINES[name]
    if name == "treeopt" and topk is not None:
        engine = Engine(**{**engine.__dict__, "rank_limit": int(topk)})
    return engine


@dataclass(frozen=True)
class EngineDraft:
    """What `engine` does with `tree`: drafts it as written, or drafts `drafted` instead (or
    refuses it: `refused`), for the reason given."""

    engine: str
    tree: Tree
    drafted: Tree
    as_written: bool
    refused: bool
    reason: str
    triple: tuple[int, int, int] | None = None  # SGLang: (steps, topk, num_draft_tokens)


# ---------------------------------------------------------------------------------------------
# Family members


def uniform_tree(counts, name: str = "uniform") -> Tree:
    """The tree in which every node of level l-1 has counts[l-1] children, ranks 0..c-1
    (vLLM's drafting rule, docs/engines.md#vllm), in (depth, path) order."""
    counts = [int(c) for c in counts]
    level: list[tuple[int, ...]] = [()]
    paths: list[tuple[int, ...]] = []
    for c in counts:
        level = [p + (r,) for p in level for r in range(c)]
        paths += level
    return Tree(tuple(paths), name=name)


def child_counts(tree: Tree) -> tuple[int, ...]:
    """vLLM's children per node of each level: n_l // n_{l-1}, with n_0 = 1 (the root), over the
    levels up to the depth of the last node in (depth, path) order."""
    hist = np.asarray(tree.depth_histogram, dtype=np.int64)
    if hist.size == 0:
        return ()
    previous = np.concatenate(([1], hist[:-1]))
    return tuple(int(c) for c in hist // previous)


def sglang_pool_size(steps: int, topk: int) -> int:
    """Scored candidates SGLang draws from: topk at the first step, topk * topk after each later
    one (docs/engines.md#sglang)."""
    return topk + (steps - 1) * topk * topk


def sglang_candidates(acc: np.ndarray, steps: int, topk: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """SGLang's candidate nodes for `steps` levels of `topk`, best first, and their scores.

    The score of a node is the product of the per-rank accuracies along its path (the drafter's
    expected probability). Step 1 scores the root's top-`topk` children; every later step
    expands the `topk` best-scored nodes of the previous level by their top-`topk` children
    and keeps all topk * topk as candidates. The order is (-score, depth, generation order),
    so a parent always comes before its children and every prefix is a tree.
    """
    a = np.asarray(acc, dtype=np.float64)
    if not 1 <= steps <= a.shape[0]:
        raise UserError(f"--speculative-num-steps: {steps} is outside 1..{a.shape[0]} (the draft heads)")
    if not 1 <= topk <= a.shape[1]:
        raise UserError(f"--speculative-eagle-topk: {topk} is outside 1..{a.shape[1]} (the table's width)")
    paths: list[tuple[int, ...]] = [(r,) for r in range(topk)]
    scores = [a[0, :topk].copy()]
    beams = paths[:]
    beam_scores = a[0, :topk]
    for d in range(1, steps):
        expanded = beam_scores[:, None] * a[d, None, :topk]  # (beam, child rank)
        flat = expanded.ravel()
        level = [b + (r,) for b in beams for r in range(topk)]
        paths += level
        scores.append(flat)
        keep = np.argsort(-flat, kind="stable")[:topk]
        beams = [level[i] for i in keep]
        beam_scores = flat[keep]
    score = np.concatenate(scores)
    depth = np.array([len(p) for p in paths])
    order = np.lexsort((np.arange(len(paths)), depth, -score))
    return [paths[i] for i in order], score[order]


def sglang_tree(acc, steps: int, topk: int, num_draft_tokens: int) -> Tree:
    """The tree SGLang drafts for the triple: the num_draft_tokens - 1 best candidates
    (`sglang_candidates`); num_draft_tokens is steps + 1 when topk is 1."""
    if topk == 1:
        num_draft_tokens = steps + 1  # why (docs/engines.md#sglang): forced for a chain
    paths, _ = sglang_candidates(acc, steps, topk)
    n = num_draft_tokens - 1
    if not 1 <= n <= len(paths):
        raise UserError(
            f"--speculative-num-draft-tokens: {num_draft_tokens} is outside 2..{len(paths) + 1} "
            f"for {steps} steps of topk {topk}"
        )
    return Tree(tuple(paths[:n]), name=f"sglang steps={steps} topk={topk} draft_tokens={num_draft_tokens}")


def sglang_triple_for(tree: Tree, acc) -> tuple[int, int, int] | None:
    """The smallest (steps, topk) whose draft of tree.size + 1 tokens is exactly `tree`, as
    (steps, topk, num_draft_tokens); None when SGLang drafts no such tree."""
    a = np.asarray(acc, dtype=np.float64)
    want = set(tree.paths)
    n = tree.size
    if n == 0 or tree.depth > a.shape[0]:
        return None
    for steps in range(tree.depth, a.shape[0] + 1):
        for topk in range(1, a.shape[1] + 1):
            if n > sglang_pool_size(steps, topk) or (topk == 1 and n != steps):
                continue
            paths, _ = sglang_candidates(a, steps, topk)
            if set(paths[:n]) == want:
                return steps, topk, n + 1
    return None


# ---------------------------------------------------------------------------------------------
# check


def _prune(tree: Tree, bad) -> Tree:
    """`tree` without the nodes for which bad(path) holds and without their descendants."""
    keep = []
    dropped: set[tuple[int, ...]] = set()
    for p in tree.sorted_paths:
        if bad(p) or p[:-1] in dropped:
            dropped.add(p)
        else:
            keep.append(p)
    order = {p: i for i, p in enumerate(tree.paths)}
    return Tree(tuple(sorted(keep, key=order.__getitem__)), name=f"{tree.name} as drafted")


def check(tree: Tree, engine: Engine, *, heads: int | None = None, accuracy=None) -> EngineDraft:
    """Whether `engine` drafts `tree` as written and, if not, what it drafts instead (the rules
    of docs/engines.md). `heads`: the draft heads the engine runs; `accuracy`: the (heads,
    width) per-rank table, needed for SGLang, which scores its candidates each step."""
    if engine.family == "uniform":
        return _check_uniform(tree, engine, heads)
    if engine.family == "beam":
        return _check_sglang(tree, accuracy)
    return _check_static(tree, engine, heads)


def _check_static(tree: Tree, engine: Engine, heads: int | None) -> EngineDraft:
    drafted, reasons, refused = tree, [], False
    for rule in (_depth_rule, _rank_rule, _left_closed_rule, _grounded_rule):
        drafted, reason, refuses = rule(tree, drafted, engine, heads)
        if reason:
            reasons.append(reason)
        refused |= refuses
    as_written = not reasons
    return EngineDraft(
        engine.name,
        tree,
        tree if as_written else drafted,
        as_written,
        refused,
        "drafted as written" if as_written else "; ".join(reasons),
    )


# Each rule of a static engine: (tree as drafted so far, why it differs or None, whether the
# engine refuses the tree) from the tree as written and as drafted by the rules before it.


def _depth_rule(tree: Tree, drafted: Tree, engine: Engine, heads: int | None) -> tuple[Tree, str | None, bool]:
    depth = engine.depth_bound(heads)
    if depth is None or tree.depth <= depth:
        return drafted, None, False
    reason = (
        f"nodes deeper than {depth} cannot be drafted (depth limit {engine.depth_limit or '-'}, "
        f"{heads if heads is not None else '?'} heads); the engine refuses the tree"
    )
    return _prune(drafted, lambda p: len(p) > depth), reason, True


def _rank_rule(tree: Tree, drafted: Tree, engine: Engine, heads: int | None) -> tuple[Tree, str | None, bool]:
    limit = engine.rank_limit
    if limit is None:
        return drafted, None, False
    worst = max((max(p) for p in tree.paths), default=-1)
    drafted = _prune(drafted, lambda p: max(p) >= limit)
    if engine.name == "trtllm" and worst > limit:
        return drafted, f"rank {worst} > {limit}: the C++ runtime aborts", True
    if worst >= limit:
        # why (docs/engines.md#medusa-reference-code, docs/engines.md#tensorrt-llm): rank r >=
        # TOPK reads another head's candidate, so the node (and all below it) is a wasted slot
        reason = (
            f"rank {worst} >= {limit} reads another head's candidate: "
            f"{sum(1 for p in tree.paths if max(p) >= limit)} node(s) verify the wrong token"
        )
        return drafted, reason, False
    return drafted, None, False


def _left_closed_rule(tree: Tree, drafted: Tree, engine: Engine, heads: int | None) -> tuple[Tree, str | None, bool]:
    missing = _left_closure_missing(drafted, engine.left_closed_depth) if engine.left_closed_depth else []
    if not missing:
        return drafted, None, False
    shown = ", ".join(_node_str(p) for p in missing[:4])
    if engine.name == "trtllm":
        # why (docs/engines.md#tensorrt-llm): the Python runtime drafts depth-1 ranks 0..k-1
        # whatever the tree lists
        reason = f"the Python runtime drafts every depth-1 rank up to the largest: {len(missing)} extra node(s) {shown}"
        return Tree(drafted.paths + tuple(missing), name=f"{tree.name} as drafted"), reason, False
    reason = f"siblings must be ranks 0..c-1: {shown} missing, so the nodes after them are never drafted"
    return _prune(drafted, _not_left_closed(drafted, engine.left_closed_depth)), reason, False


def _grounded_rule(tree: Tree, drafted: Tree, engine: Engine, heads: int | None) -> tuple[Tree, str | None, bool]:
    bad = _ungrounded(drafted) if engine.grounded else []
    if not bad:
        return drafted, None, False
    shown = ", ".join(_node_str(p) for p in bad[:4])
    reason = f"only the first children of a node are expanded: {shown} have children while an earlier sibling has none"
    while bad:  # cutting children below one node can unground its next sibling
        drafted = _prune(drafted, lambda p, bad=set(bad): any(p[:i] in bad for i in range(1, len(p))))
        bad = _ungrounded(drafted)
    return drafted, reason, False


def _left_closure_missing(tree: Tree, max_depth: int) -> list[tuple[int, ...]]:
    """The nodes ranks 0..c-1 would add at depths <= max_depth (c = largest rank + 1 there)."""
    have = set(tree.paths)
    missing = []
    for p in tree.sorted_paths:
        if len(p) <= max_depth:
            for r in range(p[-1]):
                q = p[:-1] + (r,)
                if q not in have:
                    have.add(q)
                    missing.append(q)
    return sorted(missing, key=lambda q: (len(q), q))


def _not_left_closed(tree: Tree, max_depth: int):
    have = set(tree.paths)

    def bad(p):
        return len(p) <= max_depth and any(p[:-1] + (r,) not in have for r in range(p[-1]))

    return bad


def _ungrounded(tree: Tree) -> list[tuple[int, ...]]:
    """Nodes with children whose previous sibling has none."""
    parents = {p[:-1] for p in tree.paths}
    return [p for p in tree.sorted_paths if p in parents and p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in parents]


def _check_uniform(tree: Tree, engine: Engine, heads: int | None) -> EngineDraft:
    counts = child_counts(tree)
    if engine.max_children == 1:
        # why (docs/engines.md#vllm): the Medusa path drafts a top-1 chain of
        # num_speculative_tokens (= the node count), one token per head
        counts = (1,) * min(tree.size, heads if heads is not None else tree.size)
    # Nothing is drafted below a level whose child count is 0.
    cut = counts.index(0) if 0 in counts else len(counts)
    drafted = uniform_tree(counts[:cut], name=f"{tree.name} as drafted")
    as_written = set(drafted.paths) == set(tree.paths)
    if as_written:
        reason = f"drafted as written: children per level {', '.join(map(str, counts))}"
    else:
        reason = (
            f"vLLM gives every node of a level the same number of children, the top ranks: "
            f"{', '.join(map(str, counts[:cut])) or 'none'} per level, {drafted.size} drafts "
            f"for {tree.size} slots (num_speculative_tokens)"
        )
    return EngineDraft(engine.name, tree, tree if as_written else drafted, as_written, False, reason)


def _check_sglang(tree: Tree, accuracy) -> EngineDraft:
    if accuracy is None:
        raise UserError("--engine sglang: needs --accuracy (SGLang picks its tree from the drafter's scores each step)")
    a = np.asarray(accuracy, dtype=np.float64)
    triple = sglang_triple_for(tree, a) if tree.depth <= a.shape[0] else None
    if triple is not None:
        s, k, t = triple
        return EngineDraft(
            "sglang",
            tree,
            tree,
            True,
            False,
            f"drafted as written by --speculative-num-steps {s} --speculative-eagle-topk {k} "
            f"--speculative-num-draft-tokens {t}",
            triple,
        )
    # The flags a user would derive from the tree: its depth, its widest fan-out, its size.
    steps = min(max(tree.depth, 1), a.shape[0])
    fan = max([sum(1 for p in tree.paths if p[:-1] == q) for q in {p[:-1] for p in tree.paths}], default=1)
    topk = min(fan, a.shape[1])
    tokens = min(tree.size, sglang_pool_size(steps, topk)) + 1
    drafted = sglang_tree(a, steps, topk, tokens)
    triple = (steps, topk, steps + 1 if topk == 1 else tokens)
    return EngineDraft(
        "sglang",
        tree,
        Tree(drafted.paths, name=f"{tree.name} as drafted"),
        False,
        False,
        f"SGLang has no static tree; its flags for this tree's depth, fan-out and size "
        f"(steps {triple[0]}, topk {triple[1]}, draft tokens {triple[2]}) draft another one",
        triple,
    )


# ---------------------------------------------------------------------------------------------
# Exports


@dataclass(frozen=True)
class EngineExport:
    """The paste-ready text for one engine: `line` (one line, for tables and reports) and
    `text` (everything, ending in a newline)."""

    engine: str
    line: str
    text: str


def _tuple_list(tree: Tree) -> str:
    # why (docs/engines.md#vllm): it reads the depth from the last entry, so (depth, path) order
    return repr(list(tree.sorted_paths))


def trtllm_max_draft_len(nodes: int) -> int:
    """max_draft_len for a tree of `nodes` nodes that avoids the packed-mask overrun of a node
    count that is a multiple of 32 and equal to max_draft_len (docs/engines.md#tensorrt-llm)."""
    return nodes + 1 if nodes > 0 and nodes % 32 == 0 else nodes


def export_for(engine: Engine, tree: Tree, *, heads: int | None = None, accuracy=None) -> EngineExport:
    """What `engine` takes for `tree` (docs/engines.md#exports). `heads`: the draft heads of the
    checkpoint (TensorRT-LLM's num_medusa_heads; default the tree's depth); `accuracy`: needed
    for SGLang, whose flags are found by matching its draft to the tree."""
    choices = tree.to_choices()
    kind = engine.export_kind
    if kind in ("medusa", "python"):
        line = f"{choices}"
        return EngineExport(engine.name, line, line + "\n")
    if kind == "trtllm":
        line = f'--medusa_choices="{choices}"'
        config = {
            "decoding_type": "Medusa",
            "max_draft_len": trtllm_max_draft_len(tree.size),
            "num_medusa_heads": int(heads if heads is not None else tree.depth),
            "medusa_choices": choices,
        }
        return EngineExport(engine.name, line, f"{line}\nspeculative_config = {json.dumps(config)}\n")
    if kind == "vllm":
        config = {"method": engine.method_name, "num_speculative_tokens": tree.size}
        if engine.max_children != 1:
            config["speculative_token_tree"] = _tuple_list(tree)
        line = f"--speculative-config '{json.dumps(config)}'"
        return EngineExport(engine.name, line, line + "\n")
    if kind == "sglang":
        if accuracy is None:
            raise UserError("--engine sglang: needs --accuracy to find the flags that draft this tree")
        triple = sglang_triple_for(tree, accuracy)
        if triple is None:
            raise UserError(
                f"{tree.name}: SGLang drafts no such tree for any --speculative-num-steps / "
                "--speculative-eagle-topk (build it with --engine sglang)"
            )
        line = sglang_flags(*triple)
        return EngineExport(engine.name, line, line + "\n")
    raise UserError(f"engine {engine.name}: unknown export {kind!r}")


def sglang_flags(steps: int, topk: int, num_draft_tokens: int) -> str:
    return (
        f"--speculative-algorithm EAGLE --speculative-num-steps {steps} "
        f"--speculative-eagle-topk {topk} --speculative-num-draft-tokens {num_draft_tokens}"
    )
