"""TensorRT-LLM's dynamic-tree config priced from the draft's own scores (docs/engines.md#schedules).

The dynamic tree picks its nodes each step from the draft's probabilities, so the tokens per step
of a (steps, topk, num_draft_tokens) triple are best predicted from those probabilities
(`treeopt sglang-tau`, docs/statistics.md#dynamic-trees), not from the accuracy table's ranks.
What a step costs depends on how many tokens are verified: the grid's (or sweep's) step time of
a tree of the same number of drafted tokens at that batch and context. So at each cell

    speedup(triple) = tau(triple) / (T(n) / T(0)),   n = num_draft_tokens - 1 drafted tokens,

for every triple of the tau file the engine takes (`treeopt.engines.beam_fits`) and whose n has
a step time at that cell; the best triple for the traffic and per batch range is then
`treeopt.schedules.sglang_plan`'s, as for the rank-statistics path.

numpy only (the tau file is read with the standard library's csv).
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np

from treeopt.engines import beam_fits
from treeopt.errors import UserError
from treeopt.fileio import read_text_input
from treeopt.schedules import selection_schedule
from treeopt.trtllm_eagle import trtllm_dynamic_export

__all__ = ["DYNAMIC_TAU_COLUMNS", "read_dynamic_taus", "dynamic_options", "dynamic_tau_schedule"]

#: the columns of `treeopt sglang-tau -o FILE` that price a triple (num_draft_tokens: root counted)
DYNAMIC_TAU_COLUMNS = ("steps", "topk", "num_draft_tokens", "tau_predicted")


def _int(path: str, row: int, name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{path}: row {row}: {name} {text!r} is not an integer") from None
    if value < 1:
        raise UserError(f"{path}: row {row}: {name} {value} is below 1")
    return value


def read_dynamic_taus(path) -> dict[tuple[int, int, int], float]:
    """{(steps, topk, num_draft_tokens): tau} from the CSV `treeopt sglang-tau -o` writes (the files
    of several runs may be concatenated: a repeated header row is skipped); one line naming the
    file for what is wrong."""
    name = str(path)
    text = read_text_input(path, "a CSV of dynamic-tree tau from `treeopt sglang-tau -o`")
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in DYNAMIC_TAU_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(f"{name}: no {', '.join(missing)} column (expected `treeopt sglang-tau -o` output)")
    taus: dict[tuple[int, int, int], float] = {}
    for i, row in enumerate(reader, start=2):
        if row["steps"] == "steps":
            continue
        triple = tuple(_int(name, i, c, row[c] or "") for c in DYNAMIC_TAU_COLUMNS[:3])
        try:
            tau = float(row["tau_predicted"])
        except (TypeError, ValueError):
            raise UserError(f"{name}: row {i}: tau_predicted {row['tau_predicted']!r} is not a number") from None
        if not np.isfinite(tau) or tau < 1:
            raise UserError(f"{name}: row {i}: tau_predicted {tau} is not a tokens-per-step value (>= 1)")
        if triple in taus and taus[triple] != tau:
            raise UserError(f"{name}: row {i}: triple {triple} has two tau values ({taus[triple]} and {tau})")
        taus[triple] = tau
    if not taus:
        raise UserError(f"{name}: no rows")
    return taus


def dynamic_options(grid, taus: dict, fits) -> dict:
    """{(batch, context): {triple: speedup}}: each triple of `taus` that `fits` (nodes, steps,
    topk) takes, priced at every cell of `grid` (batch, context, nodes, step_time_s) that has a
    finite step time for plain decoding and for num_draft_tokens - 1 nodes (module doc)."""
    b = np.asarray(grid["batch"], dtype=np.int64)
    c = np.asarray(grid["context"], dtype=np.int64)
    n = np.asarray(grid["nodes"], dtype=np.int64)
    t = np.asarray(grid["step_time_s"], dtype=np.float64)
    step = {(int(x), int(y), int(z)): float(v) for x, y, z, v in zip(b, c, n, t) if np.isfinite(v) and v > 0}
    usable = {k: v for k, v in taus.items() if fits(k[2] - 1, k[0], k[1])}
    out: dict = {}
    for cell in sorted({(int(x), int(y)) for x, y in zip(b, c)}):
        plain = step.get((*cell, 0))
        if plain is None:
            continue
        priced = {k: tau * plain / step[(*cell, k[2] - 1)] for k, tau in usable.items() if (*cell, k[2] - 1) in step}
        if priced:
            out[cell] = priced
    return out


def dynamic_tau_schedule(cells, engine, grid, taus: dict, *, source: str, weights=None, drafter=None) -> dict:
    """The schedule section of `engine` (TensorRT-LLM's dynamic tree) for a selection's `cells`
    from `dynamic_options`: the config of greatest mean speedup over the cells (the mix's with
    `weights`) and one per batch range; `source` names the tau file."""
    if engine.export_kind != "trtllm-eagle3-dynamic":
        raise UserError(f"--dynamic-tau: prices TensorRT-LLM's dynamic tree; --engine {engine.name} is not it")
    options = dynamic_options(grid, taus, beam_fits(engine))
    if not options:
        raise UserError(
            f"{source}: no triple TensorRT-LLM takes has a step time for its draft tokens in the grid or sweep "
            "(max_draft_len <= num_draft_tokens - 1 <= topk * steps, and that many nodes measured or predicted)"
        )
    lines = {
        k: f"speculative_config = {json.dumps(trtllm_dynamic_export(k, drafter))}" for p in options.values() for k in p
    }
    sglang = {cell: {k: (v, lines[k]) for k, v in priced.items()} for cell, priced in options.items()}
    section = selection_schedule(cells, engine, weights=weights, drafter=drafter, sglang=sglang)
    section["source"] = (
        f"tau per triple from the draft's own scores ({source}, `treeopt sglang-tau`), the step cost from the "
        "step time of as many drafted nodes at each cell"
    )
    return section
