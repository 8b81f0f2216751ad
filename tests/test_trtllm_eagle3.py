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

import pytest

from treeopt.engine_data import engine_for_drafter, get_engine
from treeopt.engines import export_for
from treeopt.errors import UserError
from treeopt.schedules import selection_schedule
from treeopt.tree import make_tree
from treeopt.trtllm_eagle import trtllm_dynamic_tree_config

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
