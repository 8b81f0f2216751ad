"""Engine presets (docs/performance-model.md#engine-presets): the data file is the derivation
script's output, a preset changes only the engine terms of a built-in profile, a profile file keeps
its own, engines map to their families, the CLI names the preset that priced the answer, and a
preset's predicted T(n)/T(0) on a held-out published row is the hand-computed one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from roofline.engine_presets import (
    DATA_FILE,
    ENGINE_FAMILY,
    FAMILIES,
    PRESET_FIELDS,
    apply_preset,
    builtin_base,
    calibrated_line,
    engine_family,
    load_presets,
    step_costs,
)
from roofline.hardware import load_hardware
from roofline.latency import step_time_s
from roofline.profile_fit import predict_step_s
from roofline.published_steps import published_tables, step_points
from roofline.shapes import draft_heads_shape, model_shape
from roofline.step_shape import StepShape
from treeopt.cli import main
from treeopt.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
ACC = str(ROOT / "treeopt" / "data" / "medusa_train_accuracy.csv")
SPEEDUP = ["roofline", "speedup", "--model", "vicuna-7b", "--hardware", "a100-80gb-sxm", "--accuracy", ACC]
SPEEDUP += ["--csv-model", "vicuna-7b", "--batch", "1,8", "--context", "1024"]


def run(capsys, *args) -> str:
    """stdout + stderr of `treeopt ARGS`, which must succeed."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    out, err = capsys.readouterr()
    assert (exc.value.code or 0) == 0, out + err
    return out + err


def _script():
    spec = importlib.util.spec_from_file_location("fit_engine_presets", ROOT / "tools" / "fit_engine_presets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(a, b, path="") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        # to 0.5% or 30 us: a term the rows leave almost free (a range's end near zero) and the
        # errors that follow it move that much with where the solver starts (tried: 1 and 3 ms)
        assert b == pytest.approx(a, rel=5e-3, abs=3e-5), path
    else:
        assert a == b, path


def test_the_data_file_is_the_derivation_scripts_output():
    _close(_script().derive(), json.loads(DATA_FILE.read_text(encoding="utf-8")))


def test_measured_presets_carry_fitted_terms_with_ranges_and_sources():
    presets = load_presets()
    assert tuple(presets) == FAMILIES
    for name in ("hf-eager", "ibm-tgis"):
        p = presets[name]
        assert p.measured and p.sources and p.fit_rows and p.held_out
        assert p.terms["spec_step_overhead_s"] > 0
        for k, v in p.terms.items():
            lo, hi = p.ranges[k]
            assert lo <= v <= hi, (name, k)
    assert not presets["ideal"].measured and presets["ideal"].terms == {}
    # vLLM: fitted on SpecDecode-Bench's cost model; TensorRT-LLM and SGLang publish no step of their
    # own and carry vLLM's terms with wider ranges (docs/performance-model.md#engine-presets)
    vllm = presets["vllm"]
    assert vllm.measured and vllm.sources and vllm.fit_rows and vllm.held_out
    # SGLang's own terms (tests below): its tree verification, carried to vLLM, and its EAGLE-3 drafting
    own = {"trtllm": (), "sglang": ("draft_stage_s", "spec_step_overhead_s")}
    for name in ("trtllm", "sglang"):
        p = presets[name]
        carried = {k: v for k, v in p.terms.items() if k not in own[name]}
        assert not p.measured and p.carried_from == "vllm"
        assert carried == {k: v for k, v in vllm.terms.items() if k not in own[name]}
        for k, v in carried.items():
            if k == "tree_verify_layer_s":
                continue
            assert p.ranges[k][0] <= vllm.ranges[k][0] <= v <= vllm.ranges[k][1] <= p.ranges[k][1], (name, k)
    # the IBM engine pays a fixed cost per speculative step of a few ms (the paper's 4-token step is
    # 1.31 plain steps)
    assert 2e-3 < presets["ibm-tgis"].terms["spec_step_overhead_s"] < 5e-3


def test_a_preset_changes_only_the_engine_terms_of_a_builtin_profile():
    base = load_hardware("a100-80gb-sxm")
    priced = apply_preset(base, "ibm-tgis")
    changed = {k for k in base.__dataclass_fields__ if getattr(base, k) != getattr(priced, k)}
    assert changed <= set(PRESET_FIELDS) | {"source"}
    assert {"spec_step_overhead_s", "verified_token_s", "forward_overhead_s"} <= changed
    assert priced.peak_flops == base.peak_flops and priced.bandwidth_bytes_per_s == base.bandwidth_bytes_per_s
    assert priced.eta_memory == base.eta_memory and priced.gemm_efficiency == base.gemm_efficiency
    assert builtin_base(priced) == base
    # the ideal engine is the built-in profile itself (vllm was one until it was fitted)
    assert apply_preset(base, "ideal") == base


def test_engines_map_to_their_families_as_documented():
    assert set(ENGINE_FAMILY) == set(ENGINES)  # every engine entry; aliases resolve to one
    assert engine_family("vllm@0.33") == "vllm" and engine_family("sglang@0.5.23") == "sglang"
    assert engine_family("medusa") == "hf-eager"
    assert engine_family("hydra") == "hf-eager"
    assert engine_family("treeopt") == "hf-eager"
    assert engine_family("trtllm") == "trtllm"
    for e in ("vllm", "vllm@0.20", "vllm-medusa@0.32", "vllm-mlp-speculator@0.10", "vllm-draft-model"):
        assert engine_family(e) == "vllm"
    assert engine_family("sglang-standalone") == "sglang"
    assert engine_family(None) == "ideal"
    assert engine_family("ibm-tgis") == "ibm-tgis"


def test_a_profile_file_keeps_its_own_terms(tmp_path, capsys):
    own = load_hardware("a100-80gb-sxm").with_(name="my-a100", spec_step_overhead_s=1e-3, calibration={"x": 1})
    costs = step_costs(own, engine="medusa")
    assert costs.profile == own and costs.family is None
    assert "hf-eager preset is not applied" in costs.line
    path = tmp_path / "my.json"
    own.save(path)
    output = run(capsys, *SPEEDUP[:5], str(path), *SPEEDUP[6:], "--engine", "medusa")
    assert "step costs: the profile's own terms (my-a100, calibrated); the hf-eager preset is not applied" in output


def test_roofline_speedup_names_the_preset_that_priced_it(capsys):
    plain = run(capsys, *SPEEDUP)
    assert "step costs: ideal engine (no cost beyond the forward pass)" in plain.splitlines()
    medusa = run(capsys, *SPEEDUP, "--engine", "medusa")
    assert "step costs: hf-eager preset (Cai et al. 2024 (Medusa), arXiv 2401.10774, Appendix F and Table 1)" in (
        medusa.splitlines()
    )
    ibm = run(capsys, *SPEEDUP, "--engine-costs", "ibm-tgis")
    assert any(line.startswith("step costs: ibm-tgis preset (Wertheimer") for line in ibm.splitlines())
    # a fixed cost per speculative step changes the best trees the ideal engine picked
    assert ibm.split("batch")[-1] != plain.split("batch")[-1]


def test_an_engine_without_its_own_measurement_says_whose_terms_it_carries(capsys):
    output = run(capsys, *SPEEDUP, "--engine", "sglang")
    lines = [line for line in output.splitlines() if line.startswith("step costs:")]
    assert len(lines) == 1
    assert lines[0].startswith("step costs: sglang preset, the vllm preset's terms with wider ranges")


def test_report_records_the_preset(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["report", "--model", "vicuna-7b", "--hardware", "a100-80gb-pcie", "--accuracy", ACC]
    args += ["--csv-model", "vicuna-7b", "--batch", "1", "--context", "1024", "--engine", "hydra", "-o", str(out)]
    output = run(capsys, *args)
    assert output.startswith("step costs: hf-eager preset (Cai et al. 2024")
    index = (out / "index.md").read_text(encoding="utf-8")
    assert "- **Step costs**: hf-eager preset (Cai et al. 2024" in index
    assert "carries the hf-eager engine preset" in index
    assert "This report's profile `a100-80gb-pcie`:" in index  # still the built-in's knee sentence
    assert not (out / "hardware.json").exists()


def test_hw_list_and_published_show_the_presets(capsys):
    listed = run(capsys, "hw", "list")
    assert "Engine presets (value, range)" in listed
    rows = {line.split()[0]: line for line in listed.splitlines() if line.split()[:1] and line.split()[0] in FAMILIES}
    assert set(rows) == set(FAMILIES)
    assert rows["ibm-tgis"].split()[1] == "yes" and rows["vllm"].split()[1] == "yes"
    # SGLang fits its drafting and tree term on its own steps and carries vLLM's forward terms; TensorRT-LLM
    # fits none of the terms (its n-gram host gap is a drafter cost, not a term)
    assert rows["sglang"].split()[1] == "partly" and rows["trtllm"].split()[1] == "carried"
    assert rows["ideal"].split()[1] == "no"
    assert "drafting per depth by drafter kind (vllm): eagle 749 us" in listed
    assert "ngram 1.1 ms per step" in listed  # the trtllm preset's CPU n-gram host gap, once a step
    published = run(capsys, "hw", "published")
    assert "== engine presets: published speculative steps" in published
    assert "sglang: no fit of its own (but draft_stage_s, tree_verify_layer_s, spec_step_overhead_s);" in published
    assert "drafting per depth by drafter kind (sglang): eagle 346 us, eagle3 346 us, mtp 346 us" in listed
    assert "  tree_verify_layer_s 31.8 us (25.1 us-37.5 us): mean over the SpecBundle dashboard's trees" in published
    assert "  tree_verify_layer_s 31.8 us (12.6 us-74.9 us): carried from the sglang preset: no published" in published
    assert "carried from the sglang preset: no published measurement of TensorRT-LLM verifying" in published
    assert "  draft_stage_s 346 us (344 us-781 us): slope of the line through the SpecBundle dashboard's" in published
    assert "  spec_step_overhead_s 858 us (850 us-872 us): intercept (depth 0) of the line" in published


def test_sglang_tree_verification_per_layer_is_the_mean_of_specbundle_trees_minus_chains():
    # typed from SpecForge's SpecBundle dashboard (data.json, MT-Bench): step = batch x acceptance
    # length / throughput; trees minus chains of equal counts, per target layer
    def step(batch, accept, throughput):
        return batch * accept / throughput

    llama8b = [  # batch 1, 32 layers: 5-3-6 minus 5-1-6, 7-4-8 minus 7-1-8
        (step(1, 3.0061, 346.47) - step(1, 3.5164, 446.64)) / 32,
        (step(1, 2.9382, 308.01) - step(1, 3.8558, 450.03)) / 32,
    ]
    llama70b = [  # batch 8, 80 layers
        (step(8, 3.2249, 1108.31) - step(8, 3.6175, 1409.51)) / 80,
        (step(8, 3.2422, 1033.77) - step(8, 3.9779, 1440.37)) / 80,
    ]
    pairs = llama8b + llama70b  # 25.1, 30.4, 34.3, 37.5 us
    presets = load_presets()
    sglang = presets["sglang"]
    assert sglang.terms["tree_verify_layer_s"] == pytest.approx(sum(pairs) / 4, rel=1e-3)
    assert sglang.ranges["tree_verify_layer_s"] == pytest.approx((min(pairs), max(pairs)), rel=1e-3)
    assert set(sglang.fitted_tables) == {"specbundle-llama-3.1-8b", "specbundle-llama-3.3-70b"}
    # no engine release publishes it elsewhere: vLLM and TensorRT-LLM carry it, range 2x wider each way
    for name in ("vllm", "trtllm"):
        p = presets[name]
        assert p.terms["tree_verify_layer_s"] == sglang.terms["tree_verify_layer_s"]
        assert p.ranges["tree_verify_layer_s"] == pytest.approx((min(pairs) / 2, max(pairs) * 2), rel=1e-3)
        assert "no published measurement" in p.hows["tree_verify_layer_s"] and not p.fitted_tables
    # the ideal engine and the eager research code: no tree cost beyond a chain's
    assert apply_preset(load_hardware("h200"), "ideal").tree_verify_layer_s == 0.0
    assert apply_preset(load_hardware("h200"), "sglang").tree_verify_layer_s == pytest.approx(sum(pairs) / 4, rel=1e-3)


def test_run_index_names_the_calibrated_profile():
    assert calibrated_line("cpu", None) == (
        "step costs: the profile's own terms (cpu, calibrated: treeopt's reference decoder here)"
    )
    assert "the hf-eager preset of --engine medusa is not applied" in calibrated_line("cpu", "medusa")


def _ideal_ms(rows, hw):
    shape = model_shape(rows["shape"].iloc[0])
    k = int(rows["draft_heads"].max())
    heads = draft_heads_shape(shape, k) if k > 0 else None
    return 1e3 * predict_step_s(shape, heads, hw, step_points(rows))


def test_preset_ratio_on_held_out_rows_is_the_hand_computed_one():
    tables = {t.id: t for t in published_tables()}
    presets = load_presets()
    # IBM, prompt 2048 (held out), batch 2: plain and 8 candidates of 3 + 1 tokens
    steps = tables["ibm-table1"].steps
    held = steps[(steps["context"] == 2048) & (steps["batch"] == 2)]
    rows = held[held["tokens"].isin([1, 32])].sort_values("tokens").reset_index(drop=True)
    assert list(rows["tokens"]) == [1, 32]
    base = load_hardware("a100-80gb-sxm")
    t0, tn = _ideal_ms(rows, base) / 1e3
    p = presets["ibm-tgis"].terms
    b, q = 2, 32
    hand = (tn + p["forward_overhead_s"] + p["spec_step_overhead_s"] + p["verified_token_s"] * b * q) / (
        t0 + p["forward_overhead_s"] + p["verified_token_s"] * b * 1
    )
    got = _ideal_ms(rows, apply_preset(base, "ibm-tgis"))
    assert got[1] / got[0] == pytest.approx(hand, rel=1e-9)
    assert abs(hand / rows["ratio"].iloc[1] - 1) < 0.15  # within the done-when's 15% on this row
    # Medusa App. F, Vicuna-33B (held out): the 64-token tree with 4 heads over the plain step
    steps = tables["medusa-appF"].steps
    rows = steps[steps["group"] == "Vicuna-33B"].sort_values("tokens").reset_index(drop=True)
    base = load_hardware("a100-80gb-pcie")
    t0, tn = _ideal_ms(rows, base) / 1e3
    e = presets["hf-eager"].terms
    layers = model_shape("llama-33b").layers
    fixed = e.get("forward_overhead_s", 0.0) + layers * e.get("layer_overhead_s", 0.0)
    hand = (tn + fixed + e["spec_step_overhead_s"]) / (t0 + fixed)
    got = _ideal_ms(rows, apply_preset(base, "hf-eager"))
    assert got[1] / got[0] == pytest.approx(hand, rel=1e-9)
    assert np.isfinite(hand) and hand > 1.0


# SpecDecode-Bench's cost model of vLLM 0.10.1 (Liu et al. 2026, arXiv 2601.11580;
# SpecDecode-Bench/simulator predictor.py, class Llama8BH100), typed here from the source, not read
# from the project's data: Llama-3.1-8B, one H100, EAGLE chain of k = 3
SDB_FORWARD = (39.2645679e-9, 21.0103129e-6, 5.88590713e-3)  # per KV token in the batch, per batched token, fixed
SDB_DRAFT = (2.37768493e-9, 0.841429603e-6, 2.13526175e-3)  # per KV token, per request token, fixed
SDB_OVERHEAD = 1.20683946e-3  # per step, plain or speculative


def _sdb_ratio(b: int, s: int, k: int = 3) -> float:
    kv = b * s
    plain = SDB_FORWARD[0] * kv + SDB_FORWARD[1] * b + SDB_FORWARD[2] + SDB_OVERHEAD
    spec = SDB_FORWARD[0] * kv + SDB_FORWARD[1] * b * (k + 1) + SDB_FORWARD[2] + SDB_OVERHEAD
    spec += SDB_DRAFT[0] * kv + SDB_DRAFT[1] * (k + 1) + SDB_DRAFT[2]
    return spec / plain


def _treeopt_ratio(engine: str, b: int, s: int, k: int = 3) -> float:
    from roofline.latency import step_time_s
    from roofline.step_shape import StepShape

    hw = step_costs(load_hardware("h100-sxm"), engine=engine, drafter="eagle").profile
    shape = model_shape("llama-3-8b")
    plain = step_time_s(shape, None, hw, StepShape(b, 1, s))
    return step_time_s(shape, None, hw, StepShape(b, k + 1, s, draft_stages=k)) / plain


def test_sglang_eagle3_drafting_is_the_line_through_specbundle_chains():
    """SpecForge's SpecBundle dashboard (data.json, MT-Bench), typed here: Llama-3.1-8B on one H200 at
    batch 1, plain decoding and the chains 3-1-4, 5-1-6, 7-1-8. Each chain's step over the plain one
    against its draft depth is a line: its slope SGLang's drafting per depth, its intercept its cost
    per speculative step. The fit also subtracts the forward's growth with two more verified tokens,
    about 4 us a token at batch 1 on one GPU, within 2% of either number."""

    def step(batch, accept, throughput):
        return batch * accept / throughput

    plain = step(1, 1.0, 189.98)
    chains = {3: step(1, 2.8981, 404.25), 5: step(1, 3.5164, 446.64), 7: step(1, 3.8558, 450.03)}
    excess = {d: s - plain for d, s in chains.items()}  # 1.905, 2.609, 3.304 ms
    slope = (excess[7] - excess[3]) / 4  # least squares through three evenly spaced depths: 0.350 ms
    intercept = sum(excess.values()) / 3 - 5 * slope  # 0.858 ms
    pairs = [(excess[5] - excess[3]) / 2, (excess[7] - excess[5]) / 2, slope]  # 0.352, 0.347, 0.350 ms
    # the 70B chains (four H200s, batch 8): their whole step growth per depth bounds drafting from above
    b70 = [step(8, 2.9607, 1238.47), step(8, 3.6175, 1409.51), step(8, 3.9779, 1440.37)]
    bound = max((b70[1] - b70[0]) / 2, (b70[2] - b70[1]) / 2)  # 0.781 ms
    sglang = load_presets()["sglang"]
    # the forward grows with the two more verified tokens a depth, so drafting is a little below the raw
    # growth: in the data file and in the script's fit (on the preset's carried forward terms)
    assert 0.98 * slope < sglang.terms["draft_stage_s"] < slope
    carried = {k: load_presets()["vllm"].terms[k] for k in ("forward_overhead_s", "verified_token_s")}
    fitted, _ = _script().sglang_drafting(published_tables(), load_hardware("h200").with_(**carried))
    assert 0.98 * slope < fitted["value"] < slope
    assert sglang.terms["spec_step_overhead_s"] == pytest.approx(intercept, rel=0.02)
    lo, hi = sglang.ranges["draft_stage_s"]
    assert lo == pytest.approx(min(pairs), rel=0.02) and hi == pytest.approx(bound, rel=1e-3)
    # half vLLM's carried 0.75 ms: SGLang drafts a chain's depths in one CUDA graph
    assert sglang.terms["draft_stage_s"] < 0.5 * load_presets()["vllm"].terms["draft_stage_s"]
    # EAGLE runs through SGLang's same EAGLEWorker; MTP too, with a range twice as wide each way
    assert (
        sglang.drafting["eagle"]
        == sglang.drafting["eagle3"]
        == sglang.drafting["mtp"]
        == pytest.approx(slope, rel=0.02)
    )
    assert sglang.drafting_ranges["mtp"] == pytest.approx((min(pairs) / 2, bound * 2), rel=0.02)
    base = load_hardware("h200")
    for kind in ("eagle", "eagle3", "mtp"):
        priced = apply_preset(base, "sglang", kind)
        assert priced.draft_stage_s == pytest.approx(slope, rel=0.02) and priced.spec_step_overhead_s == pytest.approx(
            intercept, rel=0.02
        )
    assert {"specbundle-llama-3.1-8b", "specbundle-llama-3.3-70b"} == set(sglang.fitted_tables)


# Every preset a user can pick for an EAGLE chain on an H100 prices SpecDecode-Bench's measured vLLM step
# within 10% at the median (issue 42's first target); SGLang's drafting is its own (above), fitted on
# SGLang's steps, not on this cost model, and must still land within it
@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_whole_speculative_step_matches_specdecode_bench_within_ten_percent(engine):
    cells = [(b, s) for b in (1, 2, 4, 8, 16, 32, 64, 128) for s in (512, 2048)]
    errors = np.array([_treeopt_ratio(engine, b, s) / _sdb_ratio(b, s) - 1 for b, s in cells])
    assert np.median(np.abs(errors)) <= 0.10
    # the batches the preset was not fitted on (2, 4, 128) within 15%
    held = np.array([e for (b, _), e in zip(cells, errors, strict=True) if b in (2, 4, 128)])
    assert np.median(np.abs(held)) <= 0.15
    # the ideal engine misses by about a fifth (the issue's -21% median): the preset is what fixes it
    ideal = np.array([_treeopt_ratio("ideal", b, s) / _sdb_ratio(b, s) - 1 for b, s in cells])
    assert np.median(ideal) < -0.15


def test_on_off_calls_agree_with_specdecode_bench():
    # speculation pays when the tokens per step beat the step's cost ratio; at tau of an EAGLE chain
    # (1.3-2.5 tokens per step) the preset makes the same call as the published cost model
    calls = [
        (tau > _treeopt_ratio("vllm", b, s), tau > _sdb_ratio(b, s))
        for tau in (1.3, 1.4, 1.5, 1.7, 2.0, 2.5)
        for b in (1, 8, 32, 64, 128)
        for s in (512, 2048)
    ]
    assert np.mean([a == b for a, b in calls]) >= 0.9


# vLLM issue #20780 (github.com/vllm-project/vllm/issues/20780), typed here from the issue: Llama-3.1-8B at
# batch 1, chains of K = 2..7 draft tokens; acceptance length (bonus included) and time per output token,
# vanilla 7.07 ms. Measured by another author on another vLLM release than SpecDecode-Bench's cost model.
ISSUE_20780_K = (2, 3, 4, 5, 6, 7)
ISSUE_20780 = {
    "eagle": ((2.1, 2.29, 2.39, 2.43, 2.45, 2.47), (4.37, 4.29, 4.48, 4.71, 4.94, 5.2)),
    "eagle3": ((2.36, 2.79, 3.08, 3.32, 3.46, 3.54), (4.32, 4.09, 4.05, 4.13, 4.2, 4.29)),
}


def test_the_vllm_preset_predicts_independent_published_chains():
    """The preset, fitted on SpecDecode-Bench's cost model only, against vLLM issue #20780's
    measured chains (T(K)/T(0) = acceptance length x TPOT(K) / TPOT(vanilla)): within the 15%
    held-out target at the median, the chain length it would ship costs at most 5% more per
    token than the measured best, and it calls speculation on where it measured faster, for
    EAGLE and EAGLE-3."""
    errors = []
    for lengths, tpot in ISSUE_20780.values():
        measured = np.array(lengths) * np.array(tpot) / 7.07
        predicted = np.array([_treeopt_ratio("vllm", 1, 512, k) for k in ISSUE_20780_K])
        errors += list(predicted / measured - 1)
        per_token = np.array(tpot)  # measured ms per token of each K
        picked = int(np.argmin(predicted / np.array(lengths)))
        assert per_token[picked] <= 1.05 * per_token.min()
        # on or off: every measured chain beat vanilla (TPOT < 7.07 ms); the preset says so too
        assert np.all(per_token < 7.07) and np.all(np.array(lengths) > predicted)
    assert np.median(np.abs(errors)) <= 0.15
    # the data file holds the same numbers as the issue prints
    rows = {t.id: t for t in published_tables()}["vllm-issue-20780"].steps
    eagle3 = rows[(rows["group"] == "eagle3, batch 1") & (rows["tokens"] > 1)]
    assert eagle3["ratio"].to_numpy() == pytest.approx(np.multiply(*ISSUE_20780["eagle3"]) / 7.07, rel=1e-12)


# EAGLE-3's Table 3 (Li et al. 2025, arXiv 2503.01840, measured by the SGLang team), typed here from the
# paper: SGLang v0.4.4, Llama-3.1-8B on one H100, EAGLE-3 chains of 3, speedup over no speculation per batch
TABLE3_BATCHES = (2, 4, 8, 16, 24, 32, 48, 56, 64)
TABLE3_EAGLE3 = (1.81, 1.82, 1.62, 1.48, 1.39, 1.32, 1.38, 1.34, 1.38)


def test_the_sglang_preset_follows_eagle3_speedups_over_batch():
    """No tokens per step is printed, but with tau the same at every batch speedup(b) =
    speedup(2) x ratio(2) / ratio(b): from batch 2's speedup alone the preset predicts batches
    4-64 within 15% at the median, and that speculation still pays at every one of them."""
    shape, hw = model_shape("llama-3-8b"), step_costs(load_hardware("h100-sxm"), engine="sglang", drafter="eagle3")
    from roofline.latency import step_time_s
    from roofline.step_shape import StepShape

    ratio = np.array(
        [
            step_time_s(shape, None, hw.profile, StepShape(b, 4, 512, draft_stages=3))
            / step_time_s(shape, None, hw.profile, StepShape(b, 1, 512))
            for b in TABLE3_BATCHES
        ]
    )
    measured = np.array(TABLE3_EAGLE3)
    predicted = measured[0] * ratio[0] / ratio
    assert np.median(np.abs(predicted[1:] / measured[1:] - 1)) <= 0.15
    assert np.all(predicted > 1) and np.all(measured > 1)


def test_drafter_kind_sets_the_cost_per_drafted_depth():
    base = load_hardware("h100-sxm")
    presets = load_presets()
    eagle = presets["vllm"].drafting["eagle"]
    assert 0.5e-3 < eagle < 1.0e-3  # SpecDecode-Bench's 2.135 ms EAGLE drafting over k = 3 depths, about 0.71 ms
    assert apply_preset(base, "vllm", "eagle").draft_stage_s == eagle
    assert apply_preset(base, "vllm", "eagle3").draft_stage_s == eagle  # carried, with a wider range
    lo, hi = presets["vllm"].drafting_ranges["eagle3"]
    assert lo < presets["vllm"].drafting_ranges["eagle"][0] and hi > presets["vllm"].drafting_ranges["eagle"][1]
    for priced_as_operators in ("medusa", "hydra", "mlp-speculator", "draft-model", "ngram"):
        assert apply_preset(base, "vllm", priced_as_operators).draft_stage_s == 0.0
    with pytest.raises(Exception, match="drafter kind"):
        apply_preset(base, "vllm", "lookahead")


def test_trtllm_charges_its_cpu_ngram_drafters_host_gap_once_per_speculative_step():
    """TensorRT-LLM PR #19437's traces (gpt-oss, TP 4, B200): the CPU n-gram drafter leaves ~1.3 ms
    between forward passes, ~0.2 ms once overlapped; the difference is a host cost of each
    speculative step, whatever the draft length (docs/performance-model.md#engine-presets)."""
    base = load_hardware("b200")
    ngram = apply_preset(base, "trtllm", "ngram")
    assert ngram.spec_step_overhead_s == pytest.approx(1.3e-3 - 0.2e-3)
    assert ngram.draft_stage_s == 0.0
    lo, hi = load_presets()["trtllm"].drafting_ranges["ngram"]
    assert lo == pytest.approx((1.3e-3 - 0.2e-3) / 2) and hi == pytest.approx(2 * 1.3e-3)
    # vLLM's numba proposer: ~0 (SpecDecode-Bench's 0.59% of the forward)
    assert apply_preset(base, "vllm", "ngram").spec_step_overhead_s == 0.0
    # once a step: chains of 1 and of 5 pay the same n-gram cost over a drafter the preset prices at 0
    free = apply_preset(base, "trtllm", "medusa")
    step = StepShape(8, np.array([2, 6]), 1024, draft_stages=np.array([1, 5]))
    shape = model_shape("llama-3-70b")
    extra = np.asarray(step_time_s(shape, None, ngram, step)) - np.asarray(step_time_s(shape, None, free, step))
    assert extra == pytest.approx([1.1e-3, 1.1e-3], rel=1e-6)


def test_roofline_predict_takes_the_preset_and_the_drafter_kind(tmp_path, capsys):
    # SpecDecode-Bench's held-out batches 2 and 128 at context 2048: plain and k = 3 EAGLE steps,
    # step_ms from the coefficients typed above
    rows = []
    for b in (2, 128):
        for tokens, stages in ((1, 0), (4, 3)):
            kv = b * 2048
            ms = SDB_FORWARD[0] * kv + SDB_FORWARD[1] * b * tokens + SDB_FORWARD[2] + SDB_OVERHEAD
            if tokens > 1:
                ms += SDB_DRAFT[0] * kv + SDB_DRAFT[1] * tokens + SDB_DRAFT[2]
            rows.append(f"{b},2048,{tokens},1,{stages},{1e3 * ms:.6f}")
    points = tmp_path / "p.csv"
    points.write_text("batch,context,tokens,candidates,draft_stages,step_ms\n" + "\n".join(rows) + "\n")
    common = ["roofline", "predict", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--points", str(points)]
    out = tmp_path / "o.csv"
    text = run(capsys, *common, "--engine", "vllm", "--drafter", "eagle", "-o", str(out))
    assert "step costs: vllm preset (Liu et al. 2026" in text
    import pandas as pd

    got = pd.read_csv(out)
    assert np.all(np.abs(got["error"]) < 0.15)
    # the ideal engine misses the speculative steps' drafting
    ideal = tmp_path / "i.csv"
    run(capsys, *common, "-o", str(ideal))
    spec = pd.read_csv(ideal)["tokens"] > 1
    drafting_s = 3 * load_presets()["vllm"].drafting["eagle"]
    assert np.all(pd.read_csv(ideal)["error"][spec] < got["error"][spec] - 0.5 * drafting_s / 30e-3)
    # Medusa's heads are priced as operators: no cost per drafted depth, the speculative steps as the ideal's
    medusa = tmp_path / "m.csv"
    run(capsys, *common, "--engine-costs", "vllm", "--drafter", "medusa", "-o", str(medusa))
    medusa_ms = pd.read_csv(medusa)["predicted_step_ms"][spec]
    eagle_ms = got["predicted_step_ms"][spec]
    assert np.allclose(eagle_ms - medusa_ms, 1e3 * drafting_s, rtol=1e-3)


def test_roofline_predict_says_which_plain_steps_its_profile_does_not_price(tmp_path, capsys):
    """SpecDecode-Bench's plain step at batch 2, context 2048 (typed coefficients above), then the
    same step as a host-bound run would report it, three times as long, and one a third as long:
    the two are beyond twice the prediction either way and named by their data rows, with factors
    3 and 1/3 times the first row's; a speculative step is never judged so."""
    ms = 1e3 * (SDB_FORWARD[0] * 2 * 2048 + SDB_FORWARD[1] * 2 + SDB_FORWARD[2] + SDB_OVERHEAD)
    points = tmp_path / "p.csv"
    points.write_text(
        "batch,context,tokens,step_ms\n"
        f"2,2048,1,{ms:.6f}\n2,2048,1,{3 * ms:.6f}\n2,2048,1,{ms / 3:.6f}\n2,2048,4,{5 * ms:.6f}\n"
    )
    common = ["roofline", "predict", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--engine", "vllm"]
    text = run(capsys, *common, "--points", str(points), "-o", str(tmp_path / "o.csv"))
    import pandas as pd

    factor = 1 / (1 + pd.read_csv(tmp_path / "o.csv")["error"][0])
    assert 0.85 < factor < 1.15
    line = next(x for x in text.splitlines() if "plain steps measured beyond" in x)
    assert line.startswith("2 of 3 plain steps measured beyond 2x the prediction either way")
    assert f"data rows 2 ({3 * factor:.2f}x), 3 ({factor / 3:.2f}x)" in line and "treeopt hw fit" in line
    points.write_text(f"batch,context,tokens,step_ms\n2,2048,1,{ms:.6f}\n2,2048,4,{5 * ms:.6f}\n")
    text = run(capsys, *common, "--points", str(points), "-o", str(tmp_path / "q.csv"))
    assert "plain steps measured beyond" not in text


def test_roofline_predict_prices_sglangs_tree_on_eight_h100s_with_tensor_parallel(tmp_path, capsys):
    """SGLang PR #4716: Llama-3.3-70B on eight H100s (TP 8), plain decoding at 88.61 tokens/s (a
    1000 / 88.61 = 11.29 ms step) and the 8-8-64 EAGLE-3 tree at 234.54 tokens/s and 5.88 tokens a
    step (1000 x 5.88 / 234.54 = 25.07 ms). With --tensor-parallel 8 the plain step is priced within
    10% of the measured one; on one GPU the same 70B plain step costs over three times as much."""
    points = tmp_path / "p.csv"
    points.write_text(
        "batch,context,tokens,draft_stages,tree,step_ms\n"
        f"1,512,1,0,0,{1000 / 88.61:.4f}\n1,512,64,8,1,{1000 * 5.88 / 234.54:.4f}\n"
    )
    common = ["roofline", "predict", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--engine", "sglang"]
    common += ["--drafter", "eagle3", "--points", str(points)]
    text = run(capsys, *common, "--tensor-parallel", "8", "-o", str(tmp_path / "tp8.csv"))
    assert "steps of llama-3-70b on h100-sxm x 8" in text
    import pandas as pd

    tp8 = pd.read_csv(tmp_path / "tp8.csv")
    assert abs(tp8["error"][0]) < 0.10
    run(capsys, *common, "-o", str(tmp_path / "tp1.csv"))
    assert pd.read_csv(tmp_path / "tp1.csv")["predicted_step_ms"][0] > 3 * 1000 / 88.61
