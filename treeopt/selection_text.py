"""A selection for people: the console summary of `treeopt select` and `treeopt run`, and the
phrases the reports share (docs/statistics.md#choosing-a-tree-with-intervals)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from treeopt.chain_or_tree import format_chain_or_tree
from treeopt.schedules import format_schedule
from treeopt.selection_notes import percent, plain_slow_only, unreliable_lines

if TYPE_CHECKING:  # the types' `summary` prints with this module
    from treeopt.selection_types import MixSection, Selection, SelectionCell

__all__ = [
    "NOISY_HALF_WIDTH",
    "format_speedup",
    "format_selection",
    "noise_summary",
    "rounds_needed_text",
    "best_bound_text",
    "format_pooled",
    "format_mix",
    "selection_summary",
]

# A chosen tree whose speedup interval is wider than +-10% is reported as noisy: the
# difference between neighbouring tree sizes is often smaller than that
# (docs/statistics.md#choosing-a-tree-with-intervals).
NOISY_HALF_WIDTH = 0.10


def format_speedup(v) -> str:
    """A speedup for people: "1.23x", or "--" where the selection JSON has null (NaN)."""
    return "--" if v is None or not np.isfinite(v) else f"{v:.2f}x"


def _cell_extra(c: SelectionCell) -> str:
    extra = ""
    if c.speedup_lo is not None and np.isfinite(c.speedup_lo) and c.nodes:
        extra += f" [{c.speedup_lo:.2f}, {c.speedup_hi:.2f}]"
    if c.measured_speedup is not None and c.predicted_speedup is not None:
        extra += f"  (measured {format_speedup(c.measured_speedup)}, predicted {format_speedup(c.predicted_speedup)})"
    if c.reason is not None:
        extra += f"  {c.reason}" + (f", {c.rounds} rounds" if c.rounds else "")
        if c.reason == "undecided":
            extra += f" ({rounds_needed_text(c.rounds_needed)})"
        if c.reason == "best bound":
            extra += f" ({best_bound_text(c.bound, c.open_nodes)}; {rounds_needed_text(c.rounds_needed)})"
        if c.decided_by:
            extra += f", decided by the {c.decided_by}"
        if c.fit_nodes is not None:
            extra += f"; pooled fit: {c.fit_nodes} nodes" + (
                "" if c.fit_consistent else " (the fit does not describe this cell)"
            )
    return extra


def format_selection(sel: Selection) -> str:
    """The console summary; says plainly which cells are undecided or noisy."""
    lines = [f"best tree per (batch, context) -- {sel.provenance.source}"]
    for c in sel.cells:
        what = "no speculation" if c.nodes == 0 else f"{c.nodes:3d} nodes"
        lines.append(
            f"  batch {c.batch:4d}  context {c.context:6d}: {what}  speedup {format_speedup(c.speedup)}{_cell_extra(c)}"
        )
        if c.predicted_speedup_missing:
            lines.append(f"      no predicted speedup: {c.predicted_speedup_missing}")
        if c.measured_speedup_missing:
            lines.append(f"      speedup not measured: {c.measured_speedup_missing}")
        lines += [f"      {line}" for line in unreliable_lines(c)]
        if c.step_and_end_to_end_disagree:
            lines.append(
                "      step latency and end-to-end throughput disagree beyond the interval at nodes "
                f"{list(c.step_and_end_to_end_disagree)}: selected on end-to-end"
            )
    lines += noise_summary(sel)
    return "\n".join(lines)


def noise_summary(sel: Selection) -> list[str]:
    """Lines that say which cells the measurement could not decide or measured noisily."""
    out = []
    rule = sel.rule

    def cells(keys) -> str:
        return ", ".join(f"batch {b} context {s}" for b, s in keys)

    slow_plain = {c.key for c in sel.cells if plain_slow_only(c)}
    noisy_undecided = [u for u in rule.undecided or () if u not in slow_plain]
    if noisy_undecided:
        within = f" within {rule.tolerance:.0%}" if rule.tolerance is not None else ""
        out.append(
            f"UNDECIDED: the measurement could not settle the answer{within} at "
            + cells(noisy_undecided)
            + " (shipped: the best estimate that beats the threshold at its lower bound, else no speculation); "
            "measure again on a quieter machine or with a larger --budget"
        )
    fixed = [c.key for c in sel.cells if c.reason == "best bound"]
    if fixed:
        out.append(
            "DECIDED ON FIXED ROUNDS: the rounds measured could not settle the answer"
            + (f" within {rule.tolerance:.0%}" if rule.tolerance is not None else "")
            + " at "
            + cells(fixed)
            + "; shipped there: the tree whose worst paired lower bound against every rival is the highest "
            "(the trees it is not shown to be as good as are listed per cell); more rounds would settle it"
        )
    if slow_plain:
        out.append(
            "PLAIN STEP SLOWER: at "
            + cells(sorted(slow_plain))
            + " tree steps measured faster than plain decoding, so every tree there failed the sanity checks; "
            "plain decoding is the slow step on this stack (not noise: a quieter machine will not change it)"
        )
    if rule.noisy:
        level = rule.interval_confidence if rule.interval_confidence is not None else rule.confidence
        out.append(
            f"NOISY: the chosen speedup's {percent(level)} interval is wider than "
            f"+-{NOISY_HALF_WIDTH:.0%} at " + cells(rule.noisy)
        )
    return out


def rounds_needed_text(need: float | None) -> str:
    """How many rounds the observed noise would need to settle an undecided cell, in words
    (`need` is a cell's rounds_needed: inf or None where no number would)."""
    if need is None or not np.isfinite(need):
        return "no number of rounds would settle it at this tolerance"
    return f"about {int(need)} rounds would settle it"


def best_bound_text(bound: float | None, open_nodes) -> str:
    """What a cell decided on fixed rounds guarantees (its `bound` and `open_nodes`), in words:
    no rival is more than 1 / bound - 1 faster at the comparisons' confidence, and which trees it
    is not shown to be as good as."""
    faster = 1.0 / bound - 1.0 if bound is not None and bound > 0 else math.nan
    said = f"no tree more than {faster:.0%} faster" if math.isfinite(faster) else "no bound on the rivals"
    if open_nodes:
        said += ", not shown as good as " + ", ".join("no speculation" if n == 0 else f"{n} nodes" for n in open_nodes)
    return said


def format_pooled(sel: Selection) -> str:
    """One line: the pooled fit's terms and what it decided."""
    pooled = sel.pooled
    if pooled is None:
        return ""
    if pooled.skipped is not None:
        return f"no profile fitted on every cell: {pooled.skipped}"
    status = pooled.term_status or {}
    terms = ", ".join(
        f"{k} {v:.3g}" + (f" ({status[k]})" if status.get(k) in ("at bound", "prior") else "")
        for k, v in pooled.terms.items()
    )
    cells = [c for c in sel.cells if c.fit_nodes is not None]
    same = sum(c.fit_nodes == c.nodes for c in cells)
    return (
        f"profile fitted on every cell ({terms}; {pooled.draws} refits over resampled rounds): consistent "
        f"with {pooled.consistent_cells} of {len(cells)} cells, picks the selected tree in {same}, decided "
        f"{pooled.decided_cells} undecided cell(s)"
    )


def format_mix(section: MixSection) -> str:
    """The mix section for people: the tree, the cut-off, and what each cell loses."""
    n = section.nodes
    if n:
        off = section.off_from_batch
        head = (
            f"one tree for the mix ({section.source}): {n} nodes, speculation on up to batch "
            f"{section.speculate_up_to_batch}"
            + (f", off from batch {off}" if off is not None else " (every batch of the mix)")
        )
    else:
        head = f"one tree for the mix ({section.source}): no speculation (no tree pays on this mix)"
    ratio = section.expected_tokens_per_s / section.per_cell_best_tokens_per_s
    lines = [
        head,
        f"  expected throughput {section.expected_tokens_per_s:.4g} tokens/s = {ratio:.1%} of every cell "
        f"with its own best tree ({section.per_cell_best_tokens_per_s:.4g}); plain decoding "
        f"{section.plain_tokens_per_s:.4g}",
    ]
    for c in section.cells:
        lines.append(
            f"  batch {c.batch:4d}  context {c.context:6d}  weight {c.weight:.3f}: best "
            f"{c.best_nodes:3d} nodes {c.best_speedup:.2f}x, mix tree {c.mix_nodes:3d} nodes "
            f"{c.mix_speedup:.2f}x (loses {c.loss_fraction:.1%})"
        )
    if n:
        lines.append(f"  medusa_choices = {[list(p) for p in section.medusa_choices]}")
    return "\n".join(lines)


def selection_summary(sel: Selection) -> str:
    """What `treeopt select` prints: the cells, the pooled fit, the mix, the engine's schedule."""
    text = format_selection(sel)
    if sel.pooled is not None:
        text += "\n" + format_pooled(sel)
    text += "\n" + format_mix(sel.mix) if sel.mix is not None else ""
    text += "\n" + format_chain_or_tree(sel.chain_or_tree) if sel.chain_or_tree is not None else ""
    return text + ("\n" + format_schedule(sel.schedule) if sel.schedule is not None else "")
