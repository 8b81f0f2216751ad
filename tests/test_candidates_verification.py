"""Candidate-sequence verification (IBM's batch expansion) in the reference decoder and the
sweep (docs/decoder.md#candidate-sequence-verification), and the choice between forms
(treeopt.forms.choose_form, docs/builders.md#choosing-the-verification-form).

The decoder checks: greedy decoding with candidate verification emits exactly plain greedy
decoding (float32; batch 1 and a ragged batch with holes and finished sequences; Medusa heads,
oracle heads, the MLP speculator, Hydra heads, a path-reading oracle); every step accepts the
same path as the tree form; a chain (one candidate) gives the tree form's step bit for bit;
each candidate row's logits equal the tree forward's at the matching nodes; the acceptance
and the cache expansion by hand."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from calibration.decoder import TreeDecoder, cut_tree
from calibration.greedy import greedy_decode
from calibration.kv_cache import KVCache
from calibration.models import load_model, tiny_model_for_tests
from calibration.sweep import SweepSettings, check_form, run_sweep, step_bench
from calibration.verification import AcceptanceRule
from roofline.hardware import load_hardware
from roofline.latency import step_time_s
from roofline.shapes import DraftHeadsShape
from tests import test_decoder as decoder_tests
from tests import test_drafters as drafter_tests
from treeopt.accuracy import AccuracyTable
from treeopt.app.models import shape_of
from treeopt.app.sweep import step_predictor
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.forms import FORMS_FORMAT
from treeopt.forms import choose_form as _choose_form
from treeopt.selection_types import selection_from_json
from treeopt.tau import TauCurve
from treeopt.tree import load_tree, make_tree

VOCAB = 64
BUSHY = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1], [0, 0, 0], [0, 0, 1], [1, 0, 0]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny GQA Llama with 3 random Medusa heads, a Hydra head set and an MLP speculator."""
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"), vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, num_medusa_heads=3
    )
    drafter_tests.write_hydra(path / "hydra", num_heads=4, num_layers=2)
    drafter_tests.write_mlp(path / "mlp_speculator", n_predict=4, inner_dim=24)
    torch.set_num_threads(1)
    return path, load_model(str(path), device="cpu", dtype="float32")


def choose_form(docs: dict, **kwargs) -> dict:
    """`treeopt.forms.choose_form` on selection documents, as its JSON section."""
    return _choose_form({k: selection_from_json(v) for k, v in docs.items()}, **kwargs).to_json()


def medusa_trees():
    return {
        "mc_sim_7b_63_cut": cut_tree(load_tree("mc_sim_7b_63"), 3, 10),
        "bushy": make_tree(BUSHY),
        "chain": make_tree([[0], [0, 0], [0, 0, 0]]),
        "empty": make_tree([], allow_empty=True),
    }


def oracle_for(lm, ids, mask, reference):
    prompts = decoder_tests.unpadded(ids, mask)
    return decoder_tests.OracleHeads(lm.model, [p + r for p, r in zip(prompts, reference)], [len(p) for p in prompts])


# ---- lossless ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(medusa_trees()))
def test_candidates_greedy_is_plain_greedy_medusa(tiny, name):
    _, lm = tiny
    tree = medusa_trees()[name]
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=5)
    n = 24
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    oracle = oracle_for(lm, ids, mask, reference)
    for heads in (lm.heads, oracle):
        dec = TreeDecoder(lm.model, heads, tree, verification="candidates")
        result = dec.generate(ids, mask, max_new_tokens=n)
        assert result.tokens == reference
        one = dec.generate(ids[:1, -5:], max_new_tokens=n)
        assert one.tokens == reference[:1]
    if tree.size:
        assert result.tokens_per_step > 1.5  # the oracle's deep acceptance happened
        both = (result.accepted > 0).all(1)
        assert (result.accepted[both].min(1) != result.accepted[both].max(1)).any()  # holes


def test_candidates_greedy_with_finished_sequences(tiny):
    """An eos that stops one sequence early: it leaves the batch, the others go on exactly."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=7)
    n = 20
    free = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    eos = free[0][6]
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=n, eos_token_id=eos)
    oracle = oracle_for(lm, ids, mask, free)
    result = TreeDecoder(lm.model, oracle, make_tree(BUSHY), verification="candidates").generate(
        ids, mask, max_new_tokens=n, eos_token_id=eos
    )
    assert result.tokens == reference
    assert len(result.tokens[0]) < n and (result.accepted[-1, 0] == 0)  # sequence 0 finished early


@pytest.mark.parametrize("drafter", ["hydra", "mlp-speculator", "oracle"])
@pytest.mark.parametrize("lengths", [(7,), (5, 9, 3)])
def test_candidates_greedy_is_plain_greedy_sequential_drafters(tiny, drafter, lengths):
    path, _ = tiny
    ids, mask = drafter_tests.prompts(lengths, seed=len(lengths))
    lm = load_model(str(path), device="cpu", dtype="float32", drafter=None if drafter == "oracle" else drafter)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=24)
    heads = lm.heads
    if drafter == "oracle":
        rows = [ids[i][mask[i].bool()].tolist() + reference[i] for i in range(len(lengths))]
        heads = drafter_tests.OracleDrafter(drafter_tests.oracle_table(rows), 4)
    longest = 0
    for paths in drafter_tests.TREES:
        result = TreeDecoder(lm.model, heads, make_tree(paths), topk=4, timing=False, verification="candidates")
        out = result.generate(ids, mask, max_new_tokens=24)
        assert out.tokens == reference, (drafter, paths)
        longest = max(longest, int(out.accepted.max()))
    if drafter == "oracle":
        assert longest >= 4


# ---- the same step as the tree form -------------------------------------------------------------


def test_candidates_accept_the_tree_forms_path_every_step(tiny):
    """Stepping both forms side by side from the same prompts: every step emits the same
    tokens and keeps the same count per sequence (the same accepted node)."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=5)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=30)
    oracle = oracle_for(lm, ids, mask, reference)
    tree = make_tree(BUSHY)
    forms = {v: TreeDecoder(lm.model, oracle, tree, timing=False, verification=v) for v in ("tree", "candidates")}
    states = {v: d.prefill(ids, mask, capacity=64) for v, d in forms.items()}
    deep = 0
    for _ in range(6):
        (new_t, keep_t), (new_c, keep_c) = (forms[v].step(states[v]) for v in ("tree", "candidates"))
        assert torch.equal(keep_t, keep_c)
        for row, k in enumerate(keep_t.tolist()):
            assert new_t[row, :k].tolist() == new_c[row, :k].tolist()
        assert torch.equal(states["tree"].valid, states["candidates"].valid)
        assert torch.equal(states["tree"].root, states["candidates"].root)
        deep = max(deep, int(keep_t.max()))
    assert deep == tree.depth + 1


def test_chain_candidates_step_is_the_tree_step(tiny):
    """One candidate: the candidate row is the tree, so the step is the tree form's, bit for
    bit (tokens, kept counts, cache entries, hidden state)."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([6, 3], seed=2)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=20)
    oracle = oracle_for(lm, ids, mask, reference)
    chain = make_tree([[0], [0, 0], [0, 0, 0]])
    forms = {v: TreeDecoder(lm.model, oracle, chain, timing=False, verification=v) for v in ("tree", "candidates")}
    assert forms["candidates"].verifier.candidates == 1
    states = {v: d.prefill(ids, mask, capacity=48) for v, d in forms.items()}
    for _ in range(4):
        (new_t, keep_t), (new_c, keep_c) = (forms[v].step(states[v]) for v in ("tree", "candidates"))
        assert torch.equal(new_t, new_c) and torch.equal(keep_t, keep_c)
        t, c = states["tree"], states["candidates"]
        assert torch.equal(t.hidden, c.hidden) and torch.equal(t.next_pos, c.next_pos)
        filled = t.cache.length
        assert c.cache.length == filled
        assert torch.equal(t.cache.buffer[..., :filled, :], c.cache.buffer[..., :filled, :])


def test_candidate_rows_logits_equal_tree_logits_at_their_nodes(tiny):
    """verify_forward in both forms on the same cache: row j position k of the candidates is
    node retrieve[j, k] of the tree (to 1e-5 in float32); the candidate form leaves the cache
    as it was."""
    _, lm = tiny
    tree = make_tree(BUSHY)
    b, context = 3, 11
    g = torch.Generator().manual_seed(3)
    ctx = torch.randint(3, VOCAB, (b, context), generator=g)
    tokens = torch.randint(3, VOCAB, (b, tree.size + 1), generator=g)
    forms = {v: TreeDecoder(lm.model, lm.heads, tree, timing=False, verification=v) for v in ("tree", "candidates")}
    state = forms["tree"].prefill(ctx, capacity=context + tree.size + 1)
    positions = state.valid.sum(-1)
    # state.root is in no slot yet: the verified tokens (root first) follow the prompt
    rows, _ = forms["candidates"].verify_forward(state.cache, tokens, state.valid, positions)
    assert state.cache.length == context and forms["candidates"].verify_appends == 0
    nodes, _ = forms["tree"].verify_forward(state.cache, tokens, state.valid, positions)
    assert forms["tree"].verify_appends == tree.size + 1
    # the retrieve rows of BUSHY, by hand: leaves in reverse canonical order, -1 padded
    # (canonical order: 1 (0), 2 (1), 3 (0,0), 4 (0,1), 5 (1,0), 6 (1,1), 7 (0,0,0), 8 (0,0,1), 9 (1,0,0))
    retrieve = [[0, 2, 5, 9], [0, 1, 3, 8], [0, 1, 3, 7], [0, 2, 6, -1], [0, 1, 4, -1]]
    assert rows.shape == (b, 5, 4, VOCAB)
    for j, path in enumerate(retrieve):
        for k, node in enumerate(path):
            if node >= 0:
                torch.testing.assert_close(rows[:, j, k], nodes[:, node], atol=1e-5, rtol=0)


# ---- acceptance and the cache by hand ---------------------------------------------------------


def _one_hot_logits(argmax_tokens):
    """Logits (b, n, D + 1, V) whose argmax at each position is the given token."""
    t = torch.tensor(argmax_tokens)
    logits = torch.zeros((*t.shape, VOCAB))
    logits.scatter_(-1, t[..., None], 1.0)
    return logits


def test_accept_candidates_by_hand(tiny):
    """Tree [[0], [1], [0, 0]]: rows (retrieve order) = [root, (0), (0,0)] and [root, (1), pad].
    The tokens and argmaxes below are chosen so that the answer is known by hand."""
    _, lm = tiny
    dec = TreeDecoder(lm.model, lm.heads, make_tree([[0], [1], [0, 0]]), verification="candidates").verifier
    assert dec.retrieve.tolist() == [[0, 1, 3], [0, 2, 0]] and dec.candidates == 2
    rows = torch.tensor(
        [
            [[5, 7, 9], [5, 8, 5]],  # seq 0: row 0 accepts 7 then 9; row 1 rejects 8
            [[6, 7, 9], [6, 8, 6]],  # seq 1: row 1 accepts 8; its padding would "match" the argmax 6
            [[4, 7, 9], [4, 8, 4]],  # seq 2: nothing accepted
        ]
    )
    argmax = [
        [[7, 9, 11], [7, 9, 11]],  # after 5: 7; after 7: 9; after 9: 11 (the bonus)
        [[8, 1, 1], [8, 6, 12]],  # after 6: 8; after 8 (row 1): 6 = the padding token, then 12
        [[3, 3, 3], [3, 3, 3]],
    ]
    best, n_keep, bonus = dec.accept_rows(rows, _one_hot_logits(argmax))
    assert best.tolist() == [0, 1, 0]  # seq 2: all rows tie at the root alone: the first
    assert n_keep.tolist() == [3, 2, 1]
    assert bonus.tolist() == [11, 6, 3]  # seq 1: the argmax after 8, not past the padding


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_accept_candidates_agrees_with_the_tree_rule_on_shared_logits(tiny, temperature):
    """Rows whose logits are the tree's at their nodes (as exact arithmetic gives): greedy and
    typical acceptance of the rows choose the tree form's path, length and bonus (the same
    seeded draw)."""
    _, lm = tiny
    tree_form, dec = (
        TreeDecoder(lm.model, lm.heads, make_tree(BUSHY), verification=v).verifier for v in ("tree", "candidates")
    )
    g = torch.Generator().manual_seed(11)
    b = 64
    tree_tokens = torch.randint(0, 6, (b, dec.q), generator=g)  # few tokens: many acceptances
    logits = torch.randn(b, dec.q, VOCAB, generator=g) * 3
    logits[..., :6] += 4
    rule = {"temperature": temperature, "posterior_threshold": 0.09, "posterior_alpha": 0.3}
    tree_rule, rows_rule = (
        AcceptanceRule(**rule, generator=torch.Generator().manual_seed(1) if temperature else None) for _ in range(2)
    )
    accepted = tree_form.accept(tree_tokens, logits, tree_rule)
    path, n_keep, bonus = accepted.path, accepted.n_keep, accepted.bonus
    best, n_keep_c, bonus_c = dec.accept_rows(tree_tokens[:, dec.retrieve], logits[:, dec.retrieve], rows_rule)
    assert (n_keep > 1).sum() > 10 and (n_keep > 2).any()  # the case is not trivial
    assert torch.equal(n_keep_c, n_keep) and torch.equal(bonus_c, bonus)
    for row in range(b):
        k = int(n_keep[row])
        assert dec.retrieve[best[row], :k].tolist() == path[row, :k].tolist()


def test_kv_cache_expansion_and_write_back_by_hand():
    cache = KVCache(num_layers=2, capacity=6)
    # (layers 2, k/v 2, b 2, heads 1, slots 6, head_dim 1), slot values 100 l + 10 kv + b + s / 10
    base = torch.arange(6, dtype=torch.float32) / 10
    cache.buffer = torch.stack(
        [
            torch.stack([torch.stack([100 * layer + 10 * kv + b + base for b in range(2)]) for kv in range(2)])
            for layer in range(2)
        ]
    )[:, :, :, None, :, None]
    for layer in cache.layers:
        layer.length = 3
    big = cache.expanded(3, 2)
    assert big.buffer.shape == (2, 2, 6, 1, 5, 1) and big.length == 3
    for row in range(6):  # rows 0-2 copy sequence 0, rows 3-5 sequence 1
        seq = row // 3
        expected = torch.tensor(
            [100 * layer + 10 * kv + seq + s / 10 for layer in range(2) for kv in range(2) for s in range(3)]
        )
        assert torch.allclose(big.buffer[:, :, row, 0, :3, 0].reshape(-1), expected)
    big.buffer[:, :, :, :, 3:5] = torch.arange(6, dtype=torch.float32)[None, None, :, None, None, None] + 0.5
    cache.take_rows(big, torch.tensor([2, 4]), 2)  # sequence 0 from row 2, sequence 1 from row 4
    assert cache.length == 5
    assert cache.buffer[:, :, 0, 0, 3:5, 0].unique().tolist() == [2.5]
    assert cache.buffer[:, :, 1, 0, 3:5, 0].unique().tolist() == [4.5]
    assert torch.equal(cache.buffer[:, :, :, :, :3], big.buffer[:, :, ::3, :, :3])  # the context untouched
    # the next expansion reuses the rows' buffer (room for 5 + 2 slots: doubled to 10) and
    # copies the longer context into it
    again = cache.expanded(3, 2, big)
    assert again is big and again.length == 5 and again.buffer.shape[4] == 10
    assert torch.equal(again.buffer[:, :, 3:6, :, :5], cache.buffer[:, :, 1:2, :, :5].expand(-1, -1, 3, -1, -1, -1))
    reused = again.buffer.data_ptr()
    assert cache.expanded(3, 2, again).buffer.data_ptr() == reused  # room enough: no new buffer
    fewer = cache.expanded(2, 2, again)  # other rows: a new buffer
    assert fewer.buffer.shape[2] == 4 and fewer.buffer.data_ptr() != reused
    assert torch.equal(fewer.buffer[:, :, 2:4, :, :5], cache.buffer[:, :, 1:2, :, :5].expand(-1, -1, 2, -1, -1, -1))


def test_bad_verification_is_one_line(tiny):
    _, lm = tiny
    with pytest.raises(UserError, match="verification: must be one of tree, candidates"):
        TreeDecoder(lm.model, lm.heads, make_tree([[0]]), verification="batch")


# ---- the sweep ----------------------------------------------------------------------------------


def test_step_bench_times_candidate_verification(tiny):
    _, lm = tiny
    proposal = make_tree(BUSHY)
    bench = step_bench(lm, proposal, [0, 3, 9], 2, 7, verification="candidates")
    assert bench.sizes == [0, 3, 9]
    assert {n: d.verification for n, d in bench.decoders.items()} == {3: "candidates", 9: "candidates"}
    # prefix(3) = (0), (1), (0,0): 2 leaves; the full tree: 5 leaves
    assert bench.decoders[3].verifier.candidates == 2 and bench.decoders[9].verifier.candidates == 5
    for fn in bench.fns:
        fn()
    assert bench.cached_tokens() == 7  # every call left the context as it was


def _tau(proposal):
    taus = 1.0 + 0.1 * np.arange(proposal.size + 1)
    return TauCurve(proposal, taus)


def test_sweep_meta_records_the_form_and_resume_refuses_another(tiny, tmp_path):
    _, lm = tiny
    proposal = make_tree(BUSHY)
    out = tmp_path / "s.csv"
    settings = SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0, verification="candidates")
    run_sweep(lm, _tau(proposal), settings, out, progress=False)
    meta = json.loads((tmp_path / "s.meta.json").read_text())
    assert meta["verification"] == "candidates"
    tree_settings = SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0)
    assert tree_settings.verification == "tree"
    with pytest.raises(UserError, match="verification") as err:
        run_sweep(lm, _tau(proposal), tree_settings, out, resume=True, progress=False)
    assert "\n" not in str(err.value)
    # the same form resumes (nothing left to measure)
    run_sweep(lm, _tau(proposal), settings, out, resume=True, progress=False)


def test_sweep_settings_refuse_an_unknown_form():
    with pytest.raises(UserError, match="verification"):
        SweepSettings((0, 1), (1,), (8,), verification="beams")


def test_step_predictor_prices_candidate_sequences():
    """Tree size n of the proposal verified as candidates: L leaves x (D + 1) tokens in L
    sequences (hand-counted L and D), the heads the tree reaches; plain decoding unchanged."""
    heads = SimpleNamespace(num_heads=4, num_layers=1, hidden_size=256, vocab_size=4096)
    lm = SimpleNamespace(name="demo", dtype=torch.float32, heads=heads)
    hw = load_hardware("a100")
    shape = shape_of("demo", dtype="float32")
    proposal = make_tree(BUSHY)
    predict = step_predictor(lm, proposal, hw, verification="candidates")
    # prefix(3): (0), (1), (0,0): 2 leaves, depth 2; prefix(9): 5 leaves, depth 3; prefix(1): a chain
    for n, leaves, depth in ((3, 2, 2), (9, 5, 3), (1, 1, 1)):
        draft = DraftHeadsShape(depth, 1, 256, 4096, tokens_per_sequence=1)
        expected = step_time_s(shape, draft, hw, batch=4, tokens=leaves * (depth + 1), context=256, candidates=leaves)
        assert predict(4, n + 1, 256) == pytest.approx(expected, rel=1e-12)
    tree_predict = step_predictor(lm, proposal, hw)
    assert predict(4, 1, 256) == tree_predict(4, 1, 256) == step_time_s(shape, None, hw, batch=4, tokens=1, context=256)
    assert predict(4, 10, 256) > tree_predict(4, 10, 256)  # 20 tokens, the context read 5 times


# ---- choosing the form ----------------------------------------------------------------------------


def _selection(cells):
    """A hand-made measured selection document: cells (batch, context, nodes, speedup, lo, hi)."""
    return {
        "format": "treeopt.selection/v1",
        "cells": [
            {
                "batch": b,
                "context": s,
                "nodes": n,
                "speedup": v,
                "speedup_lo": lo,
                "speedup_hi": hi,
                "medusa_choices": [[0]] * n,
            }
            for b, s, n, v, lo, hi in cells
        ],
    }


def test_choose_form_rules():
    tree = _selection(
        [
            (1, 128, 8, 1.50, 1.40, 1.60),  # overlaps candidates' interval: the tree (cheaper)
            (2, 128, 8, 1.30, 1.25, 1.35),  # below candidates' interval: candidates
            (4, 128, 4, 1.20, 1.10, 1.30),  # tree only beats 1
            (8, 128, 0, 1.00, 0.95, 1.02),  # neither speculates
            (16, 128, 2, 1.04, 0.98, 1.08),  # lower bounds at or below 1: no speculation
            (32, 128, 6, 1.70, 1.60, 1.80),  # the tree's lower bound is highest
        ]
    )
    candidates = _selection(
        [
            (1, 128, 16, 1.55, 1.45, 1.65),
            (2, 128, 16, 1.60, 1.50, 1.70),
            (4, 128, 0, 1.00, 0.90, 1.05),
            (8, 128, 0, 1.00, 0.97, 1.01),
            (16, 128, 4, 1.02, 1.00, 1.05),
            (32, 128, 12, 1.65, 1.58, 1.72),
        ]
    )
    doc = choose_form({"candidates": candidates, "tree": tree})
    assert doc["format"] == FORMS_FORMAT and doc["forms"] == ["tree", "candidates"]
    got = {c["batch"]: (c["form"], c["nodes"], c["speedup_lo"]) for c in doc["cells"]}
    assert got == {
        1: ("tree", 8, 1.40),
        2: ("candidates", 16, 1.50),
        4: ("tree", 4, 1.10),
        8: (None, 0, 1.0),
        16: (None, 0, 1.0),
        32: ("tree", 6, 1.60),
    }
    reasons = {c["batch"]: c["reason"] for c in doc["cells"]}
    assert "cheaper verification" in reasons[1] and "overlaps that of candidates" in reasons[1]
    assert reasons[2] == "highest speedup lower bound"
    assert reasons[8].startswith("no speculation")
    cell = next(c for c in doc["cells"] if c["batch"] == 2)
    assert cell["medusa_choices"] == [[0]] * 16
    assert cell["by_form"]["tree"] == {"nodes": 8, "speedup": 1.30, "speedup_lo": 1.25, "speedup_hi": 1.35}


def test_choose_form_without_intervals_and_with_a_threshold():
    """Predicted selections carry no interval: the point speedups compete; equal points
    overlap and go to the tree."""
    tree = {"cells": [{"batch": 1, "context": 64, "nodes": 4, "speedup": 1.3}]}
    cands = {"cells": [{"batch": 1, "context": 64, "nodes": 8, "speedup": 1.4}]}
    assert choose_form({"tree": tree, "candidates": cands})["cells"][0]["form"] == "candidates"
    same = {"cells": [{"batch": 1, "context": 64, "nodes": 8, "speedup": 1.3}]}
    assert choose_form({"tree": tree, "candidates": same})["cells"][0]["form"] == "tree"
    assert choose_form({"tree": tree, "candidates": cands}, threshold=1.5)["cells"][0]["form"] is None
    assert choose_form({"candidates": cands})["cells"][0]["form"] == "candidates"


def test_choose_form_prefers_the_chain_of_a_draft_model_on_overlap():
    """A draft model's chain and tree forms: overlapping intervals go to the form named first in
    `order` (the chain), a clearly better tree still wins."""
    chain = _selection([(1, 64, 2, 1.20, 1.10, 1.30), (2, 64, 1, 1.10, 1.05, 1.15)])
    tree = _selection([(1, 64, 4, 1.25, 1.15, 1.35), (2, 64, 4, 1.30, 1.20, 1.40)])
    doc = choose_form({"tree": tree, "chain": chain}, order=("chain", "tree"))
    assert doc["forms"] == ["chain", "tree"]
    assert [(c["form"], c["nodes"]) for c in doc["cells"]] == [("chain", 2), ("tree", 4)]
    with pytest.raises(UserError, match="unknown form 'chain'"):
        choose_form({"tree": tree, "chain": chain})


def test_choose_form_refuses_mismatched_cells_and_unknown_forms():
    a = {"cells": [{"batch": 1, "context": 64, "nodes": 4, "speedup": 1.3}]}
    b = {"cells": [{"batch": 2, "context": 64, "nodes": 4, "speedup": 1.3}]}
    with pytest.raises(UserError, match="same cells"):
        choose_form({"tree": a, "candidates": b})
    with pytest.raises(UserError, match="unknown form 'beam'"):
        choose_form({"tree": a, "beam": a})
    with pytest.raises(UserError, match="no selections"):
        choose_form({})


def test_sweep_cli_measures_the_candidate_form(tiny, tmp_path, capsys):
    path, _ = tiny
    acc = tmp_path / "acc.json"
    AccuracyTable(
        hits=[[60, 20, 10, 5], [40, 20, 10, 5], [30, 15, 10, 5]], positions=[100, 100, 100], provenance={"model": "t"}
    ).save(acc)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f(x):\n", "import os", "a = 1"]))
    out = tmp_path / "sweep.csv"
    common = ["sweep", "--model", str(path), "--accuracy", str(acc), "--sizes", "0,1,3", "--batch", "1,2"]
    common += ["--context", "8", "--repeats", "5", "--time-budget", "0", "-o", str(out)]
    main([*common, "--verification", "candidates", "--hardware", "a100", "--end-to-end", "--data", str(data)])
    capsys.readouterr()
    assert json.loads((tmp_path / "sweep.meta.json").read_text())["verification"] == "candidates"
    df = pd.read_csv(out)
    assert df["predicted_speedup"].notna().all() and (df["e2e_tokens_per_step"] >= 1).all()
    assert not list(tmp_path.glob("*fitted_hardware.json"))  # the profile fit models the tree form
    main(["select", "--sweep", str(out), "-o", str(tmp_path / "sel.json")])
    assert len(json.loads((tmp_path / "sel.json").read_text())["cells"]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*common, "--resume"])  # the tree form (the default) cannot continue it
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verification: 'candidates' vs now 'tree'" in err[0]


def test_a_draft_model_is_verified_in_the_tree_form_only():
    check_form(SimpleNamespace(kind="draft-model"), "tree")
    check_form(SimpleNamespace(kind="hydra"), "candidates")
    with pytest.raises(UserError, match="--verification candidates: a draft model"):
        check_form(SimpleNamespace(kind="draft-model"), "candidates")
