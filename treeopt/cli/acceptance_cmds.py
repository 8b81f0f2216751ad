"""The engine's own acceptance: `treeopt calibrate --import` of engine output (a chain table)
and `treeopt acceptance check` (observed against expected, exit 0 / 1 / 2)."""

from __future__ import annotations

import json
import sys

import click

from treeopt import api
from treeopt.acceptance import rank_vectors_path
from treeopt.app.engine_schedule import chain_schedule
from treeopt.chain_counts import ChainAcceptance, ExpectationCheck, describe_window, window_of_table
from treeopt.cli.options import AtLeast, apply
from treeopt.cli.roofline_cmds import ENGINE_COSTS_OPTION, GRID_OPTIONS, HARDWARE_OPTION, MODEL_OPTIONS
from treeopt.cli.safety import check_outputs, input_files
from treeopt.draft_scores import draft_scores_path
from treeopt.mix import parse_mix


def format_chain(chain: ChainAcceptance) -> str:
    """The chain table: each position's conditional acceptance (Wilson) and tau of every chain
    length (normal interval of the mean), extrapolated lengths flagged."""
    pct = f"{chain.confidence:.0%}"
    lines = [f"position  tried     accepted  acceptance [{pct} Wilson]"]
    for j, (n, x) in enumerate(zip(chain.tries, chain.accepted, strict=True)):
        if n > 0:
            cell = f"{chain.conditional[j]:.3f} [{chain.conditional_low[j]:.3f}, {chain.conditional_high[j]:.3f}]"
        else:
            cell = "not reached"
        lines.append(f"{j + 1:>8}  {int(n):<8}  {int(x):<8}  {cell}")
    lines.append(f"chain K  tau [{pct} normal, mean of accepted length]")
    for k, t in enumerate(chain.tau):
        flag = (
            "  extrapolated (last acceptance held; bounds: none more .. upper bounds held)"
            if chain.extrapolated[k]
            else ""
        )
        lines.append(f"{k:>7}  {t:.3f} [{chain.tau_low[k]:.3f}, {chain.tau_high[k]:.3f}]{flag}")
    return "\n".join(lines)


def engine_import(files: tuple[str, ...], output: str, *, quiet: bool) -> None:
    """`treeopt calibrate --import` of engine acceptance output: the chain table."""
    check_outputs([output, rank_vectors_path(output), draft_scores_path(output)], input_files(*files))
    window = api.engine_acceptance(files)
    table = api.chain_table(window)
    chain = api.chain_acceptance(window)
    table.save(output)
    rank_vectors_path(output).unlink(missing_ok=True)  # a sidecar of an earlier run would be stale
    draft_scores_path(output).unlink(missing_ok=True)
    if quiet:
        return
    click.echo(f"imported {describe_window(window)}")
    for note in window.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(format_chain(chain))
    click.echo(f"wrote {output}")


@click.group("acceptance")
def acceptance_group() -> None:
    """The engine's reported acceptance against what is expected of the drafter."""


@acceptance_group.command("check")
@click.option(
    "--observed",
    multiple=True,
    required=True,
    metavar="FILE",
    help="What the engine reported: vLLM /metrics scrapes (the later first, then the earlier), a per-request "
    "JSON/JSON-lines file of vLLM or SGLang, or a chain table from `treeopt calibrate --import`.",
)
@click.option(
    "--expected",
    multiple=True,
    required=True,
    metavar="FILE",
    help="What the drafter should do: an accuracy table (a calibration, or an earlier window's chain table), "
    "or engine output of an earlier window (as --observed).",
)
@click.option(
    "--tolerance",
    type=float,
    default=0.05,
    show_default=True,
    help="Differences in per-position acceptance smaller than this are consistent however many steps were seen.",
)
@click.option(
    "--confidence", type=float, default=0.95, show_default=True, help="For all positions together (Bonferroni)."
)
@click.option("-v", "--verbose", is_flag=True, help="Every position, not only the verdict.")
def check_cmd(observed, expected, tolerance, confidence, verbose) -> None:
    """Whether the engine's per-position acceptance is what a calibration or an earlier window
    predicts. Exit status 0 consistent, 1 inconsistent, 2 bad input.

    \b
    Examples:
      treeopt acceptance check --observed now.prom --observed before.prom --expected acc.json
      treeopt acceptance check --observed requests.jsonl --expected last_week.json
    """
    result = api.check_acceptance(observed, expected, tolerance=tolerance, confidence=confidence)
    if verbose:
        click.echo(format_check(result))
    click.echo(result.line())
    sys.exit(0 if result.consistent else 1)


def format_check(result: ExpectationCheck) -> str:
    pct = f"{result.confidence:.2%}"
    lines = [f"position  observed [{pct}]        expected [{pct}]        difference (Newcombe)     verdict"]
    for p in result.positions:
        o, e, d = p.observed, p.expected, p.difference
        lines.append(
            f"{p.position:>8}  {o[0]:.3f} [{o[1]:.3f}, {o[2]:.3f}]  {e[0]:.3f} [{e[1]:.3f}, {e[2]:.3f}]  "
            f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]  {p.verdict}"
        )
    return "\n".join(lines)


@acceptance_group.command("schedule")
@click.option(
    "--import",
    "import_files",
    multiple=True,
    required=True,
    metavar="FILE",
    help="The engine's acceptance: vLLM /metrics scrapes (the later first, then the earlier), a per-request "
    "JSON/JSON-lines file of vLLM or SGLang, or a chain table from `treeopt calibrate --import`.",
)
@apply(MODEL_OPTIONS)
@HARDWARE_OPTION
@ENGINE_COSTS_OPTION
@apply(GRID_OPTIONS)
@click.option(
    "--method",
    default="eagle3",
    show_default=True,
    help="The vLLM speculative method the schedule line names (eagle3, mtp, ngram, ...).",
)
@click.option("--max-batch-size", type=AtLeast(1), default=None, help="The server's max_num_seqs.")
@click.option(
    "--mix",
    default=None,
    metavar="SPEC|FILE.csv",
    help="Traffic mix (BATCH[@CONTEXT]:WEIGHT,... or a CSV, as `treeopt select --mix`): schedule its batch sizes, "
    "each weighing its contexts as the mix does (instead of --batch and equal --context weights).",
)
@click.option("-o", "--output", default=None, metavar="FILE", help="Also write the chain table (JSON).")
def schedule_cmd(
    import_files, model, dtype, hardware, engine_costs, batches, contexts, method, max_batch_size, mix, output
) -> None:
    """The best K per batch range and the switch-off point for the drafter the engine serves,
    from its reported acceptance and the step costs of a GPU profile: the chain table with its
    intervals, then vLLM's num_speculative_tokens_per_batch_size line and TensorRT-LLM's
    draft_len_schedule.

    \b
    Example:
      treeopt acceptance schedule --import now.prom --import before.prom \\
          --model llama-3-8b --hardware h100-sxm --context 2048 --method eagle3
    """
    check_outputs([output], input_files(*import_files, hardware))
    table, window = _chain_input(import_files)
    if dtype is not None:
        model = api.model_shape(model, dtype)
    plan = chain_schedule(
        model,
        hardware,
        table,
        batches=batches,
        contexts=contexts,
        method=method,
        engine_costs=engine_costs,
        max_batch_size=max_batch_size,
        mix=parse_mix(mix) if mix is not None else None,
    )
    if output is not None:
        table.save(output)
    if window is not None:
        click.echo(f"imported {describe_window(window)}")
        click.echo(format_chain(api.chain_acceptance(window)))
    click.echo(plan.step_costs)
    click.echo(
        "best K per batch size (0: speculation off): "
        + ", ".join(f"{c.batch_size}: {c.draft_len}" for c in plan.choices)
    )
    if plan.unfit_batches:
        click.echo(
            f"note: batch {', '.join(map(str, plan.unfit_batches))} does not fit in memory: not scheduled", err=True
        )
    off = plan.switch_off_batch
    click.echo(f"speculation off from batch {off} on" if off is not None else "speculation on at every batch size")
    click.echo(f"vLLM: {plan.vllm_line}")
    trt = "no schedule TensorRT-LLM takes" if plan.trtllm is None else json.dumps(plan.trtllm)
    click.echo(f"TensorRT-LLM: {trt}")
    if output is not None:
        click.echo(f"wrote {output}")


def _chain_input(files):
    """(chain table, its engine window or None) of engine output or a chain table file."""
    if len(files) == 1 and api._is_accuracy_file(files[0]):
        table = api.load_accuracy(files[0])
        return table, window_of_table(table, files[0])
    window = api.engine_acceptance(files)
    return api.chain_table(window), window
