"""Chains of draft-model tokens verified by rejection sampling: the expected tokens per step of
a chain of any gamma from the per-depth acceptance alpha, and the alpha sidecar calibration
writes beside the accuracy table (docs/statistics.md, "Draft-model acceptance"; format:
docs/formats.md, "Alpha sidecar").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from treeopt.errors import UserError
from treeopt.fileio import read_json_input, write_json

CHAIN_ACCEPTANCE_FORMAT = "treeopt.chain_acceptance/v1"
ALPHA_SUFFIX = ".alpha.json"


def chain_tau(alpha_per_depth) -> np.ndarray:
    """tau(gamma) for gamma = 0 .. K: 1 + sum_{k<=gamma} prod_{j<k} alpha_j, alpha_j the
    acceptance at depth j given that depths < j were accepted (docs/statistics.md, "Draft-model
    acceptance"). Constant alpha gives Leviathan et al. 2023's (1 - a^(g+1)) / (1 - a)."""
    alpha = np.asarray(alpha_per_depth, dtype=np.float64)
    if alpha.ndim != 1 or np.any(~np.isfinite(alpha)) or np.any((alpha < 0) | (alpha > 1)):
        raise UserError(f"alpha: expected per-depth acceptances in [0, 1], got {alpha_per_depth!r}")
    # why: the chain reaches depth k only when every earlier draft was kept, and a step emits
    # the kept drafts plus one target token (docs/statistics.md, "Draft-model acceptance")
    return 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(alpha))])


@dataclass(frozen=True)
class ChainAcceptance:
    """A draft model's acceptance at one sampling temperature, per depth.

    temperature:       the T of p and q (0: greedy, alpha = argmax agreement).
    alpha_per_depth:   alpha_d = E[sum_x min(p, q)] at depth d over positions whose depths < d
                       were accepted, i.e. tau(d + 1) - tau(d) = prod_{j<=d} alpha_j.
    tau_walked:        tau(gamma), gamma = 0 .. K, walked over the calibration rows.
    rows:              calibration positions with every depth labelled.
    """

    temperature: float
    alpha_per_depth: tuple[float, ...]
    tau_walked: tuple[float, ...]
    rows: int

    @classmethod
    def from_rows(cls, alpha_rows: np.ndarray, temperature: float) -> ChainAcceptance:
        """From (N, K) per-position alphas (NaN: no label): the rows with all K depths."""
        a = np.asarray(alpha_rows, dtype=np.float64)
        a = a[np.all(np.isfinite(a), axis=1)]
        if not len(a):
            raise UserError("alpha: no calibration position has every depth labelled (longer prompts needed)")
        reach = np.cumprod(a, axis=1).mean(0)  # P(chain reaches depth d + 1), walked over rows
        tau = 1.0 + np.concatenate([[0.0], np.cumsum(reach)])
        # the conditional alphas whose chain_tau is exactly the walked tau
        alpha = reach / np.concatenate([[1.0], reach[:-1]]).clip(min=1e-300)
        return cls(float(temperature), tuple(float(x) for x in alpha.clip(0, 1)), tuple(float(x) for x in tau), len(a))

    def tau(self) -> np.ndarray:
        return chain_tau(self.alpha_per_depth)

    def save(self, path) -> None:
        write_json(
            path,
            {
                "format": CHAIN_ACCEPTANCE_FORMAT,
                "temperature": self.temperature,
                "alpha_per_depth": list(self.alpha_per_depth),
                "tau_walked": list(self.tau_walked),
                "rows": self.rows,
            },
        )


def alpha_path(accuracy_path) -> Path:
    """``acc.json`` -> ``acc.alpha.json`` (beside it)."""
    p = Path(accuracy_path)
    return p.with_suffix(ALPHA_SUFFIX) if p.suffix else p.with_name(p.name + ALPHA_SUFFIX)


def load_chain_acceptance(path) -> ChainAcceptance:
    data = read_json_input(path, "an alpha sidecar")
    if not isinstance(data, dict) or data.get("format") != CHAIN_ACCEPTANCE_FORMAT:
        raise UserError(f"{path}: not a {CHAIN_ACCEPTANCE_FORMAT} file")
    try:
        alpha = tuple(float(x) for x in data["alpha_per_depth"])
        tau = tuple(float(x) for x in data["tau_walked"])
        temperature, rows = float(data["temperature"]), int(data["rows"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: missing or invalid field ({err})") from None
    if not alpha or not all(math.isfinite(x) and 0 <= x <= 1 for x in alpha):
        raise UserError(f"{path}: alpha_per_depth must be a non-empty list of numbers in [0, 1]")
    return ChainAcceptance(temperature, alpha, tau, rows)
