"""The published speculative steps (roofline/published_steps.py,
docs/performance-model.md#published-speculative-steps): the data file holds the papers' numbers
as printed, and the loader derives step rows from them as its docstrings say.

Every expected number here is typed from the paper (as transcribed) or worked out by hand, never
computed by the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from roofline.hardware import builtin_hardware
from roofline.published_steps import DATA_FILE, published_tables, step_points
from roofline.shapes import builtin_shapes


@pytest.fixture(scope="module")
def raw():
    return {t["id"]: t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"]}


@pytest.fixture(scope="module")
def tables():
    return {t.id: t for t in published_tables()}


def test_ibm_table1_values_as_printed(raw):
    ibm = raw["ibm-table1"]
    assert ibm["citation"]["arxiv"] == "2404.19124"
    assert ibm["candidates"] == [0, 1, 2, 4, 8, 16, 32]
    assert ibm["stages"] == 3
    p64, p2048 = ibm["prompts"]["64"], ibm["prompts"]["2048"]
    assert p64["ms_per_token"]["1"][0] == 10.54  # batch 1, 0 candidates
    assert p64["ms_per_token"]["1"][3] == 5.5  # batch 1, 4 candidates
    assert p64["tokens_per_step"][3] == 2.67  # 4 candidates
    assert p64["ms_per_token"]["2"][5] == 7.62  # batch 2, 16 candidates
    assert p64["ms_per_token"]["4"][6] == 18.31  # batch 4, 32 candidates
    assert p2048["ms_per_token"]["4"][0] == 19.62
    assert p2048["ms_per_token"]["4"][6] == 44.88
    assert p2048["ms_per_token"]["1"][2] == 8.89
    assert p2048["tokens_per_step"] == [1.0, 2.01, 2.21, 2.42, 2.61, 2.74, 2.83]


def test_medusa_values_as_printed(raw):
    t1, f = raw["medusa-table1"], raw["medusa-appF"]
    assert t1["citation"]["arxiv"] == f["citation"]["arxiv"] == "2401.10774"
    t1_rows = {r["model"]: r for r in t1["rows"]}
    assert (t1_rows["Vicuna-7B"]["overhead"], t1_rows["Vicuna-7B"]["acc_rate"]) == (1.22, 3.47)
    assert t1_rows["Zephyr-7B"]["overhead"] == 1.18
    assert t1_rows["Vicuna-13B"]["overhead"] == 1.23
    assert (t1_rows["Vicuna-33B"]["overhead"], t1_rows["Vicuna-33B"]["speedup"]) == (1.27, 2.35)
    f_rows = {r["model"]: r for r in f["rows"]}
    assert (f_rows["Vicuna-7B"]["base_tok_s"], f_rows["Vicuna-7B"]["medusa_tok_s"]) == (37.07, 106.76)
    assert f_rows["Vicuna-7B"]["acc_rate"] == 3.23
    assert (f_rows["Vicuna-33B"]["base_tok_s"], f_rows["Vicuna-33B"]["medusa_tok_s"]) == (17.87, 40.43)
    assert f_rows["Zephyr-7B"]["acc_rate"] == 3.08
    assert t1["setup"]["tree_tokens"] == f["setup"]["tree_tokens"] == 64


def test_hydra_values_as_printed(raw):
    d, s = raw["hydra-appD"], raw["hydra-sec6.2"]
    assert d["citation"]["arxiv"] == s["citation"]["arxiv"] == "2402.05109"
    assert d["base_decode_step_ms"] == 28
    assert d["draft_ms"]["Medusa"]["head1"] == 0.3
    assert d["draft_ms"]["Hydra++"]["prefix_attention"] == 1.2
    assert d["draft_ms"]["Hydra++"]["head2"] == 1.4
    assert s["speedup"] == {"1": 2.7, "8": 1.63}


def test_every_table_says_where_it_comes_from_and_how_sure_it_is(raw):
    for table in raw.values():
        assert set(table["citation"]) == {"paper", "arxiv", "where"}, table["id"]
        assert table["units"] and table["uncertainty"], table["id"]
        assert table["setup"]["hardware"] in builtin_hardware(), table["id"]
    missing = json.loads(DATA_FILE.read_text(encoding="utf-8"))["missing"]
    assert "Table 2" in missing and "Codellama" in missing


def _row(steps, group, tokens):
    rows = steps[(steps["group"] == group) & (steps["tokens"] == tokens)]
    assert len(rows) == 1
    return rows.iloc[0]


def test_ibm_step_rows_by_hand(tables):
    steps = tables["ibm-table1"].steps
    assert len(steps) == 2 * 3 * 7  # two prompts, three batch sizes, seven candidate counts
    # batch 1, prompt 64, 4 candidates of 3 + 1 tokens: 5.5 ms/token x 2.67 tokens/step
    row = _row(steps, "batch 1, prompt 64", 16)
    assert (row["batch"], row["context"], row["candidates"], row["draft_stages"]) == (1, 64, 4, 3)
    assert row["step_ms"] == pytest.approx(14.685, rel=1e-9)
    assert row["ratio"] == pytest.approx(14.685 / 10.54, rel=1e-9)
    # batch 4, prompt 2048, 32 candidates: 44.88 x 2.83 = 127.0104 ms, 128 tokens
    row = _row(steps, "batch 4, prompt 2048", 128)
    assert (row["batch"], row["context"], row["candidates"]) == (4, 2048, 32)
    assert row["step_ms"] == pytest.approx(127.0104, rel=1e-9)
    assert row["ratio"] == pytest.approx(127.0104 / 19.62, rel=1e-9)
    # plain decoding: one token, no drafting, one token per step
    row = _row(steps, "batch 2, prompt 64", 1)
    assert (row["candidates"], row["draft_stages"], row["step_ms"], row["ratio"]) == (1, 0, 10.66, 1.0)


def test_medusa_step_rows_by_hand(tables):
    f = tables["medusa-appF"].steps
    assert len(f) == 8 and len(tables["medusa-table1"].steps) == 8
    plain, tree = _row(f, "Vicuna-7B", 1), _row(f, "Vicuna-7B", 64)
    assert plain["step_ms"] == pytest.approx(26.976, rel=1e-4)  # 1000 / 37.07
    assert tree["step_ms"] == pytest.approx(30.2548, rel=1e-4)  # 1000 x 3.23 / 106.76
    assert (tree["batch"], tree["draft_heads"], tree["tokens_per_step"]) == (1, 4, 3.23)
    t1 = tables["medusa-table1"].steps
    assert _row(t1, "Vicuna-13B", 64)["ratio"] == 1.23
    assert np.isnan(_row(t1, "Vicuna-13B", 64)["step_ms"])


def test_hydra_tables_give_no_step_rows_and_say_why(tables):
    for name in ("hydra-appD", "hydra-sec6.2"):
        assert tables[name].steps.empty and "no step ratio" in tables[name].note


def test_every_shape_used_is_built_in(tables):
    shapes = set()
    for table in tables.values():
        shapes |= set(table.steps["shape"])
    assert shapes == {
        "llama-2-7b",
        "llama-2-13b",
        "llama-33b",
        "mistral-7b",
        "llama-3-8b",
        "qwen3-30b-a3b",
        "llama-3-70b",
        "llama-4-maverick",
        "llama-4-scout",
        "deepseek-v3",
    }
    assert shapes <= set(builtin_shapes())


def test_a_row_of_an_unknown_shape_is_skipped_not_invented(tmp_path, raw):
    table = json.loads(json.dumps(raw["medusa-table1"]))
    table["rows"][0]["shape"] = "codellama-13b"
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"tables": [table]}), encoding="utf-8")
    (loaded,) = published_tables(path)
    assert len(loaded.steps) == 6
    assert "Vicuna-7B" not in set(loaded.steps["group"])
    assert loaded.skipped == ("Vicuna-7B: shape 'codellama-13b' is not built in",)


def test_step_points_carry_the_rows(tables):
    steps = tables["ibm-table1"].steps
    points = step_points(steps)
    assert len(points) == 42
    assert points.tokens[3] == 16 and points.candidates[3] == 4
    assert points.step_s[3] == pytest.approx(0.014685, rel=1e-9)


def test_specdecode_bench_rows_are_its_cost_model_by_hand(tables):
    # Liu et al. 2026 (arXiv 2601.11580), SpecDecode-Bench/simulator predictor.py Llama8BH100 at batch 8,
    # 2048 tokens per request (KV 16384), k = 3: plain 39.26 ns x 16384 + 21.01 us x 8 + 5.886 ms + 1.207 ms
    rows = tables["specdecode-bench"].steps
    cell = rows[(rows["batch"] == 8) & (rows["context"] == 2048)].sort_values("tokens")
    plain = 3.92645679e-08 * 16384 + 2.10103129e-05 * 8 + 5.88590713e-03 + 1.20683946e-03
    spec = 3.92645679e-08 * 16384 + 2.10103129e-05 * 32 + 5.88590713e-03 + 1.20683946e-03
    spec += 2.37768493e-09 * 16384 + 8.41429603e-07 * 4 + 2.13526175e-03
    assert list(cell["tokens"]) == [1, 4] and list(cell["draft_stages"]) == [0, 3]
    assert cell["step_ms"].tolist() == pytest.approx([1e3 * plain, 1e3 * spec], rel=1e-12)
    assert cell["ratio"].iloc[1] == pytest.approx(spec / plain, rel=1e-12)
    assert len(rows) == 2 * 8 * 2  # plain and speculative, 8 batches, 2 contexts


def test_engine_config_rows_by_hand(tables):
    # vLLM PR #22752, batch 8: the tree's 8 sequences each yield 2.37 tokens a step at 902.72 tok/s
    # in all: a step of 1000 x 8 x 2.37 / 902.72 = 21.0032 ms; no plain run, so no ratio
    pr = tables["vllm-pr-22752"].steps
    tree = pr[(pr["group"] == "batch 8") & (pr["config"] == "tree")].iloc[0]
    assert (tree["tokens"], tree["draft_stages"], tree["tokens_per_step"]) == (9, 2, 2.37)
    assert tree["step_ms"] == pytest.approx(21.0032, rel=1e-5)
    assert np.isnan(tree["ratio"]) and len(pr) == 6
    # SpecForge issue #339, batch 1: the 3-1-4 chain's step 1000 x 1.86 / 159.78 = 11.6410 ms over the
    # plain step 1000 / 222.47 = 4.49499 ms (2.58977); batch 4 ran two configurations only (10 rows in all)
    issue = tables["specforge-issue-339"].steps
    chain = issue[(issue["group"] == "batch 1") & (issue["config"] == "chain 3-1-4")].iloc[0]
    assert (chain["tokens"], chain["draft_stages"]) == (4, 3)
    assert chain["step_ms"] == pytest.approx(11.6410, rel=1e-5)
    assert chain["ratio"] == pytest.approx(2.58977, rel=1e-5)
    assert len(issue) == 10 and set(issue[issue["batch"] == 4]["config"]) == {"plain", "chain 3-1-4", "tree 3-3-8"}
    # TensorRT-LLM PR #5146: acceptance 1.83 at 1.26x: T(chain)/T(plain) = 1.452381, no step time printed
    trt = tables["trtllm-pr-5146"].steps.set_index("config")
    assert trt.loc["chain", "ratio"] == pytest.approx(1.452381, rel=1e-6)
    assert trt.loc["plain", "ratio"] == 1.0 and np.isnan(trt.loc["chain", "step_ms"])


def test_engine_config_rows_per_prompt_length_by_hand(tables):
    # SPEED-Bench Table 10 (arXiv 2604.09557): one batch (16) at ISLs 1k, 2k, 8k, high and low entropy
    # prompts each: a group per column with its own context; ISL 8k, low entropy: AL 1.19 at 0.87x, so
    # T(chain)/T(plain) = 1.19 / 0.87 = 1.367816; ISL 1k, high entropy: 2.12 / 1.63 = 1.300613
    steps = tables["speed-bench-table10"].steps
    assert len(steps) == 12 and set(steps["batch"]) == {16}
    chains = steps[steps["config"] == "chain"].set_index("group")
    assert chains["context"].tolist() == [1024, 1024, 2048, 2048, 8192, 8192]
    assert chains.loc["ISL 8k, low entropy", "ratio"] == pytest.approx(1.367816, rel=1e-6)
    assert chains.loc["ISL 1k, high entropy", "ratio"] == pytest.approx(1.300613, rel=1e-6)
    assert chains.loc["ISL 2k, low entropy", "tokens_per_step"] == 2.59
    plains = steps[steps["config"] == "plain"]
    assert plains["group"].nunique() == 6 and (plains["ratio"] == 1.0).all()
