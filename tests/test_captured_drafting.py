"""The whole speculative step in static shapes (calibration.captured_drafting,
docs/decoder.md#captured-drafting), on CPU in float32: step by step with ragged acceptance it
equals the separate phases bit for bit (the tokens it emits and keeps, the tree it drafts next,
the hidden state, the validity mask, the cache's filled slots); greedy decoding through it is
plain greedy decoding for every drafter that can take it (Medusa, Hydra, the MLP speculator, a
path-reading oracle), trees and chains, batch 1 and a ragged batch; the drafters that cannot
are refused with their reason and keep the separate phases; the sweep records the mode. The
CUDA-graph capture of the same function runs on a GPU only."""

from __future__ import annotations

import json

import pytest
import torch

from calibration.captured_drafting import DRAFTING_MODES, captured_refusal, drafting_mode
from calibration.decoder import TreeDecoder, cut_tree
from calibration.greedy import greedy_decode
from calibration.models import load_model
from calibration.step_bench import step_bench
from calibration.sweep import SweepSettings, run_sweep
from tests import test_decoder as decoder_tests
from tests import test_drafters as drafter_tests
from treeopt.errors import UserError
from treeopt.tau import TauCurve
from treeopt.tree import load_tree, make_tree

VOCAB, NUM_HEADS = decoder_tests.VOCAB, decoder_tests.NUM_HEADS

tiny = decoder_tests.tiny  # the tiny GQA Llama with 3 random Medusa heads
tiny_drafters = drafter_tests.tiny  # the tiny model with Hydra heads and an MLP speculator beside it

CHAIN = make_tree([[0], [0, 0], [0, 0, 0]])


def _trees():
    return {
        "empty": make_tree([], allow_empty=True),
        "chain": CHAIN,
        "design_example": make_tree(decoder_tests.DESIGN_EXAMPLE),
        "mc_sim_7b_63_cut": cut_tree(load_tree("mc_sim_7b_63"), NUM_HEADS, 10),
    }


def _oracle(lm, ids, mask, n):
    """Medusa heads that know the greedy continuation (ragged, multi-token acceptance)."""
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    prompts = decoder_tests.unpadded(ids, mask)
    heads = decoder_tests.OracleHeads(lm.model, [p + r for p, r in zip(prompts, reference)], [len(p) for p in prompts])
    return heads, reference


@pytest.mark.parametrize("name", ["chain", "design_example", "mc_sim_7b_63_cut"])
def test_captured_steps_equal_the_separate_phases_bit_for_bit(tiny, name):
    """From the same prefill, step by step with oracle heads (ragged partial acceptance, holes,
    windows crossing a bucket): the captured step emits and keeps what the separate phases do,
    drafts inside itself the tree the separate phases draft next from the kept state, and leaves
    the same state and cache, exactly (the same operations on the same values)."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([6, 3], seed=2)
    oracle, _ = _oracle(lm, ids, mask, 40)
    tree = _trees()[name]
    separate = TreeDecoder(lm.model, oracle, tree, timing=False, graphs=True, drafting="separate", bucket=16)
    captured = TreeDecoder(lm.model, oracle, tree, timing=False, graphs=True, drafting="captured", bucket=16)
    assert (separate.drafting_mode, captured.drafting_mode) == ("separate", "captured")
    states = [d.prefill(ids, mask, capacity=80) for d in (separate, captured)]
    ragged = drafted_inside = 0
    for _ in range(8):
        (new_s, keep_s), (new_c, keep_c) = (d.step(s) for d, s in zip((separate, captured), states))
        assert torch.equal(new_s, new_c) and torch.equal(keep_s, keep_c)
        s, c = states
        assert torch.equal(s.valid, c.valid) and torch.equal(s.next_pos, c.next_pos)
        assert torch.equal(s.root, c.root) and torch.equal(s.hidden, c.hidden)
        assert s.cache.length == c.cache.length
        assert torch.equal(s.cache.buffer[..., : s.cache.length, :], c.cache.buffer[..., : c.cache.length, :])
        with torch.inference_mode():
            assert torch.equal(c.draft, separate.draft(s))  # the next step verifies this draft
        drafted_inside += 1
        ragged += int(keep_s.min() != keep_s.max())
    assert ragged >= 1 and drafted_inside == 8
    assert c.cache.length > 16  # the window crossed a bucket: a new step shape took the draft over


@pytest.mark.parametrize("name", ["empty", "chain", "design_example", "mc_sim_7b_63_cut"])
def test_captured_greedy_decoding_is_plain_greedy(tiny, name):
    """Random heads and oracle heads, a ragged batch of 3 (sequences leave at max_new_tokens)
    and batch 1, through the masked and the split attention."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=5)
    n = 24
    oracle, reference = _oracle(lm, ids, mask, n)
    for heads in (lm.heads, oracle):
        for attention in ("masked", "split"):
            dec = TreeDecoder(lm.model, heads, _trees()[name], graphs=True, drafting="captured", attention=attention)
            assert dec.drafting_mode == "captured" and dec.captured is not None
            assert dec.generate(ids, mask, max_new_tokens=n).tokens == reference
            assert dec.generate(ids[1:2, -9:], max_new_tokens=n).tokens == reference[1:2]
    if _trees()[name].size:
        result = TreeDecoder(lm.model, oracle, _trees()[name], graphs=True, drafting="captured").generate(
            ids, mask, max_new_tokens=n
        )
        assert result.tokens_per_step > 1.5  # the oracle's multi-token steps ran


@pytest.mark.parametrize("drafter", ["hydra", "mlp-speculator", "oracle"])
@pytest.mark.parametrize("lengths", [(7,), (5, 9, 3)])
def test_captured_drafting_is_lossless_with_sequential_drafters(tiny_drafters, drafter, lengths):
    ids, mask = drafter_tests.prompts(lengths, seed=len(lengths))
    lm = load_model(str(tiny_drafters), device="cpu", dtype="float32", drafter=None if drafter == "oracle" else drafter)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=24)
    heads = lm.heads
    if drafter == "oracle":
        rows = [ids[i][mask[i].bool()].tolist() + reference[i] for i in range(len(lengths))]
        heads = drafter_tests.OracleDrafter(drafter_tests.oracle_table(rows), 4)
    longest = 0
    for paths in drafter_tests.TREES:
        decoder = TreeDecoder(lm.model, heads, make_tree(paths), topk=4, graphs=True, drafting="captured")
        result = decoder.generate(ids, mask, max_new_tokens=24)
        assert result.tokens == reference, (drafter, paths)
        longest = max(longest, int(result.accepted.max()))
    if drafter == "oracle":
        assert longest >= 4  # deep acceptance: the captured keep moved several slots


def test_drafters_that_cannot_be_captured_keep_the_separate_phases(tiny):
    _, lm = tiny
    tree = _trees()["design_example"]

    class Eagle(type(lm.heads)):
        def read_context(self):  # the attribute that marks an EAGLE draft
            return None

    class PrefixHeads(type(lm.heads)):
        prefix_layer = True

    for heads, words in (
        (Eagle.__new__(Eagle), "EAGLE"),
        (PrefixHeads.__new__(PrefixHeads), "prefix layer"),
        (type("DraftModel", (), {"kind": "draft-model"})(), "draft model"),
    ):
        assert words in captured_refusal(heads, "tree")
    assert "candidate" in captured_refusal(lm.heads, "candidates")
    assert captured_refusal(lm.heads, "tree") is None
    cand = TreeDecoder(lm.model, lm.heads, tree, graphs=True, verification="candidates")
    assert cand.drafting_mode == "separate" and "candidate" in cand.drafting_refusal
    with pytest.raises(UserError, match="candidate"):
        TreeDecoder(lm.model, lm.heads, tree, graphs=True, verification="candidates", drafting="captured")
    with pytest.raises(UserError, match="static-shape"):
        TreeDecoder(lm.model, lm.heads, tree, graphs=False, drafting="captured")
    with pytest.raises(UserError, match="--drafting"):
        drafting_mode("inside", refusal=None, static=True, captured=False)
    # the default: captured where steps are captured as CUDA graphs, separate elsewhere
    assert drafting_mode(None, refusal=None, static=True, captured=True) == "captured"
    assert drafting_mode(None, refusal="why", static=True, captured=True) == "separate"
    assert TreeDecoder(lm.model, lm.heads, tree, graphs=True).drafting_mode == "separate"  # a CPU
    assert DRAFTING_MODES == ("captured", "separate")


def test_typical_acceptance_keeps_the_separate_phases(tiny):
    """A draw inside a graph is not captured: temperature > 0 runs the phases, seed for seed."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([5, 3], seed=1)
    tree = _trees()["design_example"]
    runs = [
        TreeDecoder(lm.model, lm.heads, tree, graphs=True, drafting=mode).generate(
            ids, mask, max_new_tokens=12, temperature=0.7, seed=3
        )
        for mode in ("separate", "captured")
    ]
    assert runs[0].tokens == runs[1].tokens


def test_sweep_times_the_captured_step_and_records_the_mode(tiny, tmp_path):
    """The sweep's timed step with captured drafting is the whole step: the separate step's
    logits, its cache append undone by the same crop, and the next draft besides; the
    metadata records the mode and a resume refuses the other one."""
    _, lm = tiny
    proposal = make_tree(decoder_tests.DESIGN_EXAMPLE)
    benches = [step_bench(lm, proposal, [3], batch=2, context=8, graphs=True, drafting=mode) for mode in DRAFTING_MODES]
    assert [b.decoders[3].drafting_mode for b in benches] == list(DRAFTING_MODES)
    tokens = benches[0].inputs[3]
    outs = []
    for bench in benches:
        dec, cache = bench.decoders[3], bench.cache
        with torch.inference_mode():
            outs.append(dec.verify_forward(cache, tokens, bench.valid, bench.positions))
        cache.crop(-dec.verify_appends)
        assert cache.length == 8
    assert torch.equal(outs[0][0], outs[1][0])
    assert outs[0][1].shape == tokens.shape  # the next tree, drafted inside the step
    settings = dict(sizes=(0, 2), batches=(1,), contexts=(5,), repeats=5, warmup=0, graphs=True)
    tau = TauCurve(proposal, 1.0 + 0.1 * torch.arange(proposal.size + 1).numpy())
    out = tmp_path / "s.csv"
    run_sweep(lm, tau, SweepSettings(**settings, drafting="captured"), out, progress=False)
    assert json.loads((tmp_path / "s.meta.json").read_text())["drafting"] == "captured"
    with pytest.raises(UserError, match="drafting"):
        run_sweep(lm, tau, SweepSettings(**settings, drafting="separate"), out, resume=True, progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: the captured graph of the whole step")
def test_captured_graph_of_the_whole_step_on_cuda(tiny):
    """On a GPU (float32, TF32 off), the graph of the whole step replayed: step by step it emits,
    keeps and drafts what the separate phases do (the first replay verifies the draft staged
    before it, not one its warm-up calls made: a stale captured draft decodes losslessly, so
    only this comparison sees it); greedy decoding with the default mode there (captured)
    equals plain greedy decoding, batch 3 with padding, a chain and a tree, windows crossing
    buckets, no capture falling back to eager."""
    _, lm = tiny
    torch.backends.cuda.matmul.allow_tf32 = False
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=5)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=80)
    try:
        model, heads = lm.model.to("cuda"), lm.heads.to("cuda")
        for name in ("chain", "mc_sim_7b_63_cut"):
            separate = TreeDecoder(model, heads, _trees()[name], timing=False, drafting="separate", bucket=16)
            captured = TreeDecoder(model, heads, _trees()[name], timing=False, bucket=16)
            assert captured.drafting_mode == "captured" and captured.steps == "cuda-graphs"
            states = [d.prefill(ids.cuda(), mask.cuda(), capacity=64) for d in (separate, captured)]
            for _ in range(6):
                (new_s, keep_s), (new_c, keep_c) = (d.step(s) for d, s in zip((separate, captured), states))
                assert torch.equal(new_s, new_c) and torch.equal(keep_s, keep_c)
                with torch.inference_mode():
                    assert torch.equal(states[1].draft, separate.draft(states[0]))
            dec = TreeDecoder(model, heads, _trees()[name], bucket=16)
            assert dec.generate(ids.cuda(), mask.cuda(), max_new_tokens=80).tokens == reference
            assert not dec.captured.notes and not captured.captured.notes  # no capture fell back to eager
    finally:
        lm.model.to("cpu")
        lm.heads.to("cpu")
