"""Static-shape verification steps (calibration.static_steps, docs/decoder.md#static-shape-steps),
on CPU in float32: the static step's logits equal the eager step's (plain and tree steps, batch 1
and 2, several contexts, both verification forms); greedy decoding through it is plain greedy
decoding (random and oracle heads, batch 1 and a ragged batch); the cache after several steps,
with ragged partial acceptance between them, holds the eager cache's entries; the pieces of
the CUDA branch that run without a GPU (input staging, windows, the capture fallback); the
sweep records the mode and a resume refuses to mix modes."""

from __future__ import annotations

import json

import pytest
import torch

import calibration.static_steps as static_steps
from calibration.decoder import TreeDecoder, cut_tree
from calibration.greedy import greedy_decode
from calibration.static_steps import StaticInputs, StepRunner, graphs_enabled, static_window, step_mode, uses_static
from calibration.sweep import SweepSettings, run_sweep, step_bench
from tests import test_decoder as decoder_tests
from treeopt.errors import UserError
from treeopt.tau import TauCurve
from treeopt.tree import load_tree, make_tree

VOCAB, NUM_HEADS = decoder_tests.VOCAB, decoder_tests.NUM_HEADS
ATOL = 1e-5

tiny = decoder_tests.tiny  # the tiny GQA Llama fixture (4 query heads, 2 KV heads)


def _trees():
    return {
        "empty": make_tree([], allow_empty=True),
        "design_example": make_tree(decoder_tests.DESIGN_EXAMPLE),
        "mc_sim_7b_63_cut": cut_tree(load_tree("mc_sim_7b_63"), NUM_HEADS, 10),
    }


def _pair(lm, heads, tree, **kw):
    """(eager, static) decoders of the same tree."""
    return (
        TreeDecoder(lm.model, heads, tree, timing=False, graphs=False, **kw),
        TreeDecoder(lm.model, heads, tree, timing=False, graphs=True, **kw),
    )


def _filled_equal(a, b):
    """The filled slots of two KVCaches hold the same entries (to ATOL)."""
    assert a.length == b.length
    torch.testing.assert_close(a.buffer[..., : a.length, :], b.buffer[..., : b.length, :], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["empty", "design_example", "mc_sim_7b_63_cut"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("form", ["tree", "candidates"])
def test_static_step_logits_equal_the_eager_steps(tiny, name, batch, form):
    _, lm = tiny
    tree = _trees()[name]
    if form == "candidates" and tree.size == 0:
        pytest.skip("the empty tree has no candidate rows")
    eager, static = _pair(lm, lm.heads, tree, verification=form)
    assert (eager.steps, static.steps) == ("eager", "static")
    g = torch.Generator().manual_seed(7)
    for context in (1, 5, 63, 64, 70):  # across window edges (bucket 64)
        ids = torch.randint(3, VOCAB, (batch, context), generator=g)
        tokens = torch.randint(3, VOCAB, (batch, tree.size + 1), generator=g)
        states = [d.prefill(ids, capacity=context + tree.size + 1) for d in (eager, static)]
        (le, he), (ls, hs) = (
            d.verify_forward(s.cache, tokens, s.valid, s.next_pos) for d, s in zip((eager, static), states)
        )
        torch.testing.assert_close(ls, le, atol=ATOL, rtol=0)
        torch.testing.assert_close(hs, he, atol=ATOL, rtol=0)
        _filled_equal(states[0].cache, states[1].cache)


def test_static_steps_keep_the_eager_cache_through_partial_acceptance(tiny):
    """Step by step on the same state, with oracle heads (ragged acceptance: the cache keeps
    each sequence's accepted path, with holes): the same tokens and kept counts, the verify
    logits and the cache's filled slots equal the eager path's after every step."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([6, 3], seed=2)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=24)
    prompts = decoder_tests.unpadded(ids, mask)
    oracle = decoder_tests.OracleHeads(lm.model, [p + r for p, r in zip(prompts, reference)], [len(p) for p in prompts])
    eager, static = _pair(lm, oracle, _trees()["mc_sim_7b_63_cut"])
    states = [d.prefill(ids, mask, capacity=64) for d in (eager, static)]
    ragged = 0
    for _ in range(5):
        with torch.inference_mode():
            tokens = eager.draft(states[0])
            assert torch.equal(tokens, static.draft(states[1]))
            (le, _), (ls, _) = (
                d.verify_forward(s.cache, tokens, s.valid, s.next_pos) for d, s in zip((eager, static), states)
            )
        torch.testing.assert_close(ls, le, atol=ATOL, rtol=0)
        for d, s in zip((eager, static), states):
            s.cache.crop(-d.verify_appends)
        (new_e, keep_e), (new_s, keep_s) = (d.step(s) for d, s in zip((eager, static), states))
        assert torch.equal(new_e, new_s) and torch.equal(keep_e, keep_s)
        ragged += int(keep_e.min() != keep_e.max())
        assert torch.equal(states[0].valid, states[1].valid) and torch.equal(states[0].next_pos, states[1].next_pos)
        torch.testing.assert_close(states[1].hidden, states[0].hidden, atol=ATOL, rtol=0)
        _filled_equal(states[0].cache, states[1].cache)
    assert ragged >= 1 and int(keep_e.max()) > 1


@pytest.mark.parametrize("name", ["empty", "design_example", "mc_sim_7b_63_cut"])
def test_static_greedy_decoding_is_plain_greedy(tiny, name):
    """The losslessness check (tests/test_decoder.py) on the static path, by name: random heads
    and oracle heads (multi-token acceptance, holes), a ragged batch of 3 and batch 1."""
    _, lm = tiny
    tree = _trees()[name]
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=5)
    n = 24
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    prompts = decoder_tests.unpadded(ids, mask)
    oracle = decoder_tests.OracleHeads(lm.model, [p + r for p, r in zip(prompts, ref)], [len(p) for p in prompts])
    for heads in (lm.heads, oracle):
        dec = TreeDecoder(lm.model, heads, tree, graphs=True)
        assert dec.steps == "static" and dec.runner is not None
        res = dec.generate(ids, mask, max_new_tokens=n)
        assert res.tokens == ref
        assert dec.generate(ids[1:2, -9:], max_new_tokens=n).tokens == ref[1:2]
    if tree.size:
        assert res.tokens_per_step > 1.5  # the oracle's multi-token steps ran
    cand = TreeDecoder(lm.model, oracle, tree, verification="candidates") if tree.size else None
    if cand is not None:
        assert cand.generate(ids, mask, max_new_tokens=n).tokens == ref


# ---- the pieces the CUDA branch shares --------------------------------------------------------


def test_static_inputs_stage_a_step():
    neg = torch.finfo(torch.float32).min
    inputs = StaticInputs(2, 3, 8, torch.float32, torch.device("cpu"))
    tokens, positions = torch.tensor([[4, 5, 6], [7, 8, 9]]), torch.tensor([[3, 4, 4], [2, 3, 3]])
    wide = torch.zeros(2, 1, 3, 7)
    inputs.load(tokens, positions, wide, 4)
    narrow = torch.full((2, 1, 3, 5), neg)
    narrow[..., 0] = 0.0
    buffers = (inputs.tokens, inputs.positions, inputs.mask, inputs.write)
    inputs.load(tokens + 1, positions + 1, narrow, 2)
    # the same buffers (a graph reads them), refilled: the slots past the mask hidden again
    assert all(a is b for a, b in zip(buffers, (inputs.tokens, inputs.positions, inputs.mask, inputs.write)))
    assert torch.equal(inputs.tokens, tokens + 1) and torch.equal(inputs.positions, positions + 1)
    assert inputs.write.tolist() == [2, 3, 4]
    assert (inputs.mask[..., 0] == 0).all() and (inputs.mask[..., 1:] == neg).all()
    with pytest.raises(RuntimeError):  # a mask wider than the window
        inputs.load(tokens, positions, torch.zeros(2, 1, 3, 9), 0)


def test_windows_and_modes():
    assert [static_window(f, q, 64) for f, q in ((0, 1), (63, 1), (64, 1), (10, 65))] == [64, 64, 128, 128]
    assert static_window(37, 4, 1) == 41
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [graphs_enabled(g, cuda) for g in (None, True, False)] == [True, True, False]
    assert not any(graphs_enabled(g, cpu) for g in (None, True, False))
    assert [step_mode(g, cpu) for g in (None, True, False)] == ["eager", "static", "eager"]
    assert [uses_static(g, cpu) for g in (None, True, False)] == [False, True, False]
    assert [uses_static(g, cuda) for g in (None, True, False)] == [True, True, False]
    assert [step_mode(g, cuda) for g in (None, False)] == ["cuda-graphs", "eager"]


def test_runner_reuses_a_step_per_shape_and_falls_back_when_capture_fails(tiny, monkeypatch, capsys):
    """One staged step per (batch, q, window, buffer); a capture that raises leaves the eager
    body with a one-line note, and the step's output is unchanged."""
    _, lm = tiny
    eager, static = _pair(lm, lm.heads, _trees()["design_example"])
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(3, VOCAB, (2, eager.q), generator=torch.Generator().manual_seed(2))
    state = static.prefill(ids, capacity=40)
    args = (state.cache, tokens, state.valid, state.next_pos)
    first, _ = static.verify_forward(*args)
    state.cache.crop(-static.verify_appends)
    static.verify_forward(*args)
    state.cache.crop(-static.verify_appends)
    assert len(static.runner._steps) == 1 and len(static.runner.staging_s) == 2

    def failing_capture(body):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(static_steps, "GraphStep", failing_capture)
    monkeypatch.setattr(static_steps, "CAPTURE_FAILURES", [])
    runner = StepRunner(lm.model, force_gqa=static.force_gqa, graphs=True)
    static.runner = runner
    again, _ = static.verify_forward(*args)
    assert not runner.graphs and len(runner.notes) == 1 and "\n" not in runner.notes[0]
    # the process-wide record a report of captured steps reads (benchmarks/gpu_check.py)
    assert static_steps.CAPTURE_FAILURES == ["RuntimeError: operation not permitted when stream is capturing"]
    assert "operation not permitted" in capsys.readouterr().err
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    ref_state = eager.prefill(ids, capacity=40)
    ref, _ = eager.verify_forward(ref_state.cache, tokens, ref_state.valid, ref_state.next_pos)
    torch.testing.assert_close(again, ref, atol=ATOL, rtol=0)


# ---- the sweep --------------------------------------------------------------------------------


def test_sweep_static_steps_and_mode_in_the_metadata(tiny, tmp_path):
    _, lm = tiny
    proposal = make_tree(decoder_tests.DESIGN_EXAMPLE)
    for graphs in (True, None, False):
        bench = step_bench(lm, proposal, [0, 3], batch=2, context=8, graphs=graphs)
        for fn in bench.fns:
            fn()
        assert bench.cached_tokens() == 8
    assert step_bench(lm, proposal, [3], batch=2, context=8).decoders[3].steps == "eager"  # the CPU default
    static = step_bench(lm, proposal, [3], batch=2, context=8, graphs=True)
    assert static.decoders[3].steps == "static" and static.decoders[3].runner.bucket == 1
    settings = SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0, graphs=False)
    out = tmp_path / "s.csv"
    run_sweep(
        lm, TauCurve(proposal, 1.0 + 0.1 * torch.arange(proposal.size + 1).numpy()), settings, out, progress=False
    )
    assert json.loads((tmp_path / "s.meta.json").read_text())["steps"] == "eager"
    with pytest.raises(UserError, match="steps"):
        run_sweep(
            lm,
            TauCurve(proposal, 1.0 + 0.1 * torch.arange(proposal.size + 1).numpy()),
            SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0, graphs=True),
            out,
            resume=True,
            progress=False,
        )
