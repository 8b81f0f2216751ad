"""The measured sweep joined to the roofline: the reference decoder's step time beside the
prediction for the same step, and the end-to-end throughput beside both."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from calibration.data import read_prompt_texts
from calibration.demo_files import DEMO_PROMPTS, DEMO_VALIDATION_PROMPTS
from calibration.random_model import RANDOM_PROMPT_TOKENS, random_token_ids
from calibration.sweep import E2E_COLUMNS, SweepSettings, check_form, measure_end_to_end, run_sweep
from roofline.grid import draft_rows_by_prefix
from roofline.hardware import HardwareProfile, load_hardware
from roofline.latency import step_time_s
from roofline.ops import drafter_work
from roofline.profile_fit import BatchTransfer, batch_transfer, error_summary, terms_line
from roofline.speculative import draft_model_tree_step_time_s, level_widths_by_prefix
from treeopt.acceptance import load_rank_vectors
from treeopt.app.models import draft_cost_of_drafter, draft_shape_of, heads_shape_of_drafter, shape_of
from treeopt.candidates import candidate_tokens
from treeopt.dtypes import torch_dtype_name
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_text
from treeopt.selection import SWEEP_COLUMNS
from treeopt.stats import tau_stderr
from treeopt.tau import TauCurve
from treeopt.tree import Tree

DEMO_VALIDATION = "demo-validation"


def load_prompt_texts(data: str) -> list[str]:
    """The prompt texts of a JSON or JSON-lines file of records, or of the demo's calibration /
    validation sets (for the commands that take texts, not token ids)."""
    path = {DEMO_VALIDATION: DEMO_VALIDATION_PROMPTS, "demo": DEMO_PROMPTS}.get(data, data)
    if Path(path).is_dir():
        raise UserError(f"{data}: is a directory, not a JSON-lines file of prompts")
    try:
        prompts = read_prompt_texts(path)
    except RecursionError:
        raise UserError(f"{data}: JSON nested too deeply to read") from None
    if not prompts:
        raise UserError(f"{data}: no prompts")
    return prompts


def step_predictor(lm, proposal: Tree, hardware: HardwareProfile, *, verification: str = "tree"):
    """predict(batch, tokens, context) -> seconds of one decoding step as the reference decoder
    runs it: the base model over q tokens plus, for q > 1, the heads the tree reaches, run on one
    token per sequence (docs/decoder.md#why-the-heads-run-on-one-token); a sequential drafter's stages run
    depth by depth on the nodes of each depth that have children
    (docs/performance-model.md#drafter-cost). A draft model drafts proposal.prefix(n) depth by
    depth, one pass per depth over the nodes of the depth above, then the target verifies n + 1
    tokens (a chain of gamma:
    gamma passes; docs/performance-model.md#draft-model-trees).

    verification="candidates": tree size n is verified as the L leaves' root paths of
    `proposal.prefix(n)`, L candidate sequences of D + 1 tokens each (D its depth, shorter paths
    padded, as the decoder runs them: docs/decoder.md#candidate-sequence-verification); the
    drafting is the tree form's."""
    check_form(lm.heads, verification)
    shape = shape_of(lm.name, dtype=torch_dtype_name(lm.dtype))
    heads = lm.heads
    if getattr(heads, "kind", "") == "draft-model":
        draft = draft_shape_of(heads, dtype=shape.dtype)
        widths = level_widths_by_prefix(proposal)
        return lambda batch, tokens, context: float(
            draft_model_tree_step_time_s(
                shape, draft, hardware, batch=batch, level_widths=widths[tokens - 1], context=context
            )
        )
    cost = draft_cost_of_drafter(heads)

    def predict(batch: int, tokens: int, context: int) -> float:
        n = tokens - 1
        used = proposal.prefix(n).depth if n else 0
        candidates = None
        if verification == "candidates" and n:
            tokens, candidates = candidate_tokens(proposal.prefix(n).num_leaves, used)
        rows = draft_rows_by_prefix(proposal.prefix(n), cost.stages)[-1]
        draft = drafter_work(cost, rows_per_stage=rows, heads_run=used, tokens_per_sequence=1) if used else None
        return float(
            step_time_s(
                shape,
                draft,
                hardware,
                batch=batch,
                tokens=tokens,
                context=context,
                on_oom="ignore",
                candidates=candidates,
            )
        )

    return predict


def curve_stderr(table, tau: TauCurve, accuracy_path=None):
    """Standard error of `tau.best` (docs/statistics.md#measured-speedup-intervals): batch
    means over calibration sequences when the table's rank-vector sidecar is there, else the
    independent-positions formula from head 1's position count."""
    vectors = None
    if accuracy_path is not None and str(accuracy_path).endswith(".json") and tau.walked is not None:
        vectors = load_rank_vectors(accuracy_path, table=table)
    return tau_stderr(tau.proposal, tau.best, positions=float(table.positions[0]), rank_vectors=vectors)


def sweep(
    lm,
    table,
    tau: TauCurve,
    settings: SweepSettings,
    output,
    *,
    hardware=None,
    resume: bool | str = False,
    progress: bool = True,
    accuracy_path=None,
    hardware_file=None,
) -> pd.DataFrame:
    """`calibration.sweep.run_sweep` with the roofline's prediction of every step when a
    hardware profile (name, file or profile) is given, and tau's standard error from the
    calibration (`curve_stderr`). The prediction is of the verification form the sweep
    measures (`settings.verification`). `hardware_file`: the profile file it was read from,
    recorded relative to the sweep's folder so that `select` finds the profile again."""
    predictor, meta = None, {"accuracy": table.provenance}
    if hardware is not None:
        hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
        predictor = step_predictor(lm, tau.proposal, hw, verification=settings.verification)
        meta["hardware"] = hw.name
        if hardware_file is not None and Path(hardware_file).is_file():
            meta["hardware_file"] = os.path.relpath(Path(hardware_file).resolve(), Path(output).resolve().parent)
    return run_sweep(
        lm,
        tau,
        settings,
        output,
        predictor=predictor,
        meta=meta,
        resume=resume,
        progress=progress,
        tau_se=curve_stderr(table, tau, accuracy_path),
    )


def add_end_to_end(
    lm,
    proposal: Tree,
    df: pd.DataFrame,
    settings: SweepSettings,
    data: str,
    max_new_tokens: int,
    output,
    *,
    max_prompts: int = 32,
    progress: bool = True,
) -> pd.DataFrame:
    """Measure the real decoder end to end on prompts and merge its throughput into the sweep.
    A model without a tokenizer (random weights) decodes `max_prompts` prompts of random token
    ids instead (`data` is not read)."""
    if lm.tokenizer is None:
        prompts = random_token_ids(lm.model.config.vocab_size, max_prompts, RANDOM_PROMPT_TOKENS, settings.seed)
    else:
        prompts = load_prompt_texts(data)[:max_prompts]
    e2e = measure_end_to_end(
        lm,
        proposal,
        settings.sizes,
        settings.batches,
        prompts,
        max_new_tokens=max_new_tokens,
        topk=settings.topk,
        progress=progress,
        verification=settings.verification,
        graphs=settings.graphs,
    )
    df = df.drop(columns=E2E_COLUMNS, errors="ignore")
    df = df.merge(e2e, on=["batch", "nodes"], how="left").reindex(columns=SWEEP_COLUMNS)
    with atomic_path(Path(output)) as tmp:
        df.to_csv(tmp, index=False)
    return df


def format_sweep(df: pd.DataFrame) -> str:
    cols = ["batch", "context", "nodes", "tau", "step_time_s", "overhead", "speedup"]
    if df["predicted_overhead"].notna().any():
        cols += ["predicted_overhead", "predicted_speedup"]
    if df["e2e_speedup"].notna().any():
        cols += ["e2e_tokens_per_s", "e2e_speedup"]
    view = df[cols].copy()
    view["step_time_ms"] = view.pop("step_time_s") * 1e3
    return view.to_string(index=False, float_format=lambda v: f"{v:.3f}")


def fit_files(out_dir, prefix: str = "") -> tuple[Path, Path, Path]:
    """The profile fitted on batch 1 and its transfer table (CSV, markdown) in `out_dir`, their
    names led by `prefix`: `treeopt sweep -o NAME.csv` writes NAME.fitted_hardware.json, ..., so
    that two sweeps in one folder keep their own; a run folder holds one sweep (no prefix)."""
    out = Path(out_dir)
    return out / f"{prefix}fitted_hardware.json", out / f"{prefix}fit_transfer.csv", out / f"{prefix}fit_transfer.md"


def fit_from_sweep(
    lm, proposal: Tree, hardware: HardwareProfile, df: pd.DataFrame, out_dir, prefix: str = ""
) -> BatchTransfer:
    """Fit the profile's engine terms to the batch-1 rows of the sweep just measured, predict
    the other batch sizes (docs/performance-model.md#fitting-a-profile-to-measured-steps), and
    write the `fit_files(out_dir, prefix)`."""
    shape = shape_of(lm.name, dtype=torch_dtype_name(lm.dtype))
    heads = heads_shape_of_drafter(lm.heads)
    depth = [proposal.prefix(n).depth for n in range(proposal.size + 1)]
    result = batch_transfer(shape, heads, hardware, df, depth)
    profile_file, transfer_csv, transfer_md = fit_files(out_dir, prefix)
    result.fit.profile.save(profile_file)
    with atomic_path(transfer_csv) as tmp:
        result.cells.to_csv(tmp, index=False, float_format="%.6g")
    write_text(transfer_md, format_transfer(result) + "\n")
    return result


def format_transfer(result: BatchTransfer) -> str:
    """How a profile fitted on batch 1 predicts the other batch sizes, in a few lines."""
    cells = result.cells
    terms = terms_line(result.fit) or "no free term"
    return (
        f"profile fitted on batch 1 ({terms}; {error_summary(result.fit.in_sample_error)} on its rows); on the "
        f"other batch sizes T(n)/T(0) is off by a median {cells['median_ratio_error'].median() * 100:.1f}% "
        f"(worst {cells['worst_ratio_error'].max() * 100:.1f}%), and the predicted best tree is within one "
        f"swept size of the measured best in {int(cells['within_one_step'].sum())} of {len(cells)} cells"
    )
