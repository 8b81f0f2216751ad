import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeopt.errors import UserError
from treeopt.tree import (
    Tree,
    load_tree,
    make_tree,
    reference_trees,
    reference_trees_about,
    tree_buffers,
)

DESIGN_CHOICES = [[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]]


def medusa_buffers_reference(choices, topk):
    """A line-by-line port of Medusa's generate_medusa_buffers (list.index lookups, loops)."""
    s = sorted([tuple(c) for c in choices], key=lambda x: (len(x), x))
    q = len(s) + 1
    mask = np.eye(q)
    mask[:, 0] = 1
    for i, c in enumerate(s):
        for k in range(len(c) - 1):
            mask[i + 1, s.index(c[: k + 1]) + 1] = 1
    tree_indices = np.zeros(q, dtype=np.int64)
    pos = np.zeros(q, dtype=np.int64)
    for i, c in enumerate(s):
        tree_indices[i + 1] = c[-1] + topk * (len(c) - 1) + 1
        pos[i + 1] = len(c)
    nest, seen = [], []
    for i in range(len(s)):
        c = s[-i - 1]
        if c in seen:
            continue
        row = []
        for k in range(len(c)):
            row.append(s.index(c[: k + 1]))
            seen.append(c[: k + 1])
        nest.append(row)
    width = max(len(r) for r in nest)
    rows = [[0] + [x + 1 for x in r] + [-1] * (width - len(r)) for r in nest]
    return mask.astype(bool), pos, tree_indices, np.array(rows, dtype=np.int64)


def test_design_test_vector():
    buf = tree_buffers(make_tree(DESIGN_CHOICES), topk=10)
    assert buf.tree_indices.tolist() == [0, 1, 2, 11, 12, 13, 11, 12, 13]
    assert buf.position_ids.tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert buf.retrieve_indices.tolist() == [[0, 2, 8], [0, 2, 7], [0, 2, 6], [0, 1, 5], [0, 1, 4], [0, 1, 3]]
    assert buf.parent.tolist() == [-1, 0, 0, 1, 1, 1, 2, 2, 2]
    assert buf.depth.tolist() == buf.position_ids.tolist()
    # Row 7 is node [1, 1]: root, [1] (token 2) and itself.
    assert np.flatnonzero(buf.attention_mask[7]).tolist() == [0, 2, 7]
    assert buf.attention_mask.dtype == bool and buf.attention_mask.shape == (9, 9)
    for a in (buf.position_ids, buf.tree_indices, buf.retrieve_indices, buf.parent):
        assert a.dtype == np.int64


@pytest.mark.parametrize("name", sorted(reference_trees()))
@pytest.mark.parametrize("topk", [10, 16])
def test_buffers_match_medusa_code_on_reference_trees(name, topk):
    tree = reference_trees()[name]
    mask, pos, idx, ret = medusa_buffers_reference(tree.to_choices(), topk)
    buf = tree_buffers(tree, topk)
    assert np.array_equal(buf.attention_mask, mask)
    assert np.array_equal(buf.position_ids, pos)
    assert np.array_equal(buf.tree_indices, idx)
    assert np.array_equal(buf.retrieve_indices, ret)


@st.composite
def random_trees(draw, max_depth=4, max_rank=4, max_nodes=25):
    """Random valid trees in a random (still prefix-valid) insertion order."""
    paths = [()]
    chosen = []
    for _ in range(draw(st.integers(0, max_nodes))):
        parent = draw(st.sampled_from(paths))
        if len(parent) >= max_depth:
            continue
        child = parent + (draw(st.integers(0, max_rank)),)
        if child not in chosen:
            chosen.append(child)
            paths.append(child)
    return chosen


@settings(max_examples=60, deadline=None)
@given(random_trees())
def test_buffers_match_medusa_code_on_random_trees(paths):
    tree = Tree(tuple(paths))
    buf = tree_buffers(tree, 5)
    if not paths:
        assert buf.retrieve_indices.tolist() == [[0]]
        assert buf.attention_mask.tolist() == [[True]]
        return
    mask, pos, idx, ret = medusa_buffers_reference(paths, 5)
    assert np.array_equal(buf.attention_mask, mask)
    assert np.array_equal(buf.position_ids, pos)
    assert np.array_equal(buf.tree_indices, idx)
    assert np.array_equal(buf.retrieve_indices, ret)
    assert buf.retrieve_indices.shape == (tree.num_leaves, tree.depth + 1)


def test_statistics_by_hand():
    t = make_tree([[1], [1, 2], [0], [1, 0], [1, 2, 0]])
    assert t.size == 5 and t.depth == 3
    assert t.sorted_paths == ((0,), (1,), (1, 0), (1, 2), (1, 2, 0))
    assert t.depth_histogram == (2, 2, 1)
    assert t.max_rank_per_depth == (1, 2, 0)
    assert t.num_leaves == 3  # [0], [1, 0], [1, 2, 0]
    assert t.to_choices() == [[1], [1, 2], [0], [1, 0], [1, 2, 0]]
    assert t.rank_matrix.tolist() == [[1, -1, -1], [1, 2, -1], [0, -1, -1], [1, 0, -1], [1, 2, 0]]


def test_reference_trees_shipped_with_attribution():
    refs = reference_trees()
    assert sorted(refs) == ["mc_sim_7b_63", "vicuna_7b_stage1", "vicuna_7b_stage1_ablation", "vicuna_7b_stage2"]
    t = refs["mc_sim_7b_63"]
    assert (t.size, t.depth, t.num_leaves) == (63, 4, 42)
    assert t.depth_histogram == (10, 28, 23, 2)
    assert t.max_rank_per_depth == (9, 9, 9, 1)
    assert t.paths[:4] == ((0,), (0, 0), (1,), (0, 1))
    assert "Medusa" in reference_trees_about() and "Apache" in reference_trees_about()
    for tree in refs.values():  # greedy insertion order: every prefix is a tree
        for n in range(tree.size + 1):
            assert tree.prefix(n).size == n


@pytest.mark.parametrize(
    "choices, kwargs, message",
    [
        ([[0], [1, 3, 0]], {}, "node [1, 3, 0] has no parent [1, 3]"),
        ([[0], [1], [0]], {}, "node [0] appears twice (#0 and #2)"),
        ([[0], [0, -1]], {}, "node [0, -1] has a negative rank -1"),
        ([[0], [0, 1.5]], {}, "node [0, 1.5] has a non-integer rank 1.5"),
        ([[0], [0, True]], {}, "non-integer rank True"),
        ([[0], ["1"]], {}, "non-integer rank '1'"),
        ([[0], [10]], {"topk": 10}, "node [10] has rank 10, not below the candidate width (topk) 10"),
        ([[0], [0, 0], [0, 0, 0]], {"num_heads": 2}, "node [0, 0, 0] has depth 3, more than the 2 heads"),
        ([[0], []], {}, "node #1 is an empty path"),
        ([], {}, "the tree is empty"),
        ([[0], 3], {}, "node #1 (3) is not a list of ranks"),
        ("[[0]]", {}, "medusa_choices must be a list"),
    ],
)
def test_validation_errors_name_the_node(choices, kwargs, message):
    with pytest.raises(UserError) as err:
        make_tree(choices, source="mytree.json", **kwargs)
    assert str(err.value).startswith("mytree.json: ")
    assert message in str(err.value)


def test_empty_tree_when_allowed():
    t = make_tree([], allow_empty=True)
    assert (t.size, t.depth, t.num_leaves, t.depth_histogram) == (0, 0, 0, ())
    assert tree_buffers(t, 10).tree_indices.tolist() == [0]


def test_prefix_that_is_not_a_tree_is_an_error():
    t = make_tree([[0], [0, 0], [0, 0, 0]], source="x").prefix(3)
    assert t.size == 3
    out_of_order = Tree(((0,), (1, 0), (1,)), name="odd")
    with pytest.raises(UserError, match=r"odd: its first 2 nodes do not form a tree .*\[1, 0\] has no parent \[1\]"):
        out_of_order.prefix(2)


def test_load_tree_sources(tmp_path):
    assert load_tree("mc_sim_7b_63") == reference_trees()["mc_sim_7b_63"]
    assert load_tree("mc_sim_7b_63").name == "mc_sim_7b_63"
    lit = load_tree("[(0,), (0, 0), [1]]")
    assert lit.paths == ((0,), (0, 0), (1,))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(DESIGN_CHOICES))
    assert load_tree(str(plain)).to_choices() == DESIGN_CHOICES
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"format": "treeopt.tree/v1", "medusa_choices": [[0], [1]]}))
    assert load_tree(str(doc)).paths == ((0,), (1,))
    assert load_tree(str(doc)).name == str(doc)


def test_load_tree_errors(tmp_path):
    with pytest.raises(UserError, match=r"nosuch\.json: no such file.*mc_sim_7b_63"):
        load_tree("nosuch.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[[0], [1")
    with pytest.raises(UserError, match=r"bad\.json: not valid JSON"):
        load_tree(str(bad))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": "other/v1", "medusa_choices": [[0]]}))
    with pytest.raises(UserError, match=r"wrong\.json: field 'format' is 'other/v1'"):
        load_tree(str(wrong))
    with pytest.raises(UserError, match="is a directory"):
        load_tree(str(tmp_path))
    with pytest.raises(UserError, match=r"tree literal '\[\[0\], \[1,': not a valid list"):
        load_tree("[[0], [1,")
    with pytest.raises(UserError, match=r"node \[0, 12\] has rank 12"):
        load_tree("[[0], [0, 12]]", topk=10)
    with pytest.raises(UserError, match=r"mc_sim_7b_63: node \[0, 0, 0, 0\] has depth 4, more than the 3 heads"):
        load_tree("mc_sim_7b_63", num_heads=3)
    with pytest.raises(UserError, match="the tree is empty"):
        load_tree("[]")
    assert load_tree("[]", allow_empty=True).size == 0


def test_buffers_reject_ranks_beyond_topk():
    with pytest.raises(
        UserError, match=r"mc_sim_7b_63: node \[0, 5\] has rank 5, not below the candidate width \(topk\) 5"
    ):
        tree_buffers(reference_trees()["mc_sim_7b_63"], 5)
    with pytest.raises(UserError, match="topk"):
        tree_buffers(make_tree([[0]]), 0)
