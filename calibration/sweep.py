"""The measured-throughput sweep: the latency of one decoding step for every proposal tree
size, batch size and context length on the machine at hand, next to the roofline prediction.

For each (batch, context) group one KV cache of `context` random tokens per sequence is built
(`step_bench`); then every tree size's step and the plain step are timed on it in interleaved
rounds (`treeopt.timing.measure_interleaved`), so that a slowdown burst of this shared
machine lands on a few samples of every configuration rather than on all samples of one;
samples far above their median are re-measured.

- Tree size n > 0: exactly the model work of one decoding step of the reference decoder,
  `TreeDecoder.verify_forward`: one forward of the base model over the q = n + 1 tree tokens
  against the cache with the tree attention mask and position ids, the base `lm_head` on all q
  tokens, and the Medusa heads the tree uses (its depth) on one token per sequence. With a
  draft model, `SpeculativeDecoder.step_work`: the draft's passes over the tree (gamma for a
  chain of gamma), then that verification forward.
- Tree size 0: plain decoding, `plain_step_forward` with q = 1 and no heads: what decoding
  without speculation costs.

One sweep measures one verification form (`SweepSettings.verification`): "tree" as above, or
"candidates": the same drafted tree verified as its leaves' root paths, each sequence's
context copied to its candidate rows (`TreeDecoder(verification="candidates").verify_forward`,
docs/decoder.md#candidate-sequence-verification). The form is part of the metadata a resumed
sweep must share; sweeps of both forms are joined by `treeopt.forms.choose_form`.

Every timed call appends its tokens to the cache and crops them off again, so every call sees
exactly `context` cached tokens (checked after each group). Overhead T(n)/T(0) is the median
over rounds of the per-round ratio: both were measured moments apart. Measured speedup =
tau(n) / overhead.

The CSV (columns `treeopt.selection.SWEEP_COLUMNS`) is rewritten atomically after every
group, with a `NAME.meta.json` beside it (the proposal tree, the measurement settings, the
model), so an interrupted sweep resumes where it stopped (`resume=True`): groups already in
the file are kept, missing ones measured. Resuming needs the same measurement settings (tree
sizes, repeats, warm-up, topk, seed), verification form, proposal tree, model, device and dtype; the batch sizes
and contexts may differ (new groups are added). The derived columns (tau, speedup, the
prediction) are recomputed for every row from the call's tau curves and predictor.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from calibration.decoder import TreeDecoder
from calibration.device_memory import check_bench_fits
from calibration.greedy import plain_step_forward
from calibration.kv_cache import new_cache
from calibration.model_calls import model_forward_hidden, synchronizer, uses_gqa
from calibration.speculative import SpeculativeDecoder, decoder_for
from calibration.static_steps import StepRunner, graphs_enabled, step_mode, uses_static
from treeopt.errors import UserError
from treeopt.fileio import atomic_outputs, atomic_path, write_json
from treeopt.forms import VERIFICATION_FORMS
from treeopt.selection import (
    SWEEP_COLUMNS,
    add_intervals,
    check_tolerance,
    read_round_samples,
    sweep_meta_path,
    sweep_samples_path,
    write_round_samples,
)
from treeopt.stats import (
    CONFIDENCE,
    DEFAULT_TOLERANCE,
    MIN_ROUNDS,
    bootstrap_speedups,
    decide_cell,
    impossible_sizes,
    interval,
    physical_speedup,
    sequential_confidence,
)
from treeopt.tau import TauCurve
from treeopt.timing import interleaved_rounds
from treeopt.tree import Tree

__all__ = [
    "SWEEP_COLUMNS",
    "MEASURED_COLUMNS",
    "SWEEP_FORMAT",
    "SweepSettings",
    "StepBench",
    "meta_path",
    "effective_sizes",
    "step_bench",
    "check_form",
    "measure_group",
    "run_sweep",
    "measure_end_to_end",
    "left_padding",
    "prompt_batches",
    "token_batches",
]

SWEEP_FORMAT = "treeopt.sweep/v1"
MEASURED_COLUMNS = [
    "step_time_s",
    "step_time_p10_s",
    "step_time_p90_s",
    "samples",
    "remeasured",
    "overhead",
    "unreliable",
]
E2E_COLUMNS = ["e2e_tokens_per_s", "e2e_tokens_per_step", "e2e_speedup"]
meta_path = sweep_meta_path


@dataclass(frozen=True)
class SweepSettings:
    sizes: tuple[int, ...]  # proposal tree sizes; 0 = plain decoding (always measured)
    batches: tuple[int, ...]
    contexts: tuple[int, ...]  # cached tokens per sequence before the step
    repeats: int = 10  # timed rounds per configuration (at least MIN_ROUNDS)
    warmup: int = 2  # untimed calls per configuration first
    topk: int = 10
    seed: int = 0
    time_budget_s: float = 0.0  # seconds of extra rounds for undecided cells, the whole sweep
    max_rounds_factor: int = 4  # at most this x repeats rounds per group (a power of 2)
    verification: str = "tree"  # the form measured: "tree" or "candidates" (treeopt.forms)
    tolerance: float = DEFAULT_TOLERANCE  # the equivalence margin a cell is settled at
    threshold: float = 1.0  # the speedup a tree must beat to be shipped
    # how the timed steps run (docs/decoder.md#static-shape-steps): True static shapes,
    # captured as CUDA graphs on CUDA; None the same on CUDA, eager elsewhere; False the eager
    # forward (`--no-graphs`)
    graphs: bool | None = None

    @property
    def looks(self) -> int:
        """How often a group's answer may be looked at: after `repeats` rounds, then after each
        doubling up to `max_rounds_factor` x repeats (1 without a time budget)."""
        return 1 + int(math.log2(self.max_rounds_factor)) if self.time_budget_s > 0 else 1

    @property
    def confidence(self) -> float:
        """The confidence of every interval of this sweep: CONFIDENCE, spent over the looks
        (docs/statistics.md#measuring-until-the-answer-is-known)."""
        return sequential_confidence(self.looks)

    def __post_init__(self):
        if self.verification not in VERIFICATION_FORMS:
            raise UserError(
                f"--verification: must be one of {', '.join(VERIFICATION_FORMS)}, got {self.verification!r}"
            )
        for name, minimum in (("sizes", 0), ("batches", 1), ("contexts", 1)):
            values = tuple(getattr(self, name))
            if not values or any(isinstance(v, bool) or int(v) != v or v < minimum for v in values):
                raise UserError(f"sweep {name}: expected integers >= {minimum}, got {list(values)}")
            object.__setattr__(self, name, tuple(sorted({int(v) for v in values})))
        if not float(self.time_budget_s) >= 0:
            raise UserError(f"--budget: must be >= 0 seconds, got {self.time_budget_s}")
        if int(self.repeats) < MIN_ROUNDS:
            raise UserError(
                f"--repeats: at least {MIN_ROUNDS} rounds, got {self.repeats} (with fewer, a 95% interval of the "
                "median covers the truth far less often than it says; docs/statistics.md)"
            )
        for name, minimum in (("warmup", 0), ("topk", 1), ("max_rounds_factor", 1)):
            if int(getattr(self, name)) < minimum:
                raise UserError(f"sweep {name}: must be >= {minimum}, got {getattr(self, name)}")
        factor = int(self.max_rounds_factor)
        if factor & (factor - 1):
            raise UserError(f"sweep max_rounds_factor: must be a power of 2 (rounds double per look), got {factor}")
        object.__setattr__(self, "tolerance", check_tolerance(self.tolerance))


def effective_sizes(sizes, proposal: Tree) -> list[int]:
    """The tree sizes measured: 0 always, sizes beyond the proposal tree replaced by its size."""
    return sorted({min(int(n), proposal.size) for n in sizes} | {0})


# ---- one group: a cache and one closure per tree size ---------------------------------------


@dataclass
class StepBench:
    """What `measure_group` times for one (batch, context): `fns[i]` runs one decoding step of
    tree size `sizes[i]` (sizes[0] = 0, the plain step) on `cache` and crops it back.

    cache:       `calibration.kv_cache.KVCache` holding `context` random tokens per sequence
                 (`context_ids`), with room for the largest step.
    valid:       (b, context) bool, all True (the cache slots each sequence sees).
    positions:   (b,) int64, the root's position id (= context).
    inputs:      size -> the token ids fed: (b, 1) for 0, (b, n + 1) tree tokens otherwise.
    decoders:    size -> the TreeDecoder whose `verify_forward` is timed (sizes > 0), in the
                 sweep's verification form.
    runners:     size -> the `StepRunner` of the size's forward where it runs in static shapes
                 (the plain step's and each decoder's).
    """

    sizes: list[int]
    fns: list[Callable[[], None]]
    cache: object
    context_ids: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    inputs: dict = field(default_factory=dict)
    decoders: dict = field(default_factory=dict)
    runners: dict = field(default_factory=dict)

    @property
    def context(self) -> int:
        return int(self.context_ids.shape[1])

    def cached_tokens(self) -> int:
        """Tokens in the cache, checked to be the same in every layer's keys and values."""
        lengths = {t.shape[-2] for layer in self.cache.layers for t in (layer.keys, layer.values)}
        if len(lengths) != 1:
            raise RuntimeError(f"sweep: cache layers disagree on their length: {sorted(lengths)}")
        return lengths.pop()


def check_form(drafter, verification: str) -> None:
    """UserError when `drafter` cannot be verified in the `verification` form: a draft model's
    decoder (`SpeculativeDecoder`) verifies its chain, one candidate, as a tree only."""
    if verification != "tree" and getattr(drafter, "kind", "") == "draft-model":
        raise UserError(
            f"--verification {verification}: a draft model drafts a chain, one candidate, verified "
            "in the tree form (use --verification tree)"
        )


def step_bench(
    lm,
    proposal: Tree,
    sizes,
    batch: int,
    context: int,
    *,
    topk: int = 10,
    seed: int = 0,
    verification: str = "tree",
    graphs: bool | None = None,
) -> StepBench:
    """Build the cache of `context` random tokens for `batch` sequences and one closure per
    tree size (0 first) running exactly one decoding step's model work in the `verification`
    form, then undoing its cache append. The closures wait for the device (`synchronizer`) on an accelerator.

    `graphs` (docs/decoder.md#static-shape-steps): True (and None on CUDA), every step's
    forward in static shapes over exactly the context and its new tokens (window = context +
    q), captured once per (batch, context, size) and replayed on CUDA; else the eager forward
    (the plain step through the library's 2D-mask path)."""
    sizes = sorted(set(int(n) for n in sizes) | {0})
    model, heads, device = lm.model, lm.heads, lm.device
    vocab = heads.vocab_size
    gen = torch.Generator().manual_seed(seed)
    context_ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
    check_form(heads, verification)
    if getattr(heads, "kind", "") == "draft-model":
        return _draft_model_bench(lm, proposal, sizes, context_ids, graphs)
    cache = new_cache(model, capacity=context + max(sizes) + 1)
    with torch.inference_mode():
        model_forward_hidden(
            model,
            context_ids,
            attention_mask=torch.ones_like(context_ids),
            position_ids=torch.arange(context, device=device).expand(batch, -1),
            cache=cache,
        )
    valid = torch.ones(batch, context, dtype=torch.bool, device=device)
    positions = torch.full((batch,), context, dtype=torch.long, device=device)
    sync = synchronizer(device)
    bench = StepBench(sizes, [], cache, context_ids, valid, positions)
    for n in sizes:
        if n == 0:
            token = torch.randint(0, vocab, (batch, 1), generator=gen).to(device)
            mask = torch.ones(batch, context + 1, dtype=torch.long, device=device)
            pos = positions[:, None]
            if uses_static(graphs, device):
                # the plain step in static shapes: its forward and lm_head, as plain_step_forward
                runner = bench.runners[0] = _plain_runner(model, device, graphs)
                mask = torch.zeros((batch, 1, 1, context + 1), dtype=cache.buffer.dtype, device=device)

                def plain(token=token, mask=mask, pos=pos, runner=runner):
                    runner(cache, token, mask, pos)
                    cache.crop(-1)
                    sync()
            else:

                def plain(token=token, mask=mask, pos=pos):
                    plain_step_forward(model, heads, cache, token, mask, pos, num_heads=0)
                    cache.crop(-1)
                    sync()

            bench.inputs[0] = token
            bench.fns.append(plain)
        else:
            decoder = TreeDecoder(
                model,
                heads,
                proposal.prefix(n),
                topk=topk,
                timing=False,
                verification=verification,
                graphs=graphs,
                bucket=1,
            )
            tokens = torch.randint(0, vocab, (batch, n + 1), generator=gen).to(device)

            def tree_step(decoder=decoder, tokens=tokens):
                decoder.verify_forward(cache, tokens, valid, positions)
                cache.crop(-decoder.verify_appends)
                sync()

            bench.inputs[n] = tokens
            bench.decoders[n] = decoder
            if decoder.runner is not None:
                bench.runners[n] = decoder.runner
            bench.fns.append(tree_step)
    return bench


def _plain_runner(model, device, graphs: bool | None) -> StepRunner:
    """The static-shape runner of the sweep's plain step (window = context + 1)."""
    return StepRunner(
        model,
        force_gqa=torch.device(device).type == "cpu" and uses_gqa(model),
        graphs=graphs_enabled(graphs, device),
        bucket=1,
    )


def _draft_model_bench(
    lm, proposal: Tree, sizes: list[int], context_ids: torch.Tensor, graphs: bool | None = None
) -> StepBench:
    """`step_bench` for a draft model: size n > 0 times `SpeculativeDecoder.step_work` (the
    draft's passes over the tree, then the target's verification), size 0 plain decoding; both
    models hold the `context` tokens in caches of their own. `graphs` False: the target's
    verification runs eagerly too (the draft's passes always do)."""
    batch, context = context_ids.shape
    device = lm.device
    sync = synchronizer(device)
    decoders = {n: SpeculativeDecoder(lm.model, lm.heads, proposal.prefix(n), timing=False) for n in sizes}
    if not uses_static(graphs, device):
        for decoder in decoders.values():
            decoder.td.runner = None  # the eager forward (TreeDecoder._forward)
    state = decoders[0].prefill(context_ids, capacity=context + max(sizes) + 2)
    ts = state.target
    bench = StepBench(sizes, [], ts.cache, context_ids, ts.valid, ts.next_pos)
    for n in sizes:
        if n == 0:
            token, pos = ts.root[:, None], ts.next_pos[:, None]
            mask = torch.ones(batch, context + 1, dtype=torch.long, device=device)

            def plain(token=token, mask=mask, pos=pos):
                plain_step_forward(lm.model, lm.heads, ts.cache, token, mask, pos, num_heads=0)
                ts.cache.crop(-1)
                sync()

            bench.inputs[0] = token
            bench.fns.append(plain)
        else:

            def spec_step(decoder=decoders[n]):
                decoder.step_work(state)
                sync()

            bench.inputs[n] = ts.root[:, None]
            bench.decoders[n] = decoders[n].td
            bench.fns.append(spec_step)
    return bench


@dataclass(frozen=True)
class GroupBudget:
    """How long `measure_group` may go on adding rounds to settle a cell
    (docs/statistics.md#measuring-until-the-answer-is-known): `extra_s` seconds beyond the first `repeats`
    rounds, at most `max_rounds` rounds in all; `tau` and `tau_se` (indexed by tree size) and
    the decision's `tolerance`, `threshold` and `confidence` let it judge whether the cell is
    settled."""

    extra_s: float
    max_rounds: int
    tau: np.ndarray
    tau_se: np.ndarray | None = None
    tolerance: float = DEFAULT_TOLERANCE
    threshold: float = 1.0
    confidence: float = CONFIDENCE


def _settled(samples: np.ndarray, sizes: list[int], reliable: np.ndarray, budget: GroupBudget) -> bool:
    """Whether the cell's answer is settled: no more rounds could change it by more than the
    tolerance (`treeopt.stats.decide_cell`, the rule `treeopt select` applies to the finished
    sweep)."""
    idx = np.asarray(sizes)
    se = None if budget.tau_se is None else budget.tau_se[idx]
    draws = bootstrap_speedups(samples, budget.tau[idx], se)
    lo, hi = interval(draws.speedup, budget.confidence)
    decision = decide_cell(
        draws.speedup_point,
        lo,
        hi,
        reliable,
        draws=draws.speedup,
        threshold=budget.threshold,
        tolerance=budget.tolerance,
        confidence=budget.confidence,
        rounds=samples.shape[0],
    )
    return decision.settled and decision.reason != "unreliable"


def measure_group(
    lm,
    proposal: Tree,
    sizes,
    batch: int,
    context: int,
    *,
    repeats: int,
    warmup: int,
    topk: int,
    seed: int,
    budget: GroupBudget | None = None,
    verification: str = "tree",
    graphs: bool | None = None,
) -> list[dict]:
    """Time every size of `sizes` (0 added) for one (batch, context) in paired rounds: one
    row per size with the MEASURED_COLUMNS (and batch, context, nodes), sizes ascending, and
    `round_samples`, the size's seconds per round (paired across sizes by round).

    A group whose step time falls as the tree grows beyond the noise is measured again with
    fresh rounds (once); sizes still impossible then are marked `unreliable`. With a `budget`,
    rounds are added until the cell is settled (`_settled`) or the budget is spent."""
    bench = step_bench(
        lm, proposal, sizes, batch, context, topk=topk, seed=seed, verification=verification, graphs=graphs
    )
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection would land on whichever sample is running
    try:
        with torch.inference_mode():
            for fn in bench.fns:
                for _ in range(warmup):
                    fn()

            def more(rounds: int, salt: int) -> np.ndarray:
                return np.asarray(interleaved_rounds(bench.fns, rounds=rounds, seed=seed + salt), dtype=float)

            samples = more(repeats, 0)
            remeasured = 0
            flags = impossible_sizes(samples)
            if flags.any():
                samples = more(repeats, 1)
                remeasured = 1
                flags = impossible_sizes(samples)
            if budget is not None:
                samples, flags = _extend_until_settled(samples, flags, more, bench.sizes, budget)
    finally:
        if gc_was_enabled:
            gc.enable()
    if bench.cached_tokens() != context:  # every call must crop what it appended
        raise RuntimeError(
            f"sweep: the cache holds {bench.cached_tokens()} tokens after timing, expected the context of {context}"
        )
    return _group_rows(bench.sizes, batch, context, samples, remeasured, flags)


def _extend_until_settled(samples: np.ndarray, flags: np.ndarray, more, sizes: list[int], budget: GroupBudget):
    """`samples` with rounds added (`more(rounds, salt)`), doubling them, until the cell is
    settled or the budget is spent; and the sizes' impossibility flags over them."""
    # why: the rounds double between looks, so the answer is looked at only a few
    # times and each look can spend its share of the error rate (docs/statistics.md#measuring-until-the-answer-is-known)
    t0 = time.perf_counter()
    while 2 * samples.shape[0] <= budget.max_rounds:
        if _settled(samples, sizes, ~flags, budget):
            break
        spent = time.perf_counter() - t0
        per_round = float(np.median(samples.sum(axis=1)))
        if spent + samples.shape[0] * per_round > budget.extra_s:
            break
        samples = np.vstack([samples, more(samples.shape[0], 2 + samples.shape[0])])
        flags = impossible_sizes(samples)
    return samples, flags


def _group_rows(sizes: list[int], batch: int, context: int, samples: np.ndarray, remeasured: int, flags) -> list[dict]:
    """One row per size of a group's (rounds, sizes) seconds `samples` (`measure_group`)."""
    base = samples[:, 0]
    rows = []
    for i, n in enumerate(sizes):
        st = samples[:, i]
        # why: the same-round ratio cancels drift between rounds, and a tree step does all of
        # the plain step's work and more, so a median below 1 is noise (docs/statistics.md#measured-speedup-intervals)
        ratio = max(1.0, float(np.median(st / base))) if n else 1.0
        p10, p50, p90 = np.quantile(st, [0.1, 0.5, 0.9])
        rows.append(
            {
                "batch": int(batch),
                "context": int(context),
                "nodes": int(n),
                "step_time_s": float(p50),
                "step_time_p10_s": float(p10),
                "step_time_p90_s": float(p90),
                "samples": int(samples.shape[0]),
                "remeasured": remeasured,
                "overhead": ratio,
                "unreliable": int(flags[i]),
                "round_samples": st.tolist(),
            }
        )
    return rows


# ---- the sweep ------------------------------------------------------------------------------


def _jsonable(obj):
    return json.loads(json.dumps(obj))


def _fingerprint(lm, proposal: Tree, sizes: list[int], settings: SweepSettings) -> dict:
    """What a resumed sweep must share with the file it continues."""
    return _jsonable(
        {
            "model": lm.name,
            "weights": _weights(lm),
            "device": str(lm.device),
            "dtype": str(lm.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(),
            "proposal": proposal.to_choices(),
            "verification": settings.verification,
            "steps": step_mode(settings.graphs, lm.device),
            "measurement": {
                "sizes": sizes,
                "repeats": settings.repeats,
                "warmup": settings.warmup,
                "topk": settings.topk,
                "seed": settings.seed,
                "looks": settings.looks,
                "confidence": settings.confidence,
            },
        }
    )


def _weights(lm) -> str:
    """Where the model's weights came from: a random sweep and a checkpoint's time alike but
    are different measurements, which a resume must not join."""
    seed = getattr(lm, "random_seed", None)
    return "checkpoint" if seed is None else f"random, seed {seed}"


def _differences(old: dict, new: dict) -> list[str]:
    out = []
    for key, value in new.items():
        if key == "measurement" and isinstance(old.get(key), dict):
            out += [f"{k} {old[key].get(k)!r} -> {v!r}" for k, v in value.items() if old[key].get(k) != v]
        elif old.get(key) != value:
            shown = "a different tree" if key == "proposal" else f"{old.get(key)!r} -> {value!r}"
            out.append(f"{key}: {shown}")
    return out


def _read_done(out_csv: Path, mpath: Path, fingerprint: dict, sizes: list[int]) -> tuple[pd.DataFrame, dict]:
    if not mpath.is_file():
        raise UserError(f"{out_csv}: no {mpath.name} beside it; cannot resume (remove the file or choose another -o)")
    try:
        old = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{mpath}: not valid JSON ({str(err).splitlines()[0]}); cannot resume") from None
    if not isinstance(old, dict) or old.get("format") != SWEEP_FORMAT:
        raise UserError(f"{mpath}: not a treeopt sweep metadata file; cannot resume")
    # a sweep written before the fields existed measured the tree form of a checkpoint
    # and ran its steps eagerly
    diff = _differences({"verification": "tree", "weights": "checkpoint", "steps": "eager", **old}, fingerprint)
    if diff:
        raise UserError(
            f"{out_csv}: was measured with other settings ({'; '.join(diff)}); cannot resume "
            "(remove it, choose another -o, or use the same settings)"
        )
    try:
        done = pd.read_csv(out_csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UserError(f"{out_csv}: not a sweep CSV ({str(err).splitlines()[0]}); cannot resume") from None
    missing = [
        c for c in ["batch", "context", "nodes"] + MEASURED_COLUMNS if c not in done.columns and c != "unreliable"
    ]
    if missing:
        raise UserError(f"{out_csv}: missing column '{missing[0]}'; cannot resume")
    done = done.reindex(columns=SWEEP_COLUMNS)
    # A group counts as done only when it holds every size (always true for files written
    # here: groups are written whole).
    complete = done.groupby(["batch", "context"])["nodes"].transform(lambda s: set(s) == set(sizes))
    return done[complete.astype(bool)].reset_index(drop=True), old


def _derive(
    table: pd.DataFrame,
    tau: TauCurve,
    predict,
    tau_se=None,
    samples: dict | None = None,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:
    """The columns computed from the measured ones: every tau estimate, `tau` = the one
    decisions use (`TauCurve.best`) and its standard error, speedup, the intervals (from the
    per-round `samples`), the prediction."""
    t = table.copy()
    nodes = t["nodes"].to_numpy(dtype=np.int64)
    for column, curve in (("tau_independent", tau.independent), ("tau_joint", tau.joint), ("tau_walk", tau.walked)):
        t[column] = curve[nodes] if curve is not None else np.nan
    t["tau"] = tau.best[nodes]
    t["tau_se"] = np.asarray(tau_se, dtype=float)[nodes] if tau_se is not None else np.nan
    t["speedup"] = t["tau"] / t["overhead"]
    t = add_intervals(t, samples or {}, confidence)
    if predict is None:
        for col in ("predicted_step_time_s", "predicted_overhead", "predicted_speedup"):
            t[col] = np.nan
    else:
        pred = np.array(
            [
                predict(int(b), int(n) + 1, int(s))
                for b, s, n in t[["batch", "context", "nodes"]].itertuples(index=False)
            ],
            dtype=float,
        )
        plain = np.array(
            [predict(int(b), 1, int(s)) for b, s in t[["batch", "context"]].itertuples(index=False)], dtype=float
        )
        t["predicted_step_time_s"] = pred
        t["predicted_overhead"] = pred / plain
        t["predicted_speedup"] = physical_speedup(t["tau"], t["predicted_overhead"])
    return t


def _write(table: pd.DataFrame, out_csv: Path) -> None:
    with atomic_path(out_csv) as tmp:
        table.to_csv(tmp, index=False)


#: the columns a sweep keeps per row before the derived ones are added
_ROW_COLUMNS = ["batch", "context", "nodes"] + MEASURED_COLUMNS + E2E_COLUMNS


class _SweepFile:
    """A sweep's rows so far and its files (the CSV, its metadata and the per-round samples),
    written after every group. `derive(frame, samples=...)` adds the derived columns."""

    def __init__(self, out_csv: Path, meta: dict, done: pd.DataFrame, round_samples: dict, derive, *, fresh: bool):
        self.out_csv, self.meta, self.round_samples, self.derive = out_csv, meta, round_samples, derive
        self.mpath, self.spath = meta_path(out_csv), sweep_samples_path(out_csv)
        # A fresh sweep replaces an old file only when its first group is measured, and then the
        # CSV, its metadata and its samples together: an interrupted start loses nothing, and an
        # old CSV never sits next to new metadata (docs/formats.md#output-safety).
        self.fresh = fresh
        if not fresh:
            write_json(self.mpath, meta)
        self.frames = [done[_ROW_COLUMNS]] if len(done) else []

    def table(self) -> pd.DataFrame:
        frame = pd.concat(self.frames, ignore_index=True) if self.frames else pd.DataFrame(columns=_ROW_COLUMNS)
        frame = frame.astype({"batch": int, "context": int, "nodes": int})
        t = self.derive(frame, samples=self.round_samples)
        return t.reindex(columns=SWEEP_COLUMNS).sort_values(["batch", "context", "nodes"], ignore_index=True)

    def add_group(self, batch: int, context: int, rows: list[dict]) -> None:
        """Add one group's rows (`measure_group`) and write the files."""
        if all("round_samples" in r for r in rows):
            self.round_samples[(batch, context)] = (
                [r["nodes"] for r in rows],
                np.column_stack([r["round_samples"] for r in rows]),
            )
            if not self.fresh:
                write_round_samples(self.spath, self.round_samples)
        group = pd.DataFrame([{k: v for k, v in r.items() if k != "round_samples"} for r in rows])
        # End-to-end figures are per (batch, nodes), the same for every context: carry
        # those already measured over to the new group.
        old = pd.concat(self.frames, ignore_index=True) if self.frames else None
        if old is not None and old["e2e_speedup"].notna().any():
            e2e = old.dropna(subset=["e2e_speedup"]).drop_duplicates(["batch", "nodes"])
            group = group.merge(e2e[["batch", "nodes"] + E2E_COLUMNS], on=["batch", "nodes"], how="left")
        self.frames.append(group.reindex(columns=_ROW_COLUMNS))
        if not self.fresh:
            _write(self.table(), self.out_csv)
            return
        with atomic_outputs() as files:
            write_json(files.path(self.mpath), self.meta)
            if self.round_samples:
                write_round_samples(files.path(self.spath), self.round_samples)
            self.table().to_csv(files.path(self.out_csv), index=False)
        if not self.round_samples:
            self.spath.unlink(missing_ok=True)
        self.fresh = False


def _sweep_sizes(settings: SweepSettings, proposal: Tree, progress: bool) -> list[int]:
    """The tree sizes measured (`effective_sizes`), telling on stderr which were cut to the tree's."""
    sizes = effective_sizes(settings.sizes, proposal)
    dropped = sorted({int(n) for n in settings.sizes} - set(sizes))
    if dropped and progress:
        print(
            f"sweep: the proposal tree has {proposal.size} nodes; sizes {dropped} measured as {proposal.size}",
            file=sys.stderr,
        )
    return sizes


def _earlier_groups(out_csv: Path, fingerprint: dict, sizes: list[int], resume, progress: bool):
    """The complete groups of the sweep file a resume continues and its metadata; (no rows,
    None) when the sweep starts afresh (module doc)."""
    if resume not in (True, False, "auto"):
        raise ValueError(f"resume must be True, False or 'auto', got {resume!r}")
    if not (resume and out_csv.exists()):
        return pd.DataFrame(columns=SWEEP_COLUMNS), None
    try:
        return _read_done(out_csv, meta_path(out_csv), fingerprint, sizes)
    except UserError as err:
        if resume != "auto":
            raise
        if progress:
            print(f"sweep: starting afresh: {err}", file=sys.stderr)
        return pd.DataFrame(columns=SWEEP_COLUMNS), None


def _sweep_meta(meta: dict | None, fingerprint: dict, settings: SweepSettings, done: pd.DataFrame, old) -> dict:
    """The .meta.json of the sweep: the caller's `meta`, the fingerprint, every batch size and
    context measured so far (those of the resumed file `old` too)."""
    batches, contexts = set(settings.batches), set(settings.contexts)
    if old is not None:
        batches |= set(old.get("batches", [])) | set(done["batch"].astype(int))
        contexts |= set(old.get("contexts", [])) | set(done["context"].astype(int))
    return {
        **_jsonable(meta or {}),
        "format": SWEEP_FORMAT,
        **fingerprint,
        "batches": sorted(int(b) for b in batches),
        "contexts": sorted(int(s) for s in contexts),
        "columns": SWEEP_COLUMNS,
    }


def _memoised(predictor):
    """`predictor(batch, tokens, context)` remembering its answers (None stays None)."""
    if predictor is None:
        return None
    cache: dict[tuple[int, int, int], float] = {}

    def predict(b, q, s):
        if (b, q, s) not in cache:
            cache[(b, q, s)] = float(predictor(b, q, s))
        return cache[(b, q, s)]

    return predict


def _group_budget(settings: SweepSettings, tau: TauCurve, tau_se, seconds_left: float, groups_left: int):
    """The next group's share of the sweep's time budget (None: no budget)."""
    if settings.time_budget_s <= 0:
        return None
    return GroupBudget(
        max(0.0, seconds_left) / groups_left,
        settings.max_rounds_factor * settings.repeats,
        tau.best,
        None if tau_se is None else np.asarray(tau_se, dtype=float),
        settings.tolerance,
        settings.threshold,
        settings.confidence,
    )


def _release_group_memory(device) -> None:
    """On CUDA, give the finished group's cache and captured graphs back before the next
    group allocates its own: a captured step and its runner refer to each other, so they go
    only with a collection, and the next group's cache may need the memory (batch 64 at
    context 2048 of a 7B model is 73 GB)."""
    if torch.device(device).type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def run_sweep(
    lm,
    tau: TauCurve,
    settings: SweepSettings,
    out_csv,
    *,
    predictor=None,
    meta: dict | None = None,
    resume: bool = False,
    progress: bool = True,
    tau_se=None,
) -> pd.DataFrame:
    """Measure every (batch, context, size) of `settings`, writing `out_csv` (and its
    .meta.json) after each (batch, context) group; returns the table sorted by (batch,
    context, nodes).

    `tau` holds the proposal sequence and the expected tokens per step of its prefixes. Sizes
    beyond the proposal tree are replaced by its size. `predictor(batch, tokens,
    context) -> seconds` adds the roofline prediction (tokens = q = n + 1; q = 1 is plain
    decoding). `meta` entries are stored in the .meta.json. With `resume`, the groups already
    in `out_csv` are kept (see the module docstring; a file measured with other settings is a
    UserError); with resume="auto" such a file is started afresh instead (for `treeopt run`,
    whose earlier stages may have changed the tree); without it the file is started afresh.

    The per-round step times go to `NAME.samples.npz` beside the CSV; the intervals of
    overhead and speedup are bootstrapped from them, with `tau_se` (the standard error of
    `tau.best`, per size; None: tau taken as exact) for tau's own error. With
    `settings.time_budget_s` > 0, groups get extra rounds until they are decided
    (`measure_group`), the budget shared evenly among the groups still to measure.
    """
    out_csv = Path(out_csv)
    proposal = tau.proposal
    sizes = _sweep_sizes(settings, proposal, progress)
    check_bench_fits(lm.model, settings.batches, settings.contexts, max(sizes) + 1, lm.device)
    fingerprint = _fingerprint(lm, proposal, sizes, settings)
    done, old = _earlier_groups(out_csv, fingerprint, sizes, resume, progress)
    round_samples = {} if old is None else read_round_samples(sweep_samples_path(out_csv))
    derive = partial(_derive, tau=tau, predict=_memoised(predictor), tau_se=tau_se, confidence=settings.confidence)
    sweep = _SweepFile(
        out_csv, _sweep_meta(meta, fingerprint, settings, done, old), done, round_samples, derive, fresh=old is None
    )
    groups = [(b, s) for b in settings.batches for s in settings.contexts]
    have = set(map(tuple, done[["batch", "context"]].drop_duplicates().to_numpy().astype(int).tolist()))
    todo = [g for g in groups if g not in have]
    bar = tqdm(
        total=len(groups),
        initial=len(groups) - len(todo),
        desc="sweep",
        unit="group",
        disable=not progress,
        file=sys.stderr,
    )
    deadline = time.perf_counter() + float(settings.time_budget_s)
    try:
        for i, (b, s) in enumerate(todo):
            bar.set_postfix_str(f"batch {b} context {s}")
            budget = _group_budget(settings, tau, tau_se, deadline - time.perf_counter(), len(todo) - i)
            rows = measure_group(
                lm,
                proposal,
                sizes,
                b,
                s,
                repeats=settings.repeats,
                warmup=settings.warmup,
                topk=settings.topk,
                seed=settings.seed,
                budget=budget,
                verification=settings.verification,
                graphs=settings.graphs,
            )
            sweep.add_group(b, s, rows)
            _release_group_memory(lm.device)
            bar.update(1)
    finally:
        bar.close()
    table = sweep.table()
    if not todo:  # nothing measured: still refresh the derived columns in the file
        _write(table, out_csv)
    return table


# ---- end to end -----------------------------------------------------------------------------


@contextlib.contextmanager
def left_padding(tokenizer):
    """Pad on the left for the duration (the decoder takes padding anywhere, but left is what
    generation code expects), with a pad token (eos, or unk, when the tokenizer has none)."""
    old_side, old_pad = tokenizer.padding_side, tokenizer.pad_token
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise UserError("tokenizer: has no pad, eos or unk token to pad a batch of prompts with")
        tokenizer.pad_token = fallback
    tokenizer.padding_side = "left"
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = old_side
        if old_pad is None:
            tokenizer.pad_token = None


def prompt_batches(tokenizer, prompts: list[str], batch: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded (input_ids, attention_mask) batches of exactly `batch` prompts: the
    prompts in order, cycled when there are fewer than `batch` (the last incomplete batch is
    dropped so every batch has the same size)."""
    if not prompts:
        raise UserError("prompts: none given")
    count = max(1, len(prompts) // batch)
    out = []
    with left_padding(tokenizer):
        for i in range(count):
            chunk = [prompts[(i * batch + j) % len(prompts)] for j in range(batch)]
            enc = tokenizer(chunk, return_tensors="pt", padding=True)
            out.append((enc["input_ids"].to(device), enc["attention_mask"].to(device)))
    return out


def token_batches(token_lists: list[list[int]], batch: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`prompt_batches` of prompts given as token ids of one length (a model without a
    tokenizer: random weights, `calibration.random_model.random_token_ids`)."""
    if not token_lists:
        raise UserError("prompts: none given")
    count = max(1, len(token_lists) // batch)
    out = []
    for i in range(count):
        ids = torch.tensor([token_lists[(i * batch + j) % len(token_lists)] for j in range(batch)], dtype=torch.long)
        out.append((ids.to(device), torch.ones_like(ids).to(device)))
    return out


def _decoder(lm, tree: Tree, topk: int, verification: str, graphs: bool | None = None):
    """The reference decoder of `lm` over `tree` in the `verification` form, its steps run as
    `graphs` says (docs/decoder.md#static-shape-steps)."""
    if getattr(lm.heads, "kind", "") == "draft-model":
        return decoder_for(lm.model, lm.heads, tree, topk=topk, timing=False)
    return TreeDecoder(lm.model, lm.heads, tree, topk=topk, timing=False, verification=verification, graphs=graphs)


def _decode_batches(decoders: dict, encoded, rng: random.Random, sync, max_new_tokens: int) -> list[dict]:
    """Decode every batch of `encoded` with every size's decoder, in a fresh random order per
    batch: per size (ascending), its nodes, e2e_tokens_per_s and e2e_tokens_per_step
    (`measure_end_to_end`)."""
    sizes = list(decoders)
    emitted = dict.fromkeys(sizes, 0)
    accepted = dict.fromkeys(sizes, 0)
    pairs = dict.fromkeys(sizes, 0)
    seconds = dict.fromkeys(sizes, 0.0)
    for ids, mask in encoded:
        order = list(sizes)
        rng.shuffle(order)
        for n in order:
            sync()
            t0 = time.perf_counter()
            result = decoders[n].generate(ids, mask, max_new_tokens=max_new_tokens)
            sync()
            seconds[n] += time.perf_counter() - t0
            emitted[n] += sum(len(t) for t in result.tokens)
            active = result.accepted > 0
            accepted[n] += int(result.accepted[active].sum())
            pairs[n] += int(active.sum())
    return [
        {
            "nodes": n,
            "e2e_tokens_per_s": emitted[n] / seconds[n],
            "e2e_tokens_per_step": accepted[n] / pairs[n] if pairs[n] else float("nan"),
        }
        for n in sizes
    ]


def measure_end_to_end(
    lm,
    proposal: Tree,
    sizes,
    batches,
    prompts: list[str] | list[list[int]],
    *,
    max_new_tokens: int,
    topk: int = 10,
    warmup: bool = True,
    seed: int = 0,
    progress: bool = True,
    verification: str = "tree",
    graphs: bool | None = None,
) -> pd.DataFrame:
    """The real greedy decoder on `prompts` (texts; token ids of one length for a model
    without a tokenizer), per (batch, tree size): rows batch, nodes,
    e2e_tokens_per_s, e2e_tokens_per_step, e2e_speedup.

    Every batch of prompts is decoded with every tree size in a fresh random order
    (interleaved, like the step sweep), after one untimed warm-up generation per size.
    e2e_tokens_per_s: all new tokens (the prefill's first one included) over the wall time of
    `generate` (prefill included); no eos stop, so every size emits the same number of tokens
    and the ratio to plain decoding (e2e_speedup) is the throughput gain.
    e2e_tokens_per_step: tokens per decoding step per sequence, over the (sequence, step)
    pairs, = accepted nodes + 1 (the first token comes from the prefill, not from a step); the
    measured counterpart of tau. The decoder verifies in the `verification` form.
    """
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: must be >= 1, got {max_new_tokens}")
    check_form(lm.heads, verification)
    sizes = effective_sizes(sizes, proposal)
    batches = sorted({int(b) for b in batches})
    rng = random.Random(seed)
    sync = synchronizer(lm.device)
    rows = []
    bar = tqdm(total=len(batches) * len(sizes), desc="end-to-end", unit="cfg", disable=not progress, file=sys.stderr)
    try:
        for b in batches:
            if lm.tokenizer is None:
                encoded = token_batches(prompts, b, lm.device)
            else:
                encoded = prompt_batches(lm.tokenizer, prompts, b, lm.device)
            decoders = {n: _decoder(lm, proposal.prefix(n), topk, verification, graphs) for n in sizes}
            if warmup:
                for n in sizes:
                    decoders[n].generate(*encoded[0], max_new_tokens=min(2, max_new_tokens))
            for row in _decode_batches(decoders, encoded, rng, sync, max_new_tokens):
                rows.append({"batch": b, **row})
                bar.update(1)
    finally:
        bar.close()
    df = pd.DataFrame(rows, columns=["batch", "nodes", "e2e_tokens_per_s", "e2e_tokens_per_step"])
    base = df[df["nodes"] == 0].set_index("batch")["e2e_tokens_per_s"]
    df["e2e_speedup"] = df["e2e_tokens_per_s"] / df["batch"].map(base)
    return df
