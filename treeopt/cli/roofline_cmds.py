"""`treeopt hw list|calibrate`, `treeopt roofline ops|speedup`, `treeopt report`: the
analytical half (roofline/)."""

from __future__ import annotations

import json
import shlex
import sys

import click

from treeopt.cli import cli
from treeopt.cli.options import parse_int_list
from treeopt.errors import UserError


def _int_list(value: str | None, option: str, default, minimum: int) -> tuple[int, ...]:
    return parse_int_list(value, option, minimum=minimum, default=default)


def _shape(model: str, dtype: str | None):
    from roofline.shapes import model_shape

    return model_shape(model, dtype=dtype)


def _load_acc(path: str, csv_model: str | None, model_name: str):
    from treeopt.accuracy import load_accuracy

    if csv_model is not None:
        return load_accuracy(path, model=csv_model), f"`{path}` (rows of {csv_model})"
    try:
        return load_accuracy(path), f"`{path}`"
    except UserError as err:
        # a CSV holding several models: take the rows named like --model, if there are any
        if "several models" in str(err):
            try:
                return load_accuracy(path, model=model_name.lower()), f"`{path}` (rows of {model_name.lower()})"
            except UserError:
                pass
        raise


def _command_line() -> str:
    return "treeopt " + " ".join(shlex.quote(a) for a in sys.argv[1:])


_model_opts = [
    click.option("--model", "model", required=True, metavar="NAME|CONFIG|DIR|demo",
                 help="Built-in shape (llama-7b, vicuna-7b, llama-3-8b, mistral-7b, ...), a config.json, "
                      "a model directory, or demo."),
    click.option("--dtype", default=None, metavar="DTYPE",
                 help="Compute dtype (fp32, bf16, fp16) [default: the model's]."),
]
_hw_opt = click.option("--hardware", "hardware", required=True, metavar="NAME|PROFILE.json",
                       help="Built-in profile (see `treeopt hw list`) or a profile JSON from `treeopt hw calibrate`.")
_heads_opts = [
    click.option("--heads", "num_heads", type=int, default=None,
                 help="Number of draft heads K [default: the accuracy table's, else the Medusa heads config "
                      "next to the model, else 5]; 0 = none."),
    click.option("--head-layers", type=int, default=None, help="ResBlocks per head [default: 1]."),
    click.option("--head-tokens", type=int, default=None,
                 help="Tokens per sequence the heads run on [default: all q, as Medusa's code; a decoder "
                      "that runs them on the accepted token only: 1]."),
]


def _apply(opts):
    def deco(f):
        for opt in reversed(opts):
            f = opt(f)
        return f
    return deco


# ---------------------------------------------------------------------------------------------
@cli.group("hw")
def hw_group() -> None:
    """Hardware profiles: the built-in datasheet table and calibrated profiles."""


@hw_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def hw_list(as_json: bool) -> None:
    """List the built-in hardware profiles."""
    from roofline.hardware import builtin_hardware, hardware_aliases

    profiles = builtin_hardware()
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in profiles.values()], indent=1))
        return
    aliases: dict[str, list[str]] = {}
    for a, n in hardware_aliases().items():
        aliases.setdefault(n, []).append(a)
    click.echo(f"{'name':<16} {'bf16 TFLOP/s':>12} {'fp32 TFLOP/s':>12} {'GB/s':>7} {'GB':>5}  description")
    for name, p in profiles.items():
        fp32 = p.peak_flops.get("fp32")
        al = f" (alias {', '.join(aliases[name])})" if name in aliases else ""
        click.echo(f"{name:<16} {p.peak('bf16') / 1e12:>12.4g} {fp32 / 1e12 if fp32 else float('nan'):>12.4g} "
                   f"{p.bandwidth_bytes_per_s / 1e9:>7.0f} {p.capacity_bytes / 1e9:>5.0f}  {p.description}{al}")
    p = next(iter(profiles.values()))
    click.echo(f"\nAll: eta_compute {p.eta_compute}, eta_memory {p.eta_memory}, {p.kernel_overhead_s * 1e6:g} us "
               "per kernel, row-dependent GEMM efficiency fitted to A100 7B measurements (see roofline/hardware.py). "
               "Calibrate your own machine with `treeopt hw calibrate`.")


@hw_group.command("calibrate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--model", default="demo", show_default=True, metavar="NAME|CONFIG|DIR|demo",
              help="Model whose weight shapes are measured (and whose forward pass fixes the overheads).")
@click.option("--dtype", default=None, help="Compute dtype [default: fp32 on cpu, bf16 on cuda].")
@click.option("--threads", type=int, default=None, help="torch CPU threads [default: torch's setting].")
@click.option("--quick", is_flag=True, help="Fewer row counts and rounds (seconds; still a usable profile).")
@click.option("--name", default=None, help="Profile name [default: cpu-calibrated / cuda-calibrated].")
@click.option("--no-validate", is_flag=True, help="Skip the full-model validation forwards.")
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="Profile JSON to write [default: hardware-DEVICE.json].")
def hw_calibrate(device, model, dtype, threads, quick, name, no_validate, out) -> None:
    """Measure this machine (bandwidth, GEMM efficiency by rows for the model's weight shapes,
    attention, elementwise work, per-kernel and per-forward framework overhead) and write a
    hardware profile the other commands accept as --hardware."""
    from treeopt.app.hwcalibrate import calibrate_hardware

    prof = calibrate_hardware(device, model, dtype=dtype, quick=quick, threads=threads, name=name,
                              validate=not no_validate, progress=True)
    out = out or f"hardware-{device}.json"
    prof.save(out)
    cal = prof.calibration
    dt = cal["dtype"]
    click.echo(f"{prof.name}: {prof.description}")
    click.echo(f"  peak {dt} GEMM {prof.peak(dt) / 1e9:.1f} GFLOP/s; streaming {prof.bandwidth_bytes_per_s / 1e9:.1f} GB/s "
               f"(weights stream at x{prof.eta_memory:.2f}); elementwise {prof.elementwise_rate / 1e9:.1f} GB/s")
    click.echo("  GEMM efficiency by rows: " + ", ".join(
        f"{int(r)}:{v:.2f}" for r, v in zip(prof.gemm_efficiency.rows, prof.gemm_efficiency.values)))
    click.echo(f"  overheads: {prof.kernel_overhead_s * 1e6:.2f} us per kernel, {prof.forward_overhead_s * 1e3:.3f} ms "
               f"per forward + {prof.layer_overhead_s * 1e3:.3f} ms per layer + {prof.head_overhead_s * 1e3:.3f} ms "
               f"per draft head; per layer {prof.token_overhead_s * 1e6:.2f} us per token row and "
               f"{prof.context_overhead_s * 1e9:.1f} ns per cached token in a tree step, "
               f"{prof.plain_context_overhead_s * 1e9:.1f} ns in plain decoding")
    for v in cal.get("validation", []):
        ratio = (f"; T(q)/T(1) measured {v['ratio_measured']:.2f}, predicted {v['ratio_predicted']:.2f}"
                 if "ratio_measured" in v else "")
        click.echo(f"  check b={v['batch']} q={v['tokens']} s={v['context']}: measured {v['measured_s'] * 1e3:.2f} ms, "
                   f"predicted {v['predicted_s'] * 1e3:.2f} ms ({v['error'] * 100:+.0f}%){ratio}")
    for note in cal.get("notes", []):
        click.echo(f"  note: {note}")
    click.echo(f"wrote {out} ({cal['seconds']:.0f} s)")


# ---------------------------------------------------------------------------------------------
@cli.group("roofline")
def roofline_group() -> None:
    """The operator-level latency model and the predicted speedup grid."""


@roofline_group.command("ops")
@_apply(_model_opts)
@_hw_opt
@_apply(_heads_opts)
@click.option("--batch", "batch", type=int, default=1, show_default=True, help="Sequences b.")
@click.option("--tokens", "tokens", type=int, default=1, show_default=True,
              help="New tokens per sequence q (1 = decode, n+1 = tree of n nodes, prompt length = prefill).")
@click.option("--context", "context", type=int, default=0, show_default=True, help="Cached tokens s.")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of operators.")
def roofline_ops(model, dtype, hardware, num_heads, head_layers, head_tokens, batch, tokens, context, attention,
                 as_json) -> None:
    """Every operator of one forward pass: FLOPs, bytes, intensity, predicted time, binding roof."""
    from roofline.hardware import load_hardware
    from roofline.latency import framework_overhead_s, memory_required_bytes, op_timings
    from roofline.shapes import resolve_heads

    shape = _shape(model, dtype)
    hw = load_hardware(hardware)
    if num_heads is None and tokens == 1:
        num_heads = 0  # plain decoding runs no heads unless asked
    heads = resolve_heads(model, shape, num_heads=num_heads, num_layers=head_layers, tokens_per_sequence=head_tokens)
    for name, v, lo in (("--batch", batch, 1), ("--tokens", tokens, 1), ("--context", context, 0)):
        if v < lo:
            raise UserError(f"{name}: must be >= {lo}, got {v}")
    timings = op_timings(shape, heads, hw, batch=batch, tokens=tokens, context=context, attention=attention)
    fixed = float(framework_overhead_s(shape, hw, batch=batch, tokens=tokens, context=context))
    total = fixed + sum(float(t.total_s) for t in timings)
    need = float(memory_required_bytes(shape, heads, batch=batch, tokens=tokens, context=context, attention=attention))
    if need > hw.capacity_bytes:
        click.echo(f"treeopt: warning: this configuration needs {need / 1e9:.1f} GB but {hw.name} has "
                   f"{hw.capacity_bytes / 1e9:.1f} GB: it does not fit; times below are what it would take", err=True)
    rows = []
    for t in timings:
        flops, nbytes = float(t.op.flops), float(t.op.bytes)
        rows.append({"name": t.op.name, "count": t.op.count, "flops": flops, "bytes": nbytes,
                     "intensity": flops / nbytes if nbytes else None, "time_s": float(t.time_s),
                     "bound": str(t.bound), "compute_s": float(t.compute_s), "memory_s": float(t.memory_s),
                     "overhead_s": float(t.overhead_s), "kernels": t.op.kernels, "kind": t.op.kind})
    if fixed > 0:
        rows.append({"name": "framework", "count": 1, "flops": 0.0, "bytes": 0.0, "intensity": None,
                     "time_s": fixed, "bound": "overhead", "compute_s": 0.0, "memory_s": 0.0,
                     "overhead_s": fixed, "kernels": 0, "kind": "framework"})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{shape.describe()}")
    if heads.num_heads:
        click.echo(f"draft heads: {heads.describe()}")
    click.echo(f"hardware: {hw.describe()}")
    click.echo(f"b={batch} q={tokens} s={context} attention={attention}; memory needed {need / 1e9:.2f} GB")
    click.echo(f"{'operator':<14} {'count':>5} {'GFLOP':>10} {'MB':>10} {'FLOP/B':>8} {'time/us':>10} "
               f"{'total/us':>10} {'share':>6}  bound")
    for r in rows:
        oi = f"{r['intensity']:.1f}" if r["intensity"] is not None else "-"
        click.echo(f"{r['name']:<14} {r['count']:>5} {r['flops'] / 1e9:>10.4g} {r['bytes'] / 1e6:>10.4g} {oi:>8} "
                   f"{r['time_s'] * 1e6:>10.2f} {r['time_s'] * r['count'] * 1e6:>10.1f} "
                   f"{r['time_s'] * r['count'] / total * 100:>5.1f}%  {r['bound']}")
    tot_flops = sum(r["flops"] * r["count"] for r in rows)
    tot_bytes = sum(r["bytes"] * r["count"] for r in rows)
    click.echo(f"step: {total * 1e3:.3f} ms; {tot_flops / 1e9:.4g} GFLOP, {tot_bytes / 1e6:.4g} MB moved, "
               f"intensity {tot_flops / tot_bytes:.1f} FLOP/B (ridge {hw.ridge_intensity(shape.dtype):.0f})")


@roofline_group.command("speedup")
@_apply(_model_opts)
@_hw_opt
@click.option("--accuracy", "accuracy", required=True, type=click.Path(),
              help="Accuracy table (treeopt.accuracy/v1 JSON, per-rank matrix JSON, or cumulative top-k CSV).")
@click.option("--csv-model", default=None, help="Row set of a CSV holding several models [default: --model].")
@_apply(_heads_opts)
@click.option("--batch", "batch", default=None, help="Comma-separated batch sizes [default: 1,2,4,...,64].")
@click.option("--context", "context", default=None, help="Comma-separated context lengths [default: 128,...,8192].")
@click.option("--max-nodes", type=int, default=64, show_default=True, help="Largest tree size.")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--joint", is_flag=True, help="tau from the table's joint prefix counts.")
@click.option("--heads-in-baseline", is_flag=True, help="Plain decoding (n = 0) also runs the heads.")
@click.option("--used-heads", is_flag=True, help="A tree runs only the heads it reaches (its depth), not all K.")
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False), help="Grid CSV to write.")
@click.option("--select", "select", default=None, type=click.Path(dir_okay=False),
              help="Selection JSON (treeopt.selection/v1) to write.")
def roofline_speedup(model, dtype, hardware, accuracy, csv_model, num_heads, head_layers, head_tokens, batch, context,
                     max_nodes, attention, joint, heads_in_baseline, used_heads, out, select) -> None:
    """Predicted overhead, tau and speedup for every batch x context x tree size, and the best
    tree per cell ("none" when no tree beats plain decoding)."""
    from roofline.grid import (DEFAULT_BATCHES, DEFAULT_CONTEXTS, best_per_cell, heads_used_by_prefix,
                               proposal_from_accuracy, selection_from_grid, speedup_grid)
    from roofline.hardware import load_hardware
    from roofline.shapes import resolve_heads
    from treeopt.fileio import atomic_path, write_json

    shape = _shape(model, dtype)
    hw = load_hardware(hardware)
    batches = _int_list(batch, "--batch", DEFAULT_BATCHES, 1)
    contexts = _int_list(context, "--context", DEFAULT_CONTEXTS, 0)
    table, label = _load_acc(accuracy, csv_model, model)
    heads = resolve_heads(model, shape, num_heads=num_heads, num_layers=head_layers, accuracy_heads=table.num_heads,
                          tokens_per_sequence=head_tokens)
    if heads.num_heads < 1:
        raise UserError("--heads: a speedup grid needs at least one draft head")
    tree, tau = proposal_from_accuracy(table, max_nodes, num_heads=heads.num_heads, joint=joint)
    grid = speedup_grid(shape, heads, hw, tau, batches, contexts, attention=attention,
                        heads_in_baseline=heads_in_baseline,
                        heads_used=heads_used_by_prefix(tree) if used_heads else None)
    best = best_per_cell(grid)
    if out:
        with atomic_path(out) as tmp:
            grid.to_csv(tmp, index=False, float_format="%.6g")
    if select:
        write_json(select, selection_from_grid(grid, tree, hw.name, shape.name,
                                               extra={"heads": heads.num_heads, "attention": attention}))
    click.echo(f"{shape.describe()}; {heads.describe()}; hardware {hw.name}; accuracy {label}")
    click.echo(f"tau of the greedy proposal sequence: " + ", ".join(
        f"n={n}: {tau[n]:.3f}" for n in (1, 4, 16, 32, 64) if n < len(tau)))
    click.echo("best tree size (predicted speedup) per batch (rows) and context (columns):")
    ctxs = sorted(best["context"].unique())
    click.echo(f"{'batch':>6} " + " ".join(f"{c:>13}" for c in ctxs))
    for b in sorted(best["batch"].unique()):
        cells = []
        for c in ctxs:
            r = best[(best["batch"] == b) & (best["context"] == c)].iloc[0]
            if not r["fits_memory"]:
                cells.append(f"{'OOM':>13}")
            elif r["nodes"] == 0:
                cells.append(f"{'none':>13}")
            else:
                cells.append(f"{int(r['nodes']):>5} ({r['speedup']:.2f}x)")
        click.echo(f"{b:>6} " + " ".join(cells))
    if not best["fits_memory"].all():
        click.echo(f"OOM: not even plain decoding fits in {hw.capacity_bytes / 1e9:.0f} GB", err=True)
    for path, what in ((out, "grid"), (select, "selection")):
        if path:
            click.echo(f"wrote {what} {path}")


# ---------------------------------------------------------------------------------------------
@cli.command("report")
@_apply(_model_opts)
@_hw_opt
@click.option("--accuracy", "accuracy", default=None, type=click.Path(),
              help="Accuracy table; without it the report has no tau, speedup or best-tree plots.")
@click.option("--csv-model", default=None, help="Row set of a CSV holding several models [default: --model].")
@_apply(_heads_opts)
@click.option("--batch", "batch", default=None, help="Comma-separated batch sizes [default: 1,2,4,...,64].")
@click.option("--context", "context", default=None, help="Comma-separated context lengths [default: 128,...,8192].")
@click.option("--plot-context", type=int, default=None, help="Context of the speedup curves [default: ~1024].")
@click.option("--max-nodes", type=int, default=64, show_default=True)
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--joint", is_flag=True, help="tau from the table's joint prefix counts.")
@click.option("--used-heads", is_flag=True, help="A tree runs only the heads it reaches (its depth), not all K.")
@click.option("--title", default=None, help="Report title.")
@click.option("--note", "notes", multiple=True, help="A note for index.md (repeatable).")
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False), help="Report directory.")
def report_cmd(model, dtype, hardware, accuracy, csv_model, num_heads, head_layers, head_tokens, batch, context,
               plot_context, max_nodes, attention, joint, used_heads, title, notes, out) -> None:
    """Write a report directory: roofline chart, speedup curves, best-tree heatmaps (PNG),
    grid.csv, selection.json and an index.md stating inputs and assumptions."""
    from roofline.grid import DEFAULT_BATCHES, DEFAULT_CONTEXTS
    from roofline.hardware import builtin_hardware, load_hardware
    from roofline.report import build_report
    from roofline.shapes import resolve_heads

    shape = _shape(model, dtype)
    hw = load_hardware(hardware)
    batches = _int_list(batch, "--batch", DEFAULT_BATCHES, 1)
    contexts = _int_list(context, "--context", DEFAULT_CONTEXTS, 0)
    table, label = (None, "")
    if accuracy:
        table, label = _load_acc(accuracy, csv_model, model)
    heads = resolve_heads(model, shape, num_heads=num_heads, num_layers=head_layers,
                          accuracy_heads=table.num_heads if table is not None else None,
                          tokens_per_sequence=head_tokens)
    if table is not None and heads.num_heads < 1:
        raise UserError("--heads: a speedup report needs at least one draft head")
    if plot_context is not None and plot_context not in contexts:
        raise UserError(f"--plot-context: {plot_context} is not one of the --context values")
    summary = build_report(shape, heads, hw, out, accuracy=table, accuracy_label=label, batches=batches,
                           contexts=contexts, max_nodes=max_nodes, attention=attention, plot_context=plot_context,
                           command=_command_line(), title=title, joint=joint, used_heads=used_heads, notes=notes,
                           save_hardware=hw.name not in builtin_hardware())
    click.echo(f"wrote {out}/index.md with " + ", ".join(v for k, v in summary["files"].items() if k != "index"))
