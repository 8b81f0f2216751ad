"""`treeopt sglang-tau`: tokens per step of SGLang's dynamic EAGLE tree for (steps, topk,
num_draft_tokens), predicted from the draft's own scores and optionally measured
(docs/statistics.md#dynamic-trees)."""

from __future__ import annotations

import dataclasses

import click
import pandas as pd

from calibration.data import check_prompt_source
from calibration.models import ModelSource
from treeopt.app.sglang_tau import TauSettings, check_settings, sglang_tau
from treeopt.cli.options import DRAFTER_OPTION, AtLeast, IntList, dtype_option
from treeopt.cli.safety import check_outputs, input_files
from treeopt.export import text_table
from treeopt.fileio import atomic_path


@click.command("sglang-tau")
@click.option("--model", default="demo", show_default=True, metavar="demo|DIR", help="Base model.")
@click.option(
    "--heads", default=None, metavar="DIR", help="The EAGLE draft's directory [default: MODEL's, per --drafter]."
)
@DRAFTER_OPTION
@click.option("--data", default="demo", show_default=True, metavar="demo|FILE|DIR", help="Calibration prompts.")
@click.option(
    "--validate-data",
    default=None,
    metavar="demo-validation|FILE|DIR",
    help="Held-out prompts: also measure tokens per step with the reference decoder drafting SGLang's way.",
)
@click.option(
    "--scores",
    default=None,
    metavar="FILE",
    help="Predict from the draft scores `treeopt calibrate --draft-scores` wrote (ACC.scores.npz) "
    "instead of drafting on --data.",
)
@click.option("--steps", type=AtLeast(1), required=True, help="--speculative-num-steps.")
@click.option("--topk", type=AtLeast(1), required=True, help="--speculative-eagle-topk.")
@click.option(
    "--draft-tokens",
    type=IntList(2),
    required=True,
    metavar="N[,N...]",
    help="--speculative-num-draft-tokens values (root included; forced to steps + 1 for topk 1).",
)
@click.option("--max-prompts", type=AtLeast(1), default=32, show_default=True, help="Prompts of each set used.")
@click.option("--prompt-tokens", type=AtLeast(1), default=128, show_default=True, help="Tokens kept per prompt.")
@click.option("--new-tokens", type=AtLeast(2), default=32, show_default=True, help="Tokens generated per prompt.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@dtype_option()
@click.option("-o", "--output", default=None, metavar="FILE", help="Also write the rows as CSV.")
def sglang_tau_cmd(
    model, heads, drafter, data, validate_data, scores, steps, topk, draft_tokens, max_prompts, prompt_tokens,
    new_tokens, device, dtype, output,
):  # fmt: skip
    """Predict SGLang's tokens per step for an EAGLE draft from the draft's own scores.

    \b
    Examples:
      treeopt sglang-tau --drafter eagle3 --steps 4 --topk 4 --draft-tokens 4,8,16
      treeopt sglang-tau --drafter eagle3 --steps 5 --topk 4 --draft-tokens 16 \\
          --validate-data demo-validation
      treeopt calibrate --drafter eagle3 --draft-scores 4 -o acc.json
      treeopt sglang-tau --scores acc.scores.npz --steps 4 --topk 4 --draft-tokens 4,8,16
    """
    settings = TauSettings(steps, topk, draft_tokens, max_prompts, prompt_tokens, new_tokens)
    check_settings(settings)
    if scores is None:
        check_prompt_source(data)
    if validate_data is not None:
        check_prompt_source(validate_data, "--validate-data")
    check_outputs([output], input_files(scores))
    source = ModelSource(model, heads, drafter, None, device, dtype)
    rows = sglang_tau(source, data, settings, held_out=validate_data, scores=scores)
    columns = ["num_draft_tokens", "tau_predicted", "tau_predicted_se", "steps_walked"]
    if validate_data is not None:
        columns += ["tau_measured", "tau_measured_se"]
    records = [dataclasses.asdict(r) for r in rows]
    shown = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in records]
    click.echo(text_table(columns, shown, title=f"SGLang EAGLE tree, {steps} steps of topk {topk}"))
    if output is not None:
        with atomic_path(output) as tmp:
            pd.DataFrame(records).to_csv(tmp, index=False)
