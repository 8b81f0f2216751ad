"""`treeopt select --engine E` prints, beside the per-cell table, the schedule that engine takes
(docs/engines.md#schedules), stores it in the selection, and `treeopt run` writes it under the
answer in `index.md`.

The grid below is small and hand-made; every expected schedule is derived by hand from the
per-cell choices (each cell's largest speedup), the context rule of
docs/engines.md#context-in-a-schedule (the shortest draft of a batch size's contexts; the mix's
contexts where a mix is given) and the ranges rule of docs/engines.md#batch-ranges.
"""

from __future__ import annotations

import json

import pytest

from treeopt.app.run_answer import answer_section
from treeopt.cli import main
from treeopt.selection_types import read_selection

# speedup per (batch, context) at 0..3 nodes; by hand, the best size per cell:
# (1, 128): 3 (1.83); (1, 512): 2 (1.73); (8, *): 1 (1.45); (64, *): none beats 1
SPEEDUPS = {
    (1, 128): (1.52, 1.73, 1.83),
    (1, 512): (1.52, 1.73, 1.62),
    (8, 128): (1.45, 1.27, 1.05),
    (8, 512): (1.45, 1.27, 1.05),
    (64, 128): (0.89, 0.95, 0.87),
    (64, 512): (0.89, 0.95, 0.87),
}


def _files(tmp_path, width: int):
    rows = ["batch,context,nodes,tau,step_time_s,overhead,speedup,fits_memory"]
    for (b, c), speeds in SPEEDUPS.items():
        rows.append(f"{b},{c},0,1,0.01,1,1,True")
        rows += [f"{b},{c},{n},1.5,0.01,1,{v},True" for n, v in enumerate(speeds, start=1)]
    grid = tmp_path / "grid.csv"
    grid.write_text("\n".join(rows) + "\n")
    heads = [{"head": d, "positions": 100, "hits": [h, 20][:width]} for d, h in ((1, 60), (2, 50), (3, 40))]
    acc = tmp_path / f"acc{width}.json"
    acc.write_text(json.dumps({"format": "treeopt.accuracy/v1", "num_heads": 3, "width": width, "heads": heads}))
    return grid, acc


def _select(tmp_path, capsys, width, *extra):
    grid, acc = _files(tmp_path, width)
    out = tmp_path / "sel.json"
    main(["select", "--grid", str(grid), "--accuracy", str(acc), "-o", str(out), *extra])
    return read_selection(out), capsys.readouterr().out


def test_select_engine_vllm_prints_and_stores_the_per_batch_schedule(tmp_path, capsys):
    sel, printed = _select(tmp_path, capsys, 1, "--engine", "vllm")
    # batch 1: contexts chose 3 and 2 -> 2; batch 8: 1; batch 64: 0. Ranges: 1:2, gap 2-7
    # min(2, 1) = 1 merged with 8:1, gap 9-63 min(1, 0) = 0 merged with 64:0
    want = {
        "method": "eagle",
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 8, 1], [9, 64, 0]],
    }
    assert sel.schedule["config"] == want
    assert f"--speculative-config '{json.dumps(want)}'" in printed.splitlines()
    assert "1-1: 2, 2-8: 1, 9-64: 0" in printed and "contexts 128, 512" in printed


def test_select_engine_trtllm_draft_model_gives_draft_len_schedule(tmp_path, capsys):
    sel, printed = _select(tmp_path, capsys, 1, "--engine", "trtllm-draft-model")
    # keys are each drafting range's largest batch size: {1: 2, 8: 1}; above 8 nothing drafts
    # (JSON writes the keys as strings; TensorRT-LLM's dict[int, int] field reads them back)
    assert sel.schedule["config"] | {"draft_len_schedule": {1: 2, 8: 1}} == {
        "decoding_type": "Draft_Target",
        "max_draft_len": 2,
        "draft_len_schedule": {1: 2, 8: 1},
        "speculative_model": "<draft model>",
    }
    assert sel.schedule["config"]["draft_len_schedule"] == {"1": 2, "8": 1}
    assert "draft_len_schedule" in printed


def test_a_mix_takes_only_its_own_contexts(tmp_path, capsys):
    sel, printed = _select(tmp_path, capsys, 1, "--engine", "vllm", "--mix", "1@128:0.5,8@512:0.5")
    # batch 1 runs at context 128 only (3 drafts), batch 8 at 512 (1); past 8 nothing is claimed
    assert sel.schedule["config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 8, 1], [9, 9, 0]]
    assert "the mix's contexts" in printed


def test_sglang_gets_one_triple_for_the_traffic_and_one_per_batch_range(tmp_path, capsys):
    sel, printed = _select(tmp_path, capsys, 2, "--engine", "sglang")
    # The proposal on accuracies (0.6, 0.2), (0.5, 0.2), (0.4, 0.2): [0], then [0, 0] (0.3 >
    # [1]'s 0.2), then [1] (0.2 > [0, 0, 0] and [0, 1], 0.12). SGLang drafts 1 node as steps 1
    # topk 1 (2 tokens), 2 as steps 2 topk 1 (3), 3 as steps 2 topk 2 (4: [0], [0, 0], [1] are
    # the 3 best of [0] .6, [1] .2, [0, 0] .3, [0, 1] .12, [1, 0] .1, [1, 1] .04).
    # Mean over the 6 cells: (1,1,2) 1.2867, (2,1,3) 1.3167, (2,2,4) 1.215, plain 1.
    s = sel.schedule
    assert s["triple"] == [2, 1, 3] and s["mean_speedup"] == pytest.approx(1.3167, abs=1e-4)
    assert "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in s["line"]
    # batch 1: (2,1,3) 1.73 > (2,2,4) 1.725 > (1,1,2) 1.52; batch 8: (1,1,2) 1.45; batch 64: plain
    assert [(a, b, t) for a, b, t, _ in s["per_range"]] == [(1, 1, [2, 1, 3]), (8, 8, [1, 1, 2]), (64, 64, [0, 0, 0])]
    assert "no speculation" in s["per_range"][2][3]
    assert s["line"] in printed and "batch 64-64: no speculation" in printed


def test_an_engine_without_a_table_says_so(tmp_path, capsys):
    sel, printed = _select(tmp_path, capsys, 2, "--engine", "trtllm")
    assert "config" not in sel.schedule and "legacy TensorRT backend" in sel.schedule["note"]
    assert "per-batch schedule (trtllm): none" in printed


def test_the_answer_section_carries_the_schedule(tmp_path, capsys):
    sel, _ = _select(tmp_path, capsys, 1, "--engine", "vllm")
    text = "\n".join(answer_section(sel, None, heads=3))
    assert f"`{sel.schedule['line']}`" in text and "2-8: 1" in text
    sglang, _ = _select(tmp_path, capsys, 2, "--engine", "sglang")
    text = "\n".join(answer_section(sglang, None, heads=3))
    assert "One SGLang server" in text and "- batch 8-8: `--speculative-algorithm EAGLE" in text


def test_roofline_speedup_select_prints_and_writes_what_treeopt_select_gives(tmp_path, capsys):
    """Issue 46: `roofline speedup --select --engine E` wrote no engine line while
    `treeopt.select(prediction)` gave one: one selection document from the same inputs."""
    import treeopt

    _, acc = _files(tmp_path, 1)
    out = tmp_path / "rs.json"
    args = ["--model", "llama-2-7b", "--hardware", "h100", "--accuracy", str(acc), "--engine", "vllm"]
    args += ["--batch", "1,8,64", "--context", "512,4096", "--max-nodes", "3", "--select", str(out)]
    main(["roofline", "speedup", *args])
    printed = capsys.readouterr().out
    got = json.loads(out.read_text())
    prediction = treeopt.predict(
        "llama-2-7b", "h100", str(acc), batches=[1, 8, 64], contexts=[512, 4096], max_nodes=3, engine="vllm"
    )
    want = treeopt.select(prediction).to_dict()
    assert got["schedule"] == json.loads(json.dumps(want["schedule"])) and got["engine"] == "vllm"
    assert [c["engine_line"] for c in got["cells"]] == [c["engine_line"] for c in want["cells"]]
    assert got["schedule"]["line"] in printed.splitlines()
    # the schedule's ranges follow the cells: per batch the shortest chain its contexts chose
    shortest = {}
    for c in got["cells"]:
        shortest[c["batch"]] = min(shortest.get(c["batch"], 99), c["nodes"])
    for b, k in shortest.items():
        assert any(s <= b <= e and kk == k for s, e, kk in got["schedule"]["ranges"]), (b, k)
