"""Several drafters of one model side by side: the `treeopt run` folder of each (its accuracy
table and rank vectors, its measured sweep and its selection) in one markdown report: tau
against tree size, what sequential dependence buys over Medusa's parallel heads at equal tree
size, measured speedup per batch, the best tree of each (docs/decoder.md#drafters)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from treeopt.acceptance import load_rank_vectors
from treeopt.accuracy import load_accuracy
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_text
from treeopt.selection_text import format_speedup
from treeopt.selection_types import FormCell, FormsChoice, Selection, SelectionCell, read_selection
from treeopt.tau import TauCurve, load_tau_curves, tau_curves
from treeopt.tree import load_tree

SIZES = (1, 2, 4, 8, 16, 32, 64)
_NAMES = {
    "medusa": "Medusa heads",
    "hydra": "Hydra heads",
    "mlp-speculator": "MLP speculator",
    "draft-model": "Draft model",
    "eagle3": "EAGLE-3 draft",
    "eagle": "EAGLE draft",
}


def _read_run(kind: str, run: Path, max_nodes: int) -> tuple[TauCurve, Selection, pd.DataFrame]:
    for name in ("accuracy.json", "selection.json", "sweep.csv"):
        if not (run / name).is_file():
            raise UserError(f"{kind}={run}: not a finished `treeopt run` folder (no {name})")
    tau = _run_tau(run, max_nodes)
    selection = read_selection(run / "selection.json")
    return tau, selection, pd.read_csv(run / "sweep.csv")


def _run_tau(run: Path, max_nodes: int) -> TauCurve:
    """tau of the proposal trees the run measured (`proposal_tree.json`: its engine's family,
    Hydra's own for Hydra heads), up to `max_nodes`; a run folder without one gets the table's
    unconstrained proposal sequence."""
    if not (run / "proposal_tree.json").is_file():
        return load_tau_curves(run / "accuracy.json", max_nodes)[1]
    table = load_accuracy(run / "accuracy.json")
    proposal = load_tree(str(run / "proposal_tree.json"))
    proposal = proposal.prefix(min(max_nodes, proposal.size))
    return tau_curves(table, proposal, load_rank_vectors(run / "accuracy.json", table=table))


def tau_table(curves: dict[str, TauCurve], sizes=SIZES) -> pd.DataFrame:
    """tau (the best estimate each run has) of each drafter's own proposal tree of n nodes."""
    rows = {"nodes": list(sizes)}
    for kind, tau in curves.items():
        rows[kind] = [float(tau.best[n]) if n < tau.best.size else np.nan for n in sizes]
    return pd.DataFrame(rows)


def _first_cell(data: dict) -> tuple[int, int]:
    """The smallest batch and context every run swept."""
    cells = [set(zip(sweep["batch"], sweep["context"], strict=True)) for _, _, sweep in data.values()]
    common = set.intersection(*cells)
    if not common:
        raise UserError("compare-drafters: the runs share no (batch, context) cell")
    return tuple(int(v) for v in min(common))


def _overheads(sweep: pd.DataFrame, batch: int, context: int) -> dict[int, float]:
    rows = sweep[(sweep["batch"] == batch) & (sweep["context"] == context)]
    return {int(n): float(o) for n, o in zip(rows["nodes"], rows["overhead"], strict=True)}


def _shipped_speedup(cell: SelectionCell | FormCell) -> float:
    measured = getattr(cell, "measured_speedup", None)
    return cell.speedup if measured is None else measured


def _served(cell: SelectionCell | FormCell, forms: FormsChoice | None) -> str:
    """A selection cell as "8 nodes, 1.50x", or with its form ("chain: gamma 1, 1.26x")."""
    if not cell.nodes:
        return "none"
    speedup = format_speedup(_shipped_speedup(cell))
    if forms is None:
        return f"{cell.nodes} node{'s' if cell.nodes != 1 else ''}, {speedup}"
    label = ((forms.labels or {}).get(cell.form) or {}).get(str(cell.nodes), f"{cell.nodes} nodes")
    return f"{cell.form}: {label}, {speedup}"


def compare_drafters(runs: dict[str, Path], out_dir, *, sizes=SIZES, command: str = "") -> dict:
    """Write out_dir/index.md, tau.csv and tau.png for the runs {kind: run folder}; returns
    the paths and the tau table."""
    if not runs:
        raise UserError("compare-drafters: no runs given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {kind: _read_run(kind, Path(run), max(sizes)) for kind, run in runs.items()}
    curves = {k: v[0] for k, v in data.items()}
    table = tau_table(curves, sizes)
    with atomic_path(out / "tau.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.4f")
    _plot_tau(curves, out / "tau.png")
    L = _intro_lines(runs, curves, command) + _tau_lines(curves, table) + _measured_lines(data)
    L += _step_cost_lines(data) + _best_tree_lines(data)
    write_text(out / "index.md", "\n".join(L) + "\n")
    return {"index": out / "index.md", "tau": table}


def _plot_tau(curves: dict[str, TauCurve], path: Path) -> None:
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for kind, tau in curves.items():
        ax.plot(np.arange(tau.best.size), tau.best, marker=".", label=f"{_NAMES.get(kind, kind)} ({tau.source})")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("tree size n (nodes)")
    ax.set_ylabel("expected tokens per step τ")
    ax.set_title("τ against tree size, each drafter's own trees")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _intro_lines(runs: dict[str, Path], curves: dict[str, TauCurve], command: str) -> list[str]:
    L = [
        "# Drafters side by side",
        "",
        "Each column is one `treeopt run --drafter KIND` on the same model, prompts and machine; each "
        "drafter gets the proposal trees its run measured (its engine's family: Hydra's own for Hydra heads), "
        "calibrated teacher-forced along the base model's greedy "
        "continuation (docs/statistics.md#dependent-drafters).",
        "",
    ]
    if command:
        L += ["Regenerate with:", "", "```", command, "```", ""]
    L += ["| drafter | run | τ estimate |", "|---|---|---|"]
    L += [f"| {_NAMES.get(k, k)} | `{runs[k]}` | {curves[k].describe()} |" for k in runs]
    return L


def _tau_lines(curves: dict[str, TauCurve], table: pd.DataFrame) -> list[str]:
    """tau against tree size, and what each dependent drafter gains over Medusa's heads."""
    L = [
        "",
        "## τ against tree size",
        "",
        "![tau](tau.png)",
        "",
        "| nodes | " + " | ".join(_NAMES.get(k, k) for k in curves) + " |",
        "|---|" + "---|" * len(curves),
    ]
    for row in table.itertuples(index=False):
        L.append(f"| {row[0]} | " + " | ".join("--" if not np.isfinite(v) else f"{v:.3f}" for v in row[1:]) + " |")
    if "medusa" in curves:
        L += ["", "## What sequential dependence bought", ""]
        for kind in (k for k in curves if k not in ("medusa", "draft-model")):
            gains = (table[kind] - table["medusa"]).to_numpy()
            parts = [f"{d:+.3f} at {n}" for n, d in zip(table["nodes"], gains, strict=True) if np.isfinite(d)]
            L.append(
                f"- {_NAMES.get(kind, kind)} vs Medusa heads, tokens per step at equal tree size: "
                + ", ".join(parts)
                + "."
            )
        L.append("- (The Hydra authors report +0.46 tokens per step over Medusa for Vicuna-7B; Ankner et al. 2024.)")
    return L


def _measured_lines(data: dict) -> list[str]:
    """Per batch and context the tree (or form) each run's selection ships."""
    L = [
        "",
        "## Measured speedup per batch",
        "",
        "The selection of each run: the tree its `selection.json` ships per batch and context (nodes, "
        "measured speedup τ·T(0)/T(n); docs/statistics.md#choosing-a-tree-with-intervals); where a run "
        "also measured the drafter's own "
        "forms (a draft model's chains, IBM's candidate sets), the form it serves with "
        "(docs/architecture.md#forms-the-main-job-compares).",
        "",
    ]
    cells = {}
    for kind, (_, selection, _) in data.items():
        forms = selection.forms
        for c in forms.cells if forms is not None else selection.cells:
            cells.setdefault((c.batch, c.context), {})[kind] = _served(c, forms)
    L += ["| batch | context | " + " | ".join(_NAMES.get(k, k) for k in data) + " |", "|---|---|" + "---|" * len(data)]
    for b, ctx in sorted(cells):
        row = []
        for kind in data:
            c = cells[(b, ctx)].get(kind)
            row.append("--" if c is None else c)
        L.append(f"| {b} | {ctx} | " + " | ".join(row) + " |")
    return L


def _step_cost_lines(data: dict) -> list[str]:
    """Measured T(n)/T(0) of each run at the smallest cell they all swept."""
    batch, context = _first_cell(data)
    L = [
        "",
        f"## What a step costs (batch {batch}, context {context})",
        "",
        "Measured step time of each tree size over plain decoding's, T(n)/T(0): a dependent drafter runs "
        "once per depth, one after the other (docs/performance-model.md#drafter-cost), so its larger τ is "
        "partly paid back in step time.",
        "",
        "| nodes | " + " | ".join(_NAMES.get(k, k) for k in data) + " |",
        "|---|" + "---|" * len(data),
    ]
    overheads = {k: _overheads(sweep, batch, context) for k, (_, _, sweep) in data.items()}
    for n in sorted(set().union(*(o.keys() for o in overheads.values()))):
        L.append(f"| {n} | " + " | ".join(f"{overheads[k][n]:.3f}" if n in overheads[k] else "--" for k in data) + " |")
    return L


def _best_tree_lines(data: dict) -> list[str]:
    L = ["", "## The best tree of each", ""]
    for kind, (_, selection, _) in data.items():
        picks = [c for c in selection.cells if c.nodes]
        if not picks:
            L.append(f"- {_NAMES.get(kind, kind)}: no tree beats plain decoding in any cell.")
            continue
        best = max(picks, key=_shipped_speedup)
        L.append(
            f"- {_NAMES.get(kind, kind)}: batch {best.batch}, context {best.context}, {best.nodes} "
            f"node{'s' if best.nodes != 1 else ''}, τ {best.tau:.3f}, "
            f"{format_speedup(_shipped_speedup(best))}: "
            f"`medusa_choices = {[list(p) for p in best.medusa_choices]}`"
        )
    return L


__all__ = ["compare_drafters", "tau_table", "SIZES"]
