"""Serving engines' own benchmark output as measured decoding steps for `treeopt hw fit`
(docs/performance-model.md#engine-benchmark-files).

`read_step_tables` reads each measurements file, tells its format from its content, and returns
tables in treeopt's step columns (batch, context, tokens, step_ms) for
`roofline.profile_fit.step_points_frame`. Formats, and where their layout was read:

- **step CSV**: treeopt's own table (docs/performance-model.md#fitting-a-profile-to-measured-steps);
  its optional `tree` column is read by `tree_flags`.
- **SGLang** `python -m sglang.benchmark.one_batch --result-filename R.jsonl` (SGLang 0.5.23; formerly
  `python -m sglang.bench_one_batch`): one JSON object per
  line with run_name, batch_size, input_len, output_len, prefill_latency, prefill_throughput,
  median_decode_latency, median_decode_throughput, total_latency, overall_throughput (times in
  seconds). Layout read from sgl-project/sglang python/sglang/bench_one_batch.py @ 0094415050
  (`latency_test_run_once`). The run prefills once, then times output_len - 1 decode steps of
  the whole batch with no scheduler and no speculative algorithm (the batch is built with
  `SpeculativeAlgorithm.NONE`). Decode step i (from 0) starts with input_len + i cached tokens,
  so the steps' contexts run from input_len to input_len + output_len - 2; step time grows with
  the context, so the median step is the middle one. One row per record: batch = batch_size,
  context = input_len + (output_len - 2) // 2, tokens = 1, step_ms = 1000 *
  median_decode_latency. A record with output_len 1 has no decode step and gives no row.
- **vLLM** `vllm bench latency --output-json L.json` (formerly benchmarks/benchmark_latency.py):
  avg_latency, [std_latency,] latencies, percentiles, all end-to-end seconds of one
  `generate` call over the whole batch. Layout read from vllm-project/vllm
  vllm/benchmarks/latency.py @ 00cae0753b and benchmarks/benchmark_latency.py @ 00db02095a (no
  std_latency there). The file does not record the batch or the lengths: they come from the
  user (`RunOptions`). With SAVE_TO_PYTORCH_BENCHMARK_FORMAT set, vLLM also writes
  L.pytorch.json: a list of records {benchmark: {name: "vLLM benchmark", extra_info: {args}},
  model, metric: {name: "latency", benchmark_values, extra_info}}, whose args hold batch_size,
  input_len, output_len, n, use_beam_search and speculative_config or its shorthands spec_method,
  spec_model, spec_tokens (a run started with any of them is speculative; vllm/benchmarks/lib/utils.py
  @ 07bf28ea9e, `convert_to_pytorch_benchmark_format`); that file describes itself. One run of
  output length N takes a prefill and N - 1 decode steps, so the latency L (the median of
  `latencies`) holds the prefill. Runs of the same batch and input length at two or more output
  lengths are differenced (the prefill cancels): consecutive lengths N1 < N2 give step_ms =
  1000 * (L2 - L1) / (N2 - N1) at context S + (N1 + N2 - 3) // 2, the middle of the decode
  steps between them. A batch and input length at one output length only gives step_ms =
  1000 * L / N (the prefill counted as one of N steps: too high by (prefill - step) / N) at
  context S + (N - 2) // 2. batch = batch_size * n; tokens = 1 (the files do not record
  accepted tokens per step, so a speculative run is refused).
- **TensorRT-LLM** `trtllm-bench ... latency --report_json R.json`: a JSON object with engine,
  world_info (max_batch_size, ...), request_info (num_requests, avg_num_concurrent_requests,
  avg_input_length, avg_output_length), performance, streaming_metrics (avg_ttft_ms,
  avg_tpot_ms, tpot_percentiles {p50, p95, p99, minimum, maximum, average} in ms, ...), and with
  speculative decoding decoding_stats (mode, acceptance_length_percentiles, ...). Layout read
  from NVIDIA/TensorRT-LLM tensorrt_llm/bench/dataclasses/reporting.py @ 0249976575
  (`ReportUtility.get_statistics_dict`) and tensorrt_llm/bench/benchmark/low_latency.py @
  000a01de66 (latency mode: max_batch_size 1, streaming). TPOT is a request's time after its
  first token over its output tokens after the first, the mean of its decode steps (contexts
  ISL to ISL + OSL - 2). One row: batch = 1 when world_info.max_batch_size is 1 (latency mode),
  else the user's batch; context = int(avg_input_length + (avg_output_length - 2) / 2); step_ms
  = tpot p50, times acceptance_length p50 when decoding_stats is present (TPOT is per output
  token and a speculative step emits the acceptance length of them; approximate); tokens = 1,
  or the user's tokens for a speculative report (the report does not record the draft length).

The vLLM throughput JSON (elapsed_time, tokens_per_second, ...) times a whole continuously
batched run and holds no step time; it is refused with that reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from treeopt.errors import UserError
from treeopt.fileio import parse_json_input

__all__ = ["RunOptions", "detect_format", "read_step_tables", "tree_flags", "FORMATS"]

#: format name -> what a message calls it
FORMATS = {
    "csv": "step CSV",
    "sglang": "SGLang one-batch benchmark results (sglang.benchmark.one_batch)",
    "vllm-latency": "vLLM latency JSON",
    "vllm-pytorch": "vLLM latency JSON (PyTorch benchmark format)",
    "trtllm": "trtllm-bench report",
    "vllm-throughput": "vLLM throughput JSON",
}
STEP_FIELDS = ("batch", "context", "tokens", "step_ms")


@dataclass(frozen=True)
class RunOptions:
    """What a benchmark file may not record, from the user: batch (sequences decoding
    together), input_len and output_len (tokens per sequence), tokens (tokens verified per
    sequence per step, root included; 1 = plain decoding). None: not given."""

    batch: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    tokens: int | None = None


@dataclass(frozen=True)
class _VllmRun:
    source: str
    batch: int
    input_len: int
    output_len: int
    latency_s: float


def detect_format(path, text: str) -> tuple[str, object]:
    """The format of a measurements file from its content (and name): a name in `FORMATS` and
    the parsed JSON (None for a CSV)."""
    name = str(path)
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return "csv", None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # JSON lines (SGLang), or broken
        data = [
            parse_json_input(line, f"{name}: line {number}")
            for number, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    except (RecursionError, ValueError):
        parse_json_input(text, name)  # raises the one-line error
    if isinstance(data, dict):
        if "performance" in data and "request_info" in data:
            return "trtllm", data
        if "latencies" in data or "avg_latency" in data:
            return "vllm-latency", data
        if "elapsed_time" in data and "tokens_per_second" in data:
            return "vllm-throughput", data
        if "median_decode_latency" in data or "batch_size" in data:
            return "sglang", [data]
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        if all(isinstance(r.get("benchmark"), dict) and "metric" in r for r in data):
            return "vllm-pytorch", data
        if all("batch_size" in r for r in data):
            return "sglang", data
    raise UserError(
        f"{name}: not a known benchmark format (step CSV, SGLang sglang.benchmark.one_batch JSONL, vLLM latency JSON, "
        "trtllm-bench report JSON)"
    )


def read_step_tables(paths, run: RunOptions | None = None) -> list[tuple[str, pd.DataFrame]]:
    """One (source, table) per measurements file (vLLM runs differenced across files share
    one), each table in columns batch, context, tokens, step_ms [, candidates, draft_stages, tree]."""
    run = run or RunOptions()
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tables: list[tuple[str, pd.DataFrame]] = []
    vllm_runs: list[_VllmRun] = []
    used: set[str] = set()
    for path in paths:
        name = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
        except FileNotFoundError:
            raise UserError(f"{name}: no such file") from None
        except IsADirectoryError:
            raise UserError(f"{name}: is a directory, not a file") from None
        except UnicodeDecodeError:
            raise UserError(f"{name}: not a text file of step measurements") from None
        except OSError as err:
            raise UserError(f"{name}: cannot read ({err.strerror or err})") from None
        kind, data = detect_format(name, text)
        if kind == "csv":
            tables.append((name, _csv_table(name)))
        elif kind == "sglang":
            tables.append((name, _sglang_table(name, data, run)))
        elif kind == "trtllm":
            tables.append((name, _trtllm_table(name, data, run, used)))
        elif kind == "vllm-latency":
            vllm_runs.append(_vllm_run(name, data, run, used))
        elif kind == "vllm-pytorch":
            vllm_runs.append(_vllm_pytorch_run(name, data, run))
        else:  # vllm-throughput
            raise UserError(
                f"{name}: a vLLM throughput JSON times a whole continuously batched run, not a decoding step "
                "(use `vllm bench latency --output-json`)"
            )
    if vllm_runs:
        tables += _vllm_tables(vllm_runs)
    given = [k for k, v in vars(run).items() if v is not None]
    unused = [k for k in given if k not in used and not (k == "tokens" and run.tokens == 1)]
    if unused:
        raise UserError("no measurements file needs it (the files given record it themselves)", param=unused[0])
    return tables


#: a `tree` cell as written (lower case, stripped) and what it says; pandas reads a column of
#: 1/0 with empty cells as floats ("1.0", "nan")
TREE_CELLS = {"1": True, "1.0": True, "true": True, "0": False, "0.0": False, "false": False, "nan": False, "": False}


def tree_flags(df: pd.DataFrame, source: str, tokens: np.ndarray) -> np.ndarray:
    """A step table's optional `tree` column as one bool per row: the row's verified tokens
    branch (1, true) or form a chain (0, false, empty; absent: every row a chain), checked
    against its `tokens` (docs/performance-model.md#fitting-a-profile-to-measured-steps)."""
    if "tree" not in df.columns:
        return np.zeros(len(df), dtype=bool)
    flags = df["tree"].map(lambda v: TREE_CELLS.get(str(v).strip().lower()))
    bad = flags.isna().to_numpy()
    if np.any(bad):
        row = int(np.argmax(bad))
        raise UserError(f"{source}: row {row + 1}: 'tree' must be 1/0 or true/false, not '{df['tree'].iloc[row]}'")
    flags = flags.to_numpy(dtype=bool)
    bad = flags & (tokens < 3)
    if np.any(bad):
        raise UserError(
            f"{source}: row {int(np.argmax(bad)) + 1}: 'tree' is set but 'tokens' is {tokens[np.argmax(bad)]:g}: "
            "a branching tree verifies at least 3 tokens (the root and two drafted tokens at one depth)"
        )
    return flags


# ---------------------------------------------------------------------------------------------
# formats


def _csv_table(name: str) -> pd.DataFrame:
    try:
        df = pd.read_csv(name, comment="#", skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UserError(f"{name}: not a CSV of step measurements ({str(err).splitlines()[0]})") from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    return df


def _number(name: str, where: str, record: dict, key: str, *, positive: bool = True) -> float:
    if key not in record or record[key] is None:
        raise UserError(f"{name}: {where}missing field '{key}'")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{name}: {where}'{key}' is not a number")
    if positive and value <= 0:
        raise UserError(f"{name}: {where}'{key}' must be positive")
    return float(value)


def _integer(name: str, where: str, record: dict, key: str, floor: int = 1) -> int:
    value = _number(name, where, record, key, positive=False)
    if value != round(value) or value < floor:
        raise UserError(f"{name}: {where}'{key}' must be an integer >= {floor}")
    return int(value)


def _sglang_table(name: str, records: list, run: RunOptions) -> pd.DataFrame:
    if run.tokens is not None and run.tokens != 1:
        raise UserError(
            f"{name}: SGLang's one-batch benchmark decodes without speculation (tokens = 1)", param="tokens"
        )
    rows = []
    for number, record in enumerate(records, 1):
        where = f"record {number}: "
        batch = _integer(name, where, record, "batch_size")
        input_len = _integer(name, where, record, "input_len", floor=0)
        output_len = _integer(name, where, record, "output_len")
        if output_len < 2:
            continue  # prefill only: no decode step was timed
        step_s = _number(name, where, record, "median_decode_latency")
        rows.append((batch, input_len + (output_len - 2) // 2, 1, 1e3 * step_s))
    if not rows:
        raise UserError(f"{name}: no record with a decode step (output_len >= 2)")
    return pd.DataFrame(rows, columns=list(STEP_FIELDS))


def _latency_s(name: str, where: str, values) -> float:
    if not isinstance(values, list) or not values:
        raise UserError(f"{name}: {where}'latencies' is not a list of seconds")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise UserError(f"{name}: {where}'latencies' holds a value that is not a number")
    return float(np.median(values))


def _vllm_run(name: str, data: dict, run: RunOptions, used: set) -> _VllmRun:
    if "latencies" not in data:
        raise UserError(f"{name}: missing field 'latencies'")
    latency = _latency_s(name, "", data["latencies"])
    missing = [k for k in ("batch", "input_len", "output_len") if getattr(run, k) is None]
    if missing:
        raise UserError(
            f"{name}: a vLLM latency JSON does not record the run's {missing[0].replace('_', ' ')}: give it",
            param=missing[0],
        )
    if run.tokens is not None and run.tokens != 1:
        raise UserError(
            f"{name}: a vLLM latency JSON does not record accepted tokens per step, so a speculative run cannot "
            "be split into steps",
            param="tokens",
        )
    used.update(("batch", "input_len", "output_len"))
    return _VllmRun(name, int(run.batch), int(run.input_len), int(run.output_len), latency)


# why: vLLM starts speculation from --speculative-config or from its shorthands --spec-method,
# --spec-model and --spec-tokens (dests spec_method, spec_model, spec_tokens; vllm/engine/arg_utils.py,
# vLLM 0.33.0), and the PyTorch-format file records whichever the user gave
VLLM_SPECULATIVE_ARGS = ("speculative_config", "spec_method", "spec_model", "spec_tokens")


def _vllm_pytorch_run(name: str, records: list, run: RunOptions) -> _VllmRun:
    latency_records = [r for r in records if isinstance(r.get("metric"), dict) and r["metric"].get("name") == "latency"]
    if not latency_records:
        raise UserError(f"{name}: no record with metric 'latency' (a vLLM latency benchmark's PyTorch-format file)")
    record = latency_records[0]
    extra = record["benchmark"].get("extra_info")
    args = extra.get("args") if isinstance(extra, dict) else None
    if not isinstance(args, dict):
        raise UserError(f"{name}: missing field 'benchmark.extra_info.args'")
    where = "args: "
    batch = _integer(name, where, args, "batch_size")
    n = _integer(name, where, args, "n") if "n" in args else 1
    input_len = _integer(name, where, args, "input_len")
    output_len = _integer(name, where, args, "output_len")
    if args.get("use_beam_search"):
        raise UserError(f"{name}: a beam-search run (args.use_beam_search) is not one decoding step per token")
    spec = [key for key in VLLM_SPECULATIVE_ARGS if args.get(key) not in (None, "", {}, "None")]
    if spec:
        raise UserError(
            f"{name}: a speculative run (args.{', args.'.join(spec)}): "
            "the file does not record accepted tokens per step"
        )
    if run.tokens is not None and run.tokens != 1:
        raise UserError(
            f"{name}: a vLLM latency run without speculative_config is plain decoding (tokens = 1)", param="tokens"
        )
    if "benchmark_values" not in record["metric"]:
        raise UserError(f"{name}: missing field 'metric.benchmark_values'")
    latency = _latency_s(name, "metric: ", record["metric"]["benchmark_values"])
    return _VllmRun(name, batch * n, input_len, output_len, latency)


def _vllm_tables(runs: list[_VllmRun]) -> list[tuple[str, pd.DataFrame]]:
    groups: dict[tuple[int, int], list[_VllmRun]] = {}
    for r in runs:
        groups.setdefault((r.batch, r.input_len), []).append(r)
    tables = []
    for (batch, input_len), group in groups.items():
        group.sort(key=lambda r: r.output_len)
        for a, b in zip(group, group[1:]):
            if a.output_len == b.output_len:
                raise UserError(
                    f"{a.source}, {b.source}: two vLLM runs of batch {batch}, input {input_len}, output "
                    f"{a.output_len}: keep one"
                )
        if group[0].output_len < 2:
            raise UserError(f"{group[0].source}: output length {group[0].output_len}: no decoding step")
        if len(group) == 1:
            (r,) = group
            row = (batch, input_len + (r.output_len - 2) // 2, 1, 1e3 * r.latency_s / r.output_len)
            tables.append((r.source, pd.DataFrame([row], columns=list(STEP_FIELDS))))
            continue
        for a, b in zip(group, group[1:]):
            step_ms = 1e3 * (b.latency_s - a.latency_s) / (b.output_len - a.output_len)
            row = (batch, input_len + (a.output_len + b.output_len - 3) // 2, 1, step_ms)
            tables.append((f"{a.source} - {b.source}", pd.DataFrame([row], columns=list(STEP_FIELDS))))
    return tables


def _section(name: str, data: dict, key: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise UserError(f"{name}: missing field '{key}'")
    return value


def _trtllm_table(name: str, data: dict, run: RunOptions, used: set) -> pd.DataFrame:
    requests = _section(name, data, "request_info")
    world = _section(name, data, "world_info")
    if not isinstance(data.get("streaming_metrics"), dict):
        raise UserError(
            f"{name}: missing field 'streaming_metrics' (the time per output token needs a streaming run: "
            "trtllm-bench latency, or throughput with --streaming)"
        )
    tpot = _section(name, data["streaming_metrics"], "tpot_percentiles")
    tpot_ms = _number(name, "tpot_percentiles: ", tpot, "p50")
    input_len = _number(name, "request_info: ", requests, "avg_input_length", positive=False)
    output_len = _number(name, "request_info: ", requests, "avg_output_length")
    if output_len < 2:
        raise UserError(
            f"{name}: request_info: 'avg_output_length' {output_len:g}: no decoding step after the first token"
        )
    max_batch = _integer(name, "world_info: ", world, "max_batch_size")
    if max_batch == 1:
        batch = 1
    elif run.batch is None:
        raise UserError(
            f"{name}: a throughput-mode report (world_info.max_batch_size {max_batch}) does not say how many "
            "requests decoded together: give it",
            param="batch",
        )
    else:
        batch = int(run.batch)
        used.add("batch")
    decoding = data.get("decoding_stats")
    if isinstance(decoding, dict):
        acceptance = decoding.get("acceptance_length_percentiles")
        if not isinstance(acceptance, dict):
            raise UserError(f"{name}: decoding_stats: missing field 'acceptance_length_percentiles'")
        accepted = _number(name, "acceptance_length_percentiles: ", acceptance, "p50")
        if run.tokens is None or run.tokens < 2:
            raise UserError(
                f"{name}: a speculative report (decoding_stats mode {decoding.get('mode')}) does not record the "
                "tokens verified per step: give them (draft tokens + 1)",
                param="tokens",
            )
        tokens = int(run.tokens)
        used.add("tokens")
        step_ms = tpot_ms * accepted
    else:
        if run.tokens is not None and run.tokens != 1:
            raise UserError(f"{name}: a report without decoding_stats is plain decoding (tokens = 1)", param="tokens")
        tokens, step_ms = 1, tpot_ms
    context = int(input_len + (output_len - 2) / 2)
    return pd.DataFrame([(batch, context, tokens, step_ms)], columns=list(STEP_FIELDS))
