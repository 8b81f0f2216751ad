"""Static candidate trees (Medusa's `medusa_choices`) and their verification buffers.

A node is a path of 0-based ranks `(i_1, ..., i_d)`: its depth-j token is head j's rank-i_j
proposal. The root (the base model's own next token) is implicit. See docs/trees.md#nodes.
"""

from __future__ import annotations

import ast
import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from treeopt.errors import UserError
from treeopt.fileio import read_json_input

TREE_FORMAT = "treeopt.tree/v1"


def _node_str(path) -> str:
    return "[" + ", ".join(str(r) for r in path) + "]"


#: the largest rank a node may have: a rank indexes a vocabulary, and indices are computed in
#: int64 (docs/trees.md#buffers), which a rank near 2^63 would overflow
MAX_RANK = 2**31 - 1


def _check_paths(paths, source, *, topk=None, num_heads=None, allow_empty=True):
    """Raise UserError for the first problem in `paths` (tuples of ints), naming the node."""
    if not paths and not allow_empty:
        raise UserError(f"{source}: the tree is empty (it needs at least one node)")
    seen: dict[tuple[int, ...], int] = {}
    for i, path in enumerate(paths):
        if len(path) == 0:
            raise UserError(f"{source}: node #{i} is an empty path (the root is implicit; leave it out)")
        for r in path:
            if r < 0:
                raise UserError(f"{source}: node {_node_str(path)} has a negative rank {r}")
            if r > MAX_RANK:
                raise UserError(
                    f"{source}: node {_node_str(path)[:40]} has rank {str(r)[:24]}, beyond any "
                    f"vocabulary (ranks are at most {MAX_RANK})"
                )
            if topk is not None and r >= topk:
                raise UserError(
                    f"{source}: node {_node_str(path)} has rank {r}, not below the candidate width (topk) {topk}"
                )
        if num_heads is not None and len(path) > num_heads:
            raise UserError(f"{source}: node {_node_str(path)} has depth {len(path)}, more than the {num_heads} heads")
        if path in seen:
            raise UserError(f"{source}: node {_node_str(path)} appears twice (#{seen[path]} and #{i})")
        seen[path] = i
    for path in paths:
        # Only the parent needs checking: the parent's own check covers the grandparent.
        if len(path) > 1 and path[:-1] not in seen:
            raise UserError(f"{source}: node {_node_str(path)} has no parent {_node_str(path[:-1])}")


def _parse_choices(choices, source) -> tuple[tuple[int, ...], ...]:
    """Lists/tuples of ints -> tuple of tuples; non-integers are errors, not silently cast."""
    if isinstance(choices, (str, bytes)) or not isinstance(choices, (list, tuple)):
        raise UserError(f"{source}: medusa_choices must be a list of paths, got {type(choices).__name__}")
    out = []
    for i, node in enumerate(choices):
        if isinstance(node, (str, bytes)) or not isinstance(node, (list, tuple)):
            raise UserError(f"{source}: node #{i} ({node!r}) is not a list of ranks")
        for r in node:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                raise UserError(f"{source}: node {list(node)!r} has a non-integer rank {r!r}")
        out.append(tuple(int(r) for r in node))
    return tuple(out)


@dataclass(frozen=True)
class Tree:
    """A candidate tree: `paths` in insertion (proposal) order, the root implicit.

    For trees from the builders every prefix `paths[:m]` is itself a tree (a proposal
    sequence). `name` only labels the tree in messages and tables.
    """

    paths: tuple[tuple[int, ...], ...]
    name: str = field(default="tree", compare=False)

    def __post_init__(self):
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        object.__setattr__(self, "paths", paths)
        _check_paths(paths, self.name)

    @property
    def size(self) -> int:
        return len(self.paths)

    @functools.cached_property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @functools.cached_property
    def sorted_paths(self) -> tuple[tuple[int, ...], ...]:
        return tuple(sorted(self.paths, key=lambda p: (len(p), p)))

    @functools.cached_property
    def depth_histogram(self) -> tuple[int, ...]:
        counts = np.bincount([len(p) for p in self.paths], minlength=self.depth + 1)
        return tuple(int(c) for c in counts[1:])

    @functools.cached_property
    def max_rank_per_depth(self) -> tuple[int, ...]:
        best = [0] * self.depth
        for p in self.paths:
            best[len(p) - 1] = max(best[len(p) - 1], p[-1])
        return tuple(best)

    @functools.cached_property
    def num_leaves(self) -> int:
        parents = {p[:-1] for p in self.paths}
        return sum(1 for p in self.paths if p not in parents)

    @functools.cached_property
    def rank_matrix(self) -> np.ndarray:
        """(n, depth) int64 ranks in insertion order, -1 past each node's depth: for vectorised
        per-node arithmetic."""
        m = np.full((self.size, self.depth), -1, dtype=np.int64)
        for i, p in enumerate(self.paths):
            m[i, : len(p)] = p
        m.setflags(write=False)
        return m

    def prefix(self, n: int) -> Tree:
        """The first n nodes in insertion order; an error if they do not form a tree."""
        if not 0 <= n <= self.size:
            raise ValueError(f"prefix length {n} outside 0..{self.size}")
        try:
            return Tree(self.paths[:n], name=self.name)
        except UserError as err:
            raise UserError(f"{self.name}: its first {n} nodes do not form a tree ({err})") from None

    def to_choices(self) -> list[list[int]]:
        return [list(p) for p in self.paths]

    def __repr__(self) -> str:
        return f"Tree(name={self.name!r}, size={self.size}, depth={self.depth})"


def make_tree(choices, *, topk=None, num_heads=None, allow_empty=False, source="tree") -> Tree:
    """Validate medusa_choices (lists or tuples of ints) and return a Tree named `source`."""
    paths = _parse_choices(choices, source)
    _check_paths(paths, source, topk=topk, num_heads=num_heads, allow_empty=allow_empty)
    return Tree(paths, name=source)


@functools.lru_cache(maxsize=1)
def _reference_data() -> dict:
    text = resources.files("treeopt").joinpath("data/medusa_trees.json").read_text(encoding="utf-8")
    return json.loads(text)


def reference_trees() -> dict[str, Tree]:
    """The trees the Medusa authors ship, by name, in their greedy insertion order."""
    return {name: make_tree(ch, source=name) for name, ch in _reference_data()["trees"].items()}


def reference_trees_about() -> str:
    """Attribution and licence of the reference trees."""
    return _reference_data()["about"]


def load_tree(spec: str, *, topk=None, num_heads=None, allow_empty=False) -> Tree:
    """A tree from a reference name, a JSON file (a list, or a treeopt.tree/v1 document), a
    selection cell (`selection.json:batch=8,context=1024`, or `selection.json:mix` for the
    traffic-mix tree), or a Python/JSON literal such as "[[0], [0, 0], (1,)]"."""
    spec = str(spec)
    refs = _reference_data()["trees"]
    if spec in refs:
        return make_tree(refs[spec], topk=topk, num_heads=num_heads, source=spec)
    path = Path(spec)
    stripped = spec.strip()
    if not stripped.startswith(("[", "(")) and not path.exists() and ":" in spec:
        file_part, cell = spec.rsplit(":", 1)
        if Path(file_part).is_file():
            choices = selection_cell_choices(file_part, cell)
            return make_tree(choices, topk=topk, num_heads=num_heads, allow_empty=allow_empty, source=spec)
    if not stripped.startswith(("[", "(")):
        if not path.exists():
            names = ", ".join(refs)
            raise UserError(f"{spec}: no such file, and not a reference tree ({names}) or a list literal")
        doc = read_json_input(spec, "a tree file")
        if isinstance(doc, dict):
            if doc.get("format") != TREE_FORMAT:
                raise UserError(
                    f"{spec}: field 'format' is {doc.get('format')!r}, expected {TREE_FORMAT!r} "
                    "(or a plain list of paths)"
                )
            if "medusa_choices" not in doc:
                raise UserError(f"{spec}: field 'medusa_choices' is missing")
            doc = doc["medusa_choices"]
        return make_tree(doc, topk=topk, num_heads=num_heads, allow_empty=allow_empty, source=spec)
    try:
        choices = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UserError(f"tree literal {_short(spec)}: not a valid list of paths") from None
    return make_tree(
        choices, topk=topk, num_heads=num_heads, allow_empty=allow_empty, source=f"tree literal {_short(spec)}"
    )


# The document `treeopt select` writes (treeopt/selection_types.py; docs/formats.md#selections-treeoptselectionv1).
# Read here as JSON, not as a `Selection`: the tree sits below the selection types, which build
# their trees with it.
_SELECTION_FORMAT = "treeopt.selection/v1"


def _cell_name(cell: dict) -> str:
    return f"batch={cell.get('batch')},context={cell.get('context')}"


def selection_cell_choices(path, cell: str) -> list:
    """medusa_choices of one cell of a selection JSON: `batch=B,context=S` (context may be left
    out where the batch has one cell) or `mix` (docs/formats.md#selections-treeoptselectionv1)."""
    spec = f"{path}:{cell}"
    doc = read_json_input(path, "a selection file")
    if not isinstance(doc, dict) or doc.get("format") != _SELECTION_FORMAT or not isinstance(doc.get("cells"), list):
        raise UserError(f"{spec}: {path} is not a {_SELECTION_FORMAT} document (from `treeopt select`)")
    bad = next((i for i, c in enumerate(doc["cells"]) if not isinstance(c, dict)), None)
    if bad is not None:
        raise UserError(f"{spec}: cells[{bad}] is {type(doc['cells'][bad]).__name__}, expected an object")
    if cell.strip() == "mix":
        mix = doc.get("mix")
        if not isinstance(mix, dict) or "medusa_choices" not in mix:
            raise UserError(f"{spec}: the selection has no traffic-mix tree (write it with `treeopt select --mix`)")
        if not mix["medusa_choices"]:
            raise UserError(f"{spec}: the traffic-mix choice is no speculation (0 nodes): there is no tree to load")
        return mix["medusa_choices"]
    want: dict[str, int] = {}
    for part in cell.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        digits = value.strip()
        # str.isdigit also holds for '²' and other digits int() refuses: ASCII only, and short
        if not eq or key not in ("batch", "context") or not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
            raise UserError(f"{spec}: the cell must be 'batch=B,context=S' or 'mix', got {cell!r}")
        want[key] = int(value)
    if "batch" not in want:
        raise UserError(f"{spec}: the cell needs batch=B (and context=S)")
    found = [c for c in doc["cells"] if all(c.get(k) == v for k, v in want.items())]
    available = "; ".join(_cell_name(c) for c in doc["cells"]) or "none"
    if not found:
        raise UserError(f"{spec}: no such cell in the selection (cells: {available})")
    if len(found) > 1:
        raise UserError(
            f"{spec}: batch {want['batch']} has {len(found)} cells: add context=S "
            f"(cells: {'; '.join(_cell_name(c) for c in found)})"
        )
    choices = found[0].get("medusa_choices")
    if not choices:
        raise UserError(f"{spec}: that cell's choice is no speculation (0 nodes): there is no tree to load")
    return choices


def _short(s: str, n: int = 40) -> str:
    s = " ".join(s.split())
    return repr(s if len(s) <= n else s[: n - 3] + "...")


@dataclass(frozen=True, eq=False)
class TreeBuffers:
    """Medusa's verification buffers (docs/trees.md#buffers). Token 0 is the root, token i+1 the
    i-th node in canonical (depth, path) order; q = n + 1."""

    attention_mask: np.ndarray  # (q, q) bool: row i attends to its ancestors and itself
    position_ids: np.ndarray  # (q,) int64: depth, root 0 (added to the context length)
    tree_indices: np.ndarray  # (q,) int64 into [base_top1, head1 top1..TOPK, head2 ...]
    retrieve_indices: np.ndarray  # (leaves, depth+1) int64, -1 padded, Medusa's row order
    parent: np.ndarray  # (q,) int64 parent token index, -1 for the root
    depth: np.ndarray  # (q,) int64, == position_ids

    def to_dict(self) -> dict:
        return {
            "attention_mask": self.attention_mask.astype(int).tolist(),
            "position_ids": self.position_ids.tolist(),
            "tree_indices": self.tree_indices.tolist(),
            "retrieve_indices": self.retrieve_indices.tolist(),
        }


#: the most memory `tree_buffers` allocates before refusing (the q x q mask dominates)
BUFFER_BYTES_LIMIT = 512 * 2**20


def buffer_bytes(num_nodes: int, depth: int, leaves: int) -> int:
    """Bytes `tree_buffers` allocates for a tree of `num_nodes` nodes, `depth` and `leaves`
    leaves: the (q, q) bool mask, the (q, depth+1) int64 root-to-node chains, the
    (leaves, depth+1) int64 retrieve indices and five (q,) int64 vectors; q = n + 1."""
    q = num_nodes + 1
    return q * q + 8 * (q + leaves) * (depth + 1) + 5 * 8 * q


def tree_buffers(tree: Tree, topk: int, *, max_bytes: int = BUFFER_BYTES_LIMIT) -> TreeBuffers:
    """Buffers in Medusa's exact convention for candidate width `topk`.

    UserError with the estimate when they would take more than `max_bytes` (`buffer_bytes`):
    the mask grows as the square of the tree (docs/trees.md#buffers), 9.3 GiB at 100,000
    nodes, far beyond any tree a GPU verifies in one step.
    """
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise UserError(f"topk: must be a positive integer, got {topk!r}")
    _check_paths(tree.paths, tree.name, topk=topk)
    nodes = tree.sorted_paths
    q = len(nodes) + 1
    index = {p: i + 1 for i, p in enumerate(nodes)}
    depth = np.zeros(q, dtype=np.int64)
    parent = np.full(q, -1, dtype=np.int64)
    last = np.zeros(q, dtype=np.int64)
    for i, p in enumerate(nodes, start=1):
        depth[i] = len(p)
        parent[i] = index.get(p[:-1], 0)
        last[i] = p[-1]
    tree_indices = np.where(depth > 0, 1 + topk * (depth - 1) + last, 0)
    leaf_count = q - len(np.unique(parent[1:]))
    need = buffer_bytes(q - 1, int(depth.max()), leaf_count)
    if need > max_bytes:
        raise UserError(
            f"{tree.name}: the buffers of {q - 1} nodes (depth {int(depth.max())}, "
            f"{leaf_count} leaves) would take {need / 2**30:.2f} GiB, more than the "
            f"{max_bytes / 2**30:.2f} GiB limit"
        )

    # Canonical order puts every depth level after its parents' level, so one vectorised pass
    # per depth fills both the ancestor mask and the root-to-node paths.
    max_depth = int(depth.max())
    mask = np.zeros((q, q), dtype=bool)
    mask[0, 0] = True
    chain = np.full((q, max_depth + 1), -1, dtype=np.int64)  # chain[i, j] = depth-j ancestor
    chain[0, 0] = 0
    for d in range(1, max_depth + 1):
        level = np.flatnonzero(depth == d)
        mask[level] = mask[parent[level]]
        mask[level, level] = True
        chain[level] = chain[parent[level]]
        chain[level, d] = level

    # Leaves, in reverse canonical order (depth descending, path descending): Medusa's rows.
    has_child = np.zeros(q, dtype=bool)
    has_child[parent[1:]] = True
    leaves = np.flatnonzero(~has_child)[::-1]
    retrieve = chain[leaves]

    for a in (mask, depth, tree_indices, retrieve, parent):
        a.setflags(write=False)
    return TreeBuffers(
        attention_mask=mask,
        position_ids=depth,
        tree_indices=tree_indices.astype(np.int64),
        retrieve_indices=retrieve,
        parent=parent,
        depth=depth,
    )
