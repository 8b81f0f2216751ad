"""`treeopt report`: a directory with the roofline chart, the speedup curves, the best-tree
heatmaps, the grid CSV, the selection JSON and an index.md that states inputs and assumptions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.engine_presets import builtin_base, load_presets
from roofline.grid import PerTreeSize, draft_rows_by_prefix, heads_used_by_prefix, speedup_grid
from roofline.hardware import GB, GIB, HardwareProfile
from roofline.latency import memory_required_bytes, op_timings, step_time_s
from roofline.ops import DraftWork
from roofline.plots import (
    RooflineCase,
    best_heatmaps,
    default_cases,
    overhead_curves,
    roofline_chart,
    roofline_points,
    speedup_curves,
)
from roofline.published import knee_summary
from roofline.published_checks import close_call_section
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt.accuracy import AccuracyTable
from treeopt.drafter_cost import DraftCost
from treeopt.engines import Engine, export_for
from treeopt.errors import UserError
from treeopt.family_build import drafted_sizes
from treeopt.fileio import atomic_path, write_text
from treeopt.selection import best_per_cell, selection_from_grid
from treeopt.selection_types import Selection, write_selection
from treeopt.tree import Tree
from treeopt.version import __version__

__all__ = ["ReportRequest", "ReportResults", "build_report", "compute_report", "write_report"]


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
        f"{_fmt_s(hw.verified_token_s)} per verified token + {_fmt_s(hw.draft_stage_s)} per sequential draft stage + "
        f"{_fmt_s(hw.tree_verify_layer_s)} per target layer of a branching tree |",
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
    """Where this profile's GEMM row curve was checked (docs/performance-model.md#where-the-knee-was-checked)."""
    if builtin_base(hw) is not None:  # a built-in, with or without an engine preset's terms
        return (
            f"This report's profile `{hw.name}`: {hw.gemm_efficiency_source}; verdict on its knee against public "
            f"measurements: {knee_summary(hw.name)} (`treeopt hw published`, "
            "docs/performance-model.md#where-the-knee-was-checked)."
        )
    where = hw.gemm_efficiency_source or (
        "fitted or calibrated on the machine it describes" if hw.calibration else "as given in the profile file"
    )
    return f"This report's profile `{hw.name}` is not a built-in one; its row curve: {where}."


def _engine_sentence(hw: HardwareProfile, family: str | None = None) -> str:
    """Which serving engine the profile describes (docs/performance-model.md#which-engine-a-profile-describes);
    `family`: the engine preset whose terms a built-in profile carries (docs/performance-model.md#engine-presets)."""
    preset = load_presets().get(family) if family else None
    if preset is not None and preset.carried_from:
        return (
            f"this built-in profile carries the {preset.family} engine preset ({preset.title}): no published step "
            f"of it fits the step terms, so it carries the {preset.carried_from} preset's terms with wider ranges"
            + (f" (its {', '.join(preset.own_terms)} are its own)" if preset.own_terms else "")
            + f" ({preset.source_text()}); the GPU's roofs are the datasheet's. The terms and their ranges are in "
            "roofline/data/engine_presets.json."
        )
    if preset is not None and preset.measured:
        return (
            f"this built-in profile carries the {preset.family} engine preset ({preset.title}): its cost per "
            f"forward and per speculative step were fitted to published steps ({preset.source_text()}; fitted on "
            f"{preset.fit_rows}), the GPU's roofs are the datasheet's. The terms and their ranges are in "
            "roofline/data/engine_presets.json."
        )
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


@dataclass(frozen=True)
class ReportRequest:
    """What a report predicts and how it presents it.

    `shape`, `heads` and `hw`: the model, its Medusa draft heads (None: none) and the hardware
    profile. With `accuracy`, `proposal` (a proposal sequence) and `tau` (its tau curve) are the
    trees the grid predicts for; `tau_source` says what they are (default: Medusa's greedy
    sequence, `joint` statistics or independent heads). With `engine` (a treeopt.engines.Engine)
    index.md gives each cell's tree as the line that engine takes. With a sequential
    `draft_cost` (Hydra heads, an MLP speculator) the grid charges its stages depth by depth on
    each tree's nodes (docs/performance-model.md#drafter-cost) instead of `heads`; the chart
    and the configuration table show it on a chain of one node per depth. `used_heads`: a tree
    runs only the heads its depth reaches; `sequential_draft`: it pays the profile's cost per
    draft stage once per depth. `plot_context`: the context of the curves (None: the one
    nearest 1024); `command`, `title`, `notes`: for index.md; `save_hardware`: write the
    profile beside the report. `step_costs`: the line naming the engine preset that priced the
    steps and `engine_costs` its family (`roofline.engine_presets.step_costs`; "" / None: not
    stated, as in the main job's prediction of its calibrated profile)."""

    shape: ModelShape
    heads: DraftHeadsShape | None
    hw: HardwareProfile
    accuracy: AccuracyTable | None = None
    accuracy_label: str = ""
    proposal: Tree | None = None
    tau: Sequence[float] | np.ndarray | None = None
    tau_source: str | None = None
    joint: bool = False
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)
    contexts: Sequence[int] = (128, 256, 512, 1024, 2048, 4096, 8192)
    max_nodes: int = 64
    attention: str = "fused"
    verification: str = "tree"
    used_heads: bool = False
    sequential_draft: bool = False
    draft_cost: DraftCost | None = None
    engine: Engine | None = None
    plot_context: int | None = None
    title: str | None = None
    command: str = ""
    notes: Sequence[str] = ()
    save_hardware: bool = False
    step_costs: str = ""
    engine_costs: str | None = None

    @property
    def sequential(self) -> bool:
        return self.draft_cost is not None and self.draft_cost.sequential


@dataclass(frozen=True, eq=False)
class ConfigurationStep:
    """The predicted step of one roofline configuration: its `case`, the drafter it runs with
    (None: the base model alone), the step time (s; inf when it does not fit) and the memory it
    needs (bytes)."""

    case: RooflineCase
    drafter: DraftHeadsShape | DraftWork | None
    step_s: float
    memory_bytes: float


@dataclass(frozen=True, eq=False)
class ReportResults:
    """What a report shows, computed from its `ReportRequest` (`compute_report`).

    `title`; `contexts` (sorted) and `plot_context`; the roofline `cases`, the drafter the chart
    charges (`chart_heads`), the chart's `points` (`roofline.plots.roofline_points`) and each
    case's predicted step (`steps`); `decode_shares`: plain decoding's operators and their share
    of its operator time, largest first. With an accuracy table: `tau`, the speedup `grid`, its
    `best` tree per cell and the `selection` (written as `treeopt.selection/v1`)."""

    title: str
    contexts: list[int]
    plot_context: int
    cases: list[RooflineCase]
    chart_heads: DraftHeadsShape | DraftWork | None
    points: pd.DataFrame
    steps: list[ConfigurationStep]
    decode_shares: list[tuple[str, float]]
    tau: np.ndarray | None = None
    grid: pd.DataFrame | None = None
    best: pd.DataFrame | None = None
    selection: Selection | None = None


def build_report(request: ReportRequest, out_dir) -> dict:
    """Write the report of `request` into out_dir; returns a summary dict (`files`: what was
    written, by kind; `best`: the best tree per cell, with an accuracy table)."""
    return write_report(request, compute_report(request), out_dir)


def compute_report(request: ReportRequest) -> ReportResults:
    """Every number of the report: the roofline points and configuration steps, and with an
    accuracy table the speedup grid, the best tree per cell and the selection."""
    r = request
    if r.accuracy is not None and (r.proposal is None or r.tau is None):
        raise UserError("report: an accuracy table needs the proposal sequence and its tau")
    title = r.title or f"{r.shape.name} with {r.heads.num_heads if r.heads else 0} draft heads on {r.hw.name}"
    ctx_list = sorted(int(c) for c in r.contexts)
    plot_context = r.plot_context
    if plot_context is None:
        plot_context = min(ctx_list, key=lambda c: abs(np.log2(max(c, 1)) - 10))
    cases = default_cases(
        context=plot_context,
        prompt=512,
        decode_batch=32 if 32 in r.batches else max(r.batches),
        tree_batch=16 if 16 in r.batches else max(r.batches),
    )
    chart_heads = DraftWork(r.draft_cost, np.ones(r.draft_cost.stages)) if r.sequential else r.heads
    results = ReportResults(
        title,
        ctx_list,
        plot_context,
        cases,
        chart_heads,
        roofline_points(r.shape, chart_heads, r.hw, cases, attention=r.attention),
        [_configuration_step(r, case, chart_heads) for case in cases],
        _decode_shares(r, plot_context),
    )
    if r.accuracy is None:
        return results
    tau = np.asarray(r.tau, dtype=float)
    grid = _speedup_grid(r, tau, ctx_list)
    selection = selection_from_grid(
        grid,
        r.proposal,
        r.hw.name,
        r.shape.name,
        provenance={
            "heads": r.heads.num_heads if r.heads else 0,
            "attention": r.attention,
            "verification": r.verification,
        },
    )
    # the model alone picks here: say where it cannot (docs/performance-model.md#close-calls)
    selection = replace(selection, close_calls=close_call_section(grid, r.proposal))
    return replace(results, tau=tau, grid=grid, best=best_per_cell(grid), selection=selection)


def _configuration_step(r: ReportRequest, case: RooflineCase, chart_heads) -> ConfigurationStep:
    hd = chart_heads if case.heads else None
    t = step_time_s(
        r.shape, hd, r.hw, batch=case.batch, tokens=case.tokens, context=case.context, attention=r.attention
    )
    need = float(
        memory_required_bytes(
            r.shape, hd, batch=case.batch, tokens=case.tokens, context=case.context, attention=r.attention
        )
    )
    return ConfigurationStep(case, hd, t, need)


def _decode_shares(r: ReportRequest, context: int) -> list[tuple[str, float]]:
    """Plain decoding's operators at batch 1 and their share of its operator time."""
    dec = op_timings(r.shape, None, r.hw, batch=1, tokens=1, context=context, attention=r.attention)
    tot = sum(float(t.total_s) for t in dec)
    return [(t.op.name, float(t.total_s) / tot) for t in sorted(dec, key=lambda t: -float(t.total_s))]


def _speedup_grid(r: ReportRequest, tau: np.ndarray, contexts: list[int]) -> pd.DataFrame:
    tree = r.proposal
    grid_heads = (
        DraftWork(r.draft_cost, draft_rows_by_prefix(tree.prefix(len(tau) - 1), r.draft_cost.stages))
        if r.sequential
        else r.heads
    )
    return speedup_grid(
        r.shape,
        grid_heads,
        r.hw,
        tau,
        r.batches,
        contexts,
        attention=r.attention,
        verification=r.verification,
        tree=tree,
        per_size=PerTreeSize(
            heads_used=heads_used_by_prefix(tree) if r.used_heads and not r.sequential else None,
            draft_stages=heads_used_by_prefix(tree) if r.sequential_draft and not r.sequential else None,
            drafted=drafted_sizes(tree, r.engine) if r.engine is not None and r.engine.family == "uniform" else None,
        ),
    )


def write_report(request: ReportRequest, results: ReportResults, out_dir) -> dict:
    """Write the report's files into out_dir: roofline.png; with an accuracy table grid.csv,
    selection.json, speedup.png and best.png, else overhead.png; hardware.json when asked;
    index.md. Returns the summary `build_report` returns."""
    r, res, out = request, results, Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    roofline_chart(
        res.points,
        r.shape,
        r.hw,
        out / "roofline.png",
        cases=res.cases,
        title=f"Roofline: {r.shape.name} ({r.shape.dtype}) on {r.hw.name}",
    )
    files["roofline"] = "roofline.png"
    summary: dict = {"files": files}
    if res.grid is not None:
        files.update(_write_speedup_files(r, res, out))
        summary["best"] = res.best
    else:
        overhead_curves(
            r.shape,
            r.heads,
            r.hw,
            out / "overhead.png",
            batches=r.batches,
            context=res.plot_context,
            max_nodes=r.max_nodes,
            attention=r.attention,
        )
        files["overhead"] = "overhead.png"
    if r.save_hardware:
        r.hw.save(out / "hardware.json")
        files["hardware"] = "hardware.json"
    write_text(out / "index.md", report_markdown(r, res))
    files["index"] = "index.md"
    return summary


def _write_speedup_files(r: ReportRequest, res: ReportResults, out: Path) -> dict:
    with atomic_path(out / "grid.csv") as tmp:
        res.grid.to_csv(tmp, index=False, float_format="%.6g")
    write_selection(out / "selection.json", res.selection)
    speedup_curves(
        res.grid,
        out / "speedup.png",
        context=res.plot_context,
        title=f"Predicted speedup against tree size: {r.shape.name}, {r.hw.name}, context {res.plot_context}",
    )
    best_heatmaps(res.best, out / "best.png", title=f"Best tree per batch and context: {r.shape.name} on {r.hw.name}")
    return {"grid": "grid.csv", "selection": "selection.json", "speedup": "speedup.png", "best": "best.png"}


def report_markdown(request: ReportRequest, results: ReportResults) -> str:
    """The report's index.md."""
    r, res = request, results
    L = _intro(r, res) + _assumptions(r)
    if r.notes:
        L += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    L += _roofline_section(r, res)
    L += _speedup_section(r, res) if res.grid is not None else _overhead_section(res)
    if r.save_hardware:
        L += ["The hardware profile used is `hardware.json`.", ""]
    return "\n".join(L)


def _intro(r: ReportRequest, res: ReportResults) -> list[str]:
    """Title, how to regenerate, and the inputs: model, drafter, hardware, accuracy, grid."""
    shape, heads = r.shape, r.heads
    L = [f"# {res.title}", ""]
    if r.command:
        L += ["Regenerate with:", "", "```", r.command, "```", ""]
    L += [
        f"Written by treeopt {__version__}. Every number here is a prediction of the roofline latency "
        "model (`roofline/`), not a measurement.",
        "",
        "## Inputs",
        "",
    ]
    L.append(f"- **Model** {shape.describe()}. Source: {shape.source}.")
    if r.sequential:
        L.append(
            f"- **Drafter**: {r.draft_cost.describe()} ({r.draft_cost.params / 1e6:.1f} M parameters); each "
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
    L += _hardware_section(r.hw, shape.dtype)
    if r.step_costs:
        L += [
            "",
            f"- **Step costs**: {r.step_costs.removeprefix('step costs: ')} "
            "(docs/performance-model.md#engine-presets).",
        ]
    if res.tau is not None:
        L += _accuracy_lines(r, res.tau)
    L += [
        "",
        f"- **Grid**: batch {', '.join(map(str, r.batches))}; context (cached tokens) "
        f"{', '.join(map(str, res.contexts))}; tree sizes 0..{r.max_nodes}; attention {r.attention}; verification "
        f"{r.verification}.",
        "",
    ]
    return L


def _accuracy_lines(r: ReportRequest, tau: np.ndarray) -> list[str]:
    sizes = [n for n in (0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128) if n < len(tau)]
    what = r.tau_source or (
        f"Medusa's greedy proposal sequence of {len(tau) - 1} nodes built from it; "
        "expected tokens per step τ of its prefixes "
        f"({'joint statistics' if r.joint else 'independent heads, docs/statistics.md'})"
    )
    return [
        "",
        f"- **Accuracy table**: {r.accuracy_label}. {what}:",
        "",
        "  | n | " + " | ".join(str(n) for n in sizes) + " |",
        "  |---|" + "---|" * len(sizes),
        "  | τ | " + " | ".join(f"{tau[n]:.3f}" for n in sizes) + " |",
    ]


def _assumptions(r: ReportRequest) -> list[str]:
    heads = r.heads
    return [
        "## Assumptions",
        "",
        f"- **Engine**: {_engine_sentence(r.hw, r.engine_costs)}",
        "- Step time = framework overhead (per forward, per layer, per token row and cached token) + Σ over "
        "operators of max(FLOPs / compute rate, bytes / memory rate) + kernels × kernel overhead + the engine "
        "terms of a speculative step (a fixed cost per step, a cost per verified token and per sequential draft "
        "stage). Operators and their FLOPs and minimum bytes follow docs/performance-model.md#operators "
        "(Medusa paper Appendix G, Table 5), plus norms, rotary, residuals, the activation and the KV-cache write.",
        "- Verification: "
        + (
            "a tree of n nodes is verified as q = n + 1 tokens per sequence under a tree mask, "
            "reading each sequence's KV cache once."
            if r.verification == "tree"
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
        "the GA102's are fitted to public GEMM timings on an H100-SXM and an A40 "
        "(docs/performance-model.md#gemm-row-efficiency). " + _knee_sentence(r.hw),
        "- Plain decoding (n = 0) runs the base model alone (q = 1, no heads); a tree of n nodes verifies "
        "q = n + 1 tokens per sequence and runs "
        + ("the heads its depth needs" if r.used_heads else "all draft heads")
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
        f"capacity, {r.hw.capacity_text()}; cells that do not are marked OOM, not predicted.",
        "",
    ]


def _roofline_section(r: ReportRequest, res: ReportResults) -> list[str]:
    """The chart, the operators above the matrix roof, each configuration's step and where
    plain decoding spends its time."""
    pts, dtype = res.points, r.shape.dtype
    L = [
        "## Roofline",
        "",
        "![roofline chart](roofline.png)",
        "",
        "Attained FLOP/s of every operator (one marker per operator, colour = configuration) against its "
        "operational intensity; solid: peak roofs, dashed: attained roofs (η-scaled). Operators with no "
        "FLOPs (embedding gather, KV-cache write) are not drawn.",
        "",
    ]
    above = sorted(set(pts.loc[pts["attained_flops"] > r.hw.peak(dtype) * 1.001, "name"])) if len(pts) else []
    if above:
        L += [
            f"Above the {dtype} matrix roof: {', '.join(above)}. Their calibrated efficiency exceeds 1: "
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
    for step in res.steps:
        L.append(
            f"| {step.case.label}{' (+ heads)' if step.drafter else ''} | "
            f"{_fmt_s(step.step_s) if np.isfinite(step.step_s) else 'OOM'} | {step.memory_bytes / GIB:.1f} GiB |"
        )
    L += [
        "",
        f"Where plain decoding (b = 1, s = {res.plot_context}) spends its time: "
        + ", ".join(f"{name} {share * 100:.0f}%" for name, share in res.decode_shares[:6])
        + " (of the operator time).",
        "",
    ]
    return L


def _speedup_section(r: ReportRequest, res: ReportResults) -> list[str]:
    """The speedup curves and the best tree per batch and context, as a table and as engine lines."""
    best, ctx_list = res.best, res.contexts
    L = [
        "## Speedup against tree size",
        "",
        "![speedup against tree size](speedup.png)",
        "",
        f"Top: predicted speedup τ(n) / overhead(n) at context {res.plot_context}, one curve per batch size; "
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
            row = best[(best["batch"] == b) & (best["context"] == c)].iloc[0]
            if not row["fits_memory"]:
                cells.append("OOM")
            elif row["nodes"] == 0:
                cells.append("none")
            else:
                cells.append(f"{int(row['nodes'])} ({row['speedup']:.2f}×)")
        L.append(f"| {b} | " + " | ".join(cells) + " |")
    if r.engine is not None:
        L += ["", *engine_lines(r.engine, r.proposal, best, r.heads.num_heads if r.heads else None, r.accuracy)]
    L += [
        "",
        "`selection.json` (format `treeopt.selection/v1`) holds the medusa_choices of every cell; "
        "`grid.csv` every (batch, context, tree size) with τ, step time, overhead and speedup.",
        "",
    ]
    return L


def _overhead_section(res: ReportResults) -> list[str]:
    return [
        "## Overhead against tree size",
        "",
        "![overhead against tree size](overhead.png)",
        "",
        "No accuracy table was given, so there is no τ and no speedup: this is the predicted step-time "
        f"overhead T(n)/T(0) at context {res.plot_context}.",
        "",
    ]


def engine_lines(engine, proposal, best, num_heads, accuracy) -> list[str]:
    """Markdown: per (batch, context) of `best` the chosen prefix of `proposal` as the line
    `engine` takes (docs/engines.md#exports)."""
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
