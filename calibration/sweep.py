"""The measured-throughput sweep: the latency of one decoding step for every proposal tree
size, batch size and context length on the machine at hand, next to the roofline prediction.

For each (batch, context) group one KV cache of `context` random tokens per sequence is built
(`calibration.step_bench`); then every tree size's step and the plain step are timed on it in interleaved
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

The CSV (columns `treeopt.sweep_file.SWEEP_COLUMNS`) is rewritten atomically after every
group, with a `NAME.meta.json` beside it (the proposal tree, the measurement settings, the
model), so an interrupted sweep resumes where it stopped (`resume=True`): groups already in
the file are kept, missing ones measured. Resuming needs the same measurement settings (tree
sizes, repeats, warm-up, topk, seed), verification form, proposal tree, model, device and dtype; the batch sizes
and contexts may differ (new groups are added). The derived columns (tau, speedup, the
prediction) are recomputed for every row from the call's tau curves and predictor.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from calibration.captured_drafting import captured_refusal, drafting_mode
from calibration.device_memory import check_bench_fits
from calibration.end_to_end import left_padding, measure_end_to_end, prompt_batches, token_batches
from calibration.fused_projections import projection_mode, use_projections
from calibration.split_attention import attention_path
from calibration.static_steps import graphs_enabled, step_mode, uses_static
from calibration.step_bench import StepBench, check_form, effective_sizes, step_bench
from treeopt.dtypes import torch_dtype_name
from treeopt.errors import UserError
from treeopt.fileio import atomic_outputs, atomic_path, write_json
from treeopt.forms import VERIFICATION_FORMS
from treeopt.resume import setting_differences
from treeopt.selection import check_tolerance
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
from treeopt.sweep_file import (
    E2E_COLUMNS,
    MEASURED_COLUMNS,
    SWEEP_COLUMNS,
    add_intervals,
    read_round_samples,
    sweep_meta_path,
    sweep_samples_path,
    write_round_samples,
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
    # the verification attention (docs/decoder.md#split-verification-attention): "split",
    # "masked", None the device's default (`--attention`)
    attention: str | None = None
    # the q/k/v and gate/up projections (docs/decoder.md#fused-projections): "fused",
    # "separate", None the device's default (`--projections`)
    projections: str | None = None
    # where the timed tree step drafts (docs/decoder.md#captured-drafting): "captured" (the
    # whole step: forward, acceptance, keep, next draft), "separate", None the default (`--drafting`)
    drafting: str | None = None

    @property
    def step_options(self) -> dict:
        """How the timed steps run: `step_bench`'s keywords."""
        keys = ("topk", "seed", "verification", "graphs", "attention", "drafting")
        return {key: getattr(self, key) for key in keys}

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
        if self.drafting == "captured" and self.graphs is False:
            raise UserError("--drafting captured: needs static-shape steps (leave out --no-graphs)")
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
    budget: GroupBudget | None = None,
    **step_options,
) -> list[dict]:
    """Time every size of `sizes` (0 added) for one (batch, context) in paired rounds: one
    row per size with the MEASURED_COLUMNS (and batch, context, nodes), sizes ascending, and
    `round_samples`, the size's seconds per round (paired across sizes by round).

    A group whose step time falls as the tree grows beyond the noise is measured again with
    fresh rounds (once); sizes still impossible then are marked `unreliable`. With a `budget`,
    rounds are added until the cell is settled (`_settled`) or the budget is spent.
    `step_options` (topk, seed, verification, graphs, attention) say how the steps run:
    `step_bench`'s keywords."""
    bench = step_bench(lm, proposal, sizes, batch, context, **step_options)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection would land on whichever sample is running
    try:
        with torch.inference_mode():
            for fn in bench.fns:
                for _ in range(warmup):
                    fn()

            seed = step_options.get("seed", 0)

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
            "dtype": torch_dtype_name(lm.dtype),
            "threads": torch.get_num_threads(),
            "proposal": proposal.to_choices(),
            "verification": settings.verification,
            "steps": step_mode(settings.graphs, lm.device),
            "attention": attention_path(lm.model, settings.attention, lm.device),
            "projections": projection_mode(lm.model),
            "drafting": sweep_drafting(lm, settings),
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


def sweep_drafting(lm, settings: SweepSettings) -> str:
    """Where the sweep's timed tree steps draft (`calibration.captured_drafting.drafting_mode`)."""
    refusal = captured_refusal(lm.heads, settings.verification)
    static = uses_static(settings.graphs, lm.device)
    captured = graphs_enabled(settings.graphs, lm.device)
    return drafting_mode(settings.drafting, refusal=refusal, static=static, captured=captured)


def _weights(lm) -> str:
    """Where the model's weights came from: a random sweep and a checkpoint's time alike but
    are different measurements, which a resume must not join."""
    seed = getattr(lm, "random_seed", None)
    return "checkpoint" if seed is None else f"random, seed {seed}"


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
    # and ran its steps eagerly through the masked attention
    before = {"verification": "tree", "weights": "checkpoint", "steps": "eager", "attention": "masked"}
    before["projections"] = "separate"
    before["drafting"] = "separate"
    diff = setting_differences({**before, **old}, fingerprint)
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
    use_projections(lm.model, settings.projections, lm.device)  # the model's, for its forwards here
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
                budget=budget,
                **settings.step_options,
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
