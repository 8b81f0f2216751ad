import json
from collections import Counter
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from treeopt.accuracy import (
    AccuracyTable,
    expected_tokens,
    joint_counts_from_ranks,
    load_accuracy,
    node_values,
    unmeasured_nodes,
)
from treeopt.errors import UserError
from treeopt.tree import make_tree, reference_trees

MEDUSA_CSV = str(resources.files("treeopt").joinpath("data/medusa_train_accuracy.csv"))


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text if isinstance(text, str) else json.dumps(text))
    return str(p)


# --- readers ---------------------------------------------------------------------------------


def test_medusa_csv_per_rank_is_successive_differences():
    t = load_accuracy(MEDUSA_CSV, model="vicuna-7b")
    assert (t.num_heads, t.width) == (5, 5)
    np.testing.assert_allclose(t.accuracy[0], [0.5604, 0.1113, 0.0554, 0.0328, 0.0200], atol=1e-12)
    np.testing.assert_allclose(t.accuracy[4], [0.1175, 0.0691, 0.0480, 0.0375, 0.0277], atol=1e-12)
    np.testing.assert_allclose(t.accuracy.sum(axis=1), [0.7799, 0.5625, 0.4169, 0.3397, 0.2998])
    assert t.provenance["model"] == "vicuna-7b"
    assert t.provenance["source"] == "medusa_train_accuracy.csv"
    assert any("ShareGPT" in n for n in t.provenance["notes"])
    assert load_accuracy(MEDUSA_CSV, model="vicuna-33b").accuracy[0, 0] == pytest.approx(0.6046)


def test_csv_model_choice(tmp_path):
    with pytest.raises(
        UserError, match=r"holds several models \(vicuna-7b, vicuna-13b, vicuna-33b\); choose one with --csv-model"
    ):
        load_accuracy(MEDUSA_CSV)
    with pytest.raises(UserError, match=r"no rows for model 'llama'"):
        load_accuracy(MEDUSA_CSV, model="llama")
    # One model, no model column, heads numbered from 1, R = 3.
    p = write(tmp_path, "one.csv", "head,top1,top2,top3\n1,0.5,0.6,0.7\n2,0.3,0.4,0.45\n")
    t = load_accuracy(p)
    np.testing.assert_allclose(t.accuracy, [[0.5, 0.1, 0.1], [0.3, 0.1, 0.05]])
    # Spreadsheet exports: a byte-order mark and CRLF line ends.
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfhead,top1\r\n0,0.5\r\n")
    assert load_accuracy(str(bom)).accuracy.tolist() == [[0.5]]


@pytest.mark.parametrize(
    "text, message",
    [
        ("model,head,top1,top2\nm,0,0.5,0.4\n", "line 2: top2 = 0.4 is below top1 = 0.5"),
        ("model,head,top1,top2\nm,0,0.5,abc\n", "line 2: top2 'abc' is not a number"),
        ("model,head,top1,top2\nm,0,0.5,1.2\n", "line 2: top2 = 1.2 is outside [0, 1]"),
        ("model,head,top1,top2\nm,0,0.5\n", "line 2: 3 fields, the header has 4"),
        ("model,head,top1,top2\nm,0,0.5,0.6\nm,0,0.5,0.6\n", "line 3: head 0 of m appears twice (line 2)"),
        ("model,head,top1,top2\nm,0,0.5,0.6\nm,2,0.5,0.6\n", "heads of m are [0, 2]"),
        ("model,head,top1,top3\nm,0,0.5,0.6\n", "columns must be top1, top2, ... in order"),
        ("model,head,top1,count\nm,0,0.5,3\n", "unknown column 'count'"),
        ("model,top1\nm,0.5\n", "header has no 'head' column"),
        ("model,head,top1\nm,x,0.5\n", "line 2: head 'x' is not an integer"),
        ("# only a comment\n", "no header line"),
        ("model,head,top1\n", "no data rows"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path, text, message):
    p = write(tmp_path, "acc.csv", text)
    with pytest.raises(UserError) as err:
        load_accuracy(p)
    assert str(err.value).startswith(p + ": ")
    assert message in str(err.value)


def test_matrix_reader(tmp_path):
    p = write(tmp_path, "m.json", [[0.5, 0.2, 0.1], [0.3, 0.1, 0.0]])
    t = load_accuracy(p)
    np.testing.assert_allclose(t.accuracy, [[0.5, 0.2, 0.1], [0.3, 0.1, 0.0]])
    assert t.positions.tolist() == [1.0, 1.0]
    assert "matrix" in t.provenance["source_format"]
    for doc, message in [
        ([[0.5, 0.2], [0.3]], "row 1 (head 2) has 1 values, row 0 has 2"),
        ([[0.5, 0.6, 0.3]], "sum to 1.4 > 1 (cumulative top-k values?"),
        ([[0.5, -0.1]], "accuracy -0.1 at rank 1 is outside [0, 1]"),
        ([[0.5, "x"]], "row 0 (head 1) value 1: expected a finite number"),
        ([], "non-empty list of lists"),
    ]:
        p = write(tmp_path, "bad.json", doc)
        with pytest.raises(UserError, match=None) as err:
            load_accuracy(p)
        assert message in str(err.value) and str(err.value).startswith(p)
    with pytest.raises(UserError, match="can only be chosen in a CSV"):
        load_accuracy(write(tmp_path, "m2.json", [[0.5]]), model="x")


def test_missing_or_broken_files(tmp_path):
    with pytest.raises(UserError, match=r"nope\.json: no such file"):
        load_accuracy(str(tmp_path / "nope.json"))
    with pytest.raises(UserError, match="not valid JSON"):
        load_accuracy(write(tmp_path, "x.json", "{oops"))
    with pytest.raises(UserError, match="is a directory"):
        load_accuracy(str(tmp_path))
    bad = tmp_path / "latin.json"
    bad.write_bytes(b"\xff\xfe[[0.5]]")
    with pytest.raises(UserError, match="not a UTF-8 text file"):
        load_accuracy(str(bad))


# --- v1 format --------------------------------------------------------------------------------


def v1_table(width=4):
    rng = np.random.default_rng(1)
    ranks = np.minimum(rng.geometric(0.5, size=(500, 3)) - 1, width + 2)
    ranks[-3:, 2] = -1  # the last positions have no label for head 3
    ranks[-1:, 1] = -1
    return AccuracyTable.from_ranks(ranks, width, provenance={"model": "demo", "dataset": "unit test"})


@pytest.mark.parametrize("width", [4, 32, 64])
def test_v1_round_trip(tmp_path, width):
    t = v1_table(width)
    path = tmp_path / "acc.json"
    t.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "treeopt.accuracy/v1"
    assert (doc["num_heads"], doc["width"]) == (3, width)
    assert doc["heads"][2]["positions"] == 497 and doc["heads"][0]["head"] == 1
    assert isinstance(doc["heads"][0]["hits"][0], int)
    u = load_accuracy(path)
    np.testing.assert_array_equal(u.hits, t.hits)
    np.testing.assert_array_equal(u.positions, t.positions)
    assert u.joint == t.joint
    assert u.provenance == t.provenance
    assert u.provenance["model"] == "demo" and "tool_version" in u.provenance and "date" in u.provenance


def test_from_ranks_counts_by_hand():
    ranks = np.array([[0, 1], [0, 0], [2, -1], [1, 5]])
    t = AccuracyTable.from_ranks(ranks, 3)
    assert t.positions.tolist() == [4, 3]  # head 2 has one unlabelled position
    assert t.hits.tolist() == [[2, 1, 1], [1, 1, 0]]
    assert t.joint == {(0,): 2, (1,): 1, (2,): 1, (0, 0): 1, (0, 1): 1}


def good_doc():
    return {
        "format": "treeopt.accuracy/v1",
        "num_heads": 2,
        "width": 2,
        "heads": [
            {"head": 1, "positions": 10, "hits": [5, 2], "accuracy": [0.5, 0.2]},
            {"head": 2, "positions": 9, "hits": [3, 1]},
        ],
        "joint": {"prefixes": [[[0], 5], [[1], 2], [[0, 0], 3], [[0, 1], 1]]},
        "provenance": {"model": "m"},
    }


def mutate(path, value):
    d = good_doc()
    obj = d
    for key in path[:-1]:
        obj = obj[key]
    if value is KeyError:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return d


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["format"], "treeopt.accuracy/v2", "field 'format' is 'treeopt.accuracy/v2'"),
        (["num_heads"], 3, "field 'heads' must list 3 heads (num_heads), got 2 entries"),
        (["width"], 0, "field 'width' must be an integer >= 1"),
        (["heads", 0, "hits"], [5, 2, 1], "heads[0].hits: expected 2 values (width), got 3"),
        (["heads", 0, "hits"], [5, 7], "head 1 has 12 hits in all ranks but only 10 positions"),
        (["heads", 1, "hits"], [3, -1], "head 2 rank 1 has a negative hit count -1"),
        (["heads", 1, "positions"], 0, "head 2 has 0 labelled positions"),
        (["heads", 1, "positions"], "9", "heads[1].positions: expected a finite number"),
        (["heads", 1, "head"], 3, "heads[1]: field 'head' is 3, expected 2"),
        (["heads", 0, "accuracy"], [0.5, 0.3], "heads[0].accuracy[1] is 0.3 but hits/positions is 0.2"),
        (
            ["joint", "prefixes", 3],
            [[0, 1], 4],
            "the paths one rank below [0] count 7 in total, more than path [0]'s count 5",
        ),
        (["joint", "prefixes", 2], [[0, 0], 6], "path [0, 0]: count 6 exceeds its prefix [0]'s count 5"),
        (["joint", "prefixes", 2], [[1, 0, 0], 1], "depth 3 exceeds the 2 heads"),
        (["joint", "prefixes", 2], [[0, 2], 1], "ranks must be in 0..1 (width 2)"),
        (["joint", "prefixes", 2], [[0, 0], -1], "negative count -1"),
        (["joint", "prefixes", 2], [[0], 1], "path [0] appears twice"),
        (["joint", "prefixes", 2], [[0, 0]], "joint.prefixes[2]: expected [path, count]"),
        (["joint", "prefixes", 1], [[1], 6], "below the root count 11 in total, more than head 1's 10 positions"),
        (["joint"], [1], "field 'joint' must be null or"),
        (["provenance"], [1], "field 'provenance' must be an object"),
    ],
)
def test_v1_errors_name_file_and_field(tmp_path, path, value, message):
    p = write(tmp_path, "acc.json", mutate(path, value))
    with pytest.raises(UserError) as err:
        load_accuracy(p)
    assert str(err.value).startswith(p + ": ")
    assert message in str(err.value)


def test_v1_minimal_doc_loads(tmp_path):
    d = mutate(["joint"], None)
    del d["provenance"]
    t = load_accuracy(write(tmp_path, "a.json", d))
    assert t.joint is None and t.provenance == {}
    np.testing.assert_allclose(t.accuracy, [[0.5, 0.2], [3 / 9, 1 / 9]])


def test_wilson_interval_known_value():
    t = AccuracyTable(hits=[[50, 0]], positions=[100])
    lo, hi = t.wilson()
    assert lo[0, 0] == pytest.approx(0.4038, abs=1e-4) and hi[0, 0] == pytest.approx(0.5962, abs=1e-4)
    assert lo[0, 1] == 0.0 and hi[0, 1] == pytest.approx(0.0370, abs=1e-4)


# --- joint counts -----------------------------------------------------------------------------


def brute_joint(ranks, width):
    out = Counter()
    for row in ranks.tolist():
        for d in range(len(row)):
            if not 0 <= row[d] < width:
                break
            out[tuple(row[: d + 1])] += 1
    return dict(out)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(np.int64, st.tuples(st.integers(0, 40), st.integers(1, 4)), elements=st.integers(-1, 5)),
    st.integers(1, 5),
)
def test_joint_counts_match_brute_force(ranks, width):
    assert joint_counts_from_ranks(ranks, width) == brute_joint(ranks, width)


def test_joint_counts_wide_table_fallback():
    # width**K beyond int64: the unique-rows path.
    rng = np.random.default_rng(0)
    ranks = rng.integers(-1, 3, size=(200, 5)) * (2**20 // 3)
    assert joint_counts_from_ranks(ranks, 2**20) == brute_joint(ranks, 2**20)


# --- expected tokens --------------------------------------------------------------------------


def test_tau_by_hand():
    acc = np.array([[0.5, 0.2], [0.4, 0.1]])
    tree = make_tree([[0], [0, 0], [1], [0, 1], [1, 0]])
    # 1 + 0.5 + 0.5*0.4 + 0.2 + 0.5*0.1 + 0.2*0.4
    assert expected_tokens(tree, acc) == pytest.approx(1 + 0.5 + 0.2 + 0.2 + 0.05 + 0.08)
    np.testing.assert_allclose(node_values(tree, acc), [0.5, 0.2, 0.2, 0.05, 0.08])


def test_tau_design_example_against_medusa_csv():
    # The buffer example tree of docs/trees.md#test-vector under vicuna-7b's published accuracies, by hand.
    t = load_accuracy(MEDUSA_CSV, model="vicuna-7b")
    tree = make_tree([[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]])
    a1 = [0.5604, 0.1113]
    a2 = [0.3164, 0.1072, 0.0615]
    expected = 1 + sum(a1) + sum(x * y for x in a1 for y in a2)
    assert expected_tokens(tree, t) == pytest.approx(expected, rel=1e-12)


def test_tau_joint_by_hand():
    ranks = np.array([[0, 0], [0, 1], [0, 0], [1, 0], [3, 0]])
    t = AccuracyTable.from_ranks(ranks, 2)
    tree = make_tree([[0], [0, 0], [1], [1, 1]])
    # counts [0]:3, [0,0]:2, [1]:1, [1,1]:0 over 5 positions per head
    assert expected_tokens(tree, t, joint=True) == pytest.approx(1 + (3 + 2 + 1 + 0) / 5)
    # Independence uses the marginals instead: acc1 = [0.6, 0.2], acc2 = [0.8, 0.2].
    assert expected_tokens(tree, t) == pytest.approx(1 + 0.6 + 0.6 * 0.8 + 0.2 + 0.2 * 0.2)


def test_joint_denominator_is_the_heads_own_positions():
    ranks = np.array([[0, 0], [0, -1]])  # head 2 has one labelled position
    t = AccuracyTable.from_ranks(ranks, 2)
    assert node_values(make_tree([[0], [0, 0]]), t, joint=True).tolist() == [1.0, 1.0]


def test_strict_and_lenient_evaluation():
    t = load_accuracy(MEDUSA_CSV, model="vicuna-7b")
    mc = reference_trees()["mc_sim_7b_63"]
    with pytest.raises(UserError, match=r"mc_sim_7b_63: node \[0, 5\] has rank 5, but the accuracy table has width 5"):
        expected_tokens(mc, t)
    vals = node_values(mc, t, strict=False)
    wide = [i for i, p in enumerate(mc.paths) if max(p) >= 5]
    assert (vals[wide] == 0).all() and (np.delete(vals, wide) > 0).all()
    assert unmeasured_nodes(mc, 5, 5) == (0, len(wide))
    assert unmeasured_nodes(mc, 3, 10) == (2, 0)
    with pytest.raises(UserError, match=r"node \[0, 0, 0, 0\] has depth 4, but the accuracy table has 3 heads"):
        expected_tokens(mc, np.full((3, 10), 0.05))
    deep = node_values(mc, np.full((3, 10), 0.05), strict=False)
    assert deep[mc.paths.index((0, 0, 0, 0))] == 0
    with pytest.raises(UserError, match="has no joint statistics"):
        expected_tokens(mc, t, joint=True, strict=False)
    with pytest.raises(UserError, match="need an AccuracyTable"):
        expected_tokens(mc, np.ones((4, 10)) * 0.1, joint=True)


def test_documented_example_loads():
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "accuracy-format.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", doc, re.S)
    t = AccuracyTable.from_dict(json.loads(blocks[0]), source="docs/accuracy-format.md")
    assert (t.num_heads, t.width) == (2, 3) and t.joint[(0, 0)] == 201
    matrix = json.loads(blocks[1])
    assert AccuracyTable(hits=matrix, positions=np.ones(len(matrix))).width == 3
