"""The run's report, `index.md`: the results of the main job's stages (`treeopt.app.stages`)
written as markdown, one function per section."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import numpy as np
import pandas as pd

from roofline.engine_presets import calibrated_line
from treeopt.app.models import is_demo
from treeopt.app.run_answer import answer_section, chain_or_tree_markdown
from treeopt.app.stages.job import RunSettings
from treeopt.app.stages.proposal import Proposal
from treeopt.app.sweep import DEMO_VALIDATION
from treeopt.app.validation import ValidationResult
from treeopt.engines import eagle_draft, export_for
from treeopt.selection_notes import unreliable_lines
from treeopt.selection_text import format_pooled, format_speedup, noise_summary, rounds_needed_text
from treeopt.selection_types import FormsChoice, MixSection, Selection, SelectionCell


@dataclass(frozen=True)
class RunResults:
    """What `index.md` reports: the run's `settings`, its `proposal`, the name of the machine's
    profile, the selection (`selection.json`), the validation, the seconds each stage took, the
    regime it measured in ("float32, 1 torch thread(s)") and whether the drafter is a draft model."""

    settings: RunSettings
    proposal: Proposal
    hardware_name: str
    selection: Selection
    validation: ValidationResult
    timings_s: dict
    regime: str = ""
    draft_model: bool = False


def run_index_markdown(r: RunResults) -> str:
    """The whole `index.md` of a run."""
    table = r.proposal.table
    answer = answer_section(r.selection, r.proposal.engine, heads=table.num_heads, accuracy=table.accuracy)
    L = _header(r) + answer + _accuracy_section(r) + _proposal_section(r) + _selection_section(r)
    L += _validation_section(r.validation) + _prediction_section(r)
    return "\n".join(L)


def _header(r: RunResults) -> list[str]:
    return (
        [
            f"# treeopt run: {r.settings.model} on {r.hardware_name}",
            "",
            "Calibrate the draft heads, build the proposal trees, calibrate this machine's roofline profile, "
            "predict, measure, select, and check the predictions against measurements on held-out prompts.",
            "",
            f"Regenerate with `{_rerun_command(r.settings)}`.",
            "",
            f"Measured in {r.regime}." if r.regime else "",
            "",
            _step_costs_text(r),
            "",
        ]
        + [f"**{line}**" for line in noise_summary(r.selection)]
        + [""]
    )


def _step_costs_text(r: RunResults) -> str:
    """Which step costs priced the prediction (docs/performance-model.md#engine-presets): the
    machine's calibrated profile, never an engine preset."""
    line = calibrated_line(r.hardware_name, r.settings.engine)
    return f"Step costs: {line.removeprefix('step costs: ')} (docs/performance-model.md#engine-presets)."


def _accuracy_section(r: RunResults) -> list[str]:
    table = r.proposal.table
    acc = table.accuracy
    L = [
        "## 1. Head accuracies",
        "",
        f"Greedy-label calibration on `{r.settings.data}` ({int(table.positions[0])} positions for head 1), "
        f"per-rank accuracy, top-1 and top-{table.width} (in `accuracy.json`):",
        "",
        "| head | top-1 | top-" + str(table.width) + " | positions |",
        "|---|---|---|---|",
    ]
    for k in range(table.num_heads):
        L.append(f"| {k + 1} | {acc[k, 0]:.3f} | {acc[k].sum():.3f} | {int(table.positions[k])} |")
    return L


def _proposal_section(r: RunResults) -> list[str]:
    return [
        "",
        "## 2. Proposal trees",
        "",
        f"{r.proposal.method} proposal sequence of {r.proposal.tree.size} nodes (`proposal_tree.json`); every "
        "prefix is the tree of that size.",
        "",
    ]


def _selection_section(r: RunResults) -> list[str]:
    selection, rule = r.selection, r.selection.rule
    confidence = rule.confidence if rule.confidence is not None else 0.95
    L = [
        "## 3. Selection: the best tree per batch size on this machine",
        "",
        "By measured speedup τ·T(0)/T(n) (bootstrap over paired rounds, τ's calibration error included; "
        f"comparisons at {_percent(confidence)}, each shipped tree's own interval at "
        f"{_percent(rule.interval_confidence or confidence)}, spent over the "
        "tree sizes so that it holds whichever is picked): the smallest tree within "
        f"{rule.tolerance or 0:.0%} of the best point estimate at the lower bound of their paired ratio, "
        "shipped only where its own lower bound is above 1; `undecided` "
        "where another tree may still be better by more than that (`selection.json`; `sweep.csv` and "
        "`sweep.samples.npz` hold every measurement):",
        "",
        "| batch | context | chosen nodes | measured speedup | interval | rounds | reason | largest point speedup at "
        "| pooled fit's pick | predicted speedup |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    L += [_selection_row(c) for c in selection.cells]
    L += _cell_notes(selection.cells)
    if selection.pooled is not None:
        L += ["", f"Pooled evidence: the {format_pooled(selection)} (`selection.json` `pooled_fit`)."]
    L += [
        "",
        "Measured speedup against tree size per batch size, with its interval band, the pick marked "
        "and the prediction beside it:",
        "",
        "![measured speedup](measured_speedup.png)",
    ]
    if r.proposal.engine is not None:
        L += _engine_lines(r)
    if selection.chain_or_tree is not None:
        L += chain_or_tree_markdown(selection.chain_or_tree)
    if selection.forms is not None:
        L += ["", _forms_markdown(selection.forms)]
    if selection.mix is not None:
        L += ["", _mix_markdown(selection.mix)]
    return L


def _selection_row(c: SelectionCell) -> str:
    has_span = c.speedup_lo is not None and np.isfinite(c.speedup_lo) and c.nodes
    span = f"{c.speedup_lo:.2f}–{c.speedup_hi:.2f}" if has_span else "--"
    return (
        f"| {c.batch} | {c.context} | {c.nodes or 'no speculation'} | "
        f"{_measured_text(c)} | {span} | {_or_dashes(c.rounds)} | "
        f"{_reason_text(c)} | {_or_dashes(c.best_nodes)} | {_fit_text(c)} | "
        f"{format_speedup(c.predicted_speedup)} |"
    )


def _cell_notes(cells) -> list[str]:
    """Under the cell table, why a number reads `--` or `= τ`, and what the sanity checks
    flagged, one line per cell (`treeopt.selection_notes`)."""
    notes = []
    for c in cells:
        where = f"batch {c.batch} context {c.context}"
        if c.measured_speedup_missing:
            notes.append(f"- {where}, measured speedup `= τ`: {c.measured_speedup_missing}.")
        if c.predicted_speedup_missing:
            notes.append(f"- {where}, predicted speedup `--` ({c.nodes} nodes): {c.predicted_speedup_missing}.")
        notes += [f"- {where}: {line}." for line in unreliable_lines(c)]
    return ["", "Notes on the table:", ""] + notes if notes else []


def _measured_text(cell: SelectionCell) -> str:
    """The measured speedup, or `= τ 1.95x` where the overhead was clamped at 1 (the speedup
    shipped is tau, not a measurement)."""
    if cell.measured_speedup_missing:
        return f"= τ {format_speedup(cell.tau)}"
    return format_speedup(cell.measured_speedup)


def _or_dashes(value) -> str:
    return "--" if value is None else str(value)


def _engine_lines(r: RunResults) -> list[str]:
    """Each cell's tree as the line of the engine whose family the proposal is from."""
    target = r.proposal.engine
    table, proposal = r.proposal.table, r.proposal.tree
    L = [
        "",
        f"Paste-ready for {target.title} (the proposal trees are from its family):",
        "",
        "| batch | context | line |",
        "|---|---|---|",
    ]
    for c in r.selection.cells:
        line = (
            "no speculation"
            if not c.nodes
            else "`"
            + export_for(
                target,
                proposal.prefix(c.nodes),
                heads=table.num_heads,
                accuracy=table.accuracy,
                drafter=eagle_draft(table),
            ).line
            + "`"
        )
        L.append(f"| {c.batch} | {c.context} | {line} |")
    return L


_ACCEPTANCE_COLUMNS = [
    "nodes",
    "measured_tokens_per_step",
    "tau_independent",
    "error_independent",
    "tau_joint",
    "error_joint",
    "tau_walk",
    "error_walk",
    "steps",
]


def _validation_section(result: ValidationResult) -> list[str]:
    L = [
        "",
        "## 4. Validation on held-out prompts",
        "",
        "Measured tokens per step of the reference decoder against τ predicted from the table:",
        "",
        "![acceptance](validation_acceptance.png)",
        "",
        _md_table(result.acceptance[_ACCEPTANCE_COLUMNS]),
        "",
        "tau_independent multiplies per-head per-rank accuracies; tau_joint averages the calibration's joint "
        "rank-vector statistics over every position; tau_walk walks the same rank vectors the way the decoder "
        "steps (after accepting A tokens the next step starts A positions on), which removes the length bias "
        "of a per-position average where acceptance comes in runs.",
        "",
    ]
    if result.latency is not None:
        err = result.latency["overhead_error"].abs()
        L += [
            "Step-latency ratio T(n)/T(0), measured against the roofline prediction for this machine's "
            f"calibrated profile: median |error| {err.median():.1%}, max {err.max():.1%} over {len(err)} "
            "configurations.",
            "",
            "![latency](validation_latency.png)",
            "",
        ]
    if result.regret is not None:
        L += [
            "Tree chosen by prediction alone against the tree the selection ships (fraction of its measured speedup):",
            "",
            _md_table(result.regret),
            "",
        ]
        L += _above_one_note(result.regret)
    return L


def _above_one_note(regret: pd.DataFrame) -> list[str]:
    """Where the tree chosen by prediction measured faster than the shipped one, say why that
    is no contradiction: the selection ships the smallest tree within --tolerance of the best
    at the lower bound of their paired ratio, not the largest point estimate."""
    if "fraction_of_selected" not in regret.columns:
        return []
    above = regret[regret["fraction_of_selected"] > 1.0]
    if above.empty:
        return []
    where = ", ".join(f"batch {b} context {c}" for b, c in above[["batch", "context"]].itertuples(index=False))
    return [
        f"A fraction above 1 ({where}): the tree chosen by prediction measured faster than the shipped one. "
        "The selection ships the smallest tree as good as the best within the tolerance at the lower bound of "
        "their paired ratio (the `reason` column of section 3), so a larger tree may measure a little faster "
        "at its point estimate without being shown faster by more than the tolerance.",
        "",
    ]


def _prediction_section(r: RunResults) -> list[str]:
    L = [
        "## 5. The prediction for this machine",
        "",
        "The roofline report of this machine's profile: [prediction/index.md](prediction/index.md).",
        "",
    ]
    if not r.draft_model:  # a draft model's prediction is a table over gamma, without plots
        L += ["![roofline](prediction/roofline.png)", "", "![speedup](prediction/speedup.png)", ""]
    L += ["## Run time", "", ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in r.timings_s.items()), ""]
    return L


def _mix_markdown(mix: MixSection) -> str:
    """The traffic-mix tree and what it loses, cell by cell, against each cell's own best
    (docs/builders.md#one-tree-for-a-traffic-mix)."""
    n = mix.nodes
    if n:
        off = mix.off_from_batch
        where = f"speculation on up to batch {mix.speculate_up_to_batch}" + (
            f", off from batch {off}" if off is not None else " (every batch of the mix)"
        )
        what = f"**{n} nodes**, {where}: `medusa_choices = {[list(p) for p in mix.medusa_choices]}`"
    else:
        what = "**no speculation**: no tree pays on this mix"
    ratio = mix.expected_tokens_per_s / mix.per_cell_best_tokens_per_s
    L = [
        "### One tree for the traffic mix",
        "",
        f"For the mix `{mix.source}`, the one static tree of largest expected throughput is {what}. "
        f"Expected {mix.expected_tokens_per_s:.4g} tokens/s, {ratio:.1%} of every cell with its own best "
        f"tree ({mix.per_cell_best_tokens_per_s:.4g}); plain decoding {mix.plain_tokens_per_s:.4g}.",
        "",
        "| batch | context | weight | best nodes | best speedup | mix tree nodes | mix tree speedup | loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in mix.cells:
        L.append(
            f"| {c.batch} | {c.context} | {c.weight:.3f} | {c.best_nodes or 'none'} | "
            f"{format_speedup(c.best_speedup)} | {c.mix_nodes or 'off'} | "
            f"{format_speedup(c.mix_speedup)} | {c.loss_fraction:.1%} |"
        )
    return "\n".join(L)


_FORM_TITLES = {
    "tree": "proposal tree (tree attention)",
    "chain": "chain of gamma drafts",
    "merged": "IBM's candidates merged into their prefix tree (tree attention)",
    "candidates": "IBM's candidates as sequences (batch expansion)",
}


def _forms_markdown(forms: FormsChoice) -> str:
    """Per cell the form to serve with and each form's measured best
    (docs/builders.md#choosing-the-verification-form)."""
    labels = {name: {int(n): v for n, v in (d or {}).items()} for name, d in (forms.labels or {}).items()}

    def size(form: str, nodes: int) -> str:
        if not nodes:
            return "no speculation"
        return labels.get(form, {}).get(nodes) or f"{nodes} node{'s' if nodes != 1 else ''}"

    names = list(forms.forms)
    L = [
        "### Which form",
        "",
        "The same cells measured in each form the drafter is served in ("
        + "; ".join(f"`{f}`: {_FORM_TITLES.get(f, f)}" for f in names)
        + "). A form competes where its speedup's lower bound is above 1; the highest lower bound wins, "
        "and where intervals overlap the form listed first wins (`selection.json`, `forms`).",
        "",
        "| batch | context | serve | speedup | interval | reason | " + " | ".join(f"best {f}" for f in names) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(names),
    ]
    for c in forms.cells:
        chosen = f"{c.form}: {size(c.form, c.nodes)}" if c.form else "no speculation"
        span = f"{c.speedup_lo:.2f}–{c.speedup_hi:.2f}" if c.form else "--"
        each = [
            f"{size(f, c.by_form[f].nodes)}, {format_speedup(c.by_form[f].speedup)}"
            if c.by_form[f].nodes
            else "no speculation"
            for f in names
        ]
        L.append(
            f"| {c.batch} | {c.context} | {chosen} | {format_speedup(c.speedup)} | {span} | "
            f"{c.reason} | " + " | ".join(each) + " |"
        )
    return "\n".join(L)


def _md_table(df: pd.DataFrame, floatfmt: str = "{:.3f}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, (float, np.floating)):
                cells.append(floatfmt.format(v) if np.isfinite(v) else "--")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _percent(confidence: float) -> str:
    """95%, or 98.75% where the sweep spent its error rate over several looks."""
    return f"{confidence * 100:.4g}%"


def _reason_text(cell: SelectionCell) -> str:
    reason = cell.reason if cell.reason is not None else "--"
    if reason == "undecided":
        return f"undecided: {rounds_needed_text(cell.rounds_needed)}"
    if cell.decided_by:
        return f"{reason}, decided by the {cell.decided_by}"
    return reason


def _fit_text(cell: SelectionCell) -> str:
    if cell.fit_nodes is None:
        return "--"
    return f"{cell.fit_nodes}" + ("" if cell.fit_consistent else " (the fit does not describe this cell)")


#: the `treeopt run` option of each setting that one sets (the others follow from these)
RUN_OPTIONS = {
    "model": "--model",
    "heads": "--heads",
    "drafter": "--drafter",
    "num_heads": "--num-heads",
    "data": "--data",
    "validation_data": "--validation-data",
    "device": "--device",
    "dtype": "--dtype",
    "threads": "--threads",
    "steps": "--steps",
    "max_prompts": "--max-prompts",
    "sizes": "--sizes",
    "batches": "--batch",
    "contexts": "--context",
    "repeats": "--repeats",
    "time_budget_s": "--budget",
    "tolerance": "--tolerance",
    "engine": "--engine",
    "mix": "--mix",
    "output": "--output",
}


def _rerun_command(s: RunSettings) -> str:
    """The `treeopt run` command line of these settings: every setting that differs from the
    default, each value quoted for a POSIX shell, so that the command repeats this run."""
    defaults = RunSettings()
    # the demo's own prompts are what the demo gets without --data / --validation-data
    implied = {"data": "demo", "validation_data": DEMO_VALIDATION} if is_demo(s.model) else {}
    parts = ["treeopt", "run"]
    for name, option in RUN_OPTIONS.items():
        value = getattr(s, name)
        if value is None or value == getattr(defaults, name) or implied.get(name) == value:
            continue
        parts += [option, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    if s.hw_quick:
        parts.append("--quick")
    return " ".join(shlex.quote(p) for p in parts)
