"""Mutation testing: plant one known bug at a time and check that the tests catch it.

    python tools/mutants.py                  # every mutant (a few minutes on 2 cores)
    python tools/mutants.py --only PATTERN   # mutants whose id, file or description contains PATTERN
    python tools/mutants.py --skip PATTERN   # all but those
    python tools/mutants.py --list           # print the list and check every snippet, run nothing
    python tools/mutants.py --slice I        # slice I of the rotation (what CI runs: I = the commit count)
    python tools/mutants.py --sample 12 --seed S   # 12 mutants drawn with seed S

Run it with the project's interpreter from anywhere; it finds the repository from its own path.
Each mutant replaces one exact snippet of one file by a wrong variant (a dropped term, a wrong
index, an off-by-one, s where s + q belongs, a missing division by n_kv, an efficiency that
is ignored, ...). The repository is copied once to a scratch directory (the working tree is
never modified, so Ctrl-C is safe); in the copy each mutant is applied, `python -m pytest -x
-q <tests>` runs on the mutant's narrow test selection, and the file is restored.

    KILLED    the tests failed (or timed out, or could not import the mutated module)
    SURVIVED  the tests passed: no test notices this bug
    ERROR     pytest could not run the selection (a test file that is not there)

Before any mutant, every selection runs once on the unmutated copy: it must pass, or the run
stops. Exit status: 0 every mutant killed; 1 some survived; 2 a snippet is not found exactly
once, a selection cannot run or fails without a mutant (the code moved: update MUTANTS);
130 interrupted.

Mutants with `pending` name the branch whose tests are to kill them; until it is merged they
are expected to survive (`--skip pending` leaves them out).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".venv", "*.pyc")
# pytest exit codes (pytest.ExitCode): 0 passed, 1 tests failed, 2 interrupted (a collection
# error: the mutant broke an import), 3 internal error, 4 usage error, 5 no tests collected
KILLING_CODES = (1, 2, 3)

OPS_TESTS = ("tests/test_roofline_ops.py", "tests/test_roofline_terms.py")
LATENCY_TESTS = ("tests/test_roofline_terms.py", "tests/test_roofline_latency.py")
GRID_TESTS = ("tests/test_roofline_grid.py",)
PUBLISHED_TESTS = ("tests/test_roofline_published.py",)
GEMM_TESTS = ("tests/test_roofline_published_gemms.py", "tests/test_roofline_published.py")
BUILD_TESTS = ("tests/test_build.py",)
ACCURACY_TESTS = ("tests/test_accuracy.py", "tests/test_build.py")
ACCEPTANCE_TESTS = ("tests/test_acceptance.py",)
ENGINE_TESTS = ("tests/test_engines.py",)
MIX_TESTS = ("tests/test_mix.py",)
SCHEDULE_TESTS = ("tests/test_schedules.py",)
RELIABILITY_TESTS = ("tests/test_reliability.py",)
STEP_TESTS = ("tests/test_step_engine.py",)
DRAFTER_TESTS = ("tests/test_drafters.py",)
ENGINE_ACCEPTANCE_TESTS = ("tests/test_engine_acceptance.py",)
PREFIX_TESTS = ("tests/test_hydra_prefix.py",)
EAGLE_TESTS = ("tests/test_eagle.py",)
SGLANG_DYNAMIC_TESTS = ("tests/test_sglang_dynamic.py",)
DATA_TESTS = ("tests/test_data_formats.py",)
API_TESTS = ("tests/test_python_api.py",)
DIST_TESTS = ("tests/test_distributed.py",)
DRAFT_MODEL_TESTS = ("tests/test_draft_model.py",)
GAMMA_TESTS = ("tests/test_roofline_speculative.py", "tests/test_draft_model_wiring.py")
DRAFT_COST_TESTS = ("tests/test_drafter_cost.py",)
CANDIDATE_TESTS = ("tests/test_candidates.py",)
FORM_TESTS = ("tests/test_candidates_verification.py",)
TREE_ACCEPT_TESTS = ("tests/test_draft_tree_acceptance.py",)
TREE_COST_TESTS = ("tests/test_draft_tree_cost.py",)
TREE_VALIDATION_TESTS = ("tests/test_draft_tree_validation.py",)
RULE_TESTS = ("tests/test_decision_rules.py",)
TIEBREAK_TESTS = ("tests/test_typical_tiebreak.py",)
CAPTURED_STEP_TESTS = ("tests/test_captured_drafting.py::test_captured_steps_equal_the_separate_phases_bit_for_bit",)
CAPTURED_LOSSLESS_TESTS = ("tests/test_captured_drafting.py::test_captured_greedy_decoding_is_plain_greedy",)
SAMPLED_VALIDATION_TESTS = (
    "tests/test_bad_inputs.py::test_bad_input[validate-temperature-mismatch]",
    "tests/test_bad_inputs.py::test_bad_input[validate-temperature-mismatch-sidecar]",
    "tests/test_validate_temperature.py",
)


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # path relative to the repository root
    original: str  # must occur exactly once in the file
    replacement: str
    description: str
    tests: tuple[str, ...]
    pending: str = ""  # branch expected to add the killing test, if none kills it yet


MUTANTS = (
    # ---- rules that decide something, against values from outside the code (tests/test_decision_rules.py)
    Mutant(
        "rules-equivalence-bound-one-sided",
        "treeopt/stats.py",
        "return np.quantile(ratio, (1.0 - confidence) / 2, axis=0)",
        "return np.quantile(ratio, 1.0 - confidence, axis=0)",
        "the equivalence bound at the 90% interval's end while selection.json says 95%",
        RULE_TESTS,
    ),
    Mutant(
        "rules-interval-whole-alpha-each-end",
        "treeopt/stats.py",
        "lo, hi = np.quantile(draws, [alpha / 2, 1 - alpha / 2], axis=0)",
        "lo, hi = np.quantile(draws, [alpha, 1 - alpha], axis=0)",
        "a 95% interval that is a 90% one (the whole error rate cut from each end)",
        RULE_TESTS,
    ),
    Mutant(
        "rules-sequential-level-not-spent",
        "treeopt/stats.py",
        "return 1.0 - (1.0 - confidence) / max(int(looks), 1)",
        "return confidence",
        "each look (or size) at the final confidence: the shipped interval holds less often than it says",
        RULE_TESTS,
    ),
    Mutant(
        "rules-engine-beats-engine-costs",
        "roofline/engine_presets.py",
        "asked = family if family is not None else (engine_family(engine) if engine is not None else None)",
        "asked = engine_family(engine) if engine is not None else family",
        "--engine's family wins over --engine-costs, against the docstring",
        RULE_TESTS,
    ),
    Mutant(
        "rules-builtin-by-name-only",
        "roofline/engine_presets.py",
        "if builtin_hardware().get(profile.name) != profile:",
        "if profile.name not in builtin_hardware():",
        "a profile file that keeps a built-in's name has its measured terms replaced by the preset",
        RULE_TESTS,
    ),
    Mutant(
        "rules-best-gamma-ignores-memory",
        "roofline/speculative.py",
        'ok = grid[grid["fits_memory"]]',
        "ok = grid",
        "best_gamma picks a gamma or tree that does not fit in memory",
        RULE_TESTS,
    ),
    Mutant(
        "rules-candidates-context-once",
        "roofline/latency.py",
        "per_key * b * c * s",
        "per_key * b * s",
        "candidate sequences pay the framework's per-key cost once per sequence, not per candidate",
        RULE_TESTS,
    ),
    Mutant(
        "rules-prior-measured-not-relative",
        "roofline/profile_fit.py",
        "            scale = spec.measured_scale * centre",
        "            scale = spec.measured_scale * unit",
        "a measured time term's prior is half a median step wide, not half its own value",
        ("tests/test_prior_widths.py",),
    ),
    Mutant(
        "rules-prior-time-not-in-steps",
        "roofline/profile_fit.py",
        "        unit = t_ref if name in TIME_TERMS else 1.0",
        "        unit = 1.0",
        "an unmeasured time term's prior is one second wide, not one median measured step",
        ("tests/test_prior_widths.py",),
    ),
    Mutant(
        "rules-candidates-row-length",
        "roofline/latency.py",
        "per_key = np.where(q / c > 1, hw.context_overhead_s, hw.plain_context_overhead_s)",
        "per_key = np.where(q > 1, hw.context_overhead_s, hw.plain_context_overhead_s)",
        "one-token candidate rows pay the tree step's per-key cost, not the plain path's",
        RULE_TESTS,
    ),
    Mutant(
        "rules-typical-first-longest",
        "calibration/verification.py",
        "    return path_ll.argmax(-1), n_keep",
        "    return lengths.argmax(-1), n_keep",
        "typical acceptance keeps the first longest path, not the most likely as Medusa's reference code",
        TIEBREAK_TESTS,
    ),
    Mutant(
        "rules-typical-root-counted",
        "calibration/verification.py",
        "counted[..., 0] = False",
        "counted[..., 0] = counted[..., 0]",
        "the root's own probability counts in a path's likelihood",
        TIEBREAK_TESTS,
    ),
    Mutant(
        "engine-bench-vllm-spec-shorthands",
        "roofline/engine_bench.py",
        'VLLM_SPECULATIVE_ARGS = ("speculative_config", "spec_method", "spec_model", "spec_tokens")',
        'VLLM_SPECULATIVE_ARGS = ("speculative_config",)',
        "a vLLM latency run started with --spec-method/--spec-model/--spec-tokens read as plain decoding",
        ("tests/test_engine_bench.py",),
    ),
    Mutant(
        "engine-newest-vllm-tree",
        "treeopt/engines.py",
        '        if kind == "vllm-tree":\n',
        '        if kind in ("vllm", "vllm-tree"):\n',
        "the newest vLLM's line carries speculative_token_tree (0.33's SpeculativeConfig refuses the key)",
        ("tests/test_engine_releases.py",),
    ),
    Mutant(
        "engine-trtllm-draft-model-as-medusa",
        "treeopt/engine_data.py",
        'serves = {"draft-model": "trtllm-draft-model",',
        'serves = {"draft-model": "trtllm",',
        "a draft-model table with --engine trtllm gets a Medusa config",
        ("tests/test_engine_releases.py",),
    ),
    # ---- per-batch schedules in the engines' forms (treeopt/schedules.py)
    Mutant(
        "schedule-gap-longer-neighbour",
        "treeopt/schedules.py",
        "lens.append(int(min(draft[i - 1], draft[i])))",
        "lens.append(int(max(draft[i - 1], draft[i])))",
        "a gap between measured batch sizes takes the longer neighbouring draft (claims more than the data)",
        SCHEDULE_TESTS,
    ),
    Mutant(
        "schedule-past-data-keeps-drafting",
        "treeopt/schedules.py",
        "        lens.append(0)\n",
        "        lens.append(int(draft[-1]))\n",
        "batch sizes above the largest measured one keep its draft length",
        SCHEDULE_TESTS,
    ),
    Mutant(
        "schedule-vllm-no-closing-zero",
        "treeopt/schedules.py",
        "    if table[-1][2] > 0:\n",
        "    if False:\n",
        "vLLM's table without the K = 0 range past the data (vLLM carries the last K forward)",
        SCHEDULE_TESTS,
    ),
    Mutant(
        "schedule-trtllm-longer-than-max",
        "treeopt/schedules.py",
        "schedule[int(end)] = int(min(k, first))",
        "schedule[int(end)] = int(k)",
        "a TensorRT-LLM value above max_draft_len (its validator refuses it)",
        SCHEDULE_TESTS,
    ),
    Mutant(
        "schedule-mix-longest-context",
        "treeopt/schedules.py",
        "out.append(BatchChoice(int(bs), int(k[b == bs].min())))",
        "out.append(BatchChoice(int(bs), int(k[b == bs].max())))",
        "a batch size takes the longest draft of its contexts",
        SCHEDULE_TESTS,
    ),
    Mutant(
        "schedule-mix-weights-ignored",
        "treeopt/schedules.py",
        "        rows = [r for r in rows if weights.get((r[0], r[1]), 0.0) > 0]\n",
        "        pass\n",
        "a schedule for a traffic mix is held back by contexts the mix never runs at that batch",
        ("tests/test_selection_schedules.py",),
    ),
    Mutant(
        "schedule-sglang-no-plain",
        "treeopt/schedules.py",
        "speedups[cell] = {SGLANG_PLAIN: 1.0} | {",
        "speedups[cell] = {} | {",
        "SGLang's per-range triple speculates where every triple is slower than plain decoding",
        ("tests/test_selection_schedules.py",),
    ),
    Mutant(
        "schedule-select-not-stored",
        "treeopt/api.py",
        "    return with_schedule(\n        chosen,\n        target,\n",
        "    return chosen or with_schedule(\n        chosen,\n        target,\n",
        "select --engine / roofline speedup --select --engine give no per-batch schedule",
        ("tests/test_selection_schedules.py",),
    ),
    Mutant(
        "schedule-not-in-answer",
        "treeopt/app/run_answer.py",
        'return L + [""] + schedule_lines(selection.get("schedule"))',
        'return L + [""]',
        "the run's answer section leaves out the engine's per-batch schedule",
        ("tests/test_selection_schedules.py",),
    ),
    # ---- TensorRT-LLM's Eagle3DecodingConfig (treeopt/trtllm_eagle.py)
    Mutant(
        "trt-eagle3-tree-max-draft-len-nodes",
        "treeopt/trtllm_eagle.py",
        'config["max_draft_len"] = int(tree.depth)',
        'config["max_draft_len"] = int(tree.size)',
        "a static EAGLE tree's max_draft_len is its node count, not its depth (the drafter layers)",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-eagle3-dynamic-total-unbounded",
        "treeopt/trtllm_eagle.py",
        "if not depth <= total <= k * depth:",
        "if not depth <= total:",
        "a dynamic tree with more tokens than topK x max_draft_len (TensorRT-LLM refuses it)",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-eagle3-no-draft",
        "treeopt/trtllm_eagle.py",
        '    config["speculative_model_dir"] = _model(drafter)\n',
        "",
        'an EAGLE-3 config without the draft ("Draft model must be provided for EAGLE")',
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-eagle3-schedule-no-draft",
        "treeopt/schedules.py",
        'extra = {"speculative_model_dir": model, "eagle3_one_model": True}',
        "extra = {}",
        "the EAGLE-3 per-batch schedule without the draft TensorRT-LLM requires",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-eagle3-drafter-gets-medusa",
        "treeopt/engine_data.py",
        '"eagle3": "trtllm-eagle3"}',
        '"eagle3": "trtllm"}',
        "an EAGLE-3 table with --engine trtllm gets a Medusa config",
        ("tests/test_trtllm_eagle3.py",),
    ),
    # ---- TensorRT-LLM's dynamic tree as an engine (--engine trtllm-eagle3-dynamic)
    Mutant(
        "trt-dynamic-fits-unbounded",
        "treeopt/trtllm_eagle.py",
        "return steps >= 1 and topk >= 1 and steps <= nodes <= topk * steps",
        "return steps >= 1 and topk >= 1 and steps <= nodes",
        "the dynamic-tree engine takes SGLang's whole pool (TensorRT-LLM refuses more than topK x max_draft_len)",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-total-counts-root",
        "treeopt/trtllm_eagle.py",
        "return trtllm_dynamic_tree_config(steps, topk, tokens - 1, drafter)",
        "return trtllm_dynamic_tree_config(steps, topk, tokens, drafter)",
        "max_total_draft_tokens counts the root, as SGLang's num_draft_tokens does (one token too many)",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-topk1-not-chain",
        "treeopt/trtllm_eagle.py",
        "    if topk == 1:\n        return {",
        "    if False:\n        return {",
        "a dynamic tree of topK 1 is written through the dynamic-tree worker instead of as the chain",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-sglang-bound",
        "treeopt/engines.py",
        'return trtllm_dynamic_fits if engine.export_kind == "trtllm-eagle3-dynamic" else _sglang_fits',
        "return _sglang_fits",
        "the dynamic-tree engine is checked against SGLang's bound: trees TensorRT-LLM cannot draft pass",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-proposal-uncapped",
        "treeopt/family_build.py",
        'seq = Tree(tuple(paths[: min(nodes, most)]), name="sglang")',
        'seq = Tree(tuple(paths[:nodes]), name="sglang")',
        "the dynamic-tree engine's proposal grows past topK x max_draft_len of its pool",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-drafter-redirected",
        "treeopt/engine_data.py",
        'asked in ("trtllm-eagle3-tree@1.3", "trtllm-eagle3-dynamic")',
        'asked in ("trtllm-eagle3-tree@1.3",)',
        "an EAGLE-3 table with --engine trtllm-eagle3-dynamic gets the chain engine",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-schedule-no-source",
        "treeopt/schedules.py",
        '        section["source"] = TRTLLM_DYNAMIC_SOURCE\n',
        "",
        "the dynamic tree's schedule does not say it comes from rank statistics, not the draft's scores",
        ("tests/test_trtllm_eagle3.py",),
    ),
    Mutant(
        "trt-dynamic-tau-root-priced",
        "treeopt/dynamic_schedule.py",
        "priced = {k: tau * plain / step[(*cell, k[2] - 1)] for k, tau in usable.items() if (*cell, k[2] - 1) in step}",
        "priced = {k: tau * plain / step[(*cell, k[2])] for k, tau in usable.items() if (*cell, k[2]) in step}",
        "a dynamic-tree triple priced at the step time of num_draft_tokens nodes (the root counted as drafted)",
        ("tests/test_dynamic_schedule.py",),
    ),
    Mutant(
        "trt-dynamic-tau-absolute-time",
        "treeopt/dynamic_schedule.py",
        "priced = {k: tau * plain / step[",
        "priced = {k: tau / step[",
        "a dynamic-tree triple's speedup is its tau over the step time, not over the step's cost relative to plain",
        ("tests/test_dynamic_schedule.py",),
    ),
    Mutant(
        "trt-dynamic-tau-unfit-priced",
        "treeopt/dynamic_schedule.py",
        "usable = {k: v for k, v in taus.items() if fits(k[2] - 1, k[0], k[1])}",
        "usable = dict(taus)",
        "triples TensorRT-LLM's validator refuses are priced and may be chosen",
        ("tests/test_dynamic_schedule.py",),
    ),
    # ---- SGLang's start-up checks (treeopt/sglang_rules.py)
    Mutant(
        "sglang-trtllm-mha-topk2",
        "treeopt/sglang_rules.py",
        'if attention_backend == "trtllm_mha" and topk > 1:',
        'if attention_backend == "trtllm_mha" and topk > 2:',
        "topk 2 with trtllm_mha passes (SGLang refuses every topk > 1)",
        ("tests/test_sglang_rules.py",),
    ),
    Mutant(
        "sglang-page-backends-too-many",
        "treeopt/sglang_rules.py",
        'PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")',
        'PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton", "flashmla")',
        "a paged tree on flashmla passes (SGLang refuses it)",
        ("tests/test_sglang_rules.py",),
    ),
    Mutant(
        "sglang-tree-export-no-note",
        "treeopt/engines.py",
        'return EngineExport(engine.name, line, _with_note(engine, line) if triple[1] > 1 else line + "\\n")',
        'return EngineExport(engine.name, line, line + "\\n")',
        "an SGLang tree line without the server flags that refuse it",
        ("tests/test_sglang_rules.py",),
    ),
    # ---- chain or tree per cell (treeopt/chain_or_tree.py)
    Mutant(
        "chain-or-tree-any-rank-is-chain",
        "treeopt/chain_or_tree.py",
        "if len(path) != n + 1 or any(path):",
        "if len(path) != n + 1:",
        "a path of depth n with a rank above 0 counts as the chain's next node",
        ("tests/test_chain_or_tree.py",),
    ),
    Mutant(
        "chain-or-tree-longest-chain-is-a-tree",
        "treeopt/chain_or_tree.py",
        "    if cell.nodes <= longest:\n",
        "    if cell.nodes < longest:\n",
        "the longest measured chain, shipped, is reported as a tree that pays",
        ("tests/test_chain_or_tree.py",),
    ),
    Mutant(
        "chain-or-tree-vllm-020-tree-pays",
        "treeopt/chain_or_tree.py",
        "if engine is not None and engine.name == _CHAIN_VERIFIED:",
        "if False:",
        "vLLM <= 0.20's tree said to pay though it is verified as a chain",
        ("tests/test_chain_or_tree.py",),
    ),
    # ---- prompt data through the chat template, counts from many processes
    Mutant(
        "data-context-includes-reply",
        "calibration/data.py",
        "out.append(self.turns[: i + 1] if with_replies else self.turns[:i])",
        "out.append(self.turns[: i + 1])",
        "a greedy-label prompt already holds the reply it should generate",
        DATA_TESTS,
    ),
    Mutant(
        "data-no-generation-prompt",
        "calibration/data.py",
        'add_generation_prompt=turns[-1][0] != "assistant"',
        "add_generation_prompt=False",
        "the templated prompt lacks the assistant header of the turn to generate",
        DATA_TESTS,
    ),
    Mutant(
        "data-long-context-keeps-start",
        "calibration/data.py",
        "ids = ids[-prompt_tokens:]",
        "ids = ids[:prompt_tokens]",
        "a long conversation loses its turn to answer",
        DATA_TESTS,
    ),
    Mutant(
        "data-sharegpt-system-last",
        "calibration/data.py",
        'turns.insert(0, ("system", system))',
        'turns.append(("system", system))',
        "a ShareGPT record's top-level system prompt lands after its turns",
        DATA_TESTS,
    ),
    Mutant(
        "data-bos-prefix-dropped",
        "calibration/data.py",
        "return list(with_special[:n])",
        "return []",
        "a prompt made without a chat template lacks the tokenizer's BOS",
        DATA_TESTS,
    ),
    Mutant(
        "data-template-bos-doubled",
        "calibration/data.py",
        "    return _encode(tokenizer, text)\n",
        "    return list(prefix) + _encode(tokenizer, text)\n",
        "a templated prompt gets the tokenizer's BOS before the template's own",
        DATA_TESTS,
    ),
    Mutant(
        "dist-shards-not-whole-batches",
        "calibration/distributed.py",
        "last = (rank + 1) * batches // world_size",
        "last = (rank + 1) * total // world_size // batch_size",
        "shards cut batches differently from one process",
        DIST_TESTS,
    ),
    Mutant(
        "dist-progress-not-offset",
        "calibration/distributed.py",
        "np.array([counts.prompts_done - first,",
        "np.array([counts.prompts_done,",
        "each process's progress counted from prompt 0, not from its shard",
        DIST_TESTS,
    ),
    Mutant(
        "dist-ranks-out-of-order",
        "calibration/distributed.py",
        "np.concatenate([p[1] for p in parts])",
        "np.concatenate([p[1] for p in parts[::-1]])",
        "rank vectors gathered out of prompt order",
        DIST_TESTS,
    ),
    # ---- the step-cost model where trees are decided (engine terms, verification, fit)
    Mutant(
        "eng-candidates-no-reread",
        "roofline/ops.py",
        "seqs = b * c\n",
        "seqs = b\n",
        "candidate sequences do not each re-read the context",
        STEP_TESTS,
    ),
    Mutant(
        "eng-spec-on-plain",
        "roofline/latency.py",
        "np.where(q > 1, hw.spec_step_overhead_s, 0.0)",
        "hw.spec_step_overhead_s",
        "plain decoding pays the speculative step's fixed cost",
        STEP_TESTS,
    ),
    Mutant(
        "eng-verified-per-sequence",
        "roofline/latency.py",
        "hw.verified_token_s * b * q",
        "hw.verified_token_s * b",
        "cost per verified token counted per sequence",
        STEP_TESTS,
    ),
    Mutant(
        "eng-stage-cost-ignored",
        "roofline/latency.py",
        "+ hw.draft_stage_s * stages",
        "+ 0.0 * stages",
        "sequential draft stages cost nothing",
        STEP_TESTS,
    ),
    Mutant(
        "eng-kv-efficiency-ignored",
        "roofline/latency.py",
        " * hw.attention_kv_fraction(op.keys)",
        "",
        "attention reads the KV cache at the streaming rate whatever the profile says",
        STEP_TESTS,
    ),
    Mutant(
        "eng-kv-keys-without-tokens",
        "roofline/ops.py",
        "att_keys = s + k\n",
        "att_keys = s + 0 * k\n",
        "attention's keys per sequence leave out the step's own tokens",
        STEP_TESTS,
    ),
    Mutant(
        "eng-leaf-tokens",
        "roofline/grid.py",
        "np.cumsum(np.where(first_child, depth, 0))",
        "np.cumsum(np.where(first_child, depth - 1, 0))",
        "a parent that stops being a leaf takes back one token too few",
        STEP_TESTS,
    ),
    Mutant(
        "eng-capacity-decimal",
        "roofline/hardware.py",
        "capacity_bytes=gb * GIB",
        "capacity_bytes=gb * GB",
        "datasheet GB read as 10^9 bytes",
        STEP_TESTS,
    ),
    Mutant(
        "eng-fit-not-robust",
        "roofline/profile_fit.py",
        "    rho = 2.0 * (np.sqrt(1.0 + (r / f) ** 2) - 1.0)",
        "    rho = (r / f) ** 2",
        "the fit squares every error, so one outlier row pulls every term",
        STEP_TESTS,
    ),
    # ---- engine presets: SpecDecode-Bench's cost model and the drafter kinds
    Mutant(
        "preset-drafter-kind-ignored",
        "roofline/engine_presets.py",
        'changes["draft_stage_s"] = preset.drafting[drafter]',
        "pass",
        "every drafter kind pays EAGLE's cost per drafted depth",
        ("tests/test_engine_presets.py",),
    ),
    Mutant(
        "sdb-batched-tokens-per-sequence",
        "roofline/published_steps.py",
        'c["forward_batched_token_s"] * batch * (k + 1)',
        'c["forward_batched_token_s"] * (k + 1)',
        "SpecDecode-Bench's verification forward counts one sequence's tokens, not the batch's",
        ("tests/test_published_steps.py",),
    ),
    Mutant(
        "sdb-no-overhead-on-plain",
        "roofline/published_steps.py",
        '            plain_s += c["overhead_per_step_s"]\n',
        "",
        "the plain step leaves out SpecDecode-Bench's per-step overhead",
        ("tests/test_published_steps.py",),
    ),
    # ---- mixture of experts and tensor parallelism
    Mutant(
        "moe-experts-one-token-short",
        "roofline/shapes.py",
        "(1.0 - (1.0 - self.experts_per_token / e) ** t)",
        "(1.0 - (1.0 - self.experts_per_token / e) ** (t - 1))",
        "expected distinct experts counted for one token fewer",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "moe-weights-per-pair",
        "roofline/ops.py",
        "moved = experts * 3 * h * ie + pairs",
        "moved = pairs * 3 * h * ie + pairs",
        "each token-expert pair reads its expert's weights again",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "tp-ring-factor",
        "roofline/ops.py",
        "moved = 2.0 * (gpus - 1) / gpus * message",
        "moved = message",
        "an all-reduce moves its message once, not 2 (N - 1) / N times",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "tp-kv-split-past-heads",
        "roofline/ops.py",
        "else min(gpus, shape.kv_heads)",
        "else gpus",
        "the KV cache splits over more GPUs than there are KV heads",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "tp-no-collective-latency",
        "roofline/latency.py",
        "np.full_like(memory, hw.collective_latency_s)",
        "np.zeros_like(memory)",
        "an all-reduce has no fixed latency",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "mla-kv-as-heads",
        "roofline/shapes.py",
        "        if self.mla_kv_dim:\n            return self.layers * self.mla_kv_dim * self.dtype_bytes\n",
        "",
        "multi-head latent attention caches K and V of every head",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    # ---- roofline/step_shape.py: the step the latency model prices
    Mutant(
        "step-plain-keeps-candidates",
        "roofline/step_shape.py",
        "replace(self, tokens_per_sequence=1, candidates_per_sequence=None, draft_stages=None)",
        "replace(self, tokens_per_sequence=1)",
        "plain decoding keeps the tree step's candidate sequences and draft stages",
        ("tests/test_step_shape.py",),
    ),
    Mutant(
        "step-loose-context-as-batch",
        "roofline/step_shape.py",
        '"context": "context_tokens",',
        '"context": "batch_sequences",',
        "the loose keyword context sets the batch",
        ("tests/test_step_shape.py",),
    ),
    # ---- roofline/ops.py: operator FLOPs, bytes and rows
    Mutant(
        "ops-att-rows-nkv",
        "roofline/ops.py",
        "att_rows = k * (nh / nkv)",
        "att_rows = k * nh",
        "attention rows per KV head without dividing by the KV-head count",
        OPS_TESTS,
    ),
    Mutant(
        "ops-k-read-nh",
        "roofline/ops.py",
        "kv_read = seqs * nkv * att_keys * d",
        "kv_read = seqs * nh * att_keys * d",
        "fused QK reads n_h instead of n_kv key heads",
        OPS_TESTS,
    ),
    Mutant(
        "ops-kproj-nh",
        "roofline/ops.py",
        'linear("k_proj", L, qkv_in, nkv * d)',
        'linear("k_proj", L, qkv_in, nh * d)',
        "k_proj with n_h output heads under GQA",
        OPS_TESTS,
    ),
    Mutant(
        "ops-vproj-nh",
        "roofline/ops.py",
        'linear("v_proj", L, qkv_in, nkv * d)',
        'linear("v_proj", L, qkv_in, nh * d)',
        "v_proj with n_h output heads under GQA",
        OPS_TESTS,
    ),
    Mutant(
        "ops-kv-append-half",
        "roofline/ops.py",
        "2 * (2 * bq * nkv * d)",
        "2 * (bq * nkv * d)",
        "KV-cache append counts K or V, not both",
        OPS_TESTS,
    ),
    Mutant(
        "ops-kv-concat-no-read",
        "roofline/ops.py",
        "2 * (b * s * nkv * d + bq * nkv * d + b * keys * nkv * d)",
        "2 * (bq * nkv * d + b * keys * nkv * d)",
        "concat KV update without reading the s cached rows",
        OPS_TESTS,
    ),
    Mutant(
        "ops-keys-off-by-one",
        "roofline/ops.py",
        "keys = s + q\n",
        "keys = s + q - 1\n",
        "attention over s + q - 1 keys (off by one)",
        OPS_TESTS,
    ),
    Mutant(
        "ops-softmax-flops",
        "roofline/ops.py",
        "sm_flops = 5 * scores",
        "sm_flops = scores",
        "softmax at 1 FLOP per score instead of 5",
        OPS_TESTS,
    ),
    Mutant(
        "ops-rotary-no-kv",
        "roofline/ops.py",
        "3 * bq * (nh + nkv) * d, 2 * bq * (nh + nkv) * d",
        "3 * bq * nh * d, 2 * bq * nh * d",
        "rotary on the queries only, not the keys",
        OPS_TESTS,
    ),
    Mutant(
        "ops-unfused-pv-no-scores",
        "roofline/ops.py",
        "pv_flops, scores + kv_read + out, att_rows)",
        "pv_flops, kv_read + out, att_rows)",
        "unfused PV does not read the scores back",
        OPS_TESTS,
    ),
    Mutant(
        "ops-gemm-rows-q",
        "roofline/ops.py",
        'self.add(name, "gemm", count, flops, moved, bq, kernels',
        'self.add(name, "gemm", count, flops, moved, self.q, kernels',
        "GEMM efficiency read at q rows instead of b x q",
        OPS_TESTS,
    ),
    Mutant(
        "ops-heads-rows-no-b",
        "roofline/ops.py",
        "b * np.minimum(q, heads.tokens_per_sequence)",
        "np.minimum(q, heads.tokens_per_sequence)",
        "heads on one token per sequence forget the batch",
        OPS_TESTS,
    ),
    Mutant(
        "ops-blocks-nkv",
        "roofline/ops.py",
        "blocks = np.asarray(seqs * nh, dtype=float)",
        "blocks = np.asarray(seqs * nkv, dtype=float)",
        "attention blocks per KV head instead of per query head",
        OPS_TESTS,
    ),
    # ---- roofline/latency.py: rates, overheads, memory
    Mutant(
        "lat-attention-eff-ignored",
        "roofline/latency.py",
        "rate_c = peak * hw.eta_compute * hw.attention_curve(op.rows)",
        "rate_c = peak * hw.eta_compute * hw.gemm_efficiency(op.rows)",
        "the profile's attention efficiency ignored",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-vector-eta-ignored",
        "roofline/latency.py",
        "rate_c = hw.vector_flops_per_s * hw.eta_compute",
        "rate_c = hw.vector_flops_per_s",
        "vector work without eta_compute",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-elementwise-rate-ignored",
        "roofline/latency.py",
        "rate_m = hw.elementwise_rate",
        "rate_m = hw.bandwidth_bytes_per_s * hw.eta_memory",
        "elementwise kernels at the bandwidth roof, not elementwise_bytes_per_s",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-kv-rate-ignored",
        "roofline/latency.py",
        "rate_m = hw.kv_update_bytes_per_s or hw.bandwidth_bytes_per_s * hw.eta_memory",
        "rate_m = hw.bandwidth_bytes_per_s * hw.eta_memory",
        "kv_update_bytes_per_s ignored",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-memory-s-not-s-plus-q",
        "roofline/latency.py",
        "kv = b * (s + q) * shape.kv_bytes_per_token",
        "kv = b * s * shape.kv_bytes_per_token",
        "memory counts s instead of s + q cached tokens",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-memory-scores-nkv",
        "roofline/latency.py",
        "scores = b * shape.heads * q * (s + q / c) * beta",
        "scores = b * shape.kv_heads * q * (s + q / c) * beta",
        "unfused scores memory per KV head",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-memory-no-head-logits",
        "roofline/latency.py",
        "logits = b * (q + head_rows * (heads.num_heads if heads is not None else 0)) * shape.vocab * beta",
        "logits = b * q * shape.vocab * beta",
        "memory without the draft heads' logits",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-max-becomes-sum",
        "roofline/latency.py",
        "return np.maximum(self.compute_s, self.memory_s) + self.overhead_s",
        "return self.compute_s + self.memory_s + self.overhead_s",
        "operator time adds the two roofs instead of taking the larger",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-blocks-on-fused-pv",
        "roofline/latency.py",
        'if op.kind == "attention" and np.any(np.asarray(op.kernels) > 0) and hw.attention_block_overhead_s:',
        'if op.kind == "attention" and hw.attention_block_overhead_s:',
        "attention block overhead also on the kernel-less fused PV",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-head-overhead-once",
        "roofline/latency.py",
        "overhead = overhead + heads.num_heads * hw.head_overhead_s",
        "overhead = overhead + hw.head_overhead_s",
        "head overhead once instead of per head",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-plain-key-cost",
        "roofline/latency.py",
        "per_key = np.where(q / c > 1, hw.context_overhead_s, hw.plain_context_overhead_s)",
        "per_key = np.where(q / c >= 1, hw.context_overhead_s, hw.plain_context_overhead_s)",
        "plain decoding pays the tree step's cost per cached key",
        LATENCY_TESTS,
    ),
    Mutant(
        "lat-token-overhead-no-b",
        "roofline/latency.py",
        "hw.token_overhead_s * b * q",
        "hw.token_overhead_s * q",
        "framework cost per token row forgets the batch",
        LATENCY_TESTS,
    ),
    # ---- roofline/hardware.py: curves, fallbacks, defaults
    Mutant(
        "hw-curve-linear-rows",
        "roofline/hardware.py",
        "x = np.log2(np.maximum(np.asarray(rows, dtype=float), 1.0))\n"
        "        log_values = np.log2(np.asarray(self.values, dtype=float))\n"
        "        return np.exp2(np.interp(x, np.log2(np.asarray(self.rows, dtype=float)), log_values))",
        "x = np.maximum(np.asarray(rows, dtype=float), 1.0)\n"
        "        log_values = np.log2(np.asarray(self.values, dtype=float))\n"
        "        return np.exp2(np.interp(x, np.asarray(self.rows, dtype=float), log_values))",
        "efficiency curve interpolated in rows, not in log2(rows)",
        LATENCY_TESTS,
    ),
    Mutant(
        "hw-curve-linear-values",
        "roofline/hardware.py",
        "return np.exp2(np.interp(x, np.log2(np.asarray(self.rows, dtype=float)), log_values))",
        "return np.interp(x, np.log2(np.asarray(self.rows, dtype=float)), np.exp2(log_values))",
        "efficiency linear in log2(rows) between points (the old rule: a GEMM's time dips between them)",
        LATENCY_TESTS,
    ),
    Mutant(
        "hw-vector-fallback",
        "roofline/hardware.py",
        "return float(max(sixteen_bit or self.peak_flops.values())) / 16.0",
        "return float(max(self.peak_flops.values())) / 16.0",
        "vector rate fallback from the fp8 peak, twice the 16-bit one",
        LATENCY_TESTS + PUBLISHED_TESTS,
    ),
    Mutant(
        "hw-elementwise-fallback",
        "roofline/hardware.py",
        "return self.bandwidth_bytes_per_s * self.eta_memory",
        "return self.bandwidth_bytes_per_s",
        "elementwise rate fallback without eta_memory",
        LATENCY_TESTS,
    ),
    Mutant(
        "hw-attention-curve-json",
        "roofline/hardware.py",
        'for key in ("gemm_efficiency", "attention_efficiency", "attention_kv_efficiency"):',
        'for key in ("gemm_efficiency", "attention_kv_efficiency"):',
        "attention curve not parsed from a profile JSON",
        LATENCY_TESTS,
    ),
    Mutant(
        "hw-eta-memory-default",
        "roofline/hardware.py",
        "eta_memory: float = 0.78",
        "eta_memory: float = 0.8",
        "eta_memory default off the published 77-80% middle",
        LATENCY_TESTS,
    ),
    # ---- roofline/published.py: the knee checks against NVIDIA's published step times
    Mutant(
        "published-knee-reference",
        "roofline/published.py",
        "reference = {128: 1, 2048: 128}.get(tokens)",
        "reference = {128: 1, 2048: 1}.get(tokens)",
        "the 2048-token step compared with the decode step, not the 128-token one",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-knee-any-batch",
        "roofline/published.py",
        "steps = [c for c in compare_steps(hardware, profile=profile) if c.measurement.batch == 1]",
        "steps = compare_steps(hardware, profile=profile)",
        "a batch-64 prefill taken as the batch-1 step of the knee ratios",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-batch-ignored",
        "roofline/published.py",
        "batch=m.batch, tokens=m.tokens",
        "batch=1, tokens=m.tokens",
        "a batch-64 measurement predicted at batch 1",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-verdict-needs-decode",
        "roofline/published.py",
        "if bands or any(r.reference_tokens == 1 for r in ratios):",
        "if bands or any(r.reference_tokens == 128 for r in ratios):",
        "a GPU without a measured decode step called checked",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-knee-error-inverted",
        "roofline/published.py",
        "return self.predicted_ratio / self.measured_ratio - 1.0",
        "return self.measured_ratio / self.predicted_ratio - 1.0",
        "knee error taken the wrong way round",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-fp8-dtype-ignored",
        "roofline/published.py",
        "return base.with_dtype(dtype)",
        "return base",
        "an fp8 measurement predicted in the shape's own fp16",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-decode-ms",
        "roofline/published.py",
        "        1e3 / tokens_per_s,",
        "        1.0 / tokens_per_s,",
        "output tokens per second read as seconds, not milliseconds, per step",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-knee-worst-not-median",
        "roofline/published.py",
        "float(np.median(errors))",
        "float(errors[np.argmax(np.abs(errors))])",
        "a knee ratio judged by its worst measurement, not the median of them",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-knee-mean-not-median",
        "roofline/published.py",
        "float(np.median(errors))",
        "float(np.mean(errors))",
        "a knee ratio judged by the mean of its errors",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-knee-across-releases",
        "roofline/published.py",
        "ref = by_key.get((hw, release, model, reference))",
        "ref = next((v for (h, _, m, t), v in by_key.items() if (h, m, t) == (hw, model, reference)), None)",
        "a ratio paired across engine releases",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "published-v09-tokens-swapped",
        "roofline/published.py",
        "for tokens, ms in zip((128, 2048), pair)",
        "for tokens, ms in zip((2048, 128), pair)",
        "v0.9's 128- and 2048-token latencies read the wrong way round",
        PUBLISHED_TESTS,
    ),
    Mutant(
        "hw-h100-fp8-peak",
        "roofline/hardware.py",
        'fp8_tflops=1979, curve="GH100", knee=_H100_SXM)',
        'fp8_tflops=989, curve="GH100", knee=_H100_SXM)',
        "the H100's fp8 rate taken as its 16-bit one",
        PUBLISHED_TESTS,
    ),
    # ---- roofline/published_gemms.py: the row curves against Vidur's GEMM timings
    Mutant(
        "gemm-check-bandwidth-kept",
        "roofline/published_gemms.py",
        "hw = base.with_(eta_memory=base.eta_memory * float(fewest / measured[0]))",
        "hw = base",
        "the GEMM check keeps the board's memory roof instead of matching the single-row GEMMs",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-layer-time-launch-gaps",
        "roofline/published_gemms.py",
        "total = total + np.maximum(t.compute_s, t.memory_s)",
        "total = total + t.time_s",
        "launch gaps added to kernel times the profiler measured without them",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-qkv-as-q",
        "roofline/published_gemms.py",
        '"attn_pre_proj_ms": (4096, 3 * 4096),',
        '"attn_pre_proj_ms": (4096, 4096),',
        "the fused QKV projection priced as Q alone",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-gate-up-as-up",
        "roofline/published_gemms.py",
        '"mlp_up_proj_ms": (4096, 2 * 11008),',
        '"mlp_up_proj_ms": (4096, 11008),',
        "the fused gate and up projection priced as one of them",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-band-worst-not-median",
        "roofline/published_gemms.py",
        "out.append(GemmBand(hardware, reference, lo, hi, float(np.median(errors)), worst, int(errors.size)))",
        "out.append(GemmBand(hardware, reference, lo, hi, worst, worst, int(errors.size)))",
        "a band judged by its worst row count, not the median",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-fit-counted-as-check",
        "roofline/published.py",
        "bands = [] if fitted else gemm_bands(hardware, profile=profile)",
        "bands = gemm_bands(hardware, profile=profile)",
        "a curve's own fitting data counted as a check of it",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-fit-not-monotone",
        "roofline/published_gemms.py",
        "return EfficiencyCurve(knots, tuple(float(v) for v in np.cumsum(x)))",
        "return EfficiencyCurve(knots, tuple(float(v) for v in x))",
        "the fit's steps taken as the curve's values",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-fit-no-flatness",
        "roofline/published_gemms.py",
        "1e-3 * x[1:]",
        "0.0 * x[1:]",
        "nothing keeps the curve flat where the timings cannot see it",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-timing-no-activations",
        "roofline/latency.py",
        "dtype_bytes * (k * n + rows * k + rows * n),",
        "dtype_bytes * k * n,",
        "a GEMM's input and output rows left out of its bytes",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-h100-a100-curve",
        "roofline/hardware.py",
        '_gpu("h100-sxm", 989, 3350, 80, 67, "NVIDIA H100-SXM5-80GB", fp8_tflops=1979, curve="GH100"',
        '_gpu("h100-sxm", 989, 3350, 80, 67, "NVIDIA H100-SXM5-80GB", fp8_tflops=1979, curve="GA100"',
        "the H100 given the A100's row curve again",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-h200-no-sibling",
        "roofline/published.py",
        '    "h200": "h100-sxm",\n',
        "",
        "the H200 not tied to the H100-SXM's die",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-mi300x-base-row-one",
        "roofline/published_gemms.py",
        "GemmCheck(hardware, r, g.rows[0], float(measured[i] / measured[0]), float(predicted[i] / predicted[0]))",
        "GemmCheck(hardware, r, 1, float(measured[i] / measured[0]), float(predicted[i] / predicted[0]))",
        "the MI300X's ratios labelled T(r)/T(1) though its fewest rows are 7",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-mi300x-gh100-curve",
        "roofline/hardware.py",
        'fp8_tflops=2614.9,\n            curve="CDNA3",',
        'fp8_tflops=2614.9,\n            curve="GH100",',
        "the MI300X left on the GH100 curve it borrowed",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-mi300x-file-unread",
        "roofline/published_gemms.py",
        ', _DATA / "tunableop-mi300x-llama-2-7b-gemms.csv")',
        ",)",
        "the MI300X's timings never read",
        GEMM_TESTS,
    ),
    Mutant(
        "gemm-data-columns-swapped",
        "roofline/data/vidur-llama-2-7b-gemms.csv",
        "h100-sxm,4096,0.584,0.193,0.987,0.441",
        "h100-sxm,4096,0.584,0.193,0.441,0.987",
        "the up and down projections' medians swapped in one row",
        GEMM_TESTS,
    ),
    # ---- roofline/grid.py
    Mutant(
        "grid-q-off-by-one",
        "roofline/grid.py",
        "q = n + 1\n",
        "q = np.maximum(n, 1)\n",
        "a tree of n nodes verifies n tokens, not n + 1",
        GRID_TESTS,
    ),
    Mutant(
        "grid-heads-in-baseline",
        "roofline/grid.py",
        "base_heads = heads_shape if heads_in_baseline else None",
        "base_heads = heads_shape",
        "plain decoding always pays for the heads",
        GRID_TESTS,
    ),
    Mutant(
        "select-grid-empty-refused",
        "treeopt/selection.py",
        'GRID_OPTIONAL_EMPTY = ("overhead", "speedup")',
        "GRID_OPTIONAL_EMPTY = ()",
        "select --grid refuses the empty speedups of out-of-memory rows",
        ("tests/test_selection.py",),
    ),
    Mutant(
        "select-grid-inf-accepted",
        "treeopt/selection.py",
        "bad = np.isinf(v) | (values.isna() & grid[col].notna()).to_numpy()",
        "bad = (values.isna() & grid[col].notna()).to_numpy()",
        "an infinite speedup in a grid file taken as a number",
        ("tests/test_selection.py",),
    ),
    Mutant(
        "grid-ties-larger",
        "treeopt/selection.py",
        "ascending=[True, True, False, True]",
        "ascending=[True, True, False, False]",
        "ties go to the larger tree",
        GRID_TESTS,
    ),
    Mutant(
        "grid-heads-used-no-max",
        "roofline/grid.py",
        "np.maximum.accumulate(lengths)",
        "lengths",
        "heads a prefix uses = depth of its last node, not of its deepest",
        GRID_TESTS,
    ),
    Mutant(
        "grid-overhead-base",
        "roofline/grid.py",
        "overhead = step / step[:, :, :1]",
        "overhead = step / step[:, :, 1:2]",
        "overhead against the 1-node tree, not plain decoding",
        GRID_TESTS,
    ),
    # ---- treeopt/build.py
    Mutant(
        "build-greedy-sibling-rank",
        "treeopt/build.py",
        "-(pv * a[d - 1, r + 1])",
        "-(pv * a[d - 1, r])",
        "greedy values a sibling with its predecessor's rank",
        BUILD_TESTS,
    ),
    Mutant(
        "build-greedy-child-value",
        "treeopt/build.py",
        "-(-neg * a[d, 0])",
        "-(pv * a[d, 0])",
        "greedy values a child from its grandparent",
        BUILD_TESTS,
    ),
    Mutant(
        "build-optimal-sort-ascending",
        "treeopt/build.py",
        'np.argsort(-a[d, : widths[d]], kind="stable")',
        'np.argsort(a[d, : widths[d]], kind="stable")',
        "optimal builder sorts the ranks worst first",
        BUILD_TESTS + RELIABILITY_TESTS,
    ),
    Mutant(
        "build-optimal-no-relabel",
        "treeopt/build.py",
        "ranks = np.where(used, order[depth_of_column, np.maximum(sorted_ranks, 0)], -1)",
        "ranks = sorted_ranks",
        "optimal builder returns sorted labels, not the original ranks",
        BUILD_TESTS + RELIABILITY_TESTS,
    ),
    Mutant(
        "build-optimal-unsorted-output",
        "treeopt/build.py",
        "key=lambda vp: (-vp[0], len(vp[1]), vp[1])",
        "key=lambda vp: (len(vp[1]), -vp[0], vp[1])",
        "optimal tree's prefixes are not by value",
        RELIABILITY_TESTS,
    ),
    Mutant(
        "build-tau-no-bonus",
        "treeopt/build.py",
        "np.concatenate(([1.0], 1.0 + np.cumsum(vals)))",
        "np.concatenate(([1.0], np.cumsum(vals)))",
        "tau curve without the bonus token",
        BUILD_TESTS,
    ),
    Mutant(
        "build-joint-depth-off-by-one",
        "treeopt/build.py",
        "if c > 0 and len(p) <= D and",
        "if c > 0 and len(p) < D and",
        "joint builder drops prefixes at the maximum depth",
        BUILD_TESTS,
    ),
    Mutant(
        "build-capacity",
        "treeopt/build.py",
        "total += level",
        "total += w",
        "tree capacity adds widths instead of level sizes",
        BUILD_TESTS,
    ),
    # ---- size guards, the commit and checkpoint windows, the shared run_id
    Mutant(
        "tree-buffer-bytes-no-retrieve",
        "treeopt/tree.py",
        "q * q + 8 * (q + leaves) * (depth + 1) + 5 * 8 * q",
        "q * q + 8 * q * (depth + 1) + 5 * 8 * q",
        "buffer estimate forgets the retrieve indices",
        RELIABILITY_TESTS,
    ),
    Mutant(
        "runner-commit-not-deferred",
        "calibration/runner.py",
        "with deferred_interrupts():  # the batch",
        "with contextlib.nullcontext():  # the batch",
        "a Ctrl-C inside the count update splits a batch from its progress",
        RELIABILITY_TESTS,
    ),
    Mutant(
        "runner-checkpoint-removed-first",
        "calibration/runner.py",
        "keep_checkpoint=output is not None,",
        "keep_checkpoint=False,",
        "checkpoint removed before the outputs are written",
        RELIABILITY_TESTS,
    ),
    Mutant(
        "sidecar-run-id-unchecked",
        "treeopt/acceptance.py",
        "if (side_id is not None or table_id is not None) and side_id != table_id:",
        "if False:",
        "a sidecar of another run with equal counts passes",
        RELIABILITY_TESTS,
    ),
    # ---- treeopt/accuracy.py
    Mutant(
        "acc-node-values-head",
        "treeopt/accuracy.py",
        "vals[inside] *= acc[j, col[inside]]",
        "vals[inside] *= acc[0, col[inside]]",
        "node value uses head 1 at every depth",
        ACCURACY_TESTS,
    ),
    Mutant(
        "acc-joint-positions-depth",
        "treeopt/accuracy.py",
        "counts[ok] / table.positions[depth[ok] - 1]",
        "counts[ok] / table.positions[0]",
        "joint value normalised by head 1's positions at every depth",
        ACCURACY_TESTS,
    ),
    Mutant(
        "acc-miss-ends-prefix",
        "treeopt/accuracy.py",
        "alive = np.logical_and.accumulate((ranks >= 0) & (ranks < width), axis=1)",
        "alive = (ranks >= 0) & (ranks < width)",
        "a miss does not end the joint prefix",
        ACCURACY_TESTS,
    ),
    Mutant(
        "acc-per-head-normalisation",
        "treeopt/accuracy.py",
        "return self.hits / self.positions[:, None]",
        "return self.hits / self.positions[0]",
        "every head normalised by head 1's positions",
        ACCURACY_TESTS,
    ),
    Mutant(
        "acc-wilson-center",
        "treeopt/accuracy.py",
        "centre = (p + z2n / 2) / (1 + z2n)",
        "centre = (p + z2n) / (1 + z2n)",
        "Wilson interval centre off by a factor 2 in z^2/n",
        ("tests/test_shared_rules.py", "tests/test_accuracy.py"),
    ),
    # ---- treeopt/acceptance.py
    Mutant(
        "accept-no-bonus",
        "treeopt/acceptance.py",
        "return 1 + (_matched_nodes(ranks, tree) >= 0).sum(1)",
        "return (_matched_nodes(ranks, tree) >= 0).sum(1)",
        "accepted length without the bonus token",
        ACCEPTANCE_TESTS,
    ),
    Mutant(
        "accept-walk-advance",
        "treeopt/acceptance.py",
        "steps += a.size\n        ptr = ptr + a",
        "steps += a.size\n        ptr = ptr + 1",
        "the walk advances one row instead of the accepted run",
        ACCEPTANCE_TESTS,
    ),
    Mutant(
        "accept-start-rows",
        "treeopt/acceptance.py",
        "ends = np.minimum(ends, starts + int(start_rows))",
        "ends = np.minimum(ends, starts + int(start_rows) - 1)",
        "start_rows off by one",
        ACCEPTANCE_TESTS,
    ),
    Mutant(
        "accept-curve-prefix",
        "treeopt/acceptance.py",
        "a = 1 + (chain[ptr] < m[:, None]).sum(1)",
        "a = 1 + (chain[ptr] <= m[:, None]).sum(1)",
        "walked tau of prefix m counts node m too",
        ACCEPTANCE_TESTS,
    ),
    Mutant(
        "tau-joint-over-walked",
        "treeopt/tau.py",
        'return "walked" if self.walked is not None else "joint" if self.joint is not None else "independent"',
        'return "joint" if self.joint is not None else "walked" if self.walked is not None else "independent"',
        "decisions use the per-position joint tau where the walked tau is there",
        ("tests/test_tau.py",),
    ),
    # ---- killed by tests other branches add (paths as of this branch)
    Mutant(
        "pipeline-every-head",
        "treeopt/app/sweep.py",
        "used = proposal.prefix(n).depth if n else 0",
        "used = heads.num_heads if n else 0",
        "the run's prediction runs every head, not those the tree uses",
        ("tests/test_pipeline.py::test_step_predictor_charges_only_the_heads_the_tree_reaches",),
    ),
    Mutant(
        "sweep-first-sample",
        "calibration/sweep.py",
        "ratio = max(1.0, float(np.median(st / base))) if n else 1.0",
        "ratio = max(1.0, float(st[0] / base[0])) if n else 1.0",
        "sweep overhead from the first sample instead of the median",
        ("tests/test_sweep.py::test_overhead_is_the_median_of_same_round_ratios",),
    ),
    Mutant(
        "sweep-median-over-median",
        "calibration/sweep.py",
        "ratio = max(1.0, float(np.median(st / base))) if n else 1.0",
        "ratio = max(1.0, float(np.median(st) / np.median(base))) if n else 1.0",
        "sweep overhead as a ratio of medians instead of the median of same-round ratios",
        ("tests/test_sweep.py::test_overhead_is_the_median_of_same_round_ratios",),
    ),
    Mutant(
        "stats-tau-error-ignored",
        "treeopt/stats.py",
        "tau_draws = np.maximum(tau[None, :] + se[None, :] * z, 1.0)",
        "tau_draws = np.maximum(tau[None, :] + 0.0 * z, 1.0)",
        "speedup interval without tau's sampling error",
        ("tests/test_stats.py",),
    ),
    Mutant(
        "stats-unpaired-rounds",
        "treeopt/stats.py",
        "return samples / samples[:, :1]",
        "return samples / np.median(samples[:, :1])",
        "overhead from unpaired samples (drift no longer cancels)",
        ("tests/test_stats.py",),
    ),
    Mutant(
        "stats-second-moment",
        "treeopt/stats.py",
        "weight = 2 * np.asarray(depths, dtype=float) - 1",
        "weight = np.asarray(depths, dtype=float)",
        "tau standard error without the chain's ancestors",
        ("tests/test_stats.py",),
    ),
    Mutant(
        "stats-tau-se-batch-means-over-g",
        "treeopt/stats.py",
        "return curves.std(axis=0, ddof=1) / np.sqrt(g)",
        "return curves.std(axis=0, ddof=1) / g",
        "tau standard error by batch means divided by g, not sqrt(g) (4.5x too small)",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "stats-tau-se-batch-means-undivided",
        "treeopt/stats.py",
        "return curves.std(axis=0, ddof=1) / np.sqrt(g)",
        "return curves.std(axis=0, ddof=1) * 1",
        "tau standard error is the spread of one group's curve, not of their mean (4.5x too large)",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "stats-tau-se-batch-means-over-sequences",
        "treeopt/stats.py",
        "return curves.std(axis=0, ddof=1) / np.sqrt(g)",
        "return curves.std(axis=0, ddof=1) / np.sqrt(ids.size)",
        "batch means divided by sqrt(number of sequences), not sqrt(groups)",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "stats-tau-draw-per-size",
        "treeopt/stats.py",
        "z = rng.standard_normal((draws, 1))",
        "z = rng.standard_normal((draws, tau.size))",
        "tau drawn independently per tree size (nested prefixes' errors no longer move together)",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "stats-monotone-no-slack",
        "treeopt/stats.py",
        "falls = hi < 1.0 - MONOTONE_SLACK",
        "falls = hi < 1.0",
        "a tree 0.5% faster than plain (timer resolution) flagged as impossible",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "stats-monotone-slack-5pct",
        "treeopt/stats.py",
        "MONOTONE_SLACK = 0.01",
        "MONOTONE_SLACK = 0.05",
        "a tree 2% faster than plain (or a speedup 2% above tau) not flagged",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "selection-above-tau-no-slack",
        "treeopt/selection.py",
        "> tau_hi * (1 + MONOTONE_SLACK)",
        "> tau_hi",
        "a speedup 0.5% above tau's upper bound flagged unreliable at selection",
        ("tests/test_stats_sources.py",),
    ),
    Mutant(
        "stats-difference-test-ties",
        "treeopt/stats.py",
        "    as_good = shippable & trees & within[:, best]",
        "    as_good = shippable & trees & (hi >= lo[best])",
        "a smaller tree taken where the intervals overlap, not where it is within the tolerance",
        ("tests/test_selection_noise.py", "tests/test_stats.py"),
    ),
    Mutant(
        "stats-open-cell-called-decided",
        "treeopt/stats.py",
        "    if as_good.any() and settled[chosen]:",
        "    if as_good.any():",
        "a cell is decided although another tree may still be better by more than the tolerance",
        ("tests/test_selection_noise.py", "tests/test_stats.py"),
    ),
    Mutant(
        "stats-tolerance-ignored",
        "treeopt/stats.py",
        "    within = (low >= 1.0 - tolerance) | np.eye(size, dtype=bool)",
        "    within = (low >= 0.5) | np.eye(size, dtype=bool)",
        "any two trees within 50% of each other count as the same answer",
        ("tests/test_selection_noise.py", "tests/test_stats.py"),
    ),
    Mutant(
        "stats-undecided-ships-the-best",
        "treeopt/stats.py",
        "chosen = int(np.argmax(np.where(shippable, point, -np.inf)))",
        "chosen = best",
        "an undecided cell ships its best point estimate even where it may be a slowdown",
        ("tests/test_stats.py",),
    ),
    Mutant(
        "stats-rounds-needed-linear",
        "treeopt/stats.py",
        "need = np.where(p > target, rounds * (h / (p - target)) ** 2, np.inf)",
        "need = np.where(p > target, rounds * (h / (p - target)), np.inf)",
        "rounds to settle scaled with the half-width, not its square",
        ("tests/test_stats.py",),
    ),
    Mutant(
        "stats-no-sequential-correction",
        "treeopt/stats.py",
        "return 1.0 - (1.0 - confidence) / max(int(looks), 1)",
        "return confidence",
        "a sweep that looks several times keeps the single-look confidence",
        ("tests/test_sweep.py::test_adaptive_rounds_until_decided",),
    ),
    Mutant(
        "stats-speedup-above-tau",
        "treeopt/stats.py",
        "return np.where(overhead < 1.0 - MONOTONE_SLACK, np.nan, tau / np.maximum(overhead, 1.0))",
        "return tau / overhead",
        "a predicted tree step cheaper than the plain step gives a speedup above tau",
        ("tests/test_stats.py",),
    ),
    Mutant(
        "stats-fit-consistency-no-band",
        "treeopt/stats.py",
        "    band = np.log1p(tolerance)",
        "    band = 0.0",
        "a cell counts as consistent with the pooled fit only if the fit is exact",
        ("tests/test_pooled.py",),
    ),
    Mutant(
        "pooled-decides-inconsistent-cells",
        "treeopt/app/pooled.py",
        'if cell.reason in ("undecided", "best bound") and consistent and by_fit.settled:',
        'if cell.reason in ("undecided", "best bound") and by_fit.settled:',
        "the pooled fit decides a cell whose measurement it does not describe",
        ("tests/test_pooled.py",),
    ),
    Mutant(
        "stats-shipped-interval-single-level",
        "treeopt/stats.py",
        "return sequential_confidence(max(int(trees), 1), confidence)",
        "return confidence",
        "the shipped tree's interval at the single-size level, biased towards the draw that picked it",
        ("tests/test_selection_noise.py",),
    ),
    Mutant(
        "mix-own-best-not-the-selection",
        "treeopt/mix.py",
        "                best_nodes[i] = n",
        "                pass",
        "the mix block reports each cell's argmax, not the tree the selection ships",
        ("tests/test_selection_report.py",),
    ),
    Mutant(
        "hwcal-attention-flops",
        "roofline/hwfit.py",
        "4.0 * np.asarray(batch, dtype=float) * shape.heads * np.asarray(query_rows",
        "2.0 * np.asarray(batch, dtype=float) * shape.heads * np.asarray(query_rows",
        "hardware calibration fits attention with half its FLOPs",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "hwcal-attention-block",
        "roofline/hwfit.py",
        "return max(0.0, (many.time_s - many.batch * one.time_s) / (many.batch * shape.heads))",
        "return max(0.0, (many.time_s - one.time_s) / (many.batch * shape.heads))",
        "hardware calibration's attention block overhead without the B x one-sequence part",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "engine-vllm-undrafted-sizes",
        "roofline/grid.py",
        "    if per_size.drafted is not None:\n        speedup = np.where(",
        "    if False:\n        speedup = np.where(",
        "the grid may pick a vLLM tree size that vLLM would not draft as written",
        ENGINE_TESTS,
    ),
    Mutant(
        "engine-vllm-children",
        "treeopt/engines.py",
        "return tuple(int(c) for c in hist // previous)",
        "return tuple(int(c) for c in -(-hist // previous))",
        "vLLM's children per node rounded up instead of n_l // n_{l-1}",
        ENGINE_TESTS,
    ),
    Mutant(
        "engine-trtllm-overrun",
        "treeopt/engines.py",
        "return nodes + 1 if nodes > 0 and nodes % 32 == 0 else nodes",
        "return nodes",
        "TensorRT-LLM max_draft_len ignores the packed-mask overrun",
        ENGINE_TESTS,
    ),
    Mutant(
        "engine-trtllm-rank-sixteen-aborts",
        "treeopt/engines.py",
        "if worst > TRTLLM_PREFIX_MAX_VALUE or tree.depth > depth:",
        "if worst >= TRTLLM_PREFIX_MAX_VALUE or tree.depth > depth:",
        "TensorRT-LLM refuses a tree with rank 16 (drafted unless its key collides) as if the C++ runtime aborted",
        ENGINE_TESTS + ("tests/test_engine_runtimes.py",),
    ),
    Mutant(
        "engine-trtllm-key-or",
        "treeopt/engines.py",
        "        key |= term\n",
        "        key += term\n",
        "the C++ runtime's prefix key adds ranks instead of OR-ing them, so rank 16 never collides",
        ("tests/test_engine_runtimes.py",),
    ),
    Mutant(
        "engine-sglang-raw-scores",
        "treeopt/engines.py",
        "    return np.minimum.accumulate(np.asarray(acc, dtype=np.float64), axis=1)",
        "    return np.asarray(acc, dtype=np.float64)",
        "SGLang's nodes picked by the raw table, so a rank can be drafted without the rank before it",
        ("tests/test_engine_runtimes.py",),
    ),
    Mutant(
        "engine-for-drafter-medusa-vllm",
        "treeopt/engine_data.py",
        '        return _differs(asked, "vllm-medusa@0.32", ENGINES["vllm-medusa@0.32"].note)',
        '        return _differs(asked, "vllm@0.20", ENGINES["vllm-medusa@0.32"].note)',
        "vLLM <= 0.20 offered its EAGLE tree for Medusa heads it serves only as a chain",
        ("tests/test_engine_runtimes.py",),
    ),
    Mutant(
        "table-drafter-kind",
        "treeopt/accuracy.py",
        '        kind = heads.split(":", 1)[0]',
        '        kind = heads.split(":", 1)[-1]',
        "the drafter of an accuracy table read from the wrong side of KIND:SPEC",
        ("tests/test_engine_runtimes.py",),
    ),
    Mutant(
        "stale-temporaries-family",
        "treeopt/fileio.py",
        '    stem = output.name.split(".", 1)[0]',
        "    stem = output.name",
        "a writer's lock removes only its own file's temporaries, not its sweep's metadata and samples",
        RELIABILITY_TESTS,
    ),
    Mutant(
        "source-date-epoch-unchecked",
        "treeopt/cli/__init__.py",
        "        _check_environment()\n",
        "",
        "a SOURCE_DATE_EPOCH that is no integer reaches numpy's import as a traceback",
        ("tests/test_cli_startup.py",),
    ),
    Mutant(
        "engine-for-table-ignores-drafter",
        "treeopt/tree_api.py",
        "    kind = table.drafter if table is not None else None",
        "    kind = None",
        "build/check/select give vLLM's EAGLE tree for Medusa statistics, with no note",
        ("tests/test_engine_runtimes.py",),
    ),
    Mutant(
        "run-engine-hydra-family-dropped",
        "treeopt/app/stages/proposal.py",
        '    if table.drafter == "hydra":',
        '    if table.drafter == "hydra-none":',
        "a Hydra run searches trees Hydra's own code does not draft",
        ("tests/test_demo_drafters.py",),
    ),
    Mutant(
        "select-pooled-skipped",
        "treeopt/api.py",
        '        if pooled and by == "measured":',
        '        if pooled and by == "predicted":',
        "select --sweep leaves out the pooled fit treeopt run adds",
        ("tests/test_select_pooled.py",),
    ),
    Mutant(
        "engine-sglang-beams",
        "treeopt/engines.py",
        'keep = np.argsort(-flat, kind="stable")[:topk]',
        "keep = np.arange(topk)",
        "SGLang expands the first beams instead of the best-scored",
        ENGINE_TESTS,
    ),
    Mutant(
        "engine-grounded-size",
        "treeopt/family_build.py",
        "min_size = 2 if grounded else 1",
        "min_size = 1",
        "Hydra's optimum lets an expanded rank be a leaf",
        ENGINE_TESTS,
    ),
    Mutant(
        "engine-left-closed",
        "treeopt/family_build.py",
        "if d + 1 <= limits.left_closed_depth:",
        "if d + 1 < limits.left_closed_depth:",
        "family greedy forgets the left-closed rule at its last depth",
        ENGINE_TESTS,
    ),
    # ---- treeopt/mix.py: one tree for a traffic mix; calibration/medusa_import.py normalisation
    Mutant(
        "mix-mean-speedup",
        "treeopt/mix.py",
        "gain = weight[:, None] * plain_tps[:, None] * (speed - threshold)",
        "gain = weight[:, None] * (speed - threshold)",
        "the mix weighs speedups, not tokens per second",
        MIX_TESTS,
    ),
    Mutant(
        "mix-no-cutoff-cumsum",
        "treeopt/mix.py",
        "np.cumsum(per_batch, axis=0)",
        "per_batch",
        "speculation on for one batch only instead of every batch up to the cut-off",
        MIX_TESTS,
    ),
    Mutant(
        "mix-loss-inverted",
        "treeopt/mix.py",
        "float(1.0 - ms / bs)",
        "float(1.0 - bs / ms)",
        "the per-cell loss inverted",
        MIX_TESTS,
    ),
    Mutant(
        "import-medusa-count",
        "calibration/medusa_import.py",
        "MEDUSA_GEN_RESULTS_COUNT = 16100",
        "MEDUSA_GEN_RESULTS_COUNT = 16000",
        "gen_results.py's count wrong",
        ("tests/test_checkpoint_layouts.py",),
    ),
    # ---- sequentially dependent drafters: forwards, depth-by-depth drafting, teacher forcing
    Mutant(
        "drafter-mlp-state-weight",
        "calibration/drafters/mlp_speculator.py",
        "self.state_weight = 0.5 ** (0.5 / n_predict)",
        "self.state_weight = 0.5 ** (1.0 / n_predict)",
        "the MLP speculator's state weight loses its square root",
        DRAFTER_TESTS,
    ),
    Mutant(
        "drafter-mlp-emb-weight",
        "calibration/drafters/mlp_speculator.py",
        "math.sqrt((1 - self.state_weight**2) * inner_dim / 2)",
        "math.sqrt(1 - self.state_weight**2)",
        "the MLP speculator's embedding weight forgets inner_dim / 2",
        DRAFTER_TESTS,
    ),
    Mutant(
        "strict-json-nan-kept",
        "treeopt/fileio.py",
        "if isinstance(obj, float) and not math.isfinite(obj):",
        "if isinstance(obj, float) and math.isnan(obj) and False:",
        "a NaN reaches the JSON writer (invalid JSON, or a crash with allow_nan=False)",
        ("tests/test_strict_json.py",),
    ),
    Mutant(
        "strict-json-prediction-reason-dropped",
        "treeopt/selection.py",
        "missing = None if math.isfinite(figure) else missing_prediction_reason(pred_overhead.get(k, np.nan))",
        "missing = None",
        "a null predicted speedup without the reason beside it",
        ("tests/test_strict_json.py",),
    ),
    Mutant(
        "clamp-reported-as-measured",
        "treeopt/selection_notes.py",
        'if not cell.nodes or cell.measured_by == "end-to-end" or not raw < 1.0:',
        'if not cell.nodes or cell.measured_by == "end-to-end" or not raw < 0.99:',
        "a shipped speedup that is tau from a ratio clamped at 1 (0.995 measured) is reported as measured",
        ("tests/test_plain_step_slower.py",),
    ),
    Mutant(
        "clamp-plain-slower-not-named",
        "treeopt/selection.py",
        '"plain_slower_nodes": nodes[(nodes > 0) & (raw < 1.0 - MONOTONE_SLACK) & ~reliable].tolist(),',
        '"plain_slower_nodes": nodes[(nodes > 0) & (raw > 1.0 - MONOTONE_SLACK) & ~reliable].tolist(),',
        "trees flagged for beating the plain step are blamed on noise (quieter machine advice)",
        ("tests/test_plain_step_slower.py",),
    ),
    Mutant(
        "heads-never-match-ignored",
        "treeopt/app/stages/calibrate.py",
        "if top1.size == 0 or float(top1.max()) >= NEVER_MATCHES_TOP1:",
        "if top1.size == 0 or float(top1.max()) >= 0.0:",
        "heads that never match go on to the sweep and validation",
        ("tests/test_heads_never_match.py",),
    ),
    Mutant(
        "answer-tolerance-unexplained",
        "treeopt/app/run_answer.py",
        'if reason == "within-tolerance":',
        'if reason == "within tolerance":',
        "a smaller tree shipped within the tolerance of a larger one is not explained in the answer",
        ("tests/test_run_answer.py",),
    ),
    Mutant(
        "serving-dtype-fp32-priced",
        "treeopt/app/models.py",
        'if shape.dtype != "fp32":',
        'if shape.dtype != "fp16":',
        "an fp32 save_pretrained config is priced in fp32 without a word",
        ("tests/test_serving_dtype.py",),
    ),
    Mutant(
        "attention-without-fallback",
        "calibration/model_calls.py",
        "return build(attn_implementation=ATTENTION_IMPLEMENTATIONS[-1])",
        "return build(attn_implementation=ATTENTION_IMPLEMENTATIONS[0])",
        "a model that refuses sdpa (Gemma-2) is never retried with eager attention",
        ("tests/test_architectures_in_step.py::test_gemma2_loads_with_eager_attention",),
    ),
    Mutant(
        "report-path-absolute",
        "treeopt/fileio.py",
        "return resolved.relative_to(root).as_posix()",
        "return os.fspath(resolved)",
        "reports record the machine's absolute path of the model config",
        ("tests/test_report_paths.py",),
    ),
    Mutant(
        "draft-model-steps-off-by-one",
        "treeopt/app/run.py",
        'if _drafter_kind(s) == "draft-model" and s.steps < (s.num_heads or DEFAULT_MAX_DEPTH) + 1:',
        'if _drafter_kind(s) == "draft-model" and s.steps < (s.num_heads or DEFAULT_MAX_DEPTH):',
        "a draft model's --steps one short of a label for every draft position is loaded and calibrated",
        ("tests/test_architectures_in_step.py::test_a_draft_models_steps_are_refused_before_loading_in_its_own_terms",),
    ),
    Mutant(
        "fileio-rows-one-level-deep",
        "treeopt/fileio.py",
        "if isinstance(value, list) and value and _depth(value) > 2:",
        "if isinstance(value, list) and value and _depth(value) > 1:",
        "a joint prefix [[0, 1], 5] is split over lines, not kept as one row",
        ("tests/test_fileio.py",),
    ),
    Mutant(
        "memory-kv-without-keys-and-values",
        "calibration/device_memory.py",
        "per_position = 2 * config.num_hidden_layers * kv_heads * head_dim",
        "per_position = config.num_hidden_layers * kv_heads * head_dim",
        "the KV cache counted for keys only",
        ("tests/test_device_memory.py",),
    ),
    Mutant(
        "memory-positions-limit-off-by-one",
        "calibration/device_memory.py",
        "if limit is not None and longest > limit:",
        "if limit is not None and longest >= limit:",
        "a cell that fills the model's positions exactly is refused",
        ("tests/test_device_memory.py",),
    ),
    Mutant(
        "hydra-config-sizes-unchecked",
        "calibration/drafters/hydra.py",
        "if name in config and config[name] != size:",
        "if name in config and config[name] != size and name == 'vocab_size':",
        "a Hydra config whose hidden_size is not its weights' loads without a word",
        ("tests/test_bad_inputs.py::test_bad_input[hydra-hidden-size-not-the-weights]",),
    ),
    Mutant(
        "run-max-prompts-dropped",
        "treeopt/app/stages/calibrate.py",
        "seed=s.seed, max_prompts=s.max_prompts)",
        "seed=s.seed)",
        "treeopt run --max-prompts calibrates on every prompt",
        ("tests/test_pipeline.py::test_run_calibrates_on_the_first_max_prompts",),
    ),
    Mutant(
        "drafter-mlp-norm-subtracts-mean",
        "calibration/drafters/mlp_speculator.py",
        "x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
        "x = x - x.mean(-1, keepdim=True)\n        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
        "the speculator's norm is the paper's mean-centred LayerNorm, not the LayerNormParameterized IBM ships",
        DRAFTER_TESTS,
    ),
    Mutant(
        "drafter-mlp-input-norm-skipped",
        "calibration/drafters/mlp_speculator.py",
        "hidden = self.input_norm(hidden) / math.sqrt(2)",
        "hidden = hidden / math.sqrt(2)",
        "scale_input divides by sqrt(2) without normalising the base model's hidden state",
        DRAFTER_TESTS,
    ),
    Mutant(
        "drafter-hydra-path-order",
        "calibration/drafters/hydra.py",
        "torch.cat([carry[0], self.input_embed_fn(tokens)], dim=-1)",
        "torch.cat([self.input_embed_fn(tokens), carry[0]], dim=-1)",
        "a Hydra head reads the path embeddings in the wrong order",
        DRAFTER_TESTS,
    ),
    Mutant(
        "drafter-parent-slot",
        "calibration/tree_drafting.py",
        "children = top[:, level.parent_slot, level.rank]",
        "children = top[:, 0 * level.parent_slot, level.rank]",
        "every node of a depth takes its children from the first parent",
        DRAFTER_TESTS,
    ),
    Mutant(
        "drafter-teacher-forcing",
        "calibration/labels.py",
        "state = drafter.child_state(carry, k, labels)",
        "state = drafter.child_state(carry, k, logits.argmax(-1))",
        "calibration follows the drafter's own guesses, not the true path",
        DRAFTER_TESTS,
    ),
    # ---- EAGLE-3 and EAGLE-1/2 drafts
    Mutant(
        "eagle-wrong-aux-layer",
        "calibration/drafters/eagle.py",
        "return torch.cat([hidden_states[i] for i in self.aux_layer_ids], dim=-1)",
        "return torch.cat([hidden_states[i + 1] for i in self.aux_layer_ids], dim=-1)",
        "EAGLE-3 reads the output of each auxiliary layer, not its input (one layer off)",
        ("tests/test_eagle.py::test_calibration_ranks_equal_slow_per_position_reference",),
    ),
    Mutant(
        "eagle-d2t-ignored",
        "calibration/drafters/eagle.py",
        "full[..., self.draft_to_target] = draft",
        "full[..., : self.draft_vocab_size] = draft",
        "a reduced draft vocabulary's ids are taken for target ids (d2t ignored)",
        EAGLE_TESTS,
    ),
    Mutant(
        "eagle-later-depth-reuses-fc",
        "calibration/drafters/eagle.py",
        "out, _, positions, seq, ctx_end, path_k, path_v = carry",
        "_, out, positions, seq, ctx_end, path_k, path_v = carry",
        "later depths feed back the first depth's fc output instead of the draft's own output",
        EAGLE_TESTS,
    ),
    Mutant(
        "eagle-root-sees-its-own-pair",
        "calibration/drafters/eagle.py",
        "seen = valid[seq] & (slots[None] < ctx_end[:, None])",
        "seen = valid[seq] & (slots[None] <= ctx_end[:, None])",
        "a calibrated row's root also sees the context's copy of its own pair",
        ("tests/test_eagle.py::test_calibration_ranks_equal_slow_per_position_reference",),
    ),
    Mutant(
        "eagle-decoder-pairs-own-feature",
        "calibration/decoder.py",
        "features = torch.cat([state.hidden[:, None], path_features[:, : keep - 1]], dim=1)",
        "features = path_features[:, :keep]",
        "the decoder pairs each kept token with its own feature, not the one before it",
        ("tests/test_eagle.py::test_the_draft_cache_holds_every_pair_of_the_sequence_so_far",),
    ),
    Mutant(
        "eagle-cost-fc-every-depth",
        "roofline/ops.py",
        "fc_in = (aux if d == 0 else 0.0) if eagle3 else 2 * h",
        "fc_in = aux if eagle3 else 2 * h",
        "the roofline charges EAGLE-3's fc at every depth, not the first only",
        ("tests/test_eagle.py::test_roofline_prices_each_depth_as_one_layer_at_the_drafts_width",),
    ),
    # ---- SGLang's dynamic EAGLE tree: pool, draft, tau from recorded pools, the decoder
    Mutant(
        "sglang-dynamic-scores-not-cumulative",
        "calibration/sglang_drafting.py",
        "expanded = (beam_score[:, :, None] * p.view(rows, topk, topk)).reshape(rows, topk * topk)",
        "expanded = (0 * beam_score[:, :, None] + p.view(rows, topk, topk)).reshape(rows, topk * topk)",
        "a later step scores a child by its own probability, not the product along its path",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-dynamic-beam-state-wrong-parent",
        "calibration/sglang_drafting.py",
        "beam_rows = (row_base + best // topk).reshape(-1)",
        "beam_rows = (row_base + best % topk).reshape(-1)",
        "a beam drafts its children from another beam's state",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-dynamic-path-any-parent",
        "calibration/sglang_drafting.py",
        "match = (pool.tokens[:, lo:hi] == labels[:, d, None]) & (pool.parent[:, lo:hi] == cur[:, None])",
        "match = pool.tokens[:, lo:hi] == labels[:, d, None]",
        "the recorded path takes the label's token under any beam, not under the path's own node",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-dynamic-one-draft-too-many",
        "treeopt/dynamic_tree.py",
        "drafted = present & (higher < num_draft_tokens - 1)",
        "drafted = present & (higher <= num_draft_tokens - 1)",
        "tau counts num_draft_tokens drafted nodes, the root as one of them forgotten",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-dynamic-accepts-past-a-gap",
        "treeopt/dynamic_tree.py",
        "return np.cumprod(drafted, axis=1).sum(1)",
        "return drafted.sum(1)",
        "a node counts as accepted although a node above it on the path was not drafted",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-decoder-accepts-orphans",
        "calibration/sglang_decoder.py",
        "accepted = match & accepted.gather(1, self.parent)",
        "accepted = match | accepted.gather(1, self.parent) & False",
        "a node the base model agrees with is accepted under a rejected parent",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-decoder-mask-parent-only",
        "calibration/sglang_decoder.py",
        "cur = parent.gather(1, cur)",
        "cur = parent",
        "a drafted node attends to its parent but not to the ancestors above it",
        SGLANG_DYNAMIC_TESTS,
    ),
    Mutant(
        "sglang-tau-walk-not-cut",
        "treeopt/app/sglang_tau.py",
        "settings.steps, settings.topk, n, start_rows=settings.new_tokens - 1)",
        "settings.steps, settings.topk, n, start_rows=None)",
        "treeopt sglang-tau walks steps past the generated tokens the decoder stops at",
        ("tests/test_sglang_dynamic.py::test_the_command_predicts_what_the_decoder_measures_on_the_same_prompts",),
    ),
    # ---- Hydra++'s prefix layer: its forward, calibration, decoder cache and cost
    Mutant(
        "prefix-not-causal",
        "calibration/drafters/hydra.py",
        "new = (causal[None] & valid[:, None, :]) | eye[None]",
        "new = valid[:, None, :].expand(b, n, n) | eye[None]",
        "the prefix layer's tokens see the tokens after them",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-padding-visible",
        "calibration/drafters/hydra.py",
        "new = (causal[None] & valid[:, None, :]) | eye[None]",
        "new = causal[None].expand(b, n, n) | eye[None]",
        "the prefix layer attends to left padding",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-past-unseen",
        "calibration/drafters/hydra.py",
        "past = past_valid[:, None, :].expand(b, n, past_valid.shape[1])",
        "past = past_valid[:, None, :].expand(b, n, past_valid.shape[1]) & False",
        "the prefix layer's new tokens do not see its cache",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-no-final-norm",
        "calibration/drafters/hydra.py",
        "return self.norm(out)",
        "return out",
        "the prefix layer's output skips its final RMSNorm",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-calibration-padded-positions",
        "calibration/labels.py",
        "hidden = heads.context_states(hidden, mask[:, :-2].to(device).bool(), pos[:, :-2].to(device))",
        "hidden = heads.context_states(hidden, mask[:, :-2].to(device).bool(), 0 * pos[:, :-2].to(device))",
        "calibration runs the prefix layer at position 0 for every token",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-decoder-positions",
        "calibration/decoder.py",
        "state.next_pos[:, None] + self._iota(keep)[None],",
        "state.next_pos[:, None] + 0 * self._iota(keep)[None],",
        "the kept tokens all enter the prefix layer at the root's position",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-decoder-first-kept",
        "calibration/decoder.py",
        "        )[bi, n_keep - 1]",
        "        )[bi, 0]",
        "the next step drafts from the prefix output at the step's root, not its last kept token",
        PREFIX_TESTS,
    ),
    Mutant(
        "decoder-draft-from-root",
        "calibration/decoder.py",
        "return path_hidden[bi, n_keep - 1]  # the last accepted token drafts next",
        "return path_hidden[bi, 0]  # the last accepted token drafts next",
        "the next step drafts from the step's root's hidden state, not its last accepted token's",
        ("tests/test_decoder.py::test_the_next_draft_reads_the_last_accepted_tokens_hidden_state",),
    ),
    Mutant(
        "prefix-decoder-drop",
        "calibration/decoder.py",
        "caches = [c for c in (state.cache, state.draft_cache) if c is not None]",
        "caches = [state.cache]",
        "a finished sequence leaves the target's cache but not the prefix layer's",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-cost-one-token",
        "roofline/ops.py",
        "shape.with_layers(1), None, b, tokens + zeros, s,",
        "shape.with_layers(1), None, b, 1.0 + zeros, s,",
        "the prefix layer is charged one token per sequence, not the accepted ones",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-cost-no-norm",
        "roofline/ops.py",
        'if o.name in LAYER_OPS or o.name in MLA_LAYER_OPS or o.name == "final_norm"',
        "if o.name in LAYER_OPS or o.name in MLA_LAYER_OPS",
        "the prefix layer's final norm is free",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-memory-no-norm",
        "roofline/latency.py",
        "weights += (one_layer.layer_params + shape.hidden) * beta",
        "weights += one_layer.layer_params * beta",
        "the prefix layer's final norm weighs nothing",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-memory-cache-context-only",
        "roofline/latency.py",
        "kv = kv + b * (s + q) * one_layer.kv_bytes_per_token",
        "kv = kv + b * s * one_layer.kv_bytes_per_token",
        "the prefix layer's cache leaves out the step's tokens",
        PREFIX_TESTS,
    ),
    Mutant(
        "prefix-grid-tau",
        "roofline/grid.py",
        "prefix_tokens = tau[None, None, :] if reads_accepted",
        "prefix_tokens = 1.0 + 0 * tau[None, None, :] if reads_accepted",
        "the grid charges the prefix layer one token, not tau",
        PREFIX_TESTS,
    ),
    # ---- draft-model speculative decoding (docs/decoder.md#draft-models)
    Mutant(
        "spec-chain-residual",
        "calibration/speculative.py",
        "residual = (target_probs[rows, n] - q_ext[rows, n]).clamp(min=0)",
        "residual = target_probs[rows, n]",
        "a chain rejection resamples from p instead of norm(max(0, p - q))",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "spec-chain-ratio",
        "calibration/speculative.py",
        "kept = _uniform((b, g), q_x, generator) * q_x < p_x",
        "kept = _uniform((b, g), q_x, generator) < p_x",
        "a draft is kept with probability p instead of min(1, p/q)",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "spec-chain-first-rejection",
        "calibration/speculative.py",
        "n = kept.long().cumprod(-1).sum(-1)",
        "n = kept.long().sum(-1)",
        "drafts after a rejection still count",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "spec-rrs-q-not-renormalised",
        "calibration/speculative.py",
        "qd = torch.where(rejected, q_without, qd)",
        "qd = qd",
        "recursive rejection keeps the rejected child in q",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "spec-rrs-residual",
        "calibration/speculative.py",
        "p = torch.where(rejected, residual, p)",
        "p = p",
        "recursive rejection does not take the residual after a rejection",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "spec-gumbel-with-replacement",
        "calibration/drafters/draft_model.py",
        "keys = torch.log(probs.clamp(min=1e-30)) - torch.log(-torch.log(u))",
        "keys = torch.log(probs.clamp(min=1e-30))",
        "children are the top-k, not draws from q",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "draft-rank-shift",
        "calibration/drafters/draft_model.py",
        "cols = np.minimum(col[:, None] + depth[None] + 1, per_position.shape[1] - 1)",
        "cols = np.minimum(col[:, None] + depth[None], per_position.shape[1] - 1)",
        "depth d reads the draft one position early",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "draft-alpha-max",
        "calibration/drafters/draft_model.py",
        "torch.minimum(p, q).sum(-1)",
        "torch.maximum(p, q).sum(-1)",
        "alpha sums max(p, q)",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "draft-tau-iid",
        "calibration/drafters/draft_model.py",
        "(1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)",
        "(1.0 - alpha ** gamma) / (1.0 - alpha)",
        "the i.i.d. chain tau counts one draft fewer",
        DRAFT_MODEL_TESTS,
    ),
    Mutant(
        "chain-tau-sum",
        "treeopt/chain.py",
        "return 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(alpha))])",
        "return 1.0 + np.concatenate([[0.0], np.cumsum(alpha)])",
        "chain tau adds alphas instead of the probability of reaching each depth",
        GAMMA_TESTS,
    ),
    Mutant(
        "chain-alpha-conditional",
        "treeopt/chain.py",
        "alpha = (reach / np.concatenate([[1.0], reach[:-1]]).clip(min=1e-300)).clip(0, 1)",
        "alpha = reach",
        "the sidecar stores reach probabilities as conditional alphas",
        GAMMA_TESTS,
    ),
    Mutant(
        "gamma-draft-context",
        "roofline/speculative.py",
        "StepShape(batch, 1, context + passes, attention)",
        "StepShape(batch, 1, context, attention)",
        "every draft pass reads the same context",
        GAMMA_TESTS,
    ),
    Mutant(
        "gamma-verify-tokens",
        "roofline/speculative.py",
        "verification = StepShape(batch, g + 1, context, attention)",
        "verification = StepShape(batch, np.maximum(g, 1), context, attention)",
        "verification reads gamma tokens, not gamma + 1",
        GAMMA_TESTS,
    ),
    Mutant(
        "gamma-speedup",
        "roofline/speculative.py",
        '"speedup": tau * plain / step',
        '"speedup": tau * plain / verify',
        "speedup ignores the draft's passes",
        GAMMA_TESTS,
    ),
    # ---- draft-model trees under rejection sampling (docs/statistics.md#positional-acceptance-of-a-tree;
    # docs/performance-model.md#draft-model-trees)
    Mutant(
        "tree-accept-no-residual",
        "calibration/drafters/draft_model.py",
        "residual = (p - q).clamp(min=0)",
        "residual = p",
        "positional acceptance tries later children against p, not the residual",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-accept-q-keeps-rejected",
        "calibration/drafters/draft_model.py",
        "q = q.scatter(1, x, 0.0)",
        "q = q",
        "positional acceptance keeps the rejected child in q",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-accept-reach",
        "calibration/drafters/draft_model.py",
        "reach = reach * (1.0 - kept)",
        "reach = reach",
        "a later child is tried even when an earlier one was kept",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-accept-first-sampled",
        "calibration/drafters/draft_model.py",
        "mean[:, 0] = torch.minimum(p2, q2).sum(-1).double()",
        "mean[:, 0] = mean[:, 0]",
        "the first child's acceptance is a Monte Carlo estimate, not sum min(p, q)",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-table-unweighted",
        "treeopt/chain.py",
        "weight = np.concatenate([np.ones((n, 1)), np.cumprod(alpha_rows, axis=1)[:, :-1]], axis=1)",
        "weight = np.ones((n, k))",
        "the per-child table weighs every row alike, not by its probability of reaching the depth",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-tau-no-packing",
        "treeopt/chain.py",
        "paths = tuple(tuple(position[p[: i + 1]] for i in range(len(p))) for p in tree.paths)",
        "paths = tree.paths",
        "a child's rank, not its draw position, picks its acceptance",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-tau-product",
        "treeopt/chain.py",
        "return float(1.0 + np.prod(factors, axis=1).sum())",
        "return float(1.0 + factors.min(axis=1).sum())",
        "a node's acceptance is its weakest link, not the product along its path",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-tau-stderr-path",
        "treeopt/chain.py",
        "np.add.at(grad, (depth[used], m[used]), (before * after)[used])",
        "np.add.at(grad, (depth[used], m[used]), before[used])",
        "tau's standard error misses the factors below each entry",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-proposal-optimal-always",
        "treeopt/chain.py",
        "if np.all(np.diff(a, axis=1) <= 0):",
        "if True:",
        "the exact optimum is used where it may skip a draw position",
        TREE_ACCEPT_TESTS,
    ),
    Mutant(
        "tree-cost-reads-own-level",
        "roofline/speculative.py",
        "reads = np.concatenate([np.ones((len(w), 1), np.int64), w[:, :-1]], axis=1)",
        "reads = w",
        "draft pass d reads the nodes of depth d, not of depth d - 1",
        TREE_COST_TESTS,
    ),
    Mutant(
        "tree-cost-context",
        "roofline/speculative.py",
        "np.maximum(reads, 1), context + read_before, attention)",
        "np.maximum(reads, 1), context, attention)",
        "every draft pass of a tree reads the same context",
        TREE_COST_TESTS,
    ),
    Mutant(
        "tree-cost-verify-tokens",
        "roofline/speculative.py",
        "verification = StepShape(batch, nodes + 1, context, attention)",
        "verification = StepShape(batch, np.maximum(nodes, 1), context, attention)",
        "the target verifies n tokens of a tree, not n + 1",
        TREE_COST_TESTS,
    ),
    Mutant(
        "tree-sweep-predictor-prefix",
        "treeopt/app/sweep.py",
        "level_widths=widths[tokens - 1]",
        "level_widths=widths[-1]",
        "the sweep predicts the whole proposal for every tree size",
        TREE_COST_TESTS,
    ),
    Mutant(
        "tree-validation-stderr",
        "treeopt/app/draft_model.py",
        "var = m / (m - 1) * ((per_seq - mean * n_seq) ** 2).sum() / n_seq.sum() ** 2",
        "var = ((per_seq - mean * n_seq) ** 2).sum() / n_seq.sum() ** 2",
        "the measured tokens per step's standard error misses the small-sample correction",
        TREE_VALIDATION_TESTS,
    ),
    Mutant(
        "validate-temperature-unchecked",
        "treeopt/app/validation.py",
        "if not math.isclose(side.temperature, temperature, rel_tol=1e-9, abs_tol=1e-12):",
        "if False and not math.isclose(side.temperature, temperature, rel_tol=1e-9, abs_tol=1e-12):",
        "validate --temperature T takes an alpha sidecar calibrated at another temperature",
        SAMPLED_VALIDATION_TESTS,
    ),
    Mutant(
        "validate-temperature-against-default",
        "treeopt/app/validation.py",
        "if not math.isclose(side.temperature, temperature, rel_tol=1e-9, abs_tol=1e-12):",
        "if not math.isclose(ALPHA_TEMPERATURE, temperature, rel_tol=1e-9, abs_tol=1e-12):",
        "validate --temperature compares T with calibration's default, not with the sidecar's own temperature",
        SAMPLED_VALIDATION_TESTS,
    ),
    Mutant(
        "validate-temperature-trees-repeated",
        "treeopt/app/validation.py",
        "        if key not in seen:",
        "        if True:",
        "a proposal prefix that is a chain is decoded and reported twice",
        SAMPLED_VALIDATION_TESTS,
    ),
    # ---- the cost of dependent drafters (docs/performance-model.md#drafter-cost)
    Mutant(
        "cost-hydra-width",
        "treeopt/drafter_cost.py",
        "return (stage + 2) * self.hidden_size",
        "return (stage + 1) * self.hidden_size",
        "a Hydra head's input misses the root's embedding",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-hydra-one-gemm",
        "roofline/ops.py",
        "gemms = 2.0 if cost.grounded else 1.0",
        "gemms = 1.0",
        "a grounded Hydra head's residual projection is free",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-stage-rows",
        "roofline/ops.py",
        "r = b * rows_all[..., d] if d < rows_all.shape[-1]",
        "r = rows_all[..., d] if d < rows_all.shape[-1]",
        "a draft stage runs for one sequence only",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-idle-stage-weights",
        "roofline/ops.py",
        "weights = (width * w + 2 * w + w * V) * runs",
        "weights = (width * w + 2 * w + w * V)",
        "a speculator stage that does not run reads its weights",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-rows-first-child",
        "roofline/grid.py",
        "first_child = ~earlier",
        "first_child = ~earlier | True",
        "every child, not the first, adds a drafting row",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-rows-depth",
        "roofline/grid.py",
        "(depth[:, None] - 1 == np.arange(stages)[None, :])",
        "(depth[:, None] == np.arange(stages)[None, :])",
        "a node's rows counted at its own depth",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-stages-auto",
        "roofline/latency.py",
        "return heads.stages_run if isinstance(heads, DraftWork) else 0",
        "return 0",
        "a sequential drafter pays no per-stage cost",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-widest-stage",
        "roofline/latency.py",
        ".max(axis=-1) * heads.cost.vocab_size",
        ".min(axis=-1) * heads.cost.vocab_size",
        "memory takes the narrowest stage's logits",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-speedup-medusa-for-all",
        "treeopt/app/prediction.py",
        "grid = speedup_grid(\n        shape,\n        work or head_shape,",
        "grid = speedup_grid(\n        shape,\n        head_shape,",
        "roofline speedup charges Medusa's heads for a sequential drafter",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-report-medusa-for-all",
        "roofline/report.py",
        "        if r.sequential\n        else r.heads\n    )",
        "        if False\n        else r.heads\n    )",
        "the report's grid charges Medusa's heads for a sequential drafter",
        DRAFT_COST_TESTS,
    ),
    Mutant(
        "cost-predictor-medusa-for-all",
        "roofline/ops.py",
        "    if cost.sequential:\n",
        "    if False:\n",
        "a step's drafter work charges Medusa's heads for a sequential drafter",
        DRAFT_COST_TESTS,
    ),
    # ---- IBM's candidate form (docs/builders.md#ibms-candidate-form)
    Mutant(
        "cand-lowest-score",
        "treeopt/candidates.py",
        'order = np.argsort(-score, kind="stable")',
        'order = np.argsort(score, kind="stable")',
        "the n worst candidates kept",
        CANDIDATE_TESTS,
    ),
    Mutant(
        "cand-rows-shifted",
        "treeopt/candidates.py",
        "np.cumprod(topk)[:-1]",
        "np.cumprod(topk)[1:]",
        "the speculator's stage d drafts from k_1..k_d states",
        CANDIDATE_TESTS,
    ),
    Mutant(
        "cand-sequence-tokens",
        "roofline/grid.py",
        "n_candidates * (tree.depth + 1.0)",
        "n_candidates * tree.depth",
        "a candidate sequence verified without its root",
        CANDIDATE_TESTS,
    ),
    # ---- a draft model in `treeopt run` (docs/architecture.md#draft-models-in-the-main-job)
    Mutant(
        "run-dm-predictor-gamma",
        "treeopt/app/sweep.py",
        "level_widths=widths[tokens - 1]",
        "level_widths=widths[min(tokens, len(widths) - 1)]",
        "the sweep's prediction drafts one pass too many",
        ("tests/test_run_draft_model.py",),
    ),
    Mutant(
        "run-dm-prediction-speedup",
        "treeopt/app/draft_model.py",
        '"speedup": tau.best * step[0] / step',
        '"speedup": tau.best',
        "the predicted speedup ignores the step's cost",
        ("tests/test_run_draft_model.py",),
    ),
    # ---- candidate-sequence verification and the choice of form (docs/decoder.md#candidate-sequence-verification;
    # docs/builders.md#choosing-the-verification-form)
    Mutant(
        "form-row-judged-at-own-position",
        "calibration/verification.py",
        "self.row_parent = self.to_device(flat - (flat % length > 0))",
        "self.row_parent = self.to_device(flat)",
        "a candidate's token judged by the distribution at its own position, not its parent's",
        FORM_TESTS,
    ),
    Mutant(
        "form-padding-counts",
        "calibration/verification.py",
        "best, n_keep = _longest_accepted(match & self.retrieve_valid, loglik)",
        "best, n_keep = _longest_accepted(match, loglik)",
        "the padding after a short candidate can be accepted",
        FORM_TESTS,
    ),
    Mutant(
        "form-write-back-first-row",
        "calibration/verification.py",
        "cache.take_rows(verified.rows_cache, rows * self.candidates + accepted.row, keep)",
        "cache.take_rows(verified.rows_cache, rows * self.candidates, keep)",
        "the first candidate's cache entries written back, not the chosen one's",
        FORM_TESTS,
    ),
    Mutant(
        "run-candidate-count-offset",
        "treeopt/app/stages/forms.py",
        'labels = {nodes[m - 1]: f"{m} candidate',
        'labels = {nodes[min(m, len(nodes) - 1)]: f"{m} candidate',
        "the run measures the candidate proposal at one candidate more than it says",
        ("tests/test_run_forms.py",),
    ),
    Mutant(
        "run-draft-model-prefers-tree",
        "treeopt/app/stages/forms.py",
        'FORM_ORDER = {"draft-model": ("chain", "tree"),',
        'FORM_ORDER = {"draft-model": ("tree", "chain"),',
        "a draft model's tree wins ties with its chain",
        ("tests/test_run_draft_model.py",),
    ),
    Mutant(
        "candidate-proposal-size-offset",
        "treeopt/candidates.py",
        "sizes.append(len(nodes))",
        "sizes.append(len(nodes) - 1)",
        "the m-candidate prefix misses the last node of the m-th candidate",
        CANDIDATE_TESTS,
    ),
    Mutant(
        "form-hidden-first-row",
        "calibration/verification.py",
        "return verified.hidden[rows, accepted.row]",
        "return verified.hidden[rows, 0]",
        "the next step drafts from the first candidate's hidden state",
        FORM_TESTS + PREFIX_TESTS,
    ),
    Mutant(
        "form-expansion-one-sequence",
        "calibration/kv_cache.py",
        "rows[..., :filled, :] = self.buffer[:, :, :, None, :, :filled]",
        "rows[..., :filled, :] = self.buffer[:, :, :1, None, :, :filled]",
        "every candidate row gets the first sequence's context",
        FORM_TESTS,
    ),
    Mutant(
        "form-predictor-unpadded",
        "treeopt/app/sweep.py",
        "tokens, candidates = candidate_tokens(proposal.prefix(n).num_leaves, used)",
        "candidates = proposal.prefix(n).num_leaves",
        "the sweep's prediction of candidates verifies n + 1 tokens",
        FORM_TESTS,
    ),
    Mutant(
        "form-not-in-fingerprint",
        "calibration/sweep.py",
        '            "verification": settings.verification,\n',
        "",
        "a sweep of one form resumes as the other",
        FORM_TESTS,
    ),
    Mutant(
        "form-no-tie-break",
        "treeopt/forms.py",
        "winner = overlapping[0]",
        "winner = best",
        "overlapping intervals go to the highest lower bound, not the cheaper verification",
        FORM_TESTS,
    ),
    Mutant(
        "form-point-not-lower-bound",
        "treeopt/forms.py",
        "bounds[f][1] > threshold]",
        "bounds[f][0] > threshold]",
        "a form competes on its point speedup, not its lower bound",
        FORM_TESTS,
    ),
    # ---- the Python API (docs/python.md): the calls and what they hand back
    Mutant(
        "api-predict-drops-engine",
        "treeopt/api.py",
        "        max_nodes=max_nodes,\n        engine=engine,",
        "        max_nodes=max_nodes,\n        engine=None,",
        "treeopt.predict ignores the engine: sizes vLLM does not draft can be picked",
        API_TESTS,
    ),
    Mutant(
        "api-check-taus-swapped",
        "treeopt/tree_api.py",
        "        tau=_expected_tokens(tree, table, strict=False),\n"
        "        tau_drafted=_expected_tokens(result.drafted, table, strict=False),",
        "        tau=_expected_tokens(result.drafted, table, strict=False),\n"
        "        tau_drafted=_expected_tokens(tree, table, strict=False),",
        "treeopt.check reports tau as drafted for the tree as written",
        API_TESTS,
    ),
    Mutant(
        "api-select-sweep-without-samples",
        "treeopt/api.py",
        "            samples=source.samples,",
        "            samples=None,",
        "treeopt.select decides a sweep without its per-round samples (no paired test)",
        API_TESTS,
    ),
    Mutant(
        "api-prediction-tree-off-by-one",
        "treeopt/app/prediction.py",
        "        return self.proposal.prefix(int(nodes))",
        "        return self.proposal.prefix(max(int(nodes) - 1, 0))",
        "Prediction.tree(n) hands back the tree of n - 1 nodes",
        API_TESTS,
    ),
    Mutant(
        "api-expected-tokens-joint-ignored",
        "treeopt/tree_api.py",
        "    return _expected_tokens(_tree(tree), _table(accuracy), joint=joint, strict=False)",
        "    return _expected_tokens(_tree(tree), _table(accuracy), joint=False, strict=False)",
        "treeopt.expected_tokens(joint=True) gives the independent-heads tau",
        API_TESTS,
    ),
    # ---- --random-weights: a model of a shape, sized before it is allocated
    Mutant(
        "random-weights-drafter-bytes-dropped",
        "calibration/random_model.py",
        "    return (base + drafter) * torch.empty((), dtype=dtype).element_size()",
        "    return base * torch.empty((), dtype=dtype).element_size()",
        "the memory check of --random-weights leaves the drafter's weights out",
        ("tests/test_random_weights.py",),
    ),
    Mutant(
        "random-weights-kv-heads-from-heads",
        "treeopt/app/random_weights.py",
        "        num_key_value_heads=shape.kv_heads,",
        "        num_key_value_heads=shape.heads,",
        "a built-in GQA shape is built with as many KV heads as query heads",
        ("tests/test_random_weights.py",),
    ),
    Mutant(
        "random-weights-seed-ignored",
        "calibration/random_model.py",
        "gen = torch.Generator(device=torch_device).manual_seed(spec.seed)",
        "gen = torch.Generator(device=torch_device).manual_seed(0)",
        "every seed draws the same random weights",
        ("tests/test_random_weights.py",),
    ),
    # ---- engines' own benchmark files as hw fit measurements (roofline/engine_bench.py)
    Mutant(
        "engine-bench-sglang-context-end",
        "roofline/engine_bench.py",
        "        rows.append((batch, input_len + (output_len - 2) // 2, 1, 1e3 * step_s))",
        "        rows.append((batch, input_len + output_len // 2, 1, 1e3 * step_s))",
        "an SGLang median decode step is placed past the middle of the timed steps",
        ("tests/test_engine_bench.py",),
    ),
    Mutant(
        "engine-bench-vllm-difference-not-divided",
        "roofline/engine_bench.py",
        "            step_ms = 1e3 * (b.latency_s - a.latency_s) / (b.output_len - a.output_len)",
        "            step_ms = 1e3 * (b.latency_s - a.latency_s) / b.output_len",
        "two vLLM runs' latency difference is divided by the longer output length, not the extra steps",
        ("tests/test_engine_bench.py",),
    ),
    # ---- published speculative steps as step rows (roofline/published_steps.py)
    Mutant(
        "published-steps-ibm-no-tokens-per-step",
        "roofline/published_steps.py",
        "                step_ms = float(ms) * t",
        "                step_ms = float(ms)",
        "IBM's ms per generated token is taken as the step time, not times the tokens a step generates",
        ("tests/test_published_steps.py",),
    ),
    Mutant(
        "published-steps-ibm-candidate-without-root",
        "roofline/published_steps.py",
        '"tokens": c * (stages + 1) if c > 0 else 1,',
        '"tokens": c * stages if c > 0 else 1,',
        "an IBM candidate sequence is verified without its root token (stages, not stages + 1)",
        ("tests/test_published_steps.py",),
    ),
    Mutant(
        "published-steps-medusa-tree-step-per-token",
        "roofline/published_steps.py",
        'tree_ms = 1e3 * float(r["acc_rate"]) / float(r["medusa_tok_s"])',
        'tree_ms = 1e3 / float(r["medusa_tok_s"])',
        "Medusa's tree step is priced per generated token, not per step (acc_rate dropped)",
        ("tests/test_published_steps.py",),
    ),
    # ---- benchmarks/gpu_check.py: the one-command check of the latency model on a GPU
    Mutant(
        "gpu-check-ratio-against-another-groups-plain-step",
        "benchmarks/gpu_check.py",
        "predict(b, 1, s) for b, s in cells",
        'predict(b, 1, min(cells["context"])) for b, s in cells',
        "the predicted T(n)/T(0) divides by the plain step of the shortest context, not of the cell's own",
        ("tests/test_gpu_check.py",),
    ),
    Mutant(
        "gpu-check-h100-pcie-as-sxm",
        "benchmarks/gpu_check.py",
        'frozenset({"h100", "pcie"}): "h100-pcie",',
        'frozenset({"h100", "pcie"}): "h100-sxm",',
        "an H100 PCIe is checked against the H100 SXM's built-in profile",
        ("tests/test_gpu_check.py",),
    ),
    Mutant(
        "gpu-check-ratio-error-over-plain-steps-too",
        "benchmarks/gpu_check.py",
        '("ratio_error", f"ratio_error_{name}{suffix}", cells[cells["nodes"] > 0]),',
        '("ratio_error", f"ratio_error_{name}{suffix}", cells),',
        "the median T(n)/T(0) error counts the plain steps, whose error is 0 by construction",
        ("tests/test_gpu_check.py",),
    ),
    Mutant(
        "fit-prior-dropped",
        "roofline/profile_fit.py",
        "return np.concatenate([_robust(rel / noise, f), np.asarray(prior, dtype=float)])",
        "return np.concatenate([_robust(rel / noise, f), 0.0 * np.asarray(prior, dtype=float)])",
        "the fit drops its priors: a term the rows cannot see is reported as determined",
        ("tests/test_profile_fit_priors.py",),
    ),
    Mutant(
        "fit-eta-memory-datasheet-bound",
        "roofline/profile_fit.py",
        '"eta_memory": PriorSpec(0.30, 0.92, 0.10, 0.35,',
        '"eta_memory": PriorSpec(0.30, 1.0, 0.10, 0.35,',
        "eta_memory may reach the datasheet bandwidth, which no engine streams at",
        ("tests/test_profile_fit_priors.py",),
    ),
    # ---- roofline/engine_presets.py: an engine family's step costs on a built-in profile
    Mutant(
        "engine-presets-vllm-medusa-as-hf-eager",
        "roofline/engine_presets.py",
        '    "vllm-medusa@0.32": "vllm",',
        '    "vllm-medusa@0.32": "hf-eager",',
        "vLLM's Medusa path is priced as the Medusa authors' eager code (its heads' name, not its engine)",
        ("tests/test_engine_presets.py",),
    ),
    Mutant(
        "engine-presets-ideal-overrides-fitted-terms",
        "roofline/engine_presets.py",
        "    changes = {**ideal, **preset.terms}",
        "    changes = {**preset.terms, **ideal}",
        "the ideal terms are applied over the preset's fitted ones: every preset prices as the ideal engine",
        ("tests/test_engine_presets.py",),
    ),
    # ---- split verification attention (docs/decoder.md#split-verification-attention)
    Mutant(
        "split-tree-mask-off-by-one-level",
        "calibration/verification.py",
        "self.tree_mask_add = additive_mask(t(buffers.attention_mask), dtype)[None, None]",
        "self.tree_mask_add = additive_mask(\n"
        "            t(buffers.attention_mask & (buffers.depth[:, None] != buffers.depth[None, :] + 1)), dtype\n"
        "        )[None, None]",
        "the tree mask off by one level: a node does not see its parent",
        ("tests/test_split_attention.py",),
    ),
    Mutant(
        "split-block-mask-one-slot-early",
        "calibration/split_attention.py",
        "self.prefix_mask, self.block_mask = mask[:, :, :1, :-q], mask[:, :, :, -q:]",
        "self.prefix_mask, self.block_mask = mask[:, :, :1, :-q], mask[:, :, :, -q - 1 : -1]",
        "the step block's mask read one slot early (each node's row shifted by one tree slot)",
        ("tests/test_split_attention.py",),
    ),
    Mutant(
        "split-window-block-mask-off-by-one",
        "calibration/split_attention.py",
        "self.block_mask = mask.index_select(-1, self.slots)",
        "self.block_mask = mask.index_select(-1, self.slots - 1)",
        "a static window's block mask read at the slots before the step's",
        ("tests/test_split_attention.py",),
    ),
    Mutant(
        "split-prefix-sees-the-root-slot",
        "calibration/split_attention.py",
        "mask[:, :, :1, :].index_fill(-1, self.slots, neg)",
        "mask[:, :, :1, :].index_fill(-1, self.slots[1:], neg)",
        "the prefix keeps the root's slot of a static window: every node attends the root twice",
        ("tests/test_split_attention.py",),
    ),
    Mutant(
        "split-merge-by-max",
        "calibration/split_attention.py",
        "lse = torch.logaddexp(lse_p, lse_b)",
        "lse = torch.maximum(lse_p, lse_b)",
        "the merge normalises by the larger part's sum only, not by both (log-sum-exp)",
        ("tests/test_split_attention.py",),
    ),
    Mutant(
        "split-gqa-rows-interleaved",
        "calibration/split_attention.py",
        "grouped = query.reshape(b, kv_heads, group * q, d)",
        "grouped = query.transpose(1, 2).reshape(b, kv_heads, group * q, d)",
        "the grouped query rows mix heads of different KV heads",
        ("tests/test_split_attention.py",),
    ),
    Mutant(
        "attention-grid-read-at-face-value",
        "roofline/hwfit.py",
        "if len({(s.batch, s.context_tokens) for s in samples if s.query_rows == samples[0].query_rows}) > 2:",
        "if False:",
        "an accelerator's batch x context grid read at the small cell's face value (latency as slowness)",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "attention-slope-over-one-sequence",
        "roofline/hwfit.py",
        "keys = [s.batch * (s.context_tokens + q) for s in cells]",
        "keys = [s.context_tokens + q for s in cells]",
        "the grid's slope over the keys of one sequence, not keys x sequences",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "attention-cells-no-memory-cap",
        "calibration/attention_bench.py",
        "if b * (s + q) * per_token <= GPU_ATTN_MEMORY_SHARE * capacity_bytes:",
        "if True:",
        "the attention grid allocates cells past the device's memory",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "fused-stale-product",
        "calibration/fused_projections.py",
        "if fresh or x is not self._input:",
        "if fresh:",
        "a fused part called on another input returns its slice of the last input's product",
        ("tests/test_fused_projections.py",),
    ),
    Mutant(
        "fused-parts-all-at-zero",
        "calibration/fused_projections.py",
        "        start = end\n",
        "",
        "every part of a fused group returns the first projection's columns",
        ("tests/test_fused_projections.py",),
    ),
    Mutant(
        "fused-first-part-reuses",
        "calibration/fused_projections.py",
        "first=i == 0,",
        "first=False,",
        "the first part reuses a product of the same tensor changed in place since",
        ("tests/test_fused_projections.py",),
    ),
    # ---- the whole speculative step in static shapes (docs/decoder.md#captured-drafting)
    Mutant(
        "captured-stale-draft",
        "calibration/captured_drafting.py",
        "tokens.copy_(self.drafting.tree_tokens(accepted.bonus, proposal))",
        "self.drafting.tree_tokens(accepted.bonus, proposal)",
        "a stale captured draft: the step's token buffer is not refreshed, the next step verifies the last tree",
        CAPTURED_STEP_TESTS,
    ),
    Mutant(
        "captured-first-draft-kept",
        "calibration/decoder.py",
        "state.root, state.hidden, state.draft = step.bonus, step.hidden, step.draft",
        "state.root, state.hidden = step.bonus, step.hidden",
        "a stale captured draft: every step verifies the batch's first draft, copied in again",
        CAPTURED_STEP_TESTS,
    ),
    Mutant(
        "captured-drafts-from-the-root",
        "calibration/captured_drafting.py",
        "last_hidden = hidden[rows, accepted.last]",
        "last_hidden = hidden[rows, accepted.path[:, 0]]",
        "the captured step drafts from the root's hidden state, not the last accepted token's",
        CAPTURED_STEP_TESTS,
    ),
    Mutant(
        "captured-keep-root-from-child-slot",
        "calibration/kv_cache.py",
        "slots = write[0] + path",
        "slots = write[0] + path.clamp(min=1)",
        "the captured keep takes the root's entry from the first child's slot",
        CAPTURED_LOSSLESS_TESTS,
    ),
    Mutant(
        "captured-hole-made-visible",
        "calibration/decoder.py",
        "state.valid = torch.cat([state.valid, self._iota(keep)[None] < step.n_keep[:, None]], dim=1)",
        "state.valid = torch.cat([state.valid, self._iota(keep)[None] <= step.n_keep[:, None]], dim=1)",
        "after a captured step a shorter sequence sees the hole past its accepted path",
        CAPTURED_STEP_TESTS,
    ),
    Mutant(
        "captured-tree-mask-off-by-one-level",
        "calibration/verification.py",
        "self.tree_mask_add = additive_mask(t(buffers.attention_mask), dtype)[None, None]",
        "self.tree_mask_add = additive_mask(\n"
        "            t(buffers.attention_mask & (buffers.depth[:, None] != buffers.depth[None, :] + 1)), dtype\n"
        "        )[None, None]",
        "the tree mask off by one level (a node does not see its parent) on the captured step",
        CAPTURED_LOSSLESS_TESTS,
    ),
    Mutant(
        "host-accept-past-a-rejection",
        "calibration/verification.py",
        "lengths = np.cumprod(match[:, retrieve] & valid, axis=-1).sum(-1)",
        "lengths = (match[:, retrieve] & valid).sum(-1)",
        "greedy acceptance on the host counts matches past the first rejection",
        ("tests/test_host_acceptance.py",),
    ),
    Mutant(
        "host-accept-bonus-at-the-root",
        "calibration/verification.py",
        "return path, n_keep, last, pred[rows, last]",
        "return path, n_keep, last, pred[rows, path[:, 0]]",
        "the host acceptance's bonus is the argmax after the root, not after the last accepted token",
        ("tests/test_host_acceptance.py",),
    ),
    # ---- static-shape verification steps (docs/decoder.md#static-shape-steps)
    Mutant(
        "static-mask-hides-last-slot",
        "calibration/static_steps.py",
        "self.mask[..., :width].copy_(mask)",
        "self.mask[..., :width].copy_(mask)\n        self.mask[..., width - 1].fill_(self.neg)",
        "the static step's mask hides the last slot of the eager mask (a tree node's own slot)",
        ("tests/test_static_steps.py",),
    ),
    Mutant(
        "gpu-check-eager-ratio-inverted",
        "benchmarks/gpu_check.py",
        'cells["eager_over_graphs"] = cells["eager_ms"] / cells["measured_ms"]',
        'cells["eager_over_graphs"] = cells["measured_ms"] / cells["eager_ms"]',
        "the eager-vs-captured ratio upside down",
        ("tests/test_gpu_check.py",),
    ),
    Mutant(
        "gpu-check-batch1-takes-batch-2",
        "benchmarks/gpu_check.py",
        'rows = cells[(cells["batch"] == 1) & cells["step_error_builtin"].notna()]',
        'rows = cells[(cells["batch"] <= 2) & cells["step_error_builtin"].notna()]',
        "the batch-1 check against the built-in profile counts batch 2 too",
        ("tests/test_gpu_check.py",),
    ),
    Mutant(
        "gpu-check-eager-sweep-static",
        "benchmarks/gpu_check.py",
        '"eager": (False, "sweep-eager.csv")',
        '"eager": (True, "sweep-eager.csv")',
        "the eager sweep runs the static steps: both columns measure the same thing",
        ("tests/test_gpu_check.py",),
    ),
    Mutant(
        "hwbench-replay-not-divided",
        "calibration/hwbench.py",
        "stats.median_s / calls,",
        "stats.median_s,",
        "a captured benchmark's replay of 16 calls counted as one call",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "hwbench-forwards-always-eager",
        "calibration/hwbench.py",
        "if context and uses_static(graphs, dev):",
        "if False:",
        "hw calibrate times eager forwards where the sweep's steps are captured",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "hwbench-gemm-copies-fit-the-l2",
        "calibration/hwbench.py",
        "return max(1, -(-2 * l2 // max(weight_bytes, 1)))",
        "return max(1, -(-l2 // max(weight_bytes, 1)))",
        "a captured GEMM cycles through one L2's worth of weights, not twice",
        ("tests/test_hwfit.py",),
    ),
    Mutant(
        "capture-failure-not-recorded",
        "calibration/static_steps.py",
        "CAPTURE_FAILURES.append(reason)",
        "pass",
        "a failed capture runs eagerly without telling the report",
        ("tests/test_static_steps.py",),
    ),
    Mutant(
        "static-mask-stale-slots",
        "calibration/static_steps.py",
        "if width < self._width:",
        "if False:",
        "a narrower mask than the last step's leaves that step's slots visible",
        ("tests/test_static_steps.py", "tests/test_decoder_overhead_paths.py"),
    ),
    Mutant(
        "static-write-at-length",
        "calibration/static_steps.py",
        "torch.add(self._arange, start, out=self.write)",
        "self.write.fill_(start)",
        "the static step writes every new key/value at the cache length instead of length + offset",
        ("tests/test_static_steps.py",),
    ),
    # ---- shape-aware GEMM efficiency (docs/performance-model.md)
    Mutant(
        "gemm-shapes-floor-tiles",
        "roofline/gemm_shapes.py",
        "tiles = np.ceil(rows / tile_m) * np.ceil(float(n) / tile_n)",
        "tiles = np.floor(rows / tile_m) * np.ceil(float(n) / tile_n)",
        "the tile count rounds the row tiles down: a partly filled tile costs nothing",
        ("tests/test_gemm_shapes.py",),
    ),
    Mutant(
        "gemm-shapes-no-operand-loads",
        "roofline/gemm_shapes.py",
        "+ dtype_bytes * (tile_m + tile_n) * depth / operand_bytes_per_s",
        "+ 0.0 * (tile_m + tile_n) * depth / operand_bytes_per_s",
        "a tile's operand loads cost nothing: small tiles run as fast as large ones",
        ("tests/test_gemm_shapes.py",),
    ),
    Mutant(
        "gemm-tiles-ignored",
        "roofline/hardware.py",
        "if self.gemm_tiles is None or not in_features > 0:",
        "if True:",
        "a profile's gemm_tiles are ignored: every weight GEMM takes the row curve",
        ("tests/test_gemm_shapes.py",),
    ),
    Mutant(
        "gemm-tiles-not-scaled-by-fit",
        "roofline/profile_fit.py",
        'changes["gemm_tiles"] = base.gemm_tiles.scaled(float(terms["gemm_efficiency_scale"]))',
        'changes["gemm_tiles"] = base.gemm_tiles',
        "a fitted GEMM efficiency scale leaves the tiles as they were",
        ("tests/test_gemm_shapes.py",),
    ),
    Mutant(
        "gemm-shapes-a100-sm-count",
        "roofline/gemm_shapes.py",
        "108, 312e12, 1935e9",
        "132, 312e12, 1935e9",
        "the A100 takes the H100-SXM's 132 SMs",
        ("tests/test_gemm_shapes.py",),
    ),
    # ---- whether runs' selections agree (treeopt/agreement.py)
    Mutant(
        "agreement-points-best-run",
        "treeopt/agreement.py",
        "points_ratio = float(run_ratios.min())",
        "points_ratio = float(run_ratios.max())",
        "the points reading takes the run where the picks look closest, not the farthest",
        ("tests/test_agreement.py",),
    ),
    Mutant(
        "agreement-intervals-one-sided",
        "treeopt/agreement.py",
        "if hi < 1 - tolerance or lo > 1 / (1 - tolerance):",
        "if lo > 1 / (1 - tolerance):",
        "a pick shown more than δ worse than the other counts as within δ",
        ("tests/test_agreement.py",),
    ),
    Mutant(
        "agreement-triple-ignores-pair",
        "treeopt/agreement.py",
        "ok = paired.reindex(three.index).fillna(False) & three[reading].fillna(False).astype(bool)",
        "ok = three[reading].fillna(False).astype(bool)",
        "the issue's check counts a cell whose loaded runs disagree",
        ("tests/test_agreement.py",),
    ),
    Mutant(
        "study-interval-holds-one-sided",
        "benchmarks/selection_under_load.py",
        "held = ((lo <= mean_overhead) & (mean_overhead <= hi))[:, ~unreliable]",
        "held = (lo <= mean_overhead)[:, ~unreliable]",
        "a run's interval counted as holding the mean of all runs when the mean lies above it",
        ("tests/test_agreement.py",),
    ),
    # ---- the engine's own acceptance (treeopt/engine_readers.py, treeopt/chain_counts.py)
    Mutant(
        "engine-reach-not-tail-sum",
        "treeopt/chain_counts.py",
        "reach = h[::-1].cumsum()[::-1]  # reach[j] = steps accepting >= j, reach[0] = N",
        "reach = h.cumsum()  # reach[j] = steps accepting >= j, reach[0] = N",
        "steps reaching position j counted from the wrong end of the histogram",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-tau-population-variance",
        "treeopt/chain_counts.py",
        "var = (capped**2 @ h / N - mean**2) * N / max(N - 1, 1)",
        "var = (capped @ h / N - mean**2) * N / max(N - 1, 1)",
        "the variance of min(L, k) from E[min(L, k)] instead of its square",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-extrapolate-point-upper",
        "treeopt/chain_counts.py",
        "more_high = high[-1] + reach_hi * np.cumsum(p_hi**i)",
        "more_high = high[-1] + reach_hi * np.cumsum(p_hi * i)",
        "the extrapolated upper bound grows linearly instead of geometrically",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-newcombe-swapped",
        "treeopt/chain_counts.py",
        "low = d - np.sqrt((p1 - a.low) ** 2 + (b.high - p2) ** 2)",
        "low = d - np.sqrt((p1 - a.low) ** 2 + (p2 - b.low) ** 2)",
        "Newcombe's lower bound takes the second proportion's lower half-width",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-no-bonferroni",
        "treeopt/chain_counts.py",
        "per = 1 - (1 - confidence) / max(compared, 1)",
        "per = confidence",
        "the confidence is not split over the positions compared",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-check-ignores-tolerance",
        "treeopt/chain_counts.py",
        "elif hi[j] < -tolerance:",
        "elif hi[j] < 0:",
        "a significant but negligible drop is called a collapse",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-histogram-from-reach",
        "treeopt/engine_readers.py",
        "hist = -np.diff(np.append(n, 0.0))",
        "hist = -np.diff(n)",
        "the steps that accepted every position are dropped from the histogram",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-restart-unnoticed",
        "treeopt/engine_readers.py",
        "if earlier.created is not None and later.created is not None and earlier.created != later.created:",
        "if False:",
        "a restart between two scrapes goes unnoticed when the counters happen to grow",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-schedule-switch-off-end",
        "treeopt/app/engine_schedule.py",
        "return self.ranges[-1][0]",
        "return self.ranges[-1][1]",
        "the switch-off point is the last batch size instead of the first that drafts nothing",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-sglang-k-off-by-one",
        "treeopt/engine_readers.py",
        "ks.setdefault(int(drafted // steps), i)",
        "ks.setdefault(int(drafted // steps) + 1, i)",
        "SGLang's K read as num_draft_tokens instead of num_draft_tokens - 1",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-vllm-short-drafts-kept",
        "treeopt/engine_readers.py",
        'total += _dense(by_length.get(str(K), []), K, f"{where}: acceptance_histogram_by_draft_length[{K}]")',
        'total += _dense(r.get("acceptance_histogram"), K, where)',
        "steps whose drafts were shorter than K counted as if K tokens were tried",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    Mutant(
        "engine-provenance-unchecked",
        "treeopt/chain_counts.py",
        "    if heads > len(c.tries) or not (",
        "    if False and not (",
        "a chain table whose stored window disagrees with its counts is trusted",
        ENGINE_ACCEPTANCE_TESTS,
    ),
    # ---- issue 47: nothing overwritten, nothing refused too late
    Mutant(
        "guard-package-only-its-root",
        "treeopt/fileio.py",
        "        if real == package or package in real.parents:",
        "        if real == package:",
        "an output inside the installed package (the demo model, the reference trees) is written",
        ("tests/test_reliability_cli.py::test_nothing_is_written_inside_the_installed_packages",),
    ),
    Mutant(
        "guard-special-file-replaced",
        "treeopt/fileio.py",
        "    if found is not None and not folder and not stat.S_ISREG(found.st_mode):",
        "    if found is not None and not folder and stat.S_ISDIR(found.st_mode):",
        # killed on a FIFO the test makes: planted against /dev/full, the mutant would replace
        # the machine's own device node, for every later test and process
        "-o naming a FIFO (or a device) replaces it with a file",
        ("tests/test_reliability_cli.py::test_a_fifo_as_output_is_refused_without_opening_it",),
    ),
    Mutant(
        "guard-trailing-slash",
        "treeopt/fileio.py",
        'if not folder and name.endswith(("/", os.sep)):',
        'if not folder and name.endswith("//"):',
        "-o newdir/ writes a file named newdir",
        ("tests/test_reliability_cli.py::test_a_file_name_ending_in_a_slash_writes_no_file",),
    ),
    # ---- the drafter's own scores recorded by calibrate (treeopt.draft_scores)
    Mutant(
        "draft-scores-walk-not-cut",
        "treeopt/draft_scores.py",
        "start_rows=new_tokens - 1,",
        "start_rows=None,",
        "tau from the sidecar walks steps past where sglang-tau's own pass stops",
        ("tests/test_draft_scores.py::test_tau_by_hand",),
    ),
    Mutant(
        "draft-scores-nan-taken",
        "treeopt/draft_scores.py",
        "if not np.all((scores >= 0) & (scores <= 1)):  # NaN fails both",
        "if np.any((scores < 0) | (scores > 1)):  # NaN fails both",
        "a sidecar of NaN scores is read as if valid",
        ("tests/test_draft_scores.py::test_bad_sidecars_are_refused_naming_the_file",),
    ),
    Mutant(
        "draft-scores-cut-rows-taken",
        "treeopt/draft_scores.py",
        "if np.any(per_prompt != generated - 1):",
        "if np.any(per_prompt > generated - 1):",
        "a sidecar with rows cut from a prompt is read as if whole",
        ("tests/test_draft_scores.py::test_bad_sidecars_are_refused_naming_the_file",),
    ),
    Mutant(
        "draft-scores-future-format-taken",
        "treeopt/draft_scores.py",
        "if text != DRAFT_SCORES_FORMAT:",
        'if not text.startswith("treeopt.draft-scores/"):',
        "a sidecar of a future format is read as v1",
        ("tests/test_draft_scores.py::test_bad_sidecars_are_refused_naming_the_file",),
    ),
    Mutant(
        "draft-scores-other-topk-taken",
        "treeopt/draft_scores.py",
        "if topk != scores.topk:",
        "if topk > scores.topk:",
        "a sidecar of topk 2 answers for topk 1, whose beams are other ones",
        ("tests/test_draft_scores.py::test_a_triple_the_file_cannot_answer",),
    ),
    Mutant(
        "draft-scores-not-in-checkpoint",
        "calibration/checkpoint.py",
        "counts.pool_chunks = [(scores, on_path)] if n else []",
        "counts.pool_chunks = []",
        "a resumed calibration loses the pools of the prompts before the checkpoint",
        ("tests/test_draft_scores.py::test_a_resumed_calibration_writes_the_same_sidecar",),
    ),
    Mutant(
        "draft-scores-not-fingerprinted",
        "calibration/calibration_settings.py",
        '**({} if settings.draft_scores_topk is None else {"draft_scores_topk": settings.draft_scores_topk}),',
        "**{},",
        "a resume with another --draft-scores topk mixes pools of two topks in one file",
        ("tests/test_draft_scores.py::test_a_resume_never_mixes_pools_of_another_topk",),
    ),
    Mutant(
        "draft-scores-context-cleared-early",
        "calibration/labels.py",
        'eagle = hasattr(heads, "read_context") and own',
        'eagle = hasattr(heads, "read_context")',
        "the ranks clear the EAGLE draft's context before the pools are drafted from the same forward",
        ("tests/test_draft_scores.py::test_the_sidecar_predicts_what_sglang_tau_drafts_itself",),
    ),
    Mutant(
        "draft-scores-any-drafter",
        "calibration/calibration_settings.py",
        "if heads.kind not in EAGLE_KINDS:",
        "if False:",
        "calibrate records a dynamic tree's scores for heads no engine drafts one with",
        ("tests/test_draft_scores.py::test_the_calibrate_command_refuses_draft_scores_it_cannot_record",),
    ),
    Mutant(
        "draft-scores-data-labels",
        "calibration/calibration_settings.py",
        'if settings.labels != "greedy":',
        "if False:",
        "calibrate records pools along the text instead of the continuation the engine accepts",
        ("tests/test_draft_scores.py::test_the_calibrate_command_refuses_draft_scores_it_cannot_record",),
    ),
    Mutant(
        "draft-scores-batch-dropped",
        "calibration/counts.py",
        "            self.pool_chunks.append(update.pool)",
        "            pass",
        "the batches' pools are computed but never kept",
        ("tests/test_draft_scores.py::test_the_sidecar_predicts_what_sglang_tau_drafts_itself",),
    ),
    Mutant(
        "draft-scores-gathered-from-one-process",
        "calibration/distributed.py",
        "pools = [p[3] for p in parts if p[3] is not None]",
        "pools = [p[3] for p in parts[:1] if p[3] is not None]",
        "under torchrun the draft scores keep process 0's pools only",
        ("tests/test_distributed.py::test_torchrun_draft_scores_equal_one_process",),
    ),
    Mutant(
        "sglang-tau-scores-ignored",
        "treeopt/app/sglang_tau.py",
        "predicted = _recorded(scores, settings, counts) if scores is not None else None",
        "predicted = None",
        "sglang-tau --scores drafts on --data instead of reading the file",
        ("tests/test_draft_scores.py::test_the_command_predicts_from_a_sidecar_without_a_model",),
    ),
    Mutant(
        "guard-input-sidecar",
        "treeopt/input_paths.py",
        "found = [rank_vectors_path(path), alpha_path(path), draft_scores_path(path)]",
        "found = [alpha_path(path), draft_scores_path(path)]",
        "build --accuracy A.json -o A.ranks.npz destroys the input's rank vectors",
        ("tests/test_reliability_cli.py::test_a_sidecar_of_an_input_is_never_an_output",),
    ),
    Mutant(
        "guard-full-disk-traceback",
        "treeopt/fileio.py",
        "    if isinstance(err, OSError) and err.errno in REFUSED_WRITES:",
        "    if False:",
        "a full disk ends in a traceback instead of one line",
        ("tests/test_reliability_cli.py::test_a_full_disk_is_one_line_and_leaves_nothing",),
    ),
    Mutant(
        "lock-commands-unlocked",
        "treeopt/cli/safety.py",
        "            ctx.with_resource(output_lock(path))",
        "            output_lock(path)",
        "build, select, report write without the writer's lock",
        ("tests/test_reliability_cli.py::test_a_second_writer_of_the_same_output_fails_at_once",),
    ),
    Mutant(
        "lock-folder-ignored",
        "treeopt/fileio.py",
        "owner = _held_elsewhere(lock_path(folder)) if folder != folder.parent else None",
        "owner = None",
        "a file is written inside a run folder another process is writing",
        ("tests/test_reliability_cli.py::test_a_file_inside_a_folder_being_written_is_refused",),
    ),
    Mutant(
        "lock-not-reentrant",
        "treeopt/fileio.py",
        "    if key in _HELD:\n",
        "    if False:\n",
        "a command that locked its output up front fails on its own lock",
        ("tests/test_reliability.py::test_lock_is_reentrant_within_a_process_and_released_by_the_outer_holder",),
    ),
    Mutant(
        "sigterm-said-as-interrupt",
        "treeopt/cli/__init__.py",
        "    _TERMINATED.append(signum)",
        "    pass",
        "SIGTERM says 'interrupted' and exits 130",
        ("tests/test_reliability_cli.py::test_sigterm_stops_as_ctrl_c_does_with_a_word",),
    ),
    Mutant(
        "input-prompt-text-unbounded",
        "calibration/data.py",
        "MAX_TEXT_BYTES = 64 << 20",
        "MAX_TEXT_BYTES = 64 << 21",
        "prompt text past 64 MiB is read and tokenised whole",
        ("tests/test_reliability_cli.py::test_input_sizes_are_bounded_before_reading",),
    ),
    Mutant(
        "input-npz-objects-advice",
        "treeopt/npz_input.py",
        "                if dtype.hasobject:",
        "                if False:",
        "an npz of Python objects is refused with numpy's advice to allow_pickle",
        ("tests/test_reliability_cli.py::test_python_objects_in_an_npz_are_refused_without_numpys_pickle_advice",),
    ),
    Mutant(
        "input-samples-round-unbounded",
        "treeopt/sweep_file.py",
        "        if rounds * sizes.size != int(sel.sum()):",
        "        if False:",
        "a samples file's round index of 10^12 is allocated before it is checked",
        ("tests/test_reliability_cli.py::test_a_damaged_samples_file_is_one_line",),
    ),
    Mutant(
        "input-samples-other-cells",
        "treeopt/sweep_file.py",
        "        if rows.empty:\n",
        "        if False:\n",
        "samples of cells the sweep CSV has not are accepted",
        ("tests/test_reliability_cli.py::test_damaged_sweep_sidecars_are_one_line",),
    ),
    Mutant(
        "input-meta-confidence",
        "treeopt/sweep_file.py",
        "and 0.5 <= confidence < 1)",
        "and 0.5 <= confidence)",
        "a sweep's confidence of 1.5 is accepted",
        ("tests/test_reliability_cli.py::test_damaged_sweep_sidecars_are_one_line",),
    ),
    Mutant(
        "input-lone-surrogate",
        "calibration/data.py",
        '            text.encode("utf-8")',
        '            text.encode("utf-8", "surrogatepass")',
        "a prompt with a lone surrogate reaches the tokenizer",
        ("tests/test_reliability_cli.py::test_prompt_records_nested_deep_or_holding_a_lone_surrogate_are_one_line",),
    ),
    Mutant(
        "input-duplicate-key-kept-last",
        "treeopt/fileio.py",
        "    if len(doc) != len(pairs):",
        "    if len(doc) < len(pairs) - 1:",
        "a JSON key given twice silently keeps its last value",
        ("tests/test_reliability_cli.py::test_duplicate_json_keys_are_refused_not_silently_kept_last",),
    ),
    Mutant(
        "input-cell-unicode-digit",
        "treeopt/tree.py",
        "not (digits.isascii() and digits.isdigit())",
        "not digits.isdigit()",
        "sel.json:batch=² ends in int()'s traceback",
        ("tests/test_reliability_cli.py::test_a_cell_reference_with_a_unicode_digit_is_the_projects_error",),
    ),
    Mutant(
        "input-eta-above-one",
        "roofline/hardware.py",
        "            if getattr(self, key) > 1:",
        "            if getattr(self, key) > 2:",
        "a profile attaining 150% of its peak is accepted",
        ("tests/test_reliability_cli.py::test_implausible_hardware_profiles_are_refused",),
    ),
    Mutant(
        "input-mix-weights-overflow",
        "treeopt/mix.py",
        'df["weight"] = df["weight"] / df["weight"].max()',
        'df["weight"] = df["weight"] / 1.0',
        "mix weights near the float maximum sum to infinity",
        ("tests/test_reliability_cli.py::test_mix_weights_near_the_float_maximum_stay_finite",),
    ),
    Mutant(
        "input-heads-uncapped-option",
        "treeopt/cli/hw_cmds.py",
        "type=AtLeast(0, MAX_HEADS),",
        "type=AtLeast(0),",
        "hw fit --num-heads 1000000 fits and writes a profile",
        ("tests/test_reliability_cli.py::test_draft_heads_beyond_any_drafter_are_one_line",),
    ),
    Mutant(
        "input-heads-uncapped-shape",
        "roofline/shapes.py",
        "            if value > most:",
        "            if value > most * 10**9:",
        "the library prices a million draft heads",
        ("tests/test_reliability_cli.py::test_draft_heads_beyond_any_drafter_are_one_line",),
    ),
    Mutant(
        "startup-console-script-imports-first",
        "pyproject.toml",
        'treeopt = "treeopt.__main__:main"',
        'treeopt = "treeopt.cli:main"',
        "the installed `treeopt` imports the command line outside the Ctrl-C handler (a traceback)",
        ("tests/test_reliability_cli.py::test_ctrl_c_while_the_console_script_imports_is_one_line",),
    ),
    Mutant(
        "startup-ctrl-c-not-caught",
        "treeopt/__main__.py",
        "    except KeyboardInterrupt:  # pressed while the command line imports",
        "    except ImportError:  # pressed while the command line imports",
        "Ctrl-C in the first imports ends in Python's traceback",
        ("tests/test_reliability_cli.py::test_ctrl_c_while_the_console_script_imports_is_one_line",),
    ),
    Mutant(
        "fixed-rounds-best-point-not-bound",
        "treeopt/stats.py",
        "    chosen = int(np.argmax(np.where(shippable, worst, -np.inf)))  # first maximum: the smallest on ties",
        "    chosen = int(np.argmax(np.where(shippable, -worst, -np.inf)))  # first maximum: the smallest on ties",
        "a fixed-round cell ships the tree of worst bound",
        ("tests/test_fixed_rounds.py",),
    ),
    Mutant(
        "fixed-rounds-plain-not-a-rival",
        "treeopt/stats.py",
        "    others = rivals[None, :] & ~np.eye(low.shape[0], dtype=bool)",
        "    others = rivals[None, :] & ~np.eye(low.shape[0], dtype=bool) & (np.arange(low.shape[0]) > 1)",
        "the bound ignores plain decoding and the smallest tree as rivals",
        ("tests/test_fixed_rounds.py",),
    ),
    Mutant(
        "fixed-rounds-ships-without-a-lower-bound",
        "treeopt/stats.py",
        "    if fixed_rounds and (shippable & trees).any():",
        "    if fixed_rounds:",
        "a cell where no tree beats plain decoding at its lower bound is decided anyway",
        ("tests/test_fixed_rounds.py",),
    ),
    Mutant(
        "fixed-rounds-open-rivals-unlisted",
        "treeopt/stats.py",
        "    open_sizes = np.flatnonzero(others[chosen] & (low[chosen] < 1.0 - tolerance))",
        "    open_sizes = np.flatnonzero(others[chosen] & (low[chosen] < 1.0 - 2 * tolerance))",
        "the rivals not shown within the tolerance are not all listed",
        ("tests/test_fixed_rounds.py",),
    ),
    Mutant(
        "fixed-rounds-not-applied-by-select",
        "treeopt/cli/select_cmds.py",
        "        fixed_rounds=fixed_rounds,\n",
        "",
        "treeopt select leaves a finished sweep's open cells undecided",
        ("tests/test_fixed_rounds.py::test_select_decides_a_sweep_file_on_its_rounds_unless_told_to_keep_it_open",),
    ),
    Mutant(
        "fixed-rounds-answer-unexplained",
        "treeopt/app/run_answer.py",
        '    if reason == "best bound":',
        '    if reason == "best-bound":',
        "a run's answer gives a fixed-round cell no reason, bound or open rival",
        ("tests/test_run_answer.py",),
    ),
    Mutant(
        "model-config-nan",
        "calibration/model_checks.py",
        "        if not math.isfinite(value):",
        "        if math.isinf(value):",
        "rms_norm_eps: NaN calibrates a silently wrong table",
        ("tests/test_reliability.py::test_a_model_config_that_would_calibrate_a_wrong_table_is_refused",),
    ),
    Mutant(
        "model-missing-tensor",
        "calibration/model_checks.py",
        '        ("missing_keys", "lacks"),\n',
        "",
        "a checkpoint lacking a tensor is initialised at random and calibrated",
        ("tests/test_reliability.py::test_a_checkpoint_lacking_a_tensor_is_refused_in_one_line",),
    ),
    # ---- multi-head latent attention, published step rows, all-reduce latency, timing estimates
    Mutant(
        "mla-value-up-projection-dropped",
        "roofline/shapes.py",
        "up = self.mla_latent * nh * (self.mla_nope_dim + self.head_dim)",
        "up = self.mla_latent * nh * self.head_dim",
        "MLA's latent up-projection without the keys' part: DeepSeek-V3 short of its published 671 B",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "mla-scores-over-the-latent-only",
        "roofline/ops.py",
        "qk_flops, pv_flops = 2 * scores * cached, 2 * scores * latent",
        "qk_flops, pv_flops = 2 * scores * latent, 2 * scores * latent",
        "MLA's scores priced without the rotary key's 64 dimensions",
        ("tests/test_moe_tensor_parallel.py",),
    ),
    Mutant(
        "published-chain-step-without-acceptance",
        "roofline/published_steps.py",
        "step_ms = float(length) * float(tpot)",
        "step_ms = float(tpot)",
        "a chain's step time taken as its time per output token (tokens per step dropped)",
        ("tests/test_engine_presets.py",),
    ),
    Mutant(
        "sample-size-per-sample-not-per-call",
        "treeopt/timing.py",
        "return inner, dt / inner",
        "return inner, dt",
        "hw calibrate's estimate priced from a whole sample per call",
        ("tests/test_timing.py",),
    ),
    Mutant(
        "all-reduce-unsourced-latency",
        "roofline/hardware.py",
        "collective_latency_s: float = 5e-6",
        "collective_latency_s: float = 10e-6",
        "the all-reduce's fixed latency back at the unsourced 10 us",
        ("tests/test_moe_tensor_parallel.py",),
    ),
)


def _matches(m: Mutant, pattern: str) -> bool:
    p = pattern.lower()
    return any(p in field.lower() for field in (m.id, m.file, m.description, "pending" if m.pending else ""))


def select(mutants, only: list[str], skip: list[str]) -> list[Mutant]:
    chosen = [m for m in mutants if not only or any(_matches(m, p) for p in only)]
    return [m for m in chosen if not any(_matches(m, p) for p in skip)]


#: CI plants the list in this many slices, one slice per commit (slice = `git rev-list --count
#: HEAD` mod ROTATION_COMMITS), so that any ROTATION_COMMITS consecutive commits plant every
#: listed mutant at least once (docs/architecture.md#planted-bugs)
ROTATION_COMMITS = 45


def rotation_slice(mutants, index: int, commits: int = ROTATION_COMMITS) -> list[Mutant]:
    """Slice `index` (mod `commits`) of the rotation: mutant i of the list is in slice
    i mod `commits`, so the slices partition the list, each holds at most
    ceil(len / commits) mutants from all over it, and `commits` consecutive indices plant each
    mutant exactly once (while the list is unchanged)."""
    k = int(index) % commits
    return [m for i, m in enumerate(mutants) if i % commits == k]


def sample(mutants, n: int, seed: str) -> list[Mutant]:
    """n mutants drawn without replacement, the same n for the same seed and list, in list order.
    CI draws with the commit as the seed, so successive commits check different mutants and
    every one is checked over time, while one commit's draw can be rerun exactly."""
    if n >= len(mutants):
        return list(mutants)
    picked = set(random.Random(seed).sample(range(len(mutants)), n))
    return [m for i, m in enumerate(mutants) if i in picked]


def snippet_problems(root: Path, mutants) -> list[str]:
    """One line per mutant whose file is missing or whose snippet is not there exactly once."""
    problems = []
    for m in mutants:
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.id}: {m.file} is not there")
            continue
        count = path.read_text(encoding="utf-8").count(m.original)
        if count != 1:
            problems.append(f"{m.id}: {m.file} holds the snippet {count} times, not once: {m.original!r}")
    return problems


def run_pytest(root: Path, tests, python: str, timeout_s: float) -> tuple[int | None, float, str]:
    """(pytest exit code or None on timeout, seconds, last lines of output) in the copy `root`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    # no bytecode: a mutant of the same size written within the same second as the original
    # would otherwise be served from a stale .pyc
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # a private basetemp: pytest's default one under /tmp is pruned by any other pytest run
    basetemp = root.parent / "pytest-tmp"
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}", *tests]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0, ""
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    return proc.returncode, time.perf_counter() - t0, tail


def check_imports_resolve_to(root: Path, python: str) -> None:
    """The copy, not an installed checkout, must be what the tests import."""
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [python, "-c", "import roofline, treeopt; print(roofline.__file__); print(treeopt.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for file in out:
        if not Path(file).resolve().is_relative_to(root.resolve()):
            raise SystemExit(f"mutants: the tests would import {file}, not the scratch copy under {root}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only mutants whose id, file or description contains PATTERN (repeatable)",
    )
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave out mutants matching PATTERN ('pending': those other branches will kill)",
    )
    ap.add_argument("--list", action="store_true", help="list the selected mutants, check their snippets, run nothing")
    ap.add_argument(
        "--slice",
        type=int,
        default=None,
        metavar="I",
        help=f"run slice I mod {ROTATION_COMMITS} of the rotation (CI: I = git rev-list --count HEAD)",
    )
    ap.add_argument("--sample", type=int, default=0, metavar="N", help="run N mutants drawn with --seed (0: all)")
    ap.add_argument("--seed", default="0", help="seed of the --sample draw (any string; CI passes the commit)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run (a timeout kills)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs pytest")
    args = ap.parse_args(argv)

    listed = MUTANTS
    if args.slice is not None:  # the slice of the whole list, so that the rotation covers it
        listed = rotation_slice(MUTANTS, args.slice)
        print(
            f"mutants: slice {args.slice % ROTATION_COMMITS} of {ROTATION_COMMITS} ({len(listed)} mutants)", flush=True
        )
    mutants = select(listed, args.only, args.skip)
    if args.sample > 0:
        mutants = sample(mutants, args.sample, args.seed)
        print(f"mutants: {len(mutants)} drawn with seed {args.seed!r}", flush=True)
    if not mutants:
        print("mutants: no mutant matches", file=sys.stderr)
        return 2
    problems = snippet_problems(REPO, mutants)
    if args.list:
        for m in mutants:
            note = f"  [pending: {m.pending}]" if m.pending else ""
            print(f"{m.id:30s} {m.file:24s} {m.description}{note}\n{'':30s} tests: {' '.join(m.tests)}")
    for line in problems:
        print(f"mutants: {line}", file=sys.stderr)
    if problems:
        print("mutants: the code moved; update MUTANTS in tools/mutants.py", file=sys.stderr)
        return 2
    if args.list:
        return 0

    results: list[tuple[Mutant, str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="treeopt-mutants-") as tmp:
            root = Path(tmp) / "repo"
            shutil.copytree(REPO, root, ignore=COPY_IGNORE)
            check_imports_resolve_to(root, args.python)
            for tests in sorted({m.tests for m in mutants}):
                code, secs, tail = run_pytest(root, tests, args.python, args.timeout)
                if code != 0:
                    print(
                        f"mutants: without any mutant, pytest {' '.join(tests)} "
                        f"{'timed out' if code is None else f'exits {code}'}:\n{tail}",
                        file=sys.stderr,
                    )
                    return 2
            for i, m in enumerate(mutants, 1):
                path = root / m.file
                original = path.read_text(encoding="utf-8")
                path.write_text(original.replace(m.original, m.replacement, 1), encoding="utf-8")
                try:
                    code, secs, tail = run_pytest(root, m.tests, args.python, args.timeout)
                finally:
                    path.write_text(original, encoding="utf-8")
                if code is None:
                    verdict = "KILLED"
                    how = " (timeout)"
                elif code == 0:
                    verdict, how = "SURVIVED", f" [pending: {m.pending}]" if m.pending else ""
                elif code in KILLING_CODES:
                    verdict, how = "KILLED", ""
                else:
                    verdict, how = "ERROR", f" (pytest exit {code}: {tail.splitlines()[-1] if tail else ''})"
                results.append((m, verdict, secs))
                print(f"[{i:2d}/{len(mutants)}] {verdict:8s} {m.id:30s} {secs:5.1f}s  {m.description}{how}", flush=True)
    except KeyboardInterrupt:
        print("\nmutants: interrupted; the working tree was never modified", file=sys.stderr)
        return 130

    counts = {v: sum(1 for _, verdict, _ in results if verdict == v) for v in ("KILLED", "SURVIVED", "ERROR")}
    total_s = sum(s for _, _, s in results)
    print(
        f"{counts['KILLED']} killed, {counts['SURVIVED']} survived, {counts['ERROR']} errors "
        f"of {len(results)} mutants ({total_s:.0f} s of tests)"
    )
    for m, verdict, _ in results:
        if verdict != "KILLED":
            print(f"  {verdict}: {m.id} ({m.file}): {m.description}")
    if counts["ERROR"]:
        return 2
    return 1 if counts["SURVIVED"] else 0


if __name__ == "__main__":
    sys.exit(main())
