"""One tree for a traffic mix (treeopt.mix): expected throughput worked out by hand, the
guarantee that it is never worse than any per-cell tree (brute force over random tables),
the mix inputs and their errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from tests.test_cli_tree import MEDUSA_CSV
from tests.test_selection import PROPOSAL, write_sweep
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.mix import choose_mix_tree, mix_section, parse_mix
from treeopt.tree import make_tree


def table(cells: dict, plain_step_s: dict) -> pd.DataFrame:
    """cells: (batch, context) -> {nodes: speedup}; plain_step_s: (batch, context) -> T(0)."""
    rows = []
    for (b, s), speeds in cells.items():
        for n, sp in speeds.items():
            rows.append(
                {
                    "batch": b,
                    "context": s,
                    "nodes": n,
                    "speedup": sp,
                    "step_time_s": plain_step_s[(b, s)] / sp * (1 + 0.5 * n) if n else plain_step_s[(b, s)],
                }
            )
    return pd.DataFrame(rows)


# batch 1: T(0) = 10 ms -> 100 tokens/s plain; batch 4: T(0) = 10 ms -> 400 tokens/s plain
HAND = table({(1, 128): {0: 1.0, 1: 1.5, 2: 2.0}, (4, 128): {0: 1.0, 1: 1.2, 2: 0.5}}, {(1, 128): 0.01, (4, 128): 0.01})


def test_throughput_not_mean_speedup_decides():
    # E(1, on everywhere) = 0.5*100*1.5 + 0.5*400*1.2 = 315 tokens/s
    # E(2, on up to batch 1) = 0.5*100*2.0 + 0.5*400 = 300 (mean speedup 1.5 > 1.35 would pick it)
    choice = choose_mix_tree(HAND, parse_mix("1:1,4:1"))
    assert choice.nodes == 1
    assert choice.speculate_up_to_batch == 4 and choice.off_from_batch is None
    assert choice.expected_tokens_per_s == pytest.approx(315.0)
    assert choice.plain_tokens_per_s == pytest.approx(0.5 * 100 + 0.5 * 400)
    assert choice.per_cell_best_tokens_per_s == pytest.approx(0.5 * 100 * 2.0 + 0.5 * 400 * 1.2)
    cell1 = choice.cells[0]
    assert (cell1.best_nodes, cell1.mix_nodes) == (2, 1)
    assert cell1.loss_fraction == pytest.approx(1 - 1.5 / 2.0)
    assert choice.cells[1].loss_fraction == pytest.approx(0.0)


def test_speculation_switches_off_above_a_batch():
    # mostly batch 1 traffic: E(2, up to 1) = 0.9*100*2 + 0.1*400 = 220 > E(1, all) = 135 + 48 = 183
    choice = choose_mix_tree(HAND, parse_mix("1:0.9,4:0.1"))
    assert (choice.nodes, choice.speculate_up_to_batch, choice.off_from_batch) == (2, 1, 4)
    assert choice.expected_tokens_per_s == pytest.approx(220.0)
    assert choice.cells[1].mix_nodes == 0 and choice.cells[1].mix_speedup == 1.0
    assert choice.cells[1].loss_fraction == pytest.approx(1 - 1 / 1.2)


def test_no_tree_pays():
    slow = table({(8, 64): {0: 1.0, 1: 0.9, 2: 0.8}}, {(8, 64): 0.02})
    choice = choose_mix_tree(slow, parse_mix("8:1"))
    assert (choice.nodes, choice.speculate_up_to_batch, choice.off_from_batch) == (0, 0, 8)
    assert choice.expected_tokens_per_s == pytest.approx(8 / 0.02)


def test_a_size_out_of_memory_in_a_speculating_cell_is_never_chosen():
    oom = table(
        {(1, 128): {0: 1.0, 1: 1.1, 2: 3.0}, (2, 128): {0: 1.0, 1: 1.1, 2: np.nan}}, {(1, 128): 0.01, (2, 128): 0.01}
    )
    # size 2 only where it fits (batch 1): 0.5*100*3 + 0.5*200 = 250 > size 1 everywhere: 55 + 110 = 165
    choice = choose_mix_tree(oom, parse_mix("1:1,2:1"))
    assert (choice.nodes, choice.speculate_up_to_batch) == (2, 1)
    assert choice.expected_tokens_per_s == pytest.approx(250.0)


def _brute_expected(speed, plain_tps, weight, batches, sizes, n, cutoff):
    """E(n, cutoff) by plain loops: -inf if size n cannot run in a speculating cell."""
    total = 0.0
    j = list(sizes).index(n)
    for c in range(len(weight)):
        s = speed[c][j] if (n and batches[c] <= cutoff) else 1.0
        if not np.isfinite(s):
            return -np.inf
        total += weight[c] * plain_tps[c] * s
    return total


def test_never_worse_than_any_per_cell_tree_brute_force():
    rng = np.random.default_rng(11)
    for trial in range(150):
        nb, nc, nn = rng.integers(1, 5), rng.integers(1, 3), rng.integers(2, 7)
        batches = sorted(rng.choice([1, 2, 4, 8, 16, 32], size=nb, replace=False).tolist())
        contexts = sorted(rng.choice([128, 512, 2048], size=nc, replace=False).tolist())
        sizes = list(range(nn))
        cells, t0 = {}, {}
        for b, s in itertools.product(batches, contexts):
            sp = {n: float(rng.uniform(0.3, 2.5)) for n in sizes[1:]}
            if rng.random() < 0.2:
                sp[sizes[-1]] = np.nan  # out of memory
            cells[(b, s)] = {0: 1.0, **sp}
            t0[(b, s)] = float(rng.uniform(0.005, 0.05))
        keys = [k for k in cells if rng.random() < 0.8] or [next(iter(cells))]
        weight = rng.uniform(0.01, 1.0, size=len(keys))
        spec = ",".join(f"{b}@{s}:{w:.6f}" for (b, s), w in zip(keys, weight, strict=True))
        mix = parse_mix(spec)
        choice = choose_mix_tree(table(cells, t0), mix)
        mkeys = list(zip(mix.batch, mix.context, strict=True))
        speed = [[cells[k][n] for n in sizes] for k in mkeys]
        plain_tps = [k[0] / t0[k] for k in mkeys]
        w, bs = list(mix.weight), [k[0] for k in mkeys]
        cutoffs = [0] + sorted(set(bs))
        brute = max(_brute_expected(speed, plain_tps, w, bs, sizes, n, cut) for n in sizes for cut in cutoffs)
        assert choice.expected_tokens_per_s == pytest.approx(brute, rel=1e-9), trial
        assert _brute_expected(
            speed, plain_tps, w, bs, sizes, choice.nodes, choice.speculate_up_to_batch
        ) == pytest.approx(brute, rel=1e-9)
        for cell in choice.cells:  # every cell's own best tree, used for the whole mix
            for cut in cutoffs:
                other = _brute_expected(speed, plain_tps, w, bs, sizes, cell.best_nodes, cut)
                assert choice.expected_tokens_per_s >= other - 1e-9 * abs(other)
        assert choice.expected_tokens_per_s <= choice.per_cell_best_tokens_per_s * (1 + 1e-12)


def test_mix_csv_and_inline_agree(tmp_path):
    f = tmp_path / "mix.csv"
    f.write_text("# from a serving log\nbatch,context,weight\n1,128,3\n4,128,1\n1,128,1\n")
    from_csv = parse_mix(str(f))
    assert (from_csv.batch, from_csv.context) == ((1, 4), (128, 128))
    assert from_csv.weight == pytest.approx((0.8, 0.2))  # duplicate rows of a cell add up
    inline = parse_mix("1@128:4, 4@128:1")
    assert (inline.batch, inline.context) == ((1, 4), (128, 128))
    assert inline.weight == pytest.approx((0.8, 0.2))


def test_entry_without_context_takes_the_tables_one_context():
    choice = choose_mix_tree(HAND, parse_mix("1:1,4:1"))
    assert [c.context for c in choice.cells] == [128, 128]
    two = pd.concat([HAND, HAND.assign(context=512)])
    with pytest.raises(UserError, match="2 contexts .*128, 512.*BATCH@CONTEXT:WEIGHT"):
        choose_mix_tree(two, parse_mix("1:1"))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("1:0.5,x:1", "entry 'x:1' is not BATCH:WEIGHT"),
        ("1:abc", "weight 'abc' is not a number"),
        ("0:1", "batch 0: batch sizes must be >= 1"),
        ("1:-1", "weight -1 must be a finite number >= 0"),
        ("1:0,2:0", "every weight is 0"),
    ],
)
def test_inline_errors(spec, message):
    with pytest.raises(UserError, match=message):
        parse_mix(spec)


def test_csv_errors(tmp_path):
    f = tmp_path / "m.csv"
    f.write_text("batch,context\n1,128\n")
    with pytest.raises(UserError, match=r"m.csv: missing column 'weight'"):
        parse_mix(str(f))
    f.write_text("batch,context,weight\n1,128,x\n")
    with pytest.raises(UserError, match="row 2: .*weight a number"):
        parse_mix(str(f))
    with pytest.raises(UserError, match="nothere.csv"):
        parse_mix(str(tmp_path / "nothere.csv"))


def test_missing_cell_lists_the_cells_there_are():
    with pytest.raises(UserError, match=r"cell batch 2 context 128 is not in .*\(it has 1@128, 4@128\)"):
        choose_mix_tree(HAND, parse_mix("2@128:1"))


def test_mix_section_holds_the_trees_choices():
    proposal = make_tree([[0], [1], [0, 0]])
    choice = choose_mix_tree(HAND, parse_mix("1:0.9,4:0.1"))
    section = mix_section(choice, proposal, parse_mix("1:0.9,4:0.1")).to_json()
    assert section["nodes"] == 2 and section["medusa_choices"] == [[0], [1]]
    assert section["speculate_up_to_batch"] == 1 and section["off_from_batch"] == 4
    assert [c["mix_nodes"] for c in section["cells"]] == [2, 0]


# ---- the command line: `select --mix`, `roofline speedup --mix`, selection cells as trees


def _run(capsys, *argv):
    main([str(a) for a in argv])
    return capsys.readouterr()


def _fail(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    err = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("treeopt: error: "), err
    return err[0]


def test_select_mix_from_a_measured_sweep_and_its_cells_as_trees(tmp_path, capsys):
    sweep = write_sweep(tmp_path)
    out = tmp_path / "sel.json"
    printed = _run(capsys, "select", "--sweep", sweep, "--mix", "1@128:1,4@128:1", "-o", out).out
    mix = json.loads(out.read_text())["mix"]
    # hand_sweep: T(0) = 10 ms, plain 100 * b tokens/s; E(2, all on) = 0.5*100*1.8 + 0.5*400*1.3 = 350
    # beats E(1, all on) = 335, E(4, all on) = 320, E(2, up to 1) = 290
    assert (mix["nodes"], mix["speculate_up_to_batch"], mix["off_from_batch"]) == (2, 4, None)
    assert mix["expected_tokens_per_s"] == pytest.approx(350.0)
    assert mix["medusa_choices"] == PROPOSAL.prefix(2).to_choices()
    assert "one tree for the mix" in printed and "2 nodes" in printed

    shown = json.loads(_run(capsys, "show", f"{out}:mix", "--json").out)
    assert shown["medusa_choices"] == [[0], [1]]
    shown = json.loads(_run(capsys, "show", f"{out}:batch=4,context=128", "--json").out)
    assert shown["medusa_choices"] == PROPOSAL.prefix(1).to_choices()
    assert _run(capsys, "build", "--tree", f"{out}:batch=1,context=128", "--format", "python").out == "[[0], [1]]\n"
    table = _run(capsys, "compare", "--accuracy", MEDUSA_CSV, "--csv-model", "vicuna-7b", f"{out}:mix").out
    assert f"{out}:mix"[:20] in table

    assert "no speculation (0 nodes)" in _fail(capsys, "show", f"{out}:batch=1,context=512")
    err = _fail(capsys, "show", f"{out}:batch=4")
    assert "batch 4 has 2 cells: add context=S" in err
    err = _fail(capsys, "show", f"{out}:batch=2,context=128")
    assert "no such cell in the selection (cells: batch=1,context=128; batch=1,context=512; " in err
    assert "the cell must be 'batch=B,context=S' or 'mix', got 'size=3'" in _fail(capsys, "show", f"{out}:size=3")
    plain = tmp_path / "plain.json"
    _run(capsys, "select", "--sweep", sweep, "-o", plain)
    assert "no traffic-mix tree (write it with `treeopt select --mix`)" in _fail(capsys, "show", f"{plain}:mix")


def test_select_mix_names_a_missing_cell(tmp_path, capsys):
    err = _fail(capsys, "select", "--sweep", write_sweep(tmp_path), "--mix", "2@128:1")
    assert "cell batch 2 context 128 is not in" in err and "(it has 1@128, 1@512, 4@128, 4@512)" in err


def test_roofline_speedup_mix_cells_join_the_grid(tmp_path, capsys):
    sel = tmp_path / "sel.json"
    printed = _run(
        capsys,
        "roofline",
        "speedup",
        "--model",
        "vicuna-7b",
        "--hardware",
        "h100-sxm",
        "--accuracy",
        MEDUSA_CSV,
        "--csv-model",
        "vicuna-7b",
        "--batch",
        "1",
        "--context",
        "1024",
        "--max-nodes",
        "16",
        "--mix",
        "1:0.5,3:0.5",
        "--select",
        sel,
    ).out
    doc = json.loads(sel.read_text())
    assert [(c["batch"], c["context"]) for c in doc["cells"]] == [(1, 1024), (3, 1024)]
    assert [(c["batch"], c["weight"]) for c in doc["mix"]["cells"]] == [(1, 0.5), (3, 0.5)]
    assert doc["mix"]["expected_tokens_per_s"] <= doc["mix"]["per_cell_best_tokens_per_s"]
    assert "one tree for the mix" in printed


def test_run_bad_mix_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    assert "--mix '1:x': entry '1:x': weight 'x' is not a number" in _fail(
        capsys, "run", "--mix", "1:x", "-o", tmp_path / "r"
    )
    assert not (tmp_path / "r").exists()
