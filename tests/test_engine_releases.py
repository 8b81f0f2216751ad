"""Engines as versioned data (treeopt/engine_data.py, docs/engines.md#releases): the newest
release by default, older ones asked for by `name@version`, and a form a release does not take
refused in one line that names the release and what it takes instead.

Expected behaviour from the engines' own code: vLLM 0.33.0's SpeculativeConfig (its `method`
Literal has no "medusa" or "mlp_speculator", and `extra="forbid"` refuses
`speculative_token_tree`); vLLM PR #42121 removed tree attention in 0.21; TensorRT-LLM's
DraftTargetDecodingConfig drafts a linear chain (tensorrt_llm/llmapi/llm_args.py).
"""

from __future__ import annotations

import json
import shlex

import pytest

from treeopt.engine_data import ENGINES, RETIRED, engine_for_drafter, get_engine
from treeopt.engines import check, export_for
from treeopt.errors import UserError
from treeopt.tree import make_tree
from treeopt.tree_api import build_tree, serving_engine

DEMO = "reports/demo-cpu/accuracy.json"
# what vLLM 0.33.0's SpeculativeConfig takes (vllm/config/speculative.py): a few of its fields
VLLM_033_KEYS = {"method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
VLLM_033_METHODS = {"ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "mtp", "dflash"}


def _vllm_config(line):
    flag, value = shlex.split(line)
    assert flag == "--speculative-config"
    return json.loads(value)


def test_bare_vllm_is_the_newest_release_and_drafts_a_chain():
    engine = get_engine("vllm")
    assert get_engine("vllm@0.33") == engine
    tree = make_tree([[0], [1], [0, 0]])
    drafted = check(tree, engine, heads=4)
    assert not drafted.as_written and set(drafted.drafted.paths) == {(0,), (0, 0), (0, 0, 0)}
    assert check(make_tree([[0], [0, 0]]), engine, heads=4).as_written


def test_every_newest_vllm_export_is_a_config_vllm_033_takes():
    for name in ("vllm", "vllm-draft-model"):
        engine = get_engine(name)
        config = _vllm_config(export_for(engine, make_tree([[0], [0, 0], [0, 0, 0]])).line)
        assert set(config) <= VLLM_033_KEYS and config["method"] in VLLM_033_METHODS, name
        assert config["num_speculative_tokens"] == 3


def test_vllm_020_keeps_the_tree_and_says_what_that_release_does():
    engine = get_engine("vllm@0.20")
    out = export_for(engine, make_tree([[0], [1], [0, 0], [1, 0]]))
    assert "speculative_token_tree" in _vllm_config(out.line)
    note = out.text.splitlines()[1]
    assert note.startswith("# ") and "TREE_ATTN" in note and "as a chain" in note


def test_retired_vllm_paths_are_refused_in_one_line_naming_the_release():
    for name in ("vllm-medusa", "vllm-mlp-speculator"):
        with pytest.raises(UserError) as err:
            get_engine(name)
        msg = str(err.value)
        assert "\n" not in msg and "0.33" in msg and "@" in msg, msg
    assert get_engine("vllm-medusa@0.32").method_name == "medusa"
    assert get_engine("vllm-mlp-speculator@0.10").method_name == "mlp_speculator"


def test_medusa_heads_with_newest_vllm_are_one_line_saying_which_releases_served_them():
    target, why = engine_for_drafter("vllm", "medusa")
    assert target is None and "\n" not in why
    assert "<= 0.32" in why and "top-1 chain" in why and "vllm-medusa@0.32" in why
    assert engine_for_drafter("vllm@0.20", "medusa")[0] == "vllm-medusa@0.32"
    assert engine_for_drafter("vllm-medusa@0.32", "medusa") == ("vllm-medusa@0.32", None)


def test_a_draft_model_never_gets_a_medusa_config():
    target, why = engine_for_drafter("trtllm", "draft-model")
    assert target == "trtllm-draft-model" and "Draft_Target" in why
    out = export_for(get_engine(target), make_tree([[0], [0, 0]]))
    config = json.loads(out.line.split("=", 1)[1])
    assert config["decoding_type"] == "Draft_Target" and config["max_draft_len"] == 2
    assert "medusa" not in out.text.lower()
    assert engine_for_drafter("medusa", "draft-model")[0] is None


def test_build_for_a_medusa_table_with_newest_vllm_is_one_line():
    # the demo table names Medusa heads: the newest vLLM has no medusa method
    with pytest.raises(UserError, match="vllm-medusa@0.32"):
        build_tree(DEMO, 4, engine="vllm")
    with pytest.raises(UserError, match="vllm-medusa@0.32"):
        serving_engine("vllm", __import__("treeopt").accuracy.load_accuracy(DEMO))
    chain = build_tree(DEMO, 3, engine="vllm-medusa@0.32")
    assert sorted(chain.paths) == [(0,), (0, 0), (0, 0, 0)]


def test_every_entry_cites_its_release_and_source():
    for name, engine in ENGINES.items():
        if name == "treeopt":
            continue
        assert engine.release and engine.source, name
    assert set(RETIRED) == {"vllm-medusa", "vllm-mlp-speculator"}
