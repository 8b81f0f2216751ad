"""A chain's acceptance from counts: per-position conditional acceptance with Wilson intervals,
tau of every chain length with a normal interval, a flagged and bounded extrapolation past the
served length, the first-class accuracy table, and the check of observed acceptance against an
expectation (docs/statistics.md#engine-reported-acceptance).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from treeopt.accuracy import AccuracyTable, wilson_interval
from treeopt.engine_readers import EngineWindow
from treeopt.errors import UserError
from treeopt.version import __version__

#: Chain lengths past the served K are extrapolated at most this many times K further.
EXTRAPOLATE_FACTOR = 1


@dataclass(frozen=True)
class ChainAcceptance:
    """The acceptance of a chain of K drafted tokens from step counts.

    tries[j], accepted[j]: steps that reached position j + 1 (every earlier draft token
    accepted) and steps that accepted it; conditional = accepted / tries.
    tau[k], tau_low[k], tau_high[k]: tokens per step of a chain of k, k = 0 .. K + extra;
    extrapolated[k] is True past K.
    """

    tries: np.ndarray
    accepted: np.ndarray
    conditional: np.ndarray
    conditional_low: np.ndarray
    conditional_high: np.ndarray
    tau: np.ndarray
    tau_low: np.ndarray
    tau_high: np.ndarray
    extrapolated: np.ndarray
    confidence: float

    @property
    def num_spec_tokens(self) -> int:
        return len(self.tries)


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise UserError(f"confidence: must be between 0 and 1, got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def chain_acceptance(histogram, *, confidence: float = 0.95, extra: int | None = None) -> ChainAcceptance:
    """From the accepted-length histogram h (K + 1,) of N = sum(h) steps.

    Position j (1-based) is tried by the steps that accepted >= j - 1 tokens and accepted by those
    that accepted >= j; its Wilson interval comes from those two counts. tau(k) = 1 + E[min(L, k)]
    with L a step's accepted length; its interval is the normal one of that mean, from the
    histogram's own variance. Past K (up to `extra`, default K * EXTRAPOLATE_FACTOR more) the last
    conditional acceptance is held (point), the bounds run from nothing more accepted (low) to the
    Wilson upper bounds of reaching K and of the last position held (high).
    """
    h = np.asarray(histogram, dtype=np.float64)
    if h.ndim != 1 or h.size < 2 or np.any(h < 0) or h.sum() <= 0:
        raise UserError("accepted-length histogram: expected K + 1 >= 2 non-negative counts with at least one step")
    K, N = h.size - 1, h.sum()
    reach = h[::-1].cumsum()[::-1]  # reach[j] = steps accepting >= j, reach[0] = N
    tries, accepted = reach[:-1], reach[1:]
    ci = wilson_interval(accepted, tries, confidence=confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        conditional = np.where(tries > 0, accepted / tries, np.nan)
    z = _z(confidence)
    lengths = np.arange(K + 1, dtype=np.float64)
    ks = np.arange(K + 1)
    capped = np.minimum(lengths[None, :], ks[:, None])  # (k, L): min(L, k)
    mean = capped @ h / N
    var = (capped**2 @ h / N - mean**2) * N / max(N - 1, 1)  # the sample variance of min(L, k)
    half = z * np.sqrt(np.maximum(var, 0) / N)
    tau, low, high = 1 + mean, np.maximum(1 + mean - half, 1.0), np.minimum(1 + mean + half, 1.0 + ks)
    extra = K * EXTRAPOLATE_FACTOR if extra is None else int(extra)
    if extra > 0:
        tau, low, high = _extrapolate(
            tau, low, high, accepted[-1] / N, conditional[-1], ci, (accepted[-1], N), extra, confidence
        )
    flags = np.arange(len(tau)) > K
    return ChainAcceptance(tries, accepted, conditional, ci.low, ci.high, tau, low, high, flags, confidence)


def _extrapolate(tau, low, high, reach_k, p_last, ci, reach_counts, extra: int, confidence: float):
    """tau past K (docs/statistics.md#extrapolating-past-the-served-length)."""
    p = 0.0 if not np.isfinite(p_last) else float(p_last)
    p_hi = 0.0 if not np.isfinite(ci.high[-1]) else float(ci.high[-1])
    reach_hi = float(wilson_interval(reach_counts[0], reach_counts[1], confidence=confidence).high)
    i = np.arange(1, extra + 1)
    more = tau[-1] + reach_k * np.cumsum(p**i)
    more_high = high[-1] + reach_hi * np.cumsum(p_hi**i)
    return (
        np.concatenate([tau, more]),
        np.concatenate([low, np.full(extra, low[-1])]),
        np.concatenate([high, more_high]),
    )


def chain_table(window: EngineWindow) -> AccuracyTable:
    """A first-class accuracy table (width 1: a chain) from an engine window: head j's
    positions are the steps that reached position j and its hits the steps that accepted it, so
    that the independent-heads product of accuracies is exactly the observed reach, and tau of
    any chain is the observed one (docs/formats.md#engine-chain-tables). Positions that no step
    reached are left out (the table ends at the first position nobody got to)."""
    c = chain_acceptance(window.accepted_length_histogram, extra=0)
    heads = int(np.count_nonzero(c.tries > 0))
    prov = {
        "source": window.source,
        "date": datetime.date.today().isoformat(),
        "tool_version": __version__,
        "heads": "chain",
        "engine_acceptance": window.to_dict(),
    }
    return AccuracyTable(hits=c.accepted[:heads, None], positions=c.tries[:heads], joint=None, provenance=prov)


def window_of_table(table: AccuracyTable, source: str) -> EngineWindow | None:
    """The engine window a chain table was built from, or None for a table from elsewhere."""
    prov = table.provenance or {}
    if "engine_acceptance" not in prov:
        return None
    window = EngineWindow.from_dict(prov["engine_acceptance"], source)
    c = chain_acceptance(window.accepted_length_histogram, extra=0)
    heads = table.num_heads
    # the stored histogram is the table's provenance only if it gives the table's own counts
    if heads > len(c.tries) or not (
        np.allclose(c.tries[:heads], table.positions) and np.allclose(c.accepted[:heads], table.hits[:, 0])
    ):
        raise UserError(
            f"{source}: provenance.engine_acceptance.accepted_length_histogram does not give the table's "
            "positions and hits (edited by hand?)"
        )
    return window


def describe_window(window: EngineWindow) -> str:
    """One line: where the counts came from (engine, window, counts)."""
    w = window.window
    if "requests" in w:
        span = f"{w['requests']} requests"
    elif w.get("earlier_created") is not None or len(window.files) > 1:
        span = f"between scrapes {window.files[-1]} and {window.files[0]}"
    else:
        span = "since the server started"
    return (
        f"{window.source}, {span}: {window.num_drafts:,} verification steps of K = {window.num_spec_tokens}, "
        f"{int(window.accepted_per_position.sum()):,} draft tokens accepted"
    )


# ---------------------------------------------------------------------------------------------
# Acceptance against expectation


@dataclass(frozen=True)
class PositionCheck:
    position: int  # 1-based
    observed: tuple[float, float, float]  # point, low, high (Wilson)
    expected: tuple[float, float, float]
    difference: tuple[float, float, float]  # observed - expected, Newcombe's interval
    verdict: str  # "consistent" | "below" | "above" | "not reached"


@dataclass(frozen=True)
class ExpectationCheck:
    positions: tuple[PositionCheck, ...]
    tolerance: float
    confidence: float  # per position, after the Bonferroni split

    @property
    def consistent(self) -> bool:
        return all(p.verdict in ("consistent", "not reached") for p in self.positions)

    def line(self) -> str:
        """One line: consistent, or where acceptance left its expectation."""
        if self.consistent:
            checked = sum(p.verdict == "consistent" for p in self.positions)
            return f"consistent: {checked} positions within {self.tolerance:g} of expectation"
        bad = [p for p in self.positions if p.verdict in ("below", "above")]
        first = bad[0]
        o, e = first.observed, first.expected
        if first.verdict == "below":
            # a chain reaches position j only through every position before it
            j = first.position
            where = f"acceptance collapsed at position {j} (position {j} onwards reached less often)"
        else:
            where = f"acceptance above expectation at position {first.position}"
        others = [f"{p.position} {p.verdict}" for p in bad[1:]]
        if others:
            where += "; also position " + ", ".join(others)
        return (
            f"inconsistent: {where}; position {first.position} accepts {o[0]:.3f} [{o[1]:.3f}, {o[2]:.3f}], "
            f"expected {e[0]:.3f} [{e[1]:.3f}, {e[2]:.3f}]"
        )


def newcombe_difference(x1, n1, x2, n2, *, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p1 - p2 with Newcombe's (1998) hybrid score interval from the two Wilson intervals
    (method 10): low = d - sqrt((p1 - l1)^2 + (u2 - p2)^2), high = d + sqrt((u1 - p1)^2 + (p2 - l2)^2)."""
    x1, n1, x2, n2 = (np.asarray(a, dtype=np.float64) for a in (x1, n1, x2, n2))
    with np.errstate(divide="ignore", invalid="ignore"):
        p1, p2 = x1 / n1, x2 / n2
    a, b = wilson_interval(x1, n1, confidence=confidence), wilson_interval(x2, n2, confidence=confidence)
    d = p1 - p2
    low = d - np.sqrt((p1 - a.low) ** 2 + (b.high - p2) ** 2)
    high = d + np.sqrt((a.high - p1) ** 2 + (p2 - b.low) ** 2)
    return d, low, high


def expected_counts(table: AccuracyTable) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, tries) per chain position that a table predicts: from its joint prefix counts
    of the all-top-1 path when it has them (the chain's own statistics), else its top-1 hits and
    positions (exact for a chain table, the independent-heads reading for Medusa-style heads)."""
    K = table.num_heads
    if table.joint:
        reach = np.array([table.positions[0]] + [table.joint.get((0,) * d, 0) for d in range(1, K + 1)], dtype=float)
        return reach[1:], reach[:-1]
    return np.asarray(table.hits[:, 0], dtype=float), np.asarray(table.positions, dtype=float)


def check_expectation(
    observed: tuple[np.ndarray, np.ndarray],
    expected: tuple[np.ndarray, np.ndarray],
    *,
    tolerance: float = 0.05,
    confidence: float = 0.95,
) -> ExpectationCheck:
    """Each position's observed conditional acceptance against the expected one. A position is
    inconsistent when Newcombe's interval of the difference lies wholly beyond +-tolerance; the
    confidence is split over the positions compared (Bonferroni), so that a consistent window
    passes every position together with the stated confidence."""
    if not 0 <= tolerance < 1:
        raise UserError(f"--tolerance: must be in [0, 1), got {tolerance}")
    xo, no = (np.asarray(a, dtype=float) for a in observed)
    xe, ne = (np.asarray(a, dtype=float) for a in expected)
    K = min(len(no), len(ne))
    if K == 0:
        raise UserError("no chain position to compare")
    xo, no, xe, ne = xo[:K], no[:K], xe[:K], ne[:K]
    compared = np.count_nonzero((no > 0) & (ne > 0))
    per = 1 - (1 - confidence) / max(compared, 1)
    d, lo, hi = newcombe_difference(xo, no, xe, ne, confidence=per)
    wo, we = wilson_interval(xo, no, confidence=per), wilson_interval(xe, ne, confidence=per)
    out = []
    for j in range(K):
        if no[j] <= 0 or ne[j] <= 0:
            verdict = "not reached"
        elif hi[j] < -tolerance:
            verdict = "below"
        elif lo[j] > tolerance:
            verdict = "above"
        else:
            verdict = "consistent"
        po = xo[j] / no[j] if no[j] > 0 else float("nan")
        pe = xe[j] / ne[j] if ne[j] > 0 else float("nan")
        out.append(
            PositionCheck(
                j + 1,
                (po, float(wo.low[j]), float(wo.high[j])),
                (pe, float(we.low[j]), float(we.high[j])),
                (float(d[j]), float(lo[j]), float(hi[j])),
                verdict,
            )
        )
    return ExpectationCheck(tuple(out), tolerance, per)
