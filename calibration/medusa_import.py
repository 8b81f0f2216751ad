"""Import the calibration output of Medusa's own script into a `treeopt.accuracy/v1` table.

Medusa's ``medusa/eval/heads_accuracy.py`` saves ``torch.save(results, path)`` where
``results`` is a list over heads of boolean tensors of shape (positions, ranks): row i of
head k is True in column r when head k's rank-r proposal equalled the label (the base model's
greedy token) at that position. Each head has its own number of rows (head k loses k+1
positions at the end of every prompt), and the authors' tree script then divided every head by
one hard-coded count; here each head is normalised by its own number of rows.

Conversion, through the rank vectors every table is counted from
(`treeopt.accuracy.rank_hits`):
- a row's rank is the column of its first True (Medusa's proposals are distinct tokens, so a
  row has at most one True; should one have several, only the first counts); a row with no
  True is a miss (rank R, the number of columns);
- ``positions[k]`` = number of rows of head k; ``hits[k, r]`` = number of rows of head k whose
  rank is r;
- joint prefix counts only when every head has the same number of rows, taking row i of all
  heads as one position (true when the file was written that way, e.g. with a single head).
  Medusa's own files have different row counts per head, whose rows are not aligned, so they
  get no joint statistics (``joint`` is None).

With ``normalize="medusa"`` the table reproduces the authors' ``medusa/eval/gen_results.py``
instead: it divides every head's per-rank hit count by one hard-coded count, 16100
(``test_accuracy[i].sum(0)/16100``), whatever the file's row counts. A tree built from that
table is the authors' tree for the file (docs/formats.md#medusas-heads_accuracypy-output).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from calibration.provenance import run_date, tool_versions
from treeopt.accuracy import AccuracyTable, joint_counts_from_ranks, rank_hits
from treeopt.errors import UserError, first_line

NORMALIZATIONS = ("own", "medusa")
#: the count `medusa/eval/gen_results.py` divides every head by (`load_accuracy_table`)
MEDUSA_GEN_RESULTS_COUNT = 16100


def medusa_rank_matrix(results, source: str = "results") -> np.ndarray:
    """Medusa's list as rank vectors (N, K) int64, N the most rows of any head: row i of head k
    is the column of its first True, the width for a miss, -1 past the head's own rows."""
    if isinstance(results, torch.Tensor) and results.ndim == 3:
        results = list(results)
    if not isinstance(results, (list, tuple)) or not results:
        kind = type(results).__name__
        raise UserError(
            f"{source}: expected a non-empty list over heads of (positions x ranks) "
            f"boolean tensors, found {kind if not isinstance(results, (list, tuple)) else 'an empty list'}"
        )
    width = None
    ranks = []
    for k, t in enumerate(results):
        if not isinstance(t, torch.Tensor):
            raise UserError(f"{source}: head {k}: expected a tensor, found {type(t).__name__}")
        if t.ndim != 2:
            raise UserError(
                f"{source}: head {k}: expected a 2-D (positions x ranks) tensor, found shape {tuple(t.shape)}"
            )
        if t.dtype != torch.bool:
            if t.is_complex() or not bool(((t == 0) | (t == 1)).all()):
                raise UserError(
                    f"{source}: head {k}: values must be True/False (or 0/1); found "
                    f"other values in a {str(t.dtype).replace('torch.', '')} tensor"
                )
            t = t != 0
        if width is None:
            width = t.shape[1]
        elif t.shape[1] != width:
            raise UserError(f"{source}: head {k} has {t.shape[1]} rank columns, head 0 has {width}")
        if width == 0:
            raise UserError(f"{source}: head {k}: tensor has no rank columns")
        t = t.cpu()
        any_true = t.any(dim=1)
        first = t.to(torch.uint8).argmax(dim=1)  # first maximal element = first True
        ranks.append(np.where(any_true.numpy(), first.numpy().astype(np.int64), width))
    matrix = np.full((max(len(r) for r in ranks), len(ranks)), -1, np.int64)
    for k, r in enumerate(ranks):  # heads only; each head's rows are one slice
        matrix[: len(r), k] = r
    return matrix


def import_medusa_accuracy(path: str | Path, normalize: str = "own"):
    """Read Medusa's ``*_heads_accuracy.pt`` and return an `AccuracyTable` (see module doc):
    normalize="own" divides each head by its own rows, "medusa" every head by gen_results.py's
    16100."""
    if normalize not in NORMALIZATIONS:
        raise UserError(f"--normalize: must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--import: {path} does not exist")
    try:
        results = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch.load raises many types for a foreign file
        raise UserError(f"{path}: not a readable torch file ({first_line(err)})") from None
    ranks = medusa_rank_matrix(results, source=str(path))
    width = int(results[0].shape[1])
    counts = rank_hits(ranks, width)
    if counts.positions.min() == 0:
        raise UserError(f"{path}: head {int(np.argmin(counts.positions))} has no positions")
    joint = None
    positions = counts.positions
    if normalize == "medusa":
        positions = np.full(positions.shape, float(MEDUSA_GEN_RESULTS_COUNT))
        over = np.flatnonzero(counts.hits.sum(axis=1) > MEDUSA_GEN_RESULTS_COUNT)
        if over.size:
            raise UserError(
                f"{path}: head {int(over[0])} has more hits than gen_results.py's count "
                f"{MEDUSA_GEN_RESULTS_COUNT}: --normalize medusa cannot apply to this file"
            )
    elif len(set(counts.positions.tolist())) == 1:
        joint = dict(sorted(joint_counts_from_ranks(ranks, width).items()))
    provenance = {
        "model": None,
        "heads": None,
        "dataset": None,
        "labels": "greedy",
        "source": str(path),
        "source_format": "Medusa heads_accuracy.py output (list over heads of positions x ranks booleans)",
        "imported_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "topk": width,
        "positions": int(counts.positions[0]),
        "joint": "rows aligned across heads"
        if joint is not None
        else "none: --normalize medusa"
        if normalize == "medusa"
        else "none: heads have different row counts, rows not aligned",
        "normalization": (
            f"every head divided by {MEDUSA_GEN_RESULTS_COUNT}, as Medusa's gen_results.py"
            if normalize == "medusa"
            else "each head divided by its own rows"
        ),
        "date": run_date(),
        **tool_versions(),
    }
    return AccuracyTable(hits=counts.hits, positions=positions, joint=joint, provenance=provenance)
