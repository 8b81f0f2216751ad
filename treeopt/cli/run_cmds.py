"""`treeopt sweep | validate | run` and `treeopt demo train | train-draft`: the commands that measure on the
machine at hand (torch)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import click

from calibration.captured_drafting import DRAFTING_MODES
from calibration.data import check_prompt_source
from calibration.demo import DemoRecipe, train_demo
from calibration.demo_draft import DraftRecipe, train_demo_draft
from calibration.demo_files import DEMO_MODEL_DIR
from calibration.fused_projections import PROJECTION_MODES
from calibration.models import load_model
from calibration.split_attention import ATTENTION_PATHS
from calibration.sweep import SweepSettings, check_form
from calibration.threads import torch_threads
from roofline.hardware import load_hardware
from treeopt.app.random_weights import check_random_bench, load_random, random_model
from treeopt.app.run import run_main_job
from treeopt.app.stages.job import RunSettings
from treeopt.app.sweep import (
    add_end_to_end,
    fit_files,
    fit_from_sweep,
    format_sweep,
    format_transfer,
    load_prompt_texts,
    sweep,
)
from treeopt.app.validation import (
    REJECTION_VALIDATION_CSV,
    ValidationDecoding,
    check_sampled_drafter,
    format_sampled_validation,
    format_validation,
    held_out_data,
    sampled_acceptance,
    sampled_trees,
    validate,
    validate_sampled,
)
from treeopt.cli.options import (
    RUN_MODEL_OPTIONS,
    TOPK,
    AtLeast,
    FiniteAtLeast,
    IntList,
    apply,
    budget_option,
    random_weights_option,
    repeats_option,
    tolerance_option,
)
from treeopt.cli.safety import check_outputs, input_files
from treeopt.engines import ENGINE_NAMES
from treeopt.errors import UserError
from treeopt.fileio import atomic_folder, output_lock
from treeopt.forms import VERIFICATION_FORMS
from treeopt.mix import parse_mix
from treeopt.selection import read_sweep, sweep_meta_path, sweep_samples_path
from treeopt.tau import PROPOSAL_METHODS, load_tau_curves

METHOD_OPTION = click.option(
    "--method",
    type=click.Choice(PROPOSAL_METHODS),
    default="auto",
    show_default=True,
    help="Proposal sequence: joint statistics when the table has them (auto), Medusa's greedy, or the chain of "
    "top-1 guesses (size n = a draft model's gamma).",
)


@click.command("train")
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="demo_model",
    show_default=True,
    help="Where to write the model (a folder in the current directory by default: the installed "
    "package is never written; copy the result over calibration/demo_model to replace the "
    "bundled one).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Checkpoints and tokenised corpus; an interrupted run resumes from here.",
)
@click.option("--base-steps", type=AtLeast(1), default=None, help="Base-model training steps.")
@click.option("--head-steps", type=AtLeast(1), default=None, help="Medusa-head training steps.")
@click.option("--seed", type=AtLeast(0), default=0, show_default=True)
@click.option("--fresh", is_flag=True, help="Ignore checkpoints in --work-dir and start over.")
def demo_train(out_dir, work_dir, base_steps, head_steps, seed, fresh) -> None:
    """Train the demo model from the running interpreter's standard library (about 30 minutes
    on 2 CPU cores). The repository already ships the result; this is the recipe."""
    check_outputs(folders=[out_dir, work_dir])
    recipe = DemoRecipe(seed=seed)
    if base_steps:
        recipe = dataclasses.replace(recipe, base_steps=base_steps)
    if head_steps:
        recipe = dataclasses.replace(recipe, head_steps=head_steps)
    out = Path(out_dir)
    summary = train_demo(out, recipe, work_dir=work_dir, resume=not fresh)
    click.echo(f"held-out loss {summary['held_out_loss']:.3f}; model and heads in {out}")


@click.command("train-draft")
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="demo_draft",
    show_default=True,
    help="Where to write the draft model (a folder in the current directory by default: the installed "
    "package is never written; copy the result over calibration/demo_model/draft to replace the "
    "bundled one).",
)
@click.option(
    "--target",
    "target_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="The model the draft learns from, with its tokenizer.json (default: the bundled demo model).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Checkpoints (default OUT/.work); an interrupted run resumes from here.",
)
@click.option("--steps", type=AtLeast(1), default=None, help="Distillation steps.")
@click.option("--seed", type=AtLeast(0), default=0, show_default=True)
@click.option("--fresh", is_flag=True, help="Ignore checkpoints in --work-dir and start over.")
def demo_train_draft(out_dir, target_dir, work_dir, steps, seed, fresh) -> None:
    """Train the demo's draft model: a 1-layer Llama with the target's tokenizer, distilled from
    the target on the running interpreter's standard library (docs/decoder.md#draft-models)."""
    target = Path(target_dir) if target_dir is not None else DEMO_MODEL_DIR
    for name in ("config.json", "tokenizer.json"):
        if not (target / name).is_file():
            raise UserError(f"--target: {target}: no {name} (the model to distil from, with its tokenizer)")
    check_outputs(folders=[out_dir, work_dir])
    recipe = DraftRecipe(seed=seed)
    if steps:
        recipe = dataclasses.replace(recipe, steps=steps)
    out = Path(out_dir)
    info = train_demo_draft(
        target, recipe, out_dir=out, work_dir=Path(work_dir) if work_dir else out / ".work", resume=not fresh
    )
    click.echo(
        f"final KL {info['log'][-1]['kl']:.3f} after {info['log'][-1]['step']} steps; "
        f"{info['params']} parameters; draft model in {out}"
    )


#: the most (batch, context) groups a sweep measures, and tree sizes in each: a sweep measures
#: every group for several seconds (docs/formats.md#output-safety), so a grid beyond these
#: is a typo, not a plan
MAX_SWEEP_GROUPS = 1024
MAX_SWEEP_CONFIGURATIONS = 16384
#: a generous upper bound of one measured configuration on the dev machine, for the estimate
SECONDS_PER_CONFIGURATION = 1.0


def check_sweep_size(batches, contexts, sizes) -> None:
    """UserError with an estimate when --batch x --context x --sizes is too large to measure."""
    groups = len(batches) * len(contexts)
    configurations = groups * len(sizes)
    if groups > MAX_SWEEP_GROUPS or configurations > MAX_SWEEP_CONFIGURATIONS:
        hours = configurations * SECONDS_PER_CONFIGURATION / 3600
        raise UserError(
            f"--batch x --context x --sizes: {len(batches)} x {len(contexts)} x {len(sizes)} = "
            f"{configurations:,} configurations in {groups:,} groups, about {hours:,.1f} hours or more "
            f"to measure (the limit is {MAX_SWEEP_GROUPS} groups and {MAX_SWEEP_CONFIGURATIONS} "
            "configurations); sweep fewer values"
        )


@click.command("sweep")
@apply(RUN_MODEL_OPTIONS)
@random_weights_option()
@click.option("--accuracy", required=True, metavar="FILE", help="Accuracy table (treeopt calibrate).")
@METHOD_OPTION
@click.option(
    "--sizes", type=IntList(0), default="0,1,2,4,8,16,32,64", show_default=True, help="Tree sizes (0 = plain decoding)."
)
@click.option("--batch", "batches", type=IntList(1), default="1,2,4,8", show_default=True, help="Batch sizes.")
@click.option(
    "--context", "contexts", type=IntList(1), default="128,512", show_default=True, help="Cached tokens per sequence."
)
@repeats_option()
@budget_option()
@tolerance_option()
@click.option(
    "--hardware",
    default=None,
    metavar="NAME|FILE",
    help="Profile for the prediction next to each measurement (e.g. from `treeopt hw calibrate`).",
)
@click.option(
    "--verification",
    type=click.Choice(VERIFICATION_FORMS),
    default="tree",
    show_default=True,
    help="Verify each tree under a tree mask, or as its leaves' root paths, one candidate sequence "
    "each (batch expansion). One sweep measures one form; sweep each to compare them.",
)
@click.option("--end-to-end", is_flag=True, help="Also measure tokens/s of the real decoder on prompts.")
@click.option(
    "--data",
    default=None,
    metavar="demo-validation|FILE",
    help="Prompts for --end-to-end (JSON or JSON lines). Required with it except for the demo model "
    "(default: demo-validation).",
)
@click.option("--max-new-tokens", type=AtLeast(1), default=32, show_default=True)
@click.option("--topk", type=TOPK, default=10, show_default=True)
@click.option(
    "--graphs/--no-graphs",
    default=None,
    help="Time steps in static shapes, captured once per shape and replayed as CUDA graphs on CUDA "
    "[default: on CUDA, off elsewhere]; --no-graphs: the eager forward, to compare. Recorded in the sweep's metadata; "
    "a resume keeps the mode (docs/decoder.md#static-shape-steps).",
)
@click.option(
    "--attention",
    type=click.Choice(ATTENTION_PATHS),
    default=None,
    help="How the verification forward attends: split (the cached prefix without a per-query mask, the tree "
    "block under its mask, merged by log-sum-exp) or masked (one sdpa call under the whole mask) [default: split "
    "on CUDA, masked elsewhere]. Recorded in the sweep's metadata (docs/decoder.md#split-verification-attention).",
)
@click.option(
    "--projections",
    type=click.Choice(PROJECTION_MODES),
    default=None,
    help="The q/k/v and gate/up projections: fused (one GEMM each, built from the loaded weights, as engines run "
    "them) or separate [default: fused on CUDA, separate elsewhere]. Recorded in the sweep's metadata "
    "(docs/decoder.md#fused-projections).",
)
@click.option(
    "--drafting",
    type=click.Choice(DRAFTING_MODES),
    default=None,
    help="Where the timed tree step drafts: captured (the whole step in static shapes: forward, acceptance, "
    "cache keep and the next draft) or separate (the forward and the heads) [default: captured where steps are "
    "captured as CUDA graphs and the drafter allows it]. Recorded in the sweep's metadata "
    "(docs/decoder.md#captured-drafting).",
)
@click.option("--resume", is_flag=True, help="Keep the (batch, context) groups already in OUTPUT.")
@click.option("-o", "--output", required=True, metavar="FILE.csv")
def sweep_cmd(
    model,
    heads,
    drafter,
    num_heads,
    device,
    dtype,
    threads,
    random_weights,
    accuracy,
    method,
    sizes,
    batches,
    contexts,
    repeats,
    time_budget,
    tolerance,
    hardware,
    verification,
    end_to_end,
    data,
    max_new_tokens,
    topk,
    graphs,
    attention,
    projections,
    drafting,
    resume,
    output,
):
    """Measure one decoding step's latency for every tree size x batch x context on this
    machine (next to the roofline prediction), and the measured speedup tau * T(0) / T(n)."""
    # the profile fit models tree verification
    # (docs/performance-model.md#fitting-a-profile-to-measured-steps): a sweep of candidate
    # sequences is not fitted
    if random_weights and data is not None:
        raise UserError("--data: with --random-weights the end-to-end prompts are random token ids")
    data = held_out_data(data, model) if end_to_end and not random_weights else data
    fits = hardware is not None and 1 in batches and len(batches) > 1 and verification == "tree"
    # the fit's files are named from -o (NAME.fitted_hardware.json, ...): a second sweep in the
    # same folder keeps its own instead of replacing the first one's
    fitted = fit_files(Path(output).parent, f"{Path(output).stem}.")
    check_outputs(
        [output, sweep_meta_path(output), sweep_samples_path(output)] + (list(fitted) if fits else []),
        input_files(accuracy, hardware, model, heads, data if end_to_end else None),
    )
    check_sweep_size(batches, contexts, sizes)
    settings = SweepSettings(
        sizes,
        batches,
        contexts,
        repeats=repeats,
        topk=topk,
        time_budget_s=time_budget,
        verification=verification,
        tolerance=tolerance,
        graphs=graphs,
        attention=attention,
        projections=projections,
        drafting=drafting,
    )
    table, tau = load_tau_curves(accuracy, max(sizes), method=method)
    profile = load_hardware(hardware) if hardware is not None else None
    random = None
    if random_weights:
        random = random_model(model, heads=heads, drafter=drafter, num_heads=num_heads, seed=settings.seed)
        check_random_bench(random, device, dtype, batch=max(batches), positions=max(contexts) + max(sizes) + 1)
    elif end_to_end:
        load_prompt_texts(data)
    with output_lock(output):  # a second sweep to the same CSV fails at once
        if random is not None:
            lm = load_random(random, device, dtype)
        else:
            lm = load_model(model, heads, device=device, dtype=dtype, num_heads=num_heads, drafter=drafter)
        check_drafter_depth(lm, tau.proposal, accuracy)
        check_form(lm.heads, verification)
        with torch_threads(lm.model, lm.device, threads):
            df = sweep(
                lm,
                table,
                tau,
                settings,
                output,
                hardware=profile,
                resume=resume,
                accuracy_path=accuracy,
                hardware_file=hardware,
            )
            if end_to_end:
                df = add_end_to_end(lm, tau.proposal, df, settings, data, max_new_tokens, output)
    click.echo(format_sweep(df))
    click.echo(f"wrote {output}")
    if fits:
        # the engine terms of this machine's decoder, fitted on batch 1 and judged on the rest
        fit = fit_from_sweep(lm, tau.proposal, profile, df, Path(output).parent, f"{Path(output).stem}.")
        click.echo(f"{format_transfer(fit)}; wrote {fitted[0]}, {fitted[1]}, {fitted[2]}")


@dataclasses.dataclass(frozen=True)
class ModelToLoad:
    """The model and drafter that --model, --heads, --drafter and --num-heads name, and the
    --device, --dtype and --threads it runs with (`calibration.models.load_model`)."""

    model: str
    heads: str | None
    drafter: str | None
    num_heads: int | None
    device: str
    dtype: str
    threads: int | None

    def load(self):
        return load_model(
            self.model, self.heads, device=self.device, dtype=self.dtype, num_heads=self.num_heads, drafter=self.drafter
        )


@click.command("validate")
@apply(RUN_MODEL_OPTIONS)
@click.option("--accuracy", required=True, metavar="FILE", help="Accuracy table the predictions come from.")
@click.option(
    "--sweep",
    "sweep_file",
    default=None,
    metavar="FILE.csv",
    help="A sweep with predictions (treeopt sweep --hardware): checks the latency model too.",
)
@METHOD_OPTION
@click.option(
    "--data",
    default=None,
    metavar="demo-validation|FILE|DIR",
    help="Held-out prompts, disjoint from the calibration prompts, in any layout calibrate's --data reads "
    "(docs/formats.md#prompt-data). Required except for the demo model (default: demo-validation).",
)
@click.option("--sizes", type=IntList(1), default="1,2,4,8,16,32,64", show_default=True)
@click.option("--max-new-tokens", type=AtLeast(1), default=32, show_default=True)
@click.option("--batch-size", type=AtLeast(1), default=8, show_default=True)
@click.option("--max-prompts", type=AtLeast(1), default=None)
@click.option("--topk", type=TOPK, default=10, show_default=True)
@click.option(
    "--temperature",
    type=FiniteAtLeast(0),
    default=0,
    show_default=True,
    metavar="T",
    help="0: greedy decoding against the accuracy table's tau. T > 0 (a draft model): rejection sampling "
    "at T against the tau of the alpha sidecar beside --accuracy, for the proposal's trees and the "
    "chains of --sizes; writes validation_rejection.csv.",
)
@click.option("-o", "--output", default=None, metavar="DIR", help="Write validation CSVs and plots here.")
def validate_cmd(
    model,
    heads,
    drafter,
    num_heads,
    device,
    dtype,
    threads,
    accuracy,
    sweep_file,
    method,
    data,
    sizes,
    max_new_tokens,
    batch_size,
    max_prompts,
    topk,
    temperature,
    output,
):
    """Measured tokens per step of the decoder against tau predicted from the accuracy table,
    and measured step-latency ratios against the roofline, with relative errors; with
    --temperature T > 0, a draft model's trees and chains under rejection sampling."""
    data = held_out_data(data, model)
    check_outputs(inputs=input_files(accuracy, sweep_file, data, model, heads), folders=[output])
    to_load = ModelToLoad(model, heads, drafter, num_heads, device, dtype, threads)
    decoding = ValidationDecoding(max_new_tokens, batch_size, max_prompts, topk)
    if temperature > 0:
        validate_sampled_cmd(
            to_load,
            accuracy=accuracy,
            sweep_file=sweep_file,
            data=data,
            sizes=sizes,
            decoding=decoding,
            temperature=temperature,
            output=output,
        )
        return
    _, tau = load_tau_curves(accuracy, max(sizes), method=method)
    sweep_df = read_sweep(sweep_file)[0] if sweep_file is not None else None  # before hours of decoding
    check_prompt_source(data)
    lm = to_load.load()
    check_drafter_depth(lm, tau.proposal, accuracy)
    # the CSVs and plots land together or not at all
    folder = atomic_folder(output) if output is not None else contextlib.nullcontext()
    with torch_threads(lm.model, lm.device, threads), folder as out_dir:
        result = validate(lm, tau, sizes, data, decoding=decoding, sweep_df=sweep_df, out_dir=out_dir)
    click.echo(format_validation(result))


def validate_sampled_cmd(
    to_load: ModelToLoad,
    *,
    accuracy,
    sweep_file,
    data,
    sizes,
    decoding: ValidationDecoding,
    temperature,
    output,
) -> None:
    """`treeopt validate --temperature T`, T > 0: every input checked before the model loads
    (the drafter's kind, where the options already say it, again once it is loaded)."""
    if sweep_file is not None:
        raise UserError("--sweep: the step-latency check runs with the greedy validation (--temperature 0)")
    if decoding.max_new_tokens < 2:
        raise UserError(f"--max-new-tokens: must be >= 2 to measure a decoding step, got {decoding.max_new_tokens}")
    # without --heads or --drafter the model's Medusa heads load (calibration.models.load_model)
    check_sampled_drafter(to_load.drafter or (None if to_load.heads else "medusa"), temperature)
    acceptance, tau = sampled_acceptance(accuracy, temperature, max(sizes))
    trees = sampled_trees(tau.proposal, len(acceptance.alpha_per_depth), sizes)
    load_prompt_texts(data)
    lm = to_load.load()
    check_sampled_drafter(lm.heads.kind, temperature)
    check_drafter_depth(lm, max(trees, key=lambda t: t.depth), accuracy)
    with torch_threads(lm.model, lm.device, to_load.threads):
        df = validate_sampled(
            lm,
            acceptance,
            trees,
            data,
            max_new_tokens=decoding.max_new_tokens,
            batch_size=decoding.batch_size,
            max_prompts=decoding.max_prompts,
            out_dir=output,
        )
    click.echo(format_sampled_validation(df, temperature))
    if output is not None:
        click.echo(f"wrote {Path(output) / REJECTION_VALIDATION_CSV}")


#: why `treeopt run` refuses --random-weights: its proposal trees, prediction, sweep, selection
#: and validation all stand on the accuracy table it calibrates, which random weights cannot give
RUN_RANDOM_WEIGHTS = (
    "run calibrates, selects and validates what the model says, which random weights cannot give; "
    "time steps without weights with `treeopt hw calibrate`, `sweep` or `decode` --random-weights"
)


@click.command("run")
@apply(RUN_MODEL_OPTIONS)
@random_weights_option(refusal=f"Not taken: {RUN_RANDOM_WEIGHTS}.")
@click.option(
    "--data", default=None, metavar="demo|FILE|DIR", help="Calibration prompts (required, except for the demo model)."
)
@click.option(
    "--validation-data",
    default=None,
    metavar="FILE",
    help="Held-out prompts for validation, disjoint from --data, in any layout --data reads (required, "
    "except for the demo model).",
)
@click.option("--batch", "batches", type=IntList(1), default="1,2,4,8", show_default=True, help="Batch sizes to sweep.")
@click.option(
    "--context", "contexts", type=IntList(1), default="128,512", show_default=True, help="Context lengths to sweep."
)
@click.option("--sizes", type=IntList(0), default="0,1,2,4,8,16,32,64", show_default=True, help="Tree sizes to sweep.")
@repeats_option()
@budget_option()
@tolerance_option()
@click.option(
    "--steps",
    type=AtLeast(2),
    default=32,
    show_default=True,
    help="Tokens generated per prompt (calibration and validation).",
)
@click.option(
    "--max-prompts",
    type=AtLeast(1),
    default=None,
    help="Calibrate on the first N prompts of --data [default: all].",
)
@click.option("--quick", is_flag=True, help="Quick hardware calibration and fewer validation prompts.")
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Proposal trees from this engine's family; index.md gives each cell's line for it.",
)
@click.option(
    "--mix",
    "mix",
    default=None,
    metavar="FILE.csv|SPEC",
    help="Also choose one tree for this traffic mix over the swept cells (CSV batch,context,weight "
    "or '1@128:0.5,8@512:0.5').",
)
@click.option("-o", "--output", default="reports/run", show_default=True, metavar="DIR")
def run_cmd(
    model,
    heads,
    drafter,
    num_heads,
    device,
    dtype,
    threads,
    random_weights,
    data,
    validation_data,
    batches,
    contexts,
    sizes,
    repeats,
    time_budget,
    tolerance,
    steps,
    max_prompts,
    quick,
    engine,
    mix,
    output,
):
    """The main job: calibrate -> build trees -> calibrate the hardware profile -> predict ->
    sweep -> select -> validate -> report. Stages already done in DIR are kept, so an
    interrupted run continues where it stopped."""
    if random_weights:
        raise UserError(f"--random-weights: {RUN_RANDOM_WEIGHTS}")
    check_outputs(inputs=input_files(model, heads, data, validation_data, mix), folders=[output])
    check_sweep_size(batches, contexts, sizes)
    if mix is not None:
        parse_mix(mix)
    if data is not None:
        check_prompt_source(data, "--data")
    if validation_data is not None:
        check_prompt_source(validation_data, "--validation-data")
    settings = RunSettings(
        model=model,
        heads=heads,
        drafter=drafter,
        num_heads=num_heads,
        data=data,
        validation_data=validation_data,
        device=device,
        dtype=dtype,
        steps=steps,
        max_prompts=max_prompts,
        sizes=sizes,
        max_nodes=max(max(sizes), 1),
        batches=batches,
        contexts=contexts,
        repeats=repeats,
        time_budget_s=time_budget,
        tolerance=tolerance,
        validation_sizes=tuple(n for n in sizes if n > 0) or (1,),
        hw_quick=quick,
        threads=threads,
        validation_prompts=32 if quick else None,
        engine=engine,
        mix=mix,
        output=output,
    )
    # results (the selection, the validation, the report's path) on stdout, progress on stderr
    run_main_job(output, settings, log=lambda m: click.echo(m, err=True), say=click.echo)


def check_drafter_depth(lm, proposal, accuracy) -> None:
    """Refuse, right after the model loads and before any measuring, a proposal tree deeper than
    the loaded drafter can draft (a table calibrated with other heads)."""
    have = getattr(lm.heads, "num_heads", 0)
    if proposal.depth > have:
        raise UserError(
            f"--heads: the drafter of {lm.name} drafts {have} levels, the proposal trees from {accuracy} "
            f"need {proposal.depth}; use the table calibrated for these heads (or --sizes small enough)"
        )
