"""The `run` pipeline's pieces for a draft model (docs/architecture.md#draft-models-in-the-main-job;
docs/decoder.md#draft-models): its proposal is a chain of gamma drafts, one per depth
(greedy verification), or a tree built from the per-child acceptance (recursive rejection
sampling); its predicted step is one draft pass per depth plus the target's verification
(docs/performance-model.md#draft-model-steps, docs/performance-model.md#draft-model-trees); and the validation of
the predicted tau of trees under rejection sampling against the decoder's measured tokens per
step (docs/statistics.md#positional-acceptance-of-a-tree)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from calibration.batching import pad_left
from calibration.speculative import SpeculativeDecoder
from roofline.hardware import HardwareProfile
from roofline.shapes import ModelShape
from roofline.speculative import draft_model_tree_step_time_s, level_widths_by_prefix
from treeopt.accuracy import AccuracyTable
from treeopt.app.sweep import load_prompt_texts
from treeopt.chain import (
    ChainAcceptance,
    load_chain_acceptance,
    rejection_proposal,
    rejection_tau,
    rejection_tau_curve,
    rejection_tau_stderr,
)
from treeopt.errors import UserError
from treeopt.fileio import write_text
from treeopt.tau import TauCurve, load_tau_curves
from treeopt.tree import Tree, make_tree

#: how many standard errors apart the measured and predicted tau may be (a correct prediction
#: fails this about once in 16,000 trees)
VALIDATION_SIGMAS = 4.0
REJECTION_VALIDATION_COLUMNS = [
    "tree",
    "nodes",
    "measured_tokens_per_step",
    "measured_se",
    "predicted_tau",
    "predicted_se",
    "error",
    "sigmas",
    "within",
    "steps",
]

PREDICTION_COLUMNS = ["batch", "context", "gamma", "tau", "step_time_s", "plain_step_s", "speedup"]


def chain_tree(gamma: int) -> Tree:
    """The chain of `gamma` drafts: each depth's top-1 guess after the previous one."""
    return make_tree([[0] * d for d in range(1, gamma + 1)])


def chain_tau_curves(accuracy_path, max_nodes: int) -> tuple[AccuracyTable, TauCurve]:
    """The accuracy table at `accuracy_path` and the tau curves of the chain of
    min(max_nodes, depths calibrated) drafts, whose prefix of n nodes is the chain of gamma = n
    (greedy verification: the rank vectors' top-1 runs, docs/statistics.md#draft-model-acceptance)."""
    return load_tau_curves(accuracy_path, max_nodes, method="chain")


def rejection_tau_curves(alpha_file, max_nodes: int) -> tuple[ChainAcceptance, TauCurve]:
    """The alpha sidecar at `alpha_file` (v2: with the per-child acceptance), the proposal of up
    to `max_nodes` nodes built from it (`treeopt.chain.rejection_proposal`) and the tau of its
    prefixes under recursive rejection sampling (docs/statistics.md#positional-acceptance-of-a-tree)."""
    side = load_chain_acceptance(alpha_file)
    proposal = rejection_proposal(side.per_child, max_nodes)
    return side, TauCurve(proposal, rejection_tau_curve(proposal, side.per_child))


def gamma_prediction(
    target: ModelShape, draft: ModelShape, hw: HardwareProfile, tau: TauCurve, batches, contexts
) -> pd.DataFrame:
    """Predicted step and speedup tau(n) x T(plain) / T(n) of every prefix of the proposal (a
    chain: gamma = n; a tree: its n nodes, in column `gamma`) per (batch, context), columns
    `PREDICTION_COLUMNS`; NaN where the two models do not fit."""
    gammas = np.arange(tau.proposal.size + 1)
    widths = level_widths_by_prefix(tau.proposal)
    frames = []
    for b in batches:  # loop over grid cells; each cell is vectorised over the prefixes
        for s in contexts:
            step = draft_model_tree_step_time_s(target, draft, hw, batch=int(b), level_widths=widths, context=int(s))
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


def _best_rows(grid: pd.DataFrame) -> pd.DataFrame:
    return grid.loc[grid.fillna({"speedup": -np.inf}).groupby(["batch", "context"])["speedup"].idxmax()]


def write_gamma_prediction(
    target: ModelShape,
    draft: ModelShape,
    hw: HardwareProfile,
    tau: TauCurve,
    batches,
    contexts,
    out_dir,
    *,
    title: str,
    tree: TauCurve | None = None,
) -> pd.DataFrame:
    """`gamma_prediction` of the chains `tau` as `out_dir/gamma.csv` and `out_dir/index.md` (best
    gamma per cell, gamma 0 where no chain beats plain decoding); with `tree`, the prefixes of
    that proposal tree too, as `out_dir/tree.csv` (column `nodes`) and the best tree per cell
    beside the best chain."""
    grid = gamma_prediction(target, draft, hw, tau, batches, contexts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "gamma.csv", grid.to_csv(index=False, float_format="%.6g"))
    best = _best_rows(grid)
    trees = None
    if tree is not None:
        tree_grid = gamma_prediction(target, draft, hw, tree, batches, contexts).rename(columns={"gamma": "nodes"})
        write_text(out / "tree.csv", tree_grid.to_csv(index=False, float_format="%.6g"))
        trees = _best_rows(tree_grid).set_index(["batch", "context"])
    L = [
        f"# {title}",
        "",
        f"Draft model `{draft.name}` ({draft.layers} layer(s), hidden {draft.hidden}) before the target "
        f"`{target.name}`; one step of a chain is gamma draft passes plus the verification of gamma + 1 tokens, "
        f"τ {tau.describe()} (every gamma in `gamma.csv`).",
    ]
    if trees is not None:
        L += [
            "",
            f"Trees: the prefixes of the {tree.proposal.size}-node proposal, drafted one pass per depth over the "
            f"nodes of the depth above, τ {tree.describe()} (every size in `tree.csv`; "
            "docs/performance-model.md#draft-model-trees).",
        ]
    L += [
        "",
        "| batch | context | best gamma | predicted speedup | step ms |"
        + (" best tree | predicted speedup |" if trees is not None else ""),
        "|---|---|---|---|---|" + ("---|---|" if trees is not None else ""),
    ]
    for row in best.itertuples(index=False):
        line = (
            f"| {row.batch} | {row.context} | {row.gamma or 'no speculation'} | {row.speedup:.2f}x | "
            f"{row.step_time_s * 1e3:.3f} |"
        )
        if trees is not None:
            t = trees.loc[(row.batch, row.context)]
            line += f" {int(t.nodes) or 'no speculation'} | {t.speedup:.2f}x |"
        L.append(line)
    write_text(out / "index.md", "\n".join(L) + "\n")
    return grid


def tokens_per_step_with_stderr(accepted: np.ndarray) -> tuple[float, float, int]:
    """(mean tokens per step, its standard error, steps) from `DecodeResult.accepted`
    (steps, b), 0 where a sequence had finished. Steps of one sequence share its prefix, so the
    standard error treats sequences as the independent units: the ratio estimator's
    sum_i a_i / sum_i n_i with variance m / (m - 1) x sum_i (a_i - R n_i)^2 / (sum_i n_i)^2 over
    the m sequences' accepted totals a_i and step counts n_i (docs/statistics.md#positional-acceptance-of-a-tree)."""
    a = np.asarray(accepted, dtype=np.float64)
    active = a > 0
    steps = int(active.sum())
    if not steps:
        return float("nan"), float("nan"), 0
    per_seq, n_seq = a.sum(0), active.sum(0).astype(np.float64)
    used = n_seq > 0
    per_seq, n_seq = per_seq[used], n_seq[used]
    mean = float(per_seq.sum() / n_seq.sum())
    m = len(per_seq)
    if m < 2:
        values = a[active]
        return mean, float(values.std(ddof=1) / np.sqrt(steps)) if steps > 1 else float("nan"), steps
    var = m / (m - 1) * ((per_seq - mean * n_seq) ** 2).sum() / n_seq.sum() ** 2
    return mean, float(np.sqrt(var)), steps


def validate_rejection_tau(
    target_model,
    drafter,
    acceptance: ChainAcceptance,
    trees,
    prompt_ids,
    *,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    pad_id: int = 0,
    seed: int = 0,
) -> pd.DataFrame:
    """The decoder's measured tokens per step with rejection sampling at the sidecar's
    temperature against the predicted tau of each tree (`treeopt.chain.rejection_tau`), one row
    per tree, columns `REJECTION_VALIDATION_COLUMNS`: `within` when they are less than
    `VALIDATION_SIGMAS` combined standard errors apart
    (docs/statistics.md#positional-acceptance-of-a-tree). `prompt_ids`: token lists, decoded in
    left-padded batches of `batch_size` for `max_new_tokens` tokens each, without an eos stop."""
    if acceptance.temperature <= 0:
        raise UserError("validation: the alpha sidecar was measured at temperature 0 (greedy: use `treeopt validate`)")
    if not prompt_ids:
        raise UserError("validation: no prompts to decode")
    if max_new_tokens < 2:
        raise UserError(f"--max-new-tokens: must be >= 2 to measure a decoding step, got {max_new_tokens}")
    table, stderr = acceptance.per_child, np.array(acceptance.accept_per_child_stderr, dtype=np.float64)
    device = next(target_model.parameters()).device
    rows = []
    for tree in trees:  # loop over the trees validated; each decodes whole batches
        tree = tree if isinstance(tree, Tree) else make_tree(tree, allow_empty=True)
        predicted = rejection_tau(tree, table)
        predicted_se = rejection_tau_stderr(tree, table, stderr)
        decoder = SpeculativeDecoder(target_model, drafter, tree, timing=False)
        accepted = []
        for i, start in enumerate(range(0, len(prompt_ids), batch_size)):
            ids, mask, _ = pad_left(prompt_ids[start : start + batch_size], pad_id, device)
            res = decoder.generate(
                ids, mask, max_new_tokens=max_new_tokens, temperature=acceptance.temperature, seed=seed + i
            )
            accepted.append(res.accepted)
        width = max(a.shape[0] for a in accepted)
        accepted = np.concatenate([np.pad(a, ((0, width - a.shape[0]), (0, 0))) for a in accepted], axis=1)
        measured, measured_se, steps = tokens_per_step_with_stderr(accepted)
        combined = float(np.hypot(measured_se, predicted_se))
        sigmas = abs(measured - predicted) / combined if combined > 0 else float("inf")
        rows.append(
            {
                "tree": str(tree.to_choices()),
                "nodes": tree.size,
                "measured_tokens_per_step": measured,
                "measured_se": measured_se,
                "predicted_tau": predicted,
                "predicted_se": predicted_se,
                "error": predicted / measured - 1.0,
                "sigmas": sigmas,
                "within": bool(sigmas <= VALIDATION_SIGMAS),
                "steps": steps,
            }
        )
    return pd.DataFrame(rows, columns=REJECTION_VALIDATION_COLUMNS)


def validate_rejection(
    lm, acceptance: ChainAcceptance, trees, data, *, max_new_tokens: int = 32, batch_size: int = 8, max_prompts=None
) -> pd.DataFrame:
    """`validate_rejection_tau` of a loaded model (`lm`: model, heads = a draft model,
    tokenizer) on the prompts of `data` (a JSON-lines file, `demo` or the demo's validation
    set, as `treeopt validate`)."""
    if getattr(lm.heads, "kind", "") != "draft-model":
        raise UserError("validation under rejection sampling: needs a draft model (--drafter draft-model)")
    prompts = load_prompt_texts(data)[: max_prompts or None]
    ids = [lm.tokenizer(p)["input_ids"] for p in prompts]
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    return validate_rejection_tau(
        lm.model, lm.heads, acceptance, trees, ids, max_new_tokens=max_new_tokens, batch_size=batch_size, pad_id=pad
    )
