"""`treeopt hw list|published|fit`: the built-in hardware profiles, the public step times and
GEMM measurements they are checked against, and a profile fitted to measured steps
(docs/performance-model.md). numpy only: no torch is loaded."""

from __future__ import annotations

import click
import numpy as np

from roofline.engine_presets import load_presets
from roofline.hardware import builtin_hardware, hardware_aliases, load_hardware
from roofline.profile_fit import error_summary, term_text
from roofline.published import (
    KNEE_TOLERANCE,
    PUBLISHED_STEPS,
    compare_steps,
    knee_checks,
    knee_ratios,
    knee_summary,
    knee_verdict,
)
from roofline.published_gemms import FITTED_CURVES, GEMM_SOURCES, GEMM_TOLERANCE, gemm_bands, published_gemms
from treeopt import api
from treeopt.cli.options import OLD_HEADS_OPTION, AtLeast, apply
from treeopt.cli.roofline_options import (
    MODEL_OPTIONS,
)
from treeopt.cli.safety import check_outputs, input_files, require_file
from treeopt.drafter_cost import MAX_HEAD_LAYERS, MAX_HEADS
from treeopt.errors import UserError
from treeopt.export import text_table
from treeopt.fileio import dumps


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def hw_list(as_json: bool) -> None:
    """List the built-in hardware profiles."""
    profiles = builtin_hardware()
    if as_json:
        click.echo(dumps([p.to_dict() for p in profiles.values()], indent=1))
        return
    aliases: dict[str, list[str]] = {}
    for a, n in hardware_aliases().items():
        aliases.setdefault(n, []).append(a)
    rows = []
    for name, p in profiles.items():
        fp32 = p.peak_flops.get("fp32")
        fp8 = p.peak_flops.get("fp8")
        al = f" (alias {', '.join(aliases[name])})" if name in aliases else ""
        rows.append(
            [
                name,
                f"{p.peak('bf16') / 1e12:.4g}",
                f"{fp8 / 1e12:.4g}" if fp8 else "-",
                f"{fp32 / 1e12:.4g}" if fp32 else "-",
                f"{p.bandwidth_bytes_per_s / 1e9:.0f}",
                f"{p.capacity_gib:.0f}",
                knee_summary(name),
                p.description + al,
            ]
        )
    headers = ["<name", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp32 TFLOP/s", "GB/s", "GiB", "<knee", "<description"]
    click.echo(text_table(headers, rows), nl=False)
    p = next(iter(profiles.values()))
    click.echo(
        f"\nAll: eta_compute {p.eta_compute}, eta_memory {p.eta_memory}, {p.kernel_overhead_s * 1e6:g} us "
        "per kernel, their die's row-dependent GEMM efficiency, no engine costs beyond the forward pass; memory "
        'as sold ("80 GB" = 80 GiB). knee: how that row curve compares with public step times and GEMM timings '
        "(`treeopt hw published`). Fit a profile to your engine's step times with `treeopt hw fit`, or "
        "calibrate this machine with `treeopt hw calibrate`."
    )
    _echo_presets()


_PRESET_COLUMNS = {
    "forward_overhead_s": "per forward",
    "layer_overhead_s": "per layer",
    "spec_step_overhead_s": "per spec. step",
    "verified_token_s": "per verified token",
    "draft_stage_s": "per drafted depth",
    "tree_verify_layer_s": "per layer of a tree",
}


def _preset_value(preset, field: str) -> str:
    if field not in preset.terms:
        return "-" if not preset.priced else "(ideal)"
    lo, hi = preset.ranges[field]
    return f"{_ms(preset.terms[field])} ({_ms(lo)}-{_ms(hi)})"


def _ms(seconds: float) -> str:
    return "0" if seconds == 0 else f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def _carried(preset) -> str:
    """The measured column of a preset that carries another family's terms: "partly" where some of
    its terms are fitted on its own engine's published steps (SGLang's drafting and tree term)."""
    return f"{'partly' if preset.own_terms else 'carried'} ({preset.carried_from})"


def _echo_presets() -> None:
    """The engine presets (docs/performance-model.md#engine-presets): what `--engine` (or
    `--engine-costs`) sets on a built-in profile."""
    rows = [
        [p.family, "yes" if p.measured else _carried(p) if p.carried_from else "no"]
        + [_preset_value(p, f) for f in _PRESET_COLUMNS]
        for p in load_presets().values()
    ]
    headers = ["<family", "<measured"] + [f"<{c}" for c in _PRESET_COLUMNS.values()]
    click.echo("")
    click.echo(text_table(headers, rows, title="Engine presets (value, range)"), nl=False)
    for p in load_presets().values():
        if p.drafting:
            kinds = ", ".join(
                f"{k} {_ms(v)}{' per step' if k in p.drafting_per_step else ''}" for k, v in p.drafting.items()
            )
            click.echo(f"drafting per depth by drafter kind ({p.family}): {kinds}")
    click.echo(
        "A preset sets these terms on a built-in profile (attention's KV bandwidth stays ideal: no published step "
        "constrains it); the roofs stay the GPU's. per drafted depth: the fitted drafter's (EAGLE for vllm); "
        "--drafter picks its kind's cost (0 where the roofline prices the drafter as operators). (ideal): not "
        "identifiable from the published steps; carried: no published step of that engine, the closest family's "
        "terms with ranges widened 2x; partly: the terms its own published steps fit, the rest carried; per layer "
        "of a tree: what a step verifying a branching tree costs beyond a "
        "chain of as many tokens, SGLang's fitted on SpecForge's SpecBundle trees minus chains, carried to vllm and "
        "trtllm; SGLang's EAGLE-3 drafting per depth and per step fitted on the same dashboard's chains; "
        "unmeasured families keep the ideal terms. --engine picks its family's preset "
        "(medusa, hydra, treeopt: hf-eager; trtllm; vllm*; sglang*), --engine-costs any family; a profile file "
        "keeps its own terms. Sources: `treeopt hw published`; held-out errors: benchmarks/bench_published_steps.py; "
        "docs/performance-model.md#engine-presets."
    )


def _echo_published_steps(name: str, sources: list) -> None:
    rows = []
    for c in compare_steps(name):
        m = c.measurement
        if m.source not in sources:
            sources.append(m.source)
        rows.append(
            [
                m.model,
                m.dtype,
                str(m.batch),
                str(m.tokens),
                str(m.context_tokens),
                m.measured_as,
                f"{m.step_ms:.3g}",
                f"{c.predicted_ms:.3g}",
                f"{c.error * 100:+.0f}%",
                f"[{sources.index(m.source) + 1}]",
            ]
        )
    if not rows:
        return
    headers = ["<model", "<dtype", "batch", "tokens", "cached", "<measured as", "ms", "predicted", "error", "source"]
    click.echo(text_table(headers, rows, title=f"{name}: one forward pass"), nl=False)
    knee_rows = [
        [
            f"T({k.tokens}) / T({k.reference_tokens})",
            k.release,
            k.model,
            f"{k.measured_ratio:.3g}",
            f"{k.predicted_ratio:.3g}",
            f"{k.error * 100:+.0f}%",
        ]
        for k in knee_checks(name)
    ]
    headers = ["<ratio", "<release", "<model", "measured", "predicted", "error"]
    click.echo(text_table(headers, knee_rows, title=f"{name}: knee in step times"), nl=False)
    for r in knee_ratios(name):
        of = f"{r.measurements} measurement" + ("s" if r.measurements > 1 else "")
        state = "matches" if r.matches else "does not match"
        click.echo(
            f"T({r.tokens}) / T({r.reference_tokens}): median error {r.median_error * 100:+.0f}% over {of}, "
            f"{state} (tolerance ±{KNEE_TOLERANCE[r.reference_tokens] * 100:.0f}%)"
        )


def _echo_published_gemms(name: str, sources: list) -> None:
    bands = gemm_bands(name)
    if not bands:
        return
    source = GEMM_SOURCES[name]
    if source not in sources:
        sources.append(source)
    (reference_rows,) = {b.reference_rows for b in bands}
    fitted = load_hardware(name).gemm_efficiency == FITTED_CURVES.get(name)
    rows = [
        [
            f"{b.lo} < r <= {b.hi}",
            str(b.row_counts),
            f"{b.median_error * 100:+.0f}%",
            f"{b.worst_error * 100:+.0f}%",
            "fitted" if fitted else ("matches" if b.matches else "does not match"),
        ]
        for b in bands
    ]
    title = (
        f"{name}: T(r) / T({reference_rows}) of Llama-2-7B's four weight GEMMs in fp16, predicted against measured "
        f"[{sources.index(source) + 1}]"
    )
    headers = ["<rows", "row counts", "median error", "worst", "<state"]
    click.echo(text_table(headers, rows, title=title), nl=False)
    click.echo(
        "its row curve was fitted to these timings: they show the fit, not a check"
        if fitted
        else f"a band matches when its median error is within ±{GEMM_TOLERANCE * 100:.0f}%"
    )


@click.command("published")
@click.option(
    "--hardware",
    "hardware",
    default=None,
    metavar="NAME",
    help="A built-in profile with published measurements [default: every one that has them].",
)
def hw_published(hardware) -> None:
    """Public step times of optimised engines and GEMM timings beside what the built-in profiles
    predict."""
    names = sorted({m.hardware for m in PUBLISHED_STEPS} | {g.hardware for g in published_gemms()})
    if hardware is not None:
        # built-in names only: a profile file is the user's own, whatever name it carries
        name = hardware_aliases().get(hardware.lower(), hardware.lower())
        if name not in names:
            raise UserError(
                f"--hardware: no published measurements for {hardware} (there are some for {', '.join(names)})"
            )
        names = [name]
    sources = []
    for name in names:
        click.echo(f"== {name}: knee {knee_verdict(name)}")
        _echo_published_steps(name, sources)
        _echo_published_gemms(name, sources)
        click.echo("")
    if hardware is None:
        _echo_preset_sources()
    for i, source in enumerate(sources, 1):
        click.echo(f"[{i}] {source}")


def _echo_preset_sources() -> None:
    """Which published speculative steps each engine preset was fitted on and which were held out."""
    click.echo("== engine presets: published speculative steps (roofline/data/published_speculative_steps.json)")
    for p in load_presets().values():
        if p.family == "ideal":
            continue
        tree = p.hows.get("tree_verify_layer_s")
        tree_line = f"  tree_verify_layer_s {_preset_value(p, 'tree_verify_layer_s')}: {tree}" if tree else ""
        if p.carried_from:
            own = f" (but {', '.join(p.own_terms)})" if p.own_terms else ""
            click.echo(f"{p.family}: no fit of its own{own}; the {p.carried_from} preset's terms, ranges widened.")
            for line in p.not_known:  # what was published and held out
                click.echo(f"  {line}")
            for term in p.own_terms:
                click.echo(f"  {term} {_preset_value(p, term)}: {p.hows[term]}")
            if tree_line and "tree_verify_layer_s" not in p.own_terms:
                click.echo(tree_line)
            continue
        if not p.measured:
            click.echo(f"{p.family}: no published measurement; ideal terms. {p.not_known[0]}")
            continue
        click.echo(f"{p.family}: {p.source_text()}")
        click.echo(f"  fitted on {p.fit_rows}; held out: {p.held_out}")
        if tree_line:
            click.echo(tree_line)
    click.echo(
        "Held-out T(n)/T(0) errors of each preset beside the ideal engine: python benchmarks/bench_published_steps.py "
        "(docs/performance-model.md#engine-presets)."
    )
    click.echo("")


@click.command("fit")
@apply(MODEL_OPTIONS)
@click.option(
    "--hardware",
    "hardware",
    required=True,
    metavar="NAME|PROFILE.json",
    help="The base profile whose roofs are kept: the GPU's built-in name, or a profile JSON.",
)
@click.option(
    "--measurements",
    required=True,
    multiple=True,
    metavar="FILE",
    help="Measured step times, repeatable (the steps are joined): a CSV with columns batch, context, tokens, "
    "step_ms [, candidates, draft_stages, tree] (docs/performance-model.md#fitting-a-profile-to-measured-steps), or an "
    "engine's benchmark output: SGLang sglang.benchmark.one_batch JSONL, vLLM latency JSON, trtllm-bench report JSON "
    "(docs/performance-model.md#engine-benchmark-files).",
)
@click.option(
    "--batch",
    type=AtLeast(1),
    default=None,
    metavar="B",
    help="Sequences decoding together, for a file that does not record it (vLLM latency JSON: the run's "
    "--batch-size; trtllm-bench throughput report).",
)
@click.option(
    "--input-len",
    "input_len",
    type=AtLeast(0),
    default=None,
    metavar="S",
    help="Prompt tokens per sequence, for a vLLM latency JSON (the run's --input-len).",
)
@click.option(
    "--output-len",
    "output_len",
    type=AtLeast(1),
    default=None,
    metavar="N",
    help="Generated tokens per sequence, for a vLLM latency JSON (the run's --output-len).",
)
@click.option(
    "--tokens",
    type=AtLeast(1),
    default=None,
    metavar="Q",
    help="Tokens verified per sequence per step, root included, for a speculative trtllm-bench report "
    "(draft tokens + 1), which does not record it. Files that record it, or are plain decoding, need none "
    "[default: 1 = plain decoding].",
)
@OLD_HEADS_OPTION
@click.option(
    "--num-heads",
    "num_heads",
    type=AtLeast(0, MAX_HEADS),
    default=0,
    show_default=True,
    metavar="K",
    help="Draft heads whose operators the prediction of a speculative step includes (0: the drafting "
    "cost is left to the fitted engine terms). Use the same value wherever the profile is used.",
)
@click.option("--head-layers", type=AtLeast(0, MAX_HEAD_LAYERS), default=None, help="ResBlocks per head [default: 1].")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True)
@click.option("--name", default=None, help="Profile name [default: BASE-fitted].")
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write.")
def hw_fit(
    model,
    dtype,
    hardware,
    measurements,
    batch,
    input_len,
    output_len,
    tokens,
    num_heads,
    head_layers,
    attention,
    name,
    out,
) -> None:
    """Fit a hardware profile's engine terms to measured step times of any engine."""
    check_outputs([out], input_files(model, hardware, *measurements))
    for path in measurements:
        require_file(path, "--measurements")
    result = api.fit_profile(
        model,
        hardware,
        list(measurements),
        heads=num_heads,
        head_layers=head_layers,
        attention=attention,
        name=name,
        dtype=dtype,
        batch=batch,
        input_len=input_len,
        output_len=output_len,
        tokens=tokens,
    )
    points, fit = result.points, result.profile.calibration["fit"]
    result.profile.save(out)
    click.echo(f"fitted {len(points)} steps of {fit['model']} over {fit['base']}; free terms: {', '.join(result.free)}")
    rows = []
    for k, v in result.values().items():
        lo, hi = result.intervals[k]
        span = f"{lo * 1e3:.3g}-{hi * 1e3:.3g} ms" if k.endswith("_s") else f"{lo:.3g}-{hi:.3g}"
        rows.append([k, _term_text(k, v), span, _status_text(result, k)])
    click.echo(text_table(["<term", "<value", "<95% interval", "<status"], rows), nl=False)
    click.echo(
        "determined: the rows narrowed the prior to under half its width; prior: they did not (or cannot see "
        "the term: not fitted); at bound: held at the edge of its physical range"
    )
    click.echo(
        f"tree_verify_layer_s stays the base's {_term_text('tree_verify_layer_s', result.profile.tree_verify_layer_s)}"
        f" (not fitted); the {int(points.tree_verify.sum())} rows marked tree pay it per layer"
    )
    click.echo(f"in-sample: {error_summary(result.in_sample_error)}")
    if result.loo_error is not None:
        click.echo(f"leave-one-out: {error_summary(result.loo_error)}")
        worst = int(np.argmax(np.abs(result.loo_error)))
        click.echo(
            f"worst row (leave-one-out): batch {int(points.batch[worst])}, "
            f"context {int(points.context[worst])}, tokens {int(points.tokens[worst])}: "
            f"{result.loo_error[worst] * 100:+.1f}%"
        )
    click.echo(f"wrote profile {out} (use it as --hardware {out})")


def _term_text(name: str, value: float) -> str:
    return term_text(name, value)


def _status_text(result, name: str) -> str:
    """A term's status, with which bound holds it or that it was not fitted."""
    status, prior = result.status[name], result.priors[name]
    if status == "at bound":
        edge = prior.lower if result.values()[name] <= prior.lower else prior.upper
        return f"at bound ({'lower' if edge == prior.lower else 'upper'}, {_term_text(name, edge)})"
    if name not in result.free:
        return f"{status} (not fitted)"
    return status
