"""What a selection's cells say about numbers it could not measure or predict, in words: a
predicted speedup the hardware profile cannot give, a shipped speedup that is tau because the
plain step was measured slower than the tree step, sizes the sanity checks flagged
(docs/statistics.md#when-the-plain-step-is-the-slow-one, docs/formats.md#strict-json)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from treeopt.stats import same_round_ratios

if TYPE_CHECKING:  # the selection types print their text with this module
    from treeopt.selection_types import SelectionCell


def missing_prediction_reason(predicted_overhead) -> str:
    """Why a tree has no predicted speedup (null in the selection), in words: the profile
    prices its step below the plain step, which no tree step can be
    (`treeopt.stats.physical_speedup`, docs/statistics.md#sanity-checks-of-a-measurement), or
    no prediction was made for it."""
    x = float(predicted_overhead)
    if not math.isfinite(x):
        return "no prediction for this tree size"
    return (
        f"the hardware profile predicts this tree's step cheaper than the plain step (T(n)/T(0) = {x:.3f} < 1), "
        "which no tree step can be: the profile does not describe this step"
    )


def raw_overheads(cell: pd.DataFrame, samples: np.ndarray | None) -> np.ndarray:
    """(sizes,) T(n)/T(0) as measured, before the clamp at 1 that the sweep's `overhead` and
    the bootstrap apply (a tree step does the plain step's work and more,
    docs/statistics.md#measured-speedup-intervals): the median same-round ratio of the per-round
    `samples`, else the ratio of the median step times (NaN where the sweep has none)."""
    if samples is not None:
        return np.median(same_round_ratios(samples), axis=0)
    if "step_time_s" not in cell.columns or len(cell) == 0:
        return np.full(len(cell), np.nan)
    step = cell["step_time_s"].to_numpy(dtype=float)
    return step / step[0]


def mark_clamp(cell: SelectionCell, overhead_measured: float) -> SelectionCell:
    """A shipped tree measured no slower than plain decoding (T(n)/T(0) < 1) has its overhead
    clamped at 1, so its speedup is tau: a bound, not a measurement. The cell then says so:
    `measured_speedup` null, `measured_speedup_missing` why, `overhead_measured` the ratio
    measured (docs/statistics.md#when-the-plain-step-is-the-slow-one)."""
    raw = float(overhead_measured)
    if not cell.nodes or cell.measured_by == "end-to-end" or not raw < 1.0:
        return cell
    return replace(
        cell,
        overhead_measured=round(raw, 6),
        measured_speedup=math.nan,
        measured_speedup_missing=clamp_reason(raw, cell.tau),
    )


def clamp_reason(overhead_measured: float, tau: float) -> str:
    """Why a shipped tree's speedup is tau and not a measurement, in words."""
    return (
        f"T(n)/T(0) measured {overhead_measured:.3f}: the tree step was no slower than the plain step, so the "
        f"plain step is the slow one on this stack; the speedup shown is tau = {tau:.2f}, the most a tree can "
        "give where plain decoding is no slower than a tree step, not a measurement"
    )


def unreliable_lines(cell: SelectionCell) -> list[str]:
    """What the sanity checks flagged in a cell, in words: sizes measured faster than plain
    decoding beyond the noise are the plain step being slow on this stack (a quieter machine
    does not change that), the others disturbed measurements."""
    slower = list(cell.plain_slower_nodes)
    other = [n for n in cell.unreliable_nodes if n not in slower]
    out = []
    if slower:
        out.append(
            f"nodes {slower}: the tree step measured faster than the plain step: the plain step is the slow one "
            "on this stack (not noise; a quieter machine will not change it), so these sizes are not selected "
            "(docs/statistics.md#when-the-plain-step-is-the-slow-one)"
        )
    if other:
        out.append(f"unreliable (failed the sanity checks, not selected): nodes {other}")
    return out


def plain_slow_only(cell: SelectionCell) -> bool:
    """An unreliable cell whose every flagged tree was measured faster than plain decoding."""
    flagged = cell.unreliable_nodes
    return cell.reason == "unreliable" and bool(flagged) and set(flagged) <= set(cell.plain_slower_nodes)


def percent(level: float) -> str:
    """95%, or 99.76% where the level was spent over several looks (the report's wording)."""
    return f"{level * 100:.4g}%"
