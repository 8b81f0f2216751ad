"""The split verification attention (calibration.split_attention,
docs/decoder.md#split-verification-attention), on CPU in float32: the fused kernel's
log-sum-exp is the definition's; the split attention equals softmax over the whole masked row
computed by its definition in float64 (GQA, a ragged batch with holes, both block forms: the
last q slots and a static window's slots); the decoder's logits through it equal the masked
path's (trees, a chain, the empty tree, batch 1 and 2, eager and static steps, both
verification forms); greedy decoding through it is plain greedy decoding (oracle heads that
make multi-token acceptance and cache holes happen); a model that does not attend through
sdpa keeps the masked path; an unknown path is refused."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from calibration.decoder import TreeDecoder
from calibration.greedy import greedy_decode
from calibration.split_attention import (
    _math_with_lse,
    attention_with_lse,
    split_attention_forward,
    split_block,
)
from calibration.sweep import SweepSettings, run_sweep, step_bench
from tests import test_decoder as decoder_tests
from treeopt.errors import UserError
from treeopt.tau import TauCurve
from treeopt.tree import make_tree, tree_buffers

tiny = decoder_tests.tiny  # the tiny GQA Llama fixture (4 query heads, 2 KV heads)
VOCAB = decoder_tests.VOCAB
ATOL = 1e-5
NEG = torch.finfo(torch.float32).min
# q = 6: root, two children, two grandchildren under the first, one under the second
SMALL_TREE = make_tree([[0], [1], [0, 0], [0, 1], [1, 0]])


def _definition(query, key, value, mask):
    """softmax(q k^T / sqrt(d) + mask) v in float64, KV heads repeated to the query heads."""
    group = query.shape[1] // key.shape[1]
    k = key.double().repeat_interleave(group, dim=1)
    v = value.double().repeat_interleave(group, dim=1)
    scores = query.double() @ k.transpose(-1, -2) / query.shape[-1] ** 0.5 + mask.double()
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def test_attention_with_lse_is_the_definition():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (5, 11, 11))
    mask = torch.zeros(2, 1, 1, 11)
    mask[0, ..., :4] = NEG  # a key-padding mask shared by the rows
    want_out, want_lse = _definition(q, k, v, mask)
    for fn in (attention_with_lse, _math_with_lse):
        out, lse = fn(q, k, v, mask, 8**-0.5)
        torch.testing.assert_close(out.double(), want_out, atol=1e-6, rtol=0)
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)


def _masks(b: int, context: int, valid: torch.Tensor):
    """The verification mask (b, 1, q, C + q) of SMALL_TREE by hand: the cache slots each
    sequence may see, then the tree's ancestor mask (a node sees its ancestors and itself)."""
    ancestors = torch.from_numpy(np.array(tree_buffers(SMALL_TREE, 2).attention_mask))
    q = ancestors.shape[0]
    seen = torch.cat([valid[:, None, :].expand(b, q, context), ancestors[None].expand(b, q, q)], -1)
    return torch.where(seen, 0.0, NEG)[:, None]


@pytest.mark.parametrize("form", ["last", "window"])
def test_split_attention_is_softmax_over_the_whole_row(form):
    """GQA (4 query heads, 2 KV heads), batch 2 with holes in the second sequence's cache: the
    split attention equals the definition under the whole mask, in the last-q layout of an eager
    step and in a static window (the step's slots inside it, unwritten slots after)."""
    g = torch.Generator().manual_seed(1)
    b, heads, kv_heads, d, context = 2, 4, 2, 8, 9
    q = SMALL_TREE.size + 1
    valid = torch.ones(b, context, dtype=torch.bool)
    valid[1, [0, 1, 5]] = False
    mask = _masks(b, context, valid)
    query = torch.randn(b, heads, q, d, generator=g)
    key = torch.randn(b, kv_heads, context + q, d, generator=g)
    value = torch.randn(b, kv_heads, context + q, d, generator=g)
    want, _ = _definition(query, key, value, mask)
    slots = None
    if form == "window":  # 4 unwritten slots after the step's, hidden by the mask
        window = context + q + 4
        pad = torch.randn(b, kv_heads, 4, d, generator=g)
        key, value = torch.cat([key, pad], 2), torch.cat([value, pad], 2)
        mask = torch.nn.functional.pad(mask, (0, 4), value=NEG)
        slots = torch.arange(context, context + q)
        assert mask.shape[-1] == window
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    model = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="sdpa"))
    with split_block(model, slots):
        out, _ = split_attention_forward(module, query, key, value, mask, scaling=d**-0.5)
    assert model.config._attn_implementation == "sdpa"  # restored
    torch.testing.assert_close(out.double(), want.transpose(1, 2), atol=1e-6, rtol=0)


def _trees():
    return {
        "empty": make_tree([], allow_empty=True),
        "chain": make_tree([[0], [0, 0], [0, 0, 0]]),
        "small": SMALL_TREE,
        "design_example": make_tree(decoder_tests.DESIGN_EXAMPLE),
    }


@pytest.mark.parametrize("name", ["empty", "chain", "small", "design_example"])
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("form", ["tree", "candidates"])
def test_split_step_logits_equal_the_masked_steps(tiny, name, graphs, form):
    _, lm = tiny
    tree = _trees()[name]
    if form == "candidates" and tree.size == 0:
        pytest.skip("the empty tree has no candidate rows")
    kw = dict(timing=False, graphs=graphs, verification=form)
    masked = TreeDecoder(lm.model, lm.heads, tree, attention="masked", **kw)
    split = TreeDecoder(lm.model, lm.heads, tree, attention="split", **kw)
    assert (masked.attention, split.attention) == ("masked", "split")
    ids, prompt_mask = decoder_tests.ragged_batch([3, 7], seed=2)
    tokens = torch.randint(3, VOCAB, (2, tree.size + 1), generator=torch.Generator().manual_seed(3))
    for rows in (slice(0, 2), slice(1, 2)):  # a ragged batch, and one sequence
        states = [d.prefill(ids[rows], prompt_mask[rows], capacity=16) for d in (masked, split)]
        (lm_, hm), (ls, hs) = (
            d.verify_forward(s.cache, tokens[rows], s.valid, s.next_pos) for d, s in zip((masked, split), states)
        )
        torch.testing.assert_close(ls, lm_, atol=ATOL, rtol=0)
        torch.testing.assert_close(hs, hm, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["chain", "design_example"])
@pytest.mark.parametrize("graphs", [False, True])
def test_split_greedy_decoding_is_lossless(tiny, name, graphs):
    """Oracle heads (multi-token acceptance, ragged across the batch: cache holes)."""
    _, lm = tiny
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=5)
    n = 16
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    prompts = decoder_tests.unpadded(ids, mask)
    oracle = decoder_tests.OracleHeads(lm.model, [p + r for p, r in zip(prompts, ref)], [len(p) for p in prompts])
    dec = TreeDecoder(lm.model, oracle, _trees()[name], graphs=graphs, attention="split")
    res = dec.generate(ids, mask, max_new_tokens=n)
    assert res.tokens == ref
    assert res.tokens_per_step > 1.5


def test_a_model_without_sdpa_keeps_the_masked_path_and_bad_paths_are_refused(tiny, monkeypatch):
    _, lm = tiny
    monkeypatch.setattr(lm.model.config, "_attn_implementation", "eager")
    assert TreeDecoder(lm.model, lm.heads, SMALL_TREE, attention="split").attention == "masked"
    monkeypatch.undo()
    with pytest.raises(UserError, match="attention: must be one of split, masked"):
        TreeDecoder(lm.model, lm.heads, SMALL_TREE, attention="flash")


def test_the_sweep_records_the_attention_and_a_resume_keeps_it(tiny, tmp_path):
    """The CPU default is the masked path; `--attention split` is recorded as such, the steps
    the sweep times run through it, and a resume with the other path is refused."""
    _, lm = tiny
    proposal = make_tree(decoder_tests.DESIGN_EXAMPLE)
    assert step_bench(lm, proposal, [3], batch=1, context=4).decoders[3].attention == "masked"
    assert step_bench(lm, proposal, [3], batch=1, context=4, attention="split").decoders[3].attention == "split"
    tau = TauCurve(proposal, 1.0 + 0.1 * np.arange(proposal.size + 1))
    out = tmp_path / "s.csv"
    run_sweep(lm, tau, SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0, attention="split"), out, progress=False)
    assert json.loads((tmp_path / "s.meta.json").read_text())["attention"] == "split"
    with pytest.raises(UserError, match="attention"):
        run_sweep(lm, tau, SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0), out, resume=True, progress=False)


def test_the_calibrated_attention_call_is_the_decoders():
    """`hw calibrate` times `run_verification_attention`: both paths give the definition's
    attention (the step's q tokens last, causal among themselves)."""
    from calibration.split_attention import run_verification_attention

    g = torch.Generator().manual_seed(4)
    b, heads, kv_heads, d, context, q = 2, 4, 2, 8, 11, 5
    query = torch.randn(b, heads, q, d, generator=g)
    key, value = (torch.randn(b, kv_heads, context + q, d, generator=g) for _ in range(2))
    seen = torch.cat([torch.ones(q, context, dtype=torch.bool), torch.ones(q, q, dtype=torch.bool).tril()], -1)
    mask = torch.where(seen, 0.0, NEG)[None, None].expand(b, 1, q, context + q)
    want, _ = _definition(query, key, value, mask)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    for path in ("split", "masked"):
        out = run_verification_attention(path, module, query, key, value, mask, d**-0.5)
        torch.testing.assert_close(out.double(), want.transpose(1, 2), atol=1e-6, rtol=0)
