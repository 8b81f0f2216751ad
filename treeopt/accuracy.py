"""Draft-head accuracy tables and the expected number of tokens per step of a tree.

Per-rank accuracy acc[k][r] = P(head k+1's rank-r proposal is the label), exact rank
(docs/statistics.md#per-rank-accuracy). Optional joint statistics keep the dependence
between heads: for each node path the number of positions whose rank vector starts with it.
The file format is documented in docs/formats.md.
"""

from __future__ import annotations

import csv
import datetime
import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from treeopt.errors import UserError
from treeopt.fileio import parse_json_input, read_text_input, write_json_rows
from treeopt.layout import DRAFTER_SUBDIRS
from treeopt.tree import Tree, _node_str
from treeopt.version import __version__

ACCURACY_FORMAT = "treeopt.accuracy/v1"
# Float slack for "hits <= positions" and "row sums <= 1" on tables derived from rounded
# published accuracies.
_TOL = 1e-6


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class AccuracyTable:
    """Per-head, per-rank hit counts with their denominators, optional joint prefix counts and
    provenance. Counts may be fractional only for tables derived from published accuracies
    (then positions = 1 and hits = accuracies)."""

    hits: np.ndarray  # (K, R) float64: positions where head k's rank-r proposal was the label
    positions: np.ndarray  # (K,) float64: labelled positions of head k (its own count)
    joint: dict[tuple[int, ...], int] | None = None  # path -> positions starting with it
    provenance: dict | None = None

    def __post_init__(self):
        hits = np.array(self.hits, dtype=np.float64)
        positions = np.array(self.positions, dtype=np.float64)
        src = (self.provenance or {}).get("source", "accuracy table")
        _validate_counts(hits, positions, src)
        object.__setattr__(self, "hits", _readonly(hits))
        object.__setattr__(self, "positions", _readonly(positions))
        object.__setattr__(self, "provenance", dict(self.provenance or {}))
        if self.joint is not None:
            # Keys from joint_counts_from_ranks are already tuples of ints: don't rebuild them.
            joint = {p if type(p) is tuple else tuple(int(r) for r in p): c for p, c in self.joint.items()}
            _validate_joint(joint, hits.shape[1], positions, src)
            object.__setattr__(self, "joint", joint)

    @property
    def num_heads(self) -> int:
        return self.hits.shape[0]

    @property
    def drafter(self) -> str | None:
        """The kind of drafter measured ("medusa", "hydra", "mlp-speculator", "draft-model"):
        `treeopt calibrate` records a drafter other than Medusa heads as "KIND:SPEC" in
        provenance["heads"] and Medusa heads as the spec alone; None for a table that does not
        say (from a paper or another tool)."""
        prov = self.provenance or {}
        heads = str(prov.get("heads") or "")
        kind = heads.split(":", 1)[0]
        if kind in DRAFTER_SUBDIRS:
            return kind
        return "medusa" if prov.get("source") == "treeopt calibrate" else None

    @property
    def width(self) -> int:
        return self.hits.shape[1]

    @property
    def accuracy(self) -> np.ndarray:
        """(K, R) exact-rank accuracy hits / positions."""
        return self.hits / self.positions[:, None]

    def wilson(self, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Wilson score interval (lo, hi) of each per-rank accuracy, (K, R) each
        (`wilson_interval`). Meaningless (very wide) for tables derived from published
        accuracies, whose positions are 1."""
        interval = wilson_interval(self.hits, self.positions[:, None], confidence=confidence)
        return interval.low, interval.high

    def to_dict(self) -> dict:
        acc = self.accuracy
        heads = [
            {
                "head": k + 1,
                "positions": _num(self.positions[k]),
                "hits": [_num(h) for h in self.hits[k]],
                "accuracy": acc[k].tolist(),
            }
            for k in range(self.num_heads)
        ]
        joint = None
        if self.joint is not None:
            items = sorted(self.joint.items(), key=lambda kv: (len(kv[0]), kv[0]))
            joint = {"prefixes": [[list(p), _num(c)] for p, c in items]}
        return {
            "format": ACCURACY_FORMAT,
            "num_heads": self.num_heads,
            "width": self.width,
            "heads": heads,
            "joint": joint,
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, d, source: str = "accuracy table") -> AccuracyTable:
        """Parse and validate a treeopt.accuracy/v1 document; errors name `source` and the field."""
        if not isinstance(d, dict):
            raise UserError(f'{source}: expected a JSON object with "format": "{ACCURACY_FORMAT}"')
        if d.get("format") != ACCURACY_FORMAT:
            raise UserError(f"{source}: field 'format' is {d.get('format')!r}, expected {ACCURACY_FORMAT!r}")
        K = _int_field(d, "num_heads", source, minimum=1)
        R = _int_field(d, "width", source, minimum=1)
        heads = d.get("heads")
        if not isinstance(heads, list) or len(heads) != K:
            got = f"{len(heads)} entries" if isinstance(heads, list) else type(heads).__name__
            raise UserError(f"{source}: field 'heads' must list {K} heads (num_heads), got {got}")
        # each head's row is checked against the width before any (K, width) array exists: a
        # width of 10^12 with short rows is one line, not a failed 7 TiB allocation
        rows = [_head_from_dict(h, k, R, source) for k, h in enumerate(heads)]
        hits = np.stack([row for row, _ in rows]).astype(float)
        positions = np.array([n for _, n in rows], dtype=float)
        joint = _joint_from_dict(d.get("joint"), R, positions, source)
        return cls(hits=hits, positions=positions, joint=joint, provenance=_provenance_from_dict(d, source))

    def save(self, path) -> None:
        """Write the treeopt.accuracy/v1 JSON file atomically."""
        write_json_rows(path, self.to_dict())

    @classmethod
    def from_ranks(cls, ranks, width: int, *, provenance=None, joint: bool = True) -> AccuracyTable:
        """A table from observed ranks: `ranks` (N, K) int, rank of the label under head k at
        position t; < 0 = no label (not counted), >= width = labelled but missed."""
        counts = rank_hits(ranks, width)
        prov = {"date": datetime.date.today().isoformat(), "tool_version": __version__}
        prov.update(provenance or {})
        return cls(
            hits=counts.hits,
            positions=counts.positions,
            joint=joint_counts_from_ranks(ranks, width) if joint else None,
            provenance=prov,
        )


def _head_from_dict(h, k: int, width: int, source: str) -> tuple[np.ndarray, float]:
    """(hits, positions) of entry k of a treeopt.accuracy/v1 document's heads, validated; a
    stored `accuracy` must be hits / positions."""
    where = f"{source}: heads[{k}]"
    if not isinstance(h, dict):
        raise UserError(f"{where}: expected an object with head, positions, hits")
    if h.get("head") != k + 1:
        raise UserError(f"{where}: field 'head' is {h.get('head')!r}, expected {k + 1} (1-based, in order)")
    positions = _number(h.get("positions"), f"{where}.positions")
    row = h.get("hits")
    if not isinstance(row, list) or len(row) != width:
        got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
        raise UserError(f"{where}.hits: expected {width} values (width), got {got}")
    hits = np.array([_number(x, f"{where}.hits[{r}]") for r, x in enumerate(row)])
    _validate_counts(hits[None, :], np.array([positions]), source, first_head=k)
    if h.get("accuracy") is None:
        return hits, positions
    acc = h["accuracy"]
    if not isinstance(acc, list) or len(acc) != width:
        raise UserError(f"{where}.accuracy: expected {width} values (width)")
    acc = np.array([_number(x, f"{where}.accuracy[{r}]") for r, x in enumerate(acc)])
    bad = np.flatnonzero(np.abs(acc - hits / positions) > 1e-6)
    if bad.size:
        r = int(bad[0])
        raise UserError(
            f"{where}.accuracy[{r}] is {acc[r]:g} but hits/positions is "
            f"{hits[r] / positions:g} (accuracy is derived: fix or drop it)"
        )
    return hits, positions


def _joint_from_dict(jd, width: int, positions: np.ndarray, source: str) -> dict | None:
    """The joint prefix counts of a treeopt.accuracy/v1 document's `joint` field, validated."""
    if jd is None:
        return None
    if not isinstance(jd, dict) or not isinstance(jd.get("prefixes"), list):
        raise UserError(f"{source}: field 'joint' must be null or {{\"prefixes\": [[path, count], ...]}}")
    joint = {}
    for i, item in enumerate(jd["prefixes"]):
        where = f"{source}: joint.prefixes[{i}]"
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)):
            raise UserError(f"{where}: expected [path, count]")
        path = item[0]
        for r in path:
            if isinstance(r, bool) or not isinstance(r, int):
                raise UserError(f"{where}: path {path!r} has a non-integer rank {r!r}")
        path = tuple(path)
        if path in joint:
            raise UserError(f"{where}: path {_node_str(path)} appears twice")
        joint[path] = _count(item[1], f"{where} (count of {_node_str(path)})")
    _validate_joint(joint, width, positions, source)
    return joint


def _provenance_from_dict(d: dict, source: str) -> dict:
    prov = d.get("provenance", {})
    if prov is None:
        prov = {}
    if not isinstance(prov, dict):
        raise UserError(f"{source}: field 'provenance' must be an object")
    if "run_id" in prov and not isinstance(prov["run_id"], str):
        # the key its rank-vector sidecar is matched by (docs/formats.md#output-safety)
        raise UserError(f"{source}: field 'provenance.run_id' must be a string, got {prov['run_id']!r}")
    return prov


def _num(x: float):
    """Counts print as integers when they are integers."""
    x = float(x)
    return int(x) if x.is_integer() else x


def _number(x, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise UserError(f"{where}: expected a finite number, got {x!r}")
    return float(x)


def _count(x, where: str) -> float:
    x = _number(x, where)
    if x < 0:
        raise UserError(f"{where}: negative count {x:g}")
    return int(x) if x.is_integer() else x


def _int_field(d: dict, name: str, source: str, *, minimum: int) -> int:
    x = d.get(name)
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise UserError(f"{source}: field '{name}' must be an integer >= {minimum}, got {x!r}")
    return x


def _validate_counts(hits: np.ndarray, positions: np.ndarray, src: str, first_head: int = 0) -> None:
    if hits.ndim != 2 or hits.shape[0] < 1 or hits.shape[1] < 1:
        raise UserError(f"{src}: hits must be a (heads, width) matrix, got shape {hits.shape}")
    if positions.shape != (hits.shape[0],):
        raise UserError(f"{src}: positions must have one entry per head ({hits.shape[0]}), got shape {positions.shape}")
    if not (np.isfinite(hits).all() and np.isfinite(positions).all()):
        raise UserError(f"{src}: counts must be finite numbers")
    for k in range(hits.shape[0]):
        head = first_head + k + 1
        if positions[k] <= 0:
            raise UserError(f"{src}: head {head} has {positions[k]:g} labelled positions (needs > 0)")
        neg = np.flatnonzero(hits[k] < 0)
        if neg.size:
            raise UserError(f"{src}: head {head} rank {int(neg[0])} has a negative hit count {hits[k, neg[0]]:g}")
        total = hits[k].sum()
        if total > positions[k] * (1 + _TOL):
            raise UserError(f"{src}: head {head} has {total:g} hits in all ranks but only {positions[k]:g} positions")


def _check_joint_path(path: tuple[int, ...], count: float, width: int, positions: np.ndarray, fail) -> None:
    """`fail(path, problem)` unless the path lies within the heads and the width, and its count
    within its head's positions."""
    # Messages are built only on failure: this runs for every observed prefix.
    d = len(path)
    if d == 0:
        fail(path, "empty path")
    if d > len(positions):
        fail(path, f"depth {d} exceeds the {len(positions)} heads")
    if min(path) < 0 or max(path) >= width:
        fail(path, f"ranks must be in 0..{width - 1} (width {width})")
    if count < 0:
        fail(path, f"negative count {count:g}")
    if count > positions[d - 1] * (1 + _TOL):
        fail(path, f"count {count:g} exceeds head {d}'s {positions[d - 1]:g} positions")


def _validate_joint(joint: dict, width: int, positions: np.ndarray, src: str) -> None:
    below: dict[tuple[int, ...], float] = {}

    def fail(path, problem):
        raise UserError(f"{src}: joint statistics, path {_node_str(path)}: {problem}")

    for path, count in joint.items():
        _check_joint_path(path, count, width, positions, fail)
        if len(path) > 1 and count > 0:
            parent = joint.get(path[:-1])
            if parent is None or parent < count:
                fail(
                    path,
                    f"count {count:g} exceeds its prefix {_node_str(path[:-1])}'s count "
                    f"{0 if parent is None else parent:g} (prefix counts never grow with depth)",
                )
        below[path[:-1]] = below.get(path[:-1], 0) + count
    # A position continues its rank vector with one rank only: children share the parent's count.
    for parent, total in below.items():
        limit = joint.get(parent, 0) if parent else positions[0]
        if total > limit * (1 + _TOL):
            what = f"path {_node_str(parent)}'s count {limit:g}" if parent else f"head 1's {limit:g} positions"
            raise UserError(
                f"{src}: joint statistics: the paths one rank below {_node_str(parent) if parent else 'the root'} "
                f"count {total:g} in total, more than {what}"
            )


@dataclass(frozen=True)
class RankHits:
    """Per-rank hit counts of rank vectors: ``hits`` (K, R) int64, positions where head k's
    label had exact rank r < R; ``positions`` (K,) int64, positions where head k has a label
    (its own denominator, docs/statistics.md#per-head-normalisation)."""

    hits: np.ndarray
    positions: np.ndarray


def rank_hits(ranks, width: int) -> RankHits:
    """Count rank vectors into per-rank hits (docs/statistics.md#per-rank-accuracy).

    ranks (N, K) int, the exact rank of head k's label at each position: < 0 = no label (not
    counted), >= width = labelled but missed (counted in positions only). One bincount over
    the flattened (head, rank) cells, no loop over heads or positions.
    """
    ranks = np.asarray(ranks)
    if ranks.ndim != 2 or ranks.shape[1] < 1:
        raise UserError(f"ranks: expected an (N, K) array, got shape {ranks.shape}")
    if width < 1:
        raise UserError(f"width: must be >= 1, got {width}")
    num_heads = ranks.shape[1]
    ranks = ranks.astype(np.int64, copy=False)
    hit = (ranks >= 0) & (ranks < width)
    cell = (np.arange(num_heads, dtype=np.int64) * width)[None, :] + ranks
    hits = np.bincount(cell[hit], minlength=num_heads * width).reshape(num_heads, width)
    return RankHits(hits=hits, positions=(ranks >= 0).sum(axis=0, dtype=np.int64))


@dataclass(frozen=True)
class ConfidenceInterval:
    """Lower and upper bounds of a proportion, elementwise (same shape as the counts)."""

    low: np.ndarray
    high: np.ndarray


def wilson_interval(hits, positions, *, confidence: float = 0.95) -> ConfidenceInterval:
    """Wilson score interval of the proportion hits / positions
    (docs/statistics.md#confidence-intervals), elementwise over broadcast arrays; fractional
    counts allowed.

    The closed form of Wilson (1927) with z the two-sided normal quantile of `confidence`;
    NaN where positions <= 0 (no observation, no interval).
    """
    if not 0 < confidence < 1:
        raise UserError(f"confidence: must be between 0 and 1, got {confidence}")
    hits, n = np.broadcast_arrays(np.asarray(hits, np.float64), np.asarray(positions, np.float64))
    # the standard library's normal quantile: scipy.stats would cost every tree command ~0.7 s
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = hits / n
        z2n = z * z / n
        centre = (p + z2n / 2) / (1 + z2n)
        half = z * np.sqrt(np.maximum(p * (1 - p), 0) / n + z2n / (4 * n)) / (1 + z2n)
    # at p = 0 (p = 1) the bound is exactly 0 (1); centre -/+ half leaves rounding error there
    low = np.where(hits <= 0, 0.0, np.clip(centre - half, 0, 1))
    high = np.where(hits >= n, 1.0, np.clip(centre + half, 0, 1))
    empty = n <= 0
    low, high = np.where(empty, np.nan, low), np.where(empty, np.nan, high)
    return ConfidenceInterval(low=low, high=high)


def joint_counts_from_ranks(ranks, width: int) -> dict[tuple[int, ...], int]:
    """Count, for every path, the positions whose rank vector starts with it.

    ranks (N, K) int; a rank >= width or < 0 is a miss that ends the prefix. Vectorised: each
    row becomes one integer (digits rank + 1 in base width + 1, 0 from the first miss on),
    sorted once; a depth-d prefix is then an integer division, and equal prefixes are
    adjacent runs of the sorted array.
    """
    ranks = np.asarray(ranks)
    if ranks.ndim != 2:
        raise UserError(f"ranks: expected an (N, K) array, got shape {ranks.shape}")
    if width < 1:
        raise UserError(f"width: must be >= 1, got {width}")
    N, K = ranks.shape
    ranks = ranks.astype(np.int64, copy=False)
    alive = np.logical_and.accumulate((ranks >= 0) & (ranks < width), axis=1)
    out: dict[tuple[int, ...], int] = {}
    base = width + 1
    if K * math.log2(base) >= 62:  # codes would overflow int64: unique rows per depth instead
        for d in range(K):
            sel = ranks[alive[:, d], : d + 1]
            if sel.shape[0] == 0:
                break
            paths, counts = np.unique(sel, axis=0, return_counts=True)
            out.update(zip(map(tuple, paths.tolist()), counts.tolist(), strict=True))
        return out
    digits = np.where(alive, ranks + 1, 0)
    codes = digits @ base ** np.arange(K - 1, -1, -1, dtype=np.int64)
    codes.sort()
    # Distinct rank vectors with their multiplicities: the per-depth work below runs over
    # these (tens of thousands) instead of the N positions.
    starts = np.flatnonzero(np.diff(codes, prepend=-1))
    uniq_rows, weight = codes[starts], np.diff(starts, append=N)
    for d in range(1, K + 1):
        prefix = uniq_rows // base ** (K - d)
        keep = prefix % base != 0  # alive through depth d; still sorted
        prefix, w = prefix[keep], weight[keep]
        if prefix.size == 0:
            break
        first = np.flatnonzero(np.diff(prefix, prepend=-1))
        counts = np.add.reduceat(w, first)
        powers = base ** np.arange(d - 1, -1, -1, dtype=np.int64)
        paths = (prefix[first][:, None] // powers[None, :]) % base - 1
        out.update(zip(map(tuple, paths.tolist()), counts.tolist(), strict=True))
    return out


# ---------------------------------------------------------------------------------------------
# Readers


def load_accuracy(path, *, model: str | None = None, default_model: str | None = None) -> AccuracyTable:
    """Read an accuracy table: treeopt.accuracy/v1 JSON, a JSON per-rank matrix (list of K
    lists of R exact-rank accuracies), or a CSV of cumulative top-k accuracies per head (like
    treeopt/data/medusa_train_accuracy.csv; `model` picks the row set; without it, a CSV of
    several models takes the rows of `default_model` when it has them)."""
    if not isinstance(path, (str, os.PathLike)):  # the project's error, not Path's TypeError
        raise UserError(f"accuracy: expected a file path or an AccuracyTable, got {type(path).__name__}")
    p = Path(path)
    src = str(path)
    text = read_text_input(p, "an accuracy file")
    if p.suffix.lower() == ".csv" or (not text.lstrip().startswith(("{", "[")) and "," in text):
        return _read_csv(text, src, p.name, model, default_model)
    doc = parse_json_input(text, src)
    if model is not None:
        raise UserError(f"{src}: a model row set (--csv-model {model}) can only be chosen in a CSV file")
    if isinstance(doc, list):
        return _read_matrix(doc, src, p.name)
    return AccuracyTable.from_dict(doc, source=src)


def _read_matrix(doc: list, src: str, name: str) -> AccuracyTable:
    if not doc or not all(isinstance(row, list) for row in doc):
        raise UserError(f"{src}: a per-rank matrix must be a non-empty list of lists (one per head)")
    R = len(doc[0])
    if R == 0:
        raise UserError(f"{src}: row 0 (head 1) is empty")
    acc = np.zeros((len(doc), R))
    for k, row in enumerate(doc):
        if len(row) != R:
            raise UserError(f"{src}: row {k} (head {k + 1}) has {len(row)} values, row 0 has {R}")
        acc[k] = [_number(x, f"{src}: row {k} (head {k + 1}) value {r}") for r, x in enumerate(row)]
        _check_accuracies(acc[k], f"{src}: row {k} (head {k + 1})")
    return AccuracyTable(
        hits=acc,
        positions=np.ones(len(doc)),
        provenance={
            "source": name,
            "source_format": "per-rank accuracy matrix (JSON)",
            "positions": "unknown: hits are accuracies and positions are 1",
            "tool_version": __version__,
        },
    )


def _check_accuracies(row: np.ndarray, where: str) -> None:
    bad = np.flatnonzero((row < 0) | (row > 1))
    if bad.size:
        raise UserError(f"{where}: accuracy {row[bad[0]]:g} at rank {int(bad[0])} is outside [0, 1]")
    if row.sum() > 1 + _TOL:
        raise UserError(
            f"{where}: per-rank accuracies sum to {row.sum():.4g} > 1 (cumulative top-k values? those belong in a CSV)"
        )


def _read_csv(text: str, src: str, name: str, model: str | None, default_model: str | None = None) -> AccuracyTable:
    notes, lines = _csv_lines(text)
    if not lines:
        raise UserError(f"{src}: no header line (expected model,head,top1,top2,...)")
    rows = list(csv.reader(io.StringIO("\n".join(line for _, line in lines))))
    header = [h.strip() for h in rows[0]]
    topk_cols = _csv_topk_columns(header, f"{src}: line {lines[0][0]}")
    i_model = header.index("model") if "model" in header else None
    by_model = _csv_cumulative_rows(lines[1:], rows[1:], header, topk_cols, src)
    if not by_model:
        raise UserError(f"{src}: no data rows")
    model = _csv_model(by_model, model, default_model, src, has_model_column=i_model is not None)
    heads = by_model[model]
    ids = sorted(heads)
    # The Medusa CSV numbers heads from 0; accept 1-based files too, but nothing with gaps.
    if ids != list(range(len(ids))) and ids != list(range(1, len(ids) + 1)):
        raise UserError(f"{src}: heads of {model or 'the table'} are {ids}, expected 0..K-1 (or 1..K)")
    cum = np.stack([heads[h][1] for h in ids])
    acc = np.diff(cum, axis=1, prepend=0.0)
    prov = {
        "source": name,
        "source_format": "cumulative top-k accuracy CSV",
        "positions": "unknown: hits are accuracies and positions are 1",
        "tool_version": __version__,
    }
    if model:
        prov["model"] = model
    if notes:
        prov["notes"] = notes
    return AccuracyTable(hits=acc, positions=np.ones(len(ids)), provenance=prov)


def _csv_lines(text: str) -> tuple[list[str], list[tuple[int, str]]]:
    """(notes, lines): the text of the `#` comment lines, and the other non-blank lines with
    their 1-based line numbers."""
    notes = []
    lines = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            notes.append(line.lstrip()[1:].strip())
        elif line.strip():
            lines.append((lineno, line))
    return notes, lines


def _csv_topk_columns(header: list[str], where: str) -> list[tuple[int, int]]:
    """[(column index, k)] of the header's top1, top2, ... columns, checked."""
    topk_cols = [(i, int(m.group(1))) for i, h in enumerate(header) if (m := re.fullmatch(r"top(\d+)", h))]
    if "head" not in header:
        raise UserError(f"{where}: header has no 'head' column")
    for h in header:
        if h not in ("model", "head") and not re.fullmatch(r"top\d+", h):
            raise UserError(f"{where}: unknown column {h!r} (expected model, head, top1, top2, ...)")
    if [k for _, k in topk_cols] != list(range(1, len(topk_cols) + 1)):
        raise UserError(f"{where}: columns must be top1, top2, ... in order")
    if not topk_cols:
        raise UserError(f"{where}: header has no top1 column")
    return topk_cols


def _csv_cumulative_rows(lines, rows, header: list[str], topk_cols, src: str) -> dict[str, dict[int, tuple]]:
    """{model: {head: (line number, cumulative top-k accuracies)}} of the data rows."""
    i_head = header.index("head")
    i_model = header.index("model") if "model" in header else None
    by_model: dict[str, dict[int, tuple[int, np.ndarray]]] = {}
    for (lineno, _), row in zip(lines, rows, strict=False):
        if len(row) != len(header):
            raise UserError(f"{src}: line {lineno}: {len(row)} fields, the header has {len(header)}")
        m = row[i_model].strip() if i_model is not None else ""
        try:
            head = int(row[i_head])
        except ValueError:
            raise UserError(f"{src}: line {lineno}: head {row[i_head]!r} is not an integer") from None
        cum = _csv_cumulative(row, topk_cols, f"{src}: line {lineno}")
        heads = by_model.setdefault(m, {})
        if head in heads:
            raise UserError(
                f"{src}: line {lineno}: head {head} of {m or 'the table'} appears twice (line {heads[head][0]})"
            )
        heads[head] = (lineno, cum)
    return by_model


def _csv_cumulative(row: list[str], topk_cols, where: str) -> np.ndarray:
    """One row's cumulative top-k accuracies, each in [0, 1] and never decreasing."""
    cum = np.zeros(len(topk_cols))
    for j, (i, k) in enumerate(topk_cols):
        try:
            cum[j] = float(row[i])
        except ValueError:
            raise UserError(f"{where}: top{k} {row[i]!r} is not a number") from None
        if not (0 <= cum[j] <= 1):
            raise UserError(f"{where}: top{k} = {cum[j]:g} is outside [0, 1]")
        if j and cum[j] < cum[j - 1]:
            raise UserError(
                f"{where}: top{k} = {cum[j]:g} is below top{k - 1} = {cum[j - 1]:g} "
                "(cumulative top-k accuracies never decrease)"
            )
    return cum


def _csv_model(
    by_model: dict, model: str | None, default_model: str | None, src: str, *, has_model_column: bool
) -> str:
    """The row set to read: `model`, else `default_model` where the file has it, else the
    file's only one."""
    models = list(by_model)
    if model is None and default_model in by_model:
        model = default_model
    if model is None:
        if len(models) > 1:
            raise UserError(f"{src}: holds several models ({', '.join(models)}); choose one with --csv-model")
        return models[0]
    if model not in by_model:
        listed = ", ".join(models) if has_model_column else "none: the file has no model column"
        raise UserError(f"{src}: no rows for model {model!r} (models: {listed})")
    return model


# ---------------------------------------------------------------------------------------------
# Expected tokens per step


def _as_acc(table_or_acc, joint: bool) -> tuple[np.ndarray, AccuracyTable | None]:
    if isinstance(table_or_acc, AccuracyTable):
        return table_or_acc.accuracy, table_or_acc
    if joint:
        raise UserError("joint statistics need an AccuracyTable, not a bare accuracy matrix")
    acc = np.asarray(table_or_acc, dtype=np.float64)
    if acc.ndim != 2 or acc.size == 0:
        raise UserError(f"accuracy: expected a (heads, width) matrix, got shape {acc.shape}")
    return acc, None


def node_values(tree: Tree, table_or_acc, *, joint: bool = False, strict: bool = True) -> np.ndarray:
    """Each node's acceptance probability, insertion order (docs/statistics.md#expected-tokens-per-step-tau).

    Independent heads: the product of acc[j][i_j] along the path. Joint: count(path) /
    positions[depth - 1]. A node deeper than the table's heads or with a rank >= its width is
    an error when `strict`, else worth 0 (unmeasured: counted as never accepted).
    """
    acc, table = _as_acc(table_or_acc, joint)
    K, R = acc.shape
    if strict:
        _check_fits(tree, K, R)
    if joint:
        if table.joint is None:
            src = table.provenance.get("source", "accuracy table")
            raise UserError(f"{src}: has no joint statistics")
        counts = np.array([table.joint.get(p, 0) for p in tree.paths], dtype=np.float64)
        depth = np.array([len(p) for p in tree.paths], dtype=np.int64)
        ok = depth <= K
        vals = np.zeros(tree.size)
        vals[ok] = counts[ok] / table.positions[depth[ok] - 1]
        return vals
    m = tree.rank_matrix
    vals = np.ones(tree.size)
    # Multiply left to right, the same order as the builders, so equal paths give equal floats.
    for j in range(m.shape[1]):
        col = m[:, j]
        present = col >= 0
        if j >= K:
            vals[present] = 0.0
            continue
        inside = present & (col < R)
        vals[inside] *= acc[j, col[inside]]
        vals[present & ~inside] = 0.0
    return vals


def _check_fits(tree: Tree, K: int, R: int) -> None:
    for p in tree.paths:
        if len(p) > K:
            raise UserError(
                f"{tree.name}: node {_node_str(p)} has depth {len(p)}, but the accuracy table has {K} heads"
            )
        if max(p) >= R:
            raise UserError(f"{tree.name}: node {_node_str(p)} has rank {max(p)}, but the accuracy table has width {R}")


def unmeasured_nodes(tree: Tree, num_heads: int, width: int) -> tuple[int, int]:
    """(nodes deeper than the table's heads, other nodes with a rank >= its width): the nodes
    that non-strict evaluation counts as never accepted."""
    deep = sum(1 for p in tree.paths if len(p) > num_heads)
    wide = sum(1 for p in tree.paths if len(p) <= num_heads and max(p) >= width)
    return deep, wide


def expected_tokens(tree: Tree, table_or_acc, *, joint: bool = False, strict: bool = True) -> float:
    """tau(T) = 1 + sum of node values: expected tokens per step (docs/statistics.md)."""
    return 1.0 + float(node_values(tree, table_or_acc, joint=joint, strict=strict).sum())
