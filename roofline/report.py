"""`treeopt report`: a directory with the roofline chart, the speedup curves, the best-tree
heatmaps, the grid CSV, the selection JSON and an index.md that states inputs and assumptions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from roofline.grid import draft_rows_by_prefix, heads_used_by_prefix, speedup_grid
from roofline.hardware import GB, GIB, HardwareProfile, builtin_hardware
from roofline.latency import memory_required_bytes, op_timings, step_time_s
from roofline.ops import DraftWork
from roofline.plots import best_heatmaps, default_cases, overhead_curves, roofline_chart, speedup_curves
from roofline.published import knee_summary
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt import __version__
from treeopt.drafter_cost import DraftCost
from treeopt.engines import export_for
from treeopt.errors import UserError
from treeopt.family_build import drafted_sizes
from treeopt.fileio import atomic_path, write_json, write_text
from treeopt.selection import best_per_cell, selection_from_grid

__all__ = ["build_report"]


def _fmt_s(t: float) -> str:
    if not np.isfinite(t):
        return "n/a"
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} µs"


def _kv_curve_text(hw: HardwareProfile) -> str:
    curve = hw.attention_kv_efficiency
    if curve is None:
        return "1 (the streaming rate)"
    return ", ".join(f"{int(r)} keys: {v:.2f}" for r, v in zip(curve.rows, curve.values, strict=True))


def _hardware_section(hw: HardwareProfile, dtype: str) -> list[str]:
    unit, scale = ("TFLOP/s", 1e12) if max(hw.peak_flops.values()) >= 1e12 else ("GFLOP/s", 1e9)
    peaks = ", ".join(f"{k} {v / scale:.4g}" for k, v in sorted(hw.peak_flops.items()))
    lines = [
        f"- **Hardware** `{hw.name}`: {hw.description or ''}",
        "",
        "  | quantity | value |",
        "  |---|---|",
        f"  | peak matrix throughput ({unit}) | {peaks} (this report uses {dtype}: {hw.peak(dtype) / scale:.3g}) |",
        f"  | memory bandwidth | {hw.bandwidth_bytes_per_s / GB:.4g} GB/s |",
        f"  | memory capacity | {hw.capacity_text()} |",
        f"  | attained fraction of peak FLOP/s for large GEMMs (η_c) | {hw.eta_compute:.3g} |",
        f"  | attained fraction of bandwidth (η_m) | {hw.eta_memory:.3g} |",
        "  | GEMM efficiency by rows b·q (× η_c) | "
        + ", ".join(
            f"{int(r)}: {v:.2f}" for r, v in zip(hw.gemm_efficiency.rows, hw.gemm_efficiency.values, strict=True)
        )
        + " |",
        f"  | kernel overhead | {_fmt_s(hw.kernel_overhead_s)} per kernel |",
        f"  | framework overhead | {_fmt_s(hw.forward_overhead_s)} per forward + {_fmt_s(hw.layer_overhead_s)} per "
        f"layer + {_fmt_s(hw.head_overhead_s)} per draft head; per layer {hw.token_overhead_s * 1e6:.3g} µs per token "
        f"row and {hw.context_overhead_s * 1e9:.3g} ns per cached token ({hw.plain_context_overhead_s * 1e9:.3g} ns in "
        "plain decoding) |",
        f"  | engine terms of a speculative step | {_fmt_s(hw.spec_step_overhead_s)} per step + "
        f"{_fmt_s(hw.verified_token_s)} per verified token + {_fmt_s(hw.draft_stage_s)} per sequential draft stage |",
        f"  | attention's KV bandwidth (× bandwidth · η_m) | {_kv_curve_text(hw)} |",
        f"  | elementwise throughput | {hw.elementwise_rate / GB:.4g} GB/s |",
        f"  | KV-cache update | {hw.kv_cache_update} |",
        "",
        f"  Source: {hw.source}.",
    ]
    cal = hw.calibration or {}
    if cal:
        lines += [
            "",
            f"  Calibrated {cal.get('date', '?')} on {cal.get('device', '?')} with torch "
            f"{cal.get('torch', '?')}, "
            f"{cal.get('framework', '')}, {cal.get('threads')} thread(s), dtype {cal.get('dtype')}, "
            f"for model `{cal.get('model')}`, in {cal.get('seconds')} s (load average at the end: "
            f"{cal.get('load_average')}).",
        ]
        for note in cal.get("notes", []):
            lines.append(f"  Note: {note}.")
        val = cal.get("validation") or []
        if val:
            lines += [
                "",
                "  Validation of this profile against full transformers forward passes of the calibrated "
                "model (median of interleaved rounds):",
                "",
                "  | b | q | s | measured | predicted | error | T(q)/T(1) measured | predicted |",
                "  |---|---|---|---|---|---|---|---|",
            ]
            for v in val:
                rm = f"{v['ratio_measured']:.2f}" if "ratio_measured" in v else ""
                rp = f"{v['ratio_predicted']:.2f}" if "ratio_predicted" in v else ""
                lines.append(
                    f"  | {v['batch']} | {v['tokens']} | {v['context']} | {_fmt_s(v['measured_s'])} | "
                    f"{_fmt_s(v['predicted_s'])} | {v['error'] * 100:+.0f}% | {rm} | {rp} |"
                )
    return lines


def _knee_sentence(hw: HardwareProfile) -> str:
    """Where this profile's GEMM row curve was checked (docs/performance-model.md, "Where the
    knee was checked")."""
    if builtin_hardware().get(hw.name) == hw:
        return (
            f"This report's profile `{hw.name}`: {hw.gemm_efficiency_source}; verdict on its knee against public "
            f'measurements: {knee_summary(hw.name)} (`treeopt hw published`, docs/performance-model.md, "Where the '
            'knee was checked").'
        )
    where = hw.gemm_efficiency_source or (
        "fitted or calibrated on the machine it describes" if hw.calibration else "as given in the profile file"
    )
    return f"This report's profile `{hw.name}` is not a built-in one; its row curve: {where}."


def _engine_sentence(hw: HardwareProfile) -> str:
    """Which serving engine the profile describes (docs/performance-model.md "Which engine a
    profile describes")."""
    fit = (hw.calibration or {}).get("fit")
    if fit:
        return (
            f"this profile was fitted to measured step times ({fit.get('source') or 'a measurements CSV'}, "
            f"{fit.get('rows')} steps) over `{fit.get('base')}`, so it describes the engine that produced them."
        )
    if hw.calibration:
        return (
            "this profile was calibrated with `treeopt hw calibrate`: it describes treeopt's reference decoder "
            "(eager PyTorch and transformers) on the machine named above."
        )
    return (
        "this built-in profile describes an ideal engine on this GPU: fused kernels replayed as CUDA graphs, tree "
        "attention, and no cost beyond the forward pass (no fixed cost per speculative step, none per verified "
        "token). Production engines pay both, which makes the best tree smaller; fit a profile to your engine's "
        "step times with `treeopt hw fit` before relying on the tree sizes."
    )


def build_report(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    hw: HardwareProfile,
    out_dir,
    *,
    accuracy=None,
    accuracy_label: str = "",
    batches=(1, 2, 4, 8, 16, 32, 64),
    contexts=(128, 256, 512, 1024, 2048, 4096, 8192),
    max_nodes: int = 64,
    attention: str = "fused",
    plot_context: int | None = None,
    command: str = "",
    title: str | None = None,
    save_hardware: bool = False,
    joint: bool = False,
    used_heads: bool = False,
    notes: list[str] | tuple = (),
    proposal=None,
    tau=None,
    tau_source: str | None = None,
    engine=None,
    verification: str = "tree",
    sequential_draft: bool = False,
    draft_cost: DraftCost | None = None,
) -> dict:
    """Write the report into out_dir; returns a summary dict (paths, best cells).

    With `accuracy`, `proposal` (a proposal sequence) and `tau` (its tau curve) are the trees
    the grid predicts for; `tau_source` says what they are. With `engine` (a treeopt.engines.Engine)
    index.md gives each cell's tree as the line that engine takes. With a sequential
    `draft_cost` (Hydra heads, an MLP speculator) the grid charges its stages depth by depth on
    each tree's nodes (docs/performance-model.md, "Drafter cost") instead of `heads`; the chart
    and the configuration table show it on a chain of one node per depth."""
    out = Path(out_dir)
    sequential = draft_cost is not None and draft_cost.sequential
    chart_heads = DraftWork(draft_cost, np.ones(draft_cost.stages)) if sequential else heads
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    title = title or f"{shape.name} with {heads.num_heads if heads else 0} draft heads on {hw.name}"
    ctx_list = sorted(int(c) for c in contexts)
    if plot_context is None:
        plot_context = min(ctx_list, key=lambda c: abs(np.log2(max(c, 1)) - 10))
    # 1. roofline chart
    cases = default_cases(
        context=plot_context,
        prompt=512,
        decode_batch=32 if 32 in batches else max(batches),
        tree_batch=16 if 16 in batches else max(batches),
    )
    pts = roofline_chart(
        shape,
        chart_heads,
        hw,
        out / "roofline.png",
        cases=cases,
        attention=attention,
        title=f"Roofline: {shape.name} ({shape.dtype}) on {hw.name}",
    )
    files["roofline"] = "roofline.png"

    summary: dict = {"files": files}
    tree, tau = proposal, (None if tau is None else np.asarray(tau, dtype=float))
    if accuracy is not None and (tree is None or tau is None):
        raise UserError("report: an accuracy table needs the proposal sequence and its tau")
    if accuracy is not None:
        grid_heads = (
            DraftWork(draft_cost, draft_rows_by_prefix(tree.prefix(len(tau) - 1), draft_cost.stages))
            if sequential
            else heads
        )
        grid = speedup_grid(
            shape,
            grid_heads,
            hw,
            tau,
            batches,
            ctx_list,
            attention=attention,
            heads_used=heads_used_by_prefix(tree) if used_heads and not sequential else None,
            verification=verification,
            tree=tree,
            draft_stages=heads_used_by_prefix(tree) if sequential_draft and not sequential else None,
            drafted=drafted_sizes(tree, engine) if engine is not None and engine.family == "uniform" else None,
        )
        best = best_per_cell(grid)
        with atomic_path(out / "grid.csv") as tmp:
            grid.to_csv(tmp, index=False, float_format="%.6g")
        files["grid"] = "grid.csv"
        sel = selection_from_grid(
            grid,
            tree,
            hw.name,
            shape.name,
            extra={"heads": heads.num_heads if heads else 0, "attention": attention, "verification": verification},
        )
        write_json(out / "selection.json", sel)
        files["selection"] = "selection.json"
        speedup_curves(
            grid,
            out / "speedup.png",
            context=plot_context,
            title=f"Predicted speedup against tree size: {shape.name}, {hw.name}, context {plot_context}",
        )
        files["speedup"] = "speedup.png"
        best_heatmaps(best, out / "best.png", title=f"Best tree per batch and context: {shape.name} on {hw.name}")
        files["best"] = "best.png"
        summary["best"] = best
    else:
        overhead_curves(
            shape,
            heads,
            hw,
            out / "overhead.png",
            batches=batches,
            context=plot_context,
            max_nodes=max_nodes,
            attention=attention,
        )
        files["overhead"] = "overhead.png"
    if save_hardware:
        hw.save(out / "hardware.json")
        files["hardware"] = "hardware.json"

    # index.md ---------------------------------------------------------------------------
    L = [f"# {title}", ""]
    if command:
        L += ["Regenerate with:", "", "```", command, "```", ""]
    L += [
        f"Written by treeopt {__version__}. Every number here is a prediction of the roofline latency "
        "model (`roofline/`), not a measurement.",
        "",
        "## Inputs",
        "",
    ]
    L.append(f"- **Model** {shape.describe()}. Source: {shape.source}.")
    if sequential:
        L.append(
            f"- **Drafter**: {draft_cost.describe()} ({draft_cost.params / 1e6:.1f} M parameters); each "
            "stage runs on the nodes of the depth above that have children, plus the profile's cost per "
            "sequential draft stage."
        )
    elif heads is not None and heads.num_heads > 0:
        L.append(
            f"- **Draft heads**: {heads.describe()} ({heads.params / 1e6:.0f} M parameters, "
            f"{heads.params * shape.dtype_bytes / GB:.2f} GB)."
        )
    else:
        L.append("- **Draft heads**: none.")
    L += _hardware_section(hw, shape.dtype)
    if accuracy is not None:
        sizes = [n for n in (0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128) if n < len(tau)]
        what = tau_source or (
            f"Medusa's greedy proposal sequence of {len(tau) - 1} nodes built from it; "
            "expected tokens per step τ of its prefixes "
            f"({'joint statistics' if joint else 'independent heads, docs/statistics.md'})"
        )
        L += [
            "",
            f"- **Accuracy table**: {accuracy_label}. {what}:",
            "",
            "  | n | " + " | ".join(str(n) for n in sizes) + " |",
            "  |---|" + "---|" * len(sizes),
            "  | τ | " + " | ".join(f"{tau[n]:.3f}" for n in sizes) + " |",
        ]
    L += [
        "",
        f"- **Grid**: batch {', '.join(map(str, batches))}; context (cached tokens) "
        f"{', '.join(map(str, ctx_list))}; tree sizes 0..{max_nodes}; attention {attention}; verification "
        f"{verification}.",
        "",
    ]
    L += [
        "## Assumptions",
        "",
        f"- **Engine**: {_engine_sentence(hw)}",
        "- Step time = framework overhead (per forward, per layer, per token row and cached token) + Σ over "
        "operators of max(FLOPs / compute rate, bytes / memory rate) + kernels × kernel overhead + the engine "
        "terms of a speculative step (a fixed cost per step, a cost per verified token and per sequential draft "
        'stage). Operators and their FLOPs and minimum bytes follow docs/performance-model.md, "Operators" '
        "(Medusa paper Appendix G, Table 5), plus norms, rotary, residuals, the activation and the KV-cache write.",
        "- Verification: "
        + (
            "a tree of n nodes is verified as q = n + 1 tokens per sequence under a tree mask, "
            "reading each sequence's KV cache once."
            if verification == "tree"
            else "a tree of n nodes is verified as its root-to-leaf paths, each a separate sequence "
            "of its depth + 1 tokens that re-reads the context (batch expansion, no tree "
            "attention)."
        ),
        "- GEMM compute rate = peak × η_c × efficiency(rows = b·q); attention matmuls use the attention "
        "efficiency by query rows per KV head; vector work runs at the fp32 (non-tensor) rate.",
        "- Built-in GPU profiles: η_m = 0.78 (the middle of the 77–80% of peak bandwidth that single-token "
        "decode reaches on A100, H100 and A40), η_c = 0.74 (the middle of the 71–76% large GEMMs reach), "
        "3 µs per kernel, no framework overhead (an engine replaying CUDA graphs). The GEMM row curve is "
        "the die's: the A100's is fitted so that Vicuna-7B on an A100-80GB-SXM reproduces the measured "
        "skinny-GEMM cost (flat to ~64 tokens, 1.27× the one-token step at 96, 1.9× at 256); the GH100's and "
        "the GA102's are fitted to public GEMM timings on an H100-SXM and an A40 (docs/performance-model.md, "
        '"GEMM row efficiency"). ' + _knee_sentence(hw),
        "- Plain decoding (n = 0) runs the base model alone (q = 1, no heads); a tree of n nodes verifies "
        "q = n + 1 tokens per sequence and runs "
        + ("the heads its depth needs" if used_heads else "all draft heads")
        + " on "
        + (
            "all of them"
            if heads is None or heads.tokens_per_sequence is None
            else f"{heads.tokens_per_sequence} of them per sequence"
        )
        + ". The q new tokens attend to s + q keys.",
        "- τ assumes greedy verification; speedup = τ / overhead; the best tree per cell is the smallest "
        'size of largest speedup, and "none" (n = 0) when no tree beats 1.0.',
        "- Memory: weights + heads + KV cache of b·(s + q) tokens + the largest activation must fit in the "
        f"capacity, {hw.capacity_text()}; cells that do not are marked OOM, not predicted.",
        "",
    ]

    if notes:
        L += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    L += [
        "## Roofline",
        "",
        "![roofline chart](roofline.png)",
        "",
        "Attained FLOP/s of every operator (one marker per operator, colour = configuration) against its "
        "operational intensity; solid: peak roofs, dashed: attained roofs (η-scaled). Operators with no "
        "FLOPs (embedding gather, KV-cache write) are not drawn.",
        "",
    ]
    above = sorted(set(pts.loc[pts["attained_flops"] > hw.peak(shape.dtype) * 1.001, "name"])) if len(pts) else []
    if above:
        L += [
            f"Above the {shape.dtype} matrix roof: {', '.join(above)}. Their calibrated efficiency exceeds 1: "
            "the kernel computes in another precision than the roof's (CPU attention on bf16 inputs runs in "
            "fp32), so the roof does not bind them.",
            "",
        ]
    L += [
        "Predicted step time per configuration:",
        "",
        "| configuration | step time | memory needed |",
        "|---|---|---|",
    ]
    for c in cases:
        hd = chart_heads if c.heads else None
        t = step_time_s(shape, hd, hw, batch=c.batch, tokens=c.tokens, context=c.context, attention=attention)
        need = float(
            memory_required_bytes(shape, hd, batch=c.batch, tokens=c.tokens, context=c.context, attention=attention)
        )
        L.append(
            f"| {c.label}{' (+ heads)' if hd else ''} | {_fmt_s(t) if np.isfinite(t) else 'OOM'} | "
            f"{need / GIB:.1f} GiB |"
        )
    dec = op_timings(shape, None, hw, batch=1, tokens=1, context=plot_context, attention=attention)
    tot = sum(float(t.total_s) for t in dec)
    L += [
        "",
        f"Where plain decoding (b = 1, s = {plot_context}) spends its time: "
        + ", ".join(
            f"{t.op.name} {float(t.total_s) / tot * 100:.0f}%" for t in sorted(dec, key=lambda t: -float(t.total_s))[:6]
        )
        + " (of the operator time).",
        "",
    ]

    if accuracy is not None:
        best = summary["best"]
        L += [
            "## Speedup against tree size",
            "",
            "![speedup against tree size](speedup.png)",
            "",
            f"Top: predicted speedup τ(n) / overhead(n) at context {plot_context}, one curve per batch size; "
            "the star marks the best tree size. Bottom: the overhead T(n) / T(0).",
            "",
            "## Best tree per batch and context",
            "",
            "![best tree heatmaps](best.png)",
            "",
            "Best tree size (nodes) and predicted speedup per cell:",
            "",
            "| batch \\ context | " + " | ".join(str(c) for c in ctx_list) + " |",
            "|---|" + "---|" * len(ctx_list),
        ]
        for b in sorted(best["batch"].unique()):
            cells = []
            for c in ctx_list:
                r = best[(best["batch"] == b) & (best["context"] == c)].iloc[0]
                if not r["fits_memory"]:
                    cells.append("OOM")
                elif r["nodes"] == 0:
                    cells.append("none")
                else:
                    cells.append(f"{int(r['nodes'])} ({r['speedup']:.2f}×)")
            L.append(f"| {b} | " + " | ".join(cells) + " |")
        if engine is not None:
            L += ["", *engine_lines(engine, tree, best, heads.num_heads if heads else None, accuracy)]
        L += [
            "",
            "`selection.json` (format `treeopt.selection/v1`) holds the medusa_choices of every cell; "
            "`grid.csv` every (batch, context, tree size) with τ, step time, overhead and speedup.",
            "",
        ]
    else:
        L += [
            "## Overhead against tree size",
            "",
            "![overhead against tree size](overhead.png)",
            "",
            "No accuracy table was given, so there is no τ and no speedup: this is the predicted step-time "
            f"overhead T(n)/T(0) at context {plot_context}.",
            "",
        ]
    if save_hardware:
        L += ["The hardware profile used is `hardware.json`.", ""]
    write_text(out / "index.md", "\n".join(L))
    files["index"] = "index.md"
    return summary


def engine_lines(engine, proposal, best, num_heads, accuracy) -> list[str]:
    """Markdown: per (batch, context) of `best` the chosen prefix of `proposal` as the line
    `engine` takes (docs/engines.md "Exports")."""
    L = [f"Paste-ready for {engine.title}, per cell:", "", "| batch | context | nodes | line |", "|---|---|---|---|"]
    for b, c, n, fits in best[["batch", "context", "nodes", "fits_memory"]].itertuples(index=False):
        if not fits or n == 0:
            line = "OOM" if not fits else "no speculation"
        else:
            line = (
                "`"
                + export_for(engine, proposal.prefix(int(n)), heads=num_heads, accuracy=accuracy.accuracy).line
                + "`"
            )
        L.append(f"| {int(b)} | {int(c)} | {int(n)} | {line} |")
    return L
