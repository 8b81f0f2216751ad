"""TensorRT-LLM's EAGLE-3 lines (treeopt/trtllm_eagle.py, docs/engines.md#tensorrt-llm-eagle-3)
checked against TensorRT-LLM's own validation rules, transcribed below from
tensorrt_llm/llmapi/llm_args.py (NVIDIA/TensorRT-LLM main after 011d0933): DecodingBaseConfig
(a StrictBaseModel: unknown keys refused; draft_len_schedule's smallest key equals
max_draft_len, every value <= it; max_concurrency and draft_len_schedule mutually exclusive),
EagleDecodingConfig.validate_eagle_config / check_eagle_choices / validate_speculative_model.
TensorRT-LLM does not install on a CPU machine without CUDA, so the rules are transcribed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treeopt.accuracy import load_accuracy
from treeopt.app.run_answer import answer_section
from treeopt.cli import main
from treeopt.engine_data import engine_for_drafter, get_engine
from treeopt.engines import check, export_for
from treeopt.errors import UserError
from treeopt.family_build import engine_proposal
from treeopt.schedules import selection_schedule
from treeopt.selection_types import read_selection
from treeopt.tree import make_tree
from treeopt.trtllm_eagle import trtllm_dynamic_fits, trtllm_dynamic_tree_config

MEDUSA_CSV = Path(__file__).resolve().parents[1] / "treeopt" / "data" / "medusa_train_accuracy.csv"

# DecodingBaseConfig's and EagleDecodingConfig's / Eagle3DecodingConfig's fields
_FIELDS = {
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "speculative_model_dir",
    "max_concurrency", "draft_len_schedule", "load_format", "acceptance_window", "acceptance_length_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "eagle_choices", "greedy_sampling", "posterior_threshold",
    "use_dynamic_tree", "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer",
    "eagle3_one_model", "eagle3_layers_to_capture", "eagle3_model_arch", "sa_config",
}  # fmt: skip


def trtllm_refusal(config: dict) -> str | None:
    """Why TensorRT-LLM's Eagle3DecodingConfig(**config) raises, None when it accepts (transcribed)."""
    unknown = set(config) - _FIELDS
    if unknown:
        return f"extra fields not permitted: {sorted(unknown)}"
    if config.get("decoding_type") not in ("Eagle3", "Eagle"):
        return "decoding_type"
    draft = config.get("max_draft_len")
    schedule = config.get("draft_len_schedule")
    if schedule is not None:
        schedule = {int(k): int(v) for k, v in schedule.items()}  # dict[int, int] from JSON keys
        if min(schedule) < 1 or min(schedule.values()) < 0:
            return "draft_len_schedule bounds"
        if draft is not None and schedule[min(schedule)] != draft:
            return "draft_len_schedule[smallest] must equal max_draft_len"
        if draft is not None and max(schedule.values()) > draft:
            return "draft_len_schedule values must be <= max_draft_len"
        if config.get("max_concurrency") is not None:
            return "max_concurrency and draft_len_schedule are mutually exclusive"
    if not draft:
        return "max_draft_len must be > 0 for Eagle"
    choices = config.get("eagle_choices")
    dynamic = config.get("use_dynamic_tree") or config.get("dynamic_tree_max_topK") is not None
    if choices is not None:
        if dynamic:
            return "If eagle_choices is provided, use_dynamic_tree should be False"
        paths = {tuple(c) for c in choices}
        if any(len(c) > 1 and c[:-1] not in paths for c in paths):
            return "choice is not connected"
    if dynamic:
        k, total = config.get("dynamic_tree_max_topK"), config.get("max_total_draft_tokens")
        if k is None or k <= 0:
            return "dynamic_tree_max_topK should be provided"
        if total is not None and not draft <= total <= k * draft:
            return "max_total_draft_tokens out of [max_draft_len, topK * max_draft_len]"
    if config.get("speculative_model", config.get("speculative_model_dir")) is None:
        return "Draft model must be provided for EAGLE"
    return None


def _config(line: str) -> dict:
    assert line.startswith("speculative_config = ")
    return json.loads(line.removeprefix("speculative_config = "))


DRAFT = ("eagle3", "/models/eagle3-draft")


def test_every_chain_and_schedule_export_is_accepted():
    engine = get_engine("trtllm-eagle3")
    for n in range(1, 9):
        config = _config(export_for(engine, make_tree([[0] * d for d in range(1, n + 1)]), drafter=DRAFT).line)
        assert trtllm_refusal(config) is None, config
        # a chain: max_draft_len = n, the draft named, the one-model path
        assert config["max_draft_len"] == n and config["speculative_model_dir"] == DRAFT[1]
        assert "eagle_choices" not in config and config["eagle3_one_model"] is True
    cells = [{"batch": b, "context": 512, "nodes": k} for b, k in ((1, 4), (4, 3), (16, 1), (64, 0))]
    section = selection_schedule(cells, engine, drafter=DRAFT)
    # ranges by hand: 1:4, 2-4: 3, 5-16: 1, above 16 nothing -> keys {1: 4, 4: 3, 16: 1}
    assert section["config"]["draft_len_schedule"] == {1: 4, 4: 3, 16: 1}
    assert trtllm_refusal(section["config"]) is None
    only_off = selection_schedule(
        [{"batch": 1, "context": 1, "nodes": 3}, {"batch": 8, "context": 1, "nodes": 0}], engine
    )
    # 1:3, then the gap 2-7 takes min(3, 0) = 0: speculation only at batch 1, max_concurrency 1
    assert only_off["config"]["max_concurrency"] == 1 and trtllm_refusal(only_off["config"]) is None


def test_static_trees_on_13_are_eagle_choices_with_the_depth_and_the_deprecation():
    engine = get_engine("trtllm-eagle3-tree@1.3")
    tree = make_tree([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    export = export_for(engine, tree, drafter=DRAFT)
    config = _config(export.line)
    assert trtllm_refusal(config) is None
    assert config["max_draft_len"] == 3 and sorted(map(tuple, config["eagle_choices"])) == sorted(tree.paths)
    assert "removed in release 1.4" in export.text


def test_the_dynamic_tree_config_follows_the_validator():
    ok = trtllm_dynamic_tree_config(4, 3, 10, DRAFT)
    assert trtllm_refusal(ok) is None and ok["use_dynamic_tree"] is True
    for depth, k, total in ((4, 3, 13), (4, 3, 3), (0, 3, 3), (4, 0, 4)):
        assert trtllm_refusal(
            {**ok, "max_draft_len": depth, "dynamic_tree_max_topK": k, "max_total_draft_tokens": total}
        )
        with pytest.raises(UserError, match="TensorRT-LLM dynamic tree"):
            trtllm_dynamic_tree_config(depth, k, total)


def test_the_transcribed_rules_refuse_what_tensorrt_llm_refuses():
    good = {"decoding_type": "Eagle3", "max_draft_len": 2, "speculative_model_dir": "/d"}
    assert trtllm_refusal(good) is None
    assert trtllm_refusal({**good, "speculative_model_dir": None})  # no draft
    assert trtllm_refusal({**good, "num_speculative_tokens": 2})  # a vLLM key: extra forbidden
    assert trtllm_refusal({**good, "draft_len_schedule": {"1": 3}})  # longer than max_draft_len
    assert trtllm_refusal({**good, "draft_len_schedule": {"1": 2}, "max_concurrency": 4})
    assert trtllm_refusal({**good, "eagle_choices": [[0], [1, 0]]})  # [1] missing: not connected


def test_an_eagle3_draft_with_trtllm_gets_eagle3_never_medusa():
    target, why = engine_for_drafter("trtllm", "eagle3")
    assert target == "trtllm-eagle3" and "Eagle3DecodingConfig" in why
    assert engine_for_drafter("trtllm-eagle3-tree@1.3", "eagle3") == ("trtllm-eagle3-tree@1.3", None)
    assert engine_for_drafter("trtllm", "eagle")[0] is None
    assert engine_for_drafter("trtllm-eagle3", "medusa")[0] == "trtllm"


# ---- the dynamic tree as an engine (--engine trtllm-eagle3-dynamic) ----------------------------
# TensorRT-LLM's one-model dynamic-tree worker (tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py
# @ 470bb720) drafts SGLang's tree: layer 1 the root's top-K children, each later layer the K
# best-scored of the K*K children of the layer before, every child kept in the history, and the
# max_total_draft_tokens best of the history drafted. The table below is monotone in rank, so the
# drafter's scores are the accuracies and every draft is derived by hand from them.
ACC = [[0.6, 0.3], [0.5, 0.2], [0.4, 0.2]]
DYNAMIC = get_engine("trtllm-eagle3-dynamic")


def _dynamic(depth: int, k: int, total: int) -> dict:
    return {
        "decoding_type": "Eagle3",
        "max_draft_len": depth,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": k,
        "max_total_draft_tokens": total,
        "speculative_model_dir": "/d",
        "eagle3_one_model": True,
    }


def test_the_sizes_the_engine_takes_are_the_validators():
    for steps in range(1, 5):
        for k in range(1, 5):
            for n in range(0, 22):
                assert trtllm_dynamic_fits(n, steps, k) == (trtllm_refusal(_dynamic(steps, k, n)) is None), (
                    n,
                    steps,
                    k,
                )


def test_a_tree_sglang_drafts_in_two_steps_needs_three_on_tensorrt_llm():
    # steps 2 of topk 2, scores: [0] .6, [1] .3, [0,0] .3, [1,0] .15, [0,1] .12, [1,1] .06 (ties
    # to the shallower node). The 5 best: [0], [1], [0,0], [1,0], [0,1]. SGLang drafts them as
    # (2, 2, 6 tokens); TensorRT-LLM caps 2 layers of topK 2 at 4 tokens, and 3 layers add
    # [0,0,0] .12 and [1,0,0], [0,0,1] .06 behind them: the same 5 best, so (3, 2, 5).
    tree = make_tree([[0], [1], [0, 0], [1, 0], [0, 1]])
    sglang = export_for(get_engine("sglang"), tree, accuracy=ACC).line
    assert "--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 6" in sglang
    config = _config(export_for(DYNAMIC, tree, accuracy=ACC, drafter=DRAFT).line)
    assert config == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 2,
        "max_total_draft_tokens": 5,
        "speculative_model_dir": DRAFT[1],
        "eagle3_one_model": True,
    }
    assert trtllm_refusal(config) is None
    checked = check(tree, DYNAMIC, accuracy=ACC)
    assert checked.as_written and "max_draft_len 3, dynamic_tree_max_topK 2, max_total_draft_tokens 5" in checked.reason


def test_a_tree_only_sglang_drafts_is_refused():
    # the 6 best of 2 steps of topk 2 add [1,1] .06; 3 layers of topK 2 (6 tokens) rank [0,0,0]
    # .12 before it, and 3 heads allow no 4th layer: SGLang drafts it (2, 2, 7), TensorRT-LLM cannot
    tree = make_tree([[0], [1], [0, 0], [1, 0], [0, 1], [1, 1]])
    assert "--speculative-num-draft-tokens 7" in export_for(get_engine("sglang"), tree, accuracy=ACC).line
    assert not check(tree, DYNAMIC, accuracy=ACC).as_written
    with pytest.raises(UserError, match="TensorRT-LLM's dynamic tree drafts no such tree"):
        export_for(DYNAMIC, tree, accuracy=ACC)


def test_topk_one_is_written_as_the_chain():
    # a dynamic tree of topK 1 is the chain of max_draft_len tokens: TensorRT-LLM's linear tree
    config = _config(export_for(DYNAMIC, make_tree([[0], [0, 0]]), accuracy=ACC, drafter=DRAFT).line)
    assert config == {
        "decoding_type": "Eagle3",
        "max_draft_len": 2,
        "speculative_model_dir": DRAFT[1],
        "eagle3_one_model": True,
    }


def test_every_prefix_of_the_engines_proposal_is_a_config_tensorrt_llm_takes():
    table = load_accuracy(str(MEDUSA_CSV), model="vicuna-7b")
    proposal = engine_proposal(table, 40, DYNAMIC)
    assert proposal.size >= 10
    for n in range(1, proposal.size + 1):
        config = _config(export_for(DYNAMIC, proposal.prefix(n), accuracy=table.accuracy, drafter=DRAFT).line)
        assert trtllm_refusal(config) is None, (n, config)
        # the config names as many tokens as the prefix has nodes (a chain: max_draft_len)
        assert config.get("max_total_draft_tokens", config["max_draft_len"]) == n


def test_an_eagle3_draft_keeps_the_dynamic_engine():
    assert engine_for_drafter("trtllm-eagle3-dynamic", "eagle3") == ("trtllm-eagle3-dynamic", None)
    assert engine_for_drafter("trtllm-eagle3-dynamic", "medusa")[0] == "trtllm"
    assert engine_for_drafter("trtllm-eagle3-dynamic", "eagle")[0] is None


# speedup per (batch, context) at 0..3 nodes of the proposal on rank accuracies (0.6, 0.2),
# (0.5, 0.2), (0.4, 0.2): [0], [0, 0] (.3 > [1]'s .2), [1] (.2 > [0,1] .12 and [0,0,0] .12)
GRID_SPEEDUPS = {(1, 128): (1.2, 1.3, 1.6), (4, 128): (1.2, 1.4, 1.3), (32, 128): (0.9, 0.8, 0.7)}


def _select_dynamic(tmp_path, capsys):
    rows = ["batch,context,nodes,tau,step_time_s,overhead,speedup,fits_memory"]
    for (b, c), speeds in GRID_SPEEDUPS.items():
        rows.append(f"{b},{c},0,1,0.01,1,1,True")
        rows += [f"{b},{c},{n},1.5,0.01,1,{v},True" for n, v in enumerate(speeds, start=1)]
    (tmp_path / "grid.csv").write_text("\n".join(rows) + "\n")
    heads = [{"head": d, "positions": 100, "hits": [h, 20]} for d, h in ((1, 60), (2, 50), (3, 40))]
    (tmp_path / "acc.json").write_text(
        json.dumps({"format": "treeopt.accuracy/v1", "num_heads": 3, "width": 2, "heads": heads})
    )
    out = tmp_path / "sel.json"
    argv = ["select", "--grid", str(tmp_path / "grid.csv"), "--accuracy", str(tmp_path / "acc.json"), "-o", str(out)]
    main([*argv, "--engine", "trtllm-eagle3-dynamic"])
    return read_selection(out), capsys.readouterr().out


def test_select_stores_the_dynamic_tree_config_for_the_traffic(tmp_path, capsys):
    sel, printed = _select_dynamic(tmp_path, capsys)
    s = sel.schedule
    # sizes as SGLang's triples: 1 (1, 1, 2), 2 (2, 1, 3), 3 (2, 2, 4); means over the 3 cells:
    # 1.1, 1.1667, 1.2; plain 1. So 3 nodes: 2 layers of topK 2, 3 tokens (2 <= 3 <= 4)
    assert s["triple"] == [2, 2, 4] and s["mean_speedup"] == pytest.approx(1.2, abs=1e-4)
    assert s["config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 2,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 2,
        "max_total_draft_tokens": 3,
        "speculative_model_dir": "<EAGLE-3 draft>",
        "eagle3_one_model": True,
    }
    assert trtllm_refusal(s["config"]) is None and s["line"] == f"speculative_config = {json.dumps(s['config'])}"
    # per batch: 1 -> 3 nodes (1.6), 4 -> 2 nodes, the chain of 2 (1.4), 32 -> plain
    assert [(a, b, t) for a, b, t, _ in s["per_range"]] == [(1, 1, [2, 2, 4]), (4, 4, [2, 1, 3]), (32, 32, [0, 0, 0])]
    assert _config(s["per_range"][1][3])["max_draft_len"] == 2 and "use_dynamic_tree" not in s["per_range"][1][3]
    # what the triple is predicted from, and what checks it against the draft's own scores
    assert "treeopt sglang-tau" in s["source"] and "treeopt sglang-tau" in printed
    assert s["line"] in printed and "TensorRT-LLM (trtllm-eagle3-dynamic)" in printed


def test_the_answer_section_names_tensorrt_llm(tmp_path, capsys):
    sel, _ = _select_dynamic(tmp_path, capsys)
    text = "\n".join(answer_section(sel, None, heads=3))
    assert "One TensorRT-LLM (dynamic tree) server" in text and "treeopt sglang-tau" in text


def test_check_without_the_accuracy_table_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tree.json").write_text("[[0], [1], [0, 0]]")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exc:
        main(["check", "tree.json", "--engine", "trtllm-eagle3-dynamic"])
    err = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert err[0].startswith("treeopt: error: --engine trtllm-eagle3-dynamic: needs --accuracy")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
