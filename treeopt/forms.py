"""Verification forms of one static candidate set and the choice between them.

A drafted tree can be verified as a tree (one sequence of q tokens under a tree mask, the
context read once) or as its leaves' root paths, each a candidate sequence of its own (IBM's
batch expansion: the context read once per candidate). Both accept the same tokens; only the
cost differs (docs/decoder.md#candidate-sequence-verification). A measured sweep measures one
form; `choose_form` joins the selections of several forms measured on the same (batch, context)
cells (docs/builders.md#choosing-the-verification-form).
"""

from __future__ import annotations

import math

from treeopt.errors import UserError
from treeopt.selection_types import FORMS_FORMAT, FormCell, FormOption, FormsChoice, Selection, SelectionCell

__all__ = ["VERIFICATION_FORMS", "FORMS_FORMAT", "choose_form"]

#: the verification forms, cheapest verification first: the tree reads each sequence's context
#: once, candidate sequences once per candidate (docs/performance-model.md#verification-modes)
VERIFICATION_FORMS = ("tree", "candidates")


def _interval(cell: SelectionCell) -> tuple[float, float, float]:
    """(speedup, lower, upper) of a selection cell; a cell without an interval (a predicted
    selection) is its point speedup at both ends. No speculation is speedup 1."""
    if not cell.nodes:
        return 1.0, 1.0, 1.0

    def bound(value) -> float:
        return cell.speedup if value is None or math.isnan(value) else value

    return cell.speedup, bound(cell.speedup_lo), bound(cell.speedup_hi)


def choose_form(selections: dict[str, Selection], *, threshold: float = 1.0, order=None) -> FormsChoice:
    """Per (batch, context) the verification form to serve with, from the selections
    (`treeopt.selection.select`) of several forms measured on the same cells, keyed by form.

    Rule (docs/builders.md#choosing-the-verification-form): a form competes in a cell when it
    speculates there (nodes > 0) and its speedup's lower bound exceeds `threshold`; none does:
    no speculation. Among those the highest lower bound wins, unless another competing form's
    interval overlaps the winner's: then, of the overlapping ones, the form with the cheaper
    verification (the earlier in VERIFICATION_FORMS: the tree reads the context once) wins.
    `order` names the forms in that preference order when they are other ways of drafting than
    the verification forms (a draft model's "chain" before its "tree": every engine that serves
    a draft model verifies chains, fewer verify trees).

    Returns the forms in preference order, the threshold and per cell (sorted by batch,
    context) the form (None for no speculation), its tree and interval, why, and every form's
    answer there.
    """
    if not selections:
        raise UserError("choose_form: no selections given")
    order = tuple(VERIFICATION_FORMS if order is None else order)
    unknown = sorted(set(selections) - set(order))
    if unknown:
        raise UserError(f"choose_form: unknown form '{unknown[0]}' (one of {', '.join(order)})")
    forms = [f for f in order if f in selections]  # preferred (cheapest verification) first
    cells = {form: {c.key: c for c in selections[form].cells} for form in forms}
    keys = set(cells[forms[0]])
    for form in forms[1:]:
        if set(cells[form]) != keys:
            missing = sorted(keys ^ set(cells[form]))[0]
            raise UserError(
                f"choose_form: the selections of '{forms[0]}' and '{form}' cover other cells "
                f"(batch {missing[0]} context {missing[1]} is in one only); measure both forms on the same cells"
            )
    out = [_choose_in_cell(key, {form: cells[form][key] for form in forms}, threshold) for key in sorted(keys)]
    return FormsChoice(tuple(forms), float(threshold), tuple(out))


def _choose_in_cell(key: tuple[int, int], by_cell: dict[str, SelectionCell], threshold: float) -> FormCell:
    """One cell of `choose_form`: `by_cell` is each form's selection cell, in preference order."""
    forms = list(by_cell)
    bounds = {form: _interval(by_cell[form]) for form in forms}
    competing = [f for f in forms if by_cell[f].nodes and bounds[f][1] > threshold]
    by_form = {f: FormOption(int(by_cell[f].nodes), s, lo, hi) for f, (s, lo, hi) in bounds.items()}
    if not competing:
        reason = f"no speculation: no form's speedup lower bound exceeds {threshold:g}"
        return FormCell(*key, None, 0, 1.0, 1.0, 1.0, (), reason, by_form)
    best = max(competing, key=lambda f: bounds[f][1])  # the first (cheapest) on ties
    overlapping = [f for f in competing if bounds[f][2] >= bounds[best][1] and bounds[f][1] <= bounds[best][2]]
    winner = overlapping[0]  # competing is in cost order, and best overlaps itself
    if winner == best:
        others = [f for f in competing if f != best]
        reason = "highest speedup lower bound" + (
            f" (intervals overlap with {', '.join(others)}; cheapest verification)"
            if any(f in overlapping for f in others)
            else ""
        )
    else:
        reason = f"interval overlaps that of {best} (the highest lower bound); cheaper verification"
    s, lo, hi = bounds[winner]
    chosen = by_cell[winner]
    return FormCell(*key, winner, int(chosen.nodes), s, lo, hi, chosen.medusa_choices, reason, by_form)
