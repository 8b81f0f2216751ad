"""`treeopt select --engine trtllm-eagle3-dynamic --dynamic-tau FILE`: TensorRT-LLM's dynamic-tree
config priced from the draft's own tau per (steps, topk, num_draft_tokens) (`treeopt sglang-tau
-o`) and the step time of as many drafted nodes (treeopt/dynamic_schedule.py,
docs/engines.md#schedules). Every expected value is derived by hand below from
speedup = tau * T(0) / T(n), n = num_draft_tokens - 1, and TensorRT-LLM's validator bound
max_draft_len <= n <= dynamic_tree_max_topK * max_draft_len (tensorrt_llm/llmapi/llm_args.py)."""

from __future__ import annotations

import json

import pytest

from treeopt.cli import main
from treeopt.dynamic_schedule import dynamic_options
from treeopt.selection_types import read_selection
from treeopt.trtllm_eagle import trtllm_dynamic_fits

# step time (ms) per (batch, context) at 0, 1, 2, 4, 5 nodes
STEP_MS = {(1, 128): (10, 11, 12, 16, 18), (8, 128): (20, 24, 40, 44, 50)}
NODES = (0, 1, 2, 4, 5)
# (steps, topk, num_draft_tokens): tau, as `treeopt sglang-tau -o` writes them (root counted)
TAUS = {(2, 2, 3): 1.8, (2, 2, 5): 2.1, (2, 2, 6): 2.3, (3, 2, 3): 1.9}
TAU_CSV = "steps,topk,num_draft_tokens,tau_predicted,tau_predicted_se,steps_walked\n" + "".join(
    f"{s},{k},{t},{tau},0.05,100\n" for (s, k, t), tau in TAUS.items()
)


def _grid() -> dict:
    rows = [(b, c, n, ms / 1000) for (b, c), times in STEP_MS.items() for n, ms in zip(NODES, times)]
    return {k: [r[i] for r in rows] for i, k in enumerate(("batch", "context", "nodes", "step_time_s"))}


def test_each_triple_is_priced_by_the_step_time_of_its_drafted_tokens():
    got = dynamic_options(_grid(), TAUS, trtllm_dynamic_fits)
    # (2, 2, 3): 2 drafted tokens; (2, 2, 5): 4. (2, 2, 6) drafts 5 > topK 2 x 2 layers and
    # (3, 2, 3) drafts 2 < 3 layers: TensorRT-LLM refuses both, so neither is priced.
    want = {
        (1, 128): {(2, 2, 3): 1.8 * 10 / 12, (2, 2, 5): 2.1 * 10 / 16},
        (8, 128): {(2, 2, 3): 1.8 * 20 / 40, (2, 2, 5): 2.1 * 20 / 44},
    }
    assert got.keys() == want.keys()
    for cell, priced in want.items():
        assert got[cell] == pytest.approx(priced), cell


def _files(tmp_path):
    rows = ["batch,context,nodes,tau,step_time_s,overhead,speedup,fits_memory"]
    for (b, c), times in STEP_MS.items():
        for n, ms in zip(NODES, times):
            rows.append(f"{b},{c},{n},{1 + 0.2 * n},{ms / 1000},{ms / times[0]},{(1 + 0.2 * n) * times[0] / ms},True")
    (tmp_path / "grid.csv").write_text("\n".join(rows) + "\n")
    heads = [{"head": d, "positions": 100, "hits": [h, 20]} for d, h in ((1, 60), (2, 50), (3, 40))]
    (tmp_path / "acc.json").write_text(
        json.dumps({"format": "treeopt.accuracy/v1", "num_heads": 3, "width": 2, "heads": heads})
    )
    (tmp_path / "taus.csv").write_text(TAU_CSV)
    return ["select", "--grid", str(tmp_path / "grid.csv"), "--accuracy", str(tmp_path / "acc.json")]


def test_select_stores_the_config_of_best_mean_speedup_over_the_cells(tmp_path, capsys):
    out = tmp_path / "sel.json"
    argv = _files(tmp_path) + ["--engine", "trtllm-eagle3-dynamic", "--dynamic-tau", str(tmp_path / "taus.csv")]
    main([*argv, "-o", str(out)])
    printed = capsys.readouterr().out
    s = read_selection(out).schedule
    # means: (2, 2, 3) (1.5 + 0.9) / 2 = 1.2; (2, 2, 5) (1.3125 + 0.9545) / 2 = 1.1335; plain 1.
    # Per batch: 1 -> (2, 2, 3) at 1.5; 8 -> plain (0.9 and 0.9545 < 1)
    assert s["triple"] == [2, 2, 3] and s["mean_speedup"] == pytest.approx(1.2, abs=1e-4)
    assert s["config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 2,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 2,
        "max_total_draft_tokens": 2,
        "speculative_model_dir": "<EAGLE-3 draft>",
        "eagle3_one_model": True,
    }
    assert [(a, b, t) for a, b, t, _ in s["per_range"]] == [(1, 1, [2, 2, 3]), (8, 8, [0, 0, 0])]
    assert "taus.csv" in s["source"] and "draft's own scores" in s["source"]
    assert s["line"] in printed and "taus.csv" in printed


@pytest.mark.parametrize(
    ("extra", "taus", "words"),
    [
        (["--engine", "sglang"], TAU_CSV, "give --engine trtllm-eagle3-dynamic"),
        ([], TAU_CSV, "give --engine trtllm-eagle3-dynamic"),
        (["--engine", "trtllm-eagle3-dynamic"], "steps,topk,num_draft_tokens\n2,2,3\n", "no tau_predicted column"),
        (["--engine", "trtllm-eagle3-dynamic"], TAU_CSV + "2,2,4,0.5,0,1\n", "row 6: tau_predicted 0.5"),
        (["--engine", "trtllm-eagle3-dynamic"], TAU_CSV + "2,x,4,1.5,0,1\n", "row 6: topk 'x' is not an integer"),
        (
            ["--engine", "trtllm-eagle3-dynamic"],
            "steps,topk,num_draft_tokens,tau_predicted\n4,1,4,1.5\n2,2,4,1.5\n",
            "no triple",
        ),
    ],
    ids=["sglang", "no-engine", "no-tau-column", "tau-below-one", "topk-not-int", "nothing-priced"],
)
def test_a_bad_tau_file_or_engine_is_one_line_and_writes_nothing(tmp_path, capsys, extra, taus, words):
    argv = _files(tmp_path)
    (tmp_path / "taus.csv").write_text(taus)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exc:
        main([*argv, *extra, "--dynamic-tau", str(tmp_path / "taus.csv"), "-o", str(tmp_path / "sel.json")])
    err = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("treeopt: error: "), err
    assert words in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
