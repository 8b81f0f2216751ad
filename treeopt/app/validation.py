"""Validation: the decoder's measured tokens per step on held-out prompts against the
predicted tau (docs/statistics.md#walked-tau), and the roofline's step-latency ratios against
the measured sweep (docs/formats.md#validation-csvs); at a temperature T > 0, a draft model's
trees and chains under rejection sampling against the tau of its alpha sidecar
(docs/statistics.md#positional-acceptance-of-a-tree)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from calibration.data import load_prompts
from calibration.drafters.draft_model import ALPHA_TEMPERATURE
from calibration.validate import latency_errors, measure_acceptance
from roofline.plots import log2_axis
from treeopt.app.draft_model import VALIDATION_SIGMAS, chain_tree, rejection_tau_curves, validate_rejection
from treeopt.app.models import is_demo
from treeopt.app.sweep import DEMO_VALIDATION
from treeopt.chain import ChainAcceptance, alpha_path, load_chain_acceptance
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import atomic_path
from treeopt.selection import prediction_regret, read_sweep
from treeopt.selection_types import Selection
from treeopt.tau import TauCurve
from treeopt.tree import Tree

#: the file `treeopt validate --temperature T` writes (docs/formats.md#validation-csvs)
REJECTION_VALIDATION_CSV = "validation_rejection.csv"
#: a held-out record's prompt keeps this many tokens, and a text file is cut into prompts of
#: this many (docs/formats.md#prompt-data): the demo's held-out prompts (at most 183 tokens)
#: stay whole
VALIDATION_PROMPT_TOKENS = 512


def held_out_data(data: str | None, model: str, option: str = "--data") -> str:
    """The held-out prompts of a validation: `data`, or the demo's own for the demo model only;
    for any other model a UserError naming `option`, before anything loads."""
    if data is not None:
        return data
    if not is_demo(model):
        # as calibrate's --data (calibration.runner): a model is judged on prompts of its own use
        raise UserError(
            f"{option}: required for --model {model} (the demo's held-out prompts are Python code; "
            "give held-out prompts from your model's own use, disjoint from its calibration prompts)"
        )
    return DEMO_VALIDATION


@dataclass(frozen=True)
class ValidationResult:
    acceptance: pd.DataFrame  # per tree size: measured tokens/step vs tau
    latency: pd.DataFrame | None  # per (batch, context, size): measured vs predicted overhead
    regret: pd.DataFrame | None  # per (batch, context): prediction's pick vs the selected tree


@dataclass(frozen=True)
class ValidationDecoding:
    """How the held-out prompts are decoded: `max_new_tokens` generated per prompt,
    `batch_size` prompts per batch, the first `max_prompts` prompts (None: all), `topk`
    candidates per draft head."""

    max_new_tokens: int = 32
    batch_size: int = 8
    max_prompts: int | None = None
    topk: int = 10


def validate(
    lm,
    tau: TauCurve,
    sizes,
    data,
    *,
    decoding: ValidationDecoding = ValidationDecoding(),
    sweep_file=None,
    sweep_df=None,
    out_dir=None,
    progress: bool = True,
    selection: Selection | None = None,
) -> ValidationResult:
    """Measured tokens per step of the decoder on held-out prompts against every tau, and
    (given a sweep with predictions) the roofline's step-latency ratios and picks against the
    trees `selection` ships (without one: the measured argmax)."""
    # the held-out prompts as calibration reads its own (calibration.data), chat template included
    prompts = load_prompts(
        data, lm.tokenizer, prompt_tokens=VALIDATION_PROMPT_TOKENS, max_prompts=decoding.max_prompts
    ).token_ids
    sizes = [n for n in sizes if n <= tau.proposal.size]
    acceptance = measure_acceptance(
        lm,
        tau,
        sizes,
        prompts,
        max_new_tokens=decoding.max_new_tokens,
        batch_size=decoding.batch_size,
        topk=decoding.topk,
        progress=progress,
    )
    if sweep_df is None and sweep_file is not None:
        sweep_df, _ = read_sweep(sweep_file)
    latency = regret = None
    if (
        sweep_df is not None
        and "predicted_overhead" in sweep_df.columns
        and sweep_df["predicted_overhead"].notna().any()
    ):
        latency = latency_errors(sweep_df)
        chosen = selection.chosen_nodes() if selection is not None else None
        regret = prediction_regret(sweep_df, chosen=chosen)
    result = ValidationResult(acceptance, latency, regret)
    if out_dir is not None:
        write_validation(result, out_dir)
    return result


def write_validation(result: ValidationResult, out_dir) -> list[str]:
    """CSV files and the validation plots; returns the PNG names written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, df in (
        ("validation_acceptance.csv", result.acceptance),
        ("validation_latency.csv", result.latency),
        ("validation_selection.csv", result.regret),
    ):
        if df is not None:
            with atomic_path(out_dir / name) as tmp:
                df.to_csv(tmp, index=False)
    return plot_validation(result, out_dir)


def plot_validation(result: ValidationResult, out_dir: Path) -> list[str]:
    written = []
    acc = result.acceptance
    fig = Figure(figsize=(6.4, 4.4), dpi=120)
    ax = fig.subplots()
    ax.plot(acc["nodes"], acc["measured_tokens_per_step"], "o-", color="black", label="measured (decoder)")
    ax.plot(acc["nodes"], acc["tau_independent"], "s--", label="predicted, independent heads")
    if acc["tau_joint"].notna().any():
        ax.plot(acc["nodes"], acc["tau_joint"], "^--", label="predicted, joint statistics (per position)")
    if "tau_walk" in acc.columns and acc["tau_walk"].notna().any():
        ax.plot(acc["nodes"], acc["tau_walk"], "D--", label="predicted, joint statistics walked step by step")
    log2_axis(ax, acc["nodes"])
    ax.set_xlabel("tree size (nodes)")
    ax.set_ylabel("tokens per step")
    ax.set_title("Acceptance on held-out prompts: measured vs predicted")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out_dir / "validation_acceptance.png") as tmp:
        fig.savefig(tmp, format="png")
    written.append("validation_acceptance.png")

    if result.latency is not None:
        lat = result.latency
        contexts = sorted(lat["context"].unique())
        fig = Figure(figsize=(5.2 * len(contexts), 4.4), dpi=120)
        axes = fig.subplots(1, len(contexts), squeeze=False, sharey=True)
        for ax, s in zip(axes[0], contexts, strict=True):
            sub = lat[lat["context"] == s]
            for i, (b, g) in enumerate(sub.groupby("batch")):
                color = f"C{i}"
                ax.plot(g["nodes"], g["overhead"], "o-", color=color, label=f"batch {b} measured")
                ax.plot(g["nodes"], g["predicted_overhead"], "x--", color=color, label=f"batch {b} predicted")
            log2_axis(ax, sub["nodes"])
            ax.set_xlabel("tree size (nodes)")
            ax.set_title(f"context {s} tokens")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("step latency / plain decoding step")
        axes[0][-1].legend(fontsize=7, ncol=2)
        fig.suptitle("Step-latency overhead: measured vs roofline prediction")
        fig.tight_layout()
        with atomic_path(out_dir / "validation_latency.png") as tmp:
            fig.savefig(tmp, format="png")
        written.append("validation_latency.png")
    return written


def format_validation(result: ValidationResult) -> str:
    acc = result.acceptance
    lines = [
        "acceptance (tokens per step) on held-out prompts:",
        "  nodes  measured  tau_indep (err)    tau_joint (err)    tau_walk (err)    steps",
    ]
    for r in acc.itertuples(index=False):
        joint = f"{r.tau_joint:8.3f} ({r.error_joint:+6.1%})" if np.isfinite(r.tau_joint) else "      --          "
        walk = f"{r.tau_walk:8.3f} ({r.error_walk:+6.1%})" if np.isfinite(r.tau_walk) else "      --          "
        lines.append(
            f"  {r.nodes:5d}  {r.measured_tokens_per_step:8.3f}  {r.tau_independent:8.3f} "
            f"({r.error_independent:+6.1%})  {joint}  {walk}  {r.steps:6d}"
        )
    agree = acc["agreement"].to_numpy(dtype=float) if "agreement" in acc.columns else np.array([])
    if np.isfinite(agree).any():
        lines.append(
            f"agreement with plain greedy decoding: {np.nanmin(agree):.2%} of generated tokens identical "
            "at worst"
            + ("" if np.nanmin(agree) == 1.0 else " (reduced precision: near-tied logits may flip, docs/decoder.md)")
        )
    if result.latency is not None:
        err = result.latency["overhead_error"].abs()
        lines.append(
            f"step-latency overhead, predicted vs measured over {len(err)} configurations: "
            f"median |error| {err.median():.1%}, max {err.max():.1%}"
        )
    if result.regret is not None:
        worst = result.regret["fraction_of_selected"].min()
        lines.append(
            f"tree picked by prediction alone reaches >= {worst:.1%} of the selected tree's measured "
            f"speedup in every (batch, context) cell"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# T > 0: a draft model under rejection sampling (docs/statistics.md#positional-acceptance-of-a-tree)


def check_sampled_drafter(kind: str | None, temperature: float) -> None:
    """Refuse a drafter other than a draft model at T > 0 (`kind` None: not known yet)."""
    if temperature > 0 and kind is not None and kind != "draft-model":
        # why: heads verify by typical acceptance at T > 0, which is not distribution-preserving,
        # so no tau at T is predicted for them (docs/decoder.md#typical-acceptance)
        raise UserError(
            f"--temperature {temperature:g}: the {kind} drafter is validated greedily (--temperature 0): at T > 0 it "
            "verifies by typical acceptance, which is not distribution-preserving; only a draft model "
            "(--drafter draft-model) is verified by rejection sampling"
        )


def sampled_acceptance(accuracy, temperature: float, max_nodes: int) -> tuple[ChainAcceptance, TauCurve]:
    """The alpha sidecar beside the accuracy table `accuracy` (`treeopt.chain.alpha_path`) and the
    proposal of up to `max_nodes` nodes built from it, refused in one line when it is missing,
    has no per-child table (v1) or was calibrated at a temperature other than `temperature`."""
    path = alpha_path(accuracy)
    if not path.is_file():
        raise UserError(
            f"--temperature {temperature:g}: no alpha sidecar {path} beside --accuracy {accuracy}; "
            f"calibrate with a draft model (treeopt calibrate --drafter draft-model -o {accuracy}) to write it"
        )
    side = load_chain_acceptance(path)
    if side.accept_per_child is None:
        raise UserError(
            f"{path}: a treeopt.chain_acceptance/v1 sidecar has no per-child acceptance (chains only); "
            "calibrate again (treeopt calibrate --drafter draft-model) to validate at --temperature"
        )
    # why: the acceptance min(p, q) is a property of p and q at one temperature
    # (docs/statistics.md#draft-model-acceptance): a table of another T predicts nothing about this one
    if not math.isclose(side.temperature, temperature, rel_tol=1e-9, abs_tol=1e-12):
        raise UserError(
            f"--temperature {temperature:g}: {path} was calibrated at temperature {side.temperature:g}; "
            f"pass --temperature {side.temperature:g}, or recalibrate (treeopt calibrate --drafter draft-model "
            f"measures alpha at temperature {ALPHA_TEMPERATURE:g})"
        )
    return rejection_tau_curves(path, max_nodes)


def sampled_trees(proposal: Tree, depths: int, sizes) -> list[Tree]:
    """The prefixes of `proposal` of each size in `sizes` it has, then the chains of gamma =
    each size up to `depths`, each tree once (a prefix that is a chain is not repeated)."""
    trees = [proposal.prefix(int(n)) for n in sorted(sizes) if n <= proposal.size]
    trees += [chain_tree(int(n)) for n in sorted(sizes) if n <= depths]
    seen, unique = set(), []
    for tree in trees:  # over the few trees validated, not over nodes
        key = tuple(sorted(tuple(c) for c in tree.to_choices()))
        if key not in seen:
            seen.add(key)
            unique.append(tree)
    return unique


def validate_sampled(
    lm,
    acceptance: ChainAcceptance,
    trees,
    data,
    *,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    max_prompts=None,
    out_dir=None,
) -> pd.DataFrame:
    """`treeopt.app.draft_model.validate_rejection` of `trees` at the sidecar's temperature;
    with `out_dir`, also written there as `REJECTION_VALIDATION_CSV` (only that file replaced)."""
    df = validate_rejection(
        lm, acceptance, trees, data, max_new_tokens=max_new_tokens, batch_size=batch_size, max_prompts=max_prompts
    )
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_path(out / REJECTION_VALIDATION_CSV) as tmp:
            df.to_csv(tmp, index=False)
    return df


def _form(choices: str) -> str:
    """'chain' for a tree of top-1 guesses only (every rank 0), else 'tree'."""
    return "chain" if set(choices) <= set("[], 0") else "tree"


def format_sampled_validation(df: pd.DataFrame, temperature: float) -> str:
    """Measured tokens per step +- se against predicted tau +- se per tree, with the verdict."""
    rows = [
        (
            r.nodes,
            _form(r.tree),
            f"{r.measured_tokens_per_step:.3f} ± {r.measured_se:.3f}",
            f"{r.predicted_tau:.3f} ± {r.predicted_se:.3f}",
            f"{r.error:+.1%}",
            f"{r.sigmas:.1f}",
            "yes" if r.within else "NO",
            r.steps,
        )
        for r in df.itertuples(index=False)
    ]
    table = text_table(
        ["nodes", "<form", "measured", "predicted", "error", "sigmas", f"within {VALIDATION_SIGMAS:g}σ", "steps"],
        rows,
        title=f"tokens per step under rejection sampling at T = {temperature:g} (measured vs predicted tau):",
    )
    bad = int((~df["within"].astype(bool)).sum())
    verdict = (
        f"all {len(df)} predictions within {VALIDATION_SIGMAS:g} combined standard errors"
        if not bad
        else f"{bad} of {len(df)} predictions more than {VALIDATION_SIGMAS:g} combined standard errors off"
    )
    return f"{table}\n{verdict}"
