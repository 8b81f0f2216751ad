"""A hardware profile fitted to an engine's measured step times
(docs/performance-model.md#fitting-a-profile-to-measured-steps).

The measurements are a CSV of steps (`STEP_COLUMNS`, optional `OPTIONAL_COLUMNS`): b sequences
with s cached tokens each verify q tokens (root included; q = 1 is plain decoding), optionally
split into c candidate sequences, in step_ms milliseconds. The fit keeps the base profile's
roofs and moves a few bounded terms, each with a physical meaning (`FIT_TERMS`):

- eta_memory: the attained fraction of bandwidth for weights (sets plain decoding);
- forward_overhead_s: the fixed cost of every step (launches, host work);
- spec_step_overhead_s, verified_token_s, draft_stage_s: the engine terms of a speculative step
  (tree_verify_layer_s, the cost per layer of verifying a branching tree, stays the base's; the
  rows a `tree` column marks pay it in every prediction, the others are chains);
- gemm_efficiency_scale: the skinny-GEMM row efficiency, scaled as a whole;
- attention_kv_efficiency: the attention kernel's achieved KV bandwidth, one value or, with
  three or more contexts, a line in log2(keys) between the shortest and longest.

The fit is a MAP estimate: every term has a prior (`PRIORS`: a range from physics and a
Gaussian scale around the base profile's value, `term_priors`), the relative errors of the rows
are weighed by the noise the residuals show (soft_l1: one outlier row does not pull the fit),
and the Laplace approximation at the optimum gives each term a 95% interval and a status:
"determined" by the rows, left at its "prior", or "at bound" (`TermStatus`). A term is fitted
only when the rows can tell it apart (`identifiable_terms`); the others keep the base value
and are reported as "prior".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from roofline.engine_bench import read_step_tables, tree_flags
from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.latency import step_time_s
from roofline.shapes import DraftHeadsShape, ModelShape
from roofline.step_shape import ONE_GPU, GpuSplit, StepShape
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
    "PRIORS",
    "Prior",
    "TermStatus",
    "term_priors",
    "fit_profile",
    "term_text",
    "terms_line",
    "apply_terms",
    "batch_transfer",
    "error_summary",
]

STEP_COLUMNS = ("batch", "context", "tokens", "step_ms")
#: the optional columns read as numbers; `tree` (1/0, true/false) is read by engine_bench.tree_flags
NUMERIC_OPTIONAL_COLUMNS = ("candidates", "draft_stages")
OPTIONAL_COLUMNS = (*NUMERIC_OPTIONAL_COLUMNS, "tree")
TIME_TERMS = ("forward_overhead_s", "spec_step_overhead_s", "verified_token_s", "draft_stage_s")


@dataclass(frozen=True)
class PriorSpec:
    """One row of `PRIORS`: the physical range [lower, upper] and the prior's scale (time terms
    in units of the median measured step), in the term's transform ("linear": (x - centre) /
    scale; "log": log(x / centre) / scale); `measured_scale`: the scale, relative to the centre,
    when the base profile measured the term (a calibrated or fitted base, `term_priors`)."""

    lower: float
    upper: float
    scale: float
    measured_scale: float
    transform: str = "linear"
    why: str = ""


# The prior of every fitted term (docs/performance-model.md#fitting-a-profile-to-measured-steps).
# The centre is the base profile's value, clipped into the range. Where each range comes from:
PRIORS = {
    # single-token decoding reaches 77-80% of datasheet bandwidth on A100, H100 and A40, and the
    # published GEMM timings stream weights at 77.5% (H100) and 80% (A40) of it
    # (docs/performance-model.md#efficiencies, #gemm-row-efficiency): no engine streams at the
    # datasheet rate, so the range stops at 0.92; below 0.3 is a unit or shape mistake, not an
    # engine. A calibrated base measured its bandwidth as a streaming read, which an engine can
    # reach but not beat: there the range is 0.05-1 of that measured rate (`term_priors`).
    "eta_memory": PriorSpec(0.30, 0.92, 0.10, 0.35, why="77-80% of datasheet on A100/H100/A40"),
    # fixed costs are costs (>= 0); the ideal engine pays none (#framework-overheads), a
    # production engine a good part of a step (IBM's: 3.1 ms per speculative step,
    # #published-speculative-steps): a scale of one median step leaves them to the rows
    "forward_overhead_s": PriorSpec(0.0, 10.0, 1.0, 0.5, why=">= 0; ideal engine 0"),
    "spec_step_overhead_s": PriorSpec(0.0, 10.0, 1.0, 0.5, why=">= 0; ideal engine 0"),
    # per verified token: IBM's 51 us is 0.5% of a step; a tenth of a step per token is ample
    "verified_token_s": PriorSpec(0.0, 1.0, 0.1, 0.5, why=">= 0; ideal engine 0"),
    "draft_stage_s": PriorSpec(0.0, 10.0, 1.0, 0.5, why=">= 0; ideal engine 0"),
    # the scaled row curve times eta_c may not pass the compute roof at any row (#efficiencies):
    # the upper bound is min(2, 1 / (eta_c x the curve's largest value)) of the base, 1.35 for the
    # built-in A100; log-normal around 1 (x/÷ 1.35 at one scale)
    "gemm_efficiency_scale": PriorSpec(0.1, 2.0, 0.3, 0.3, "log", why="scaled curve x eta_c <= 1"),
    # a decode attention kernel reads the cache no faster than a streaming read
    # (#attention-kv-bandwidth): at most 1
    "attention_kv_short": PriorSpec(0.02, 1.0, 0.25, 0.25, why="<= 1: no faster than a streaming read"),
    "attention_kv_long": PriorSpec(0.02, 1.0, 0.25, 0.25, why="<= 1: no faster than a streaming read"),
}
# name -> (lower, upper) of the table; time terms in units of the median measured step
FIT_TERMS = {name: (spec.lower, spec.upper) for name, spec in PRIORS.items()}
SOFT_L1_SCALE = 0.05  # relative errors above ~5% (or above the noise, if larger) count linearly
NOISE_DEFAULT = 0.05  # a row's relative error scale before the residuals say it (and with no spare rows)
NOISE_RANGE = (0.001, 0.5)  # the residuals' noise estimate is clipped to this range (0.1%: a step timed well)
INTERVAL_Z = 1.959964  # the reported intervals are 95% (Laplace: normal at the optimum)
DETERMINED_RATIO = 0.5  # "determined": the posterior sd under half the prior's
BOUND_TOLERANCE = 1e-3  # "at bound": within this fraction of the prior's scale of a bound


@dataclass(frozen=True)
class Prior:
    """A term's prior for one fit: Gaussian with `centre` and `scale` (in the term's units) in
    `transform`, truncated to [lower, upper]."""

    centre: float
    scale: float
    lower: float
    upper: float
    transform: str = "linear"
    measured: bool = False

    def residual(self, x):
        if self.transform == "log":
            return np.log(np.maximum(x, 1e-300) / self.centre) / self.scale
        return (x - self.centre) / self.scale

    @property
    def sd(self) -> float:
        """The prior's standard deviation in the term's own units (at the centre)."""
        return self.scale * self.centre if self.transform == "log" else self.scale

    def interval(self) -> tuple[float, float]:
        """The prior's own 95% interval, clipped to the range."""
        if self.transform == "log":
            lo, hi = self.centre * np.exp(-INTERVAL_Z * self.scale), self.centre * np.exp(INTERVAL_Z * self.scale)
        else:
            lo, hi = self.centre - INTERVAL_Z * self.scale, self.centre + INTERVAL_Z * self.scale
        return float(max(lo, self.lower)), float(min(hi, self.upper))

    def record(self) -> dict:
        return {
            "centre": self.centre,
            "scale": self.scale,
            "lower": self.lower,
            "upper": self.upper,
            "transform": self.transform,
            "measured": self.measured,
        }


@dataclass(frozen=True)
class StepPoints:
    """Steps, one entry per row; candidates 1 = tree verification; draft_heads: the draft
    heads each step runs (0 = none); tree_verify: the verified tokens branch (bool)."""

    batch: np.ndarray
    context: np.ndarray
    tokens: np.ndarray
    candidates: np.ndarray
    draft_stages: np.ndarray
    draft_heads: np.ndarray
    step_s: np.ndarray
    tree_verify: np.ndarray

    def __len__(self) -> int:
        return int(self.batch.size)

    def take(self, rows) -> StepPoints:
        return StepPoints(**{k: getattr(self, k)[rows] for k in self.__dataclass_fields__})


@dataclass(frozen=True)
class ProfileFit:
    """A fitted profile with the fitted terms, which terms were free, and the relative errors
    (predicted / measured - 1) in sample and leave-one-out.

    For every term of `FIT_TERMS` (free or not): `intervals[name]` its 95% interval (Laplace at
    the optimum; a term that is not free: its prior's), `status[name]` "determined", "prior" or
    "at bound" (`TermStatus`), `priors[name]` its `Prior`; `noise`: the relative error scale the
    rows were weighed with."""

    profile: HardwareProfile
    terms: dict
    free: tuple[str, ...]
    in_sample_error: np.ndarray
    loo_error: np.ndarray | None
    points: StepPoints | None = None  # the steps it was fitted to
    intervals: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    priors: dict = field(default_factory=dict)
    noise: float | None = None

    def values(self) -> dict:
        """Every term's value in the fitted profile: the fitted ones and, for the others, the
        base value (the prior's centre)."""
        return {name: self.terms.get(name, prior.centre) for name, prior in self.priors.items()}


class TermStatus:
    """What the rows said about a term: DETERMINED (its 95% interval is under half as wide as its
    prior's), PRIOR (the rows did not narrow it that much, or could not see it: it stays near the
    prior's centre) or AT_BOUND (the optimum sits on its physical range's edge: the rows push it
    beyond, and the value is the bound's)."""

    DETERMINED = "determined"
    PRIOR = "prior"
    AT_BOUND = "at bound"


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
    for name in STEP_COLUMNS + NUMERIC_OPTIONAL_COLUMNS:
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
        tree_verify=tree_flags(df, source, cols["tokens"]),
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
    gpus: GpuSplit = ONE_GPU,
) -> np.ndarray:
    """Predicted seconds of every step (vectorised per distinct head count; memory not checked:
    the steps were measured, so they fit), on one of `gpus`' GPUs."""
    out = np.empty(len(points))
    counts = points.draft_heads.astype(int)
    for k in np.unique(counts):  # at most K + 1 distinct head counts
        rows = counts == k
        hk = replace(heads, num_heads=int(k)) if (heads is not None and k > 0) else None
        step = StepShape(
            points.batch[rows],
            points.tokens[rows],
            points.context[rows],
            attention,
            points.candidates[rows],
            points.draft_stages[rows],
            gpus.tensor_parallel_gpus,
            points.tree_verify[rows],
            expert_parallel=gpus.expert_parallel,
        )
        out[rows] = step_time_s(shape, hk, hw, step, on_oom="ignore")
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
        if base.gemm_tiles is not None:
            changes["gemm_tiles"] = base.gemm_tiles.scaled(float(terms["gemm_efficiency_scale"]))
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


def _calibrated(base: HardwareProfile) -> bool:
    """Whether the base measured its roofs and terms (`treeopt hw calibrate`; or a fit over a
    profile): a calibration record beyond a fit's."""
    return any(k != "fit" for k in (base.calibration or {}))


def term_priors(base: HardwareProfile, points: StepPoints) -> dict:
    """{term: Prior} of a fit of `base` to `points` (`PRIORS`): centred on the base's value,
    clipped into the physical range; time terms scaled by the median measured step. A term the
    base measured (a calibrated base's positive time terms and eta_memory; every term of a
    fitted base) gets the narrower `measured_scale`, relative to its value. A calibrated base's
    bandwidth is a measured streaming read, so its eta_memory may reach 1 of it; a datasheet
    bandwidth's stops at 0.92. gemm_efficiency_scale stops where the scaled curve times eta_c
    would pass the compute roof."""
    t_ref = float(np.median(points.step_s))
    start = _base_values(base, points)
    calibrated = _calibrated(base)
    fitted = set(((base.calibration or {}).get("fit") or {}).get("terms") or ())
    out = {}
    for name, spec in PRIORS.items():
        unit = t_ref if name in TIME_TERMS else 1.0
        lower, upper = spec.lower * unit, spec.upper * unit
        if name == "eta_memory" and calibrated:
            lower, upper = 0.05, 1.0
        if name == "gemm_efficiency_scale":
            roof = base.eta_compute * max(base.gemm_efficiency.values)
            upper = min(upper, max(1.0, 1.0 / roof)) if roof > 0 else upper
        centre = float(np.clip(start[name], lower, upper))
        measured = name in fitted or (calibrated and (name == "eta_memory" or (name in TIME_TERMS and start[name] > 0)))
        if measured and spec.transform == "linear" and centre > 0:
            scale = spec.measured_scale * centre
        else:
            scale = spec.measured_scale if measured else spec.scale
            scale = scale * unit if spec.transform == "linear" else scale
        out[name] = Prior(centre, float(scale), float(lower), float(upper), spec.transform, bool(measured))
    return out


def _robust(r: np.ndarray, f: float) -> np.ndarray:
    """soft_l1 as residuals: sum of squares = sum of f^2 rho((r/f)^2), rho(z) = 2 (sqrt(1 + z) - 1):
    quadratic below f, linear above."""
    rho = 2.0 * (np.sqrt(1.0 + (r / f) ** 2) - 1.0)
    return np.sign(r) * f * np.sqrt(rho)


def _solve(shape, heads, base, points, free, attention, priors, keys_range, noise, x0=None):
    """The MAP terms: bounded least squares of the rows' relative errors over `noise` (soft_l1 at
    SOFT_L1_SCALE or the noise, whichever is larger) and every free term's prior residual.
    Returns (terms, least_squares result)."""
    lower = np.array([priors[k].lower for k in free])
    upper = np.array([priors[k].upper for k in free])
    start = np.array([priors[k].centre for k in free]) if x0 is None else np.asarray(x0, dtype=float)
    # strictly inside the range: trf starts from a feasible interior point
    span = upper - lower
    start = np.clip(start, lower + 1e-9 * span, upper - 1e-9 * span)
    sd = np.array([priors[k].sd for k in free])
    f = max(SOFT_L1_SCALE / noise, 1.0)

    def residuals(x):
        hw = apply_terms(base, dict(zip(free, x, strict=True)), keys_range)
        rel = predict_step_s(shape, heads, hw, points, attention=attention) / points.step_s - 1.0
        prior = [priors[k].residual(v) for k, v in zip(free, x, strict=True)]
        return np.concatenate([_robust(rel / noise, f), np.asarray(prior, dtype=float)])

    if not free:
        return {}, None
    # x_scale puts seconds and fractions on one footing: each term in units of its prior's sd
    sol = least_squares(residuals, start, bounds=(lower, upper), x_scale=sd)
    return dict(zip(free, (float(v) for v in sol.x), strict=True)), sol


def _noise(rel: np.ndarray, free: int) -> float:
    """The rows' relative error scale: 1.4826 x the median |error| (robust to an outlier row),
    inflated by sqrt(n / (n - free)) for the terms fitted to them; NOISE_DEFAULT when the rows
    leave no spare degree of freedom."""
    n = rel.size
    if n <= free:
        return NOISE_DEFAULT
    s = 1.4826 * float(np.median(np.abs(rel))) * np.sqrt(n / (n - free))
    return float(np.clip(s, *NOISE_RANGE))


def _posterior(free, fitted, sol, priors) -> tuple[dict, dict, dict]:
    """(terms snapped to a bound where at one, 95% intervals, statuses) of the free terms from the
    Laplace approximation at the optimum: covariance (J^T J)^-1 of the whitened residuals (rows
    over the noise the residuals show, priors over their scales)."""
    jac = np.asarray(sol.jac, dtype=float)
    cov = np.linalg.pinv(jac.T @ jac)
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    grad = np.asarray(sol.grad, dtype=float)
    terms, intervals, status = {}, {}, {}
    for i, name in enumerate(free):
        prior, x = priors[name], fitted[name]
        tol = BOUND_TOLERANCE * prior.sd
        # widths compared in the prior's transform: a log prior's sd is relative to the value
        spread = sd[i] / max(x, 1e-300) if prior.transform == "log" else sd[i]
        determined = spread < DETERMINED_RATIO * prior.scale
        # a bound holds it when the optimum sits on it and the cost falls beyond it; a term whose
        # prior centre is on the bound and that the rows do not see is just at its prior
        at_lower = x - prior.lower <= tol and (grad[i] * prior.sd > 1e-6 or prior.centre - prior.lower > tol)
        at_upper = prior.upper - x <= tol and (-grad[i] * prior.sd > 1e-6 or prior.upper - prior.centre > tol)
        if at_lower or at_upper:
            status[name] = TermStatus.AT_BOUND
        else:
            status[name] = TermStatus.DETERMINED if determined else TermStatus.PRIOR
        if x - prior.lower <= tol or prior.upper - x <= tol:  # on a bound: its value, not 1e-30
            x = prior.lower if x - prior.lower <= tol else prior.upper
        terms[name] = float(x)
        if prior.transform == "log":  # normal in log(x): a multiplicative interval
            lo, hi = x * np.exp(-INTERVAL_Z * spread), x * np.exp(INTERVAL_Z * spread)
        else:
            lo, hi = x - INTERVAL_Z * sd[i], x + INTERVAL_Z * sd[i]
        intervals[name] = (float(max(lo, prior.lower)), float(min(hi, prior.upper)))
    return terms, intervals, status


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
    noise: float | None = None,
) -> ProfileFit:
    """Fit the identifiable terms (or `terms`) of `base` to `points` (MAP under `term_priors`);
    with leave_one_out, refit once per row without it and predict it. `noise`: the rows'
    relative error scale (default: estimated from a first fit's residuals)."""
    if len(points) < 2:
        raise UserError(f"{source or 'measurements'}: a fit needs at least 2 rows")
    free = tuple(terms) if terms is not None else identifiable_terms(points, shape)
    unknown = [t for t in free if t not in FIT_TERMS]
    if unknown:
        raise UserError(f"fit terms: unknown term '{unknown[0]}' (known: {', '.join(FIT_TERMS)})")
    priors = term_priors(base, points)
    keys_range = _kv_keys(points)
    if noise is None:  # a first fit led by the rows (noise at the floor); its residuals say their noise
        first, _ = _solve(shape, heads, base, points, free, attention, priors, keys_range, NOISE_RANGE[0])
        hw = apply_terms(base, first, keys_range)
        noise = _noise(predict_step_s(shape, heads, hw, points, attention=attention) / points.step_s - 1.0, len(free))
        start = [first[k] for k in free]
    else:
        start = None
    fitted, sol = _solve(shape, heads, base, points, free, attention, priors, keys_range, noise, start)
    intervals = {k: p.interval() for k, p in priors.items()}
    status = dict.fromkeys(priors, TermStatus.PRIOR)
    if sol is not None:
        fitted, post_intervals, post_status = _posterior(free, fitted, sol, priors)
        intervals.update(post_intervals)
        status.update(post_status)
    profile = apply_terms(base, fitted, keys_range)
    in_sample = predict_step_s(shape, heads, profile, points, attention=attention) / points.step_s - 1.0
    loo = None
    if leave_one_out and len(points) >= 3:
        loo = np.empty(len(points))
        for i in range(len(points)):  # one refit per row: the leave-one-out estimate itself
            keep = np.arange(len(points)) != i
            sub = points.take(keep)
            sub_free = tuple(t for t in free if t in identifiable_terms(sub, shape))
            sub_terms, _ = _solve(shape, heads, base, sub, sub_free, attention, priors, keys_range, noise)
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
        "intervals": {k: list(v) for k, v in intervals.items()},
        "interval": "95% (Laplace)",
        "status": status,
        "priors": {k: p.record() for k, p in priors.items()},
        "noise": noise,
        "in_sample_error": _summary_dict(in_sample),
        "loo_error": None if loo is None else _summary_dict(loo),
    }
    profile = profile.with_(
        name=name or f"{base.name}-fitted",
        source=f"treeopt hw fit on {source or 'measured steps'} over {base.name}",
        calibration={**(base.calibration or {}), "fit": record},
    )
    return ProfileFit(profile, fitted, free, in_sample, loo, points, intervals, status, priors, noise)


def term_text(name: str, value: float) -> str:
    """A term's value for printing: times in ms (a term at zero is 0, not 1e-30)."""
    if name.endswith("_s"):
        return f"{value * 1e3:.4g} ms"
    return f"{value:.3g}"


def terms_line(fit: ProfileFit, sep: str = " ") -> str:
    """The free terms, compactly: 'eta_memory 0.75, forward_overhead_s 0 (at bound), ...'; a
    term the rows left at its prior says so."""
    parts = []
    for name, value in fit.terms.items():
        mark = fit.status.get(name)
        note = f" ({mark})" if mark in (TermStatus.AT_BOUND, TermStatus.PRIOR) else ""
        parts.append(f"{name}{sep}{value:.3g}{note}")
    return ", ".join(parts)


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
        tree_verify=np.zeros(n, dtype=bool),  # chains, as before: the fit keeps the base's tree term
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
