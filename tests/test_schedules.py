"""Per-batch schedules in the engines' forms (treeopt/schedules.py, docs/engines.md#schedules).

Every expected schedule below is derived by hand from the rule in docs/engines.md#batch-ranges
and the engines' documented semantics: vLLM's inclusive [start, end, K] ranges that start at 1
and carry the last K forward (vllm/v1/spec_decode/dynamic/utils.py), TensorRT-LLM's "keys are the
largest batch size of their range, above the largest key nothing is drafted"
(tensorrt_llm/_torch/speculative/utils.py, get_draft_len_for_batch_size).
"""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from treeopt.errors import UserError
from treeopt.schedules import (
    BatchChoice,
    batch_ranges,
    choices_for_mix,
    sglang_plan,
    trtllm_schedule_config,
    vllm_schedule_config,
    vllm_schedule_line,
)


def _choices(pairs):
    return [BatchChoice(b, k) for b, k in pairs]


def _vllm_k(table, num_speculative_tokens, batch_size, max_num_seqs):
    """vLLM's documented lookup: a batch size in a range takes its K; between ranges and after
    the last one the previous K is carried forward; K is capped at num_speculative_tokens."""
    k = None
    for start, end, kk in sorted(table):
        if start <= batch_size <= end:
            return min(kk, num_speculative_tokens)
        if start <= batch_size:
            k = kk
    assert batch_size <= max_num_seqs
    return min(k, num_speculative_tokens)


def _trtllm_k(config, batch_size):
    """TensorRT-LLM's documented lookup: the first key >= batch size gives the draft length,
    none (0) above the largest key; max_concurrency N means {N: max_draft_len}."""
    schedule = config.get("draft_len_schedule") or {config["max_concurrency"]: config["max_draft_len"]}
    keys = sorted(schedule)
    i = bisect.bisect_left(keys, batch_size)
    return schedule[keys[i]] if i < len(keys) else 0


def test_ranges_between_measured_sizes_take_the_smaller_neighbour():
    # measured 1:4, 4:3, 16:1 -> 1:4, gap 2-3: min(4,3)=3, 4:3, gap 5-15: min(3,1)=1, 16:1
    got = batch_ranges(_choices([(1, 4), (4, 3), (16, 1)]))
    assert got == [(1, 1, 4), (2, 4, 3), (5, 16, 1)]


def test_ranges_extend_down_to_one_and_stop_at_the_data():
    # smallest measured 4 (K 2) covers 1..4; nothing beyond 8 without a max batch size
    assert batch_ranges(_choices([(8, 1), (4, 2)])) == [(1, 4, 2), (5, 8, 1)]
    # with a larger max batch size, the sizes past the data draft nothing
    assert batch_ranges(_choices([(4, 2), (8, 1)]), max_batch_size=64) == [(1, 4, 2), (5, 8, 1), (9, 64, 0)]
    # a smaller max cuts the table
    assert batch_ranges(_choices([(4, 2), (8, 1)]), max_batch_size=6) == [(1, 4, 2), (5, 6, 1)]


def test_a_longer_draft_at_the_larger_size_is_not_claimed_in_the_gap():
    # non-monotone data (2 at batch 2, 3 at batch 8): the gap 3..7 gets min = 2, merged with 1..2
    assert batch_ranges(_choices([(2, 2), (8, 3)])) == [(1, 7, 2), (8, 8, 3)]


def test_bad_choices_are_refused_in_one_line():
    with pytest.raises(UserError, match="two draft lengths"):
        batch_ranges(_choices([(4, 2), (4, 3)]))
    with pytest.raises(UserError, match="below 1"):
        batch_ranges(_choices([(0, 2)]))
    with pytest.raises(UserError, match="negative"):
        batch_ranges(_choices([(1, -1)]))
    with pytest.raises(UserError, match="no batch sizes"):
        batch_ranges([])


def test_vllm_config_holds_the_table_and_ends_speculation_past_the_data():
    config = vllm_schedule_config(_choices([(1, 4), (4, 3), (16, 1)]), "draft_model", "my/draft")
    assert config == {
        "method": "draft_model",
        "model": "my/draft",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 4, 3], [5, 16, 1], [17, 17, 0]],
    }
    table = config["num_speculative_tokens_per_batch_size"]
    # what vLLM then drafts at each batch size up to a server of 64 sequences
    want = {1: 4, 2: 3, 3: 3, 4: 3, 5: 1, 16: 1, 17: 0, 64: 0}
    assert {b: _vllm_k(table, 4, b, 64) for b in want} == want
    line = vllm_schedule_line(config)
    assert line.startswith("--speculative-config '{") and '"num_speculative_tokens_per_batch_size"' in line


def test_vllm_config_with_speculation_off_everywhere_is_none():
    assert vllm_schedule_config(_choices([(1, 0), (8, 0)]), "eagle3") is None
    assert "without --speculative-config" in vllm_schedule_line(None)


def test_vllm_table_ending_in_zero_needs_no_extra_range():
    config = vllm_schedule_config(_choices([(1, 3), (8, 0)]), "eagle3", max_batch_size=32)
    # 1:3, gap 2..7 min(3,0)=0, 8:0, past data 0 -> merged
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 32, 0]]


def test_trtllm_schedule_keys_are_range_ends():
    config = trtllm_schedule_config(_choices([(1, 4), (4, 3), (16, 1)]))
    assert config == {"decoding_type": "Eagle", "max_draft_len": 4, "draft_len_schedule": {1: 4, 4: 3, 16: 1}}
    want = {1: 4, 2: 3, 4: 3, 5: 1, 16: 1, 17: 0, 100: 0}
    assert {b: _trtllm_k(config, b) for b in want} == want


def test_trtllm_cut_off_only_is_max_concurrency():
    # 4 tokens up to batch 8, none above: one key, written as max_concurrency (not both)
    config = trtllm_schedule_config(_choices([(1, 4), (8, 4), (16, 0)]))
    assert config == {"decoding_type": "Eagle", "max_draft_len": 4, "max_concurrency": 8}
    assert "draft_len_schedule" not in config


def test_trtllm_later_longer_draft_is_cut_to_max_draft_len():
    # the smallest key must draft max_draft_len and nothing later may exceed it
    config = trtllm_schedule_config(_choices([(1, 2), (8, 3)]))
    # ranges 1..7 at 2, 8 at min(3, 2) = 2: one value up to batch 8, so a plain cut-off
    assert config == {"decoding_type": "Eagle", "max_draft_len": 2, "max_concurrency": 8}
    assert {b: _trtllm_k(config, b) for b in (1, 8, 9)} == {1: 2, 8: 2, 9: 0}


def test_trtllm_refuses_a_schedule_whose_smallest_batch_drafts_nothing():
    with pytest.raises(UserError, match="smallest key"):
        trtllm_schedule_config(_choices([(1, 0), (8, 2)]))
    assert trtllm_schedule_config(_choices([(1, 0)])) is None


def test_mix_without_speedups_takes_the_shortest_draft_of_the_contexts():
    got = choices_for_mix([1, 1, 8, 8], [512, 4096, 512, 4096], [4, 2, 1, 3])
    assert got == [BatchChoice(1, 2), BatchChoice(8, 1)]


def test_mix_with_speedups_weights_the_contexts():
    # batch 4, contexts 512 (weight 3) and 4096 (weight 1); K=2: (3*1.5+1*1.1)/4 = 1.40,
    # K=4: (3*1.6+1*0.9)/4 = 1.425 -> K=4; with equal weights K=2 (1.30 vs 1.25)
    batch = [4, 4, 4, 4]
    ctx = [512, 4096, 512, 4096]
    k = [2, 2, 4, 4]
    s = [1.5, 1.1, 1.6, 0.9]
    assert choices_for_mix(batch, ctx, k, speedup=s, weight=[3, 1, 3, 1]) == [BatchChoice(4, 4)]
    assert choices_for_mix(batch, ctx, k, speedup=s) == [BatchChoice(4, 2)]


def test_mix_skips_a_draft_length_missing_at_one_context():
    # K=6 is known only at 512, so it cannot be chosen for a mix that also runs 4096
    got = choices_for_mix([2, 2, 2], [512, 4096, 512], [1, 1, 6], speedup=[1.2, 1.1, 9.0])
    assert got == [BatchChoice(2, 1)]


def test_sglang_plan_best_for_the_mix_and_per_batch():
    a, b = (3, 1, 4), (5, 4, 16)
    speedups = {
        (1, 512): {a: 1.8, b: 2.4},
        (8, 512): {a: 1.5, b: 1.3},
        (32, 512): {a: 1.1, b: 0.7},
    }
    # equal weights: a = (1.8+1.5+1.1)/3 = 1.4667, b = (2.4+1.3+0.7)/3 = 1.4667 -> tie, smaller (a)
    plan = sglang_plan(speedups, {cell: 1.0 for cell in speedups})
    assert plan.triple == a and plan.mean_speedup == pytest.approx(4.4 / 3)
    assert plan.per_range == ((1, 1, b), (8, 32, a))
    # mostly batch 1: b = (4*2.4+1.3+0.7)/6 = 1.933 > a = (4*1.8+1.5+1.1)/6 = 1.633
    heavy = sglang_plan(speedups, {(1, 512): 4.0, (8, 512): 1.0, (32, 512): 1.0})
    assert heavy.triple == b and heavy.mean_speedup == pytest.approx(11.6 / 6)


def test_sglang_plan_refuses_a_mix_cell_without_speedups():
    with pytest.raises(UserError, match="batch 64, context 512"):
        sglang_plan({(1, 512): {(3, 1, 4): 1.5}}, {(1, 512): 1.0, (64, 512): 1.0})


def test_a_selection_of_chains_gives_each_engine_its_table():
    from treeopt.engine_data import get_engine
    from treeopt.schedules import format_schedule, selection_schedule

    # cells: batch 1 chose 3 at context 128 and 2 at 512 -> 2; batch 4: 1 and 1 -> 1; batch 16: 0
    cells = [
        {"batch": b, "context": c, "nodes": n}
        for b, c, n in ((1, 128, 3), (1, 512, 2), (4, 128, 1), (4, 512, 1), (16, 128, 0), (16, 512, 0))
    ]
    vllm = selection_schedule(cells, get_engine("vllm-draft-model"))
    # ranges by hand: 1:2, gap 2-3 min(2,1)=1, 4:1, gap 5-15 min(1,0)=0, 16:0
    assert vllm["ranges"] == [[1, 1, 2], [2, 4, 1], [5, 16, 0]]
    assert vllm["config"] == {
        "method": "draft_model",
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 4, 1], [5, 16, 0]],
    }
    trt = selection_schedule(cells, get_engine("trtllm-draft-model"))
    assert trt["config"] == {
        "decoding_type": "Draft_Target",
        "max_draft_len": 2,
        "draft_len_schedule": {1: 2, 4: 1},
        "speculative_model": "<draft model>",
    }
    assert "1-1: 2, 2-4: 1, 5-16: 0" in format_schedule(vllm)
    # with the draft's directory known, both configs name it (vLLM's draft_model loads "model";
    # TensorRT-LLM's Draft_Target refuses a config without speculative_model)
    named = selection_schedule(cells, get_engine("vllm-draft-model"), draft_model="/models/llama-68m")
    assert named["config"]["model"] == "/models/llama-68m"
    named = selection_schedule(cells, get_engine("trtllm-draft-model"), draft_model="/models/llama-68m")
    assert named["config"]["speculative_model"] == "/models/llama-68m"
    medusa = selection_schedule(cells, get_engine("trtllm"))
    assert "config" not in medusa and "legacy TensorRT backend" in medusa["note"]


def test_a_draft_model_table_names_its_draft_directory():
    from treeopt.accuracy import AccuracyTable
    from treeopt.engines import draft_model_dir

    def table(heads):
        return AccuracyTable(np.full((2, 1), 0.5), np.array([10, 10]), provenance={"heads": heads})

    assert draft_model_dir(table("draft-model:/models/llama-68m")) == "/models/llama-68m"
    assert draft_model_dir(table("draft-model:demo")) is None  # the bundled demo draft: no engine serves it
    assert draft_model_dir(table("hydra:/x")) is None
