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

import functools
import json
from dataclasses import dataclass

import numpy as np

from treeopt.engine_data import (
    ENGINE_NAMES,
    ENGINES,
    GROUNDED_ALL_DEPTHS,
    RETIRED,
    TRTLLM_EXACT_DEPTH,
    Engine,
    engine_for_drafter,
    get_engine,
)
from treeopt.errors import UserError
from treeopt.layout import DRAFTER_KINDS
from treeopt.tree import Tree, _node_str
from treeopt.trtllm_eagle import trtllm_dynamic_export, trtllm_dynamic_fits, trtllm_dynamic_text, trtllm_eagle3_config

__all__ = [
    "Engine",
    "EngineCheck",
    "ENGINES",
    "ENGINE_NAMES",
    "RETIRED",
    "GROUNDED_ALL_DEPTHS",
    "TRTLLM_EXACT_DEPTH",
    "get_engine",
    "check",
    "uniform_tree",
    "child_counts",
    "sglang_candidates",
    "sglang_scores",
    "sglang_tree",
    "sglang_pool_size",
    "sglang_triple_for",
    "beam_fits",
    "draft_model_dir",
    "eagle_draft",
    "export_for",
    "EngineExport",
    "trtllm_cpp_draft",
    "trtllm_python_buffers",
    "engine_for_drafter",
    "DRAFTER_KINDS",
]

# TensorRT-LLM's C++ runtime keys each node by its ranks packed in 4-bit chunks
# (cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp, computePrefix, NVIDIA/TensorRT-LLM
# @ b4f2086ddd2206a1f8b5f3d40885d7ce7d0c73fa; docs/engines.md#tensorrt-llm).
TRTLLM_PREFIX_CHUNK_BITS = 4  # PREFIX_CHUNK_SIZE_BITS
TRTLLM_PREFIX_MAX_VALUE = 16  # PREFIX_MAX_VALUE: a larger rank fails a TLLM_CHECK (abort)
TRTLLM_PREFIX_MAX_DEPTH = 16  # sizeof(uint64_t) * 8 / PREFIX_CHUNK_SIZE_BITS: deeper aborts


@dataclass(frozen=True)
class EngineCheck:
    """What `engine` does with `tree`: drafts it as written, or drafts `drafted` instead (or
    refuses it: `refused`), for the reason given; tau of both when an accuracy table was given
    (`treeopt.check`)."""

    engine: str
    tree: Tree
    drafted: Tree
    as_written: bool
    refused: bool
    reason: str
    tau: float | None = None
    tau_drafted: float | None = None
    sglang_flags: tuple[int, int, int] | None = None  # SGLang: (steps, topk, num_draft_tokens)
    runtimes: tuple[str, ...] = ()  # one line per runtime of the engine (TensorRT-LLM: C++, Python)

    def to_dict(self) -> dict:
        return {
            "tree": self.tree.name,
            "engine": self.engine,
            "as_written": self.as_written,
            "refused": self.refused,
            "reason": "; ".join(self.runtimes) if self.runtimes else self.reason,  # one line, as JSON readers expect
            "nodes": self.tree.size,
            "drafted_nodes": self.drafted.size,
            "drafted": self.drafted.to_choices(),
            "tau": self.tau,
            "tau_drafted": self.tau_drafted,
            "sglang_flags": list(self.sglang_flags) if self.sglang_flags else None,
            "runtimes": list(self.runtimes),
        }


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

    The score of a node is the product along its path of `sglang_scores(acc)`, the per-rank
    accuracy made non-increasing in rank: SGLang ranks a node's children by its drafter's
    probabilities, which fall with rank, so the children it drafts under one parent are always
    ranks 0..c-1 (docs/engines.md#sglang). Step 1 scores the root's top-`topk` children; every
    later step expands the `topk` best-scored nodes of the previous level by their top-`topk`
    children and keeps all topk * topk as candidates. The order is (-score, depth, generation
    order), so a parent always comes before its children, a rank before the next rank of the
    same parent, and every prefix is a tree.
    """
    a = sglang_scores(acc)
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


def sglang_scores(acc) -> np.ndarray:
    """The running minimum of each head's accuracy along rank: the rank-monotone stand-in for the
    drafter's probabilities by which SGLang picks its nodes (docs/engines.md#sglang). Equal to
    the table where accuracy already falls with rank; tau is still taken from the table."""
    return np.minimum.accumulate(np.asarray(acc, dtype=np.float64), axis=1)


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


def _sglang_fits(nodes: int, steps: int, topk: int) -> bool:
    """SGLang drafts `nodes` nodes from its pool of `steps` levels of `topk`; topk 1 forces the chain."""
    return nodes <= sglang_pool_size(steps, topk) and (topk > 1 or nodes == steps)


def beam_fits(engine: Engine):
    """(nodes, steps, topk) -> whether the beam-family `engine` takes that draft size for that
    (steps, topk): SGLang's pool, or TensorRT-LLM's dynamic-tree bound (docs/engines.md#tensorrt-llm-eagle-3)."""
    return trtllm_dynamic_fits if engine.export_kind == "trtllm-eagle3-dynamic" else _sglang_fits


def sglang_triple_for(tree: Tree, acc, *, fits=_sglang_fits) -> tuple[int, int, int] | None:
    """The smallest (steps, topk) whose draft of tree.size + 1 tokens is exactly `tree`, as
    (steps, topk, num_draft_tokens); None when SGLang (`fits`: another beam engine's bound,
    `beam_fits`) drafts no such tree."""
    a = np.asarray(acc, dtype=np.float64)
    want = set(tree.paths)
    n = tree.size
    if n == 0 or tree.depth > a.shape[0]:
        return None
    for steps in range(tree.depth, a.shape[0] + 1):
        for topk in range(1, a.shape[1] + 1):
            if not fits(n, steps, topk):
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


def check(tree: Tree, engine: Engine, *, heads: int | None = None, accuracy=None) -> EngineCheck:
    """Whether `engine` drafts `tree` as written and, if not, what it drafts instead (the rules
    of docs/engines.md). `heads`: the draft heads the engine runs; `accuracy`: the (heads,
    width) per-rank table, needed for SGLang, which scores its candidates each step."""
    if engine.family == "uniform":
        return _check_uniform(tree, engine, heads)
    if engine.family == "beam":
        return _check_sglang(tree, accuracy, engine)
    if engine.name == "trtllm":
        return _check_trtllm(tree, engine, heads)
    return _check_static(tree, engine, heads)


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM's two runtimes (docs/engines.md#tensorrt-llm)


def _trtllm_key(ranks) -> int | None:
    """computePrefix of the C++ runtime: each rank shifted by 4 bits per level below it and
    OR-ed in (so rank 16 spills into the chunk above), the shift done on a 32-bit int and the
    result sign-extended into the 64-bit key; None where that shift is undefined behaviour."""
    key, n = 0, len(ranks)
    for i, r in enumerate(ranks):
        shift = TRTLLM_PREFIX_CHUNK_BITS * (n - 1 - i)
        term = int(r) << shift
        if shift >= 32 or term >= 1 << 32:
            return None
        if term >= 1 << 31:  # int32 wraps negative; `prefix |= int` sign-extends it
            term |= ((1 << 32) - 1) << 32
        key |= term
    return key


def trtllm_cpp_draft(tree: Tree, heads: int | None = None) -> tuple[Tree, str, bool]:
    """What TensorRT-LLM's C++ runtime (initTensorsFromChoices) drafts of `tree`: the nodes it
    certainly places where the tree puts them, one line saying why any are missing, and whether
    it aborts. It finds a node's parent by the parent's prefix key at the level above; two nodes
    of one level with equal keys (rank 16 spilling into the chunk above) share one map entry,
    so the children of both hang under whichever the sort put last; a key of more than 8 ranks
    is undefined behaviour. Nodes below either are not counted (docs/engines.md#tensorrt-llm)."""
    name = "C++ runtime (LLM API, trtllm-serve, ModelRunnerCpp)"
    depth = min([TRTLLM_PREFIX_MAX_DEPTH] + ([int(heads)] if heads is not None else []))
    worst = max((max(p) for p in tree.paths), default=-1)
    if worst > TRTLLM_PREFIX_MAX_VALUE or tree.depth > depth:
        what = (
            f"rank {worst} > {TRTLLM_PREFIX_MAX_VALUE}"
            if worst > TRTLLM_PREFIX_MAX_VALUE
            else f"depth {tree.depth} > {depth} ({heads if heads is not None else '?'} heads, key limit 16)"
        )
        drafted = _prune(tree, lambda p: len(p) > depth or max(p) > TRTLLM_PREFIX_MAX_VALUE)
        return drafted, f"{name}: {what}: a TLLM_CHECK fails and the runtime aborts", True
    keys = {p: _trtllm_key(p) for p in tree.paths}
    groups: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    for p in tree.sorted_paths:
        if keys[p] is not None:
            groups.setdefault((len(p), keys[p]), []).append(p)
    shared = [g for g in groups.values() if len(g) > 1]
    unsure = {p for g in shared for p in g} | {p for p, k in keys.items() if k is None}
    drafted = _prune(tree, lambda p: p[:-1] in unsure)
    lost = tree.size - drafted.size
    if not lost:
        return drafted, f"{name}: drafts it as written", False
    parts = []
    if shared:
        pairs = ", ".join(" and ".join(_node_str(p) for p in g) for g in shared[:3])
        parts.append(
            f"rank 16 spills into the parent's 4-bit chunk of the prefix key: {pairs} share one key, "
            "so the children of both hang under one of them (whichever std::sort put last)"
        )
    if any(k is None for k in keys.values()):
        parts.append(
            "nodes below depth 9 find their parent by a key that shifts a 32-bit int by >= 32 bits (undefined)"
        )
    return drafted, f"{name}: {'; '.join(parts)}: {lost} node(s) below them are not where the tree puts them", False


def _python_sort_key():
    def cmp(a, b):  # path_sorter: the first differing rank; a prefix compares equal
        for x, y in zip(a, b, strict=False):
            if x != y:
                return -1 if x < y else 1
        return 0

    return functools.cmp_to_key(cmp)


def trtllm_python_buffers(tree: Tree) -> tuple[list[tuple[int, ...] | None], list[tuple[int, ...]], list[list[int]]]:
    """The buffers of TensorRT-LLM's Python runtime (`_medusa_setup` in
    tensorrt_llm/runtime/medusa_utils.py, docs/engines.md#tensorrt-llm), without the root:
    `tokens[i]`, the node whose candidate is the i-th drafted token (None for a depth-1 rank the
    tree does not list: the first level is every rank up to the largest); the leaves in the
    runtime's order; and, per leaf, the indices into `tokens` its path and attention mask use.
    Deeper levels are indexed from the number of depth-1 nodes listed, not from the depth-1
    tokens, so with gaps at depth 1 the paths and the tokens disagree."""
    have = set(tree.paths)
    parents = {p[:-1] for p in tree.paths}
    leaves = sorted((p for p in tree.paths if p not in parents), key=_python_sort_key())
    level_counts = np.bincount([len(p) for p in tree.paths], minlength=tree.depth + 1)[1:]
    top1 = max((p[0] for p in leaves), default=-1) + 1
    tokens: list[tuple[int, ...] | None] = [(r,) if (r,) in have else None for r in range(top1)]
    paths = [list(p[:1]) for p in leaves]
    for i in range(1, tree.depth):
        base = int(level_counts[:i].sum())
        last, c = None, -1
        for pi, p in enumerate(leaves):
            if i < len(p):
                if p[: i + 1] != last:
                    tokens.append(p[: i + 1])
                    last, c = p[: i + 1], c + 1
                paths[pi].append(base + c)
    return tokens, leaves, paths


def _trtllm_python_line(tree: Tree) -> str:
    """One line on what the Python runtime does with `tree`; a warning when its buffers disagree."""
    name = "Python runtime (ModelRunner, --use_py_session)"
    tokens, leaves, paths = trtllm_python_buffers(tree)
    extra = sum(1 for t in tokens if t is None)
    if not extra:
        return f"{name}: drafts it as written"
    wrong = {leaf[: j + 1] for leaf, idx in zip(leaves, paths) for j, k in enumerate(idx) if tokens[k] != leaf[: j + 1]}
    if not wrong:
        return f"{name}: also computes {extra} depth-1 token(s) the tree does not list, on no path (wasted slots)"
    index = {t: i for i, t in enumerate(tokens) if t is not None}
    rows: dict[int, set[int]] = {}
    for idx in paths:  # get_medusa_mask: a path's token attends to the tokens before it on the path
        for j, k in enumerate(idx):
            rows.setdefault(k, set()).update(idx[: j + 1])

    def ancestors(k):
        t = tokens[k]
        return {index[t[:d]] for d in range(1, len(t) + 1)} if t is not None else {k}

    stray = sum(1 for k, row in rows.items() if row - ancestors(k))
    listed = sum(1 for p in tree.paths if len(p) == 1)
    return (
        f"WARNING {name}: its buffers disagree: its tokens hold depth-1 ranks 0..{listed + extra - 1} "
        f"({extra} not in the tree) but its paths and attention mask index the deeper tokens as if depth 1 "
        f"held the {listed} nodes listed: {len(wrong)} node(s) verify another node's token and {stray} "
        "token(s) attend to tokens that are not their ancestors"
    )


def _check_trtllm(tree: Tree, engine: Engine, heads: int | None) -> EngineCheck:
    """The C++ runtime decides what is drafted (the production path); the Python runtime gets
    its own line (docs/engines.md#tensorrt-llm)."""
    drafted, cpp, refused = trtllm_cpp_draft(tree, heads)
    python = _trtllm_python_line(tree)
    as_written = not refused and drafted.size == tree.size
    drafted = tree if as_written else Tree(drafted.paths, name=f"{tree.name} as drafted")
    lines = (cpp, python)
    return EngineCheck(engine.name, tree, drafted, as_written, refused, "\n  ".join(lines), runtimes=lines)


def _check_static(tree: Tree, engine: Engine, heads: int | None) -> EngineCheck:
    drafted, reasons, refused = tree, [], False
    for rule in (_depth_rule, _rank_rule, _left_closed_rule, _grounded_rule):
        drafted, reason, refuses = rule(tree, drafted, engine, heads)
        if reason:
            reasons.append(reason)
        refused |= refuses
    as_written = not reasons
    return EngineCheck(
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
    if worst >= limit:
        # why (docs/engines.md#medusa-reference-code): rank r >= TOPK reads another head's
        # candidate, so the node (and all below it) is a wasted slot
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


def _check_uniform(tree: Tree, engine: Engine, heads: int | None) -> EngineCheck:
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
    elif engine.max_children == 1:
        reason = (
            f"{engine.release} drafts a top-1 chain, one token per draft step: {drafted.size} drafts "
            f"for {tree.size} slots (the chain of {tree.size} nodes is what it takes)"
        )
    else:
        reason = (
            f"vLLM gives every node of a level the same number of children, the top ranks: "
            f"{', '.join(map(str, counts[:cut])) or 'none'} per level, {drafted.size} drafts "
            f"for {tree.size} slots (num_speculative_tokens)"
        )
    return EngineCheck(engine.name, tree, tree if as_written else drafted, as_written, False, reason)


def _check_sglang(tree: Tree, accuracy, engine: Engine) -> EngineCheck:
    if accuracy is None:
        raise UserError(
            f"--engine {engine.name}: needs --accuracy (the engine picks its tree from the drafter's scores each step)"
        )
    a = np.asarray(accuracy, dtype=np.float64)
    trt = engine.export_kind == "trtllm-eagle3-dynamic"
    triple = sglang_triple_for(tree, a, fits=beam_fits(engine)) if tree.depth <= a.shape[0] else None
    if triple is not None:
        s, k, t = triple
        flags = trtllm_dynamic_text(triple) if trt else f"--speculative-num-steps {s} --speculative-eagle-topk {k} "
        flags += "" if trt else f"--speculative-num-draft-tokens {t}"
        return EngineCheck(engine.name, tree, tree, True, False, f"drafted as written by {flags}", sglang_flags=triple)
    # The flags a user would derive from the tree: its depth, its widest fan-out, its size.
    steps = min(max(tree.depth, 1), a.shape[0])
    fan = max([sum(1 for p in tree.paths if p[:-1] == q) for q in {p[:-1] for p in tree.paths}], default=1)
    topk = min(fan, a.shape[1])
    most = topk * steps if trt else sglang_pool_size(steps, topk)  # why: TensorRT-LLM's narrower bound
    tokens = min(tree.size, most) + 1  # the tree's size >= its depth = steps: TensorRT-LLM's lower bound holds
    drafted = sglang_tree(a, steps, topk, tokens)
    triple = (steps, topk, steps + 1 if topk == 1 else tokens)
    what = trtllm_dynamic_text(triple) if trt else f"steps {triple[0]}, topk {triple[1]}, draft tokens {triple[2]}"
    return EngineCheck(
        engine.name,
        tree,
        Tree(drafted.paths, name=f"{tree.name} as drafted"),
        False,
        False,
        f"{engine.name} has no static tree; its flags for this tree's depth, fan-out and size ({what}) draft "
        "another one",
        sglang_flags=triple,
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


# why (docs/engines.md#tensorrt-llm): MedusaDecodingConfig.supports_backend is `backend not in
# ("pytorch", "_autodeploy")` (tensorrt_llm/llmapi/llm_args.py, NVIDIA/TensorRT-LLM @
# fcd3f31682808ae56118ae43c1d7864a3a945e6f)
TRTLLM_LLM_API_BACKEND_NOTE = (
    '# LLM API: MedusaDecodingConfig runs on the TensorRT engine backend only (LLM(..., backend="tensorrt"), '
    "a trtllm-build engine); the default pytorch backend rejects it"
)


def export_for(
    engine: Engine, tree: Tree, *, heads: int | None = None, accuracy=None, drafter: tuple[str, str] | None = None
) -> EngineExport:
    """What `engine` takes for `tree` (docs/engines.md#exports). `heads`: the draft heads of the
    checkpoint (TensorRT-LLM's num_medusa_heads; default the tree's depth); `accuracy`: needed
    for SGLang, whose flags are found by matching its draft to the tree; `drafter`: an EAGLE
    draft's (kind, directory) (`eagle_draft` of the table), named in vLLM's and SGLang's lines."""
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
        return EngineExport(
            engine.name, line, f"{line}\n{TRTLLM_LLM_API_BACKEND_NOTE}\nspeculative_config = {json.dumps(config)}\n"
        )
    if kind in ("vllm", "vllm-tree"):
        config = {"method": engine.method_name, "num_speculative_tokens": tree.size}
        if drafter is not None and engine.method_name in ("eagle", "eagle3"):
            # vLLM names the draft's method and path (docs/engines.md#eagle-drafts)
            config = {"method": drafter[0], "model": drafter[1], "num_speculative_tokens": tree.size}
        if kind == "vllm-tree":
            config["speculative_token_tree"] = _tuple_list(tree)
        line = f"--speculative-config '{json.dumps(config)}'"
        return EngineExport(engine.name, line, _with_note(engine, line))
    if kind == "trtllm-draft":
        # why (docs/engines.md#tensorrt-llm): DraftTargetDecodingConfig needs the draft model's path
        config = {"decoding_type": engine.method_name, "max_draft_len": tree.size, "speculative_model": "<draft model>"}
        line = f"speculative_config = {json.dumps(config)}"
        return EngineExport(engine.name, line, _with_note(engine, line))
    if kind in ("trtllm-eagle3", "trtllm-eagle3-tree"):
        config = trtllm_eagle3_config(tree, drafter)
        line = f"speculative_config = {json.dumps(config)}"
        return EngineExport(engine.name, line, _with_note(engine, line))
    if kind in ("sglang", "trtllm-eagle3-dynamic"):
        if accuracy is None:
            raise UserError(f"--engine {engine.name}: needs --accuracy to find the flags that draft this tree")
        triple = sglang_triple_for(tree, accuracy, fits=beam_fits(engine))
        if triple is None:
            who = "SGLang" if kind == "sglang" else "TensorRT-LLM's dynamic tree"
            raise UserError(
                f"{tree.name}: {who} drafts no such tree for any (steps, topk) (build it with --engine {engine.name})"
            )
        if kind == "trtllm-eagle3-dynamic":
            line = f"speculative_config = {json.dumps(trtllm_dynamic_export(triple, drafter))}"
            return EngineExport(engine.name, line, _with_note(engine, line))
        line = sglang_flags(*triple, algorithm=engine.method_name)
        if drafter is not None and engine.method_name == "EAGLE":
            algorithm = "EAGLE3" if drafter[0] == "eagle3" else "EAGLE"
            line = sglang_flags(*triple, algorithm=algorithm) + f" --speculative-draft-model-path {drafter[1]}"
        # why (docs/engines.md#sglang-server-checks): SGLang refuses a tree (topk > 1) with some server flags
        return EngineExport(engine.name, line, _with_note(engine, line) if triple[1] > 1 else line + "\n")
    raise UserError(f"engine {engine.name}: unknown export {kind!r}")


def _with_note(engine: Engine, line: str) -> str:
    """The full text: the line, then what the release does with it as a comment."""
    return f"{line}\n# {engine.note}\n" if engine.note else line + "\n"


def eagle_draft(table) -> tuple[str, str] | None:
    """(kind, the draft's directory) of an accuracy table calibrated with an EAGLE draft
    (`treeopt calibrate` records it as "eagle3:DIR" or "eagle:DIR"), else None."""
    kind = getattr(table, "drafter", None)
    if kind not in ("eagle3", "eagle"):
        return None
    heads = str((table.provenance or {}).get("heads") or "")
    return kind, heads.split(":", 1)[1] if ":" in heads else heads


def draft_model_dir(table) -> str | None:
    """The draft model's directory of a table calibrated with `--drafter draft-model`
    (`treeopt calibrate` records "draft-model:DIR"), for the engines' configs that name it; None
    for another drafter and for the bundled demo draft ("demo"), which no engine serves."""
    if getattr(table, "drafter", None) != "draft-model":
        return None
    spec = str((table.provenance or {}).get("heads") or "").split(":", 1)
    return spec[1] if len(spec) == 2 and spec[1] not in ("", "demo") else None


def sglang_flags(steps: int, topk: int, num_draft_tokens: int, *, algorithm: str = "EAGLE") -> str:
    return (
        f"--speculative-algorithm {algorithm} --speculative-num-steps {steps} "
        f"--speculative-eagle-topk {topk} --speculative-num-draft-tokens {num_draft_tokens}"
    )
