"""Published step times of speculative decoding as treeopt step rows
(docs/performance-model.md#published-speculative-steps).

roofline/data/published_speculative_steps.json holds the papers' numbers as printed, each table
with its citation, setup, units and an uncertainty note: IBM's Table 1 (Wertheimer et al. 2024,
arXiv 2404.19124), Medusa's Table 1 and Appendix F (Cai et al. 2024, arXiv 2401.10774) and
Hydra's Appendix D and Section 6.2 (Ankner et al. 2024, arXiv 2402.05109), and SpecDecode-Bench's
cost model of vLLM's steps (Liu et al. 2026, arXiv 2601.11580), and vLLM issue #20780's EAGLE and
EAGLE-3 chains at batch 1 (acceptance length and time per output token), and engines' drafting
configurations side by side at one batch (chains against trees, and plain decoding where
measured: vLLM PRs #22752 and #16035, SpecForge issue #339, PRs #4716 and #5318, AngelSlim
issue #163 and SpecForge's SpecBundle dashboard on SGLang, TensorRT-LLM PR #5146).
`published_tables()` turns every table that gives step times, or ratios of step times, into rows
of the step table of docs/performance-model.md#fitting-a-profile-to-measured-steps (batch, context, tokens,
candidates, draft_stages, step_ms), with the measured T(n)/T(0) of each row beside it. Hydra's
tables give drafting costs and speedups but no tree step, so they are held with no rows and a
note saying why. A row whose model shape is not a built-in (`roofline.shapes.builtin_shapes`) is
left out and named in the table's `skipped`, never given made-up dimensions.

numpy and pandas only, like the rest of `roofline`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.profile_fit import StepPoints
from roofline.shapes import builtin_shapes

__all__ = [
    "DATA_FILE",
    "ROW_COLUMNS",
    "Citation",
    "PublishedTable",
    "cost_model_step_rows",
    "engine_chain_rows",
    "engine_config_rows",
    "ibm_step_rows",
    "medusa_step_rows",
    "published_tables",
    "step_points",
]

DATA_FILE = Path(__file__).resolve().parent / "data" / "published_speculative_steps.json"

#: one row per measured step: the step table's columns, the drafting it ran, and what the paper
#: measured of it. group: the rows that share one plain step T(0) (one batch and prompt, one
#: model); ratio: the measured T(n)/T(0) in its group; tokens_per_step: tokens generated per step
#: (1 for plain decoding); ms_per_token: step_ms / tokens_per_step (NaN where step_ms is); config:
#: an engine configuration's name where a group compares them ("plain", "chain ...", "tree ...";
#: NaN in the tables that vary one count).
ROW_COLUMNS = (
    "group",
    "shape",
    "batch",
    "context",
    "tokens",
    "candidates",
    "draft_stages",
    "draft_heads",
    "step_ms",
    "ratio",
    "tokens_per_step",
    "ms_per_token",
    "config",
)


@dataclass(frozen=True)
class Citation:
    paper: str
    arxiv: str
    where: str  # the table or section

    def __str__(self) -> str:
        return f"{self.paper}, arXiv {self.arxiv}, {self.where}"


@dataclass(frozen=True)
class PublishedTable:
    """One published table: its source and setup as transcribed, and its steps as rows
    (`ROW_COLUMNS`; empty when the table gives no step ratio, `note` says why). hardware: the
    built-in profile of the paper's GPU; skipped: rows left out (a shape that is not built in)."""

    id: str
    kind: str
    citation: Citation
    setup: dict
    units: str
    uncertainty: str
    hardware: str
    steps: pd.DataFrame
    note: str = ""
    skipped: tuple[str, ...] = ()


def ibm_step_rows(table: dict) -> pd.DataFrame:
    """IBM's Table 1 as step rows. A step with c candidates verifies c candidate sequences of
    stages + 1 tokens each, the root and one token per speculator stage (batch expansion,
    `treeopt.candidates.candidate_tokens`): tokens = c (stages + 1) per sequence, candidates =
    c, draft_stages = stages; c = 0 is plain decoding (tokens 1, no drafting).

    The paper prints milliseconds per generated token and tokens generated per step, so

        step_ms = ms_per_token x tokens_per_step

    (a step generates tokens_per_step tokens, each costing ms_per_token). Its uncertainty: both
    factors are printed to 2 decimals (about 0.1-0.2% each), and tokens_per_step is one row per
    prompt length averaged over batch sizes 1, 2 and 4, while ms_per_token is per batch size; if
    acceptance differs by batch, a step time is off by that difference (the ratios T(c)/T(0)
    inherit it, since T(0) has tokens_per_step 1 exactly). The number of generated tokens is
    not in the data, so the context is the prompt length: the steps' real contexts are longer by
    up to the generated length, which matters for attention only at the short prompt."""
    stages = int(table["stages"])
    shape = table["setup"]["shape"]
    rows = []
    for prompt, data in table["prompts"].items():
        tps = [float(v) for v in data["tokens_per_step"]]
        for batch, per_token in data["ms_per_token"].items():
            plain_ms = None
            for c, ms, t in zip(table["candidates"], per_token, tps, strict=True):
                step_ms = float(ms) * t
                plain_ms = step_ms if c == 0 else plain_ms
                rows.append(
                    {
                        "group": f"batch {batch}, prompt {prompt}",
                        "shape": shape,
                        "batch": int(batch),
                        "context": int(prompt),
                        "tokens": c * (stages + 1) if c > 0 else 1,
                        "candidates": max(int(c), 1),
                        "draft_stages": stages if c > 0 else 0,
                        "draft_heads": 0,
                        "step_ms": step_ms,
                        "ratio": step_ms / plain_ms,
                        "tokens_per_step": t,
                        "ms_per_token": float(ms),
                    }
                )
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def medusa_step_rows(table: dict) -> pd.DataFrame:
    """Medusa's tables as step rows, two per model: the plain step (tokens 1) and the tree step
    (tokens = tree_tokens, the tree's nodes and its root, with the draft heads it runs), both at
    batch 1 and the table's assumed context. Table 1 ("step_overhead") prints the tree step over
    the plain step (its "overhead") but no times: step_ms is NaN, ratio = overhead. Appendix F
    ("step_throughput") prints tokens per second: plain step_ms = 1000 / base_tok_s, tree
    step_ms = 1000 x acc_rate / medusa_tok_s (tokens per second over tokens per step)."""
    setup = table["setup"]
    rows = []
    for r in table["rows"]:
        if table["kind"] == "step_overhead":
            plain_ms, tree_ms, ratio = np.nan, np.nan, float(r["overhead"])
        else:
            plain_ms = 1e3 / float(r["base_tok_s"])
            tree_ms = 1e3 * float(r["acc_rate"]) / float(r["medusa_tok_s"])
            ratio = tree_ms / plain_ms
        for tokens, step_ms, rel, tps, heads in (
            (1, plain_ms, 1.0, 1.0, 0),
            (int(setup["tree_tokens"]), tree_ms, ratio, float(r["acc_rate"]), int(setup["draft_heads"])),
        ):
            rows.append(
                {
                    "group": r["model"],
                    "shape": r["shape"],
                    "batch": int(setup["batch"]),
                    "context": int(setup["context"]),
                    "tokens": tokens,
                    "candidates": 1,
                    "draft_stages": 0,
                    "draft_heads": heads,
                    "step_ms": step_ms,
                    "ratio": rel,
                    "tokens_per_step": tps,
                    "ms_per_token": step_ms / tps,
                }
            )
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def cost_model_step_rows(table: dict) -> pd.DataFrame:
    """A published cost model of an engine's steps (SpecDecode-Bench's `Llama8BH100`, Liu et al.
    2026) evaluated as its simulator evaluates it, one group per (batch, context): the plain step

        T(0) = kv_s x b s + batched_token_s x b + fixed_s + overhead_per_step_s

    and the speculative step of k draft tokens (tokens k + 1, drafted in k draft forwards)

        T(k) = kv_s x b s + batched_token_s x b (k + 1) + fixed_s
               + draft_kv_s x b s + draft_token_s x (k + 1) + draft_fixed_s + overhead_per_step_s

    (b s: the batch's KV tokens; the draft's token term counts one request's k + 1 tokens, the
    simulator's largest request). tokens_per_step is NaN: a cost model gives no acceptance."""
    c = {k: float(v) for k, v in table["coefficients"].items()}
    setup = table["setup"]
    k = int(setup["draft_tokens"])
    rows = []
    for batch in setup["batches"]:
        for context in setup["contexts"]:
            kv = float(batch) * float(context)
            plain_s = c["forward_kv_s"] * kv + c["forward_batched_token_s"] * batch + c["forward_fixed_s"]
            plain_s += c["overhead_per_step_s"]
            spec_s = c["forward_kv_s"] * kv + c["forward_batched_token_s"] * batch * (k + 1) + c["forward_fixed_s"]
            spec_s += c["draft_kv_s"] * kv + c["draft_token_s"] * (k + 1) + c["draft_fixed_s"]
            spec_s += c["overhead_per_step_s"]
            for tokens, stages, step_s in ((1, 0, plain_s), (k + 1, k, spec_s)):
                rows.append(
                    {
                        "group": f"batch {batch}, context {context}",
                        "shape": setup["shape"],
                        "batch": int(batch),
                        "context": int(context),
                        "tokens": tokens,
                        "candidates": 1,
                        "draft_stages": stages,
                        "draft_heads": 0,
                        "step_ms": 1e3 * step_s,
                        "ratio": step_s / plain_s,
                        "tokens_per_step": np.nan if tokens > 1 else 1.0,
                        "ms_per_token": np.nan if tokens > 1 else 1e3 * step_s,
                    }
                )
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def engine_chain_rows(table: dict) -> pd.DataFrame:
    """An engine's chains measured at one batch size, one group per drafter: the plain step and
    a chain of K draft tokens for each K (tokens K + 1, K draft forwards). The source prints the
    acceptance length L(K) (tokens per step, the bonus included) and the time per output token,
    so with T(0) = the vanilla TPOT (one token per plain step)

        T(K) / T(0) = L(K) x TPOT(K) / TPOT(vanilla)

    (a step of T(K) yields L(K) tokens). step_ms is that ratio times the vanilla TPOT."""
    setup, plain_ms = table["setup"], float(table["vanilla_tpot_ms"])
    rows = []
    for drafter, data in table["drafters"].items():
        base = {"group": f"{drafter}, batch {setup['batch']}", "shape": setup["shape"], "batch": int(setup["batch"])}
        base |= {"context": int(setup["context"]), "candidates": 1, "draft_heads": 0}
        rows.append(base | {"tokens": 1, "draft_stages": 0, "step_ms": plain_ms, "ratio": 1.0})
        rows[-1] |= {"tokens_per_step": 1.0, "ms_per_token": plain_ms}
        for k, length, tpot in zip(table["draft_tokens"], data["acceptance_length"], data["tpot_ms"], strict=True):
            step_ms = float(length) * float(tpot)
            rows.append(base | {"tokens": int(k) + 1, "draft_stages": int(k), "step_ms": step_ms})
            rows[-1] |= {"ratio": step_ms / plain_ms, "tokens_per_step": float(length), "ms_per_token": float(tpot)}
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def engine_config_rows(table: dict) -> pd.DataFrame:
    """An engine's drafting configurations measured side by side, one group per batch size: a
    configuration verifies `verified_tokens` per sequence after `draft_stages` draft forwards, and
    the source prints its acceptance length L (tokens per step, the bonus included; 1 for plain
    decoding) with either the output throughput of all b sequences or the speedup over plain
    decoding at the same batch. A step of b sequences yields b x L tokens, so

        step_ms = 1000 x b x L / throughput,   T / T(plain) = L / speedup

    and the ratio is against the group's plain step where the source has one (NaN otherwise: only
    configurations against each other can be judged then). A configuration the source did not
    run at a batch (null) gives no row. Where one batch size was measured at several prompt
    lengths or on several datasets (SPEED-Bench's Table 10), the setup names each column's
    context (`contexts`) and group (`group_labels`) beside `batches`; otherwise every column has
    the setup's one context and is named by its batch."""
    setup = table["setup"]
    batches = [int(b) for b in table["batches"]]
    contexts = setup.get("contexts", [setup.get("context")] * len(batches))
    labels = setup.get("group_labels", [f"batch {b}" for b in batches])
    rows = []
    for i, batch in enumerate(batches):
        base = {"group": labels[i], "shape": setup["shape"], "batch": batch, "context": int(contexts[i])}
        base |= {"candidates": 1, "draft_heads": 0}
        plain = table["configs"].get("plain", {})
        plain_ms = 1e3 * batch / plain["throughput_tok_s"][i] if "throughput_tok_s" in plain else np.nan
        for name, config in table["configs"].items():
            length = config["acceptance_length"][i]
            if length is None:
                continue
            row = base | {"config": name, "tokens": int(config["verified_tokens"])}
            row |= {"draft_stages": int(config["draft_stages"]), "tokens_per_step": float(length)}
            if "throughput_tok_s" in config:
                row["step_ms"] = 1e3 * batch * float(length) / float(config["throughput_tok_s"][i])
                row["ratio"] = row["step_ms"] / plain_ms
            else:
                row["step_ms"] = np.nan
                row["ratio"] = float(length) / float(config["speedup"][i])
            rows.append(row | {"ms_per_token": row["step_ms"] / float(length)})
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


_ROWS = {
    "ibm_candidates": ibm_step_rows,
    "step_overhead": medusa_step_rows,
    "step_throughput": medusa_step_rows,
    "cost_model": cost_model_step_rows,
    "engine_chain_tpot": engine_chain_rows,
    "engine_configs": engine_config_rows,
}
_NO_ROWS = {
    "draft_overhead": "drafting costs per step only: no tree-step time, so no step ratio",
    "speedup_only": "wall-clock speedups only, without tokens per step per batch: no step ratio",
    "speedup_by_batch": "speedups per batch size without tokens per step: no step ratio, but (tau constant) "
    "how the step ratio grows with batch (benchmarks/bench_published_steps.py)",
}


def _table(raw: dict) -> PublishedTable:
    kind = raw["kind"]
    if kind in _ROWS:
        steps, note = _ROWS[kind](raw), ""
    else:
        steps, note = pd.DataFrame(columns=list(ROW_COLUMNS)), _NO_ROWS[kind]
    known = builtin_shapes()
    missing = sorted(set(steps["shape"]) - set(known))
    skipped = tuple(
        f"{g}: shape '{s}' is not built in"
        for g, s in steps[["group", "shape"]].drop_duplicates().values
        if s in missing
    )
    steps = steps[~steps["shape"].isin(missing)].reset_index(drop=True)
    return PublishedTable(
        id=raw["id"],
        kind=kind,
        citation=Citation(**raw["citation"]),
        setup=dict(raw["setup"]),
        units=raw["units"],
        uncertainty=raw["uncertainty"],
        hardware=raw["setup"]["hardware"],
        steps=steps,
        note=note,
        skipped=skipped,
    )


def published_tables(path: Path = DATA_FILE) -> tuple[PublishedTable, ...]:
    """Every table of the data file, in its order, with its steps as rows (`ROW_COLUMNS`)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return tuple(_table(raw) for raw in data["tables"])


def step_points(rows: pd.DataFrame) -> StepPoints:
    """The rows as `roofline.profile_fit.StepPoints` (step_s NaN where only a ratio was
    published: such rows can be predicted, not fitted)."""
    col = {k: rows[k].to_numpy(dtype=float) for k in ("batch", "context", "tokens", "candidates", "draft_stages")}
    return StepPoints(
        **col,
        draft_heads=rows["draft_heads"].to_numpy(dtype=float),
        step_s=rows["step_ms"].to_numpy(dtype=float) / 1e3,
        tree_verify=np.zeros(len(rows), dtype=bool),
    )
