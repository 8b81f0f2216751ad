"""The engine's own acceptance: readers of vLLM /metrics, vLLM per-request JSON and SGLang
meta_info (fixtures in tests/data/engine_acceptance, in the engines' documented formats), the
chain table with its intervals, and the check against expectation. Expected values come from
the counts the fixtures were written with and hand-derived formulas (Wilson 1927, Newcombe
1998 method 10, the normal interval of a mean), never from the code under test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from treeopt import api
from treeopt.accuracy import load_accuracy
from treeopt.build import tau_curve
from treeopt.chain_counts import chain_acceptance, check_expectation, newcombe_difference
from treeopt.cli import main
from treeopt.engine_readers import load_engine_window
from treeopt.errors import UserError
from treeopt.tree import Tree

DATA = Path(__file__).parent / "data" / "engine_acceptance"
Z95 = 1.959963984540054
# The EAGLE-3 window the fixtures hold: 1000 drafts of K = 3 between the two scrapes, 700 / 420
# / 210 of them accepting position 1 / 2 / 3 (vLLM's per-position counters are cumulative).
DRAFTS, REACH = 1000, (700, 420, 210)
HIST = (300, 280, 210, 210)  # exactly 0, 1, 2, 3 accepted: 1000-700, 700-420, 420-210, 210


def f(name: str) -> str:
    return str(DATA / name)


def wilson(x: float, n: float, z: float = Z95) -> tuple[float, float]:
    p = x / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def run(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def run_ok(args, capsys) -> str:
    main(args)
    return capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Readers


def test_scrape_pair_is_the_window_between_them():
    w = load_engine_window([f("vllm_eagle3_after.prom"), f("vllm_eagle3_before.prom")])
    assert (w.engine, w.num_spec_tokens, w.num_drafts) == ("vllm", 3, DRAFTS)
    assert w.accepted_length_histogram == HIST
    assert w.accepted_per_position.tolist() == list(REACH)
    assert w.num_draft_tokens == 3 * DRAFTS


def test_one_scrape_is_the_window_since_the_server_started():
    w = load_engine_window([f("vllm_eagle3_after.prom")])
    assert w.num_drafts == 6000 and w.accepted_per_position.tolist() == [4200, 2520, 1260]


def test_data_parallel_engines_are_summed():
    one = load_engine_window([f("vllm_eagle3_after.prom")])
    two = load_engine_window([f("vllm_dp2_after.prom")])
    assert two.accepted_length_histogram == one.accepted_length_histogram


def test_vllm_per_request_jsonl_and_sglang_meta_info():
    for name, engine in (("vllm_eagle3_requests.jsonl", "vllm"), ("sglang_mtp_requests.jsonl", "sglang")):
        w = load_engine_window([f(name)])
        # four requests of histograms summing to 60 / 56 / 42 / 42 steps
        assert (w.engine, w.accepted_length_histogram, w.window["requests"]) == (engine, (60, 56, 42, 42), 4)


def test_vllm_short_drafts_are_left_out_with_a_note():
    w = load_engine_window([f("vllm_short_drafts.json")])
    assert w.accepted_length_histogram == (30, 28, 21, 21)
    assert w.notes and "2 steps drafted fewer than K = 3" in w.notes[0]


def _write(tmp_path, name, text) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        (["vllm_eagle3_restarted.prom", "vllm_eagle3_before.prom"], "restarted between the scrapes"),
        (["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"], "went down by 1000"),
        (["vllm_k2_after.prom", "vllm_eagle3_before.prom"], "two different K (3 draft positions, then 2)"),
        (["vllm_missing_position.prom"], "not position 1 (missing positions)"),
        (["vllm_two_k_requests.jsonl"], "two different K (3 in record 1, 5 in record 2)"),
    ],
)
def test_planted_inconsistencies_are_one_clear_line(files, needle, tmp_path, capsys):
    out = tmp_path / "chain.json"
    imports = [a for x in files for a in ("--import", f(x))]
    code, _, err = run(["calibrate", *imports, "-o", str(out)], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_reset_without_created_lines_is_caught_by_the_counters(tmp_path):
    strip = lambda name: "\n".join(x for x in (DATA / name).read_text().splitlines() if "_created" not in x)  # noqa: E731
    later = _write(tmp_path, "later.prom", strip("vllm_eagle3_restarted.prom"))
    earlier = _write(tmp_path, "earlier.prom", strip("vllm_eagle3_before.prom"))
    with pytest.raises(UserError, match="went down by 4600: the counters were reset"):
        load_engine_window([later, earlier])


def test_window_too_short(tmp_path):
    before = (DATA / "vllm_eagle3_before.prom").read_text()
    later = before.replace("} 5000.0", "} 5010.0")  # 10 drafts, none accepted
    with pytest.raises(UserError, match="too short: 10 drafts, at least 30"):
        load_engine_window([_write(tmp_path, "l.prom", later), f("vllm_eagle3_before.prom")])
    with pytest.raises(UserError, match="0 drafts"):
        load_engine_window([f("vllm_eagle3_before.prom"), f("vllm_eagle3_before.prom")])


def test_per_position_counts_that_grow_are_not_a_chain(tmp_path):
    text = (DATA / "vllm_eagle3_after.prom").read_text().replace('position="2"} 1260.0', 'position="2"} 3000.0')
    with pytest.raises(UserError, match="position 2 has 3000 accepted tokens, more than the 2520 of position 1"):
        load_engine_window([_write(tmp_path, "a.prom", text)])


def test_sglang_without_histogram_or_with_unclear_k(tmp_path):
    rec = json.loads((DATA / "sglang_mtp_requests.jsonl").read_text().splitlines()[0])
    del rec["meta_info"]["spec_accept_histogram"]
    with pytest.raises(UserError, match="no spec_accept_histogram"):
        load_engine_window([_write(tmp_path, "a.jsonl", json.dumps(rec) + "\n" + json.dumps(rec))])
    rec["meta_info"]["spec_draft_token_num"] = 151
    with pytest.raises(UserError, match="not a multiple of spec_verify_ct 50"):
        load_engine_window([_write(tmp_path, "b.json", json.dumps(rec))])


# ---------------------------------------------------------------------------------------------
# The chain table and its intervals


def test_conditional_acceptance_and_wilson_intervals_by_hand():
    c = chain_acceptance(HIST)
    assert c.tries.tolist() == [1000, 700, 420] and c.accepted.tolist() == list(REACH)
    np.testing.assert_allclose(c.conditional, [0.7, 0.6, 0.5])
    for j, (x, n) in enumerate(zip(REACH, (1000, 700, 420), strict=True)):
        lo, hi = wilson(x, n)
        assert c.conditional_low[j] == pytest.approx(lo, abs=1e-12)
        assert c.conditional_high[j] == pytest.approx(hi, abs=1e-12)


def test_tau_and_its_normal_interval_by_hand():
    c = chain_acceptance(HIST, extra=0)
    # tau(k) = 1 + sum_{j<=k} reach_j / N
    np.testing.assert_allclose(c.tau, [1.0, 1.7, 2.12, 2.33])
    # tau(3): min(L, 3) = L; E[L^2] = (280*1 + 210*4 + 210*9) / 1000 = 3.01, mean 1.33
    var = (3.01 - 1.33**2) * 1000 / 999
    half = Z95 * math.sqrt(var / 1000)
    assert (c.tau_low[3], c.tau_high[3]) == pytest.approx((2.33 - half, 2.33 + half), abs=1e-12)
    # tau(1): min(L, 1) is Bernoulli(0.7): variance 0.21 * 1000 / 999
    half1 = Z95 * math.sqrt(0.21 * 1000 / 999 / 1000)
    assert (c.tau_low[1], c.tau_high[1]) == pytest.approx((1.7 - half1, 1.7 + half1), abs=1e-12)
    assert not c.extrapolated.any()


def test_extrapolation_is_flagged_and_bounded():
    c = chain_acceptance(HIST)
    assert len(c.tau) == 7 and c.extrapolated.tolist() == [False] * 4 + [True] * 3
    # point: the last conditional acceptance (0.5) held: tau(4) = 2.33 + 0.21 * 0.5
    assert c.tau[4] == pytest.approx(2.33 + 0.21 * 0.5)
    assert c.tau[6] == pytest.approx(2.33 + 0.21 * (0.5 + 0.25 + 0.125))
    # bounds: nothing more accepted .. the Wilson upper bounds of reach and of position 3 held
    r_hi, p_hi = wilson(210, 1000)[1], wilson(210, 420)[1]
    assert c.tau_low[5] == pytest.approx(c.tau_low[3])
    assert c.tau_high[5] == pytest.approx(c.tau_high[3] + r_hi * (p_hi + p_hi**2))


def test_chain_table_is_a_first_class_accuracy_table(tmp_path, capsys):
    out = tmp_path / "chain.json"
    text = run_ok(
        [
            "calibrate",
            "--import",
            f("vllm_eagle3_after.prom"),
            "--import",
            f("vllm_eagle3_before.prom"),
            "-o",
            str(out),
        ],
        capsys,
    )
    assert "1,000 verification steps of K = 3" in text and "extrapolated" in text
    table = load_accuracy(out)
    assert (table.num_heads, table.width) == (3, 1)
    chain = Tree([(0,), (0, 0), (0, 0, 0)])
    # tau of every chain length is the observed one: 1 + sum of reach / N
    np.testing.assert_allclose(tau_curve(chain, table), [1.0, 1.7, 2.12, 2.33])
    prov = table.provenance["engine_acceptance"]
    assert prov["format"] == "treeopt.engine_acceptance/v1" and prov["accepted_length_histogram"] == list(HIST)
    from treeopt.app.prediction import load_table

    _, label = load_table(out, None, "llama-3-8b")
    assert "engine-reported" in label and "vllm /metrics" in label and "1,000 verification steps" in label


def test_a_position_nobody_reached_ends_the_table():
    w = load_engine_window([f("vllm_eagle3_requests.jsonl")])
    t = api.chain_table(w.__class__(**{**w.__dict__, "accepted_length_histogram": (50, 50, 0, 0)}))
    assert t.num_heads == 2 and t.hits[:, 0].tolist() == [50, 0]


# ---------------------------------------------------------------------------------------------
# Acceptance against expectation


def test_newcombe_interval_by_hand():
    d, lo, hi = newcombe_difference(40, 200, 700, 1000)
    l1, u1 = wilson(40, 200)
    l2, u2 = wilson(700, 1000)
    assert d == pytest.approx(0.2 - 0.7)
    assert lo == pytest.approx(-0.5 - math.sqrt((0.2 - l1) ** 2 + (u2 - 0.7) ** 2))
    assert hi == pytest.approx(-0.5 + math.sqrt((u1 - 0.2) ** 2 + (0.7 - l2) ** 2))


def test_bonferroni_split_and_tolerance():
    r = check_expectation(([140, 84, 42], [200, 140, 84]), ([700, 420, 210], [1000, 700, 420]))
    assert r.confidence == pytest.approx(1 - 0.05 / 3) and r.consistent
    # a 0.02 drop seen over a million steps is significant but inside the tolerance
    big = check_expectation(([680_000], [1_000_000]), ([700_000], [1_000_000]))
    assert big.consistent
    strict = check_expectation(([680_000], [1_000_000]), ([700_000], [1_000_000]), tolerance=0.0)
    assert not strict.consistent and strict.positions[0].verdict == "below"


def test_check_consistent_window_passes(tmp_path, capsys):
    table = tmp_path / "chain.json"
    run_ok(
        [
            "calibrate",
            "-q",
            "--import",
            f("vllm_eagle3_after.prom"),
            "--import",
            f("vllm_eagle3_before.prom"),
            "-o",
            str(table),
        ],
        capsys,
    )
    for observed in ("vllm_eagle3_requests.jsonl", "sglang_mtp_requests.jsonl"):
        code, out, _ = run(["acceptance", "check", "--observed", f(observed), "--expected", str(table)], capsys)
        assert code == 0 and out.startswith("consistent: 3 positions")


def test_check_collapse_is_caught_at_position_1(capsys):
    args = ["acceptance", "check", "--observed", f("vllm_collapsed_requests.jsonl")]
    args += ["--expected", f("vllm_eagle3_after.prom"), "--expected", f("vllm_eagle3_before.prom")]
    code, out, _ = run(args, capsys)
    assert code == 1 and out.count("\n") == 1
    assert "inconsistent: acceptance collapsed at position 1" in out and "accepts 0.200" in out


def test_check_bad_input_is_exit_2(tmp_path, capsys):
    code, _, err = run(
        [
            "acceptance",
            "check",
            "--observed",
            f("vllm_two_k_requests.jsonl"),
            "--expected",
            f("vllm_eagle3_after.prom"),
        ],
        capsys,
    )
    assert code == 2 and "two different K" in err


# ---------------------------------------------------------------------------------------------
# Schedules for any drafter


@pytest.mark.parametrize(
    "imports",
    [
        ["vllm_eagle3_after.prom", "vllm_eagle3_before.prom"],
        ["vllm_eagle3_requests.jsonl"],
        ["sglang_mtp_requests.jsonl"],
    ],
)
def test_one_command_from_engine_output_to_a_vllm_schedule(imports, tmp_path, capsys):
    out = tmp_path / "chain.json"
    args = ["acceptance", "schedule", *[a for x in imports for a in ("--import", f(x))]]
    args += [
        "--model",
        "llama-3-8b",
        "--hardware",
        "h100-sxm",
        "--context",
        "2048",
        "--batch",
        "1,8,4096",
        "-o",
        str(out),
    ]
    text = run_ok(args, capsys)
    assert "acceptance [95% Wilson]" in text and "0.700 [" in text
    line = next(x for x in text.splitlines() if x.startswith("vLLM: --speculative-config"))
    config = json.loads(line.split("'")[1])
    ranges = config["num_speculative_tokens_per_batch_size"]
    # vLLM's form: inclusive ranges from batch 1, contiguous, K within the served K = 3
    assert ranges[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert config["num_speculative_tokens"] == max(k for *_, k in ranges) <= 3
    # at batch 1 a step is memory-bound: verifying 4 tokens costs about one, so the longest chain wins
    assert ranges[0][2] == 3
    assert load_accuracy(out).num_heads == 3


def test_a_drafter_that_accepts_nothing_is_switched_off(tmp_path):
    from treeopt.app.engine_schedule import chain_schedule

    w = load_engine_window([f("vllm_eagle3_requests.jsonl")])
    dead = api.chain_table(w.__class__(**{**w.__dict__, "accepted_length_histogram": (200, 0, 0, 0)}))
    # tau = 1 at every K, and a step never costs less than plain decoding: no K beats K = 0
    plan = chain_schedule("llama-3-8b", "h100-sxm", dead, batches=[1, 8, 64], contexts=[1024])
    assert [c.draft_len for c in plan.choices] == [0, 0, 0] and plan.vllm is None and plan.switch_off_batch == 1


def test_a_chain_table_whose_provenance_disagrees_with_its_counts_is_refused(tmp_path):
    from treeopt.chain_counts import window_of_table

    table = api.chain_table(f("vllm_eagle3_requests.jsonl"))
    doc = json.loads(json.dumps(table.to_dict()))  # a copy: to_dict shares the provenance
    doc["provenance"]["engine_acceptance"]["accepted_length_histogram"] = [60, 56, 43, 41]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match="does not give the table's positions and hits"):
        window_of_table(load_accuracy(path), str(path))
    assert window_of_table(table, "t").num_drafts == 200


def test_one_indented_response_is_read_as_one_record(tmp_path):
    rec = json.loads((DATA / "vllm_eagle3_requests.jsonl").read_text().splitlines()[1])
    rec["metrics"]["speculative_decoding"]["acceptance_histogram_by_draft_length"]["3"] = [10, 10, 10, 10]
    w = load_engine_window([_write(tmp_path, "one.json", json.dumps(rec, indent=2))])
    assert w.accepted_length_histogram == (10, 10, 10, 10) and w.window["requests"] == 1


def test_a_traffic_mix_gives_its_batch_sizes(capsys):
    args = ["acceptance", "schedule", "--import", f("sglang_mtp_requests.jsonl"), "--model", "llama-3-8b"]
    args += ["--hardware", "h100-sxm", "--context", "2048", "--mix", "1:0.7,256:0.3", "--method", "mtp"]
    text = run_ok(args, capsys)
    line = next(x for x in text.splitlines() if x.startswith("best K per batch size"))
    assert [c.split(":")[0] for c in line.split("off): ", 1)[1].split(", ")] == ["1", "256"]
    assert '"method": "mtp"' in text
