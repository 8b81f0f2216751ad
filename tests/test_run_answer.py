"""The answer that opens a run's index.md: per (batch, context) the line to paste, why, and how
sure; the readings that look like contradictions explained where they occur
(docs/architecture.md#the-run-report)."""

from __future__ import annotations

import pandas as pd

from treeopt.app.run_answer import answer_section
from treeopt.app.run_index import _above_one_note
from treeopt.engines import get_engine

CHOICES = [[0], [0, 0], [1], [0, 0, 0]]


def cell(batch, nodes, reason, **extra):
    return {
        "batch": batch,
        "context": 512,
        "nodes": nodes,
        "speedup": 1.5 if nodes else 1.0,
        "tau": 2.0 if nodes else 1.0,
        "medusa_choices": CHOICES[:nodes],
        "speedup_lo": 1.4 if nodes else 1.0,
        "speedup_hi": 1.6 if nodes else 1.0,
        "rounds": 10,
        "reason": reason,
        "best_nodes": nodes,
        **extra,
    }


SELECTION = {
    "confidence": 0.9833,
    "interval_confidence": 0.9976,
    "tolerance": 0.05,
    "noisy": [{"batch": 8, "context": 512}],
    "cells": [
        cell(1, 4, "best"),
        cell(2, 1, "within-tolerance", best_nodes=4),
        cell(4, 2, "best", decided_by="pooled fit", best_nodes=1),
        cell(8, 0, "no speculation"),
    ],
}


def rows(lines):
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ") and "---" not in line
    ][1:]


def test_each_cell_gets_the_line_to_paste_why_and_how_sure():
    lines = answer_section(SELECTION, None, heads=4)
    assert lines[0] == "## The answer: what to ship per batch size"
    assert "No `--engine` was given" in lines[2]
    r = rows(lines)
    assert [x[:2] for x in r] == [["1", "512"], ["2", "512"], ["4", "512"], ["8", "512"]]
    assert r[0][2] == "`medusa_choices = [[0], [0, 0], [1], [0, 0, 0]]`"
    assert r[0][3] == "largest measured speedup (4 nodes)"
    assert r[0][4] == "1.50x, 99.76% interval 1.40–1.60, 10 rounds"
    # the smaller tree within the tolerance of a larger one, said so
    assert "smallest tree within 5% of the largest point speedup (4 nodes)" in r[1][3]
    # the pooled fit's pick beside a different largest point of the cell's own measurement
    assert "the profile fitted to every cell picks 2 nodes" in r[2][3]
    assert "this cell's own largest point speedup is at 1 node" in r[2][3]
    assert r[3][2] == "no speculation" and r[3][4] == "--"


def test_with_an_engine_the_line_is_that_engines():
    r = rows(answer_section(SELECTION, get_engine("trtllm"), heads=4))
    assert r[0][2] == '`--medusa_choices="[[0], [0, 0], [1], [0, 0, 0]]"`'


def test_a_tau_speedup_and_a_noisy_cell_are_named():
    sel = dict(SELECTION, cells=[cell(8, 4, "best", measured_speedup_missing="T(n)/T(0) measured 0.982")])
    (r,) = rows(answer_section(sel, None, heads=4))
    assert r[4].startswith("= τ 1.50x (not measured") and r[4].endswith("noisy (interval wider than ±10%)")


def test_a_fraction_of_selected_above_one_is_explained_where_it_occurs():
    regret = pd.DataFrame({"batch": [4, 8], "context": [512, 512], "fraction_of_selected": [1.0, 1.064]})
    (note, _) = _above_one_note(regret)
    assert note.startswith("A fraction above 1 (batch 8 context 512)") and "smallest tree" in note
    assert _above_one_note(regret.assign(fraction_of_selected=[1.0, 0.97])) == []


def test_a_cell_decided_on_fixed_rounds_says_its_bound_and_open_rivals():
    # bound 0.8: no rival more than 1 / 0.8 - 1 = 25% faster; 4 nodes not shown as good
    sel = dict(SELECTION, cells=[cell(2, 2, "best bound", bound=0.8, open_nodes=[4], rounds_needed=120, best_nodes=4)])
    (r,) = rows(answer_section(sel, None, heads=4))
    assert "worst paired lower bound against every rival is the highest" in r[3]
    assert "no tree more than 25% faster, not shown as good as 4 nodes" in r[3]
    assert "about 120 rounds would settle it" in r[3]
