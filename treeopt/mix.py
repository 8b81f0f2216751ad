"""One static tree for a traffic mix (docs/builders.md#one-tree-for-a-traffic-mix).

An engine takes one tree, but the best tree depends on the batch size. Given the share of
decoding steps spent at each (batch, context) and a speedup table (predicted grid or measured
sweep), choose the single tree size n and the largest batch B at which speculation stays on
that maximise the expected throughput

    E(n, B) = sum_{cells, b <= B} w * b * tau(n) / T(n)  +  sum_{cells, b > B} w * b / T(0)
            = sum_cells w * (b / T(0)) * (speedup(n) if b <= B else 1)

in tokens per second. Throughput, not mean speedup: a speedup at batch 32 moves 32 times
more tokens than the same speedup at batch 1 (docs/builders.md#one-tree-for-a-traffic-mix).
The mix file's format: docs/formats.md#traffic-mix
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from treeopt.errors import UserError
from treeopt.fileio import read_text_input
from treeopt.selection import best_per_cell, measured_speedup
from treeopt.selection_text import format_mix
from treeopt.selection_types import MixCell, MixSection

__all__ = [
    "ANY_CONTEXT",
    "TrafficMix",
    "MixCell",
    "MixChoice",
    "parse_mix",
    "resolve_mix_contexts",
    "mix_grid_from_sweep",
    "choose_mix_tree",
    "mix_section",
    "format_mix",
]

ANY_CONTEXT = -1  # a mix entry written without a context: the table's one context
_INLINE = re.compile(r"^\s*(\d{1,18})\s*(?:@\s*(\d{1,18})\s*)?:\s*([^,:@]+?)\s*$")


@dataclass(frozen=True)
class TrafficMix:
    """Weights of (batch, context) cells, normalised to sum 1 (duplicate cells summed)."""

    batch: tuple[int, ...]
    context: tuple[int, ...]  # ANY_CONTEXT where the entry named no context
    weight: tuple[float, ...]
    source: str


@dataclass(frozen=True)
class MixChoice:
    """The single tree for a mix and where speculation switches off."""

    nodes: int  # 0: speculation never pays on this mix
    speculate_up_to_batch: int  # largest mix batch with speculation on; 0: never
    off_from_batch: int | None  # smallest mix batch with speculation off; None: on everywhere
    expected_tokens_per_s: float  # E(nodes, speculate_up_to_batch)
    per_cell_best_tokens_per_s: float  # every cell with its own best tree
    plain_tokens_per_s: float  # no speculation anywhere
    cells: tuple[MixCell, ...]


#: the largest batch or context a mix names (2^31 tokens: beyond any model's context)
MAX_CELL = 2**31


def _bad(source: str, message: str) -> UserError:
    return UserError(f"{source}: {message}")


def _normalised(batch, context, weight, source: str) -> TrafficMix:
    df = pd.DataFrame({"batch": batch, "context": context, "weight": weight})
    df = df[df["weight"] > 0]
    if df.empty:
        raise _bad(source, "every weight is 0 (the mix needs at least one positive weight)")
    # relative to the largest first: weights near the float maximum would sum to infinity
    df["weight"] = df["weight"] / df["weight"].max()
    df = df.groupby(["batch", "context"], as_index=False, sort=True)["weight"].sum()
    w = df["weight"].to_numpy(dtype=float)
    return TrafficMix(
        tuple(int(b) for b in df["batch"]),
        tuple(int(c) for c in df["context"]),
        tuple(float(x) for x in w / w.sum()),
        source,
    )


def _parse_inline(spec: str) -> TrafficMix:
    source = f"--mix {spec!r}"
    batch, context, weight = [], [], []
    for part in spec.split(","):
        m = _INLINE.match(part)
        if not m:
            raise _bad(source, f"entry {part.strip()!r} is not BATCH:WEIGHT or BATCH@CONTEXT:WEIGHT")
        try:
            w = float(m.group(3))
        except ValueError:
            raise _bad(source, f"entry {part.strip()!r}: weight {m.group(3)!r} is not a number") from None
        batch.append(int(m.group(1)))
        context.append(int(m.group(2)) if m.group(2) is not None else ANY_CONTEXT)
        weight.append(w)
    return _checked(batch, context, weight, source)


def _checked(batch, context, weight, source: str) -> TrafficMix:
    for b, c, w in zip(batch, context, weight, strict=True):
        if b < 1:
            raise _bad(source, f"batch {b}: batch sizes must be >= 1")
        if b > MAX_CELL or c > MAX_CELL:  # batch and context become int64 grid coordinates
            raise _bad(source, f"batch {str(b)[:24]} context {str(c)[:24]}: at most {MAX_CELL} each")
        if not math.isfinite(w) or w < 0:
            raise _bad(source, f"batch {b}: weight {w:g} must be a finite number >= 0")
    return _normalised(batch, context, weight, source)


def _parse_csv(path: Path) -> TrafficMix:
    source = str(path)
    text = read_text_input(path, "a traffic-mix file")
    rows = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not rows:
        raise _bad(source, "no rows (expected a header batch,context,weight and one row per cell)")
    header = [h.strip() for h in rows[0].split(",")]
    for col in ("batch", "weight"):
        if col not in header:
            raise _bad(source, f"missing column '{col}' (expected the header batch,context,weight)")
    batch, context, weight = [], [], []
    for line_no, line in enumerate(rows[1:], start=2):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(header):
            raise _bad(source, f"row {line_no}: {len(fields)} fields, the header has {len(header)}")
        row = dict(zip(header, fields, strict=True))
        try:
            b = int(row["batch"])
            c = int(row["context"]) if row.get("context", "") != "" else ANY_CONTEXT
            w = float(row["weight"])
        except ValueError:
            raise _bad(
                source, f"row {line_no}: batch and context must be integers and weight a number, got {line!r}"
            ) from None
        if c < 0 and c != ANY_CONTEXT:
            raise _bad(source, f"row {line_no}: context {c} must be >= 0")
        batch.append(b)
        context.append(c)
        weight.append(w)
    if not batch:
        raise _bad(source, "no rows after the header")
    return _checked(batch, context, weight, source)


def parse_mix(spec: str) -> TrafficMix:
    """A mix from a CSV file (`batch,context,weight`; context may be left out) or an inline
    spec `"1:0.5,8:0.3,32@2048:0.2"` (BATCH[@CONTEXT]:WEIGHT, comma-separated)."""
    spec = str(spec)
    path = Path(spec)
    try:
        is_file = path.is_file()
    except OSError:  # longer than a file name may be: an inline spec
        is_file = False
    if is_file or (path.suffix.lower() == ".csv"):
        return _parse_csv(path)
    return _parse_inline(spec)


def resolve_mix_contexts(mix: TrafficMix, contexts) -> TrafficMix:
    """Give entries without a context the table's context; UserError when the table has several."""
    if ANY_CONTEXT not in mix.context:
        return mix
    available = sorted({int(c) for c in contexts})
    if len(available) != 1:
        raise _bad(
            mix.source,
            f"an entry has no context but the table has {len(available)} contexts "
            f"({', '.join(map(str, available))}): write BATCH@CONTEXT:WEIGHT",
        )
    ctx = [available[0] if c == ANY_CONTEXT else c for c in mix.context]
    return _normalised(mix.batch, ctx, mix.weight, mix.source)


def mix_grid_from_sweep(sweep: pd.DataFrame, by: str = "measured") -> pd.DataFrame:
    """The columns choose_mix_tree needs (batch, context, nodes, speedup, step_time_s) from a
    sweep table: measured speedups (end to end where measured) and measured step times, or the
    roofline's predicted ones (by="predicted"); and speedup_lo/hi, the sweep's interval where
    the speedup is the step-latency one (NaN elsewhere; treeopt.chain_or_tree shows them)."""
    nan = pd.Series(np.nan, index=sweep.index)
    lo, hi = nan, nan
    if by == "predicted":
        speed = sweep["predicted_speedup"].astype(float).where(sweep["nodes"] != 0, 1.0)
        step = sweep["predicted_step_time_s"].astype(float)
    else:
        speed, how = measured_speedup(sweep)
        step = sweep["step_time_s"].astype(float)
        if "speedup_lo" in sweep.columns and "speedup_hi" in sweep.columns:
            lo = sweep["speedup_lo"].astype(float).where(how == "step latency")
            hi = sweep["speedup_hi"].astype(float).where(how == "step latency")
    return pd.DataFrame(
        {
            "batch": sweep["batch"].to_numpy(),
            "context": sweep["context"].to_numpy(),
            "nodes": sweep["nodes"].to_numpy(),
            "speedup": speed.to_numpy(),
            "step_time_s": step.to_numpy(),
            "speedup_lo": lo.to_numpy(),
            "speedup_hi": hi.to_numpy(),
        }
    )


def _speedup_matrix(grid: pd.DataFrame, mix: TrafficMix, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, speedup[cell, size], plain tokens/s[cell]) for the mix's cells; a size missing
    or out of memory in a cell is NaN there."""
    for col in ("batch", "context", "nodes", "speedup", "step_time_s"):
        if col not in grid.columns:
            raise _bad(source, f"missing column '{col}'")
    sizes = np.unique(grid["nodes"].to_numpy(dtype=np.int64))
    wide = grid.pivot(index=["batch", "context"], columns="nodes", values="speedup").reindex(columns=sizes)
    plain = grid[grid["nodes"] == 0].drop_duplicates(["batch", "context"]).set_index(["batch", "context"])
    keys = list(zip(mix.batch, mix.context, strict=True))
    missing = [k for k in keys if k not in wide.index or k not in plain.index]
    if missing:
        have = ", ".join(f"{b}@{c}" for b, c in sorted(set(wide.index) & set(plain.index)))
        raise _bad(mix.source, f"cell batch {missing[0][0]} context {missing[0][1]} is not in {source} (it has {have})")
    speed = wide.loc[keys].to_numpy(dtype=float, copy=True)
    speed[:, sizes == 0] = 1.0
    t_plain = plain.loc[keys, "step_time_s"].to_numpy(dtype=float)
    bad = ~np.isfinite(t_plain) | (t_plain <= 0)
    if bad.any():
        b, c = keys[int(np.flatnonzero(bad)[0])]
        raise _bad(
            mix.source,
            f"cell batch {b} context {c}: plain decoding has no step time in {source} (does not fit in memory?)",
        )
    return sizes, speed, np.asarray(mix.batch, dtype=float) / t_plain


def choose_mix_tree(
    grid: pd.DataFrame,
    mix: TrafficMix,
    *,
    threshold: float = 1.0,
    source: str = "the speedup table",
    chosen: dict | None = None,
) -> MixChoice:
    """The tree size n and speculation cut-off batch B of largest expected throughput E(n, B).

    grid: one row per (batch, context, nodes) with `speedup` (1 at nodes 0) and `step_time_s`
    (used at nodes 0: plain tokens/s = batch / T(0)). Speculation is on for batches <= B: the
    form of an engine's switch-off by batch size, chosen with n jointly
    (docs/builders.md#one-tree-for-a-traffic-mix). A batch joins the speculating ones only where
    the mix tree's tokens there beat `threshold` times plain decoding's. Ties go to the smaller
    n, then the smaller B. A size that does not fit (NaN) in a cell of a speculating batch is never chosen.

    `chosen` {(batch, context): nodes}: each cell's own answer (a selection's), which the cells'
    `best_nodes` then report, so that a report shows one tree per cell; without it, each
    cell's largest speedup in the grid.
    """
    mix = resolve_mix_contexts(mix, grid["context"].unique())
    sizes, speed, plain_tps = _speedup_matrix(grid, mix, source)
    weight = np.asarray(mix.weight)
    batches = np.asarray(mix.batch)
    # gain[cell, n] in tokens/s over `threshold` x plain; -inf where size n cannot run there
    gain = weight[:, None] * plain_tps[:, None] * (speed - threshold)
    gain = np.where(np.isfinite(gain), gain, -np.inf)
    gain[:, sizes == 0] = 0.0
    distinct, batch_index = np.unique(batches, return_inverse=True)
    per_batch = np.zeros((distinct.size, sizes.size))
    np.add.at(per_batch, batch_index, gain)
    # on_upto[k, n]: gain with speculation on for the k smallest batches (k = 0: off everywhere)
    on_upto = np.vstack([np.zeros((1, sizes.size)), np.cumsum(per_batch, axis=0)])
    by_size_then_k = on_upto.T  # argmax of the first maximum: smallest n, then smallest k
    n_i, k = np.unravel_index(int(np.argmax(by_size_then_k)), by_size_then_k.shape)
    nodes = int(sizes[n_i])
    if nodes == 0 or k == 0 or by_size_then_k[n_i, k] <= 0:
        nodes, k = 0, 0
    up_to = int(distinct[k - 1]) if k else 0
    on = batches <= up_to if nodes else np.zeros(batches.size, bool)
    n_col = int(np.flatnonzero(sizes == nodes)[0]) if nodes else int(np.flatnonzero(sizes == 0)[0])
    mix_speed = np.where(on, speed[:, n_col], 1.0)

    grid_cells = grid.merge(pd.DataFrame({"batch": batches, "context": mix.context}), on=["batch", "context"])
    best = best_per_cell(grid_cells, threshold=threshold).set_index(["batch", "context"])
    keys = list(zip(mix.batch, mix.context, strict=True))
    best_nodes = best.loc[keys, "nodes"].to_numpy(dtype=np.int64, copy=True)
    best_speed = np.where(best_nodes > 0, best.loc[keys, "speedup"].to_numpy(dtype=float), 1.0)
    if chosen:
        speed_at = grid_cells.set_index(["batch", "context", "nodes"])["speedup"]
        for i, key in enumerate(keys):
            n = chosen.get((int(key[0]), int(key[1])))
            if n is not None and (n == 0 or (*key, n) in speed_at.index):
                best_nodes[i] = n
                best_speed[i] = float(speed_at.loc[(*key, n)]) if n else 1.0
    cells = tuple(
        MixCell(
            int(b), int(c), float(w), int(bn), float(bs), nodes if o else 0, float(ms), float(p), float(1.0 - ms / bs)
        )
        for b, c, w, bn, bs, o, ms, p in zip(
            batches, mix.context, weight, best_nodes, best_speed, on, mix_speed, plain_tps, strict=True
        )
    )
    off_from = distinct[distinct > up_to] if nodes else distinct
    return MixChoice(
        nodes=nodes,
        speculate_up_to_batch=up_to if nodes else 0,
        off_from_batch=int(off_from[0]) if off_from.size else None,
        expected_tokens_per_s=float(np.sum(weight * plain_tps * mix_speed)),
        per_cell_best_tokens_per_s=float(np.sum(weight * plain_tps * best_speed)),
        plain_tokens_per_s=float(np.sum(weight * plain_tps)),
        cells=cells,
    )


def mix_section(choice: MixChoice, proposal, mix: TrafficMix, threshold: float = 1.0) -> MixSection:
    """The selection's `mix` section (docs/formats.md#selections-treeoptselectionv1), its
    figures rounded as the document holds them."""
    if choice.nodes > proposal.size:
        raise UserError(f"mix: the table picks {choice.nodes} nodes but the proposal tree has {proposal.size}")
    return MixSection(
        source=mix.source,
        nodes=choice.nodes,
        medusa_choices=tuple(tuple(p) for p in proposal.prefix(choice.nodes).to_choices()) if choice.nodes else (),
        speculate_up_to_batch=choice.speculate_up_to_batch,
        off_from_batch=choice.off_from_batch,
        threshold=threshold,
        expected_tokens_per_s=round(choice.expected_tokens_per_s, 6),
        per_cell_best_tokens_per_s=round(choice.per_cell_best_tokens_per_s, 6),
        plain_tokens_per_s=round(choice.plain_tokens_per_s, 6),
        cells=tuple(
            replace(
                c,
                weight=round(c.weight, 6),
                best_speedup=round(c.best_speedup, 6),
                mix_speedup=round(c.mix_speedup, 6),
                loss_fraction=round(c.loss_fraction, 6),
            )
            for c in choice.cells
        ),
    )
