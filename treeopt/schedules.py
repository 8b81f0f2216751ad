"""Per-batch speculation schedules in the forms the serving engines take (docs/engines.md#schedules).

treeopt decides a draft length per (batch, context) cell, measured or predicted. Today's
engines take one draft length per batch-size range instead:

- vLLM: `--speculative-config` with `num_speculative_tokens` (the most drafted) and
  `num_speculative_tokens_per_batch_size`, a list of inclusive ranges `[start, end, K]` that
  starts at 1 (K = 0 switches speculation off). Between ranges and after the last one vLLM
  carries the previous K forward, up to `max_num_seqs`.
- TensorRT-LLM: `draft_len_schedule`, `{batch_size: draft_len}`, where each key is the largest
  batch size of its range ("up to that key") and batch sizes above the largest key draft
  nothing; the smallest key's value must equal `max_draft_len`, every value is <= it, and
  `max_concurrency` (a plain cut-off) may not be given with a schedule.
- SGLang: one (steps, topk, draft tokens) per server: the best triple for the traffic mix, and
  per batch range what a separate deployment would run.

How a range between two measured (or predicted) batch sizes is decided, and how far it may
reach, is `batch_ranges` (docs/engines.md#batch-ranges); how the contexts of a traffic mix
enter a table with no context axis is `choices_for_mix` (docs/engines.md#context-in-a-schedule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

from treeopt.engines import beam_fits, export_for, sglang_triple_for
from treeopt.errors import UserError
from treeopt.trtllm_eagle import TRTLLM_EAGLE3_PLACEHOLDER, trtllm_dynamic_export

__all__ = [
    "BatchChoice",
    "BatchRange",
    "batch_ranges",
    "choices_for_mix",
    "vllm_schedule_config",
    "vllm_schedule_line",
    "trtllm_schedule_config",
    "SGLangPlan",
    "sglang_plan",
    "SGLANG_PLAIN",
    "sglang_options",
    "selection_schedule",
    "with_schedule",
    "format_schedule",
]


@dataclass(frozen=True)
class BatchChoice:
    """The draft length chosen at one measured or predicted batch size (0: speculation off)."""

    batch_size: int
    draft_len: int


BatchRange = tuple[int, int, int]  # (first batch size, last batch size, draft length), inclusive


def _checked(choices) -> tuple[np.ndarray, np.ndarray]:
    """Batch sizes (ascending) and draft lengths of `choices`; one line for what is wrong."""
    choices = list(choices)
    if not choices:
        raise UserError("schedule: no batch sizes to schedule")
    batch = np.array([int(c.batch_size) for c in choices], dtype=np.int64)
    draft = np.array([int(c.draft_len) for c in choices], dtype=np.int64)
    if (batch < 1).any():
        raise UserError(f"schedule: batch size {int(batch.min())} is below 1")
    if (draft < 0).any():
        raise UserError(f"schedule: draft length {int(draft.min())} is negative")
    order = np.argsort(batch, kind="stable")
    batch, draft = batch[order], draft[order]
    if (np.diff(batch) == 0).any():
        dup = int(batch[1:][np.diff(batch) == 0][0])
        raise UserError(f"schedule: batch size {dup} has two draft lengths (one per batch size)")
    return batch, draft


def batch_ranges(choices, max_batch_size: int | None = None) -> list[BatchRange]:
    """Inclusive batch-size ranges with one draft length each, from 1 on (docs/engines.md#batch-ranges).

    - A measured batch size keeps its own draft length.
    - Between two measured sizes b_i < b_j the draft length is min(K_i, K_j): drafting K
      tokens is claimed only where the measurements on both sides support at least K.
    - Below the smallest measured size its draft length holds (a smaller batch is more
      memory-bound, so K extra verified tokens cost no more there; docs/engines.md#batch-ranges).
    - Above the largest measured size nothing is claimed: up to `max_batch_size`, when it is
      given and larger, the draft length is 0 (speculation off).
    Neighbouring ranges with one draft length are merged. Sizes above `max_batch_size` are cut.
    """
    batch, draft = _checked(choices)
    top = int(batch[-1]) if max_batch_size is None else int(max_batch_size)
    if top < 1:
        raise UserError(f"schedule: max batch size {top} is below 1")
    starts, ends, lens = [1], [int(batch[0])], [int(draft[0])]
    for i in range(1, batch.size):
        gap_lo, gap_hi = int(batch[i - 1]) + 1, int(batch[i]) - 1
        if gap_lo <= gap_hi:
            starts.append(gap_lo)
            ends.append(gap_hi)
            lens.append(int(min(draft[i - 1], draft[i])))
        starts.append(int(batch[i]))
        ends.append(int(batch[i]))
        lens.append(int(draft[i]))
    if top > batch[-1]:
        starts.append(int(batch[-1]) + 1)
        ends.append(top)
        lens.append(0)
    merged: list[list[int]] = []
    for s, e, k in zip(starts, ends, lens):
        if s > top:
            break
        e = min(e, top)
        if merged and merged[-1][2] == k:
            merged[-1][1] = e
        else:
            merged.append([s, e, k])
    return [(s, e, k) for s, e, k in merged]


def choices_for_mix(batch, context, draft_len, *, speedup=None, weight=None) -> list[BatchChoice]:
    """One draft length per batch size from cells at several contexts (docs/engines.md#context-in-a-schedule).

    `batch`, `context`, `draft_len` (and `speedup`, `weight`) are equal-length arrays, one row
    per (batch, context, candidate draft length). Without `speedup`, each row is a cell's chosen
    draft length and a batch size gets the smallest of them over its contexts: no context of
    the mix is given more drafting than its own cell chose. With `speedup` (expected speedup of
    that draft length in that cell), a batch size gets the draft length of greatest
    `weight`-weighted mean speedup over the contexts (weight: how much of the traffic at that
    batch runs at that context; equal when omitted), among draft lengths measured or predicted
    at every one of those contexts; ties go to the shorter draft.
    """
    b = np.asarray(batch, dtype=np.int64)
    c = np.asarray(context, dtype=np.int64)
    k = np.asarray(draft_len, dtype=np.int64)
    if not (b.shape == c.shape == k.shape) or b.ndim != 1 or b.size == 0:
        raise UserError("schedule: batch, context and draft length need one entry per row, and at least one row")
    if speedup is None:
        out = []
        for bs in np.unique(b):
            out.append(BatchChoice(int(bs), int(k[b == bs].min())))
        return out
    s = np.asarray(speedup, dtype=np.float64)
    w = np.ones_like(s) if weight is None else np.asarray(weight, dtype=np.float64)
    if s.shape != b.shape or w.shape != b.shape:
        raise UserError("schedule: speedup and weight need one entry per row")
    if (w < 0).any() or not np.isfinite(w).all():
        raise UserError("schedule: weights must be finite and >= 0")
    return [_best_draft_len(b == bs, bs, c, k, s, w) for bs in np.unique(b)]


def _best_draft_len(rows, bs, c, k, s, w) -> BatchChoice:
    """The draft length of greatest weighted mean speedup at one batch size (see choices_for_mix)."""
    contexts = np.unique(c[rows])
    cw = np.array([w[rows & (c == ctx)].max() for ctx in contexts])  # one weight per context
    if cw.sum() <= 0:
        raise UserError(f"schedule: batch {int(bs)} has no context of positive weight")
    best_k, best_v = None, -np.inf
    for kk in np.unique(k[rows]):  # ascending, so a tie keeps the shorter draft
        at = rows & (k == kk)
        got = {int(ctx): float(v) for ctx, v in zip(c[at], s[at])}
        if any(int(ctx) not in got or not np.isfinite(got[int(ctx)]) for ctx, wt in zip(contexts, cw) if wt > 0):
            continue  # a draft length not known at every context of the mix is not chosen
        value = float(sum(wt * got.get(int(ctx), 0.0) for ctx, wt in zip(contexts, cw)) / cw.sum())
        if value > best_v:
            best_k, best_v = int(kk), value
    if best_k is None:
        raise UserError(f"schedule: batch {int(bs)}: no draft length has a speedup at every context of the mix")
    return BatchChoice(int(bs), best_k)


def vllm_schedule_config(
    choices, method: str, model: str | None = None, *, max_batch_size: int | None = None, **extra
) -> dict | None:
    """vLLM's `--speculative-config` for a per-batch schedule (docs/engines.md#schedules); None when
    no batch size drafts anything (run without speculation: vLLM refuses num_speculative_tokens 0).

    `num_speculative_tokens` is the longest draft of the table. vLLM carries the last range's K
    forward to `max_num_seqs`, so when the data end with K > 0 and no `max_batch_size` says how
    far the server goes, the table ends with one range of K = 0 just past the data.
    """
    ranges = batch_ranges(choices, max_batch_size)
    longest = max(k for _, _, k in ranges)
    if longest == 0:
        return None
    table = [list(r) for r in ranges]
    if table[-1][2] > 0:
        past = table[-1][1] + 1
        table.append([past, past, 0])
    config: dict = {"method": method}
    if model is not None:
        config["model"] = model
    config["num_speculative_tokens"] = int(longest)
    config["num_speculative_tokens_per_batch_size"] = table
    config.update(extra)
    return config


def vllm_schedule_line(config: dict | None) -> str:
    """The paste-ready command-line form of `vllm_schedule_config`."""
    if config is None:
        return "# no batch size drafts a token: run vLLM without --speculative-config"
    return f"--speculative-config '{json.dumps(config)}'"


def trtllm_schedule_config(
    choices, *, decoding_type: str = "Eagle", max_batch_size: int | None = None, **extra
) -> dict | None:
    """TensorRT-LLM's decoding config with `draft_len_schedule` (docs/engines.md#schedules); None
    when no batch size drafts anything.

    Each key is the largest batch size of its range and batch sizes above the largest key draft
    nothing, so the ranges that draft become keys and a trailing K = 0 range needs none. The
    smallest key's draft length must be `max_draft_len` and no later one may exceed it: a
    later, longer draft is cut to the first range's (claiming less, never more). A schedule
    that only cuts speculation off above N is written as `max_concurrency: N` instead (the two
    may not be given together).
    """
    ranges = batch_ranges(choices, max_batch_size)
    first = ranges[0][2]
    if first == 0:
        return None if all(k == 0 for _, _, k in ranges) else _refuse_trtllm_first(ranges)
    schedule: dict[int, int] = {}
    for _, end, k in ranges:
        schedule[int(end)] = int(min(k, first))
    while schedule and schedule[max(schedule)] == 0:
        del schedule[max(schedule)]
    # neighbouring keys with one value say the same as the larger key alone
    keys = sorted(schedule)
    schedule = {
        key: schedule[key] for i, key in enumerate(keys) if i + 1 == len(keys) or schedule[keys[i + 1]] != schedule[key]
    }
    config: dict = {"decoding_type": decoding_type, "max_draft_len": int(first)}
    if len(schedule) == 1:
        config["max_concurrency"] = int(next(iter(schedule)))
    else:
        config["draft_len_schedule"] = schedule
    config.update(extra)
    return config


def _refuse_trtllm_first(ranges) -> dict:
    start, end, _ = ranges[0]
    raise UserError(
        f"draft_len_schedule: batch sizes {start}-{end} draft nothing but larger ones do; TensorRT-LLM's "
        "smallest key must draft max_draft_len (tensorrt_llm/llmapi/llm_args.py), so it takes no such schedule"
    )


@dataclass(frozen=True)
class SGLangPlan:
    """SGLang runs one (steps, topk, draft tokens) per server (docs/engines.md#schedules).

    triple: the best for the whole traffic mix; mean_speedup: its mix-weighted speedup;
    per_range: (first batch, last batch, triple) that a deployment serving only those batch
    sizes would run, over measured batch sizes only (a gap between two sizes that want
    different triples belongs to neither)."""

    triple: tuple[int, int, int]
    mean_speedup: float
    per_range: tuple[tuple[int, int, tuple[int, int, int]], ...]


def sglang_plan(speedups: dict, weights: dict) -> SGLangPlan:
    """The triple of greatest `weights`-weighted mean speedup over the mix's (batch, context)
    cells, and the best triple per batch size. `speedups`: {(batch, context): {triple: speedup}};
    `weights`: {(batch, context): weight}. A triple is a candidate only where every weighted
    cell has its speedup; ties go to the smaller triple."""
    cells = [cell for cell, wt in weights.items() if wt > 0]
    if not cells:
        raise UserError("schedule: the traffic mix has no cell of positive weight")
    missing = [cell for cell in cells if cell not in speedups]
    if missing:
        raise UserError(f"schedule: no speedups for cell (batch {missing[0][0]}, context {missing[0][1]})")
    best = _best_triple(speedups, {cell: weights[cell] for cell in cells})
    if best is None:
        raise UserError("schedule: no SGLang triple has a speedup in every cell of the mix")
    per_batch = []
    for bs in sorted({cell[0] for cell in cells}):
        here = _best_triple(speedups, {cell: weights[cell] for cell in cells if cell[0] == bs})
        if here is not None:
            per_batch.append((bs, here[0]))
    per_range: list[tuple[int, int, tuple[int, int, int]]] = []
    for bs, triple in per_batch:
        if per_range and per_range[-1][2] == triple:
            per_range[-1] = (per_range[-1][0], bs, triple)
        else:
            per_range.append((bs, bs, triple))
    return SGLangPlan(best[0], best[1], tuple(per_range))


def _best_triple(speedups: dict, weights: dict):
    total = float(sum(weights.values()))
    common = set.intersection(*(set(speedups[cell]) for cell in weights))
    best = None
    for triple in sorted(common):
        value = sum(wt * float(speedups[cell][triple]) for cell, wt in weights.items()) / total
        if np.isfinite(value) and (best is None or value > best[1]):
            best = (tuple(int(x) for x in triple), value)
    return best


def _cell_rows(cells, weights) -> list[tuple[int, int, int]]:
    """(batch, context, draft length) of each cell (a dict or a typed SelectionCell); with a
    traffic mix's `weights` ({(batch, context): weight}), only the mix's cells of positive weight."""
    rows = []
    for c in cells:
        get = c.get if isinstance(c, dict) else lambda k, c=c: getattr(c, k)
        rows.append((int(get("batch")), int(get("context")), int(get("nodes") or 0)))
    if weights is not None:
        rows = [r for r in rows if weights.get((r[0], r[1]), 0.0) > 0]
    if not rows:
        raise UserError("schedule: the selection has no cells" + (" of the traffic mix" if weights else ""))
    return rows


def selection_schedule(cells, engine, *, weights=None, drafter=None, sglang=None, draft_model=None) -> dict:
    """The per-batch schedule of a selection's cells for `engine` (a treeopt.engine_data.Engine),
    paste-ready (docs/engines.md#schedules): `ranges`, the engine's `config` and `line`, or a
    `note` saying why that engine takes none. `cells`: dicts or SelectionCells with batch, context
    and nodes (the chosen chain's draft length; 0 = speculation off). The engine's table has no
    context axis, so a batch size gets the shortest draft its contexts chose (`choices_for_mix`):
    every context of the selection, or with a traffic mix's `weights` ({(batch, context):
    weight}) the mix's contexts at that batch (docs/engines.md#context-in-a-schedule).
    `drafter`: an EAGLE draft's (kind, directory), named in vLLM's config; `draft_model`: a draft
    model's directory, named in vLLM's and TensorRT-LLM's draft-model configs. `sglang`: for SGLang,
    {(batch, context): {triple: (speedup, line)}} of the triples the selection's source measured or
    predicted (`sglang_options`): the mix's best triple and one per batch range (`sglang_plan`)."""
    family = engine.name.split("@")[0]
    if engine.family == "beam" and sglang is not None:
        return _sglang_section(cells, engine, weights, sglang, drafter)
    if engine.schedule not in ("vllm", "trtllm") or engine.max_children != 1:
        return {"engine": engine.name, "note": _NO_SCHEDULE.get(family, _NO_SCHEDULE[""])}
    b, c, k = (np.array(col) for col in zip(*_cell_rows(cells, weights)))
    choices = choices_for_mix(b, c, k)
    doc = {
        "engine": engine.name,
        "choices": [[x.batch_size, x.draft_len] for x in choices],
        "ranges": [list(r) for r in batch_ranges(choices)],
        "contexts": sorted({int(x) for x in c}),
        "contexts_from": "mix" if weights is not None else "selection",
    }
    if engine.schedule == "vllm":
        method, model = engine.method_name, None
        if drafter is not None and engine.method_name in ("eagle", "eagle3"):
            method, model = drafter  # vLLM names the draft's method and path (docs/engines.md#eagle-drafts)
        elif engine.method_name == "draft_model":
            model = draft_model  # the draft's path: vLLM loads it from "model"
        config = vllm_schedule_config(choices, method, model)
        doc["config"] = config
        doc["line"] = vllm_schedule_line(config)
    else:
        # why (docs/engines.md#tensorrt-llm): Draft_Target and EAGLE configs refuse a config without
        # the draft's path
        extra = {"speculative_model": draft_model or "<draft model>"} if engine.method_name == "Draft_Target" else {}
        if engine.method_name == "Eagle3":
            model = drafter[1] if drafter is not None else TRTLLM_EAGLE3_PLACEHOLDER
            extra = {"speculative_model_dir": model, "eagle3_one_model": True}
        config = trtllm_schedule_config(choices, decoding_type=engine.method_name, **extra)
        doc["config"] = config
        doc["line"] = (
            f"speculative_config = {json.dumps(config)}" if config else "# no batch size drafts: no speculative_config"
        )
    return doc


#: SGLang without speculation, in every cell at speedup 1: the plan may say "run plain"
SGLANG_PLAIN = (0, 0, 0)


#: what TensorRT-LLM's dynamic-tree schedule is predicted from, and what would predict it better
TRTLLM_DYNAMIC_SOURCE = (
    "the triple is the best of the sizes measured or predicted, each drafted as the accuracy table's ranks "
    "order the nodes; TensorRT-LLM orders them by the draft's own scores: to price the triples from those, give "
    "`treeopt select --dynamic-tau FILE` the CSV of `treeopt sglang-tau -o` on the draft (docs/engines.md#schedules)"
)


def _sglang_section(cells, engine, weights, sglang: dict, drafter=None) -> dict:
    rows = _cell_rows(cells, weights)
    mix = {(b, c): (weights[(b, c)] if weights is not None else 1.0) for b, c, _ in rows}
    trt = engine.export_kind == "trtllm-eagle3-dynamic"
    plain = "run TensorRT-LLM without speculative_config" if trt else "run SGLang without --speculative-algorithm"
    speedups, lines = {}, {SGLANG_PLAIN: f"no speculation ({plain})"}
    for cell in mix:
        options = sglang.get(cell, {})
        speedups[cell] = {SGLANG_PLAIN: 1.0} | {t: float(v[0]) for t, v in options.items()}
        lines.update({t: v[1] for t, v in options.items()})
    plan = sglang_plan(speedups, mix)
    section = {
        "engine": engine.name,
        "contexts": sorted({c for _, c in mix}),
        "contexts_from": "mix" if weights is not None else "selection",
        "triple": list(plan.triple),
        "mean_speedup": round(plan.mean_speedup, 4),
        "line": lines[plan.triple],
        "per_range": [[s, e, list(t), lines[t]] for s, e, t in plan.per_range],
    }
    if trt:
        # why (docs/engines.md#tensorrt-llm-eagle-3): the triple in SGLang's convention (root counted),
        # the config in TensorRT-LLM's names
        section["config"] = trtllm_dynamic_export(plan.triple, drafter) if plan.triple != SGLANG_PLAIN else None
        section["source"] = TRTLLM_DYNAMIC_SOURCE
    return section


def sglang_options(grid, triple_of) -> dict:
    """{(batch, context): {triple: (speedup, line)}} of a grid's rows (batch, context, nodes,
    speedup; NaN rows skipped) where `triple_of(nodes)` gives the (triple, line) SGLang drafts
    that size with (None: no triple drafts it; two sizes never share one: the draft tokens differ)."""
    out: dict = {}
    known: dict = {}
    for b, c, n, v in zip(grid["batch"], grid["context"], grid["nodes"], grid["speedup"]):
        if not int(n) or not np.isfinite(float(v)):
            continue
        if int(n) not in known:
            known[int(n)] = triple_of(int(n))
        got = known[int(n)]
        if got is None:
            continue
        out.setdefault((int(b), int(c)), {})[got[0]] = (float(v), got[1])
    return out


def with_schedule(selection, engine, *, grid=None, proposal=None, accuracy=None, drafter=None, draft_model=None):
    """`selection` (a typed Selection) with its `schedule` for `engine` (`selection_schedule`):
    the traffic mix's contexts where the selection has a mix; for SGLang, the triples of the
    `grid` (batch, context, nodes, speedup) rows, each size of `proposal` exported as SGLang's
    flags against `accuracy` (without them: the note that SGLang needs them)."""
    weights = None
    if selection.mix is not None:
        weights = {(c.batch, c.context): c.weight for c in selection.mix.cells}
    sglang = None
    if engine.family == "beam" and grid is not None and proposal is not None and accuracy is not None:

        def triple_of(nodes: int):
            tree = proposal.prefix(nodes)
            triple = sglang_triple_for(tree, accuracy, fits=beam_fits(engine))
            if triple is None:
                return None
            return triple, export_for(engine, tree, accuracy=accuracy, drafter=drafter).line

        sglang = sglang_options(grid, triple_of)
    section = selection_schedule(
        selection.cells, engine, weights=weights, drafter=drafter, sglang=sglang, draft_model=draft_model
    )
    return replace(selection, schedule=section)


_NO_SCHEDULE = {
    "trtllm": (
        "TensorRT-LLM's Medusa runs on the legacy TensorRT backend, which reads no draft_len_schedule (the PyTorch "
        "backend's drafters do); the tree per batch is each cell's line"
    ),
    "vllm": "vLLM <= 0.20's tree proposer takes no per-batch table; the tree per batch is each cell's line",
    "vllm-medusa": (
        "vLLM's Medusa proposer does not honour num_speculative_tokens_per_batch_size (only ngram, eagle, eagle3, "
        "mtp, draft_model and dflash do: vllm/config/vllm.py); the chain per batch is each cell's line"
    ),
    "sglang": "SGLang runs one (steps, topk, draft tokens) per server: see the mix's triple (sglang_plan)",
    "trtllm-eagle3-dynamic": (
        "TensorRT-LLM's dynamic tree runs one (max_draft_len, dynamic_tree_max_topK, max_total_draft_tokens) per "
        "server, chosen as SGLang's triple (sglang_plan) from a grid or sweep with its accuracy table"
    ),
    "": "this engine takes no per-batch schedule; the tree per batch is each cell's line",
}


def format_schedule(section: dict) -> str:
    """The schedule section of a selection as the lines `treeopt select` and `treeopt run` print."""
    where = "the mix's contexts" if section.get("contexts_from") == "mix" else "contexts"
    contexts = f"{where} {', '.join(map(str, section.get('contexts', [])))}"
    if "note" in section:
        return f"per-batch schedule ({section['engine']}): none; {section['note']}"
    if "triple" in section:
        who = "TensorRT-LLM" if "source" in section else "SGLang"
        lines = [
            f"{who} ({section['engine']}) runs one (steps, topk, draft tokens) per server; best for the traffic "
            f"({contexts}, mean speedup {section['mean_speedup']:.2f}x; docs/engines.md#schedules):",
            f"  {section['line']}",
            "  a separate deployment per batch range would run:",
        ]
        lines += [f"    batch {s}-{e}: {line}" for s, e, _, line in section["per_range"]]
        lines += [f"  note: {section['source']}"] if "source" in section else []
        return "\n".join(lines)
    ranges = ", ".join(f"{s}-{e}: {k}" for s, e, k in section["ranges"])
    return (
        f"per-batch schedule for {section['engine']} (batch sizes: draft length; the shortest draft of "
        f"{contexts}; docs/engines.md#schedules): {ranges}\n{section['line']}"
    )
