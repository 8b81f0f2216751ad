"""A hardware profile fitted to an engine's measured step times
(docs/performance-model.md#fitting-a-profile-to-measured-steps).

The measurements are a CSV of steps (`STEP_COLUMNS`, optional `OPTIONAL_COLUMNS`): b sequences
with s cached tokens each verify q tokens (root included; q = 1 is plain decoding), optionally
split into c candidate sequences, in step_ms milliseconds. The fit keeps the base profile's
roofs and moves a few bounded terms, each with a physical meaning (`FIT_TERMS`):

- eta_memory: the attained fraction of bandwidth for weights (sets plain decoding);
- forward_overhead_s: the fixed cost of every step (launches, host work);
- spec_step_overhead_s, verified_token_s, draft_stage_s: the engine terms of a speculative step;
- gemm_efficiency_scale: the skinny-GEMM row efficiency, scaled as a whole;
- attention_kv_efficiency: the attention kernel's achieved KV bandwidth, one value or, with
  three or more contexts, a line in log2(keys) between the shortest and longest.

A term is fitted only when the rows can tell it apart (`identifiable_terms`); each is pulled
weakly toward the base profile's value, so a term the rows barely constrain stays where the
base had it. The loss is soft_l1 on relative errors: one outlier row does not pull the fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from roofline.engine_bench import read_step_tables
from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.latency import step_time_s
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt.errors import UserError

#: the longest decoding step a measurement file may hold: an hour (a larger number is a unit
#: mistake or a damaged file, and it would dominate the least-squares fit)
MAX_STEP_MS = 3.6e6

__all__ = [
    "STEP_COLUMNS",
    "OPTIONAL_COLUMNS",
    "FIT_TERMS",
    "StepPoints",
    "ProfileFit",
    "BatchTransfer",
    "read_step_points",
    "step_points_frame",
    "sweep_step_points",
    "predict_step_s",
    "identifiable_terms",
    "fit_profile",
    "apply_terms",
    "batch_transfer",
    "error_summary",
]

STEP_COLUMNS = ("batch", "context", "tokens", "step_ms")
OPTIONAL_COLUMNS = ("candidates", "draft_stages")
# name -> (lower, upper); time terms in units of the median measured step
FIT_TERMS = {
    "eta_memory": (0.05, 1.0),
    "forward_overhead_s": (0.0, 10.0),
    "spec_step_overhead_s": (0.0, 10.0),
    "verified_token_s": (0.0, 1.0),
    "draft_stage_s": (0.0, 10.0),
    "gemm_efficiency_scale": (0.1, 2.0),
    "attention_kv_short": (0.02, 1.0),
    "attention_kv_long": (0.02, 1.0),
}
TIME_TERMS = ("forward_overhead_s", "spec_step_overhead_s", "verified_token_s", "draft_stage_s")
# weight of the pull toward the base value: a residual of 1% equals a change of one median step
# (time terms) or of 1.0 (efficiencies), far more than any fitted term moves
PRIOR_WEIGHT = 0.01
SOFT_L1_SCALE = 0.05  # relative errors above ~5% count linearly, not squared


@dataclass(frozen=True)
class StepPoints:
    """Steps, one entry per row; candidates 1 = tree verification; draft_heads: the draft
    heads each step runs (0 = none)."""

    batch: np.ndarray
    context: np.ndarray
    tokens: np.ndarray
    candidates: np.ndarray
    draft_stages: np.ndarray
    draft_heads: np.ndarray
    step_s: np.ndarray

    def __len__(self) -> int:
        return int(self.batch.size)

    def take(self, rows) -> StepPoints:
        return StepPoints(**{k: getattr(self, k)[rows] for k in self.__dataclass_fields__})


@dataclass(frozen=True)
class ProfileFit:
    """A fitted profile with the fitted terms, which terms were free, and the relative errors
    (predicted / measured - 1) in sample and leave-one-out."""

    profile: HardwareProfile
    terms: dict
    free: tuple[str, ...]
    in_sample_error: np.ndarray
    loo_error: np.ndarray | None
    points: StepPoints | None = None  # the steps it was fitted to


def step_points_frame(df: pd.DataFrame, *, source: str, heads: int = 0) -> StepPoints:
    """Check a measurements table and turn it into StepPoints. `heads`: draft heads a step
    with q > 1 runs in the prediction (0: the drafting cost is left to the engine terms)."""
    missing = [c for c in STEP_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(
            f"{source}: missing column '{missing[0]}' (needs {', '.join(STEP_COLUMNS)}; "
            f"optional {', '.join(OPTIONAL_COLUMNS)})"
        )
    if len(df) == 0:
        raise UserError(f"{source}: no rows")
    cols = {}
    for name in STEP_COLUMNS + OPTIONAL_COLUMNS:
        if name not in df.columns:
            continue
        values = pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)
        if name == "candidates":
            values = np.where(np.isnan(values), 1.0, values)
        bad = ~np.isfinite(values)
        if np.any(bad):
            raise UserError(f"{source}: row {int(np.argmax(bad)) + 1}: '{name}' is not a number")
        cols[name] = values
    floors = {"batch": 1, "context": 0, "tokens": 1, "candidates": 1, "draft_stages": 0}
    for name, floor in floors.items():
        if name in cols:
            bad = (cols[name] < floor) | (cols[name] != np.round(cols[name]))
            if np.any(bad):
                raise UserError(f"{source}: row {int(np.argmax(bad)) + 1}: '{name}' must be an integer >= {floor}")
    bad = cols["step_ms"] <= 0
    if np.any(bad):
        raise UserError(f"{source}: row {int(np.argmax(bad)) + 1}: 'step_ms' must be positive")
    bad = cols["step_ms"] > MAX_STEP_MS
    if np.any(bad):
        raise UserError(
            f"{source}: row {int(np.argmax(bad)) + 1}: 'step_ms' {cols['step_ms'][np.argmax(bad)]:g} is over "
            f"{MAX_STEP_MS:g} ms (an hour), not one decoding step (milliseconds expected)"
        )
    n = len(df)
    candidates = cols.get("candidates", np.ones(n))
    bad = candidates > cols["tokens"]
    if np.any(bad):
        raise UserError(f"{source}: row {int(np.argmax(bad)) + 1}: 'candidates' exceeds 'tokens'")
    return StepPoints(
        batch=cols["batch"],
        context=cols["context"],
        tokens=cols["tokens"],
        candidates=candidates,
        draft_stages=cols.get("draft_stages", np.zeros(n)),
        draft_heads=np.where(cols["tokens"] > 1, float(heads), 0.0),
        step_s=cols["step_ms"] / 1e3,
    )


def read_step_points(path, *, heads: int = 0, run=None) -> StepPoints:
    """The measurements at `path` (docs/performance-model.md#fitting-a-profile-to-measured-steps):
    a step CSV or an engine's own benchmark output (`roofline.engine_bench`), or a list of such
    files whose steps are joined. `run`: an `engine_bench.RunOptions` with what a benchmark file
    does not record (batch, lengths, tokens per step)."""
    parts = [step_points_frame(df, source=source, heads=heads) for source, df in read_step_tables(path, run)]
    if len(parts) == 1:
        return parts[0]
    return StepPoints(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in StepPoints.__dataclass_fields__})


def predict_step_s(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    hw: HardwareProfile,
    points: StepPoints,
    *,
    attention: str = "fused",
) -> np.ndarray:
    """Predicted seconds of every step (vectorised per distinct head count; memory not checked:
    the steps were measured, so they fit)."""
    out = np.empty(len(points))
    counts = points.draft_heads.astype(int)
    for k in np.unique(counts):  # at most K + 1 distinct head counts
        rows = counts == k
        hk = replace(heads, num_heads=int(k)) if (heads is not None and k > 0) else None
        out[rows] = step_time_s(
            shape,
            hk,
            hw,
            batch=points.batch[rows],
            tokens=points.tokens[rows],
            context=points.context[rows],
            attention=attention,
            on_oom="ignore",
            candidates=points.candidates[rows],
            draft_stages=points.draft_stages[rows],
        )
    return out


def identifiable_terms(points: StepPoints, shape: ModelShape) -> tuple[str, ...]:
    """The terms these rows can tell apart: plain-decoding terms always; the speculative-step
    terms with rows of q > 1; the per-token cost with two or more verified-token counts; the
    draft-stage cost when the stage counts vary; the GEMM scale with a step of at least 128
    token rows (where the row efficiency leaves its flat start,
    docs/performance-model.md#gemm-row-efficiency); attention's KV bandwidth with two or more
    contexts, a line with three."""
    spec = points.tokens > 1
    terms = ["eta_memory", "forward_overhead_s"]
    if np.any(spec):
        terms.append("spec_step_overhead_s")
        if np.unique(points.batch * points.tokens).size >= 2:
            terms.append("verified_token_s")
        if np.unique(points.draft_stages[spec]).size >= 2:
            terms.append("draft_stage_s")
    if np.max(points.batch * points.tokens) >= 128:
        terms.append("gemm_efficiency_scale")
    contexts = np.unique(points.context)
    if contexts.size >= 2:
        terms.append("attention_kv_short")
    if contexts.size >= 3:
        terms.append("attention_kv_long")
    return tuple(terms)


def _kv_keys(points: StepPoints) -> tuple[float, float]:
    keys = points.context + points.tokens / points.candidates
    return float(max(np.min(keys), 1.0)), float(max(np.max(keys), np.min(keys) + 1.0, 2.0))


def apply_terms(base: HardwareProfile, terms: dict, keys_range: tuple[float, float]) -> HardwareProfile:
    """`base` with fitted terms: time terms and eta_memory as given, the GEMM row curve scaled,
    attention's KV efficiency as a constant (attention_kv_short alone) or a line in log2(keys)
    from keys_range[0] to keys_range[1]."""
    changes = {k: float(v) for k, v in terms.items() if k in TIME_TERMS or k == "eta_memory"}
    if "gemm_efficiency_scale" in terms:
        curve = base.gemm_efficiency
        changes["gemm_efficiency"] = EfficiencyCurve(
            curve.rows, tuple(float(v) * float(terms["gemm_efficiency_scale"]) for v in curve.values)
        )
        scaled = f"scaled by {float(terms['gemm_efficiency_scale']):.3g} to the measured steps (treeopt hw fit)"
        changes["gemm_efficiency_source"] = "; ".join(filter(None, (base.gemm_efficiency_source, scaled)))
    if "attention_kv_short" in terms:
        if "attention_kv_long" in terms:
            changes["attention_kv_efficiency"] = EfficiencyCurve(
                keys_range, (float(terms["attention_kv_short"]), float(terms["attention_kv_long"]))
            )
        else:
            changes["attention_kv_efficiency"] = EfficiencyCurve((1.0,), (float(terms["attention_kv_short"]),))
    return base.with_(**changes)


def _base_values(base: HardwareProfile, points: StepPoints) -> dict:
    short, long = _kv_keys(points)
    return {
        "eta_memory": base.eta_memory,
        "forward_overhead_s": base.forward_overhead_s,
        "spec_step_overhead_s": base.spec_step_overhead_s,
        "verified_token_s": base.verified_token_s,
        "draft_stage_s": base.draft_stage_s,
        "gemm_efficiency_scale": 1.0,
        "attention_kv_short": float(base.attention_kv_fraction(short)),
        "attention_kv_long": float(base.attention_kv_fraction(long)),
    }


def _solve(shape, heads, base, points, free, attention, t_ref, keys_range):
    start = _base_values(base, points)
    scale = np.array([t_ref if k in TIME_TERMS else 1.0 for k in free])
    lower = np.array([FIT_TERMS[k][0] for k in free]) * scale
    upper = np.array([FIT_TERMS[k][1] for k in free]) * scale
    x0 = np.clip(np.array([start[k] for k in free]), lower, upper)
    prior = x0.copy()

    def residuals(x):
        hw = apply_terms(base, dict(zip(free, x, strict=True)), keys_range)
        rel = predict_step_s(shape, heads, hw, points, attention=attention) / points.step_s - 1.0
        return np.concatenate([rel, PRIOR_WEIGHT * (x - prior) / scale])

    # soft_l1 is robust to an outlier row; x_scale puts seconds and fractions on one footing
    sol = least_squares(residuals, x0, bounds=(lower, upper), loss="soft_l1", f_scale=SOFT_L1_SCALE, x_scale=scale)
    return dict(zip(free, (float(v) for v in sol.x), strict=True))


def fit_profile(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    base: HardwareProfile,
    points: StepPoints,
    *,
    attention: str = "fused",
    name: str | None = None,
    leave_one_out: bool = True,
    terms: tuple[str, ...] | None = None,
    source: str = "",
) -> ProfileFit:
    """Fit the identifiable terms (or `terms`) of `base` to `points`; with leave_one_out, refit
    once per row without it and predict it."""
    if len(points) < 2:
        raise UserError(f"{source or 'measurements'}: a fit needs at least 2 rows")
    free = tuple(terms) if terms is not None else identifiable_terms(points, shape)
    unknown = [t for t in free if t not in FIT_TERMS]
    if unknown:
        raise UserError(f"fit terms: unknown term '{unknown[0]}' (known: {', '.join(FIT_TERMS)})")
    t_ref = float(np.median(points.step_s))
    keys_range = _kv_keys(points)
    fitted = _solve(shape, heads, base, points, free, attention, t_ref, keys_range)
    profile = apply_terms(base, fitted, keys_range)
    in_sample = predict_step_s(shape, heads, profile, points, attention=attention) / points.step_s - 1.0
    loo = None
    if leave_one_out and len(points) >= 3:
        loo = np.empty(len(points))
        for i in range(len(points)):  # one refit per row: the leave-one-out estimate itself
            keep = np.arange(len(points)) != i
            sub = points.take(keep)
            sub_terms = _solve(
                shape,
                heads,
                base,
                sub,
                tuple(t for t in free if t in identifiable_terms(sub, shape)),
                attention,
                t_ref,
                keys_range,
            )
            hw_i = apply_terms(base, sub_terms, keys_range)
            loo[i] = (
                predict_step_s(shape, heads, hw_i, points.take(~keep), attention=attention)[0] / points.step_s[i] - 1.0
            )
    record = {
        "source": source,
        "rows": len(points),
        "model": shape.name,
        "attention": attention,
        "draft_heads": 0 if heads is None else heads.num_heads,
        "base": base.name,
        "terms": fitted,
        "in_sample_error": _summary_dict(in_sample),
        "loo_error": None if loo is None else _summary_dict(loo),
    }
    profile = profile.with_(
        name=name or f"{base.name}-fitted",
        source=f"treeopt hw fit on {source or 'measured steps'} over {base.name}",
        calibration={**(base.calibration or {}), "fit": record},
    )
    return ProfileFit(profile, fitted, free, in_sample, loo, points)


def error_summary(errors) -> str:
    """'median |e| x%, worst y%' of relative errors."""
    e = np.abs(np.asarray(errors, dtype=float))
    return f"median |error| {np.median(e) * 100:.1f}%, worst {np.max(e) * 100:.1f}%"


def _summary_dict(errors) -> dict:
    e = np.abs(np.asarray(errors, dtype=float))
    return {"median_abs": float(np.median(e)), "worst_abs": float(np.max(e))}


def sweep_step_points(sweep: pd.DataFrame, heads_by_nodes) -> StepPoints:
    """StepPoints of a measured sweep (treeopt.selection SWEEP_COLUMNS: batch, context, nodes,
    step_time_s): q = nodes + 1 under a tree mask; heads_by_nodes[n] draft heads run with the
    tree of n nodes (the reference decoder runs those its depth reaches, docs/decoder.md)."""
    nodes = sweep["nodes"].to_numpy(dtype=int)
    heads = np.asarray(heads_by_nodes, dtype=float)
    n = len(sweep)
    return StepPoints(
        batch=sweep["batch"].to_numpy(dtype=float),
        context=sweep["context"].to_numpy(dtype=float),
        tokens=nodes + 1.0,
        candidates=np.ones(n),
        draft_stages=np.zeros(n),
        draft_heads=heads[nodes],
        step_s=sweep["step_time_s"].to_numpy(dtype=float),
    )


@dataclass(frozen=True)
class BatchTransfer:
    """A profile fitted on the batch-1 rows of a sweep, judged on the other batch sizes: per
    (batch, context) cell the median and worst relative error of T(n)/T(0), and the best tree
    size measured and predicted (by tau x T(0)/T(n)) with whether they are at most one swept
    size apart ("within one proposal step")."""

    fit: ProfileFit
    cells: pd.DataFrame


def batch_transfer(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    base: HardwareProfile,
    sweep: pd.DataFrame,
    heads_by_nodes,
    *,
    fit_batch: int = 1,
    fit_terms: tuple[str, ...] | None = None,
) -> BatchTransfer:
    """Fit `base` on the rows of batch `fit_batch` and predict the other batch sizes.
    fit_terms: the terms to fit (default: those the rows identify; () keeps `base` as it is)."""
    points = sweep_step_points(sweep, heads_by_nodes)
    train = points.batch == fit_batch
    if not np.any(train) or np.all(train):
        raise UserError(f"sweep: the fit needs rows of batch {fit_batch} and of other batch sizes")
    fit = fit_profile(
        shape,
        heads,
        base,
        points.take(train),
        leave_one_out=False,
        terms=fit_terms,
        source=f"the batch-{fit_batch} rows of a sweep",
    )
    frame = sweep.assign(predicted_s=predict_step_s(shape, heads, fit.profile, points))
    sizes = np.sort(frame["nodes"].unique())
    rows = []
    for (b, s), cell in frame[~train].groupby(["batch", "context"]):  # one entry per measured cell
        cell = cell.sort_values("nodes")
        plain = cell[cell["nodes"] == 0]
        if plain.empty:
            continue
        measured = cell["step_time_s"].to_numpy() / float(plain["step_time_s"].iloc[0])
        predicted = cell["predicted_s"].to_numpy() / float(plain["predicted_s"].iloc[0])
        spec = cell["nodes"].to_numpy() > 0
        err = predicted[spec] / measured[spec] - 1.0
        tau = cell["tau"].to_numpy()
        best_m = int(cell["nodes"].iloc[int(np.argmax(tau / measured))])
        best_p = int(cell["nodes"].iloc[int(np.argmax(tau / predicted))])
        apart = abs(int(np.searchsorted(sizes, best_m)) - int(np.searchsorted(sizes, best_p)))
        rows.append(
            {
                "batch": int(b),
                "context": int(s),
                "median_ratio_error": float(np.median(np.abs(err))),
                "worst_ratio_error": float(np.max(np.abs(err))),
                "best_measured": best_m,
                "best_predicted": best_p,
                "within_one_step": bool(apart <= 1),
            }
        )
    return BatchTransfer(fit, pd.DataFrame(rows))
