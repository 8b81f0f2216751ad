"""How well treeopt predicts the published step times of speculative decoding
(docs/performance-model.md#published-speculative-steps). Run:

    python benchmarks/bench_published_steps.py

A benchmark, not a test: no GPU and no download; it reads roofline/data/published_speculative_steps.json
(roofline.published_steps) and, for every published table with step ratios, prints:

(a) the built-in profile of the paper's GPU with the table's model shape: the predicted
    T(n)/T(0) against the measured one (median and worst |error| over the speculative rows),
    and, per group of rows sharing one plain step (one batch and prompt), the candidate count
    that minimises the predicted ms per token, T(n) / tokens_per_step(n), priced at its
    measured cost: "measured ms per token of the picked / measured best - 1";
(b) a fit of that profile (roofline.profile_fit.fit_profile) on the table's batch-1 rows,
    judged on rows it did not see. IBM's Table 1: fitted on batch 1 at prompt 64, held out
    batches 2 and 4 and the whole prompt 2048 (and, printed beside it, a fit on batch 1 at both
    prompts judged on batches 2 and 4). Medusa: every row of its tables is batch 1, so a fit on
    Appendix F's two steps of a model is judged on Table 1's overhead of the same model, a
    different benchmark run of the same code: that error is mostly the two tables'
    disagreement, printed for information, with no target.

(c) the engine presets (roofline/data/engine_presets.json, docs/performance-model.md#engine-presets),
    judged on the published rows their derivation (tools/fit_engine_presets.py) did not fit on: the
    ibm-tgis preset, fitted on IBM's prompt 64, on IBM's prompt 2048; the hf-eager preset, fitted
    on Medusa Appendix F's 7B and 13B models, on Appendix F's Vicuna-33B and the whole of Table 1;
    the vllm preset, fitted on SpecDecode-Bench's cost model at batches 1, 8, 16, 32 and 64, on its
    batches 2, 4 and 128 and, independently of that cost model, on vLLM issue #20780's EAGLE and
    EAGLE-3 chains of 2 to 7 tokens at batch 1 (another vLLM release, another measurement), where
    the picked count is the chain length with the least measured ms per token.

(d) the sglang preset (vllm's terms, carried) on EAGLE-3's Table 3: SGLang v0.4.4's speedups of
    EAGLE and EAGLE-3 chains of 3 at batches 2-64 on an H100, printed without tokens per step,
    and the vllm preset on the same paper's Table 5 (vLLM, chains of 2, batches 2-56, A100).
    With tau the same at every batch, speedup(b) = speedup(2) x T(k)/T(0) at 2 / T(k)/T(0) at b:
    the preset's step ratios predict every batch from batch 2's speedup, and whether speculation
    still pays (speedup > 1) at each batch. That premise is checked on the table itself first
    (roofline.published_checks.speedup_ratio_premise): EAGLE's and EAGLE-3's speedups in one
    engine, one chain, one base model can only keep or raise their ratio over batch while both
    taus are constant; in both tables it falls by more than rounding, so EAGLE's rows are printed
    "NOT JUDGED" (premise contradicted by the table: not a test of step costs) and EAGLE-3's
    stay judged (the data file's why_eagle_falls says what was checked).

(e) engines' drafting configurations side by side at one batch (tables of kind engine_configs),
    each with its engine's preset: vLLM PR #22752's chain against a tree on one backend (vllm;
    no plain run: the tree's step over the chain's), SpecForge issue #339's SGLang chains and trees
    of Qwen3-30B-A3B on two H100s beside plain decoding (sglang), SGLang PR #4716's 64-token
    EAGLE-3 tree of Llama-3.3-70B on eight H100s beside plain decoding (sglang), SpecForge's
    SpecBundle dashboard's chains and trees of equal counts of Llama-3.1-8B on one H200 and
    Llama-3.3-70B on four beside plain decoding (sglang; FITTED, not held out: the sglang preset's
    tree_verify_layer_s is fitted on their trees minus chains, so their names say "(fitted)" and
    their calls stay out of the call resolution), TensorRT-LLM PR
    #5146's EAGLE-3 chains of Llama-3.3-70B and of FP8 Llama 4 Maverick on eight H200s beside plain
    decoding (trtllm), and SPEED-Bench's TensorRT-LLM chains of Llama-3.3-70B on one B200 (EAGLE-3
    at batch 16 and ISLs 1k-8k, EAGLE-3 and n-gram at batch 32) and DeepSeek-R1's MTP chains on
    eight B200s (trtllm), and AngelSlim issue #163's SGLang EAGLE-3 trees of Qwen3-30B-A3B on four
    H100s beside plain decoding at batches 1-64 and SGLang PR #5318's chain and tree of Llama-3.1-8B
    beside plain decoding at batch 1, and SpecBundle's chains and trees of Qwen3-30B-A3B at batch 8
    on H200s (TP 4 taken; held out) and of Llama 4 Scout on eight (held out; its plain run not
    held: the table is judged against its chain 3-1-4) (sglang). A configuration labelled "tree" is priced as a step
    whose tokens branch (its preset's tree_verify_layer_s per target layer). Per batch: the step ratios'
    errors, and three calls against the measurement: on/off (is plain decoding the cheapest per
    token), chain-or-tree (is the cheapest speculative configuration a chain or a tree), and the
    configuration picked by the predicted ms per token priced at its measured cost ("measured ms
    per token of the picked / measured best - 1"). A call whose two best configurations (one of
    each kind, by the preset) are predicted closer per token than the call resolution
    (roofline/data/call_resolution.json, recomputed here from the same calls of the held-out tables;
    docs/performance-model.md#close-calls) is a close call: listed apart with its measured gap
    ("CLOSE CALL"), never counted as agreeing; every other call must agree with the measurement.
    A batch whose measured plain step is more than twice the preset's, or under half of it, is
    outside the regime the model prices (roofline.published_checks.plain_step_regime;
    docs/performance-model.md#the-priced-regime): its rows are shown, and listed as NOT JUDGED with
    their errors, but no error, call, pick or pair of theirs is counted.

(f) the whole held-out judgement (issue 42's "within 15% median, with the calls agreeing"):
    the presets' |error| pooled over every published row no preset term was fitted on ((c)'s
    held-out rows, (d)'s judged batches, (e)'s held-out tables), and the confident calls of (e)'s
    held-out tables that disagree with the measurement (target: none).

The targets (docs/performance-model.md#published-speculative-steps): built-in median |error|
<= 15% and the picked count within 5% of the measured best; fitted on batch 1, <= 10% and
within 3%; an engine preset on held-out rows, <= 15% and within 5%. The tables without step
ratios (Hydra's) are listed with the reason.

`main()` returns [(name, value, target, unit, lower_is_better), ...] for run_all.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roofline.engine_presets import apply_preset, fitted_tables, load_presets, step_costs  # noqa: E402
from roofline.hardware import load_hardware  # noqa: E402
from roofline.latency import step_time_s  # noqa: E402
from roofline.profile_fit import fit_profile, predict_step_s  # noqa: E402
from roofline.published_checks import (  # noqa: E402
    call_resolution,
    load_call_resolution,
    plain_step_regime,
    speedup_ratio_premise,
)
from roofline.published_steps import published_tables, step_points  # noqa: E402
from roofline.shapes import draft_heads_shape, model_shape  # noqa: E402
from roofline.step_shape import StepShape  # noqa: E402

BUILTIN_RATIO, BUILTIN_PICK = 0.15, 0.05
FITTED_RATIO, FITTED_PICK = 0.10, 0.03
PRESET_RATIO, PRESET_PICK = 0.15, 0.05
PREMISE_CONTRADICTED = "premise contradicted by the table (tau fell with batch): not a test of step costs"


def _heads(rows: pd.DataFrame, shape):
    k = int(rows["draft_heads"].max())
    return draft_heads_shape(shape, k) if k > 0 else None


def predict(rows: pd.DataFrame, hw_by_shape) -> pd.DataFrame:
    """rows with predicted step_ms and predicted ratio T(n)/T(0) in each group; hw_by_shape maps
    a shape name to the profile to price it with."""
    out = rows.copy()
    out["predicted_ms"] = np.nan
    for name, part in rows.groupby("shape"):
        shape = model_shape(name)
        out.loc[part.index, "predicted_ms"] = 1e3 * predict_step_s(
            shape, _heads(part, shape), hw_by_shape(name), step_points(part)
        )
    plain = out[out["tokens"] == 1].set_index("group")["predicted_ms"]
    out["predicted_ratio"] = out["predicted_ms"] / out["group"].map(plain)
    out["ratio_error"] = out["predicted_ratio"] / out["ratio"] - 1.0
    return out


def group_summary(pred: pd.DataFrame) -> pd.DataFrame:
    """Per group: median and worst |T(n)/T(0) error| over its speculative rows and, with two or
    more speculative rows, the measured best candidate count (a chain's draft length where only
    that varies; 0: plain decoding), the predicted pick and the picked one's measured excess
    cost per token."""
    rows = []
    for group, g in pred.groupby("group", sort=False):
        spec = g[g["tokens"] > 1]
        err = spec["ratio_error"].abs()
        row = {"group": group, "median_err": err.median(), "worst_err": err.max()}
        if len(spec) >= 2:
            measured = g["ratio"] / g["tokens_per_step"]  # ms per token in units of T(0)
            predicted = g["predicted_ratio"] / g["tokens_per_step"]
            best, pick = measured.idxmin(), predicted.idxmin()
            # what the group varies: IBM's candidate count, or a chain's draft length
            size = "candidates" if spec["candidates"].nunique() > 1 else "draft_stages"
            row.update(
                best=int(g.loc[best, size] if g.loc[best, "tokens"] > 1 else 0),
                picked=int(g.loc[pick, size] if g.loc[pick, "tokens"] > 1 else 0),
                pick_excess=float(measured[pick] / measured[best] - 1.0),
            )
        rows.append(row)
    return pd.DataFrame(rows)


def print_summary(label: str, pred: pd.DataFrame) -> dict:
    cells = group_summary(pred)
    spec = pred[pred["tokens"] > 1]
    err = spec["ratio_error"].abs()
    print(f"\n  {label}")
    show = spec[["group", "tokens", "ratio", "predicted_ratio", "ratio_error"]]
    print("    " + show.to_string(index=False, float_format=lambda v: f"{v:.3f}").replace("\n", "\n    "))
    print("    " + cells.to_string(index=False, float_format=lambda v: f"{v:.3f}").replace("\n", "\n    "))
    out = {"median": float(err.median()), "worst": float(err.max()), "errors": err.to_numpy()}
    line = (
        f"    T(n)/T(0): median |error| {out['median'] * 100:.1f}%, "
        f"worst {out['worst'] * 100:.1f}% over {len(err)} rows"
    )
    if "pick_excess" in cells:
        out["pick_worst"] = float(cells["pick_excess"].max())
        out["pick_median"] = float(cells["pick_excess"].median())
        line += (
            f"; picked count's measured cost over the best: median {out['pick_median'] * 100:.1f}%, "
            f"worst {out['pick_worst'] * 100:.1f}% over {cells['pick_excess'].notna().sum()} groups"
        )
    print(line)
    return out


def fitted(table, fit_rows: pd.DataFrame, held: pd.DataFrame, label: str) -> dict:
    """Fit the built-in profile on fit_rows (one shape) and print the errors on held-out rows
    (held must carry its own plain rows: ratios are within a group)."""
    shape = model_shape(fit_rows["shape"].iloc[0])
    base = load_hardware(table.hardware)
    fit = fit_profile(shape, _heads(fit_rows, shape), base, step_points(fit_rows), leave_one_out=False, source=table.id)
    terms = ", ".join(f"{k}={v:.3g}" for k, v in fit.terms.items())
    in_sample = np.abs(fit.in_sample_error)
    print(
        f"\n  {label}\n    fitted terms: {terms}\n    in sample ({len(fit_rows)} rows): step_ms median |error| "
        f"{np.median(in_sample) * 100:.1f}%, worst {in_sample.max() * 100:.1f}%"
    )
    return print_summary(f"held out ({len(held)} rows)", predict(held, lambda _: fit.profile))


def ibm(table) -> list[tuple]:
    steps = table.steps
    base = load_hardware(table.hardware)
    built = print_summary(
        f"(a) built-in {table.hardware}, shape {steps['shape'].iloc[0]}", predict(steps, lambda _: base)
    )
    b1 = steps["batch"] == 1
    short = steps["context"] == steps["context"].min()
    fit = fitted(table, steps[b1 & short], steps[~(b1 & short)], "(b) fitted on batch 1, prompt 64")
    fitted(table, steps[b1], steps[~b1], "(b') fitted on batch 1, both prompts; held out: batches 2 and 4")
    name = f"{table.id}"
    return [
        (f"{name} built-in: median |T(n)/T(0) error|", built["median"], BUILTIN_RATIO, "", True),
        (f"{name} built-in: picked count's excess cost (worst group)", built["pick_worst"], BUILTIN_PICK, "", True),
        (f"{name} fit on batch 1: median |T(n)/T(0) error|, held out", fit["median"], FITTED_RATIO, "", True),
        (
            f"{name} fit on batch 1: picked count's excess cost (worst held-out group)",
            fit["pick_worst"],
            FITTED_PICK,
            "",
            True,
        ),
    ]


def medusa(table, tables) -> list[tuple]:
    hw = load_hardware(table.hardware)
    steps = table.steps
    built = print_summary(
        f"(a) built-in {table.hardware}, 64-token tree vs plain step, batch 1", predict(steps, lambda _: hw)
    )
    if table.kind == "step_throughput":
        other = next(t for t in tables if t.kind == "step_overhead" and t.citation.arxiv == table.citation.arxiv)
        errs = []
        for model, rows in steps.groupby("group", sort=False):
            held = other.steps[other.steps["group"] == model]
            if len(held):
                errs.append(
                    fitted(table, rows, held, f"(b) fitted on {model}'s two steps; held out: {other.id}")["median"]
                )
        print(
            f"\n  (b) over {len(errs)} models: median |overhead error| {np.median(errs) * 100:.1f}% "
            f"(for information: mostly the two tables' disagreement; no target)"
        )
    return [(f"{table.id} built-in: median |T(tree)/T(0) error|", built["median"], BUILTIN_RATIO, "", True)]


def preset_rows(tables) -> dict[str, pd.DataFrame]:
    """Per measured preset, the published rows its derivation did not fit on (with their plain
    rows: ratios are within a group), as tools/fit_engine_presets.py names them."""
    by_id = {t.id: t.steps for t in tables}
    ibm = by_id["ibm-table1"]
    appf = by_id["medusa-appF"]
    held_f = appf[appf["group"] == "Vicuna-33B"]
    table1 = by_id["medusa-table1"].assign(group=lambda d: "Table 1 " + d["group"])
    sdb = by_id["specdecode-bench"]
    return {
        "vllm": sdb[sdb["batch"].isin([2, 4, 128])].reset_index(drop=True),
        # independent of the cost model the preset was fitted to: another vLLM, another measurement
        "vllm on vllm-issue-20780": by_id["vllm-issue-20780"],
        "ibm-tgis": ibm[ibm["context"] > ibm["context"].min()].reset_index(drop=True),
        "hf-eager": pd.concat([held_f.assign(group="App. F Vicuna-33B"), table1], ignore_index=True),
    }


def presets(tables) -> tuple[list[tuple], list[float], list[tuple]]:
    """(c): each measured preset on its held-out rows, beside the ideal engine on the same rows.
    Returns the results, every held-out row's |T(n)/T(0) error|, and the groups set aside
    because their measured plain step is outside the priced regime (`regime_outside`), as
    (name, median |error|, why)."""
    hardware = {t.id: t.hardware for t in tables}
    where = {
        "ibm-tgis": hardware["ibm-table1"],
        "hf-eager": hardware["medusa-appF"],
        "vllm": hardware["specdecode-bench"],
        "vllm on vllm-issue-20780": hardware["vllm-issue-20780"],
    }
    known = load_presets()
    results, held_errors, unjudged = [], [], []
    print("\n== engine presets on held-out rows (roofline/data/engine_presets.json)")
    for label, held in preset_rows(tables).items():
        family = label.split(" on ")[0]
        preset = known[family]
        base = load_hardware(where[label])
        print(f"\n  {family}: fitted on {preset.fit_rows}; held out: {preset.held_out}")
        print("    terms: " + ", ".join(f"{k}={v:.4g}" for k, v in preset.terms.items()))
        priced = apply_preset(base, family)
        with_preset = predict(held, lambda _, hw=priced: hw)
        # a group whose plain step is outside the priced regime is set aside, as in (e)
        outside = {
            g: why
            for g, row in with_preset[with_preset["tokens"] == 1].set_index("group").iterrows()
            if (why := regime_outside(row))
        }
        for g, why in outside.items():
            print(f"    NOT JUDGED {g}: {why}")
            errs = with_preset.loc[(with_preset["group"] == g) & (with_preset["tokens"] > 1), "ratio_error"]
            unjudged.append((f"engine preset {label} {g}: median |T(n)/T(0) error|", float(errs.abs().median()), why))
        inside = ~held["group"].isin(list(outside))
        held, with_preset = held[inside], with_preset[inside]
        ideal = print_summary(f"(ideal) built-in {base.name}, same rows", predict(held, lambda _, hw=base: hw))
        got = print_summary(f"(c) {family} preset on {base.name}", with_preset)
        print(
            f"    ideal engine on the same rows: median {ideal['median'] * 100:.1f}%"
            + (f", picked count's excess worst {ideal['pick_worst'] * 100:.1f}%" if "pick_worst" in ideal else "")
        )
        held_errors += list(got["errors"])
        results.append(
            (f"engine preset {label}: median |T(n)/T(0) error|, held out", got["median"], PRESET_RATIO, "", True)
        )
        if "pick_worst" in got:
            results.append(
                (
                    f"engine preset {label}: picked count's excess cost (worst held-out group)",
                    got["pick_worst"],
                    PRESET_PICK,
                    "",
                    True,
                )
            )
    return results, held_errors, unjudged


def premise_line(premise) -> str:
    """The premise check's line (roofline.published_checks.speedup_ratio_premise)."""
    i, j = premise.batches_fallen
    verdict = "contradicted" if premise.contradicted else "not contradicted"
    return (
        "    premise check: speedup(eagle) / speedup(eagle3) per batch "
        + " ".join(f"{r:.3f}" for r in premise.ratio)
        + f"; largest fall {premise.fall * 100:.1f}% (batch {i} to {j}) against {premise.rounding_bound * 100:.1f}% "
        f"that 2-decimal printing can make: constant tau {verdict} by the table"
    )


def batch_growth(tables) -> tuple[list[tuple], list[tuple], list[float]]:
    """(d): an engine's preset against a table of speedups per batch without tokens per step
    (EAGLE-3's Tables 3 and 5): with tau the same at every batch, speedup(b) = speedup(2) x
    ratio(2) / ratio(b), so the preset's step ratios predict every batch from batch 2's speedup
    alone; judged on batches 4 on and on whether speculation pays (speedup > 1) at each.

    First the premise: EAGLE's and EAGLE-3's speedups in one table give their ratio per batch,
    which constant taus forbid to fall (roofline.published_checks.speedup_ratio_premise). Where
    it falls beyond rounding, EAGLE's rows are shown but not judged (the second list: name,
    value, why); EAGLE-3's stay judged (docs/performance-model.md#published-speculative-steps).
    The third list: every judged batch's |speedup error|."""
    results, unjudged, held_errors = [], [], []
    for table in tables:
        if table.kind != "speedup_by_batch":
            continue
        raw, engine = table.setup, table.setup["engine_preset"]
        k, context, shape = int(raw["draft_tokens"]), int(raw["context"]), model_shape(raw["shape"])
        batches = np.array(_raw_table(table.id)["batches"])
        speedups = _raw_table(table.id)["speedup"]
        print(f"\n== {engine} preset on {table.id}'s speedups per batch ({table.citation})")
        premise = speedup_ratio_premise(batches, speedups["eagle"], speedups["eagle3"])
        print(premise_line(premise))
        for drafter, measured in speedups.items():
            hw = step_costs(load_hardware(table.hardware), engine=engine, drafter=drafter).profile
            ratio = np.array(
                [
                    step_time_s(shape, None, hw, StepShape(int(b), k + 1, context, draft_stages=k))
                    / step_time_s(shape, None, hw, StepShape(int(b), 1, context))
                    for b in batches
                ]
            )
            measured = np.array(measured, dtype=float)
            predicted = measured[0] * ratio[0] / ratio
            err = predicted[1:] / measured[1:] - 1
            calls = (predicted > 1) == (measured > 1)
            print(f"  {drafter}: batch    " + " ".join(f"{b:5d}" for b in batches))
            print("    measured       " + " ".join(f"{v:5.2f}" for v in measured))
            print("    predicted      " + " ".join(f"{v:5.2f}" for v in predicted))
            print(
                f"    median |error| {np.median(np.abs(err)) * 100:.1f}%, worst {np.max(np.abs(err)) * 100:.1f}% "
                f"over batches {batches[1]}-{batches[-1]}; speculation on/off called as measured at "
                f"{int(calls.sum())} of {len(calls)} batch sizes"
            )
            if drafter == "eagle" and premise.contradicted:
                print(f"    not judged: {PREMISE_CONTRADICTED}")
            held = f"batches {batches[1]}-{batches[-1]}"
            name = f"engine preset {engine} on {table.id} {drafter}: median |speedup error|, {held}"
            if drafter == "eagle" and premise.contradicted:
                unjudged.append((name, float(np.median(np.abs(err))), PREMISE_CONTRADICTED))
            else:
                results.append((name, float(np.median(np.abs(err))), PRESET_RATIO, "", True))
                held_errors += list(np.abs(err))
    return results, unjudged, held_errors


def config_calls(group: pd.DataFrame, resolution: float = 0.0) -> dict:
    """One batch of an engine_configs table with predicted steps (column predicted_rel: the
    predicted step over the reference's, that of plain decoding where measured, else the chain's):
    the step ratios' errors and the calls, measured against predicted. Per-token costs are
    step / tokens per step in units of the reference step.

    Each call (on_off: plain decoding against the cheapest speculative configuration;
    chain_or_tree: the cheapest chain against the cheapest tree) compares the predicted best of
    each kind, as `treeopt roofline speedup` does: under `pairs`, per call, the error of their
    predicted step ratio against the measured one (what the call resolution is derived from,
    roofline.published_checks.call_resolution), the predicted and measured gaps (the dearer of
    the two per token over the cheaper, minus 1; the measured one between the measured best of
    each kind), `close`: a predicted gap below `resolution`, a call the tool does not make, and
    `measured_within`: the measured gap below `resolution` too, which is what a close call
    claims (the two configurations cost the same per token within the model's resolution)."""
    structure = group["config"].str.split().str[0]
    reference = group[structure == ("plain" if (structure == "plain").any() else "chain")].iloc[0]
    by_step = group["step_ms"] / reference["step_ms"]
    measured_rel = by_step.where(by_step.notna(), group["ratio"] / reference["ratio"])
    measured, predicted = measured_rel / group["tokens_per_step"], group["predicted_rel"] / group["tokens_per_step"]
    out = {"errors": (group["predicted_rel"] / measured_rel - 1).drop(reference.name), "measured_rel": measured_rel}
    out["pick_excess"] = float(measured[predicted.idxmin()] / measured.min() - 1)
    spec = structure != "plain"
    kinds = {}
    if not spec.all():
        out["on_off"] = (structure[measured.idxmin()] == "plain", structure[predicted.idxmin()] == "plain")
        kinds["on_off"] = (~spec, spec)
    if {"chain", "tree"} <= set(structure[spec]):
        out["chain_or_tree"] = (structure[measured[spec].idxmin()], structure[predicted[spec].idxmin()])
        kinds["chain_or_tree"] = (structure == "chain", structure == "tree")
    out["pairs"] = {}
    for call, (one, other) in kinds.items():
        a, b = predicted[one].idxmin(), predicted[other].idxmin()
        error = (group.loc[b, "predicted_rel"] / group.loc[a, "predicted_rel"]) / (
            measured_rel[b] / measured_rel[a]
        ) - 1
        gap = max(predicted[a], predicted[b]) / min(predicted[a], predicted[b]) - 1
        best_one, best_other = measured[one].min(), measured[other].min()
        out["pairs"][call] = {
            "error": float(error),
            "predicted_gap": float(gap),
            "measured_gap": float(max(best_one, best_other) / min(best_one, best_other) - 1),
            "close": bool(gap < resolution),
            "measured_within": bool(max(best_one, best_other) / min(best_one, best_other) - 1 < resolution),
            "resolution": resolution,
        }
    return out


def call_line(call: str, calls: dict) -> str:
    """How one call of a batch reads: confident (and whether it agrees with the measurement) or
    close (no call, with the measured gap)."""
    pair = calls["pairs"][call]
    words = {True: "plain decoding", False: "speculation", "chain": "a chain", "tree": "a tree"}
    measured, predicted = (words[v] for v in calls[call])
    what = call.replace("_", "-")
    if pair["close"]:
        return (
            f"{what}: close call, no call made (the preset leans to {predicted} by {pair['predicted_gap'] * 100:.1f}% "
            f"per token, within ±{pair['resolution'] * 100:.1f}%); measured: {measured}, by "
            f"{pair['measured_gap'] * 100:.1f}%, "
            + ("within it, as the close call says" if pair["measured_within"] else "BEYOND it: a call was missed")
        )
    verdict = "agrees" if measured == predicted else "DISAGREES"
    return f"{what}: called {predicted} ({pair['predicted_gap'] * 100:.1f}% apart), measured {measured}: {verdict}"


def _table_steps(table) -> pd.DataFrame:
    """The table's rows with the predicted step of its engine's preset and of the ideal engine."""
    setup, rows = table.setup, table.steps.copy()
    engine, tp = setup["engine_preset"], int(setup.get("tensor_parallel", 1))
    hw = step_costs(load_hardware(table.hardware), engine=engine, drafter=setup["drafter_kind"]).profile
    step = StepShape(
        rows["batch"].to_numpy(),
        rows["tokens"].to_numpy(),
        rows["context"].to_numpy(),
        draft_stages=rows["draft_stages"].to_numpy(),
        tensor_parallel_gpus=tp,
        # a configuration labelled "tree" branches (SGLang: topk > 1), which the preset's
        # tree_verify_layer_s prices per layer (docs/performance-model.md#engine-presets); a table
        # whose chains ran on the tree's attention path prices them so too
        tree_verify=rows["config"].str.startswith("tree").to_numpy() | ("chains_verified_as_trees" in setup),
    )
    shape = model_shape(setup["shape"], dtype=setup.get("shape_dtype"))  # e.g. an FP8 checkpoint
    rows["predicted_ms"] = 1e3 * step_time_s(shape, None, hw, step)
    rows["ideal_ms"] = 1e3 * step_time_s(shape, None, load_hardware(table.hardware), step)
    return rows


def engine_configs(tables) -> tuple[list[tuple], list[str], dict, list[tuple]]:
    """(e): each engine_configs table with its engine's preset: per batch, the predicted steps of
    its configurations against the measured ones, and the on/off and chain-or-tree calls: a call
    whose predicted gap is within the stored call resolution (roofline/data/call_resolution.json)
    is a close call, reported with the measured gap and never counted as agreeing; every other
    call must agree with the measurement. A batch outside the priced regime (`regime_outside`) is
    shown and set aside, none of its numbers counted. Last, the resolution recomputed from these
    tables' pairs (roofline.published_checks.call_resolution) against the stored one. Returns the
    results, one line per close call (shown apart from PASS and FAIL), over the held-out tables
    only, every configuration's |step ratio error| ("errors") and whether each confident call
    agreed with the measurement ("confident"), and the batches set aside as (name, median |step
    ratio error|, why)."""
    stored = load_call_resolution()
    results, pair_errors, close_lines, unjudged = [], [], [], []
    held = {"errors": [], "confident": []}
    fitted = fitted_tables()
    for table in tables:
        if table.kind != "engine_configs":
            continue
        engine, rows = table.setup["engine_preset"], _table_steps(table)
        # a table a preset term was fitted on is shown and judged, but it is not held out: its
        # pairs stay out of the call resolution (docs/performance-model.md#close-calls)
        role = " (FITTED: a preset term was fitted on this table, not held out)" if table.id in fitted else ""
        print(f"\n== {engine} preset on {table.id}{role}: {table.citation}")
        print(f"   {table.setup['model']}, {table.setup['gpu']}, {table.setup['drafter']}")
        errors, ideal_errors, excess = [], [], []
        judged = {"on_off": [], "chain_or_tree": [], "close": []}
        name = f"engine preset {engine} on {table.id}" + (" (fitted)" if table.id in fitted else "")
        for _, group in rows.groupby("group", sort=False):
            ref = group["config"].str.startswith("plain").any()
            base = group[group["config"].str.startswith("plain" if ref else "chain")].iloc[0]
            group = group.assign(predicted_rel=group["predicted_ms"] / base["predicted_ms"])
            calls = config_calls(group, stored.fraction)
            show = group.assign(measured_rel=calls["measured_rel"])
            show = show[
                ["group", "config", "tokens", "draft_stages", "tokens_per_step", "measured_rel", "predicted_rel"]
            ]
            print("    " + show.to_string(index=False, float_format=lambda v: f"{v:.3f}").replace("\n", "\n    "))
            outside = regime_outside(base) if ref else None
            if outside:
                # the batch's plain step is not the step the model prices, nor, in the same run,
                # are its speculative steps: shown, never judged (docs/performance-model.md#the-priced-regime)
                print(f"    NOT JUDGED: {outside}")
                where = f"{name} {group['group'].iloc[0]}: median |step ratio error|"
                unjudged.append((where, float(calls["errors"].abs().median()), outside))
                continue
            errors += list(calls["errors"])
            ideal_errors += list(
                config_calls(group.assign(predicted_rel=group["ideal_ms"] / base["ideal_ms"]))["errors"]
            )
            excess.append(calls["pick_excess"])
            print(
                f"    steps over {base['config']}'s: median |error| {calls['errors'].abs().median() * 100:.1f}%; "
                f"picked configuration's measured cost per token over the best: {calls['pick_excess'] * 100:+.1f}%"
            )
            for call, pair in calls["pairs"].items():
                if table.id not in fitted:
                    pair_errors.append(pair["error"])
                print("    " + call_line(call, calls))
                agree = calls[call][0] == calls[call][1]
                (judged["close"] if pair["close"] else judged[call]).append(agree)
                if pair["close"]:
                    close_lines.append(f"{table.id} {group['group'].iloc[0]} {call_line(call, calls)}")
        if not errors:
            print(f"    {table.id}: no batch in the priced regime, nothing judged")
            continue
        median = float(np.median(np.abs(errors)))
        summary = f"    {table.id}: median |step ratio error| {median * 100:.1f}% over {len(errors)} configurations"
        summary += f" (ideal engine: {np.median(np.abs(ideal_errors)) * 100:.1f}%)"
        for what in ("on_off", "chain_or_tree"):
            if judged[what]:
                agreed = f"{sum(judged[what])} of {len(judged[what])}"
                summary += f"; {what.replace('_', '-')} confident calls as measured: {agreed}"
        if judged["close"]:
            summary += f"; close calls (no call): {len(judged['close'])}"
        print(summary)
        confident = judged["on_off"] + judged["chain_or_tree"]
        wrong = len(confident) - sum(confident)
        if table.id not in fitted:
            held["errors"] += list(np.abs(errors))
            held["confident"] += confident
        results.append((f"{name}: median |step ratio error|", median, PRESET_RATIO, "", True))
        results.append(
            (f"{name}: picked configuration's excess cost (worst batch)", max(excess), PRESET_PICK, "", True)
        )
        if confident:  # no confident call, nothing to judge: the close calls are listed apart
            results.append(
                (
                    f"{name}: confident calls wrong, {wrong} of {len(confident)} "
                    f"(and {len(judged['close'])} close calls, not made)",
                    wrong / len(confident),
                    0.0,
                    "",
                    True,
                )
            )
    results.append(resolution_check(stored, pair_errors))
    return results, close_lines, held, unjudged


def regime_outside(plain: pd.Series) -> str:
    """Why a batch's measured plain step (`plain`: its row, step_ms measured, predicted_ms by the
    preset) is outside the priced regime, or "" when it is inside or not measured."""
    if not np.isfinite(plain["step_ms"]):
        return ""
    regime = plain_step_regime([plain["step_ms"]], [plain["predicted_ms"]])
    if not regime.outside[0]:
        return ""
    return (
        f"outside the priced regime: plain decoding measured {plain['step_ms']:.2f} ms a step, "
        f"{regime.factor[0]:.2f}x the preset's {plain['predicted_ms']:.2f} ms (beyond {regime.bound:g}x): "
        "not a test of step costs"
    )


def pooled(held_errors: list[float], confident: list[bool]) -> list[tuple]:
    """(f): issue 42's whole held-out judgement in two lines: the presets' |error| pooled over
    every published row no preset term was fitted on ((c)'s held-out T(n)/T(0) rows, (d)'s judged
    speedups, (e)'s held-out tables' step ratios), and the confident on/off and chain-or-tree
    calls on (e)'s held-out tables that disagree with the measurement."""
    wrong = len(confident) - sum(confident)
    return [
        (
            f"engine presets, pooled over {len(held_errors)} held-out published rows: median |error|",
            float(np.median(held_errors)),
            PRESET_RATIO,
            "",
            True,
        ),
        (
            f"engine presets, confident calls on held-out tables wrong: {wrong} of {len(confident)}",
            wrong / len(confident),
            0.0,
            "",
            True,
        ),
    ]


def resolution_check(stored, pair_errors) -> tuple:
    """The call resolution recomputed from the calls' pair errors against the stored one."""
    recomputed = call_resolution(pair_errors)
    print(
        f"\n== call resolution (roofline/data/call_resolution.json): {stored.rule}\n"
        f"   |pair errors| over {len(pair_errors)} calls: "
        + " ".join(f"{abs(e) * 100:.1f}%" for e in sorted(pair_errors, key=abs))
        + f"\n   recomputed {recomputed * 100:.1f}%, stored {stored.fraction * 100:.1f}% "
        f"(largest {max(map(abs, pair_errors)) * 100:.1f}%)"
    )
    name = (
        f"call resolution: stored {stored.fraction * 100:.1f}% against recomputed {recomputed * 100:.1f}%, |difference|"
    )
    return (name, abs(stored.fraction - recomputed), 0.0, "", True)


def _raw_table(table_id: str) -> dict:
    import json

    from roofline.published_steps import DATA_FILE

    return next(t for t in json.loads(DATA_FILE.read_text(encoding="utf-8"))["tables"] if t["id"] == table_id)


def main() -> list[tuple]:
    tables = published_tables()
    results = []
    for table in tables:
        print(f"\n== {table.id}: {table.citation}")
        print(f"   setup: {', '.join(f'{k} {v}' for k, v in table.setup.items())}")
        for why in table.skipped:
            print(f"   skipped {why}")
        if table.steps.empty:
            print(f"   no step rows: {table.note}")
        elif table.kind == "engine_configs":
            print("   judged with its engine's preset in (e) below")
        elif table.kind == "ibm_candidates":
            results += ibm(table)
        else:
            results += medusa(table, tables)
    preset_results, preset_errors, unjudged = presets(tables)
    results += preset_results
    growth, contradicted, growth_errors = batch_growth(tables)
    unjudged += contradicted
    results += growth
    configs, close_lines, held, outside = engine_configs(tables)
    unjudged += outside
    results += configs
    results += pooled(preset_errors + growth_errors + held["errors"], held["confident"])
    print()
    for name, value, target, _unit, _lower in results:
        print(f"{'PASS' if value <= target else 'FAIL'}  {name}: {value * 100:.1f}% (target <= {target * 100:.0f}%)")
    for line in close_lines:
        print(f"CLOSE CALL (no call, not counted as agreeing)  {line}")
    if close_lines:
        held = sum("within it, as the close call says" in line for line in close_lines)
        print(
            f"CLOSE CALLS measured within the resolution, as they claim: {held} of {len(close_lines)} "
            "(the resolution is the 90th percentile of the pair errors, so about 1 in 10 may fall beyond it)"
        )
    for name, value, why in unjudged:
        print(f"NOT JUDGED  {name}: {value * 100:.1f}%: {why}")
    return results


if __name__ == "__main__":
    main()
