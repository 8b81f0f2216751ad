"""Engine targets: each family's rule, exact search within it against brute force, check() of
what an engine drafts, and exports parsed back the way each engine reads them.

The family rules and the engines' parsers below are written from docs/engines.md, not from
treeopt/engines.py, so that they are an independent reading of the same engine code."""

import ast
import json
import shlex
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from roofline.grid import PerTreeSize, speedup_grid
from roofline.hardware import load_hardware
from roofline.shapes import draft_heads_shape, model_shape
from treeopt.accuracy import AccuracyTable, expected_tokens, load_accuracy
from treeopt.build import tau_curve
from treeopt.cli import main
from treeopt.engines import (
    ENGINE_NAMES,
    RETIRED,
    check,
    child_counts,
    export_for,
    get_engine,
    trtllm_max_draft_len,
    uniform_tree,
)
from treeopt.errors import UserError
from treeopt.family_build import build_for_engine, drafted_sizes, engine_proposal
from treeopt.selection import best_per_cell
from treeopt.tree import Tree, load_tree, make_tree

MEDUSA_CSV = str(resources.files("treeopt").joinpath("data/medusa_train_accuracy.csv"))
DEMO = "reports/demo-cpu/accuracy.json"


# --- independent family rules -------------------------------------------------------------------


def children_of(paths):
    kids = {(): []}
    for p in paths:
        kids.setdefault(p[:-1], []).append(p[-1])
        kids.setdefault(p, [])
    return kids


def is_uniform(paths):
    """vLLM drafts as written: every node of a level has the same children, ranks 0..c-1."""
    paths = set(paths)
    depth = max((len(p) for p in paths), default=0)
    kids = children_of(paths)
    for d in range(depth):
        level = [q for q in kids if len(q) == d]
        counts = {tuple(sorted(kids[q])) for q in level}
        if len(counts) != 1 or counts.pop() != tuple(range(len(kids[level[0]]))):
            return False
    return True


def is_grounded(paths):
    """Hydra: a node's children are ranks 0..c-1, those with children ranks 0..e-1."""
    kids = children_of(paths)
    for q, ranks in kids.items():
        if sorted(ranks) != list(range(len(ranks))):
            return False
        with_kids = sorted(r for r in ranks if kids[q + (r,)])
        if with_kids != list(range(len(with_kids))):
            return False
    return True


def trtllm_ok(paths, heads):
    """Family: C++ runtime keys exact (ranks <= 15, depth <= 9 and <= heads); Python runtime
    buffers consistent (depth-1 ranks 0..k-1)."""
    first = sorted(p[0] for p in paths if len(p) == 1)
    return all(max(p) <= 15 and len(p) <= min(9, heads) for p in paths) and first == list(range(len(first)))


def falling(acc):
    """Each head's accuracy made non-increasing in rank by a running minimum, written as a loop:
    SGLang ranks children by its drafter's probabilities, which fall with rank."""
    out = []
    for row in acc:
        low, kept = float("inf"), []
        for x in row:
            low = min(low, float(x))
            kept.append(low)
        out.append(kept)
    return out


def sglang_draft(acc, steps, topk, tokens):
    """SGLang's draft, simulated step by step with plain Python: beams of topk, candidates of
    topk * topk, the best tokens - 1 by path score (ties: shallower first, then generation order),
    scored by the rank-monotone accuracies."""
    acc = falling(acc)
    cands = [((r,), acc[0][r]) for r in range(topk)]
    beams = list(cands)
    for d in range(1, steps):
        level = [(p + (r,), s * acc[d][r]) for p, s in beams for r in range(topk)]
        cands += level
        beams = sorted(level, key=lambda ps: -ps[1])[:topk]
    order = sorted(range(len(cands)), key=lambda i: (-cands[i][1], len(cands[i][0]), i))
    return {cands[i][0] for i in order[: tokens - 1]}


def all_trees(depth, width, n):
    """Every prefix-closed set of exactly n nodes with depth <= depth and ranks < width."""
    nodes = []
    level = [()]
    for _ in range(depth):
        level = [p + (r,) for p in level for r in range(width)]
        nodes += level
    out = []

    def walk(i, chosen):
        if len(chosen) == n:
            out.append(tuple(chosen))
            return
        for j in range(i, len(nodes)):
            p = nodes[j]
            if len(p) == 1 or p[:-1] in chosen:
                walk(j + 1, chosen + [p])

    walk(0, [])
    return out


def tau(paths, acc):
    return 1.0 + sum(float(np.prod([acc[j][r] for j, r in enumerate(p)])) for p in paths)


def random_acc(seed, heads, width):
    rng = np.random.default_rng(seed)
    a = rng.random((heads, width))  # not monotone in rank: the sibling rules bind
    return a / np.maximum(a.sum(axis=1, keepdims=True), 1.0)


def table_of(acc):
    positions = np.full(acc.shape[0], 1000.0)
    return AccuracyTable(hits=acc * positions[:, None], positions=positions, joint=None, provenance={"source": "test"})


# --- exact search within each family ------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [2, 4, 6])
def test_optimal_within_static_families_matches_brute_force(seed, n):
    acc = random_acc(seed, 3, 3)
    table = table_of(acc)
    trees = all_trees(3, 3, n)
    for name, member in (("hydra", is_grounded), ("trtllm", lambda t: trtllm_ok(t, 3))):
        best = max(tau(t, acc) for t in trees if member(t))
        built = build_for_engine(table, n, "optimal", get_engine(name))
        assert member(built.paths), (name, built.paths)
        assert tau(built.paths, acc) == pytest.approx(best), name
        for method in ("greedy",):
            other = build_for_engine(table, n, method, get_engine(name))
            assert member(other.paths) and tau(other.paths, acc) <= best + 1e-12


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [3, 5, 7])
def test_vllm_best_uniform_tree_matches_brute_force(seed, n):
    acc = random_acc(seed, 3, 4)
    trees = [t for t in all_trees(3, 4, n) if is_uniform(t)]
    built = build_for_engine(table_of(acc), n, "optimal", get_engine("vllm@0.20"))
    assert is_uniform(built.paths)
    assert tau(built.paths, acc) == pytest.approx(max(tau(t, acc) for t in trees))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [2, 4, 6])
def test_sglang_best_triple_matches_brute_force(seed, n):
    acc = random_acc(seed, 3, 3)
    drafts = [
        sglang_draft(acc, s, k, n + 1)
        for s in range(1, 4)
        for k in range(1, 4)
        if n <= k + (s - 1) * k * k and (k > 1 or n == s)
    ]
    built = build_for_engine(table_of(acc), n, "optimal", get_engine("sglang"))
    assert tau(built.paths, acc) == pytest.approx(max(tau(d, acc) for d in drafts))
    assert set(built.paths) in drafts


def test_hydra_optimum_skips_a_better_but_ungrounded_tree():
    # Head 1's rank 1 beats rank 0, so the free optimum of 3 nodes hangs the child under [1]:
    # {[0], [1], [1, 0]} = 1 + .4 + .5 + .45. Hydra expands [0] first: {[0], [1], [0, 0]}
    # = 1 + .4 + .5 + .36 (by hand).
    acc = np.array([[0.4, 0.5], [0.9, 0.0]])
    table = table_of(acc)
    free = build_for_engine(table, 3, "optimal", get_engine("treeopt"))
    hydra = build_for_engine(table, 3, "optimal", get_engine("hydra"))
    assert set(free.paths) == {(0,), (1,), (1, 0)}
    assert set(hydra.paths) == {(0,), (1,), (0, 0)}
    assert expected_tokens(hydra, table) == pytest.approx(1 + 0.4 + 0.5 + 0.36)
    assert set(check(free, get_engine("hydra")).drafted.paths) == {(0,), (1,)}


def test_trtllm_optimum_keeps_depth_one_ranks_left_closed():
    # Rank 1 of head 1 is worthless: the free optimum of 2 nodes is [[0], [2]]; TensorRT-LLM's
    # Python runtime would draft [1] as well, so its family's best is [[0], [0, 0]] (by hand).
    acc = np.array([[0.5, 0.0, 0.3], [0.5, 0.1, 0.1]])
    free = build_for_engine(table_of(acc), 2, "optimal", get_engine("treeopt"))
    trt = build_for_engine(table_of(acc), 2, "optimal", get_engine("trtllm"))
    assert set(free.paths) == {(0,), (2,)}
    assert set(trt.paths) == {(0,), (0, 0)}
    drafted = check(free, get_engine("trtllm"), heads=2)
    assert drafted.as_written and "1 depth-1 token(s) the tree does not list" in drafted.reason


def test_medusa_and_trtllm_rank_limits_bind_on_a_wide_table():
    acc = np.full((2, 20), 0.04)
    table = table_of(acc)
    for name, limit in (("medusa", 10), ("trtllm", 16)):
        tree = build_for_engine(table, 24, "optimal", get_engine(name))
        assert max(max(p) for p in tree.paths) == limit - 1
        assert check(tree, get_engine(name), heads=2).as_written
    assert max(max(p) for p in build_for_engine(table, 24, "optimal", get_engine("treeopt")).paths) == 19


def test_proposal_sequences_stay_in_the_family_at_every_size():
    table = load_accuracy(DEMO)
    for name in ("treeopt", "medusa", "trtllm", "hydra", "sglang"):
        engine = get_engine(name)
        for method in ("greedy", "joint"):
            seq = engine_proposal(table, 30, engine, method=method)
            assert seq.size == 30
            for n in range(1, seq.size + 1):
                assert check(seq.prefix(n), engine, accuracy=table.accuracy).as_written, (name, method, n)


def test_vllm_gets_a_nested_sequence_of_uniform_trees():
    """vLLM's trees of different sizes are not prefixes of one another, so its sequence grows by
    whole levels: the prefixes that end a step are uniform trees, nested, each of the size the
    child counts imply, and the grid never picks a size in between."""
    table = load_accuracy(DEMO)
    engine = get_engine("vllm@0.20")
    seq = engine_proposal(table, 40, engine, method="greedy")
    drafted = drafted_sizes(seq, engine)
    sizes = np.flatnonzero(drafted)
    assert sizes[0] == 0 and sizes[1] == 1 and len(sizes) >= 5
    for n in sizes[1:]:
        counts = child_counts(seq.prefix(int(n)))
        # hand rule: a uniform tree with children c_1..c_L has c_1 + c_1 c_2 + ... nodes
        assert int(n) == sum(int(np.prod(counts[: level + 1])) for level in range(len(counts)))
        assert set(seq.prefix(int(n)).paths) == set(uniform_tree(counts).paths)
    grid = speedup_grid(
        model_shape("vicuna-7b"),
        draft_heads_shape(model_shape("vicuna-7b"), 4),
        load_hardware("a100"),
        tau_curve(seq, table),
        [1, 64],
        [1024],
        per_size=PerTreeSize(drafted=drafted),
    )
    best = best_per_cell(grid)
    assert all(drafted[int(n)] for n in best["nodes"])


# --- check: what each engine drafts ----------------------------------------------------------------


def test_check_agrees_with_the_independent_rules_on_every_small_tree():
    acc = random_acc(3, 3, 3)
    for n in (1, 2, 3, 4, 5):
        drafts = [
            sglang_draft(acc, s, k, n + 1)
            for s in range(1, 4)
            for k in range(1, 4)
            if n <= k + (s - 1) * k * k and (k > 1 or n == s)
        ]
        for paths in all_trees(3, 3, n):
            tree = Tree(paths)
            assert check(tree, get_engine("sglang"), accuracy=acc).as_written == (set(paths) in drafts)
            assert check(tree, get_engine("vllm@0.20")).as_written == is_uniform(paths)
            assert check(tree, get_engine("hydra")).as_written == is_grounded(paths)
            # the C++ runtime drafts any tree of ranks <= 15 as written; the family is narrower
            assert check(tree, get_engine("trtllm"), heads=3).as_written
            assert check(tree, get_engine("medusa"), heads=3).as_written


def test_vllm_drafts_the_reference_tree_as_30_drafts():
    # mc_sim_7b_63: 10, 20, 27, 6 nodes per level -> 10, 2, 1, 0 children per node (by hand):
    # 10 + 20 then nothing below the level whose count is 0.
    drafted = check(load_tree("mc_sim_7b_63"), get_engine("vllm@0.20"))
    assert not drafted.as_written
    assert drafted.drafted.size == 30 and set(drafted.drafted.paths) == {(i,) for i in range(10)} | {
        (i, j) for i in range(10) for j in range(2)
    }


def test_trtllm_check_takes_the_cpp_runtime_and_warns_of_the_python_one():
    """Depth-1 ranks [3, 7, 4, 8, 9, 2, 0] and [0, 0]: the C++ runtime drafts the 8 nodes as
    written; the Python runtime's tokens hold depth-1 ranks 0..9 (11 tokens) while its paths
    index [0, 0] at 7, the 8th token (depth-1 rank 7): a warning (docs/engines.md#tensorrt-llm)."""
    tree = make_tree([[3], [7], [4], [8], [9], [2], [0], [0, 0]])
    drafted = check(tree, get_engine("trtllm"), heads=4)
    assert drafted.as_written and drafted.drafted.size == 8
    cpp, python = drafted.runtimes
    assert cpp.startswith("C++ runtime") and "as written" in cpp
    assert python.startswith("WARNING Python runtime") and "0..9 (3 not in the tree)" in python
    assert "1 node(s) verify another node's token" in python
    assert check(make_tree([[0], [17]]), get_engine("trtllm"), heads=2).refused
    assert check(make_tree([[0], [1], [0, 15]]), get_engine("trtllm"), heads=2).as_written


def test_trtllm_rank_sixteen_corrupts_the_nodes_that_share_its_key_and_seventeen_aborts():
    """C++ runtime: the prefix key ORs rank 16 into the parent's 4-bit chunk, so [0, 16] has the
    key of [1, 0] (0b1_0000, by hand); their children hang under one of the two, so [1, 0, 0],
    a child of the OTHER node, is not drafted where the tree puts it. Alone, [0, 16] is fine."""
    trtllm = get_engine("trtllm")
    alone = check(make_tree([[0], [1], [0, 16], [0, 16, 0]]), trtllm, heads=3)
    assert (alone.as_written, alone.refused) == (True, False)
    shared = check(make_tree([[0], [1], [0, 16], [1, 0], [1, 0, 0]]), trtllm, heads=3)
    assert (shared.as_written, shared.refused) == (False, False)
    assert set(shared.drafted.paths) == {(0,), (1,), (0, 16), (1, 0)}
    assert "[0, 16] and [1, 0] share one key" in shared.reason and "1 node(s) below them" in shared.reason
    seventeen = check(make_tree([[0], [1], [0, 17]]), trtllm, heads=2)
    assert (seventeen.as_written, seventeen.refused) == (False, True)
    assert "aborts" in seventeen.reason


def test_medusa_rank_ten_reads_another_heads_candidate():
    d = check(make_tree([[0], [10], [10, 0], [0, 3]]), get_engine("medusa"), heads=3)
    assert not d.as_written and set(d.drafted.paths) == {(0,), (0, 3)}
    assert check(make_tree([[0], [0, 0], [0, 0, 0]]), get_engine("medusa"), heads=2).refused
    treeopt = get_engine("treeopt", topk=4)
    assert not check(make_tree([[0], [4]]), treeopt).as_written


def test_hydra_cuts_children_of_a_node_whose_earlier_sibling_has_none():
    d = check(make_tree([[0], [1], [1, 0], [1, 0, 0]]), get_engine("hydra"))
    assert set(d.drafted.paths) == {(0,), (1,)}


def test_sglang_check_needs_the_accuracy_table():
    with pytest.raises(UserError, match="needs --accuracy"):
        check(make_tree([[0]]), get_engine("sglang"))


def test_vllm_medusa_path_drafts_a_chain():
    d = check(make_tree([[0], [1], [0, 0]]), get_engine("vllm-medusa@0.32"), heads=4)
    assert set(d.drafted.paths) == {(0,), (0, 0), (0, 0, 0)}


# --- exports, parsed back the way each engine reads them -------------------------------------------


def vllm_parse(line):
    """vLLM: the JSON of --speculative-config; ast.literal_eval of the tree string; levels by
    the depth of the last entry; n_l // n_{l-1} top-rank children for every node of level l-1."""
    flag, value = shlex.split(line)
    assert flag == "--speculative-config"
    config = json.loads(value)
    choices = ast.literal_eval(config["speculative_token_tree"])
    depth = len(choices[-1])
    per_level = [sum(1 for c in choices if len(c) == d) for d in range(1, depth + 1)]
    drafted, level, above = set(), [()], 1
    for n in per_level:
        level = [p + (r,) for p in level for r in range(n // above)]
        drafted |= set(level)
        above = n
    return config, choices, drafted


def trtllm_parse(text):
    """TensorRT-LLM: the CLI value literal_eval'ed; the Python runtime drafts depth-1 ranks
    0..max and every listed deeper prefix; a comment line names the LLM API backend."""
    cli, comment, config_line = text.splitlines()
    assert comment.startswith("#") and 'backend="tensorrt"' in comment and "pytorch" in comment
    (arg,) = shlex.split(cli)
    name, value = arg.split("=", 1)
    assert name == "--medusa_choices"
    choices = ast.literal_eval(value)
    k = max(c[0] for c in choices) + 1
    drafted = {(r,) for r in range(k)} | {tuple(c[:i]) for c in choices for i in range(2, len(c) + 1)}
    config = json.loads(config_line.split("=", 1)[1])
    return choices, drafted, config


def sglang_parse(line):
    args = shlex.split(line)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--speculative-algorithm"] == "EAGLE"
    steps, topk = int(flags["--speculative-num-steps"]), int(flags["--speculative-eagle-topk"])
    tokens = int(flags["--speculative-num-draft-tokens"])
    if topk == 1:
        tokens = steps + 1  # SGLang forces it
    return steps, topk, tokens


@pytest.mark.parametrize("source", [DEMO, MEDUSA_CSV])
@pytest.mark.parametrize("n", [5, 12, 32])
@pytest.mark.parametrize("method", ["greedy", "optimal", "joint"])
def test_exports_parse_back_to_the_intended_tree(source, n, method):
    table = load_accuracy(source, model="vicuna-7b" if source.endswith(".csv") else None)
    if method == "joint" and table.joint is None:
        pytest.skip("no joint statistics in the CSV")
    for name in ("medusa", "trtllm", "vllm@0.20", "sglang", "treeopt", "hydra"):
        engine = get_engine(name)
        tree = build_for_engine(table, n, method, engine)
        want = set(tree.paths)
        out = export_for(engine, tree, heads=table.num_heads, accuracy=table.accuracy)
        if name == "vllm@0.20":
            config, choices, drafted = vllm_parse(out.line)
            assert config["method"] == "eagle" and config["num_speculative_tokens"] == n == len(choices)
            assert drafted == want
        elif name == "trtllm":
            choices, drafted, config = trtllm_parse(out.text)
            assert drafted == want and len(drafted) == len(choices) == n
            assert config["decoding_type"] == "Medusa" and config["medusa_choices"] == choices
            assert config["num_medusa_heads"] == table.num_heads
            assert config["max_draft_len"] >= n and not (n % 32 == 0 and config["max_draft_len"] == n)
        elif name == "sglang":
            s, k, t = sglang_parse(out.line)
            assert sglang_draft(table.accuracy, s, k, t) == want
        else:  # the Medusa list: Medusa indexes candidates by rank, TOPK = 10
            choices = ast.literal_eval(out.line)
            assert {tuple(c) for c in choices} == want
            if name == "medusa":
                assert all(r < 10 for c in choices for r in c)


def test_trtllm_max_draft_len_avoids_the_packed_mask_overrun():
    assert [trtllm_max_draft_len(n) for n in (1, 31, 32, 33, 63, 64, 96)] == [1, 31, 33, 33, 63, 65, 97]


def test_vllm_medusa_export_is_a_chain_length():
    line = export_for(get_engine("vllm-medusa@0.32"), make_tree([[0], [0, 0]])).line
    assert json.loads(shlex.split(line)[1]) == {"method": "medusa", "num_speculative_tokens": 2}


def test_sglang_export_refuses_a_tree_it_cannot_draft():
    table = load_accuracy(DEMO)
    with pytest.raises(UserError, match="SGLang drafts no such tree"):
        export_for(get_engine("sglang"), make_tree([[0], [0, 0], [0, 0, 0], [5]]), accuracy=table.accuracy)


def test_every_engine_has_a_name_and_tree_verification():
    assert set(ENGINE_NAMES) >= {"medusa", "trtllm", "vllm", "sglang", "treeopt", "hydra"}
    assert {get_engine(n).verification for n in ENGINE_NAMES if n not in RETIRED} == {"tree"}
    with pytest.raises(UserError, match="--engine: 'tgi' is not one of"):
        get_engine("tgi")


# --- command line ----------------------------------------------------------------------------------


def cli(capsys, *argv):
    main([str(a) for a in argv])
    return capsys.readouterr()


def test_cli_build_for_vllm_ends_with_a_config_that_vllm_drafts_as_written(capsys, tmp_path):
    # The demo's numbers as if measured from an EAGLE head, which vLLM serves with a tree (the
    # demo's own table names Medusa heads, which it serves as a top-1 chain)
    doc = json.loads(Path(DEMO).read_text())
    doc["provenance"] = {"source": "an EAGLE drafter's calibration"}
    eagle = tmp_path / "eagle.json"
    eagle.write_text(json.dumps(doc))
    out = cli(
        capsys,
        "build",
        "--accuracy",
        eagle,
        "--nodes",
        12,
        "--method",
        "optimal",
        "--engine",
        "vllm@0.20",
        "--format",
        "engine",
    ).out
    config, choices, drafted = vllm_parse(out.strip().splitlines()[0])
    assert config["num_speculative_tokens"] == 12 and drafted == {tuple(c) for c in choices}


def test_cli_check_reports_what_vllm_drafts_of_the_reference_tree(capsys):
    out = cli(capsys, "check", "mc_sim_7b_63", "--engine", "vllm@0.20", "--json").out
    doc = json.loads(out)
    assert doc["as_written"] is False and doc["drafted_nodes"] == 30 and doc["nodes"] == 63


def test_cli_compare_marks_trees_the_engine_does_not_draft(capsys):
    out = cli(
        capsys,
        "compare",
        "--accuracy",
        DEMO,
        "--nodes",
        16,
        "--engine",
        "vllm@0.20",
        "mc_sim_7b_63",
        "optimal",
        "--json",
    ).out
    rows = {r["tree"]: r for r in json.loads(out)["trees"]}
    assert rows["mc_sim_7b_63"]["as_written"] == "no" and rows["optimal"]["as_written"] == "yes"
    assert rows["mc_sim_7b_63"]["tau_drafted"] < rows["mc_sim_7b_63"]["tau"]


def test_cli_engine_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        cli(capsys, "build", "--accuracy", DEMO, "--nodes", 4, "--engine", "vllm@0.20", "--max-depth", 2)
    assert exc.value.code == 2
    assert "leave out --max-depth" in capsys.readouterr().err


def test_joint_builder_keeps_depth_one_ranks_left_closed_for_trtllm():
    # Head 1's rank 1 is the most frequent (5 of 8 positions): the free joint builder starts
    # with [1], [1, 0]; TensorRT-LLM's family must take [0] first, then the best of [1] (5)
    # and [0, 0] (2): {[0], [1]} (counted by hand).
    ranks = np.array([[1, 0]] * 5 + [[0, 0]] * 2 + [[2, 0]])
    table = AccuracyTable.from_ranks(ranks, 3)
    assert set(build_for_engine(table, 2, "joint", get_engine("treeopt")).paths) == {(1,), (1, 0)}
    for name in ("trtllm", "hydra"):
        tree = build_for_engine(table, 2, "joint", get_engine(name))
        assert set(tree.paths) == {(0,), (1,)}, name
