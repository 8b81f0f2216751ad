"""Accepted lengths from per-position rank vectors, and the decoder's tokens per step simulated
on calibration sequences.

Under greedy verification the tokens a decoding step produces depend only on where it starts:
a step that starts at position t (its root is x_{t+1}, the heads read h_t) accepts the node
(i_1 .. i_d) exactly when head j's rank of its label x_{t+j+1} is i_j for every j <= d
(docs/statistics.md#joint-statistics-and-rank-vectors). With the rank vector
R_t = (r_1(t) .. r_K(t)) the step produces

    A_T(t) = 1 + max{ d : (r_1(t), .., r_d(t)) is a node of T }       (1 with no node matched)

tokens (accepted nodes + the bonus token), and the next step starts at t + A_T(t).

tau = 1 + sum of node values (`treeopt.accuracy.expected_tokens`, joint) is the mean of A_T over
*all* positions. The decoder does not sample positions uniformly: it starts steps only where it
lands, so a stretch of easy positions is crossed in a few long steps and a hard stretch takes one
step per token. When acceptance is autocorrelated along a sequence (it is: easy code stays easy)
the decoder's mean tokens per step is below tau. `simulate_tokens_per_step` walks each
calibration sequence the way the decoder does and returns that mean exactly (for the calibration
sequences, under greedy verification).

Rank vectors (the `treeopt calibrate` sidecar, see docs/formats.md): ``ranks`` (N, K)
int, one row per position, ``ranks[i, k]`` the exact rank of head k+1's label (0 = top-1), a
value < 0 where head k+1 has no label there, a value >= the table's width for a miss;
``sequence`` (N,) int, the sequence (prompt) each row belongs to. The rows of one sequence are
consecutive positions t, t+1, ... in order and form one contiguous block (so ``sequence`` is
non-decreasing); only the non-decreasing part can be checked, the rest is the producer's
promise (`calibration.runner` keeps it).

numpy only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from treeopt.accuracy import load_accuracy, rank_hits
from treeopt.errors import UserError
from treeopt.npz_input import read_npz, write_npz
from treeopt.tree import Tree

__all__ = [
    "RANK_VECTORS_SUFFIX",
    "accepted_lengths",
    "load_rank_vectors",
    "rank_vectors_fingerprint",
    "rank_vectors_path",
    "save_rank_vectors",
    "simulate_tokens_per_step",
    "simulated_tau_curve",
    "walked_tokens_per_step",
]

#: the sidecar of ``acc.json`` is ``acc.ranks.npz``
RANK_VECTORS_SUFFIX = ".ranks.npz"
#: (prefixes x sequences) pointers walked at once by `simulated_tau_curve`
_WALK_CELLS = 1 << 20


# --------------------------------------------------------------------------------------------
# accepted lengths


def _as_ranks(ranks) -> np.ndarray:
    ranks = np.asarray(ranks)
    if ranks.ndim != 2 or ranks.shape[1] < 1:
        raise UserError(f"ranks: expected an (N, K) array of label ranks, got shape {ranks.shape}")
    if ranks.dtype.kind not in "iu":
        raise UserError(f"ranks: expected integer ranks, got dtype {ranks.dtype}")
    return ranks.astype(np.int64, copy=False)


def _tree_index(tree: Tree):
    """Per depth d = 1..depth: the depth-d nodes' keys ``parent * W + rank`` sorted, and their
    insertion-order indices in the same order; the parent of a depth-1 node is n (the root).
    Also each node's parent index (n for depth 1). Loops over depth only."""
    n = tree.size
    m = tree.rank_matrix  # (n, depth), -1 past each node's depth
    W = int(m.max()) + 1 if n else 1
    node_depth = (m >= 0).sum(1)
    ancestor = np.full(n, n, np.int64)  # depth-(d-1) ancestor of every node deep enough
    parent = np.full(n, n, np.int64)
    levels = []
    for d in range(1, tree.depth + 1):
        deep = node_depth >= d
        key = ancestor[deep] * W + m[deep, d - 1]
        here = np.flatnonzero(node_depth == d)
        order = np.argsort(key[node_depth[deep] == d], kind="stable")
        keys_d = key[node_depth[deep] == d][order]
        idx_d = here[order]
        parent[here] = ancestor[here]
        # every deeper node's depth-d prefix is a node (trees are prefix-closed)
        ancestor[deep] = idx_d[np.searchsorted(keys_d, key)]
        levels.append((keys_d, idx_d))
    return W, levels, parent


def _matched_nodes(ranks: np.ndarray, tree: Tree) -> np.ndarray:
    """(N, D) insertion-order index of the node each position's rank vector matches at depth
    d = 1..D (D = min(tree depth, K)), -1 once the chain has ended."""
    N, K = ranks.shape
    D = min(tree.depth, K)
    out = np.full((N, D), -1, np.int64)
    if D == 0 or N == 0:
        return out
    W, levels, _ = _tree_index(tree)
    cur = np.full(N, tree.size, np.int64)  # the root
    alive = np.ones(N, bool)
    for d in range(D):
        keys_d, idx_d = levels[d]
        r = ranks[:, d]
        ok = alive & (r >= 0) & (r < W)  # no label or a rank beyond the tree: no match
        key = cur * W + np.where(ok, r, 0)
        j = np.minimum(np.searchsorted(keys_d, key), len(keys_d) - 1)
        alive = ok & (keys_d[j] == key)
        cur = np.where(alive, idx_d[j], cur)
        out[alive, d] = idx_d[j[alive]]
        if not alive.any():
            break
    return out


def accepted_lengths(ranks, tree: Tree) -> np.ndarray:
    """A_T(t) for every position: 1 + the depth of the deepest node of `tree` that the rank
    vector ``ranks[t]`` starts with (tokens a greedy step starting at t produces, bonus
    included). ranks (N, K) int: < 0 (no label) and ranks beyond every node never match; nodes
    deeper than K never match. Returns (N,) int64. Vectorised over positions and nodes (loops
    over depth only)."""
    ranks = _as_ranks(ranks)
    return 1 + (_matched_nodes(ranks, tree) >= 0).sum(1)


# --------------------------------------------------------------------------------------------
# the walk


def _blocks(sequence_ids, n_rows: int, start_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) row ranges of each sequence, where steps may start; UserError unless rows
    are grouped and ordered."""
    if start_rows is not None and (isinstance(start_rows, bool) or int(start_rows) != start_rows or start_rows < 1):
        raise UserError(f"start_rows: must be an integer >= 1 or None, got {start_rows!r}")
    seq = np.asarray(sequence_ids)
    if seq.shape != (n_rows,):
        raise UserError(f"sequence_ids: expected shape ({n_rows},) (one per rank vector), got {seq.shape}")
    if n_rows == 0:
        raise UserError("ranks: no positions to walk")
    if seq.dtype.kind not in "iu":
        raise UserError(f"sequence_ids: expected integers, got dtype {seq.dtype}")
    down = np.flatnonzero(np.diff(seq) < 0)
    if down.size:
        i = int(down[0])
        raise UserError(
            f"sequence_ids: must be non-decreasing (the rows of a sequence are its "
            f"positions in order, one block per sequence); row {i + 1} has sequence "
            f"{seq[i + 1]} after {seq[i]}"
        )
    starts = np.flatnonzero(np.diff(seq, prepend=seq[0] - 1))
    ends = np.append(starts[1:], n_rows)
    if start_rows is not None:
        ends = np.minimum(ends, starts + int(start_rows))
    return starts, ends


def simulate_tokens_per_step(ranks, sequence_ids, tree: Tree, *, start_rows: int | None = None) -> tuple[float, int]:
    """The greedy decoder's mean tokens per step on the calibration sequences, walked exactly.

    Each sequence: t <- its first row; repeat: A = A_T(t), record A, t += A; until t passes the
    sequence's last row (or its first `start_rows` rows). Returns (total recorded tokens /
    steps, steps) over all sequences (the mean over (sequence, step) pairs, as the decoder's
    measurement). Vectorised across sequences: one iteration per step, all pointers at once.
    Rows must be ordered by position within each sequence, one block per sequence (module doc);
    non-decreasing `sequence_ids` is checked.

    End of a sequence: near it the later heads have no label, so the last steps' acceptance is
    cut short, while the decoder counts its last step in full (before the cut at
    max_new_tokens): with few steps per sequence the walk reads a little low (1.5% at 64 nodes
    with 32 generated tokens on the demo model; it shrinks as 1 / generated tokens). To match a
    decoder run of ``max_new_tokens = S`` exactly, calibrate with ``steps >= S + K`` and pass
    ``start_rows = S - 1`` (steps start in the first S - 1 rows, as the decoder's do after the
    prefill token; their acceptance still sees the labels beyond).
    """
    ranks = _as_ranks(ranks)
    return walked_tokens_per_step(accepted_lengths(ranks, tree), sequence_ids, start_rows=start_rows)


def walked_tokens_per_step(lengths, sequence_ids, *, start_rows: int | None = None) -> tuple[float, int]:
    """`simulate_tokens_per_step`'s walk over given per-row step lengths (N,) (tokens a step
    starting at that row produces, >= 1): (mean tokens per step, steps)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts, ends = _blocks(sequence_ids, lengths.shape[0], start_rows)
    ptr, end = starts.copy(), ends
    tokens, steps = 0, 0
    while ptr.size:
        a = lengths[ptr]
        tokens += int(a.sum())
        steps += a.size
        ptr = ptr + a
        live = ptr < end
        ptr, end = ptr[live], end[live]
    return tokens / steps, steps


def simulated_tau_curve(tree: Tree, ranks, sequence_ids, *, start_rows: int | None = None) -> np.ndarray:
    """(n+1,) `simulate_tokens_per_step` of ``tree.prefix(m)`` for m = 0..n (n = tree.size):
    the walked counterpart of `treeopt.build.tau_curve`; entry 0 is exactly 1.0. `start_rows`
    as in `simulate_tokens_per_step`.

    Needs a proposal sequence: every node after its parent in insertion order (UserError
    otherwise). One pass: a position's matched chain of node indices gives its accepted length
    under every prefix (1 + the number of chain nodes with index < m), and the walks of all
    prefixes advance together, chunked over sequences.
    """
    ranks = _as_ranks(ranks)
    starts, ends = _blocks(sequence_ids, ranks.shape[0], start_rows)
    n = tree.size
    if n:
        _, _, parent = _tree_index(tree)
        late = np.flatnonzero((parent != n) & (parent > np.arange(n)))
        if late.size:
            i = int(late[0])
            raise UserError(
                f"{tree.name}: node {list(tree.paths[i])} comes before its parent in "
                "insertion order, so its prefixes are not all trees (not a proposal sequence)"
            )
    chain = _matched_nodes(ranks, tree)  # (N, D), indices increase along the chain
    D = chain.shape[1]
    # position -> chain, with an unmatched depth larger than any m
    chain = np.where(chain >= 0, chain, n + 1)
    M = n + 1
    prefix = np.arange(M)
    tokens = np.zeros(M, np.int64)
    steps = np.zeros(M, np.int64)
    per_chunk = max(1, _WALK_CELLS // (M * max(D, 1)))
    for lo in range(0, len(starts), per_chunk):
        first, stop = starts[lo : lo + per_chunk], ends[lo : lo + per_chunk]
        ptr = np.tile(first, M)  # prefix-major: entry (m, s)
        end = np.tile(stop, M)
        m = np.repeat(prefix, len(first))
        while ptr.size:
            a = 1 + (chain[ptr] < m[:, None]).sum(1)
            tokens += np.bincount(m, weights=a, minlength=M).astype(np.int64)
            steps += np.bincount(m, minlength=M)
            ptr = ptr + a
            live = ptr < end
            ptr, end, m = ptr[live], end[live], m[live]
    return tokens / steps


# --------------------------------------------------------------------------------------------
# the sidecar file


def rank_vectors_path(accuracy_path) -> Path:
    """``acc.json`` -> ``acc.ranks.npz`` (beside it)."""
    p = Path(accuracy_path)
    return p.with_suffix(RANK_VECTORS_SUFFIX) if p.suffix else p.with_name(p.name + RANK_VECTORS_SUFFIX)


def save_rank_vectors(
    path, ranks, sequence, width: int, fingerprint: dict | None = None, run_id: str | None = None
) -> None:
    """Write an .npz (keys ranks, sequence, width, fingerprint as a JSON string, and run_id
    when given: the provenance key its accuracy table carries too) atomically.

    The archive is byte-identical for equal inputs (`treeopt.npz_input.write_npz`).
    """
    arrays = {
        "ranks": np.asarray(ranks),
        "sequence": np.asarray(sequence),
        "width": np.asarray(int(width), np.int64),
        "fingerprint": np.asarray(json.dumps(fingerprint or {}, sort_keys=True)),
    }
    if run_id is not None:
        arrays["run_id"] = np.asarray(str(run_id))
    write_npz(path, arrays)


def load_rank_vectors(accuracy_path, *, table=None) -> tuple[np.ndarray, np.ndarray] | None:
    """The rank vectors saved beside an accuracy table by `treeopt calibrate`: (ranks (N, K),
    sequence (N,)), or None when there is no sidecar (tables from elsewhere).

    The sidecar is checked against the table (`table`, else the accuracy file when it exists):
    its per-head, per-rank counts must equal the table's hits and positions, and its
    ``run_id`` the table's ``provenance.run_id`` when either has one, so a sidecar left from
    another run (e.g. the table was overwritten by ``calibrate --import``, or by a concurrent
    calibration) is an error, not a silently wrong prediction (docs/formats.md#output-safety). UserError naming the
    file when it is unreadable or inconsistent.
    """
    side = rank_vectors_path(accuracy_path)
    if not side.exists():
        return None
    z = read_npz(side, "a rank-vector file")
    missing = [k for k in ("ranks", "sequence", "width") if k not in z]
    if missing:
        raise UserError(f"{side}: not a rank-vector file (no '{missing[0]}' array)")
    ranks, sequence, width = z["ranks"], z["sequence"], z["width"]
    side_id = _text_member(z, "run_id", side)
    if ranks.ndim != 2 or ranks.shape[1] < 1 or ranks.dtype.kind not in "iu":
        raise UserError(f"{side}: 'ranks' must be an (N, K) integer array, got {ranks.dtype} {ranks.shape}")
    if sequence.shape != (ranks.shape[0],) or sequence.dtype.kind not in "iu":
        raise UserError(
            f"{side}: 'sequence' must be {ranks.shape[0]} integers (one per row), got {sequence.dtype} {sequence.shape}"
        )
    if width.shape != () or width.dtype.kind not in "iu" or int(width) < 1:
        raise UserError(f"{side}: 'width' must be an integer >= 1")
    if ranks.shape[0] and np.any(np.diff(sequence) < 0):
        raise UserError(f"{side}: 'sequence' is not non-decreasing (rows must be grouped by sequence)")
    if table is None and Path(accuracy_path).is_file():
        table = load_accuracy(accuracy_path)
    if table is not None:
        _check_against_table(side, ranks, int(width), table, side_id)
    return ranks, sequence


def _text_member(z, key: str, side: Path) -> str | None:
    """A string member of the archive (None when absent); UserError when it is not one."""
    if key not in z:
        return None
    value = z[key]
    if value.shape != () or value.dtype.kind != "U":
        raise UserError(f"{side}: '{key}' must be a string")
    return str(value)


def rank_vectors_fingerprint(accuracy_path) -> dict | None:
    """The inputs' fingerprint recorded in the sidecar of `accuracy_path` (what
    `calibration.runner` compares before resuming a finished output), None when there is no
    sidecar. UserError when it is unreadable."""
    side = rank_vectors_path(accuracy_path)
    if not side.exists():
        return None
    text = _text_member(read_npz(side, "a rank-vector file"), "fingerprint", side)
    try:
        fingerprint = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        fingerprint = None
    if not isinstance(fingerprint, dict):
        raise UserError(f"{side}: 'fingerprint' must be a JSON object")
    return fingerprint


def _check_against_table(side: Path, ranks: np.ndarray, width: int, table, side_id: str | None = None) -> None:
    K, R = table.hits.shape
    problem = None
    table_id = table.provenance.get("run_id")
    if (side_id is not None or table_id is not None) and side_id != table_id:
        problem = f"run_id {side_id}, the table's is {table_id}"
    elif ranks.shape[1] != K or width != R:
        problem = f"{ranks.shape[1]} heads x width {width}, the table has {K} x {R}"
    else:
        counts = rank_hits(ranks, R)
        if not (np.array_equal(counts.positions, table.positions) and np.array_equal(counts.hits, table.hits)):
            problem = "its per-head, per-rank counts differ from the table's"
    if problem:
        raise UserError(
            f"{side}: does not belong to the accuracy table beside it ({problem}); delete it or recalibrate"
        )
