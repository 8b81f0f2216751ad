"""The selection as typed frozen parts, and its one JSON writer and reader
(docs/formats.md#selections-treeoptselectionv1).

A `Selection` is built whole by `treeopt.selection.select` (or `selection_from_grid`) and
grown by `dataclasses.replace` as the evidence beside it arrives: the pooled fit
(`PooledEvidence`), the drafter's other forms (`FormsChoice`), one tree for a traffic mix
(`MixSection`), the engine's lines. Nothing edits a selection in place; `selection_to_json`
turns it into the `treeopt.selection/v1` document at the end, `selection_from_json` reads
one back (every file written so far loads: the format is unchanged).

In a `SelectionCell`, an optional field that is None is absent from the document; a number
that is NaN is written as null (strict JSON). `rounds_needed` is inf where no number of rounds
would settle the cell (null in the document).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd

from treeopt.errors import UserError
from treeopt.fileio import read_json_input, write_json
from treeopt.selection_text import selection_summary
from treeopt.tree import Tree, make_tree

__all__ = [
    "SELECTION_FORMAT",
    "FORMS_FORMAT",
    "SelectionCell",
    "Provenance",
    "SelectionRule",
    "PooledEvidence",
    "MixCell",
    "MixSection",
    "FormOption",
    "FormCell",
    "FormsChoice",
    "Selection",
    "selection_to_json",
    "selection_from_json",
    "read_selection",
    "write_selection",
]

SELECTION_FORMAT = "treeopt.selection/v1"
FORMS_FORMAT = "treeopt.forms/v1"
Choices = tuple[tuple[int, ...], ...]


def _choices(value, where: str) -> Choices:
    if not isinstance(value, list) or not all(isinstance(p, list) for p in value):
        raise UserError(f"{where}: 'medusa_choices' must be a list of paths")
    try:
        return tuple(tuple(int(i) for i in p) for p in value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: 'medusa_choices' must be a list of integer paths") from None


def _json_choices(choices: Choices) -> list:
    return [list(p) for p in choices]


def _num_out(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _num_in(value, name: str, where: str) -> float:
    """A number of the document as a float (null: NaN); UserError naming it otherwise."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: '{name}' is not a number ({value!r})")
    return float(value)


def _int_in(value, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise UserError(f"{where}: '{name}' must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SelectionCell:
    """One (batch, context) of a selection: the tree shipped there (`nodes` 0 and no
    medusa_choices: no speculation), its speedup, and what decided it.

    measured_speedup/measured_by/predicted_speedup: the chosen size's figures side by side
    (selections of a sweep); speedup_lo/hi, rounds, reason, best_nodes, rounds_needed,
    unreliable_nodes, step_and_end_to_end_disagree: the measured decision
    (docs/statistics.md#choosing-a-tree-with-intervals); predicted_speedup_missing,
    measured_speedup_missing (with overhead_measured), plain_slower_nodes: why a figure is null
    and what the sanity checks flagged (docs/statistics.md#when-the-plain-step-is-the-slow-one);
    bound, open_nodes: a cell decided on fixed rounds (reason "best bound": the shipped tree's
    worst paired lower bound against every rival, and the rivals it is not shown to be within
    the tolerance of; docs/statistics.md#a-sweep-that-cannot-be-measured-again);
    fit_nodes, fit_consistent,
    decided_by: the pooled fit's evidence (docs/statistics.md#pooled-evidence); engine_line:
    the line the selection's engine takes (None for no speculation)."""

    batch: int
    context: int
    nodes: int
    speedup: float
    tau: float
    overhead: float
    medusa_choices: Choices = ()
    measured_speedup: float | None = None
    measured_by: str | None = None
    predicted_speedup: float | None = None
    predicted_speedup_missing: str | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    rounds: int | None = None
    reason: str | None = None
    rounds_needed: float | None = None
    best_nodes: int | None = None
    overhead_measured: float | None = None
    measured_speedup_missing: str | None = None
    unreliable_nodes: tuple[int, ...] = ()
    plain_slower_nodes: tuple[int, ...] = ()
    step_and_end_to_end_disagree: tuple[int, ...] = ()
    bound: float | None = None
    open_nodes: tuple[int, ...] = ()
    fit_nodes: int | None = None
    fit_consistent: bool | None = None
    decided_by: str | None = None
    engine_line: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.batch, self.context)


_CELL_NUMBERS = (
    "speedup",
    "tau",
    "overhead",
    "measured_speedup",
    "predicted_speedup",
    "speedup_lo",
    "speedup_hi",
    "overhead_measured",
    "bound",
)
_CELL_LISTS = ("unreliable_nodes", "plain_slower_nodes", "step_and_end_to_end_disagree", "open_nodes")


def _cell_to_json(cell: SelectionCell, engine: bool) -> dict:
    out = {}
    for f in fields(SelectionCell):
        value = getattr(cell, f.name)
        if f.name == "engine_line":
            if engine:
                out[f.name] = value
        elif f.name == "medusa_choices":
            out[f.name] = _json_choices(value)
        elif f.name in _CELL_LISTS:
            if value:
                out[f.name] = list(value)
        elif f.name == "rounds_needed":
            if value is not None:
                out[f.name] = int(value) if math.isfinite(value) else None
        elif f.name in _CELL_NUMBERS:
            if value is not None or f.name in ("speedup", "tau", "overhead"):
                out[f.name] = _num_out(value)
        elif value is not None:
            out[f.name] = value
    return out


def _cell_from_json(raw, where: str) -> SelectionCell:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: a cell is not an object ({raw!r})")
    try:
        batch, context, nodes = (int(raw[k]) for k in ("batch", "context", "nodes"))
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{where}: a cell without an integer batch, context and nodes: {raw!r}") from None
    where = f"{where}: cell batch {batch} context {context}"
    got = {"batch": batch, "context": context, "nodes": nodes}
    for name in _CELL_NUMBERS:
        if name in raw or name in ("speedup", "tau", "overhead"):
            got[name] = _num_in(raw.get(name), name, where)
    if "medusa_choices" in raw:
        got["medusa_choices"] = _choices(raw["medusa_choices"], where)
    for name in ("rounds", "best_nodes", "fit_nodes"):
        if raw.get(name) is not None:
            got[name] = _int_in(raw[name], name, where)
    for name in (
        "measured_by",
        "reason",
        "decided_by",
        "engine_line",
        "predicted_speedup_missing",
        "measured_speedup_missing",
    ):
        if raw.get(name) is not None:
            got[name] = str(raw[name])
    if "rounds_needed" in raw:
        got["rounds_needed"] = math.inf if raw["rounds_needed"] is None else float(raw["rounds_needed"])
    for name in _CELL_LISTS:
        if raw.get(name):
            got[name] = tuple(_int_in(v, name, where) for v in raw[name])
    if raw.get("fit_consistent") is not None:
        got["fit_consistent"] = bool(raw["fit_consistent"])
    return SelectionCell(**got)


@dataclass(frozen=True)
class Provenance:
    """Where a selection comes from: the machine and model it is for, what it was selected
    from (`source`, `selected_by` "measured" or "predicted"), and how the trees are drafted
    and verified (`heads`, `attention`, `verification`, `dtype`, `threads`); `labels` name a
    form's sizes ("gamma 3"); `engine` the engine whose lines the cells carry."""

    hardware: str = ""
    model: str = ""
    source: str = ""
    selected_by: str | None = None
    heads: int | None = None
    attention: str | None = None
    threads: int | None = None
    verification: str | None = None
    labels: dict | None = None
    dtype: str | None = None
    engine: str | None = None


@dataclass(frozen=True)
class SelectionRule:
    """The rule a selection was decided by: the `threshold` a tree must beat; for a measured
    selection the `confidence` of its comparisons, the `interval_confidence` of each shipped
    interval, the equivalence `tolerance`, and the cells left `undecided` or measured `noisy`
    (docs/statistics.md#choosing-a-tree-with-intervals)."""

    threshold: float | None = None
    confidence: float | None = None
    interval_confidence: float | None = None
    undecided: tuple[tuple[int, int], ...] | None = None
    noisy: tuple[tuple[int, int], ...] | None = None
    tolerance: float | None = None


@dataclass(frozen=True)
class PooledEvidence:
    """One profile fitted to every cell (docs/statistics.md#pooled-evidence): its `terms`, their
    95% `term_intervals` over `draws` refits, each term's fit status, in how many cells the
    measurement is consistent with it and how many undecided cells it decided; or `skipped`
    saying why no fit was made."""

    terms: dict = field(default_factory=dict)
    term_intervals: dict = field(default_factory=dict)
    term_status: dict = field(default_factory=dict)
    draws: int = 0
    consistent_cells: int = 0
    decided_cells: int = 0
    skipped: str | None = None

    def to_json(self) -> dict:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {
            "terms": {k: float(v) for k, v in self.terms.items()},
            "term_intervals": {k: list(v) for k, v in self.term_intervals.items()},
            "term_status": dict(self.term_status),
            "draws": self.draws,
            "consistent_cells": int(self.consistent_cells),
            "decided_cells": int(self.decided_cells),
        }

    @classmethod
    def from_json(cls, raw, where: str) -> PooledEvidence:
        if not isinstance(raw, dict):
            raise UserError(f"{where}: 'pooled_fit' is not an object")
        if "skipped" in raw:
            return cls(skipped=str(raw["skipped"]))
        return cls(
            dict(raw.get("terms", {})),
            {k: tuple(v) for k, v in raw.get("term_intervals", {}).items()},
            dict(raw.get("term_status", {})),
            int(raw.get("draws", 0)),
            int(raw.get("consistent_cells", 0)),
            int(raw.get("decided_cells", 0)),
        )


@dataclass(frozen=True)
class MixCell:
    """What one cell of the mix gets from the single tree against its own best tree."""

    batch: int
    context: int
    weight: float
    best_nodes: int
    best_speedup: float
    mix_nodes: int  # 0 where speculation is off at this batch
    mix_speedup: float
    plain_tokens_per_s: float
    loss_fraction: float  # 1 - mix_speedup / best_speedup (negative: the mix tree does better there)


_MIX_CELL_JSON = (
    "batch",
    "context",
    "weight",
    "best_nodes",
    "best_speedup",
    "mix_nodes",
    "mix_speedup",
    "loss_fraction",
)


@dataclass(frozen=True)
class MixSection:
    """The one tree for a traffic mix (docs/builders.md#one-tree-for-a-traffic-mix): its size
    and medusa_choices, the batch up to which speculation stays on, the throughputs and what
    each cell of the mix gets (`treeopt.mix.mix_section` builds it, rounded as written)."""

    source: str
    nodes: int
    medusa_choices: Choices
    speculate_up_to_batch: int
    off_from_batch: int | None
    threshold: float
    expected_tokens_per_s: float
    per_cell_best_tokens_per_s: float
    plain_tokens_per_s: float
    cells: tuple[MixCell, ...]

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cells"}
        out["medusa_choices"] = _json_choices(self.medusa_choices)
        out["cells"] = [{k: getattr(c, k) for k in _MIX_CELL_JSON} for c in self.cells]
        return out

    @classmethod
    def from_json(cls, raw, where: str) -> MixSection:
        if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
            raise UserError(f"{where}: 'mix' is not a mix section")
        try:
            cells = tuple(
                MixCell(**{k: c[k] for k in _MIX_CELL_JSON}, plain_tokens_per_s=math.nan) for c in raw["cells"]
            )
            return cls(
                str(raw["source"]),
                int(raw["nodes"]),
                _choices(raw["medusa_choices"], f"{where}: mix"),
                int(raw["speculate_up_to_batch"]),
                raw["off_from_batch"],
                float(raw.get("threshold", 1.0)),
                float(raw["expected_tokens_per_s"]),
                float(raw["per_cell_best_tokens_per_s"]),
                float(raw["plain_tokens_per_s"]),
                cells,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{where}: 'mix' lacks or mangles {err}") from None


@dataclass(frozen=True)
class FormOption:
    """One form's answer in a cell of `FormsChoice`."""

    nodes: int
    speedup: float
    speedup_lo: float
    speedup_hi: float


@dataclass(frozen=True)
class FormCell:
    """The form served in one (batch, context) (None: no speculation), its tree and interval,
    why, and every form's answer there (`by_form`)."""

    batch: int
    context: int
    form: str | None
    nodes: int
    speedup: float
    speedup_lo: float
    speedup_hi: float
    medusa_choices: Choices
    reason: str
    by_form: dict  # form -> FormOption


@dataclass(frozen=True)
class FormsChoice:
    """Per cell the form to serve with (`treeopt.forms.choose_form`,
    docs/builders.md#choosing-the-verification-form); `labels` name each form's sizes."""

    forms: tuple[str, ...]
    threshold: float
    cells: tuple[FormCell, ...]
    labels: dict | None = None

    def to_json(self) -> dict:
        cells = []
        for c in self.cells:
            row = {f.name: getattr(c, f.name) for f in fields(c)}
            row["medusa_choices"] = _json_choices(c.medusa_choices)
            row["by_form"] = {k: {f.name: getattr(v, f.name) for f in fields(v)} for k, v in c.by_form.items()}
            cells.append(row)
        out = {"format": FORMS_FORMAT, "forms": list(self.forms), "threshold": self.threshold, "cells": cells}
        if self.labels is not None:
            out["labels"] = self.labels
        return out

    @classmethod
    def from_json(cls, raw, where: str) -> FormsChoice:
        if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
            raise UserError(f"{where}: 'forms' is not a {FORMS_FORMAT} section")
        try:
            cells = tuple(
                FormCell(
                    **{k: c[k] for k in ("batch", "context", "form", "nodes", "speedup", "speedup_lo", "speedup_hi")},
                    medusa_choices=_choices(c["medusa_choices"], f"{where}: forms"),
                    reason=c["reason"],
                    by_form={k: FormOption(**v) for k, v in c["by_form"].items()},
                )
                for c in raw["cells"]
            )
            return cls(tuple(raw["forms"]), float(raw["threshold"]), cells, raw.get("labels"))
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{where}: 'forms' lacks or mangles {err}") from None


@dataclass(frozen=True)
class Selection:
    """The best tree per (batch, context) and the evidence beside it
    (docs/formats.md#selections-treeoptselectionv1): `provenance`, `cells`, the cells where not
    even plain decoding fits (`out_of_memory`), the decision `rule`, and where the selection has
    them the `pooled` fit, the drafter's other `forms`, the traffic `mix` and the engine's per-batch
    `schedule` (`treeopt.schedules.selection_schedule`'s section), and per cell whether a tree pays
    over the best chain (`chain_or_tree`, `treeopt.chain_or_tree`), and for a predicted grid which
    calls the model cannot separate (`close_calls`, `treeopt.close_calls`). `extra` keeps the
    keys of a document this treeopt does not know, written back unchanged."""

    provenance: Provenance
    cells: tuple[SelectionCell, ...]
    out_of_memory: tuple[tuple[int, int], ...] = ()
    rule: SelectionRule = SelectionRule()
    pooled: PooledEvidence | None = None
    forms: FormsChoice | None = None
    mix: MixSection | None = None
    schedule: dict | None = None
    chain_or_tree: dict | None = None
    close_calls: dict | None = None
    extra: dict = field(default_factory=dict)

    def cell(self, batch: int, context: int) -> SelectionCell:
        for c in self.cells:
            if c.batch == batch and c.context == context:
                return c
        raise UserError(f"selection: no cell batch={batch}, context={context}")

    def tree(self, batch: int, context: int) -> Tree:
        """The chosen tree of one cell (empty: no speculation)."""
        choices = [list(p) for p in self.cell(batch, context).medusa_choices]
        return make_tree(choices, allow_empty=True, source=f"cell batch={batch},context={context}")

    def to_frame(self) -> pd.DataFrame:
        """One row per cell: batch, context, nodes (0 = no speculation), speedup, tau, overhead,
        and where known the interval, reason and engine line."""
        keep = ["batch", "context", "nodes", "speedup", "speedup_lo", "speedup_hi", "tau", "overhead", "reason"]
        keep += ["engine_line"] if self.provenance.engine is not None else []
        frame = pd.DataFrame([_cell_to_json(c, self.provenance.engine is not None) for c in self.cells])
        return frame[[c for c in keep if c in frame.columns]]

    def summary(self) -> str:
        """The table `treeopt select` prints."""
        return selection_summary(self)

    def chosen_nodes(self) -> dict[tuple[int, int], int]:
        """{(batch, context): nodes} of every cell."""
        return {c.key: c.nodes for c in self.cells}

    def to_json(self) -> dict:
        return selection_to_json(self)

    def to_dict(self) -> dict:
        """The `treeopt.selection/v1` document (a new dict each call)."""
        return selection_to_json(self)

    def save(self, path) -> None:
        write_selection(path, self)


def _keys(pairs) -> list[dict]:
    return [{"batch": b, "context": c} for b, c in pairs]


def selection_to_json(sel: Selection) -> dict:
    """The one writer of the `treeopt.selection/v1` document: keys in the order every treeopt
    has written them."""
    p, r = sel.provenance, sel.rule
    doc = {"format": SELECTION_FORMAT, "hardware": p.hardware, "model": p.model, "source": p.source}
    doc["cells"] = [_cell_to_json(c, p.engine is not None) for c in sel.cells]
    if sel.out_of_memory:
        doc["out_of_memory"] = _keys(sel.out_of_memory)
    optional = (
        ("heads", p.heads),
        ("attention", p.attention),
        ("selected_by", p.selected_by),
        ("threshold", r.threshold),
        ("confidence", r.confidence),
        ("interval_confidence", r.interval_confidence),
        ("undecided", None if r.undecided is None else _keys(r.undecided)),
        ("noisy", None if r.noisy is None else _keys(r.noisy)),
        ("tolerance", r.tolerance),
        ("threads", p.threads),
        ("verification", p.verification),
        ("labels", p.labels),
        ("pooled_fit", None if sel.pooled is None else sel.pooled.to_json()),
        ("dtype", p.dtype),
        ("engine", p.engine),
        ("forms", None if sel.forms is None else sel.forms.to_json()),
        ("mix", None if sel.mix is None else sel.mix.to_json()),
        ("schedule", sel.schedule),
        ("chain_or_tree", sel.chain_or_tree),
        ("close_calls", sel.close_calls),
    )
    doc.update((k, v) for k, v in optional if v is not None)
    doc.update(sel.extra)
    return doc


_KNOWN = {
    "format",
    "hardware",
    "model",
    "source",
    "cells",
    "out_of_memory",
    "heads",
    "attention",
    "selected_by",
    "threshold",
    "confidence",
    "interval_confidence",
    "undecided",
    "noisy",
    "tolerance",
    "threads",
    "verification",
    "labels",
    "pooled_fit",
    "dtype",
    "engine",
    "forms",
    "mix",
    "schedule",
    "chain_or_tree",
    "close_calls",
}


def _key_pairs(raw, name: str, where: str) -> tuple[tuple[int, int], ...] | None:
    if raw is None:
        return None
    try:
        return tuple((int(u["batch"]), int(u["context"])) for u in raw)
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{where}: '{name}' must list {{batch, context}} objects") from None


def selection_from_json(doc, where: str = "selection") -> Selection:
    """A `treeopt.selection/v1` document (or a dict of its shape: a `format` is not required)
    as a `Selection`; UserError naming `where` when it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise UserError(f"{where}: not a selection (a {SELECTION_FORMAT} document has a 'cells' list)")
    if doc.get("format", SELECTION_FORMAT) != SELECTION_FORMAT:
        raise UserError(f"{where}: format {doc.get('format')!r}, expected {SELECTION_FORMAT}")
    g = doc.get
    provenance = Provenance(
        str(g("hardware", "")),
        str(g("model", "")),
        str(g("source", "")),
        g("selected_by"),
        g("heads"),
        g("attention"),
        g("threads"),
        g("verification"),
        g("labels"),
        g("dtype"),
        g("engine"),
    )
    rule = SelectionRule(
        g("threshold"),
        g("confidence"),
        g("interval_confidence"),
        _key_pairs(g("undecided"), "undecided", where),
        _key_pairs(g("noisy"), "noisy", where),
        g("tolerance"),
    )
    return Selection(
        provenance,
        tuple(_cell_from_json(c, where) for c in doc["cells"]),
        _key_pairs(g("out_of_memory"), "out_of_memory", where) or (),
        rule,
        PooledEvidence.from_json(doc["pooled_fit"], where) if "pooled_fit" in doc else None,
        FormsChoice.from_json(doc["forms"], where) if "forms" in doc else None,
        MixSection.from_json(doc["mix"], where) if "mix" in doc else None,
        _schedule_in(g("schedule"), where),
        _section_in(g("chain_or_tree"), "chain_or_tree", where),
        _section_in(g("close_calls"), "close_calls", where),
        {k: v for k, v in doc.items() if k not in _KNOWN},
    )


def _schedule_in(raw, where: str) -> dict | None:
    if raw is not None and (not isinstance(raw, dict) or not isinstance(raw.get("engine"), str)):
        raise UserError(f"{where}: 'schedule' is not a schedule section (an object naming its engine)")
    return raw


def _section_in(raw, name: str, where: str) -> dict | None:
    if raw is not None and (not isinstance(raw, dict) or not isinstance(raw.get("cells"), list)):
        raise UserError(f"{where}: '{name}' is not an object with a 'cells' list")
    return raw


def read_selection(path) -> Selection:
    """The selection file at `path` (`treeopt select`, `treeopt run`); UserError naming the file
    when it is missing or not a selection."""
    doc = read_json_input(path, "a selection file")
    if not isinstance(doc, dict) or doc.get("format") != SELECTION_FORMAT:
        raise UserError(f"{path}: not a {SELECTION_FORMAT} document (from `treeopt select`)")
    return selection_from_json(doc, str(Path(path)))


def write_selection(path, sel: Selection) -> None:
    write_json(path, selection_to_json(sel))
