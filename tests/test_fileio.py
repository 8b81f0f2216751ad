"""Table-shaped JSON (treeopt.fileio.json_rows): the same value as json.dumps, one row a line."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from treeopt.fileio import json_rows

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=30,
)


def test_an_accuracy_document_is_laid_out_one_row_a_line():
    doc = {
        "format": "treeopt.accuracy/v1",
        "heads": [{"head": 1, "hits": [3, 1]}],
        "joint": {"prefixes": [[[0], 3], [[0, 1], 1]]},
        "provenance": {},
    }
    expected = (
        "{\n"
        ' "format": "treeopt.accuracy/v1",\n'
        ' "heads": [\n'
        "  {\n"
        '   "head": 1,\n'
        '   "hits": [3, 1]\n'
        "  }\n"
        " ],\n"
        ' "joint": {\n'
        '  "prefixes": [\n'
        "   [[0], 3],\n"
        "   [[0, 1], 1]\n"
        "  ]\n"
        " },\n"
        ' "provenance": {}\n'
        "}\n"
    )
    assert json_rows(doc) == expected


@given(VALUES)
def test_rows_parse_to_the_value_written(value):
    assert json.loads(json_rows(value)) == json.loads(json.dumps(value))
