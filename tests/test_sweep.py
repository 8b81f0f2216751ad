"""The measured sweep (calibration.sweep) on a tiny random model: the timed work is a real
decoding step on a cache of exactly `context` tokens, every (batch, context, size) gets a row
with consistent derived columns, the CSV is written after every group and resumes without
re-measuring, and the end-to-end decoder throughput (batch > 1, left padding)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import calibration.sweep as sweep_mod
from calibration.greedy import plain_step_forward
from calibration.models import load_model, tiny_model_for_tests
from calibration.sweep import (
    MEASURED_COLUMNS,
    SWEEP_COLUMNS,
    SweepSettings,
    measure_end_to_end,
    measure_group,
    meta_path,
    run_sweep,
    step_bench,
)
from treeopt.errors import UserError
from treeopt.selection import format_selection, read_round_samples, read_sweep, select, sweep_samples_path
from treeopt.selection_types import selection_from_json
from treeopt.tau import TauCurve
from treeopt.tree import make_tree

VOCAB = 64
CHAIN = make_tree([[0], [0, 0], [0, 0, 0]])
PROPOSAL = make_tree([[0], [0, 0], [1], [0, 0, 0], [2], [0, 1], [1, 0]])
TAU_IND = np.array([1.0, 1.5, 1.8, 2.0, 2.1, 2.15, 2.2, 2.25])
TAU_JOINT = np.array([1.0, 1.45, 1.75, 1.9, 2.0, 2.05, 2.1, 2.12])
SETTINGS = SweepSettings((1, 3, 7), (1, 2), (8, 16), repeats=5, warmup=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with GQA (4 query heads, 2 KV heads) and 3 random Medusa heads."""
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"), vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, num_medusa_heads=3
    )
    torch.set_num_threads(1)
    return path, load_model(str(path), device="cpu", dtype="float32")


def predictor(batch, tokens, context):
    """A stand-in roofline: 1 ms + per-token and per-cached-token costs."""
    return 1e-3 + 2e-5 * batch * tokens + 1e-7 * batch * tokens * (context + tokens)


def count_groups(monkeypatch, fail_on=None):
    """Count measure_group calls; raise KeyboardInterrupt on call number `fail_on`."""
    calls = []

    def counted(*args, **kw):
        calls.append((args[3], args[4]))
        if fail_on is not None and len(calls) == fail_on:
            raise KeyboardInterrupt
        return measure_group(*args, **kw)

    monkeypatch.setattr(sweep_mod, "measure_group", counted)
    return calls


def test_step_is_a_real_decoding_step(tiny):
    """The sweep's tree step (verify_forward on its cache) gives the base logits of an uncached
    causal run of context + chain, the heads the tree uses at the root, and the plain step the
    logits of context + token; every timed call leaves exactly `context` tokens cached."""
    _, lm = tiny
    bench = step_bench(lm, CHAIN, [0, 3], batch=2, context=8, seed=3)
    assert bench.sizes == [0, 3] and len(bench.fns) == 2 and bench.cached_tokens() == 8
    assert bench.valid.shape == (2, 8) and bench.positions.tolist() == [8, 8]
    tokens = bench.inputs[3]
    assert tokens.shape == (2, 4)
    logits, head_logits = bench.decoders[3].verify_forward(bench.cache, tokens, bench.valid, bench.positions)
    assert bench.cached_tokens() == 8 + 4
    bench.cache.crop(-4)
    with torch.inference_mode():
        seq = torch.cat([bench.context_ids, tokens], dim=1)
        ref = lm.model(seq, output_hidden_states=True)
        torch.testing.assert_close(logits, ref.logits[:, 8:], atol=2e-5, rtol=1e-5)
        root_hidden = ref.hidden_states[-1][:, 8]  # after the final norm
        torch.testing.assert_close(head_logits[:, :, 0], lm.heads(root_hidden), atol=2e-5, rtol=1e-5)

        plain, no_heads = plain_step_forward(
            lm.model,
            lm.heads,
            bench.cache,
            bench.inputs[0],
            torch.ones(2, 9, dtype=torch.long),
            bench.positions[:, None],
            num_heads=0,
        )
        bench.cache.crop(-1)
        ref = lm.model(torch.cat([bench.context_ids, bench.inputs[0]], dim=1)).logits[:, -1]
        torch.testing.assert_close(plain[:, 0], ref, atol=2e-5, rtol=1e-5)
        assert no_heads.shape[0] == 0
    # the timed closures crop what they append: the cache never grows across repeats
    for _ in range(3):
        for fn in bench.fns:
            fn()
            assert bench.cached_tokens() == 8
    # and the step after all those repeats still sees the same context
    logits2, _ = bench.decoders[3].verify_forward(bench.cache, tokens, bench.valid, bench.positions)
    torch.testing.assert_close(logits2, logits)


def test_measure_group_rows(tiny, monkeypatch):
    _, lm = tiny
    seen = []
    real = sweep_mod.step_bench

    def spy(*args, **kw):
        seen.append(real(*args, **kw))
        return seen[-1]

    monkeypatch.setattr(sweep_mod, "step_bench", spy)
    rows = measure_group(lm, PROPOSAL, [7, 1], 2, 16, repeats=3, warmup=1, topk=10, seed=0)
    assert [r["nodes"] for r in rows] == [0, 1, 7]
    assert seen[0].cached_tokens() == 16  # after all the timed calls
    for r in rows:
        assert (r["batch"], r["context"], r["samples"]) == (2, 16, 3)
        assert set(MEASURED_COLUMNS) <= set(r)
        assert 0 < r["step_time_p10_s"] <= r["step_time_s"] <= r["step_time_p90_s"] < 10
        assert np.isfinite(r["overhead"]) and r["overhead"] > 0
    assert rows[0]["overhead"] == 1.0


def test_sweep_rows_and_derived_columns(tiny, tmp_path):
    _, lm = tiny
    out = tmp_path / "sweep.csv"
    df = run_sweep(
        lm,
        TauCurve(PROPOSAL, TAU_IND, TAU_JOINT),
        SETTINGS,
        out,
        predictor=predictor,
        meta={"hardware": "test-hw"},
        progress=False,
    )
    assert list(df.columns) == SWEEP_COLUMNS and len(df) == 2 * 2 * 4
    keys = list(df[["batch", "context", "nodes"]].itertuples(index=False, name=None))
    assert keys == [(b, s, n) for b in (1, 2) for s in (8, 16) for n in (0, 1, 3, 7)]
    n = df["nodes"].to_numpy()
    assert (df.loc[n == 0, "overhead"] == 1.0).all() and (df.loc[n == 0, "speedup"] == 1.0).all()
    assert np.isfinite(df["overhead"]).all() and (df["overhead"] > 0).all() and (df["step_time_s"] > 0).all()
    assert (df["samples"] == 5).all()
    np.testing.assert_array_equal(df["tau_independent"], TAU_IND[n])
    np.testing.assert_array_equal(df["tau_joint"], TAU_JOINT[n])
    np.testing.assert_array_equal(df["tau"], TAU_JOINT[n])  # joint statistics win when given
    np.testing.assert_allclose(df["speedup"], df["tau"] / df["overhead"], rtol=1e-12)
    pred = np.array([predictor(b, k + 1, s) for b, s, k in zip(df["batch"], df["context"], n, strict=False)])
    plain = np.array([predictor(b, 1, s) for b, s in zip(df["batch"], df["context"], strict=False)])
    np.testing.assert_allclose(df["predicted_step_time_s"], pred, rtol=1e-12)
    np.testing.assert_allclose(df["predicted_overhead"], pred / plain, rtol=1e-12)
    np.testing.assert_allclose(df["predicted_speedup"], df["tau"] * plain / pred, rtol=1e-12)
    assert df["e2e_speedup"].isna().all()

    back, meta = read_sweep(out)  # the file holds the same table, and selection can read it
    pd.testing.assert_frame_equal(back, df, check_dtype=False, check_exact=False, rtol=1e-12)
    assert meta["format"] == "treeopt.sweep/v1" and meta["proposal"] == PROPOSAL.to_choices()
    assert meta["measurement"] == {
        "sizes": [0, 1, 3, 7],
        "repeats": 5,
        "warmup": 1,
        "topk": 10,
        "seed": 0,
        "looks": 1,
        "confidence": 0.95,
    }
    assert meta["batches"] == [1, 2] and meta["contexts"] == [8, 16] and meta["hardware"] == "test-hw"
    assert meta["model"] == lm.name and meta["device"] == "cpu" and meta["dtype"] == "float32"


def test_sweep_without_predictor_and_size_clipping(tiny, tmp_path):
    _, lm = tiny
    settings = SweepSettings((0, 2, 64), (1,), (8,), repeats=5, warmup=0)
    df = run_sweep(lm, TauCurve(CHAIN, TAU_IND[:4], None), settings, tmp_path / "s.csv", progress=False)
    assert df["nodes"].tolist() == [0, 2, 3]  # 64 > the chain's 3 nodes: measured at 3
    assert df["tau_joint"].isna().all() and (df["tau"] == df["tau_independent"]).all()
    assert df["predicted_speedup"].isna().all()
    with pytest.raises(UserError, match=r"tau \(independent\): expected 4 values \(tree sizes 0..3\)"):
        run_sweep(lm, TauCurve(CHAIN, TAU_IND[:3], None), settings, tmp_path / "t.csv", progress=False)
    with pytest.raises(UserError, match="sweep batches"):
        SweepSettings((1,), (0,), (8,))


def test_resume(tiny, tmp_path, monkeypatch):
    _, lm = tiny
    out = tmp_path / "sweep.csv"
    one = SweepSettings((1, 3), (1,), (8, 16), repeats=5, warmup=1)
    calls = count_groups(monkeypatch)
    first = run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, TAU_JOINT), one, out, predictor=predictor, progress=False)
    assert calls == [(1, 8), (1, 16)]

    # same settings: nothing measured again, same rows
    calls.clear()
    again = run_sweep(
        lm, TauCurve(PROPOSAL, TAU_IND, TAU_JOINT), one, out, predictor=predictor, resume=True, progress=False
    )
    assert calls == []
    pd.testing.assert_frame_equal(again, first, check_exact=False, rtol=1e-12, check_dtype=False)

    # more batch sizes: only the new groups are measured, the done ones keep their numbers
    more = SweepSettings((1, 3), (1, 2), (8, 16), repeats=5, warmup=1)
    grown = run_sweep(
        lm, TauCurve(PROPOSAL, TAU_IND, TAU_JOINT), more, out, predictor=predictor, resume=True, progress=False
    )
    assert calls == [(2, 8), (2, 16)]
    pd.testing.assert_frame_equal(
        grown[grown["batch"] == 1].reset_index(drop=True), first, check_exact=False, rtol=1e-12, check_dtype=False
    )
    assert len(grown) == 12 and json.loads(meta_path(out).read_text())["batches"] == [1, 2]

    # other measurement settings, tree or model: refuse, and leave the files alone
    before = out.read_bytes(), meta_path(out).read_bytes()
    for settings, proposal, match in (
        (SweepSettings((1, 3), (1,), (8, 16), repeats=6, warmup=1), PROPOSAL, "repeats: 5 vs now 6"),
        (SweepSettings((1, 2, 3), (1,), (8, 16), repeats=5, warmup=1), PROPOSAL, "sizes"),
        (one, make_tree([[0], [1], [2], [3]]), "proposal: a different tree"),
    ):
        with pytest.raises(UserError, match=match) as exc:
            run_sweep(
                lm,
                TauCurve(proposal, TAU_IND[: proposal.size + 1], TAU_JOINT[: proposal.size + 1]),
                settings,
                out,
                resume=True,
                progress=False,
            )
        assert str(out) in str(exc.value) and "cannot resume" in str(exc.value)
    assert (out.read_bytes(), meta_path(out).read_bytes()) == before

    meta_path(out).unlink()
    with pytest.raises(UserError, match="sweep.meta.json beside it; cannot resume"):
        run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, TAU_JOINT), one, out, resume=True, progress=False)

    # without --resume the file starts afresh
    calls.clear()
    fresh = run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, TAU_JOINT), one, out, progress=False)
    assert calls == [(1, 8), (1, 16)] and len(fresh) == 6


def test_interrupted_sweep_keeps_finished_groups_and_resumes(tiny, tmp_path, monkeypatch):
    _, lm = tiny
    out = tmp_path / "sweep.csv"
    settings = SweepSettings((1, 3), (1, 2), (8,), repeats=5, warmup=1)
    calls = count_groups(monkeypatch, fail_on=2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), settings, out, progress=False)
    assert calls == [(1, 8), (2, 8)]
    partial = pd.read_csv(out)
    assert partial[["batch", "context"]].drop_duplicates().values.tolist() == [[1, 8]]
    assert partial["nodes"].tolist() == [0, 1, 3]
    # no temp files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.meta.json", "sweep.samples.npz"]

    calls.clear()
    done = run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), settings, out, resume=True, progress=False)
    assert calls == [(2, 8)]
    assert done[["batch", "nodes"]].values.tolist() == [[1, 0], [1, 1], [1, 3], [2, 0], [2, 1], [2, 3]]
    pd.testing.assert_frame_equal(
        done[done["batch"] == 1].reset_index(drop=True),
        partial.reindex(columns=SWEEP_COLUMNS),
        check_exact=False,
        rtol=1e-12,
        check_dtype=False,
    )

    # interrupted before the first group finished: nothing written, and a fresh sweep over an
    # existing file leaves it byte-identical until its first group is measured
    out2 = tmp_path / "early.csv"
    calls = count_groups(monkeypatch, fail_on=1)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), settings, out2, progress=False)
    assert not out2.exists() and not meta_path(out2).exists()
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    calls = count_groups(monkeypatch, fail_on=1)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), settings, out, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == kept
    calls = count_groups(monkeypatch)
    assert len(run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), settings, out2, resume=True, progress=False)) == 6
    assert calls == [(1, 8), (2, 8)]


def test_end_to_end_batched(tiny):
    """Real decoder throughput for batch 1 and 2 (left padding, prompts of different lengths):
    plain decoding makes exactly 1 token per step (the first token is the prefill's)."""
    _, lm = tiny
    side = lm.tokenizer.padding_side
    prompts = ["def f(x):", "a = 1", "import os\nprint(os.sep)", "x"]
    df = measure_end_to_end(lm, CHAIN, [0, 3, 99], [2, 1], prompts, max_new_tokens=6, progress=False)
    assert df[["batch", "nodes"]].values.tolist() == [[1, 0], [1, 3], [2, 0], [2, 3]]
    assert (df.loc[df["nodes"] == 0, "e2e_tokens_per_step"] == 1.0).all()
    assert (df["e2e_tokens_per_step"] >= 1.0).all() and (df["e2e_tokens_per_step"] <= 4.0).all()
    assert (df.loc[df["nodes"] == 0, "e2e_speedup"] == 1.0).all()
    assert np.isfinite(df["e2e_tokens_per_s"]).all() and (df["e2e_tokens_per_s"] > 0).all()
    # greedy acceptance of a sequence does not depend on its batch: same prompts, same steps
    by = df.set_index(["batch", "nodes"])["e2e_tokens_per_step"]
    assert by[(1, 3)] == pytest.approx(by[(2, 3)])
    assert lm.tokenizer.padding_side == side  # restored
    # fewer prompts than the batch size: the prompts are cycled to fill one batch
    small = measure_end_to_end(lm, CHAIN, [0], [3], ["ab"], max_new_tokens=3, progress=False)
    assert small["e2e_tokens_per_step"].tolist() == [1.0]
    with pytest.raises(UserError, match="prompts"):
        measure_end_to_end(lm, CHAIN, [0], [1], [], max_new_tokens=3, progress=False)


def test_resume_recomputes_derived_columns_and_carries_end_to_end(tiny, tmp_path, monkeypatch):
    """Only the measured columns are kept from the file: tau, speedup and the prediction come
    from the resuming call; end-to-end figures (per batch and size) carry over to new contexts."""
    _, lm = tiny
    calls = []

    def fake(lm_, proposal, sizes, batch, context, **kw):
        calls.append((batch, context))
        return [
            {
                "batch": batch,
                "context": context,
                "nodes": n,
                "step_time_s": 0.01 * (1 + n / 10),
                "step_time_p10_s": 0.009,
                "step_time_p90_s": 0.02,
                "samples": 3,
                "remeasured": 0,
                "overhead": 1 + n / 10,
            }
            for n in sizes
        ]

    monkeypatch.setattr(sweep_mod, "measure_group", fake)
    out = tmp_path / "sweep.csv"
    one = SweepSettings((1, 3), (1,), (8,), repeats=5, warmup=1)
    df = run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), one, out, progress=False)
    np.testing.assert_allclose(df["speedup"], [1.0, 1.5 / 1.1, 2.0 / 1.3])
    assert df["predicted_speedup"].isna().all()
    # the end-to-end columns as treeopt.app.sweep.add_end_to_end writes them
    df["e2e_tokens_per_s"] = [100.0, 120.0, 150.0]
    df["e2e_tokens_per_step"] = [1.0, 1.4, 1.8]
    df["e2e_speedup"] = [1.0, 1.2, 1.5]
    df.to_csv(out, index=False)

    again = run_sweep(
        lm, TauCurve(PROPOSAL, TAU_IND, TAU_JOINT), one, out, predictor=predictor, resume=True, progress=False
    )
    assert calls == [(1, 8)]  # nothing re-measured
    np.testing.assert_allclose(again["speedup"], TAU_JOINT[[0, 1, 3]] / np.array([1.0, 1.1, 1.3]))
    assert again["predicted_speedup"].notna().all()
    assert pd.read_csv(out)["predicted_speedup"].notna().all()  # the file is refreshed too

    wider = SweepSettings((1, 3), (1,), (8, 32), repeats=5, warmup=1)
    grown = run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), wider, out, resume=True, progress=False)
    assert calls == [(1, 8), (1, 32)]
    new = grown[grown["context"] == 32]
    assert new["e2e_speedup"].tolist() == [1.0, 1.2, 1.5]
    assert new["e2e_tokens_per_s"].tolist() == [100.0, 120.0, 150.0]

    # resume="auto" (treeopt run): a file measured with other settings is started afresh,
    # a compatible one resumed
    calls.clear()
    other = SweepSettings((1, 3), (1,), (8,), repeats=6, warmup=1)
    fresh = run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), other, out, resume="auto", progress=False)
    assert calls == [(1, 8)] and len(fresh) == 3 and fresh["e2e_speedup"].isna().all()
    assert json.loads(meta_path(out).read_text())["measurement"]["repeats"] == 6
    run_sweep(lm, TauCurve(PROPOSAL, TAU_IND, None), other, out, resume="auto", progress=False)
    assert calls == [(1, 8)]


def recorded_rounds(monkeypatch, passes):
    """Replace the timer of measure_group: pass i of interleaved rounds returns passes[i]
    (rounds x sizes seconds), whatever the functions do."""
    left = list(passes)

    def fake(fns, *, rounds, seed=0, **kw):
        x = np.asarray(left.pop(0), dtype=float)
        assert x.shape == (rounds, len(fns))
        return x.tolist()

    monkeypatch.setattr(sweep_mod, "interleaved_rounds", fake)
    return left


def test_overhead_is_the_median_of_same_round_ratios(tiny, monkeypatch):
    _, lm = tiny
    # plain [1, 2, 1] s, tree [3.0, 2.6, 1.4] s: same-round ratios [3, 1.3, 1.4] -> 1.4 (not the
    # first sample's 3.0, nor median / median = 2.6 / 1)
    recorded_rounds(monkeypatch, [[[1.0, 3.0], [2.0, 2.6], [1.0, 1.4]]])
    rows = measure_group(lm, CHAIN, [1], 1, 8, repeats=3, warmup=0, topk=10, seed=0)
    assert rows[1]["overhead"] == pytest.approx(1.4)
    assert rows[1]["round_samples"] == [3.0, 2.6, 1.4] and rows[0]["round_samples"] == [1.0, 2.0, 1.0]
    assert rows[1]["remeasured"] == 0 and rows[1]["unreliable"] == 0


# step times of plain, 1, 2 and 3 nodes of CHAIN and their tau: true speedups 1.43, 1.64, 1.43
TRUE_STEP = np.array([0.010, 0.0105, 0.011, 0.014])
CHAIN_TAU = np.array([1.0, 1.5, 1.8, 2.0])


def steady(rounds, seed):
    rng = np.random.default_rng(seed)
    return TRUE_STEP[None, :] * np.exp(rng.normal(0, 0.01, size=(rounds, 4)))


def burst_in_plain(rounds, seed, hit):
    """A 3x slowdown burst that lands on the plain step in the first `hit` rounds."""
    x = steady(rounds, seed)
    x[:hit, 0] *= 3.0
    return x


def test_burst_in_the_plain_step_is_never_selected_on(tiny, tmp_path, monkeypatch):
    _, lm = tiny
    # first pass: the burst covers the plain step of every round (every tree "faster than
    # plain"); the re-measure still has it in 3 rounds of 10, which the median of same-round
    # ratios outvotes
    left = recorded_rounds(monkeypatch, [burst_in_plain(10, 0, 10), burst_in_plain(10, 1, 3)])
    settings = SweepSettings((1, 2, 3), (1,), (8,), repeats=10, warmup=0)
    out = tmp_path / "s.csv"
    df = run_sweep(lm, TauCurve(CHAIN, CHAIN_TAU, None), settings, out, progress=False)
    assert not left  # the disturbed rounds were measured again
    assert (df["remeasured"] == 1).all() and (df["unreliable"] == 0).all()
    back, meta = read_sweep(out)
    doc = select(back, CHAIN, samples=read_round_samples(sweep_samples_path(out))).to_json()
    cell = doc["cells"][0]
    # the 3 disturbed rounds of 10 leave the answer open at 3% (a resample that draws half
    # of them makes every tree look free), but what ships is the true best
    assert cell["nodes"] == 2
    assert cell["speedup_lo"] <= 1.8 / 1.1 <= cell["speedup_hi"]
    assert (back["speedup"] <= back["tau"]).all()


def test_impossible_cell_stays_flagged(tiny, tmp_path, monkeypatch):
    _, lm = tiny
    recorded_rounds(monkeypatch, [burst_in_plain(10, 0, 10), burst_in_plain(10, 1, 10)])
    settings = SweepSettings((1, 2, 3), (1,), (8,), repeats=10, warmup=0)
    out = tmp_path / "s.csv"
    df = run_sweep(lm, TauCurve(CHAIN, CHAIN_TAU, None), settings, out, progress=False)
    # every tree looks 3x faster than plain: impossible twice, so marked, and never chosen
    assert df.loc[df["nodes"] > 0, "unreliable"].eq(1).all() and df.loc[df["nodes"] == 0, "unreliable"].eq(0).all()
    doc = select(read_sweep(out)[0], CHAIN, samples=read_round_samples(sweep_samples_path(out))).to_json()
    cell = doc["cells"][0]
    assert cell["nodes"] == 0 and cell["reason"] == "unreliable" and cell["unreliable_nodes"] == [1, 2, 3]
    assert doc["undecided"] == [{"batch": 1, "context": 8}]
    # every tree beat plain decoding by more than it can: the headline names the slow plain step
    # (docs/statistics.md#sanity-checks-of-a-measurement), not an undecided cell to measure again
    assert "PLAIN STEP SLOWER" in format_selection(selection_from_json(doc))


def test_adaptive_rounds_until_decided(tiny, tmp_path, monkeypatch):
    """A cell whose first rounds cannot tell a 14% speedup from none gets more rounds, doubling
    at each look, until its answer is settled within the tolerance."""
    _, lm = tiny
    rng = np.random.default_rng(5)
    # same-round ratios 0.9 .. 1.3 (a disturbed start): the lower bound of 1.2 / 1.3 is below 1
    noisy = 0.01 * np.column_stack([np.ones(5), [0.9, 1.3, 1.0, 1.25, 0.95]])
    # the passes the sweep may ask for: 5 more rounds (10 in all), then 10 (20), then 20 (40)
    more = [TRUE_STEP[None, :2] * np.exp(rng.normal(0, 0.01, size=(k, 2))) for k in (5, 10, 20)]
    left = recorded_rounds(monkeypatch, [noisy] + more)
    tau = np.array([1.0, 1.2])  # 1.2 / 1.05: a 14% speedup
    settings = SweepSettings((1,), (1,), (8,), repeats=5, warmup=0, time_budget_s=60, max_rounds_factor=8)
    assert settings.looks == 4 and settings.confidence == pytest.approx(1 - 0.05 / 4)
    out = tmp_path / "s.csv"
    df = run_sweep(lm, TauCurve(make_tree([[0]]), tau, None), settings, out, progress=False)
    used = 3 - len(left)
    assert used >= 1 and df["samples"].iloc[0] == 5 * 2**used
    back, meta = read_sweep(out)
    assert meta["measurement"]["confidence"] == pytest.approx(1 - 0.05 / 4)
    doc = select(back, make_tree([[0]]), samples=read_round_samples(sweep_samples_path(out))).to_json()
    assert doc["cells"][0]["nodes"] == 1 and doc["cells"][0]["reason"] == "best"
