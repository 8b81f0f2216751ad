"""Table-shaped JSON (treeopt.fileio.json_rows): the same value as json.dumps, one row a line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.fileio import finite_json, json_rows

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
    # the value as strict JSON writes it: a NaN or an infinity is null (docs/formats.md#strict-json)
    assert json.loads(json_rows(value)) == json.loads(json.dumps(finite_json(value)))


def test_an_accuracy_table_is_saved_one_joint_prefix_a_line(tmp_path):
    """Rank vectors of 3 positions under 2 heads: 2 depth-1 prefixes and 3 depth-2 prefixes,
    each of which must take exactly one line of the file."""
    table = AccuracyTable.from_ranks(np.array([[0, 1], [0, 0], [1, 0]]), width=2)
    table.save(tmp_path / "a.json")
    text = (tmp_path / "a.json").read_text()
    assert sum(line.strip().startswith("[[") for line in text.splitlines()) == 5
    assert load_accuracy(tmp_path / "a.json").joint == table.joint


def test_a_number_past_pythons_digit_limit_is_named_as_such():
    # CPython refuses int() of more than sys.get_int_max_str_digits() digits (4300 by default)
    import sys

    from treeopt.errors import UserError
    from treeopt.fileio import parse_json_input

    digits = sys.get_int_max_str_digits()
    with pytest.raises(UserError) as err:
        parse_json_input("[" + "9" * (digits + 1) + "]", "big.json")
    assert str(err.value) == f"big.json: not readable JSON (a number of more than {digits} digits)"


def test_a_report_folder_gets_the_permissions_mkdir_gives(tmp_path):
    """`report` and `validate` write their folder through atomic_folder: 0755 under umask 022,
    as `treeopt run`'s folder (mkdir), not mkdtemp's 0700."""
    import os
    import stat

    from treeopt.fileio import atomic_folder

    old = os.umask(0o022)
    try:
        with atomic_folder(tmp_path / "report") as folder:
            (folder / "index.md").write_text("x")
        (tmp_path / "run").mkdir()
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "report").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755
