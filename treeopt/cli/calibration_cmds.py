"""`treeopt calibrate` and `treeopt hw calibrate`: measure the draft heads' per-rank and joint
accuracies, and this machine's hardware profile (torch)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click
import numpy as np

from calibration.distributed import processes_from_env
from calibration.medusa_import import NORMALIZATIONS, import_medusa_accuracy
from calibration.models import ModelSource, load_model
from calibration.random_model import RANDOM_DRAFT_HEADS
from calibration.runner import CalibrationInterrupted, CalibrationResult, CalibrationSettings, run_calibration
from calibration.threads import torch_threads
from roofline.profile_fit import error_summary
from treeopt.acceptance import rank_vectors_path
from treeopt.accuracy import wilson_interval
from treeopt.app.hwcalibrate import ENGINE_BATCHES, calibrate_engine_terms, calibrate_hardware, engine_bench_positions
from treeopt.app.models import is_demo
from treeopt.app.random_weights import check_random_bench, load_random, random_model
from treeopt.cli.acceptance_cmds import engine_import
from treeopt.cli.options import DRAFTER_OPTION, AtLeast, dtype_option, random_weights_option
from treeopt.cli.safety import check_outputs, input_files
from treeopt.draft_scores import draft_scores_path
from treeopt.drafter_cost import MAX_HEADS
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.layout import default_heads_dir

_RUN_OPTIONS = (
    "model",
    "heads",
    "drafter",
    "num_heads",
    "data",
    "steps",
    "topk",
    "labels",
    "batch_size",
    "prompt_tokens",
    "max_prompts",
    "checkpoint",
    "checkpoint_every",
    "resume",
    "seed",
    "device",
    "dtype",
    "threads",
    "no_joint",
    "draft_scores_topk",
    "no_chat_template",
    "device_map",
)


@click.command("calibrate")
@click.option(
    "--model",
    default="demo",
    show_default=True,
    metavar="demo|DIR",
    help="Base model: the bundled demo or a local transformers model directory.",
)
@click.option(
    "--heads",
    default=None,
    metavar="DIR",
    help="Medusa heads directory (config.json + medusa_lm_head.safetensors/.pt). Default: MODEL/heads.",
)
@DRAFTER_OPTION
@click.option(
    "--num-heads",
    type=AtLeast(1, MAX_HEADS),
    default=None,
    metavar="K",
    help="Use this many of the Medusa heads the weights hold [default: the heads config's medusa_num_heads].",
)
@click.option(
    "--data",
    default=None,
    metavar="demo|FILE|DIR",
    help="Prompts: a JSON-lines or JSON file of ShareGPT conversations, OpenAI messages, "
    "Alpaca instructions or prompt/text/turns records, a text/code file, or a directory "
    "of them (cut into prompts). Required except for the demo model (default: demo).",
)
@click.option(
    "--no-chat-template", is_flag=True, help="Do not put prompt records through the tokenizer's chat template."
)
@click.option(
    "--device-map",
    type=click.Choice(["auto"]),
    default=None,
    help="Spread a model larger than one device over this machine's devices (accelerate: "
    "pip install 'treeopt[scale]'); the heads go where the last hidden state is.",
)
@click.option(
    "--labels",
    type=click.Choice(["greedy", "data"]),
    default="greedy",
    show_default=True,
    help="greedy: the base model's own greedy continuation; data: the text itself.",
)
@click.option(
    "--steps", type=AtLeast(1), default=32, show_default=True, help="Tokens generated per prompt (greedy labels)."
)
@click.option(
    "--topk",
    type=AtLeast(1),
    default=10,
    show_default=True,
    help="Ranks recorded per head (table width), up to the vocabulary size.",
)
@click.option(
    "--batch-size",
    type=AtLeast(1),
    default=8,
    show_default=True,
    help="Prompts per batch (left-padded; counts do not depend on it).",
)
@click.option(
    "--prompt-tokens",
    type=AtLeast(1),
    default=128,
    show_default=True,
    help="Chunk size for text files; longer JSON-lines prompts keep their first N tokens.",
)
@click.option("--max-prompts", type=AtLeast(1), default=None, help="Use only the first N prompts.")
@click.option(
    "--checkpoint", default=None, metavar="FILE", help="Checkpoint of partial counts. Default: OUTPUT.partial."
)
@click.option(
    "--checkpoint-every",
    type=AtLeast(1),
    default=64,
    show_default=True,
    metavar="N",
    help="Write the checkpoint every N prompts.",
)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint (same inputs required).")
@click.option(
    "--seed",
    type=AtLeast(0),
    default=0,
    show_default=True,
    help="Torch seed, recorded in the provenance (greedy calibration draws nothing "
    "random: same inputs and seed give the same file).",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps.")
@dtype_option()
@click.option(
    "--threads",
    type=AtLeast(1),
    default=None,
    metavar="N",
    help="CPU threads for torch. Default: 1 for models under 100M parameters on the "
    "CPU (much faster on a busy machine), else one per core.",
)
@click.option("--no-joint", is_flag=True, help="Skip the joint rank-vector prefix counts.")
@click.option(
    "--draft-scores",
    "draft_scores_topk",
    type=AtLeast(1),
    default=None,
    metavar="TOPK",
    help="EAGLE drafts: also record the draft's own scores as SGLang's EAGLE worker drafts with this topk, "
    "every steps up to the draft's depth, in OUTPUT's .scores.npz (for `treeopt sglang-tau --scores`).",
)
@click.option(
    "--import",
    "import_files",
    multiple=True,
    metavar="FILE",
    help="Instead of running, convert the output of Medusa's heads_accuracy.py (FILE.pt), or an engine's own "
    "acceptance into a chain table: vLLM /metrics text (a second --import of an earlier scrape makes the "
    "window between them), vLLM per-request JSON / JSON lines, SGLang meta_info records.",
)
@click.option(
    "--normalize",
    type=click.Choice(NORMALIZATIONS),
    default="own",
    show_default=True,
    help="With --import: each head by its own positions, or every head by one count as Medusa's "
    "gen_results.py does (to rebuild the authors' tree from the file).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@click.option("-o", "--output", required=True, metavar="FILE", help="Accuracy table to write (JSON).")
@click.pass_context
def calibrate_cmd(
    ctx,
    model,
    heads,
    drafter,
    num_heads,
    data,
    no_chat_template,
    device_map,
    labels,
    steps,
    topk,
    batch_size,
    prompt_tokens,
    max_prompts,
    checkpoint,
    checkpoint_every,
    resume,
    seed,
    device,
    dtype,
    threads,
    no_joint,
    draft_scores_topk,
    import_files,
    normalize,
    quiet,
    output,
):
    """Measure how often each draft head's rank-r proposal is right, and write an accuracy
    table (treeopt.accuracy/v1) for `treeopt build`.

    \b
    Examples:
      treeopt calibrate --model demo --data demo -o acc.json
      treeopt calibrate --model ./vicuna-7b --heads ./medusa-heads --data sharegpt.json \\
          --steps 64 --batch-size 16 --device cuda -o acc.json
      torchrun --nproc-per-node 8 -m treeopt calibrate --model ./vicuna-7b \\
          --data sharegpt.json --device cuda -o acc.json
      treeopt calibrate --import vicuna_heads_accuracy.pt -o acc.json
      treeopt calibrate --import metrics_now.txt --import metrics_before.txt -o chain.json
    """
    medusa = len(import_files) == 1 and Path(import_files[0]).suffix.lower() in (".pt", ".pth")
    if not medusa and ctx.get_parameter_source("normalize") == click.core.ParameterSource.COMMANDLINE:
        raise UserError("--normalize: only meaningful with --import of Medusa's FILE.pt")
    if import_files:
        given = [
            name for name in _RUN_OPTIONS if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            raise UserError(f"--import: cannot be combined with --{given[0].replace('_', '-')}")
        if medusa:
            _import(import_files[0], normalize, output, quiet=quiet)
        else:
            engine_import(import_files, output, quiet=quiet)
        return
    settings = CalibrationSettings(
        steps=steps,
        topk=topk,
        labels=labels,
        batch_size=batch_size,
        max_prompts=max_prompts,
        checkpoint_every=checkpoint_every,
        seed=seed,
        joint=not no_joint,
        draft_scores_topk=draft_scores_topk,
    )
    try:
        result = run_calibration(
            ModelSource(model, heads, drafter, num_heads, device, dtype, device_map),
            data,
            output=output,
            settings=settings,
            prompt_tokens=prompt_tokens,
            chat_template=not no_chat_template,
            threads=threads,
            checkpoint=checkpoint if checkpoint is not None else "auto",
            resume=resume,
            progress=False if quiet else None,
        )
    except CalibrationInterrupted as stop:
        _interrupted(stop)
    if not quiet and processes_from_env().is_main:  # process 0 speaks for a torchrun
        _report(result, settings, output)


def _import(import_file: str, normalize: str, output: str, *, quiet: bool) -> None:
    """`--import`: Medusa's heads_accuracy.py output as an accuracy table."""
    check_outputs([output, rank_vectors_path(output), draft_scores_path(output)], input_files(import_file))
    table = import_medusa_accuracy(import_file, normalize=normalize)
    table.save(output)
    # Medusa's file has no rank vectors: a sidecar left by an earlier run would be stale.
    rank_vectors_path(output).unlink(missing_ok=True)
    draft_scores_path(output).unlink(missing_ok=True)
    if not quiet:
        _summary(table, f"imported {import_file}: {table.num_heads} heads, width {table.width}")
        click.echo(f"wrote {output}")


def _interrupted(stop: CalibrationInterrupted) -> NoReturn:
    """Tell where the counts of an interrupted run are, and exit as Ctrl-C does (130)."""
    if stop.checkpoint is not None:
        click.echo(
            f"treeopt: interrupted after {stop.prompts_done} prompts; counts saved to "
            f"{stop.checkpoint}. Continue with the same command plus --resume.",
            err=True,
        )
    else:
        click.echo("treeopt: interrupted before any prompt was done; nothing saved", err=True)
    sys.exit(130)


def _report(result: CalibrationResult, settings: CalibrationSettings, output: str) -> None:
    """The summary of a calibration run, and what became of its checkpoint."""
    c = result.counts
    rate = result.run_tokens / result.elapsed_s if result.elapsed_s > 0 else float("nan")
    resumed = f" (resumed after {result.resumed_prompts})" if result.resumed_prompts else ""
    _summary(
        result.table,
        f"calibrated {c.prompts_done} prompts{resumed}, {c.tokens:,} tokens "
        f"({c.generated:,} generated), {settings.labels} labels, top-{settings.topk}; this run "
        f"{result.elapsed_s:.1f} s, {rate:,.0f} tok/s",
    )
    prov = result.table.provenance
    if "data_format" in prov:
        click.echo(
            f"data format {prov['data_format']}, chat template {prov['chat_template']}"
            + (f"; {prov['processes']} processes" if "processes" in prov else "")
        )
    click.echo(f"wrote {output}")
    if result.checkpoint is not None and "processes" in prov:
        click.echo(
            f"checkpoints kept, one per process ({result.checkpoint} ...): more prompts remain; "
            "a process resumes only its own shard, so a run over more prompts starts over"
        )
    elif result.checkpoint is not None:
        click.echo(
            f"checkpoint kept at {result.checkpoint}: more prompts remain; continue with "
            "--resume (and a larger or no --max-prompts)"
        )


def _summary(table, headline: str) -> None:
    hits, pos = np.asarray(table.hits, float), np.asarray(table.positions, float)
    width = hits.shape[1]
    cumulative = hits.cumsum(axis=1)
    click.echo(headline)
    rows = []
    for k in range(hits.shape[0]):
        cells = []
        for h in (cumulative[k, 0], cumulative[k, -1]):
            interval = wilson_interval(h, pos[k])
            cells.append(f"{h / pos[k]:.3f} [{float(interval.low):.3f}, {float(interval.high):.3f}]")
        rows.append([k + 1, int(pos[k]), *cells])
    click.echo(text_table(["head", "positions", "top-1", f"top-{width}"], rows), nl=False)
    click.echo("(heads numbered from 1 as in the Medusa paper; [95% Wilson interval])")


@click.command("calibrate")
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="cpu, cuda, cuda:N, mps or auto: the device measured.",
)
@click.option(
    "--model",
    default="demo",
    show_default=True,
    metavar="NAME|CONFIG|DIR|demo",
    help="Model whose weight shapes are measured (and whose forward pass fixes the overheads).",
)
@dtype_option()
@click.option(
    "--threads",
    type=AtLeast(1),
    default=None,
    help="torch CPU threads [default: 1 for models under 100M parameters, else torch's].",
)
@click.option("--quick", is_flag=True, help="Fewer row counts and rounds (seconds; still a usable profile).")
@click.option("--name", default=None, help="Profile name [default: cpu-calibrated, cuda-calibrated or mps-calibrated].")
@click.option("--no-validate", is_flag=True, help="Skip the full-model validation forwards.")
@click.option(
    "--engine-terms/--no-engine-terms",
    default=None,
    help="Also time tree steps of treeopt's own decoder with the model's drafter and fit the profile's "
    "engine terms to them [default: on for demo or a model directory, or with --random-weights; off for a "
    "built-in shape].",
)
@click.option(
    "--graphs/--no-graphs",
    default=None,
    help="Time the forwards as `treeopt sweep` runs its steps: in static shapes, captured as CUDA graphs on CUDA "
    "with the microbenchmarks [default: on CUDA, off elsewhere]; --no-graphs: eager, for a sweep run with "
    "--no-graphs (docs/performance-model.md#calibrating-for-captured-steps).",
)
@random_weights_option()
@click.option(
    "--drafter",
    type=click.Choice(["medusa", "hydra", "mlp-speculator", "draft-model"]),
    default=None,
    help="With --random-weights: the random drafter's kind [default: medusa].",
)
@click.option(
    "--num-heads",
    type=AtLeast(1, MAX_HEADS),
    default=None,
    metavar="K",
    help=f"With --random-weights: the random drafter's heads [default: {RANDOM_DRAFT_HEADS}].",
)
@click.option(
    "-o",
    "--out",
    "out",
    default=None,
    type=click.Path(dir_okay=False),
    help="Profile JSON to write [default: hardware-DEVICE.json].",
)
def hw_calibrate(
    device,
    model,
    dtype,
    threads,
    quick,
    name,
    no_validate,
    engine_terms,
    graphs,
    random_weights,
    drafter,
    num_heads,
    out,
) -> None:
    """Measure this machine (bandwidth, GEMM efficiency by rows for the model's weight shapes,
    attention, elementwise work, per-kernel and per-forward framework overhead, and the engine
    terms of a speculative step with treeopt's decoder) and write a hardware profile the other
    commands accept as --hardware."""
    check_outputs([out or f"hardware-{device}.json"], input_files(model))
    random = _random_engine_model(model, device, dtype, engine_terms, random_weights, drafter, num_heads)
    loadable = random is not None or is_demo(model) or _runnable_with_drafter(Path(str(model)))
    if engine_terms and not loadable:
        raise UserError(
            "--engine-terms: needs a model to run (demo, a model directory or --random-weights), not a built-in shape"
        )
    prof = calibrate_hardware(
        device,
        model,
        dtype=dtype,
        quick=quick,
        threads=threads,
        name=name,
        validate=not no_validate,
        progress=True,
        graphs=graphs,
    )
    if engine_terms if engine_terms is not None else loadable:
        if random is not None:
            lm = load_random(random, device, prof.calibration["dtype"])
        else:
            lm = load_model(str(model), device=device, dtype=prof.calibration["dtype"])
        with torch_threads(lm.model, lm.device, threads):
            fit = calibrate_engine_terms(
                lm, prof, repeats=5 if quick else 9, graphs=graphs, log=lambda line: click.echo(line, err=True)
            )
        prof = fit.profile
        click.echo(
            "  engine terms from treeopt's decoder: "
            + ", ".join(f"{k} {v:.3g}" for k, v in fit.terms.items())
            + f"; {error_summary(fit.in_sample_error)} on {len(fit.in_sample_error)} tree steps"
        )
    out = out or f"hardware-{device}.json"
    prof.save(out)
    cal = prof.calibration
    dt = cal["dtype"]
    click.echo(f"{prof.name}: {prof.description}")
    click.echo(
        f"  peak {dt} GEMM {prof.peak(dt) / 1e9:.1f} GFLOP/s; "
        f"streaming {prof.bandwidth_bytes_per_s / 1e9:.1f} GB/s "
        f"(weights stream at x{prof.eta_memory:.2f}); elementwise {prof.elementwise_rate / 1e9:.1f} GB/s"
    )
    click.echo(
        "  GEMM efficiency by rows: "
        + ", ".join(
            f"{int(r)}:{v:.2f}" for r, v in zip(prof.gemm_efficiency.rows, prof.gemm_efficiency.values, strict=False)
        )
    )
    click.echo(
        f"  overheads: {prof.kernel_overhead_s * 1e6:.2f} us per kernel, {prof.forward_overhead_s * 1e3:.3f} ms "
        f"per forward + {prof.layer_overhead_s * 1e3:.3f} ms per layer + {prof.head_overhead_s * 1e3:.3f} ms "
        f"per draft head; per layer {prof.token_overhead_s * 1e6:.2f} us per token row and "
        f"{prof.context_overhead_s * 1e9:.1f} ns per cached token in a tree step, "
        f"{prof.plain_context_overhead_s * 1e9:.1f} ns in plain decoding"
    )
    for v in cal.get("validation", []):
        ratio = (
            f"; T(q)/T(1) measured {v['ratio_measured']:.2f}, predicted {v['ratio_predicted']:.2f}"
            if "ratio_measured" in v
            else ""
        )
        click.echo(
            f"  check b={v['batch']} q={v['tokens']} s={v['context']}: measured {v['measured_s'] * 1e3:.2f} ms, "
            f"predicted {v['predicted_s'] * 1e3:.2f} ms ({v['error'] * 100:+.0f}%){ratio}"
        )
    for note in cal.get("notes", []):
        click.echo(f"  note: {note}")
    click.echo(f"wrote {out} ({cal['seconds']:.0f} s)")


def _random_engine_model(model, device, dtype, engine_terms, random_weights, drafter, num_heads):
    """The random model whose tree steps give the engine terms (None without --random-weights),
    checked to fit the device with those steps' cache before anything is measured."""
    if not random_weights:
        for option, value in (("--drafter", drafter), ("--num-heads", num_heads)):
            if value is not None:
                raise UserError(
                    f"{option}: hw calibrate takes it with --random-weights (a model directory's own drafter runs)"
                )
        return None
    if engine_terms is False:
        raise UserError("--no-engine-terms: --random-weights builds a model only to time the engine terms' tree steps")
    random = random_model(model, drafter=drafter, num_heads=num_heads)
    check_random_bench(random, device, dtype, batch=max(ENGINE_BATCHES), positions=engine_bench_positions())
    return random


def _runnable_with_drafter(model_dir: Path) -> bool:
    """A model directory holding weights and a drafter beside them: the decoder can run it."""
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    return (
        model_dir.is_dir()
        and default_heads_dir(model_dir) is not None
        and any((model_dir / name).is_file() for name in weights)
    )
