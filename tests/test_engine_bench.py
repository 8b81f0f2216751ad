"""Engines' own benchmark output as `hw fit` measurements (roofline/engine_bench.py,
docs/performance-model.md#engine-benchmark-files). The fixtures under tests/data/engine_bench
keep each engine's layout; the expected step rows are derived here from the fixtures' fields."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

import treeopt
from roofline.engine_bench import RunOptions, detect_format, read_step_tables
from roofline.profile_fit import read_step_points
from treeopt.cli import main
from treeopt.errors import UserError

DATA = Path(__file__).parent / "data" / "engine_bench"
SGLANG = DATA / "sglang_bench_one_batch.jsonl"
VLLM = DATA / "vllm_latency_b8_in512_out128.json"
VLLM_PT_32 = DATA / "vllm_latency_b4_in1024_out32.pytorch.json"
VLLM_PT_96 = DATA / "vllm_latency_b4_in1024_out96.pytorch.json"
TRT = DATA / "trtllm_bench_latency_report.json"
TRT_SPEC = DATA / "trtllm_bench_latency_eagle3_report.json"


def rows(tables):
    return [tuple(r) for _, df in tables for r in df[["batch", "context", "tokens", "step_ms"]].itertuples(index=False)]


def test_formats_are_told_by_content():
    for path, kind in [
        (SGLANG, "sglang"),
        (VLLM, "vllm-latency"),
        (VLLM_PT_32, "vllm-pytorch"),
        (TRT, "trtllm"),
        (TRT_SPEC, "trtllm"),
    ]:
        assert detect_format(path, path.read_text())[0] == kind, path.name
    assert detect_format("x.csv", "batch,context,tokens,step_ms\n1,2,1,3\n")[0] == "csv"


def test_sglang_rows_are_the_median_decode_step_of_each_record():
    records = [json.loads(line) for line in SGLANG.read_text().splitlines()]
    # decode steps i = 0 .. output_len - 2 start with input_len + i cached tokens; the median one
    expect = [
        (r["batch_size"], r["input_len"] + (r["output_len"] - 2) // 2, 1, r["median_decode_latency"] * 1000)
        for r in records
    ]
    got = rows(read_step_tables(SGLANG))
    assert len(got) == 8
    assert [g[:3] for g in got] == [e[:3] for e in expect]
    assert [g[3] for g in got] == pytest.approx([e[3] for e in expect])
    assert got[0][:2] == (1, 512 + 15)  # output_len 32: 31 steps, the 16th at context 527


def test_sglang_record_without_decode_step_gives_no_row(tmp_path):
    lines = SGLANG.read_text().splitlines()
    short = json.loads(lines[0]) | {"output_len": 1}
    del short["median_decode_latency"]
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(short) + "\n" + lines[1] + "\n")
    assert len(rows(read_step_tables(path))) == 1
    path.write_text(json.dumps(short) + "\n")
    with pytest.raises(UserError, match="no record with a decode step"):
        read_step_tables(path)


def test_vllm_runs_at_two_output_lengths_are_differenced():
    a = json.loads(VLLM_PT_32.read_text())[0]
    b = json.loads(VLLM_PT_96.read_text())[0]
    la = statistics.median(a["metric"]["benchmark_values"])
    lb = statistics.median(b["metric"]["benchmark_values"])
    # the prefill cancels: 64 more decode steps, contexts 1024 + 31 .. 1024 + 94
    step_ms = (lb - la) / (96 - 32) * 1000
    got = rows(read_step_tables([VLLM_PT_96, VLLM_PT_32]))
    assert len(got) == 1
    assert got[0][:3] == (4, 1024 + (31 + 94) // 2, 1)
    assert got[0][3] == pytest.approx(step_ms)


def test_vllm_output_json_needs_the_run_from_the_user_and_spreads_the_prefill():
    with pytest.raises(UserError, match="input_len: .*does not record the run's input len"):
        read_step_tables(VLLM, RunOptions(batch=8, output_len=128))
    latencies = json.loads(VLLM.read_text())["latencies"]
    median = sorted(latencies)[len(latencies) // 2]  # five values
    got = rows(read_step_tables(VLLM, RunOptions(batch=8, input_len=512, output_len=128)))
    assert got[0][:3] == (8, 512 + 63, 1)
    assert got[0][3] == pytest.approx(median / 128 * 1000)


def test_vllm_speculative_runs_are_refused(tmp_path):
    with pytest.raises(UserError, match="tokens: .*accepted tokens per step"):
        read_step_tables(VLLM, RunOptions(batch=8, input_len=512, output_len=128, tokens=4))
    record = json.loads(VLLM_PT_32.read_text())
    record[0]["benchmark"]["extra_info"]["args"]["speculative_config"] = {
        "method": "eagle",
        "num_speculative_tokens": 3,
    }
    path = tmp_path / "spec.pytorch.json"
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match="speculative_config"):
        read_step_tables(path)


def test_vllm_runs_started_with_the_spec_shorthands_are_speculative(tmp_path):
    # vLLM 0.33's `--spec-method eagle3 --spec-model M --spec-tokens 3` land in the args as
    # spec_method, spec_model, spec_tokens (vllm/engine/arg_utils.py), with speculative_config None
    for key, value in (("spec_method", "eagle3"), ("spec_model", "org/eagle3"), ("spec_tokens", 3)):
        record = json.loads(VLLM_PT_32.read_text())
        args = record[0]["benchmark"]["extra_info"]["args"]
        args["speculative_config"] = None
        args[key] = value
        path = tmp_path / f"{key}.pytorch.json"
        path.write_text(json.dumps(record))
        with pytest.raises(UserError, match=f"speculative run \\(args.{key}\\)"):
            read_step_tables(path)


def test_trtllm_plain_report_is_one_row_of_median_tpot():
    report = json.loads(TRT.read_text())
    info = report["request_info"]
    got = rows(read_step_tables(TRT))
    # TPOT averages the decode steps after the first token: contexts ISL .. ISL + OSL - 2
    assert got == [(1, int(info["avg_input_length"] + (info["avg_output_length"] - 2) / 2), 1, pytest.approx(7.412))]
    assert got[0][1] == 1024 + 127


def test_trtllm_speculative_report_needs_tokens_and_scales_by_acceptance():
    with pytest.raises(UserError, match="tokens: .*does not record the tokens verified per step"):
        read_step_tables(TRT_SPEC)
    report = json.loads(TRT_SPEC.read_text())
    tpot = report["streaming_metrics"]["tpot_percentiles"]["p50"]
    accepted = report["decoding_stats"]["acceptance_length_percentiles"]["p50"]
    got = rows(read_step_tables(TRT_SPEC, RunOptions(tokens=4)))
    assert got[0][:3] == (1, 1151, 4)
    assert got[0][3] == pytest.approx(tpot * accepted)
    with pytest.raises(UserError, match="tokens: .*plain decoding"):
        read_step_tables(TRT, RunOptions(tokens=4))


def test_several_files_are_joined_and_an_unused_option_is_refused():
    points = read_step_points([SGLANG, TRT, VLLM_PT_32, VLLM_PT_96])
    assert len(points) == 8 + 1 + 1
    assert points.batch.tolist()[-2:] == [1, 4]
    with pytest.raises(UserError, match="batch: no measurements file needs it"):
        read_step_tables([SGLANG, TRT], RunOptions(batch=4))


def test_csv_still_reads_as_before(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("# a comment\nbatch, context, tokens, step_ms, candidates\n2,64,4,10.5,2\n")
    points = read_step_points(path)
    assert (points.batch[0], points.context[0], points.tokens[0], points.candidates[0]) == (2, 64, 4, 2)
    assert points.step_s[0] == pytest.approx(10.5e-3)


def test_fit_profile_reads_an_engine_file_like_its_rows():
    from_file = treeopt.fit_profile("llama-2-7b", "a100-80gb-sxm", SGLANG)
    frame = read_step_tables(SGLANG)[0][1]
    from_frame = treeopt.fit_profile("llama-2-7b", "a100-80gb-sxm", frame)
    assert from_file.terms == pytest.approx(from_frame.terms)
    with pytest.raises(UserError, match="batch: applies to benchmark files"):
        treeopt.fit_profile("llama-2-7b", "a100-80gb-sxm", frame, batch=2)


def hw_fit(*files, out, extra=()):
    argv = ["hw", "fit", "--model", "llama-2-7b", "--hardware", "a100-80gb-sxm"]
    for f in files:
        argv += ["--measurements", str(f)]
    main([*argv, *map(str, extra), "-o", str(out)])


def test_hw_fit_writes_a_profile_from_engine_files(tmp_path, capsys):
    out = tmp_path / "fitted.json"
    hw_fit(SGLANG, TRT, out=out)
    text = capsys.readouterr().out
    assert "fitted 9 steps of llama-2-7b over a100-80gb-sxm" in text
    saved = json.loads(out.read_text())
    assert saved["calibration"]["fit"]["base"] == "a100-80gb-sxm"
    # a fit to ~7.3-8.8 ms steps of a 13.5 GB model: a plausible eta_memory
    assert 0.3 < saved["eta_memory"] <= 1.0


@pytest.mark.parametrize(
    "content,extra,message",
    [
        ('{"batch_size": 1, "input_len": 512, "output_len": 32', (), "line 1: not valid JSON"),
        ('{"foo": 1}', (), "not a known benchmark format"),
        (
            json.dumps({"run_name": "x", "batch_size": 1, "input_len": 512, "output_len": 32}) + "\n",
            (),
            "record 1: missing field 'median_decode_latency'",
        ),
        ('{"avg_latency": 1.0, "latencies": [1.0]}', ("--batch", 8, "--output-len", 32), "--input-len: "),
        (
            json.dumps({"elapsed_time": 9.0, "num_requests": 10, "tokens_per_second": 100.0}),
            (),
            "vLLM throughput JSON",
        ),
    ],
)
def test_hw_fit_bad_engine_file_is_one_line_exit_2(tmp_path, capsys, content, extra, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "fitted.json"
    with pytest.raises(SystemExit) as err:
        hw_fit(bad, out=out, extra=extra)
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0], lines
    assert not out.exists()


def test_hw_fit_trtllm_report_missing_streaming_metrics_names_the_field(tmp_path, capsys):
    report = json.loads(TRT.read_text())
    del report["streaming_metrics"]
    bad = tmp_path / "report.json"
    bad.write_text(json.dumps(report))
    shutil.copy(SGLANG, tmp_path / "ok.jsonl")
    with pytest.raises(SystemExit) as err:
        hw_fit(tmp_path / "ok.jsonl", bad, out=tmp_path / "p.json")
    assert err.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"{bad}: missing field 'streaming_metrics'" in line
    assert not (tmp_path / "p.json").exists()
