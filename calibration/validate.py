"""Validation: do the predictions hold on prompts the calibration never saw?

Two checks. Acceptance: the greedy decoder's measured tokens per step for each tree size
against tau predicted from the accuracy table (independent per-rank product and joint
statistics). Latency: the sweep's measured step-latency ratio T(n)/T(0) against the roofline
prediction. Greedy acceptance of a sequence does not depend on what else is in the batch, so
tokens per step is measured once per tree size (batched for speed) and the latency side
covers every batch.

Relative errors are (predicted - measured) / measured: positive = the prediction is too high.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from calibration.batching import pad_left
from calibration.speculative import decoder_for
from treeopt.errors import UserError
from treeopt.tau import TauCurve

__all__ = [
    "AcceptanceRow",
    "ACCEPTANCE_COLUMNS",
    "LATENCY_COLUMNS",
    "measure_acceptance",
    "latency_errors",
    "relative_error",
]


@dataclass(frozen=True)
class AcceptanceRow:
    nodes: int
    measured_tokens_per_step: float  # mean over (sequence, step) pairs of accepted nodes + 1
    tau_independent: float
    tau_joint: float  # NaN without joint statistics
    steps: int  # decoding steps measured (sequence x step pairs)
    error_independent: float  # (predicted - measured) / measured
    error_joint: float
    tau_walk: float = float("nan")  # joint statistics walked as the decoder steps (NaN: no rank vectors)
    error_walk: float = float("nan")
    # fraction of generated tokens equal to plain greedy decoding's (1.0 in float32; in bf16 /
    # fp16 near-tied logits may flip, docs/decoder.md#reduced-precision)
    agreement: float = float("nan")


ACCEPTANCE_COLUMNS = [f for f in AcceptanceRow.__dataclass_fields__]
LATENCY_COLUMNS = [
    "batch",
    "context",
    "nodes",
    "overhead",
    "predicted_overhead",
    "overhead_error",
    "step_time_s",
    "predicted_step_time_s",
    "step_time_error",
]


def relative_error(predicted, measured):
    """(predicted - measured) / measured, elementwise (NaN where measured is 0 or NaN)."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(m != 0, (p - m) / m, np.nan)
    return float(out) if out.ndim == 0 else out


def measure_acceptance(
    lm,
    tau: TauCurve,
    sizes,
    prompts,
    *,
    max_new_tokens: int,
    batch_size: int = 8,
    topk: int = 10,
    progress: bool = True,
) -> pd.DataFrame:
    """Measured tokens per step of the greedy tree decoder for each size in `sizes` (trees
    `tau.proposal.prefix(n)`), beside every tau estimate of those trees, decoding every prompt
    (left-padded batches of `batch_size`, the last one smaller) for `max_new_tokens` tokens
    without an eos stop. A step's count is its verification outcome, accepted nodes + 1 (before
    the cut at max_new_tokens): what tau predicts. `prompts`: token-id sequences
    (`calibration.data.load_prompts`) or texts, tokenised here. Columns ACCEPTANCE_COLUMNS, one
    row per size."""
    if not prompts:
        raise UserError("validate: no prompts to decode")
    if max_new_tokens < 2:
        raise UserError(
            f"--max-new-tokens: must be >= 2 to measure a decoding step (the first token "
            f"comes from the prefill), got {max_new_tokens}"
        )
    sizes = [int(n) for n in sizes]
    proposal = tau.proposal
    for n in sizes:
        if n < 0 or n > proposal.size:
            raise UserError(f"--sizes: {n} nodes asked for, the proposal tree has {proposal.size}")
    tok = lm.tokenizer
    ids = [list(tok(p)["input_ids"]) if isinstance(p, str) else list(p) for p in prompts]
    pad = next((t for t in (tok.pad_token_id, tok.eos_token_id) if t is not None), 0)
    encoded = [pad_left(ids[i : i + batch_size], pad, "cpu")[:2] for i in range(0, len(ids), batch_size)]
    rows = []
    plain_tokens = []
    # the first pass is plain greedy decoding, the reference of `agreement`
    for j, n in enumerate(tqdm([0] + sizes, desc="acceptance", unit="tree", disable=not progress)):
        decoder = decoder_for(lm.model, lm.heads, proposal.prefix(n), topk=topk, timing=False)
        accepted, same, total = [], 0, 0
        for i, enc in enumerate(encoded):
            res = decoder.generate(enc[0].to(lm.device), enc[1].to(lm.device), max_new_tokens=max_new_tokens)
            if j == 0:
                plain_tokens.append(res.tokens)
                continue
            for got, want in zip(res.tokens, plain_tokens[i], strict=True):
                k = min(len(got), len(want))
                same += int(np.sum(np.asarray(got[:k]) == np.asarray(want[:k])))
                total += max(len(got), len(want))
            # res.accepted: (steps, b), 0 marks a sequence already finished.
            accepted.append(res.accepted[res.accepted > 0].ravel())
        if j == 0:
            continue
        rows.append(asdict(_acceptance_row(tau, n, accepted, same / total if total else float("nan"))))
    return pd.DataFrame(rows, columns=ACCEPTANCE_COLUMNS)


def _acceptance_row(tau: TauCurve, n: int, accepted: list[np.ndarray], agreement: float) -> AcceptanceRow:
    """Size `n`'s row: the mean of its steps' `accepted` counts beside every tau estimate."""
    accepted = np.concatenate(accepted) if accepted else np.zeros(0, np.int64)
    measured = float(accepted.mean()) if accepted.size else float("nan")
    ti, tj, tw = (
        float(curve[n]) if curve is not None else float("nan") for curve in (tau.independent, tau.joint, tau.walked)
    )
    return AcceptanceRow(
        n,
        measured,
        ti,
        tj,
        int(accepted.size),
        relative_error(ti, measured),
        relative_error(tj, measured),
        tw,
        relative_error(tw, measured),
        agreement,
    )


def latency_errors(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per measured configuration with a tree (nodes > 0): the predicted vs measured overhead
    ratio T(n)/T(0) and step time, with relative errors (predicted - measured) / measured.
    Columns LATENCY_COLUMNS."""
    need = ["batch", "context", "nodes", "overhead", "predicted_overhead"]
    missing = [c for c in need if c not in sweep.columns]
    if missing:
        raise UserError(
            f"{sweep.attrs.get('source', 'sweep')}: missing column '{missing[0]}' "
            "(the latency check needs a sweep with predictions: --hardware)"
        )
    df = sweep[sweep["nodes"] > 0].copy()
    for col in ("step_time_s", "predicted_step_time_s"):
        if col not in df.columns:
            df[col] = np.nan
    df["overhead_error"] = relative_error(df["predicted_overhead"], df["overhead"])
    df["step_time_error"] = relative_error(df["predicted_step_time_s"], df["step_time_s"])
    return df[LATENCY_COLUMNS].sort_values(["batch", "context", "nodes"]).reset_index(drop=True)
