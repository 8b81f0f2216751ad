"""The `run` pipeline's pieces for a draft model (docs/architecture.md, "Draft models in the main
job"; docs/decoder.md, "Draft models"): its proposal is a chain of gamma drafts, one per depth,
and its predicted step is gamma draft passes plus the target's verification
(docs/performance-model.md, "Draft-model steps")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from roofline.hardware import HardwareProfile
from roofline.shapes import ModelShape
from roofline.speculative import draft_model_step_time_s
from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.fileio import write_text
from treeopt.tau import TauCurve, tau_curves
from treeopt.tree import Tree, make_tree

PREDICTION_COLUMNS = ["batch", "context", "gamma", "tau", "step_time_s", "plain_step_s", "speedup"]


def chain_tree(gamma: int) -> Tree:
    """The chain of `gamma` drafts: each depth's top-1 guess after the previous one."""
    return make_tree([[0] * d for d in range(1, gamma + 1)])


def chain_tau_curves(accuracy_path, max_nodes: int) -> tuple[AccuracyTable, TauCurve]:
    """The accuracy table at `accuracy_path` and the tau curves of the chain of
    min(max_nodes, depths calibrated) drafts, whose prefix of n nodes is the chain of gamma = n
    (greedy verification: the rank vectors' top-1 runs, docs/statistics.md "Draft-model
    acceptance")."""
    table = load_accuracy(accuracy_path)
    chain = chain_tree(min(int(max_nodes), table.num_heads))
    vectors = load_rank_vectors(accuracy_path, table=table) if str(accuracy_path).endswith(".json") else None
    return table, tau_curves(table, chain, vectors)


def gamma_prediction(
    target: ModelShape, draft: ModelShape, hw: HardwareProfile, tau: TauCurve, batches, contexts
) -> pd.DataFrame:
    """Predicted step and speedup tau(gamma) x T(plain) / T(gamma) of every chain prefix per
    (batch, context), columns `PREDICTION_COLUMNS`; NaN where the two models do not fit."""
    gammas = np.arange(tau.proposal.size + 1)
    frames = []
    for b in batches:  # loop over grid cells; each cell is vectorised over gamma
        for s in contexts:
            step = draft_model_step_time_s(target, draft, hw, batch=int(b), gamma=gammas, context=int(s))
            frames.append(
                pd.DataFrame(
                    {
                        "batch": int(b),
                        "context": int(s),
                        "gamma": gammas,
                        "tau": tau.best,
                        "step_time_s": step,
                        "plain_step_s": step[0],
                        "speedup": tau.best * step[0] / step,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)[PREDICTION_COLUMNS]


def write_gamma_prediction(
    target: ModelShape, draft: ModelShape, hw: HardwareProfile, tau: TauCurve, batches, contexts, out_dir, *, title: str
) -> pd.DataFrame:
    """`gamma_prediction` as `out_dir/gamma.csv` and `out_dir/index.md` (best gamma per cell,
    gamma 0 where no chain beats plain decoding)."""
    grid = gamma_prediction(target, draft, hw, tau, batches, contexts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "gamma.csv", grid.to_csv(index=False, float_format="%.6g"))
    best = grid.loc[grid.fillna({"speedup": -np.inf}).groupby(["batch", "context"])["speedup"].idxmax()]
    L = [
        f"# {title}",
        "",
        f"Draft model `{draft.name}` ({draft.layers} layer(s), hidden {draft.hidden}) before the target "
        f"`{target.name}`; one step is gamma draft passes plus the verification of gamma + 1 tokens, "
        f"τ {tau.describe()} (every gamma in `gamma.csv`).",
        "",
        "| batch | context | best gamma | predicted speedup | step ms |",
        "|---|---|---|---|---|",
    ]
    for row in best.itertuples(index=False):
        L.append(
            f"| {row.batch} | {row.context} | {row.gamma or 'no speculation'} | {row.speedup:.2f}x | "
            f"{row.step_time_s * 1e3:.3f} |"
        )
    write_text(out / "index.md", "\n".join(L) + "\n")
    return grid
