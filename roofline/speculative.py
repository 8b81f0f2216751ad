"""The cost of draft-model speculative decoding: gamma sequential passes of the draft model
(its own shape, the same batch, its own cache of the same context), then one verification pass
of the target over gamma + 1 tokens (docs/performance-model.md, "Draft-model steps";
Leviathan et al. 2023, section 3.4).

    step(gamma)    = sum_{j < gamma} T_draft(b, q = 1, s + j) + T_target(b, q = gamma + 1, s)
    speedup(gamma) = tau(gamma) x T_target(b, 1, s) / step(gamma)

gamma = 0 is plain decoding (speedup 1). tau(gamma) comes from the core
(`treeopt.chain.chain_tau`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from roofline.hardware import HardwareProfile
from roofline.latency import memory_required_bytes, step_time_s
from roofline.shapes import ModelShape
from treeopt.chain import chain_tau
from treeopt.errors import UserError

GAMMA_COLUMNS = [
    "batch",
    "context",
    "gamma",
    "tau",
    "draft_s",
    "verify_s",
    "step_time_s",
    "plain_step_s",
    "speedup",
    "fits_memory",
]


def draft_model_step_time_s(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    *,
    batch: int,
    gamma,
    context: int,
    attention: str = "fused",
):
    """Predicted seconds of one draft-model step for each gamma (an int or an array of ints):
    gamma draft passes of one token per sequence, the j-th over a cache of context + j tokens,
    plus the target's verification of gamma + 1 tokens. NaN where the two models' weights, KV
    caches and activations together exceed the profile's memory."""
    g = np.asarray(gamma, dtype=np.int64)
    if np.any(g < 0):
        raise UserError(f"gamma: must be >= 0, got {gamma!r}")
    longest = int(g.max(initial=0))
    passes = np.arange(longest)
    # why: the draft is autoregressive, each pass reads one more cached token than the last
    # (docs/performance-model.md, "Draft-model steps")
    per_pass = (
        np.atleast_1d(
            step_time_s(
                draft, None, hw, batch=batch, tokens=1, context=context + passes, attention=attention, on_oom="ignore"
            )
        )
        if longest
        else np.zeros(0)
    )
    drafting = np.concatenate([[0.0], np.cumsum(per_pass)])[g]
    verify = step_time_s(
        target, None, hw, batch=batch, tokens=g + 1, context=context, attention=attention, on_oom="ignore"
    )
    need = memory_required_bytes(
        target, None, batch=batch, tokens=g + 1, context=context, attention=attention
    ) + memory_required_bytes(draft, None, batch=batch, tokens=1, context=context + g, attention=attention)
    total = np.where(need <= hw.capacity_bytes, drafting + verify, np.nan)
    return float(total) if total.ndim == 0 else total


def gamma_grid(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    alpha_per_depth,
    *,
    batches,
    contexts,
    max_gamma: int | None = None,
    attention: str = "fused",
) -> pd.DataFrame:
    """Every (batch, context, gamma) for gamma = 0 .. max_gamma (default: the depths alpha
    covers), columns `GAMMA_COLUMNS`: tau(gamma) from `alpha_per_depth`, the step's draft and
    verification seconds, plain decoding's step and speedup = tau x plain / step."""
    tau = chain_tau(alpha_per_depth)
    top = len(tau) - 1 if max_gamma is None else int(max_gamma)
    if not 0 <= top < len(tau):
        raise UserError(f"--max-gamma: {max_gamma} needs alpha for {max_gamma} depths, the sidecar has {len(tau) - 1}")
    gammas = np.arange(top + 1)
    frames = []
    for b in batches:  # loop over grid cells; each cell is vectorised over gamma
        for s in contexts:
            step = draft_model_step_time_s(
                target, draft, hw, batch=int(b), gamma=gammas, context=int(s), attention=attention
            )
            verify = step_time_s(
                target, None, hw, batch=int(b), tokens=gammas + 1, context=int(s), attention=attention, on_oom="ignore"
            )
            plain = float(verify[0])
            frames.append(
                pd.DataFrame(
                    {
                        "batch": int(b),
                        "context": int(s),
                        "gamma": gammas,
                        "tau": tau[: top + 1],
                        "draft_s": step - verify,
                        "verify_s": verify,
                        "step_time_s": step,
                        "plain_step_s": plain,
                        "speedup": tau[: top + 1] * plain / step,
                        "fits_memory": np.isfinite(step),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)[GAMMA_COLUMNS]


def best_gamma(grid: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, context) the row of the fastest gamma; gamma 0 (no speculation) where no
    gamma beats plain decoding, and rows that do not fit memory are never chosen."""
    ok = grid[grid["fits_memory"]]
    idx = ok.groupby(["batch", "context"])["speedup"].idxmax()
    return ok.loc[idx].sort_values(["batch", "context"], ignore_index=True)
