"""Schedules for any drafter from its engine-reported acceptance: the chain table's tau of every
measured chain length, priced per batch size by the roofline (a built-in GPU profile, a fitted
profile, an engine preset), the best K per batch range and the switch-off point, in the
engines' schedule forms (treeopt/schedules.py; docs/engines.md#schedules-from-engine-reported-acceptance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from treeopt.accuracy import AccuracyTable
from treeopt.app.prediction import PredictionOptions, predict_speedup
from treeopt.errors import UserError
from treeopt.mix import TrafficMix, resolve_mix_contexts
from treeopt.schedules import (
    BatchChoice,
    batch_ranges,
    choices_for_mix,
    trtllm_schedule_config,
    vllm_schedule_config,
    vllm_schedule_line,
)


@dataclass(frozen=True)
class ChainSchedule:
    """choices: the best chain length per batch size (0: speculation off); ranges: (first,
    last, K) inclusive; vllm/trtllm: the engines' configs (None: no batch size drafts); grid:
    the predicted speedup per (batch, context, K); step_costs: which preset priced the steps."""

    choices: tuple[BatchChoice, ...]
    ranges: tuple[tuple[int, int, int], ...]
    vllm: dict | None
    trtllm: dict | None
    grid: pd.DataFrame
    step_costs: str
    unfit_batches: tuple[int, ...] = ()  # batch sizes that fit no chain in memory: not scheduled

    @property
    def vllm_line(self) -> str:
        return vllm_schedule_line(self.vllm)

    @property
    def switch_off_batch(self) -> int | None:
        """The smallest batch size from which no larger one drafts, None when the largest drafts."""
        if self.ranges[-1][2] > 0:
            return None
        return self.ranges[-1][0]


def chain_schedule(
    model,
    hardware,
    table: AccuracyTable,
    *,
    batches,
    contexts,
    method: str = "eagle3",
    engine_costs: str | None = None,
    max_batch_size: int | None = None,
    mix: TrafficMix | None = None,
) -> ChainSchedule:
    """The best measured chain length per batch size: the greatest mean predicted speedup over
    `contexts` (choices_for_mix), chains of 0..K where K is the table's measured length; with a
    traffic `mix`, its batch sizes and contexts, each context weighted as the mix weighs it at
    that batch size. The drafter drafts one token per stage (a chain), priced as the table's heads."""
    if mix is not None:
        mix = resolve_mix_contexts(mix, contexts)
        batches, contexts = sorted(set(mix.batch)), sorted(set(mix.context))
    if table.width != 1:
        raise UserError("schedule: the accuracy table is not a chain (width 1); import the engine's output first")
    prediction = predict_speedup(
        model,
        hardware,
        table,
        batches=batches,
        contexts=contexts,
        max_nodes=table.num_heads,
        engine=None,
        heads={"num_heads": table.num_heads},
        options=PredictionOptions(sequential_draft=True, engine_costs=engine_costs),
    )
    g = prediction.grid
    speedup = g["speedup"].to_numpy(dtype=float)
    fits = np.isfinite(speedup)
    if not fits.any():
        raise UserError("schedule: no batch size fits in the GPU's memory with this model")
    unfit = sorted(set(g["batch"].astype(int)) - set(g["batch"][fits].astype(int)))
    g = g[fits]
    weight = None
    if mix is not None:
        weights = {(b, c): w for b, c, w in zip(mix.batch, mix.context, mix.weight, strict=True)}
        weight = np.array([weights.get((int(b), int(c)), 0.0) for b, c in zip(g["batch"], g["context"], strict=True)])
    choices = choices_for_mix(
        g["batch"].to_numpy(),
        g["context"].to_numpy(),
        g["nodes"].to_numpy(),
        speedup=g["speedup"].to_numpy(),
        weight=weight,
    )
    ranges = batch_ranges(choices, max_batch_size)
    return ChainSchedule(
        choices=tuple(choices),
        ranges=tuple(ranges),
        vllm=vllm_schedule_config(choices, method, max_batch_size=max_batch_size),
        trtllm=_trtllm_or_none(choices, max_batch_size),
        grid=prediction.grid,
        step_costs=prediction.step_costs,
        unfit_batches=tuple(unfit),
    )


def _trtllm_or_none(choices, max_batch_size) -> dict | None:
    try:
        return trtllm_schedule_config(choices, max_batch_size=max_batch_size)
    except UserError:  # a schedule TensorRT-LLM cannot take (off at small batches): vLLM's line still stands
        return None
