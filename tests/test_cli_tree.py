import json
import re
from importlib import resources

import numpy as np
import pytest

from treeopt.accuracy import AccuracyTable, expected_tokens, load_accuracy
from treeopt.build import greedy_tree, joint_tree, optimal_tree
from treeopt.cli import main
from treeopt.tree import reference_trees

MEDUSA_CSV = str(resources.files("treeopt").joinpath("data/medusa_train_accuracy.csv"))
DESIGN = "[[0],[0,0],[0,1],[0,2],[1],[1,0],[1,1],[1,2]]"


def run(capsys, *argv):
    main([str(a) for a in argv])
    out = capsys.readouterr()
    return out.out, out.err


def fail(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    assert exc.value.code == 2
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("treeopt: error: "), out.err
    assert "Traceback" not in out.err and out.out == ""
    return lines[0]


@pytest.fixture
def vicuna7b():
    return load_accuracy(MEDUSA_CSV, model="vicuna-7b")


@pytest.fixture
def joint_file(tmp_path):
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 2, size=(300, 1))
    ranks = np.minimum(shared + rng.geometric(0.6, size=(300, 3)) - 1, 5)
    table = AccuracyTable.from_ranks(ranks, 4, provenance={"model": "demo"})
    path = tmp_path / "joint.json"
    table.save(path)
    return path, table


def test_build_text(capsys, vicuna7b):
    out, err = run(capsys, "build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 16)
    tree = greedy_tree(vicuna7b.accuracy, 16)
    tau = expected_tokens(tree, vicuna7b)
    assert f"tau = {tau:.4f}" in out
    assert out.splitlines()[0].startswith("greedy tree of 16 nodes from medusa_train_accuracy.csv (vicuna-7b)")
    assert "├── [0]  0.5604" in out and "│   ├── [0, 0]  0.1773" in out  # 0.5604 * 0.3164
    assert out.rstrip().endswith(f"medusa_choices = {tree.to_choices()}")
    assert err == ""


def test_build_formats(capsys, tmp_path, vicuna7b):
    args = ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 4]
    out, _ = run(capsys, *args, "--format", "python")
    assert out == "[[0], [0, 0], [1], [0, 1]]\n"
    out, _ = run(capsys, *args, "--format", "trtllm")
    assert out == '--medusa_choices="[[0], [0, 0], [1], [0, 1]]"\n'
    out, _ = run(capsys, *args, "--format", "vllm")
    assert out == "[(0,), (1,), (0, 0), (0, 1)]\n"
    target = tmp_path / "sub" / "tree.json"
    out, err = run(capsys, *args, "--format", "json", "--method", "optimal", "-o", target)
    assert out == "" and "wrote" in err
    doc = json.loads(target.read_text())
    assert doc["format"] == "treeopt.tree/v1"
    assert doc["medusa_choices"] == [[0], [0, 0], [1], [0, 1]]
    assert doc["method"] == "optimal" and doc["nodes"] == 4
    assert doc["expected_tokens_per_step"] == pytest.approx(1 + 0.5604 + 0.5604 * 0.3164 + 0.1113 + 0.5604 * 0.1072)
    assert doc["accuracy"]["model"] == "vicuna-7b"
    # The written tree loads back as a TREE argument.
    out, _ = run(capsys, "show", target, "--json")
    assert json.loads(out)["medusa_choices"] == doc["medusa_choices"]


def test_build_limits_and_methods(capsys, joint_file):
    path, table = joint_file
    out, _ = run(capsys, "build", "--accuracy", path, "--nodes", 6, "--method", "joint", "--format", "python")
    assert out.strip() == str(joint_tree(table, 6).to_choices())
    out, _ = run(
        capsys,
        "build",
        "--accuracy",
        path,
        "--nodes",
        3,
        "--method",
        "optimal",
        "--max-depth",
        2,
        "--max-children",
        "2,1",
        "--format",
        "json",
    )
    doc = json.loads(out)
    built = optimal_tree(table.accuracy, 3, max_depth=2, max_children=[2, 1])
    assert doc["medusa_choices"] == built.to_choices()
    assert all(len(p) <= 2 and p[0] < 2 and (len(p) == 1 or p[1] < 1) for p in doc["medusa_choices"])
    assert doc["expected_tokens_per_step"] == pytest.approx(expected_tokens(built, table))
    out, _ = run(capsys, "build", "--accuracy", path, "--nodes", 5)
    assert "tau under the table's joint statistics" in out


def test_show(capsys, vicuna7b):
    out, _ = run(capsys, "show", "mc_sim_7b_63")
    lines = out.splitlines()
    assert lines[0] == "mc_sim_7b_63: 63 nodes (64 tokens per step), depth 4, 42 leaves"
    assert lines[1] == "nodes per depth:    10, 28, 23, 2"
    assert lines[2] == "max rank per depth: 9, 9, 9, 1"
    assert lines[3] == "root" and len(lines) == 4 + 63
    out, _ = run(capsys, "show", "mc_sim_7b_63", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b")
    tau = expected_tokens(reference_trees()["mc_sim_7b_63"], vicuna7b, strict=False)
    assert f"tau = {tau:.4f} expected tokens per step" in out
    assert "note: mc_sim_7b_63: 25 node(s) use a rank >= the table's width 5" in out
    out, _ = run(capsys, "show", DESIGN, "--json", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b")
    doc = json.loads(out)
    assert doc["depth_histogram"] == [2, 6] and doc["leaves"] == 6 and doc["max_rank_per_depth"] == [1, 2]
    assert doc["notes"] == []


def test_buffers_json_design_vector(capsys):
    out, _ = run(capsys, "buffers", DESIGN, "--json")
    doc = json.loads(out)
    assert sorted(doc) == ["attention_mask", "position_ids", "retrieve_indices", "tree_indices"]
    assert doc["tree_indices"] == [0, 1, 2, 11, 12, 13, 11, 12, 13]
    assert doc["position_ids"] == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert doc["retrieve_indices"] == [[0, 2, 8], [0, 2, 7], [0, 2, 6], [0, 1, 5], [0, 1, 4], [0, 1, 3]]
    assert doc["attention_mask"][7] == [1, 0, 1, 0, 0, 0, 0, 1, 0]
    out, _ = run(capsys, "buffers", DESIGN, "--topk", 4, "--json")
    assert json.loads(out)["tree_indices"] == [0, 1, 2, 5, 6, 7, 5, 6, 7]
    out, _ = run(capsys, "buffers", DESIGN)
    assert "tree_indices     [ 0  1  2 11 12 13 11 12 13]" in out


def test_compare(capsys, vicuna7b):
    out, _ = run(
        capsys,
        "compare",
        "--accuracy",
        MEDUSA_CSV,
        "--csv-model",
        "vicuna-7b",
        "--nodes",
        16,
        "mc_sim_7b_63",
        "greedy",
        "optimal",
    )
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if not line.startswith("note")}
    mc16 = reference_trees()["mc_sim_7b_63"].prefix(16)
    assert rows["mc_sim_7b_63"][1] == "16"
    assert float(rows["mc_sim_7b_63"][4]) == pytest.approx(expected_tokens(mc16, vicuna7b, strict=False), abs=6e-5)
    assert float(rows["greedy"][4]) == pytest.approx(
        expected_tokens(greedy_tree(vicuna7b.accuracy, 16), vicuna7b), abs=6e-5
    )
    assert float(rows["optimal"][4]) >= float(rows["greedy"][4])
    assert "note: mc_sim_7b_63: 2 node(s) use a rank >= the table's width 5" in out
    out, _ = run(
        capsys,
        "compare",
        "--accuracy",
        MEDUSA_CSV,
        "--csv-model",
        "vicuna-7b",
        "mc_sim_7b_63",
        "vicuna_7b_stage2",
        "--json",
    )
    doc = json.loads(out)
    assert [r["nodes"] for r in doc["trees"]] == [63, 63]
    assert len(doc["notes"]) == 2


def test_compare_with_joint(capsys, joint_file):
    path, table = joint_file
    out, _ = run(capsys, "compare", "--accuracy", path, "--nodes", 8, "greedy", "joint", "--json")
    rows = {r["tree"]: r for r in json.loads(out)["trees"]}
    assert rows["joint"]["tau_joint"] >= rows["greedy"]["tau_joint"] - 1e-12
    assert rows["joint"]["tau_joint"] == pytest.approx(expected_tokens(joint_tree(table, 8), table, joint=True))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["build", "--nodes", 3], "--accuracy FILE is required"),
        (["build", "--accuracy", "nope.csv", "--nodes", 3], "nope.csv: no such file"),
        (["build", "--accuracy", MEDUSA_CSV, "--nodes", 3], "choose one with --csv-model"),
        (["build", "--accuracy", MEDUSA_CSV, "--csv-model", "llama", "--nodes", 3], "no rows for model 'llama'"),
        (["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b"], "--nodes N is required"),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", "x"],
            "--nodes: 'x' is not an integer",
        ),
        (["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 0], "--nodes: must be at least 1"),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 10**6],
            "--nodes: 1000000 exceeds the 3905 nodes",
        ),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "--method", "beam"],
            "--method: 'beam' is not one of",
        ),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "--method", "joint"],
            "has no joint statistics, which --method joint needs",
        ),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "--format", "xml"],
            "--format: 'xml' is not one of",
        ),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "--max-depth", 6],
            "--max-depth: 6 exceeds the accuracy table's 5 heads",
        ),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "--max-children", "10,10"],
            "--max-children: 10 at depth 1 exceeds the accuracy table's width 5",
        ),
        (
            ["build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "--max-children", "a,b"],
            "--max-children: 'a,b' is not a comma-separated list",
        ),
        (
            [
                "build",
                "--accuracy",
                MEDUSA_CSV,
                "--csv-model",
                "vicuna-7b",
                "--nodes",
                3,
                "--max-depth",
                3,
                "--max-children",
                "2,2",
            ],
            "--max-children: 2 values for max depth 3",
        ),
        (["show", "[[0], [1, 0]]"], "tree literal '[[0], [1, 0]]': node [1, 0] has no parent [1]"),
        (["show", "[[0], [0]]"], "node [0] appears twice"),
        (["show", "[[0], [-1]]"], "node [-1] has a negative rank -1"),
        (["show", "[[0], [0.5]]"], "non-integer rank 0.5"),
        (["show", "[[0], []]"], "node #1 is an empty path"),
        (["show", "[]"], "the tree is empty"),
        (
            ["show", "mc_sim_7b_63", "--topk", 8],
            "mc_sim_7b_63: node [0, 8] has rank 8, not below the candidate width (topk) 8",
        ),
        (
            ["show", "mc_sim_7b_63", "--num-heads", 3],
            "mc_sim_7b_63: node [0, 0, 0, 0] has depth 4, more than the 3 heads",
        ),
        (["show", "no_such_tree"], "no_such_tree: no such file, and not a reference tree"),
        (["show", "mc_sim_7b_63", "--csv-model", "vicuna-7b"], "--csv-model: only meaningful with --accuracy"),
        (["buffers", "mc_sim_7b_63", "--topk", 5, "--json"], "node [0, 5] has rank 5"),
        (["buffers", DESIGN, "--topk", "0"], "--topk: must be at least 1"),
        (["compare", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b"], "TREE: give at least one tree"),
        (
            ["compare", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "greedy"],
            "TREE greedy: building a tree for comparison needs --nodes N",
        ),
        (
            ["compare", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 2, "[[0], [1, 0], [1]]"],
            "its first 2 nodes do not form a tree",
        ),
        (
            ["compare", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 2, "joint"],
            "has no joint statistics, which TREE joint needs",
        ),
        (["compare", "mc_sim_7b_63"], "--accuracy FILE is required"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, argv, expected):
    line = fail(capsys, *argv)
    assert expected in line


@pytest.mark.parametrize(
    "content, expected",
    [
        ("{", "not valid JSON"),
        ('{"format": "other"}', "field 'format' is 'other'"),
        ("[[0.5, 0.7]]", "per-rank accuracies sum to 1.2 > 1"),
    ],
)
def test_bad_accuracy_file_leaves_no_output(capsys, tmp_path, content, expected):
    acc = tmp_path / "acc.json"
    acc.write_text(content)
    target = tmp_path / "out.json"
    line = fail(capsys, "build", "--accuracy", acc, "--nodes", 3, "--format", "json", "-o", target)
    assert str(acc) in line and expected in line
    assert not target.exists()
    assert list(tmp_path.iterdir()) == [acc]


def test_unwritable_output_is_one_line(capsys, tmp_path):
    line = fail(capsys, "build", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", "--nodes", 3, "-o", tmp_path)
    assert re.match(rf"treeopt: error: {re.escape(str(tmp_path))}: cannot write", line)
    assert list(tmp_path.iterdir()) == []


def test_inline_trees_longer_than_a_file_name_are_taken_by_every_command(capsys, tmp_path):
    """A literal of Medusa's 63-node tree is 555 characters, over the 255 a file name may have:
    it is a tree, not a path that cannot be looked up (OSError: File name too long)."""
    literal = json.dumps(reference_trees()["mc_sim_7b_63"].to_choices())
    assert len(literal) > 255
    buffers = json.loads(run(capsys, "buffers", literal, "--json")[0])
    assert len(buffers["tree_indices"]) == 64  # the root and 63 nodes
    out = tmp_path / "tree.json"
    run(capsys, "build", "--tree", literal, "--format", "json", "-o", str(out))
    assert json.loads(out.read_text())["medusa_choices"] == json.loads(literal)
