"""Derive roofline/data/engine_presets.json from the published speculative steps the project holds
(docs/performance-model.md#engine-presets). Run:

    python tools/fit_engine_presets.py            # print the JSON
    python tools/fit_engine_presets.py --write    # write roofline/data/engine_presets.json

Deterministic (a bounded least-squares fit, no random draws), so the data file is regenerated,
never typed by hand; tests/test_engine_presets.py checks that the file equals this script's output.

Per engine family with a published speculative step (roofline.published_steps):

- ibm-tgis (IBM's candidates engine, Wertheimer et al. 2024, Table 1): forward_overhead_s,
  spec_step_overhead_s and verified_token_s fitted on the prompt-64 rows (batches 1, 2 and 4) on
  the built-in a100-80gb-sxm; the prompt-2048 rows are held out (judged by
  benchmarks/bench_published_steps.py). Uncertainty: the range over the refits that leave one batch
  size out.
- hf-eager (the Medusa authors' reference code over Hugging Face eager PyTorch, Cai et al. 2024):
  layer_overhead_s and spec_step_overhead_s fitted on Appendix F's steps of the 7B and 13B models
  (Vicuna-7B, Zephyr-7B, Vicuna-13B) on the built-in a100-80gb-pcie; Vicuna-33B and the whole of
  Table 1 are held out. Uncertainty: the range over the refits that leave one model out and the
  refit whose tree steps come from Table 1's overheads instead of Appendix F's.

- vllm (SpecDecode-Bench's cost model of measured vLLM 0.10.1 steps, Liu et al. 2026,
  predictor.py Llama8BH100): forward_overhead_s, verified_token_s and draft_stage_s (EAGLE, per
  drafted depth) fitted at the authors' fitting batches 1, 8, 16, 32, 64 on the built-in h100-sxm;
  batches 2, 4 and 128 held out. Uncertainty: refits leaving one batch out. Per drafter kind
  (`drafting`): EAGLE's cost per depth, carried with wider ranges to EAGLE-3 and MTP; 0 for the
  drafters the roofline prices as operators or as a draft model, and for n-gram (vLLM's numba
  proposer: 0.59% of the forward in SpecDecode-Bench's model).

trtllm and sglang publish no speculative steps the project could fit on: they carry the vllm preset's
terms with each range widened 2x each way (`carried_from`). What was found is held out and judged
in benchmarks/bench_published_steps.py: TensorRT-LLM PR #5146's one EAGLE-3 chain beside plain
decoding; for SGLang, EAGLE-3's Table 3, SpecForge issue #339's chains and trees, SGLang PR #4716's
tree, PR #5318's chain and tree, AngelSlim issue #163's trees and SpecForge's SpecBundle
dashboard's chains and trees of equal counts. SGLang's first term of its own is tree_verify_layer_s,
the cost per target layer of verifying a topk > 1 tree beyond a chain of equal verified tokens and
draft forwards: the mean per layer of the SpecBundle dashboard's tree-minus-chain step differences
(`sglang_tree_verify`; those two tables are fitted, no longer held out), range their smallest and
largest; vllm and trtllm publish no such pair and carry it with the range widened 2x each way. The same
dashboard's chains 3-1-4, 5-1-6 and 7-1-8 of the 8B on one GPU fit SGLang's EAGLE-3 drafting
(`sglang_drafting`): a line through each chain's step over plain decoding's (less the forward's
predicted growth) against its depth, its slope draft_stage_s per drafted depth (EAGLE-3, EAGLE and,
widened, MTP), its intercept spec_step_overhead_s per step; the 70B chains (TP 4) only bound the
cost per depth from above. One term is
TensorRT-LLM's own: its CPU n-gram drafter's host gap per speculative step (`trtllm_ngram`, from
TensorRT-LLM PR #19437's traces), where vLLM's numba proposer costs about nothing.

numpy, pandas and scipy only, like roofline/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roofline.hardware import load_hardware  # noqa: E402
from roofline.latency import step_time_s  # noqa: E402
from roofline.profile_fit import predict_step_s  # noqa: E402
from roofline.published_steps import published_tables, step_points  # noqa: E402
from roofline.shapes import draft_heads_shape, model_shape  # noqa: E402
from roofline.step_shape import StepShape  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "roofline" / "data" / "engine_presets.json"
FORMAT = "treeopt.engine_presets/v1"
SIGNIFICANT = 4  # digits kept in the file
SOFT_L1_SCALE = 0.05  # relative errors above ~5% count linearly (as roofline.profile_fit)
UPPER_S = 0.1  # every fitted time term is bounded to [0, 100 ms]

MEDUSA = "Cai et al. 2024 (Medusa), arXiv 2401.10774"
IBM = "Wertheimer et al. 2024 (IBM speculators), arXiv 2404.19124"


def heads_of(rows: pd.DataFrame, shape):
    k = int(rows["draft_heads"].max())
    return draft_heads_shape(shape, k) if k > 0 else None


def predict_ms(rows: pd.DataFrame, hw) -> np.ndarray:
    """Predicted step_ms of rows (one or more shapes) on profile hw."""
    out = np.empty(len(rows))
    for name in rows["shape"].unique():
        part = (rows["shape"] == name).to_numpy()
        shape = model_shape(name)
        out[part] = 1e3 * predict_step_s(shape, heads_of(rows[part], shape), hw, step_points(rows[part]))
    return out


def residuals_of(rows: pd.DataFrame, hw) -> np.ndarray:
    """Relative errors: of step_ms where the row has one, else of the ratio T(n)/T(0) in its group."""
    pred = predict_ms(rows, hw)
    plain = pd.Series(pred[(rows["tokens"] == 1).to_numpy()], index=rows.loc[rows["tokens"] == 1, "group"])
    ratio = pred / rows["group"].map(plain).to_numpy()
    timed = np.isfinite(rows["step_ms"].to_numpy(dtype=float))
    rel = np.where(timed, pred / rows["step_ms"].to_numpy(dtype=float), ratio / rows["ratio"].to_numpy()) - 1.0
    keep = timed | (rows["tokens"] > 1).to_numpy()  # a ratio-only plain row is 1/1 by definition
    return rel[keep]


#: the weight of a fit's pull towards zero terms: a 1 ms term costs as much as a 0.1% relative
#: error on one row, which decides only what the rows leave undetermined
TIE_BREAK_WEIGHT = 1e-3


def fit_terms(rows: pd.DataFrame, base, terms: tuple[str, ...]) -> dict:
    """Bounded least squares (soft_l1) of `terms` (HardwareProfile time fields, seconds) of base on rows.

    Leaving a model out can leave two terms that trade against each other (with only 32-layer
    models left, a cost per forward and 32 times a cost per layer are one number). The answer
    would then depend on where the solver starts and stops, and so on the scipy build; a weak
    pull towards zero picks, among fits the rows cannot tell apart, the one with the smallest
    terms (the minimum-norm solution), and the solver runs to convergence."""
    scale = np.full(len(terms), 1e-3)

    def res(x):
        r = residuals_of(rows, base.with_(**dict(zip(terms, (float(v) for v in x), strict=True))))
        return np.concatenate([r, TIE_BREAK_WEIGHT * x / scale])

    sol = least_squares(
        res,
        np.full(len(terms), 1e-3),
        bounds=(np.zeros(len(terms)), np.full(len(terms), UPPER_S)),
        loss="soft_l1",
        f_scale=SOFT_L1_SCALE,
        x_scale=scale,
        ftol=1e-14,
        xtol=1e-14,
        gtol=1e-14,
    )
    return {k: float(v) for k, v in zip(terms, sol.x, strict=True)}


def rounded(v: float) -> float:
    """SIGNIFICANT digits; a time under a nanosecond (a bound the fit sits on) is 0."""
    return 0.0 if abs(v) < 1e-9 else float(f"{v:.{SIGNIFICANT}g}")


def term_record(value, alternatives, unit, how) -> dict:
    values = [value, *alternatives]
    return {
        "value": rounded(value),
        "unit": unit,
        "range": [rounded(min(values)), rounded(max(values))],
        "how": how,
    }


def _table(tables, table_id):
    return next(t for t in tables if t.id == table_id)


def ibm_preset(tables) -> dict:
    table = _table(tables, "ibm-table1")
    steps = table.steps
    base = load_hardware(table.hardware)
    short = steps["context"] == steps["context"].min()
    train = steps[short].reset_index(drop=True)
    terms = ("forward_overhead_s", "spec_step_overhead_s", "verified_token_s")
    fit = fit_terms(train, base, terms)
    alternatives = {k: [] for k in terms}
    for b in sorted(train["batch"].unique()):  # leave one batch size out
        sub = fit_terms(train[train["batch"] != b].reset_index(drop=True), base, terms)
        for k in terms:
            alternatives[k].append(sub[k])
    err = np.abs(residuals_of(train, base.with_(**fit)))
    how = "fitted on IBM Table 1, prompt 64, batches 1, 2 and 4 (21 rows); range: refits leaving one batch out"
    return {
        "title": "IBM's TGIS-style candidates engine (torch.compile; batch expansion of c candidates)",
        "measured": True,
        "sources": [
            {
                "paper": IBM,
                "where": "Table 1",
                "read": "ms per generated token for 0-32 candidates at batch 1, 2, 4 and prompts 64 and 2048, and "
                "tokens per step (roofline/data/published_speculative_steps.json, table ibm-table1)",
            }
        ],
        "base_hardware": table.hardware,
        "model": str(train["shape"].iloc[0]),
        "fit_rows": "ibm-table1, prompt 64: batches 1, 2, 4, candidates 0-32 (21 rows, step_ms)",
        "held_out": "ibm-table1, prompt 2048 (21 rows; judged in benchmarks/bench_published_steps.py)",
        "in_sample": {"median_abs": rounded(float(np.median(err))), "worst_abs": rounded(float(err.max()))},
        "terms": {
            "forward_overhead_s": term_record(fit["forward_overhead_s"], alternatives["forward_overhead_s"], "s", how),
            "spec_step_overhead_s": term_record(
                fit["spec_step_overhead_s"], alternatives["spec_step_overhead_s"], "s", how
            ),
            "verified_token_s": term_record(fit["verified_token_s"], alternatives["verified_token_s"], "s", how),
        },
        "not_known": [
            "draft_stage_s: every row runs the same 3 speculator stages, so their cost is inside "
            "spec_step_overhead_s (kept at the ideal 0)",
            "attention_kv_efficiency: the fit sees one prompt length (kept at the ideal streaming rate)",
            "other model sizes and GPUs: one model (Llama-2-7B) on one A100; the terms are seconds, carried "
            "unchanged to other models and GPUs",
        ],
    }


def medusa_rows(tables, table_id: str, models) -> pd.DataFrame:
    steps = _table(tables, table_id).steps
    return steps[steps["group"].isin(models)].reset_index(drop=True)


def hf_eager_preset(tables) -> dict:
    appf = _table(tables, "medusa-appF")
    base = load_hardware(appf.hardware)
    models = ("Vicuna-7B", "Zephyr-7B", "Vicuna-13B")
    train = medusa_rows(tables, "medusa-appF", models)
    # a cost per forward and one per layer are both offered: eager dispatch grows with the kernels, so with
    # the layers, but the published plain steps do not (the fit puts the per-layer cost at 0, see the docs)
    terms = ("forward_overhead_s", "layer_overhead_s", "spec_step_overhead_s")
    fit = fit_terms(train, base, terms)
    alternatives = {k: [] for k in terms}
    for m in models:  # leave one model out
        sub = fit_terms(train[train["group"] != m].reset_index(drop=True), base, terms)
        for k in terms:
            alternatives[k].append(sub[k])
    # the other table: Appendix F's plain steps with Table 1's overheads for the tree steps
    swap = train.copy()
    t1 = _table(tables, "medusa-table1").steps.set_index(["group", "tokens"])["ratio"]
    tree = swap["tokens"] > 1
    swap.loc[tree, "ratio"] = [t1[(g, q)] for g, q in swap.loc[tree, ["group", "tokens"]].itertuples(index=False)]
    plain_ms = swap[~tree].set_index("group")["step_ms"]
    swap.loc[tree, "step_ms"] = swap.loc[tree, "group"].map(plain_ms) * swap.loc[tree, "ratio"]
    sub = fit_terms(swap, base, terms)
    for k in terms:
        alternatives[k].append(sub[k])
    err = np.abs(residuals_of(train, base.with_(**fit)))
    how = (
        "fitted on Medusa App. F, Vicuna-7B, Zephyr-7B and Vicuna-13B (6 steps); range: refits leaving one model "
        "out, and the refit with Table 1's overheads as the tree steps"
    )
    return {
        "title": "Hugging Face eager PyTorch: the Medusa/Hydra authors' reference code "
        "(and treeopt's reference decoder)",
        "measured": True,
        "sources": [
            {
                "paper": MEDUSA,
                "where": "Appendix F",
                "read": "tokens per second with and without Medusa-2 and tokens per step, Vicuna-7B/13B/33B and "
                "Zephyr-7B, batch 1, tree mc_sim_7b_63 (table medusa-appF)",
            },
            {
                "paper": MEDUSA,
                "where": "Table 1",
                "read": "the tree step over the plain step ('overhead') of the same models (table medusa-table1): "
                "held out, and the other table of the uncertainty range",
            },
        ],
        "base_hardware": appf.hardware,
        "model": "llama-2-7b, mistral-7b, llama-2-13b",
        "fit_rows": "medusa-appF: Vicuna-7B, Zephyr-7B, Vicuna-13B (plain and 64-token tree steps, 6 rows)",
        "held_out": "medusa-appF Vicuna-33B and all of medusa-table1 (judged in benchmarks/bench_published_steps.py)",
        "in_sample": {"median_abs": rounded(float(np.median(err))), "worst_abs": rounded(float(err.max()))},
        "terms": {
            "forward_overhead_s": term_record(fit["forward_overhead_s"], alternatives["forward_overhead_s"], "s", how),
            "layer_overhead_s": term_record(
                fit["layer_overhead_s"], alternatives["layer_overhead_s"], "s per layer", how
            ),
            "spec_step_overhead_s": term_record(
                fit["spec_step_overhead_s"], alternatives["spec_step_overhead_s"], "s", how
            ),
        },
        "not_known": [
            "verified_token_s: every step is batch 1 with one tree of 64 tokens, so a cost per token cannot be told "
            "from the fixed cost per step; it is inside spec_step_overhead_s (kept at the ideal 0)",
            "draft_stage_s: Medusa drafts every depth in one pass (kept at 0)",
            "attention_kv_efficiency: the context is not stated in the paper (kept at the ideal streaming rate)",
            "the GPU board is not stated (A100-80GB-PCIe assumed, that of the paper's Appendix G)",
        ],
    }


SDB = "Liu et al. 2026 (SpecDecode-Bench), arXiv 2601.11580"
#: SpecDecode-Bench's cost model was fitted on these batches (predictor.py's comment); the others are held out
SDB_FIT_BATCHES = (1, 8, 16, 32, 64)
SDB_TERMS = ("forward_overhead_s", "verified_token_s", "draft_stage_s")
#: a family with no published step of its own carries the closest family's terms, its range widened by
#: this factor each way (docs/performance-model.md#engine-presets)
CARRIED_WIDENING = 2.0


def vllm_preset(tables) -> dict:
    table = _table(tables, "specdecode-bench")
    steps = table.steps
    base = load_hardware(table.hardware)
    train = steps[steps["batch"].isin(SDB_FIT_BATCHES)].reset_index(drop=True)
    fit = fit_terms(train, base, SDB_TERMS)
    alternatives = {k: [] for k in SDB_TERMS}
    for b in SDB_FIT_BATCHES:  # leave one batch size out
        sub = fit_terms(train[train["batch"] != b].reset_index(drop=True), base, SDB_TERMS)
        for k in SDB_TERMS:
            alternatives[k].append(sub[k])
    err = np.abs(residuals_of(train, base.with_(**fit)))
    how = (
        "fitted on SpecDecode-Bench's vLLM 0.10.1 cost model at batches 1, 8, 16, 32, 64 and contexts 512, 2048 "
        "(20 steps); range: refits leaving one batch out"
    )
    eagle = term_record(fit["draft_stage_s"], alternatives["draft_stage_s"], "s per drafted depth", how)
    return {
        "title": "vLLM (EAGLE/EAGLE-3, MTP, draft model and n-gram proposers; CUDA graphs)",
        "measured": True,
        "sources": [
            {
                "paper": SDB,
                "where": "SpecDecode-Bench/simulator predictor.py, class Llama8BH100",
                "read": "the authors' cost model of measured vLLM 0.10.1 steps, Llama-3.1-8B, one H100, EAGLE, k = 3 "
                "(roofline/data/published_speculative_steps.json, table specdecode-bench)",
            }
        ],
        "base_hardware": table.hardware,
        "model": str(train["shape"].iloc[0]),
        "fit_rows": "specdecode-bench: batches 1, 8, 16, 32, 64 (the authors' own fitting batches), contexts 512 "
        "and 2048, plain and k = 3 EAGLE steps (20 rows)",
        "held_out": "specdecode-bench batches 2, 4 and 128 (12 rows; judged in benchmarks/bench_published_steps.py)",
        "in_sample": {"median_abs": rounded(float(np.median(err))), "worst_abs": rounded(float(err.max()))},
        "terms": {
            "forward_overhead_s": term_record(fit["forward_overhead_s"], alternatives["forward_overhead_s"], "s", how),
            "verified_token_s": term_record(fit["verified_token_s"], alternatives["verified_token_s"], "s", how),
            "draft_stage_s": eagle,
        },
        "drafting": drafting_by_kind(eagle),
        "not_known": [
            "forward_overhead_s: the built-in h100-sxm already predicts the model's plain step (its 1.207 ms per "
            "step of scheduling overhead included) within a few percent, so the fit adds none",
            "spec_step_overhead_s: only k = 3 was fitted, so a fixed drafting cost per step cannot be told from a "
            "cost per drafted depth; all of it is per depth (vLLM's EAGLE proposer runs one draft forward per "
            "drafted token), kept at the ideal 0",
            "attention_kv_efficiency: kept at the ideal streaming rate (the forward's KV term is within the "
            "built-in's prediction)",
        ],
    }


def drafting_by_kind(eagle: dict) -> dict:
    """The cost per drafted depth of each drafter kind beyond what the roofline prices as
    operators (docs/performance-model.md#engine-presets)."""

    def carried(why: str, low: float, high: float) -> dict:
        return {
            "value": eagle["value"],
            "unit": eagle["unit"],
            "range": [rounded(eagle["range"][0] * low), rounded(eagle["range"][1] * high)],
            "how": why,
        }

    def priced(why: str) -> dict:
        return {"value": 0.0, "unit": eagle["unit"], "range": [0.0, 0.0], "how": why}

    return {
        "eagle": eagle,
        "eagle3": carried(
            "EAGLE's cost carried (no published EAGLE-3 step): one draft decoder layer per depth as EAGLE's, its "
            "first depth fusing three target layers (3h -> h); range widened 0.75x-1.5x",
            0.75,
            1.5,
        ),
        "mtp": carried(
            "EAGLE's cost carried (no published MTP step): one decoder layer (DeepSeek-V3's MTP module) per depth; "
            "range widened 0.5x-2x",
            0.5,
            2.0,
        ),
        "draft-model": priced("0: the roofline prices the draft model's own forward passes (draft-model steps)"),
        "medusa": priced("0: Medusa's heads run in parallel in one pass and are priced as operators"),
        "hydra": priced("0: Hydra's heads are priced as operators, one per stage"),
        "mlp-speculator": priced("0: the MLP speculator's stages are priced as operators"),
        "ngram": priced(
            "0: SpecDecode-Bench's n-gram proposer costs 0.59% of the verification forward "
            "(predictor.py ngram_draft_percentage), within the forward's own uncertainty"
        ),
    }


def carried_preset(family: str, title: str, why: str, *, source: dict) -> dict:
    """`source`'s terms for a family with no published step, each range widened CARRIED_WIDENING each way."""

    def widen(rec: dict) -> dict:
        lo, hi = rec["range"]
        how = f"carried from the vllm preset ({rec['how']}); range widened {CARRIED_WIDENING:g}x each way"
        return {**rec, "range": [rounded(lo / CARRIED_WIDENING), rounded(hi * CARRIED_WIDENING)], "how": how}

    return {
        "title": title,
        "measured": False,
        "carried_from": "vllm",
        "sources": source["sources"],
        "base_hardware": source["base_hardware"],
        "model": source["model"],
        "fit_rows": f"none of its own: the vllm preset's terms ({source['fit_rows']})",
        "held_out": source["held_out"],
        "terms": {k: widen(v) for k, v in source["terms"].items()},
        "drafting": {k: widen(v) for k, v in source["drafting"].items()},
        "not_known": [why],
    }


UNMEASURED = {
    "trtllm": (
        "NVIDIA TensorRT-LLM (C++ runtime, CUDA graphs, Medusa/EAGLE/draft-model speculation)",
        "no published TensorRT-LLM speculative steps enough to fit on were found (NVIDIA publishes forward "
        "passes by token count, roofline/published.py, and speculative throughput speedups without tokens per "
        "step): the vllm preset's terms are carried, each range widened 2x each way; held out and judged in "
        "benchmarks/bench_published_steps.py: TensorRT-LLM PR #5146's EAGLE-3 chain of 3 (Llama-3.3-70B, eight "
        "H200s, concurrency 4: acceptance length 1.83 at 1.26x, table trtllm-pr-5146), one point",
    ),
    "sglang": (
        "SGLang (EAGLE/EAGLE-3, STANDALONE draft model)",
        "SGLang's published steps fit none of the vllm preset's forward terms (SGLang's EAGLE numbers before them, "
        "e.g. SafeAILab/EAGLE#173: Llama-2-7B-chat on one H100, 156 tokens/s plain, 297 with EAGLE, 64 draft "
        "tokens, give tokens per second without the accepted tokens per step): those are carried, each range "
        "widened 2x each way; its own terms are fitted on SpecForge's SpecBundle dashboard (SGLang 0.5.6; chains "
        "and trees of equal counts of Llama-3.1-8B on one H200 and Llama-3.3-70B on four), whose tables are "
        "therefore fitted, not held out: tree_verify_layer_s (SGLang verifies a topk > 1 tree with two attention "
        "passes a layer, a chain with one), and the EAGLE-3 drafting per depth (draft_stage_s, also EAGLE's and "
        "MTP's) and per step (spec_step_overhead_s) from the 8B chains (the 70B chains only bound the cost per "
        "depth: the forward's row curve prices their growth above their whole measured growth); "
        "held out and judged in benchmarks/bench_published_steps.py: EAGLE-3's Table 3 (speedups per batch), "
        "SpecForge issue #339 (chains and trees of Qwen3-30B-A3B beside plain decoding), SGLang PR #4716 (a "
        "64-token tree of Llama-3.3-70B on eight H100s), SGLang PR #5318 (a chain and a tree of Llama-3.1-8B) and "
        "AngelSlim issue #163 (trees of Qwen3-30B-A3B on four H100s)",
    ),
}


#: TensorRT-LLM's n-gram drafter (the PyTorch backend's CPU proposer, the path of 1.2.0rc1) is a host
#: cost per speculative step, not per drafted depth: NVIDIA/TensorRT-LLM PR #19437 (mikeiovine,
#: 2026-09-18), traces of gpt-oss on four B200s: "~1.3 ms between forward passes" with the CPU n-gram,
#: which "does not support overlap scheduler", against "~0.2 ms" once ported to the one-model path with
#: overlap scheduling (docs/performance-model.md#engine-presets)
TRTLLM_NGRAM_GAP_S = (1.3e-3, 0.2e-3)


def trtllm_ngram() -> dict:
    """The trtllm preset's n-gram cost per speculative step: the CPU path's exposed gap over the
    overlapped one; range half of that to twice the whole gap (one model's trace read by eye, and
    "magnitude ... depends on model")."""
    cpu, overlapped = TRTLLM_NGRAM_GAP_S
    return {
        "value": rounded(cpu - overlapped),
        "unit": "s per step",
        "range": [rounded((cpu - overlapped) / 2), rounded(2 * cpu)],
        "how": "TensorRT-LLM PR #19437 (gpt-oss TP 4 on B200 traces): the CPU n-gram drafter leaves ~1.3 ms "
        "between forward passes (no overlap scheduler), ~0.2 ms once overlapped; the difference charged once per "
        "speculative step; range 0.5x the difference to 2x the whole gap (another model's trace, read by eye)",
    }


#: SGLang's chains and trees of equal verified tokens and draft forwards, on which its
#: tree_verify_layer_s is fitted (and which are therefore no longer held out)
SGLANG_TREE_TABLES = ("specbundle-llama-3.1-8b", "specbundle-llama-3.3-70b")
SPECBUNDLE = {
    "paper": "SpecForge's SpecBundle performance dashboard (sgl-project/SpecForge pull request #382)",
    "where": "docs/spec_bundle/public/raw_data/data.json at commit 317f1a0, MT-Bench rows",
    "read": "SGLang 0.5.6 chains (steps, 1, steps + 1) and trees (steps, topk > 1, steps + 1) of equal verified "
    "tokens and draft forwards, Llama-3.1-8B on one H200 at batch 1 and Llama-3.3-70B on four at batch 8 "
    "(roofline/data/published_speculative_steps.json, tables " + " and ".join(SGLANG_TREE_TABLES) + ")",
}
TREE_UNIT = "s per target layer of a branching tree"


def tree_minus_chain_per_layer(table) -> list[float]:
    """Seconds per target layer by which each tree of `table` costs more than the chain of its
    batch that verifies as many tokens after as many draft forwards: the two are one step to
    every other term, so the difference is the tree's alone (docs/performance-model.md#engine-presets)."""
    steps = table.steps
    layers = model_shape(table.setup["shape"]).layers
    kind = steps["config"].str.split().str[0]
    chains = steps[kind == "chain"].set_index(["group", "tokens", "draft_stages"])["step_ms"]
    trees = steps[kind == "tree"]
    chain_ms = chains.loc[list(zip(trees["group"], trees["tokens"], trees["draft_stages"], strict=True))]
    return list((trees["step_ms"].to_numpy() - chain_ms.to_numpy()) / 1e3 / layers)


def sglang_tree_verify(tables) -> dict:
    """SGLang's tree_verify_layer_s: the mean over SpecBundle's tree-minus-chain pairs of the
    step difference per target layer; range: the smallest and largest pair."""
    per_layer = [v for t in SGLANG_TREE_TABLES for v in tree_minus_chain_per_layer(_table(tables, t))]
    return {
        **term_record(float(np.mean(per_layer)), per_layer, TREE_UNIT, ""),
        "how": "mean over the SpecBundle dashboard's trees minus its chains of equal verified tokens and draft "
        "forwards (5-3-6 minus 5-1-6, 7-4-8 minus 7-1-8; Llama-3.1-8B TP 1 batch 1, 32 layers; Llama-3.3-70B TP 4 "
        f"batch 8, 80 layers; {len(per_layer)} pairs) of the step difference per target layer; range: the smallest "
        "and largest pair (the two models, batches and GPU counts differ, so the spread is not noise alone)",
        "tables": list(SGLANG_TREE_TABLES),
    }


def carried_tree_verify(sglang: dict, engine: str) -> dict:
    """SGLang's tree_verify_layer_s for an engine that publishes no tree beside a chain of equal
    counts, its range widened CARRIED_WIDENING each way."""
    lo, hi = sglang["range"]
    return {
        "value": sglang["value"],
        "unit": sglang["unit"],
        "range": [rounded(lo / CARRIED_WIDENING), rounded(hi * CARRIED_WIDENING)],
        "how": f"carried from the sglang preset: no published measurement of {engine} verifying a branching tree "
        f"beside a chain of equal verified tokens and draft forwards; range widened {CARRIED_WIDENING:g}x each way",
    }


#: SGLang's chains on one GPU, whose drafting cost per depth and per step is fitted on them, and
#: the chains at TP 4 whose forward the row curve confounds: they only bound the cost per depth
#: from above (docs/performance-model.md#engine-presets)
SGLANG_CHAIN_TABLE = "specbundle-llama-3.1-8b"
SGLANG_CHAIN_BOUND_TABLE = "specbundle-llama-3.3-70b"


def _chains(table) -> pd.DataFrame:
    steps = table.steps
    return steps[steps["config"].str.startswith("chain")].sort_values("draft_stages")


def chain_excess_s(table, hw) -> tuple[np.ndarray, np.ndarray]:
    """(draft depths, seconds): each chain's measured step over plain decoding's, less what the
    forward pass alone adds (hw's prediction of the chain's verification over the plain step): the
    drafting and per-step cost of the chain (docs/performance-model.md#engine-presets)."""
    steps, chains = table.steps, _chains(table)
    plain = steps[steps["tokens"] == 1]
    rows = pd.concat([plain, chains])
    step = StepShape(
        rows["batch"].to_numpy(),
        rows["tokens"].to_numpy(),
        rows["context"].to_numpy(),
        tensor_parallel_gpus=int(table.setup.get("tensor_parallel", 1)),
    )
    forward_s = step_time_s(model_shape(table.setup["shape"]), None, hw, step)
    measured_s = rows["step_ms"].to_numpy() / 1e3
    excess = (measured_s[1:] - measured_s[0]) - (forward_s[1:] - forward_s[0])
    return chains["draft_stages"].to_numpy(dtype=float), excess


def chain_growth_per_depth_s(table) -> list[float]:
    """Seconds by which each chain's measured step grows per extra draft depth over the next
    shorter chain: drafting plus the forward's growth, so an upper bound of drafting alone."""
    chains = _chains(table)
    return list(np.diff(chains["step_ms"].to_numpy()) / 1e3 / np.diff(chains["draft_stages"].to_numpy()))


def sglang_drafting(tables, hw) -> tuple[dict, dict]:
    """SGLang's EAGLE-3 drafting: (cost per drafted depth, cost per speculative step), the slope and
    intercept of the line through the SpecBundle 8B chains' excess over plain decoding against their
    depth (`chain_excess_s`); hw: the preset's profile without drafting. Ranges: the lines through
    each two of the three chains; the cost per depth's upper end also the 70B chains' whole step
    growth per depth."""
    depth, excess = chain_excess_s(_table(tables, SGLANG_CHAIN_TABLE), hw)
    slope, intercept = np.polyfit(depth, excess, 1)
    pairs = [np.polyfit(np.delete(depth, i), np.delete(excess, i), 1) for i in range(len(depth))]
    bound = chain_growth_per_depth_s(_table(tables, SGLANG_CHAIN_BOUND_TABLE))
    fitted = (
        "the SpecBundle dashboard's EAGLE-3 chains 3-1-4, 5-1-6, 7-1-8 of Llama-3.1-8B (one H200, batch 1): "
        "each chain's step over plain decoding's, less the forward's predicted growth, against its draft depth"
    )
    per_depth = {
        **term_record(float(slope), [p[0] for p in pairs] + [max(bound)], "s per drafted depth", ""),
        "how": f"slope of the line through {fitted}; range: the lines through two of the three chains, up to the "
        "Llama-3.3-70B chains' whole step growth per depth (TP 4, batch 8: the forward's row curve confounds "
        "their drafting, so they bound it from above only)",
        "tables": [SGLANG_CHAIN_TABLE, SGLANG_CHAIN_BOUND_TABLE],
    }
    per_step = {
        **term_record(float(intercept), [p[1] for p in pairs], "s", ""),
        "how": f"intercept (depth 0) of the line through {fitted}: SGLang's cost of a speculative step beyond its "
        "draft depths and verification forward; range: the lines through two of the three chains",
        "tables": [SGLANG_CHAIN_TABLE],
    }
    return per_depth, per_step


def sglang_drafting_by_kind(per_depth: dict) -> dict:
    """SGLang's drafter kinds priced by its own chains: EAGLE and EAGLE-3 (one worker, SGLang's
    EAGLEWorker, serves both) at the fitted cost per depth; MTP (SGLang runs DeepSeek's NextN
    layer through the same worker) at that cost with the range widened 0.5x-2x, as vLLM's MTP."""
    own = {k: v for k, v in per_depth.items() if k != "tables"}
    lo, hi = own["range"]
    return {
        "eagle": {
            **own,
            "how": "SGLang's EAGLE-3 cost per depth (EAGLE runs through the same EAGLEWorker): " + own["how"],
        },
        "eagle3": own,
        "mtp": {
            **own,
            "range": [rounded(lo * 0.5), rounded(hi * 2.0)],
            "how": "SGLang's EAGLE-3 cost per depth (no published SGLang MTP step; SGLang runs an MTP layer, one "
            "decoder layer per depth, through the same EAGLEWorker); range widened 0.5x-2x",
        },
    }


def derive() -> dict:
    tables = published_tables()
    families = {
        "ideal": {
            "title": "ideal engine: no cost beyond the forward pass (the built-in profiles' own terms)",
            "measured": False,
            "sources": [],
            "terms": {},
            "not_known": ["not an engine that was measured: the upper bound of what an engine's terms allow"],
        },
        "hf-eager": hf_eager_preset(tables),
        "ibm-tgis": ibm_preset(tables),
    }
    vllm = vllm_preset(tables)
    for family in ("trtllm", "vllm", "sglang"):
        families[family] = vllm if family == "vllm" else carried_preset(family, *UNMEASURED[family], source=vllm)
    families["trtllm"]["drafting"]["ngram"] = trtllm_ngram()
    sglang = families["sglang"]
    sglang["terms"]["tree_verify_layer_s"] = sglang_tree_verify(tables)
    sglang["sources"] = [*sglang["sources"], SPECBUNDLE]
    sglang["fit_rows"] += (
        "; tree_verify_layer_s its own: SpecForge's SpecBundle dashboard, trees minus chains of equal counts "
        "(" + ", ".join(SGLANG_TREE_TABLES) + ")"
    )
    carried = {k: sglang["terms"][k]["value"] for k in ("forward_overhead_s", "verified_token_s")}
    chains_hw = load_hardware(_table(tables, SGLANG_CHAIN_TABLE).hardware).with_(**carried)
    per_depth, per_step = sglang_drafting(tables, chains_hw)
    sglang["terms"]["draft_stage_s"] = per_depth
    sglang["terms"]["spec_step_overhead_s"] = per_step
    sglang["drafting"].update(sglang_drafting_by_kind(per_depth))
    sglang["fit_rows"] += (
        "; draft_stage_s (EAGLE and EAGLE-3 per depth) and spec_step_overhead_s its own: the same dashboard's chains "
        f"of {SGLANG_CHAIN_TABLE}, bounded by those of {SGLANG_CHAIN_BOUND_TABLE}"
    )
    for family, engine in (("vllm", "vLLM (tree attention until 0.20)"), ("trtllm", "TensorRT-LLM")):
        families[family]["terms"]["tree_verify_layer_s"] = carried_tree_verify(
            sglang["terms"]["tree_verify_layer_s"], engine
        )
    return {
        "format": FORMAT,
        "generated_by": "tools/fit_engine_presets.py (docs/performance-model.md#engine-presets)",
        "families": families,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(OUT.parents[2])}")
    args = parser.parse_args(argv)
    text = json.dumps(derive(), indent=1) + "\n"
    if args.write:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
