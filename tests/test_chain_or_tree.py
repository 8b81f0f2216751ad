"""Chain or tree per cell (treeopt/chain_or_tree.py, docs/engines.md#chain-or-tree): the best
chain the sweep measured beside the tree the selection ships, with intervals, and whether the
tree pays. Expected values are read off the hand-made sweep below by the selection rule of
docs/statistics.md#choosing-a-tree-with-intervals (the smallest size whose ratio to the best
is within the tolerance at its lower bound, lo(i) / hi(best) without per-round samples)."""

from __future__ import annotations

import json

import pandas as pd

import treeopt
from treeopt.selection import SWEEP_COLUMNS

# sizes 1 and 2 are chains ([0], [0, 0]); 3 and 4 branch
PROPOSAL = [[0], [0, 0], [1], [0, 1]]
TAU = {0: 1.0, 1: 1.6, 2: 2.1, 3: 2.3, 4: 2.6}
CELLS = {
    # the 4-node tree: lo(2) / hi(4) = 1.48 / 1.92 < 0.97, so no chain is within 3%: the tree pays
    (1, 512): {1: 1.3, 2: 1.5, 3: 1.6, 4: 1.9},
    # the 2-node chain is best: it ships, the tree does not pay
    (8, 512): {1: 1.3, 2: 1.5, 3: 1.45, 4: 1.4},
}


def _sweep(tmp_path):
    rows = []
    for (b, s), cell in CELLS.items():
        rows.append({"batch": b, "context": s, "nodes": 0, "tau": 1.0, "speedup": 1.0, "step_time_s": 0.01})
        for n, v in cell.items():
            rows.append(
                {
                    "batch": b,
                    "context": s,
                    "nodes": n,
                    "tau": TAU[n],
                    "overhead": TAU[n] / v,
                    "speedup": v,
                    "speedup_lo": v - 0.02,
                    "speedup_hi": v + 0.02,
                    "step_time_s": 0.01 * TAU[n] / v,
                    "samples": 10,
                }
            )
    path = tmp_path / "sweep.csv"
    pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS).to_csv(path, index=False)
    meta = {"format": "treeopt.sweep/v1", "model": "tiny", "device": "cpu", "proposal": PROPOSAL}
    path.with_name("sweep.meta.json").write_text(json.dumps(meta))
    return path


def test_each_cell_shows_the_best_chain_the_tree_and_whether_it_pays(tmp_path):
    sel = treeopt.select(treeopt.load_sweep(_sweep(tmp_path)), pooled=False)
    section = sel.chain_or_tree
    assert section["chain_nodes_measured"] == 2
    cells = {(c["batch"], c["context"]): c for c in section["cells"]}
    one, eight = cells[(1, 512)], cells[(8, 512)]
    assert one["chain"] == {"nodes": 2, "speedup": 1.5, "speedup_lo": 1.48, "speedup_hi": 1.52}
    assert one["tree"]["nodes"] == 4 and one["tree_pays"].startswith("yes: no measured chain is within")
    assert eight["chain"]["nodes"] == 2 and eight["tree"]["nodes"] == 2
    assert eight["tree_pays"].startswith("no")
    text = sel.summary()
    assert "chain 2 nodes 1.50x [1.48, 1.52], tree 4 nodes" in text and "tree pays: yes:" in text
    # it survives the selection file
    assert sel.to_dict()["chain_or_tree"] == section


def test_an_engine_that_drafts_chains_only_gets_no_comparison_and_vllm_020_verifies_chains(tmp_path):
    sweep = treeopt.load_sweep(_sweep(tmp_path))
    from treeopt.chain_or_tree import chain_or_tree
    from treeopt.engine_data import get_engine
    from treeopt.mix import mix_grid_from_sweep
    from treeopt.tree import make_tree

    sel = treeopt.select(sweep, pooled=False)
    grid = mix_grid_from_sweep(sweep.frame)
    proposal = make_tree(PROPOSAL)
    assert chain_or_tree(sel, grid, proposal, get_engine("vllm")) is None
    old = chain_or_tree(sel, grid, proposal, get_engine("vllm@0.20"))
    assert all("verifies the flattened tree as a chain" in c["tree_pays"] for c in old["cells"])
    assert chain_or_tree(sel, grid, make_tree([[0], [0, 0]]), None) is None  # nothing but chains


def test_the_run_report_has_the_chain_or_tree_table(tmp_path):
    from treeopt.app.run_answer import chain_or_tree_markdown

    sel = treeopt.select(treeopt.load_sweep(_sweep(tmp_path)), pooled=False)
    text = "\n".join(chain_or_tree_markdown(sel.chain_or_tree))
    assert "| 1 | 512 | 2 nodes, 1.50x (1.48–1.52) | 4 nodes" in text and "| yes: no measured chain" in text


def test_the_chains_measured_end_at_the_first_branching_node():
    from treeopt.chain_or_tree import chain_prefix_length
    from treeopt.tree import make_tree

    assert chain_prefix_length(make_tree([[0], [0, 0], [1], [0, 0, 0]])) == 2
    assert chain_prefix_length(make_tree([[0], [0, 1], [0, 1, 0]])) == 1  # [0, 1] is not rank 0
    assert chain_prefix_length(make_tree([[1], [0]])) == 0
