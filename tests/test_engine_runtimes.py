"""What the serving engines really do (docs/engines.md): TensorRT-LLM's two runtimes rebuilt from
their buffer rules, SGLang's sibling ranks on tables whose accuracy does not fall with rank, the
LLM-API backend line, and which engine line a drafter can use.

The runtimes below are small re-implementations written from reading the upstream code
(cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp initTensorsFromChoices and
tensorrt_llm/runtime/medusa_utils.py _medusa_setup, NVIDIA/TensorRT-LLM), not from
treeopt/engines.py, so that they are an independent reading of the same code."""

import ast
import itertools
import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from treeopt.accuracy import AccuracyTable, expected_tokens, load_accuracy
from treeopt.cli import main
from treeopt.engines import check, engine_for_drafter, export_for, get_engine, sglang_tree
from treeopt.errors import UserError
from treeopt.family_build import build_for_engine
from treeopt.tree import Tree, make_tree

DEMO = "reports/demo-cpu/accuracy.json"

# --- TensorRT-LLM C++ runtime: initTensorsFromChoices -------------------------------------------


def cpp_prefix(choice, length):
    """computePrefix: `prefix |= vec[ci] << 4 * (len - 1 - ci)`, the shift on a 32-bit int.
    Only called here for keys of at most 8 ranks below 8 in the top chunk (defined behaviour)."""
    prefix = 0
    for ci in range(length):
        prefix |= choice[ci] << (4 * (length - 1 - ci))
    return prefix


def cpp_tree(choices, tie_order):
    """The tree the C++ runtime builds: sort by (depth, prefix), equal keys in `tie_order`
    (std::sort leaves them unspecified); each node's parent is the last node of the level above
    stored under the parent's prefix; a node's token is candidate `choice.back()` of its head,
    so it drafts the path parent's path + (rank,). Returns the drafted path of every choice."""
    order = sorted(range(len(choices)), key=lambda i: (len(choices[i]), cpp_prefix(choices[i], len(choices[i]))))
    order = tie_order(order, choices)
    drafted = {}
    prev, cur, depth = {0: ()}, {}, 1
    for i in order:
        choice = choices[i]
        if len(choice) != depth:
            prev, cur, depth = cur, {}, depth + 1
        cur[cpp_prefix(choice, len(choice))] = i
        parent = prev.get(cpp_prefix(choice, len(choice) - 1), None)
        parent_path = () if len(choice) == 1 else drafted[parent]
        drafted[i] = parent_path + (choice[-1],)
    return drafted


def keep_ties(order, choices):
    return order


def flip_ties(order, choices):
    """The same order with every run of equal (depth, prefix) keys reversed."""
    out = []
    for _, run in itertools.groupby(order, key=lambda i: (len(choices[i]), cpp_prefix(choices[i], len(choices[i])))):
        out += list(run)[::-1]
    return out


def cpp_certain(paths):
    """The nodes the C++ runtime drafts where the tree puts them, whatever order the sort leaves
    equal keys in."""
    choices = [list(p) for p in paths]
    certain = set(paths)
    for ties in (keep_ties, flip_ties):
        drafted = cpp_tree(choices, ties)
        certain &= {tuple(choices[i]) for i, d in drafted.items() if d == tuple(choices[i])}
    return certain


# --- TensorRT-LLM Python runtime: _medusa_setup --------------------------------------------------


def python_buffers(paths):
    """_medusa_setup's token buffer (as (depth, rank) per token, no root) and its paths (token
    indices, no root): depth-1 tokens are arange(max depth-1 rank + 1); a deeper token is added
    for each new (prefix, rank) along the lexicographically sorted leaf paths, and its path index
    is sum(level_counts of the levels above) + its position in its level."""
    choices = sorted((list(p) for p in paths), key=len, reverse=True)
    leaves, seen = [], set()
    level_counts = [0] * max(len(c) for c in choices)
    for c in choices:
        if tuple(c) not in seen:
            leaves.append(c)
        for i in range(len(c)):
            if tuple(c[: i + 1]) not in seen:
                seen.add(tuple(c[: i + 1]))
                level_counts[i] += 1
    leaves.sort()  # no leaf is a prefix of another: path_sorter is lexicographic here
    topks = [0] * len(level_counts)
    for p in leaves:
        for i, k in enumerate(p):
            topks[i] = max(topks[i], k + 1)
    tokens = [(1, r) for r in range(topks[0])]
    index = [list(p) for p in leaves]
    for i in range(1, len(level_counts)):
        last, c = None, -1
        for pi, p in enumerate(leaves):
            if i < len(p):
                if tuple(p[: i + 1]) != last:
                    tokens.append((i + 1, p[i]))
                    last, c = tuple(p[: i + 1]), c + 1
                index[pi][i] = sum(level_counts[:i]) + c
    return tokens, leaves, index


def python_wrong_nodes(paths):
    """Listed nodes whose path index points at a token that is not theirs: for depth 1 the
    token of the node's rank, for deeper nodes the token emitted for that node."""
    tokens, leaves, index = python_buffers(paths)
    own = {}
    first = len([t for t in tokens if t[0] == 1])
    for i in range(1, max(len(p) for p in paths)):
        emitted = sorted({tuple(p[: i + 1]) for p in leaves if len(p) > i})
        for j, node in enumerate(emitted):
            own[node] = first + sum(1 for t in tokens[first:] if t[0] <= i) + j
    wrong = set()
    for p, idx in zip(leaves, index, strict=True):
        for j, k in enumerate(idx):
            node = tuple(p[: j + 1])
            if k != (node[0] if j == 0 else own[node]):
                wrong.add(node)
    return tokens, wrong


# --- TensorRT-LLM: check against the rebuilt runtimes -------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_trtllm_check_matches_the_rebuilt_runtimes_on_every_small_tree(n):
    """Ranks 0, 1, 15 and 16 up to depth 3 (every pair that can share a C++ key): the drafted tree
    is the C++ runtime's certain nodes; the Python warning and its count of nodes that verify
    another node's token match the rebuilt _medusa_setup."""
    ranks = (0, 1, 15, 16)
    nodes = [p for d in (1, 2, 3) for p in itertools.product(ranks, repeat=d)]
    for combo in itertools.combinations(nodes, n):
        have = set(combo)
        if not all(len(p) == 1 or p[:-1] in have for p in combo):
            continue
        tree = Tree(combo)
        got = check(tree, get_engine("trtllm"), heads=3)
        want = cpp_certain(combo)
        assert set(got.drafted.paths) == want, combo
        assert got.as_written == (want == have), combo
        tokens, wrong = python_buffers(combo)[0], python_wrong_nodes(combo)[1]
        assert got.runtimes[1].startswith("WARNING") == bool(wrong), combo
        if wrong:
            assert f"{len(wrong)} node(s) verify another node's token" in got.runtimes[1], combo
        extra = len(tokens) - len(combo)
        assert ("not in the tree" in got.runtimes[1] or "does not list" in got.runtimes[1]) == (extra > 0), combo


def test_trtllm_gap_tree_is_drafted_as_written_by_cpp_and_inconsistent_in_python():
    """The known case (docs/engines.md#tensorrt-llm): 8 choices; the C++ runtime drafts the 8 as
    written, so tau is the tree's own; the Python runtime has 11 tokens and indexes [0, 0] at 7,
    which holds depth-1 rank 7 (by hand: 7 depth-1 nodes listed, 10 depth-1 tokens)."""
    paths = ((3,), (7,), (4,), (8,), (9,), (2,), (0,), (0, 0))
    tokens, leaves, index = python_buffers(paths)
    assert len(tokens) == 11 and tokens[7] == (1, 7)
    assert index[leaves.index([0, 0])] == [0, 7]
    table = load_accuracy(DEMO)
    tree = Tree(paths)
    result = check(tree, get_engine("trtllm"), heads=table.num_heads)
    assert result.as_written and set(result.drafted.paths) == set(paths)
    assert expected_tokens(result.drafted, table) == pytest.approx(expected_tokens(tree, table))
    assert "WARNING Python runtime" in result.reason and "C++ runtime" in result.reason


def test_trtllm_deep_nodes_rely_on_undefined_shifts():
    """A node at depth 10 finds its parent by a 9-rank key: computePrefix shifts the top rank of a
    32-bit int by 32 bits, undefined behaviour, so the node is not counted; depth 9 is exact."""
    chain9 = make_tree([[0] * d for d in range(1, 10)])
    chain10 = make_tree([[0] * d for d in range(1, 11)])
    assert check(chain9, get_engine("trtllm"), heads=16).as_written
    deep = check(chain10, get_engine("trtllm"), heads=16)
    assert not deep.as_written and not deep.refused and deep.drafted.size == 9
    assert "undefined" in deep.reason
    assert check(make_tree([[0] * d for d in range(1, 18)]), get_engine("trtllm"), heads=17).refused


# --- TensorRT-LLM LLM API: which backend takes MedusaDecodingConfig -------------------------------


def test_trtllm_export_says_which_llm_api_backend_takes_the_config():
    text = export_for(get_engine("trtllm"), make_tree([[0], [1], [0, 0]]), heads=3).text
    cli, comment, config = text.splitlines()
    assert cli == '--medusa_choices="[[0], [1], [0, 0]]"'
    assert comment.startswith("# LLM API:") and 'backend="tensorrt"' in comment and "pytorch backend rejects" in comment
    doc = json.loads(config.split("=", 1)[1])
    assert doc["decoding_type"] == "Medusa" and doc["medusa_choices"] == [[0], [1], [0, 0]]


# --- SGLang: siblings are always ranks 0..c-1 ------------------------------------------------------


def closed(paths):
    have = set(paths)
    return all(p[:-1] + (r,) in have for p in have for r in range(p[-1]))


def test_sglang_hand_built_table_drafts_rank_one_before_rank_two():
    """Head 1: rank 2 (0.3) beats rank 1 (0.1). The drafter's own probabilities fall with rank, so
    SGLang's two best children of the root are ranks 0 and 1, never 0 and 2 (by hand)."""
    acc = np.array([[0.5, 0.1, 0.3]])
    assert set(sglang_tree(acc, 1, 3, 3).paths) == {(0,), (1,)}
    assert set(sglang_tree(acc, 1, 3, 4).paths) == {(0,), (1,), (2,)}


@pytest.mark.parametrize("seed", range(8))
def test_sglang_drafts_are_sibling_closed_on_non_monotone_tables(seed):
    rng = np.random.default_rng(seed)
    acc = rng.random((3, 4)) * 0.5  # accuracy rises and falls with rank
    for steps, topk in itertools.product(range(1, 4), range(1, 5)):
        pool = topk + (steps - 1) * topk * topk
        for tokens in range(2, pool + 2):
            if topk == 1 and tokens != steps + 1:
                continue
            paths = sglang_tree(acc, steps, topk, tokens).paths
            assert closed(paths), (steps, topk, tokens, paths)


def test_sglang_builds_on_the_demo_table_are_sibling_closed_at_every_size(capsys, tmp_path):
    """The demo table has acc[2, 4] > acc[2, 3]: the reported case, `build --engine sglang`
    returned (0, 0, 4) without (0, 0, 3)."""
    table = load_accuracy(DEMO)
    assert table.accuracy[2, 4] > table.accuracy[2, 3]
    for n in range(1, 41):
        for method in ("greedy", "optimal", "joint"):
            tree = build_for_engine(table, n, method, get_engine("sglang"))
            assert tree.size == n and closed(tree.paths), (n, method)
    # The demo's table names Medusa heads, which SGLang cannot serve; the same numbers measured
    # from a drafter it does serve (an EAGLE head, say) carry no such name.
    doc = json.loads(Path(DEMO).read_text())
    doc["provenance"] = {"source": "an EAGLE drafter's calibration"}
    eagle = tmp_path / "eagle.json"
    eagle.write_text(json.dumps(doc))
    main(["build", "--accuracy", str(eagle), "--nodes", "22", "--engine", "sglang", "--format", "python"])
    paths = {tuple(c) for c in ast.literal_eval(capsys.readouterr().out.strip())}
    assert len(paths) == 22 and closed(paths)


def test_engine_lines_follow_the_drafter_the_table_was_measured_from(capsys):
    # The demo table was measured from Medusa heads: vLLM <= 0.32 serves them as a top-1 chain
    # (method "medusa"), the newest vLLM (0.33) and SGLang not at all.
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--accuracy", DEMO, "--nodes", "3", "--engine", "vllm", "--format", "engine"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "<= 0.32 served Medusa heads as a top-1 chain" in err
    main(["build", "--accuracy", DEMO, "--nodes", "3", "--engine", "vllm@0.20", "--format", "engine"])
    out = capsys.readouterr()
    line = out.out.strip().splitlines()[0]
    assert json.loads(line.removeprefix("--speculative-config '").removesuffix("'")) == {
        "method": "medusa",
        "num_speculative_tokens": 3,
    }
    assert "note: --engine vllm@0.20: vLLM <= 0.32 serves Medusa heads as a top-1 chain" in out.err
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--accuracy", DEMO, "--nodes", "8", "--engine", "sglang"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SGLang has no medusa drafter" in err


def test_sglang_tau_is_taken_from_the_real_table():
    """Only the choice of nodes uses the rank-monotone scores: tau of the draft is the table's."""
    acc = np.array([[0.5, 0.1, 0.3], [0.4, 0.2, 0.25]])
    table = AccuracyTable(hits=acc * 1000, positions=np.full(2, 1000.0), joint=None, provenance={"source": "t"})
    tree = sglang_tree(acc, 2, 2, 4)
    want = 1 + sum(float(np.prod([acc[d][r] for d, r in enumerate(p)])) for p in tree.paths)
    assert expected_tokens(tree, table) == pytest.approx(want)


# --- which engine line a drafter can use -------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "drafter", "target", "says"),
    [
        ("vllm", "medusa", None, "ask for --engine vllm-medusa@0.32"),
        ("vllm", "mlp-speculator", None, "ask for --engine vllm-mlp-speculator@0.10"),
        ("vllm", "mlp_speculator", None, "0.11-0.32 fail at engine start"),
        ("vllm", "draft-model", "vllm-draft-model", "top-1 chain"),
        ("vllm@0.20", "medusa", "vllm-medusa@0.32", "top-1 chain"),
        ("trtllm", "draft-model", "trtllm-draft-model", "Draft_Target"),
        ("trtllm", "hydra", None, "no hydra drafter"),
        ("vllm", "hydra", None, "no Hydra drafter"),
        ("sglang", "medusa", None, "no medusa drafter"),
        ("sglang", "hydra", None, "no hydra drafter"),
        ("sglang", "mlp-speculator", None, "no mlp-speculator drafter"),
        ("sglang", "draft-model", "sglang-standalone", "STANDALONE"),
    ],
)
def test_engine_for_drafter_names_what_the_engine_can_serve(engine, drafter, target, says):
    got, note = engine_for_drafter(engine, drafter)
    assert got == target and says in note and "\n" not in note
    if target is None:
        assert "emits no" in note


def test_engine_for_drafter_keeps_engines_that_serve_the_drafter():
    assert engine_for_drafter("vllm-medusa@0.32", "medusa") == ("vllm-medusa@0.32", None)
    assert engine_for_drafter("trtllm", "medusa") == ("trtllm", None)
    assert engine_for_drafter("sglang-standalone", "draft_model") == ("sglang-standalone", None)
    # vLLM's EAGLE proposer and SGLang's EAGLE worker serve EAGLE-3 and EAGLE-1/2 drafts
    for kind in ("eagle3", "eagle"):
        assert engine_for_drafter("vllm", kind) == ("vllm", None)
        assert engine_for_drafter("sglang", kind) == ("sglang", None)
    with pytest.raises(UserError, match="drafter: 'ngram' is not one of"):
        engine_for_drafter("vllm", "ngram")


def test_chain_engines_export_their_vllm_method():
    for name, method in (("vllm-mlp-speculator@0.10", "mlp_speculator"), ("vllm-draft-model", "draft_model")):
        line = export_for(get_engine(name), make_tree([[0], [0, 0]])).line
        assert json.loads(shlex.split(line)[1]) == {"method": method, "num_speculative_tokens": 2}


def test_sglang_standalone_exports_its_algorithm():
    table = load_accuracy(DEMO)
    tree = build_for_engine(table, 6, "optimal", get_engine("sglang-standalone"))
    line = export_for(get_engine("sglang-standalone"), tree, accuracy=table.accuracy).line
    assert shlex.split(line)[:2] == ["--speculative-algorithm", "STANDALONE"]


def test_check_json_reports_each_runtime_on_its_own(tmp_path):
    # A gap at depth 1: the C++ runtime drafts it as written, the Python runtime's buffers
    # disagree (TensorRT-LLM's medusa_utils.py indexes deeper tokens from the listed nodes).
    import json
    import subprocess
    import sys

    tree = "[[3],[7],[4],[8],[9],[2],[0],[0,0]]"
    out = subprocess.run(
        [sys.executable, "-m", "treeopt", "check", tree, "--engine", "trtllm", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cpp, python = doc["runtimes"]
    assert cpp.startswith("C++ runtime") and cpp.endswith("drafts it as written")
    assert python.startswith("WARNING Python runtime") and "buffers disagree" in python
    assert doc["as_written"] and doc["drafted_nodes"] == 8
    assert "\n" not in doc["reason"]


@pytest.mark.parametrize(
    ("run", "kind"),
    [("run-medusa", "medusa"), ("run-hydra", "hydra"), ("run-mlp-speculator", "mlp-speculator"),
     ("run-draft-model", "draft-model"), ("run-eagle3", "eagle3")],
)  # fmt: skip
def test_a_calibrated_table_names_the_drafter_it_was_measured_from(run, kind):
    # the committed runs of reports/drafters-demo, one per drafter kind (their folder names)
    table = load_accuracy(Path(DEMO).parents[1] / "drafters-demo" / run / "accuracy.json")
    assert table.drafter == kind
    assert (
        AccuracyTable(hits=np.ones((1, 2)), positions=np.full(1, 2.0), provenance={"source": "a paper"}).drafter is None
    )
