"""Report figures, drawn on matplotlib `Figure` objects (no pyplot state, no display needed).

- roofline_chart: attained FLOP/s against operational intensity, log-log, with the peak roofs
  and the attained (efficiency-scaled) roofs, one marker per operator for prefill, plain
  decoding and tree verification at several q, batch sizes and contexts (the style of the
  Medusa paper's Appendix G figures).
- speedup_curves: predicted speedup (and overhead) against tree size, one curve per batch.
- best_heatmaps: best tree size and its speedup over batch x context.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib
import matplotlib.colors
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from roofline.grid import speedup_grid
from roofline.hardware import HardwareProfile
from roofline.latency import op_timings
from roofline.shapes import DraftHeadsShape, ModelShape
from treeopt.fileio import atomic_path
from treeopt.selection_types import Selection

__all__ = [
    "RooflineCase",
    "default_cases",
    "roofline_chart",
    "roofline_points",
    "speedup_curves",
    "speedup_curves_figure",
    "best_heatmaps",
    "best_heatmaps_figure",
    "selection_heatmaps_figure",
    "measured_speedup_figure",
    "log2_axis",
    "plot_measured_speedup",
]


def log2_axis(ax, values) -> None:
    """A base-2 log x axis labelled with the plain numbers 1, 2, 4, ... (not 2^0, 2^1, ...)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    ax.set_xscale("log", base=2)
    if values.size:
        ticks = 2.0 ** np.arange(np.floor(np.log2(values.min())), np.ceil(np.log2(values.max())) + 1)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


@dataclass(frozen=True)
class RooflineCase:
    label: str
    batch: int
    tokens: int
    context: int
    heads: bool = True


def default_cases(
    context: int = 1024, prompt: int = 512, decode_batch: int = 32, tree_batch: int = 16
) -> list[RooflineCase]:
    """Prefill, plain decoding at batch 1 and `decode_batch`, tree verification at q = 16 and
    64 (batch 1) and q = 64 at `tree_batch`: six row counts b*q that do not coincide."""
    return [
        RooflineCase(f"prefill: b=1, q={prompt}, s=0", 1, prompt, 0, heads=False),
        RooflineCase(f"decode: b=1, q=1, s={context}", 1, 1, context, heads=False),
        RooflineCase(f"decode: b={decode_batch}, q=1, s={context}", decode_batch, 1, context, heads=False),
        RooflineCase(f"tree: b=1, q=16, s={context}", 1, 16, context),
        RooflineCase(f"tree: b=1, q=64, s={context}", 1, 64, context),
        RooflineCase(f"tree: b={tree_batch}, q=64, s={context}", tree_batch, 64, context),
    ]


_MARKERS = {
    "q_proj": "o",
    "k_proj": "v",
    "v_proj": "^",
    "o_proj": "s",
    "gate": "D",
    "up": "d",
    "down": "p",
    "qk": "<",
    "pv": ">",
    "softmax": "h",
    "lm_head": "*",
    "draft_heads": "X",
    "attn_norm": "1",
    "mlp_norm": "2",
    "rotary": "3",
    "act": "4",
    "attn_residual": "+",
    "mlp_residual": "x",
    "final_norm": "|",
    "embedding": "_",
    "kv_cache": ".",
}


def _save(fig, path, extra=None) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=130, bbox_inches="tight", pad_inches=0.15, bbox_extra_artists=extra)


def roofline_points(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    hw: HardwareProfile,
    cases: list[RooflineCase],
    *,
    attention: str = "fused",
) -> pd.DataFrame:
    """Every operator of every case with FLOPs and bytes, one row each: case, case_index,
    name, intensity (FLOP/byte), attained_flops (FLOP/s of the modelled time), bound, time_s."""
    rows = []
    for ci, case in enumerate(cases):
        for t in op_timings(
            shape,
            heads if case.heads else None,
            hw,
            batch=case.batch,
            tokens=case.tokens,
            context=case.context,
            attention=attention,
        ):
            flops, nbytes, time_s = float(t.op.flops), float(t.op.bytes), float(t.time_s)
            if flops <= 0 or nbytes <= 0 or time_s <= 0:
                continue  # pure data movement has no place on a FLOP/s axis
            rows.append(
                {
                    "case": case.label,
                    "case_index": ci,
                    "name": t.op.name,
                    "intensity": flops / nbytes,
                    "attained_flops": flops / time_s,
                    "bound": str(t.bound),
                    "time_s": time_s,
                }
            )
    return pd.DataFrame(rows)


def roofline_chart(
    points: pd.DataFrame,
    shape: ModelShape,
    hw: HardwareProfile,
    path,
    *,
    cases: list[RooflineCase],
    title: str | None = None,
) -> None:
    """Write the roofline chart of `points` (`roofline_points` of `cases`) as a PNG to `path`."""
    pts = points.copy()
    peak = hw.peak(shape.dtype)
    fig = Figure(figsize=(10.5, 6.2))
    ax = fig.subplots()
    x_lo, x_hi = _draw_roofs(ax, hw, peak, pts)
    colors = matplotlib.colormaps["tab10"]
    _draw_points(ax, pts, peak, hw.bandwidth_bytes_per_s, len(cases), colors)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    y_lo = max(pts["attained_flops"].min() / 3, peak * 1e-7) if len(pts) else peak * 1e-4
    y_hi = max(peak * 3, pts["attained_flops"].max() * 2.5) if len(pts) else peak * 3
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("operational intensity (FLOP / byte)")
    ax.set_ylabel("attained throughput (FLOP/s)")
    ax.grid(True, which="major", ls=":", lw=0.5, color="0.8")
    ax.set_title(title or f"Roofline: {shape.name} ({shape.dtype}) on {hw.name}", fontsize=11)
    _save(fig, path, extra=_roofline_legends(ax, pts, cases, colors))


def _draw_roofs(ax, hw: HardwareProfile, peak: float, pts: pd.DataFrame) -> tuple[float, float]:
    """The peak roofs, the attained (efficiency-scaled) roofs and the ridge; returns the x range."""
    bw = hw.bandwidth_bytes_per_s
    x_lo = max(min(pts["intensity"].min() / 3, 0.1), 1e-3) if len(pts) else 0.1
    x_hi = max(pts["intensity"].max() * 3, 10 * peak / bw) if len(pts) else 1e4
    xs = np.logspace(np.log10(x_lo), np.log10(x_hi), 400)
    peak_txt = f"{peak / 1e12:.3g} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.3g} GFLOP/s"
    ax.plot(xs, np.minimum(peak, bw * xs), color="black", lw=2.0, label=f"peak roofs: {peak_txt}, {bw / 1e9:.4g} GB/s")
    att_c = peak * hw.eta_compute
    att_m = bw * hw.eta_memory
    ax.plot(
        xs,
        np.minimum(att_c, att_m * xs),
        color="0.45",
        lw=1.4,
        ls="--",
        label=f"attained roofs: x{hw.eta_compute:.2f} compute, x{hw.eta_memory:.2f} memory",
    )
    ridge = peak / bw
    ax.axvline(ridge, color="0.75", lw=0.8, ls=":")
    ax.text(ridge * 1.08, peak * 1.25, f"ridge {ridge:.0f} FLOP/B", fontsize=8, color="0.35", va="bottom")
    return x_lo, x_hi


def _draw_points(ax, pts: pd.DataFrame, peak: float, bw: float, n_cases: int, colors) -> None:
    """One marker per operator, coloured by case."""
    above = np.zeros(0, dtype=bool)
    if len(pts):
        # A point above the peak roof would mean the model's time beats the hardware's bound
        # (an operator whose time is not from this roof, e.g. a measured attention efficiency
        # on another dtype's peak). It is drawn on the roof, hollow, rather than above it.
        roof = np.minimum(peak, bw * pts["intensity"].to_numpy())
        above = pts["attained_flops"].to_numpy() > roof * 1.0001
        pts["drawn_flops"] = np.where(above, roof, pts["attained_flops"])
        pts["above_roof"] = above
    for ci in range(n_cases):
        sub = pts[pts["case_index"] == ci]
        for r in sub.itertuples():
            filled = _MARKERS.get(r.name, "o") in "ov^sDdp<>hX*"
            hollow = r.above_roof and filled
            ax.scatter(
                r.intensity,
                r.drawn_flops,
                marker=_MARKERS.get(r.name, "o"),
                s=46,
                color="none" if hollow else colors(ci % 10),
                edgecolors=colors(ci % 10) if hollow else ("black" if filled else None),
                linewidths=1.2 if hollow else 0.4,
                alpha=0.9,
                zorder=3,
            )
    if above.any():
        ax.scatter(
            [],
            [],
            marker="o",
            s=46,
            color="none",
            edgecolors="0.3",
            linewidths=1.2,
            label=f"hollow: {int(above.sum())} point(s) modelled above the roof, drawn on it",
        )


def _roofline_legends(ax, pts: pd.DataFrame, cases: list[RooflineCase], colors) -> list:
    """Two legends beside the axes: roofs and configurations (colour), operators (marker)."""
    roof_handles, roof_labels = ax.get_legend_handles_labels()
    case_handles = [Line2D([], [], marker="o", ls="", color=colors(i % 10), markersize=8) for i in range(len(cases))]
    leg1 = ax.legend(
        roof_handles + case_handles,
        roof_labels + [c.label for c in cases],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        title="roofs and configurations (colour)",
        title_fontsize=8,
        frameon=False,
    )
    ax.add_artist(leg1)
    names = [n for n in _MARKERS if n in set(pts["name"])] if len(pts) else []
    op_handles = [Line2D([], [], marker=_MARKERS[n], ls="", color="0.3", markersize=7) for n in names]
    leg2 = ax.legend(
        op_handles,
        names,
        loc="lower left",
        bbox_to_anchor=(1.01, 0.0),
        fontsize=7.5,
        ncol=2,
        title="operators (marker)",
        title_fontsize=8,
        frameon=False,
    )
    return [leg1, leg2]


def _outside_artists(fig) -> list:
    """The legends (drawn beside the axes) and the suptitle, which a tight crop must keep."""
    found = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return found + ([fig._suptitle] if fig._suptitle is not None else [])


def speedup_curves(grid: pd.DataFrame, path, *, context: int, title: str | None = None) -> None:
    """`speedup_curves_figure`, saved as a PNG at `path`."""
    fig = speedup_curves_figure(grid, context=context, title=title)
    _save(fig, path, extra=_outside_artists(fig))


def speedup_curves_figure(grid: pd.DataFrame, *, context: int, title: str | None = None) -> Figure:
    """Speedup (top) and overhead (bottom) against tree size at one context, one curve per batch."""
    sub = grid[grid["context"] == context]
    batches = sorted(sub["batch"].unique())
    fig = Figure(figsize=(9, 7.5))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    cmap = matplotlib.colormaps["viridis"]
    for j, b in enumerate(batches):
        g = sub[sub["batch"] == b].sort_values("nodes")
        color = cmap(j / max(len(batches) - 1, 1))
        if not np.isfinite(g["speedup"]).any():
            ax.plot([], [], color=color, label=f"batch {b}: does not fit in memory")
            continue
        best = g.loc[g["speedup"].idxmax()]
        good = best["speedup"] > 1.0 and best["nodes"] > 0
        label = (
            f"batch {b}: best n = {int(best['nodes'])}, {best['speedup']:.2f}x"
            if good
            else f"batch {b}: no tree beats plain decoding"
        )
        ax.plot(g["nodes"], g["speedup"], color=color, lw=1.6, label=label)
        ax2.plot(g["nodes"], g["overhead"], color=color, lw=1.6)
        if good:
            # several batches often pick the same size at nearly the same speedup: shrink the
            # later stars so that every one stays visible
            ax.scatter(
                [best["nodes"]],
                [best["speedup"]],
                marker="*",
                s=260 - 150 * j / max(len(batches) - 1, 1),
                color=color,
                edgecolors="black",
                linewidths=0.6,
                zorder=4 + j,
            )
    ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
    ax.set_ylabel("predicted speedup (x plain decoding)")
    ax.grid(True, ls=":", lw=0.5, color="0.8")
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
        title="star = best tree size",
        title_fontsize=8,
    )
    ax.set_title(title or f"Speedup against tree size (context {context} tokens)", fontsize=11)
    ax2.axhline(1.0, color="0.4", lw=0.8, ls="--")
    ax2.set_xlabel("tree size n (nodes; n = 0 is plain decoding, q = n + 1 tokens per step)")
    ax2.set_ylabel("overhead T(n) / T(0)")
    ax2.grid(True, ls=":", lw=0.5, color="0.8")
    return fig


def overhead_curves(
    shape, heads, hw, path, *, batches, context: int, max_nodes: int, attention="fused", title: str | None = None
) -> None:
    """Overhead T(n)/T(0) against tree size when no accuracy table is given (no tau, no speedup)."""

    grid = speedup_grid(shape, heads, hw, np.ones(max_nodes + 1), batches, [context], attention=attention)
    fig = Figure(figsize=(9, 5))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"]
    bs = sorted(grid["batch"].unique())
    for j, b in enumerate(bs):
        g = grid[grid["batch"] == b]
        fits = np.isfinite(g["overhead"]).any()
        ax.plot(
            g["nodes"],
            g["overhead"],
            color=cmap(j / max(len(bs) - 1, 1)),
            lw=1.6,
            label=f"batch {b}" if fits else f"batch {b}: does not fit in memory",
        )
    ax.set_xlabel("tree size n (nodes; q = n + 1 tokens per step)")
    ax.set_ylabel("overhead T(n) / T(0)")
    ax.grid(True, ls=":", lw=0.5, color="0.8")
    leg = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title(title or f"Step-time overhead against tree size (context {context})", fontsize=11)
    _save(fig, path, extra=[leg])


def best_heatmaps(best: pd.DataFrame, path, *, title: str | None = None) -> None:
    """`best_heatmaps_figure`, saved as a PNG at `path`."""
    _save(best_heatmaps_figure(best, title=title), path)


def best_heatmaps_figure(best: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Two heatmaps over batch (rows) x context (columns): best tree size and its speedup.
    `best`: columns batch, context, nodes, speedup, fits_memory (one row per cell)."""
    batches = sorted(best["batch"].unique())
    contexts = sorted(best["context"].unique())
    nodes = best.pivot(index="batch", columns="context", values="nodes").reindex(index=batches, columns=contexts)
    speed = best.pivot(index="batch", columns="context", values="speedup").reindex(index=batches, columns=contexts)
    fits = best.pivot(index="batch", columns="context", values="fits_memory").reindex(index=batches, columns=contexts)
    w = max(10, 0.8 * len(contexts) * 2 + 3)
    fig = Figure(figsize=(w, 0.55 * len(batches) + 2.6))
    axes = fig.subplots(1, 2)
    node_values = np.unique(nodes.to_numpy(dtype=float)[np.isfinite(nodes.to_numpy(dtype=float))])
    for ax, data, label, cmap, fmt in [
        (axes[0], nodes.to_numpy(dtype=float), "best tree size (nodes)", "viridis", "{:.0f}"),
        (axes[1], speed.to_numpy(dtype=float), "predicted speedup (x)", "magma", "{:.2f}"),
    ]:
        ok = fits.to_numpy(dtype=bool)
        discrete = label.startswith("best")
        if discrete:
            # one colour per tree size that occurs, "none" (0) in grey: node counts are
            # categories, not a continuous scale with fractional ticks
            data = np.searchsorted(node_values, data).astype(float) if node_values.size else data
        masked = np.ma.masked_where(~ok | ~np.isfinite(data), data)
        cm = matplotlib.colormaps[cmap].with_extremes(bad="0.85")
        norm = None
        if discrete and node_values.size:
            colours = [matplotlib.colormaps[cmap](k / max(node_values.size - 1, 1)) for k in range(node_values.size)]
            if node_values[0] == 0:
                colours[0] = (0.93, 0.93, 0.93, 1.0)
            cm = matplotlib.colors.ListedColormap(colours).with_extremes(bad="0.85")
            norm = matplotlib.colors.BoundaryNorm(np.arange(node_values.size + 1) - 0.5, node_values.size)
        im = ax.imshow(masked, cmap=cm, norm=norm, aspect="auto", origin="upper")
        ax.set_xticks(range(len(contexts)), [str(c) for c in contexts])
        ax.set_yticks(range(len(batches)), [str(b) for b in batches])
        ax.set_xlabel("context length s (cached tokens)")
        ax.set_ylabel("batch size b")
        ax.set_title(label, fontsize=10)
        finite = masked.compressed()
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0
        for i in range(len(batches)):
            for j in range(len(contexts)):
                if not ok[i, j] or not np.isfinite(data[i, j]):
                    ax.text(j, i, "OOM", ha="center", va="center", fontsize=7.5, color="0.3")
                    continue
                if discrete:
                    value = node_values[int(data[i, j])]
                    txt = "none" if value == 0 else f"{value:.0f}"
                    dark = value == 0 or data[i, j] > (node_values.size - 1) / 2
                else:
                    txt = fmt.format(data[i, j])
                    dark = data[i, j] > mid
                ax.text(j, i, txt, ha="center", va="center", fontsize=8.5, color="black" if dark else "white")
        cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
        if discrete and node_values.size:
            cbar.set_ticks(np.arange(node_values.size), labels=["none" if v == 0 else f"{v:.0f}" for v in node_values])
        cbar.ax.tick_params(labelsize=8)
    fig.suptitle(title or "Best tree per batch and context", fontsize=11)
    fig.tight_layout()
    return fig


def selection_heatmaps_figure(selection: Selection, *, title: str | None = None) -> Figure:
    """`best_heatmaps_figure` of a selection: its chosen tree size and speedup per cell, the
    cells where not even plain decoding fits marked."""
    rows = [
        {"batch": c.batch, "context": c.context, "nodes": c.nodes, "speedup": c.speedup, "fits_memory": True}
        for c in selection.cells
    ]
    rows += [
        {"batch": b, "context": s, "nodes": 0, "speedup": np.nan, "fits_memory": False}
        for b, s in selection.out_of_memory
    ]
    return best_heatmaps_figure(pd.DataFrame(rows), title=title)


def plot_measured_speedup(sweep: pd.DataFrame, selection: Selection, path) -> None:
    """`measured_speedup_figure`, saved as a PNG at `path`."""
    fig = measured_speedup_figure(sweep, selection)
    _save(fig, path, extra=_outside_artists(fig))


def _dropped_predictions(rows: pd.DataFrame) -> np.ndarray:
    """The tree sizes of `rows` (one cell's trees) whose predicted speedup is missing although
    a step was predicted: the profile priced the tree step below the plain step
    (`treeopt.stats.physical_speedup`), so the dashed line skips them."""
    if "predicted_speedup" not in rows.columns or "predicted_overhead" not in rows.columns:
        return np.zeros(0)
    gone = rows["predicted_speedup"].isna() & rows["predicted_overhead"].notna()
    return rows.loc[gone, "nodes"].to_numpy(dtype=float)


def measured_speedup_figure(sweep: pd.DataFrame, selection: Selection) -> Figure:
    """Measured speedup against tree size with its interval band, one panel per context and
    one colour per batch size, the pick of `selection` marked (a ring; a cross at 1 for no
    speculation) and the predicted speedup dashed beside it."""
    contexts = sorted(sweep["context"].unique())
    batches = sorted(sweep["batch"].unique())
    picks = selection.chosen_nodes()
    fig = Figure(figsize=(5.4 * len(contexts) + 2.6, 4.6))
    axes = fig.subplots(1, len(contexts), squeeze=False, sharey=True)[0]
    cmap = matplotlib.colormaps["viridis"]
    trees = sweep[sweep["nodes"] > 0]
    for ax, s in zip(axes, contexts, strict=True):
        for j, b in enumerate(batches):
            color = cmap(j / max(len(batches) - 1, 1))
            g = trees[(trees["batch"] == b) & (trees["context"] == s)].sort_values("nodes")
            if g.empty:
                continue
            ax.plot(g["nodes"], g["speedup"], "o-", color=color, lw=1.6, ms=4, label=f"batch {b}")
            if "speedup_lo" in g.columns and g["speedup_lo"].notna().any():
                ax.fill_between(g["nodes"], g["speedup_lo"], g["speedup_hi"], color=color, alpha=0.18, lw=0)
            if "predicted_speedup" in g.columns and g["predicted_speedup"].notna().any():
                ax.plot(g["nodes"], g["predicted_speedup"], ls="--", color=color, lw=1.0, alpha=0.8)
            if "unreliable" in g.columns and (g["unreliable"] > 0).any():
                bad = g[g["unreliable"] > 0]
                ax.scatter(bad["nodes"], bad["speedup"], marker="x", s=60, color="red", zorder=5)
            dropped = _dropped_predictions(g)
            if dropped.size:
                ax.scatter(dropped, np.ones(dropped.size), marker="v", s=40, color=color, zorder=5)
            n = picks.get((b, s))
            if n is not None:
                y = float(g.loc[g["nodes"] == n, "speedup"].iloc[0]) if n else 1.0
                x = n if n else float(g["nodes"].min())
                ax.scatter(
                    [x],
                    [y],
                    marker="o" if n else "X",
                    s=170 - 80 * j / max(len(batches) - 1, 1),
                    facecolors="none" if n else color,
                    edgecolors=color,
                    linewidths=2.0,
                    zorder=6,
                )
        ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
        log2_axis(ax, trees["nodes"])
        ax.set_xlabel("tree size n (nodes)")
        ax.set_title(f"context {s} tokens", fontsize=10)
        ax.grid(True, ls=":", lw=0.5, color="0.8")
    axes[0].set_ylabel("speedup over plain decoding (x)")
    handles, labels = axes[-1].get_legend_handles_labels()
    handles += [
        Line2D([], [], ls="--", color="0.3"),
        Line2D([], [], marker="o", ls="", mfc="none", mec="0.3", ms=10),
        Line2D([], [], marker="X", ls="", color="0.3", ms=9),
        Line2D([], [], marker="x", ls="", color="red"),
        Line2D([], [], marker="v", ls="", color="0.3"),
    ]
    labels += [
        "predicted",
        "picked tree",
        "picked: no speculation (at the smallest size)",
        "unreliable (not selected)",
        "no prediction: the profile prices\nthe tree step below plain (at 1)",
    ]
    rule = selection.rule
    level = rule.confidence if rule.confidence is not None else 0.95
    shipped = rule.interval_confidence if rule.interval_confidence is not None else level
    axes[-1].legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=8,
        frameon=False,
        title=f"band: each size's {level * 100:.4g}% interval"
        + (f"\n(the report's shipped interval: {shipped * 100:.4g}%)" if shipped != level else ""),
        title_fontsize=8,
    )
    fig.suptitle("Measured speedup against tree size", fontsize=11, y=1.02)
    return fig
