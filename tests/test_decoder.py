"""The reference tree decoder (calibration.decoder): tree attention equals causal runs of the
root-to-node paths, greedy tree decoding is lossless (against the project's greedy loop and
transformers' generate), with random heads and with oracle heads that make multi-token
acceptance and KV pruning happen, for several trees, batch 1 and batch 3 with ragged prompts;
eos handling, typical acceptance, and the `treeopt decode` command."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from calibration.decoder import TreeDecoder, cut_tree
from calibration.greedy import greedy_decode, plain_step_forward
from calibration.heads import MedusaHeads
from calibration.kv_cache import KVCache, new_cache
from calibration.model_calls import cache_kwargs, model_forward_hidden
from calibration.models import load_model, tiny_model_for_tests
from calibration.verification import AcceptanceRule
from treeopt.errors import UserError
from treeopt.tree import load_tree, make_tree, tree_buffers

VOCAB, NUM_HEADS, EOS = 64, 3, 2
DESIGN_EXAMPLE = [[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with GQA (4 query heads, 2 KV heads) and 3 random Medusa heads."""
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"),
        vocab=VOCAB,
        hidden=32,
        layers=2,
        heads=4,
        kv_heads=2,
        num_medusa_heads=NUM_HEADS,
    )
    torch.set_num_threads(1)
    return path, load_model(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny_mha(tmp_path_factory):
    """The same shape without GQA (2 query heads, 2 KV heads)."""
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny_mha"),
        vocab=VOCAB,
        hidden=32,
        layers=2,
        heads=2,
        kv_heads=2,
        num_medusa_heads=NUM_HEADS,
        seed=1,
    )
    return path, load_model(str(path), device="cpu", dtype="float32")


def ragged_batch(lengths, seed=0):
    """Left-padded prompts (pad id 0) of the given lengths, tokens in 3..VOCAB-1."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.zeros((len(lengths), L), dtype=torch.long)
    mask = torch.zeros((len(lengths), L), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, L - n :] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, L - n :] = 1
    return ids, mask


def unpadded(ids, mask):
    return [ids[i][mask[i].bool()].tolist() for i in range(ids.shape[0])]


def hf_generate(model, ids, mask, n, eos=None):
    """transformers' greedy generate, new tokens cut after eos."""
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=0 if eos is not None else n,
        eos_token_id=eos,
        pad_token_id=0,
    )[:, ids.shape[1] :].tolist()
    if eos is not None:
        out = [row[: row.index(eos) + 1] if eos in row else row for row in out]
    return out


def trees():
    mc = load_tree("mc_sim_7b_63")
    return {
        "mc_sim_7b_63_cut": cut_tree(mc, NUM_HEADS, 10),
        "vicuna_7b_stage2_cut_top4": cut_tree(load_tree("vicuna_7b_stage2"), NUM_HEADS, 4),
        "chain": make_tree([[0], [0, 0], [0, 0, 0]]),
        "wide": make_tree([[r] for r in range(10)] + [[0, r] for r in range(4)]),
        "design_example": make_tree(DESIGN_EXAMPLE),
        "empty": make_tree([], allow_empty=True),
    }


# --------------------------------------------------------------------------------------------
# Oracle heads: head k puts the true greedy token t+k+2 at rank 0 or 1 (or misses it), found by
# matching the hidden state against a teacher-forced run of prompt + greedy continuation.


class OracleHead(torch.nn.Module):
    def __init__(self, oracle: OracleHeads, k: int):
        super().__init__()
        self.oracle, self.k = [oracle], k  # list: not a submodule

    def forward(self, hidden):
        return self.oracle[0].logits(hidden, self.k)


class OracleHeads(MedusaHeads):
    def __init__(self, model, sequences, prompt_lengths, num_heads=NUM_HEADS, seed=0):
        hidden_size = model.config.hidden_size
        super().__init__(hidden_size, VOCAB, num_heads, 0)
        for k in range(num_heads):
            self[k] = OracleHead(self, k)
        g = torch.Generator().manual_seed(seed)
        self.proj = torch.randn(hidden_size, VOCAB, generator=g)
        keys, targets, ranks = [], [], []
        with torch.inference_mode():
            for seq, n in zip(sequences, prompt_lengths):
                ids = torch.tensor([seq])
                h = model_forward_hidden(
                    model, ids, attention_mask=None, position_ids=torch.arange(len(seq))[None], cache=None
                )[0]
                for t in range(n - 1, len(seq)):
                    keys.append(h[t])
                    targets.append([seq[t + k + 2] if t + k + 2 < len(seq) else -1 for k in range(num_heads)])
                    # rank 0 (60%), rank 1 (25%) or a miss, deterministic per (t, k)
                    ranks.append(
                        [(0, 0, 0, 1, 0, 1, 0, -1, 0, 0, 1, -1)[(7 * t + 5 * k + seed) % 12] for k in range(num_heads)]
                    )
        self.keys = torch.stack(keys)
        self.targets = torch.tensor(targets)
        self.ranks = torch.tensor(ranks)
        self.calls = 0
        self.matched = 0

    def logits(self, hidden, k):
        flat = hidden.reshape(-1, hidden.shape[-1]).float()
        out = flat @ self.proj
        dist = torch.cdist(flat, self.keys, compute_mode="donot_use_mm_for_euclid_dist")
        best = dist.argmin(-1)
        for i in range(flat.shape[0]):
            self.calls += 1
            j = int(best[i])
            if float(dist[i, j]) > 1e-3:
                continue
            self.matched += 1
            tgt, rank = int(self.targets[j, k]), int(self.ranks[j, k])
            if tgt < 0 or rank < 0:
                continue
            top = float(out[i].max())
            out[i, tgt] = top + 1.0
            if rank == 1:
                other = (tgt + 1) % VOCAB
                out[i, other] = top + 2.0
        return out.reshape(*hidden.shape[:-1], VOCAB).to(hidden.dtype)


# --------------------------------------------------------------------------------------------


def test_tree_logits_equal_causal_runs_of_paths(tiny):
    """Every node's base logits and hidden state (hence head logits) from one tree forward over
    a padded batch equal a plain causal run of prompt + its root-to-node path; with and
    without forced GQA."""
    _, lm = tiny
    model, heads = lm.model, lm.heads
    tree = make_tree(DESIGN_EXAMPLE)
    ids, mask = ragged_batch([6, 3], seed=1)
    prompts = unpadded(ids, mask)
    buf = tree_buffers(tree, 10)
    for force in (True, False):
        dec = TreeDecoder(model, heads, tree)
        assert dec.force_gqa  # CPU and kv_heads < heads
        dec.force_gqa = force
        state = dec.prefill(ids, mask)
        c = state.valid.shape[1]
        g = torch.Generator().manual_seed(2)
        tokens = torch.randint(3, VOCAB, (2, dec.q), generator=g)
        logits, head_root = dec.verify_forward(state.cache, tokens, state.valid, state.next_pos)
        assert logits.shape == (2, dec.q, VOCAB) and head_root.shape == (tree.depth, 2, 1, VOCAB)
        assert state.cache.layers[0].keys.shape[2] == c + dec.q == state.cache.get_seq_length()
        # the hidden states of every node, through the same tree mask and positions
        state.cache.crop(-dec.q)
        with torch.inference_mode():
            hidden = model_forward_hidden(
                model,
                tokens,
                attention_mask=dec.verifier.layout(state.valid, state.next_pos)[0],
                position_ids=state.next_pos[:, None] + torch.tensor(buf.depth)[None],
                cache=state.cache,
            )
            head_all = torch.stack([heads[k](hidden) for k in range(tree.depth)])
        torch.testing.assert_close(head_root[:, :, 0], head_all[:, :, 0])
        with torch.inference_mode():
            for i, prompt in enumerate(prompts):
                for j in range(dec.q):
                    chain, node = [], j
                    while node >= 0:
                        chain.append(node)
                        node = int(buf.parent[node])
                    seq = torch.tensor([prompt + tokens[i, chain[::-1]].tolist()])
                    h = model_forward_hidden(
                        model, seq, attention_mask=None, position_ids=torch.arange(seq.shape[1])[None], cache=None
                    )
                    ref = model(seq).logits[0, -1]
                    torch.testing.assert_close(logits[i, j], ref, atol=2e-5, rtol=1e-5)
                    ref_heads = heads(h[0, -1])[: tree.depth]
                    torch.testing.assert_close(head_all[:, i, j], ref_heads, atol=2e-5, rtol=1e-5)
    assert "TRANSFORMERS_SDPA_FORCE_GQA" not in os.environ


def _prefill_mask(valid):
    """4D additive prefill mask built by hand: causal, padding hidden, a padding row sees itself."""
    n = valid.shape[1]
    see = (torch.ones(n, n).tril().bool()[None] & valid.bool()[:, None, :]) | torch.eye(n).bool()
    return torch.where(see, 0.0, torch.finfo(torch.float32).min)[:, None]


def _keep_rows(cache: DynamicCache, c: int, slots: torch.Tensor) -> None:
    """The accepted path kept in the library's own cache, row by row: slot c + j <- slots[i, j]."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            kept = torch.stack([t[i, :, slots[i]] for i in range(t.shape[0])])
            setattr(layer, name, torch.cat([t[:, :, :c], kept], dim=2))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("fixture", ["tiny", "tiny_mha"])
def test_kv_cache_tree_steps_equal_the_librarys_dynamic_cache(request, attn, fixture):
    """Two tree steps on the preallocated KVCache (the second after keeping a ragged accepted
    path) give exactly the logits and cache entries of the same steps on transformers'
    DynamicCache pruned row by row; and greedy tree decoding stays lossless (sdpa and eager,
    GQA and not)."""
    path, _ = request.getfixturevalue(fixture)
    lm = load_model(str(path), device="cpu", dtype="float32")
    lm.model.set_attn_implementation(attn)
    model = lm.model
    # the eager forward: bit for bit against DynamicCache (the static-shape path attends over a
    # wider window, equal to 1e-5: tests/test_static_steps.py)
    dec = TreeDecoder(model, lm.heads, make_tree(DESIGN_EXAMPLE), graphs=False)
    ids, mask = ragged_batch([6, 3], seed=12)
    state = dec.prefill(ids, mask)
    assert isinstance(state.cache, KVCache) and state.cache.length == 6
    ref = DynamicCache()
    with torch.inference_mode():
        model_forward_hidden(
            model, ids, attention_mask=_prefill_mask(mask), position_ids=(mask.cumsum(-1) - 1).clamp(min=0), cache=ref
        )
        for layer, ref_layer in zip(state.cache.layers, ref.layers):
            assert torch.equal(layer.keys, ref_layer.keys) and torch.equal(layer.values, ref_layer.values)
        g = torch.Generator().manual_seed(4)
        valid = state.valid
        for _step in range(2):
            tokens = torch.randint(3, VOCAB, (2, dec.q), generator=g)
            logits, heads_ = dec.verify_forward(state.cache, tokens, valid, state.next_pos)
            ref_logits, ref_heads = dec.verify_forward(ref, tokens, valid, state.next_pos)
            assert torch.equal(logits, ref_logits) and torch.equal(heads_, ref_heads)
            # keep root + [1] + [1, 2] for row 0 (buffer indices 0, 2, 8), the root only for row 1
            c = valid.shape[1]
            slots = c + torch.tensor([[0, 2, 8], [0, 0, 0]])
            state.cache.keep_slots(c, slots)
            _keep_rows(ref, c, slots)
            valid = torch.cat([valid, torch.tensor([[True, True, True], [True, False, False]])], dim=1)
            state.next_pos = state.next_pos + torch.tensor([3, 1])
            assert state.cache.length == ref.get_seq_length() == c + 3
            for layer, ref_layer in zip(state.cache.layers, ref.layers):
                assert torch.equal(layer.keys, ref_layer.keys) and torch.equal(layer.values, ref_layer.values)
    ids, mask = ragged_batch([5, 9, 2], seed=13)
    n = 16
    plain = greedy_decode(model, ids, mask, max_new_tokens=n)
    prompts = unpadded(ids, mask)
    oracle = OracleHeads(model, [p + r for p, r in zip(prompts, plain)], [len(p) for p in prompts])
    res = TreeDecoder(model, oracle, trees()["mc_sim_7b_63_cut"]).generate(ids, mask, max_new_tokens=n)
    assert res.tokens == plain and res.tokens_per_step > 1.5


def test_kv_cache_by_hand():
    """KVCache bookkeeping on hand-made entries: writes land at the length, the cache grows by
    doubling keeping its contents, keep_slots / crop / batch_select_indices move what they say."""
    cache = KVCache(num_layers=2)
    assert cache.capacity == 0 and cache.length == 0 and not cache.is_initialized

    def entries(b, start, n, layer, kv):
        # value = 1000 * layer + 100 * kv + 10 * row + slot, one head, head_dim 1
        slot = torch.arange(start, start + n, dtype=torch.float32)
        return (1000 * layer + 100 * kv + 10 * torch.arange(b)[:, None] + slot[None])[:, None, :, None]

    def write(start, n, b=3):
        for layer in range(2):
            k, v = cache.update(entries(b, start, n, layer, 0), entries(b, start, n, layer, 1), layer)
            assert k.shape == (b, 1, start + n, 1)
            assert torch.equal(k, entries(b, 0, start + n, layer, 0))
            assert torch.equal(v, entries(b, 0, start + n, layer, 1))

    write(0, 3)
    assert cache.capacity == 3 and cache.length == 3 == cache.get_seq_length()
    write(3, 1)
    assert cache.capacity == 6 and cache.length == 4  # doubled, contents kept (checked in write)
    write(4, 3)
    assert cache.capacity == 12 and cache.length == 7
    cache.crop(-2)
    assert cache.length == 5 and cache.layers[1].keys.shape[2] == 5
    # rows keep slots (0, 4), (3, 3), (1, 2) after the first 2: slot 2 + j <- slot slots[i, j]
    cache.keep_slots(2, torch.tensor([[0, 4], [3, 3], [1, 2]]))
    assert cache.length == 4
    want = torch.tensor([[0, 1, 0, 4], [10, 11, 13, 13], [20, 21, 21, 22]], dtype=torch.float32)
    for layer in range(2):
        for kv, t in enumerate((cache.layers[layer].keys, cache.layers[layer].values)):
            assert torch.equal(t[:, 0, :, 0], want + 1000 * layer + 100 * kv)
    cache.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(cache.layers[1].values[:, 0, :, 0], want[[2, 0]] + 1100)
    with pytest.raises(ValueError):
        cache.crop(1)


def test_new_cache_with_the_models_ordinary_forward(tiny):
    """new_cache(model) (no capacity) behind the library's ordinary 2D-mask forward: prompt, then
    single tokens growing it past its first allocation, gives the logits of a DynamicCache."""
    _, lm = tiny
    ids, mask = ragged_batch([7, 4], seed=14)
    ours, ref = new_cache(lm.model), DynamicCache()
    assert len(ours.layers) == lm.model.config.num_hidden_layers
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    g = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        for cache in (ours, ref):
            lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, **cache_kwargs(lm.model, cache))
        assert ours.capacity == 7
        m = mask
        for i in range(9):
            tok = torch.randint(3, VOCAB, (2, 1), generator=g)
            m = torch.cat([m, torch.ones(2, 1, dtype=torch.long)], 1)
            p = pos[:, -1:] + 1 + i
            a, ha = plain_step_forward(lm.model, lm.heads, ours, tok, m, p)
            b, hb = plain_step_forward(lm.model, lm.heads, ref, tok, m, p)
            assert torch.equal(a, b) and torch.equal(ha, hb)
    assert ours.length == ref.get_seq_length() == 16 and ours.capacity == 28


def test_greedy_decode_matches_generate(tiny):
    _, lm = tiny
    ids, mask = ragged_batch([5, 9, 2], seed=3)
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=16)
    assert [len(r) for r in ref] == [16, 16, 16]
    assert ref == hf_generate(lm.model, ids, mask, 16)
    # batch of one, no mask
    assert greedy_decode(lm.model, ids[1:2], max_new_tokens=16) == ref[1:2]


@pytest.mark.parametrize("name", list(trees()))
def test_greedy_tree_decoding_is_lossless_random_heads(tiny, name):
    _, lm = tiny
    tree = trees()[name]
    dec = TreeDecoder(lm.model, lm.heads, tree)
    ids, mask = ragged_batch([5, 9, 2], seed=4)
    n = 20
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    res = dec.generate(ids, mask, max_new_tokens=n)
    assert res.tokens == ref
    assert res.tokens == hf_generate(lm.model, ids, mask, n)
    one = dec.generate(ids[1:2, -9:], max_new_tokens=n)
    assert one.tokens == ref[1:2]
    # bookkeeping
    for r in (res, one):
        assert r.accepted.shape == r.emitted.shape == (r.steps, r.accepted.shape[1])
        assert r.draft_s.shape == r.verify_s.shape == r.update_s.shape == (r.steps,)
        assert (1 + r.emitted.sum(0) == [len(t) for t in r.tokens]).all()
        assert (r.accepted >= r.emitted).all() and r.accepted.max() <= tree.depth + 1
        assert (r.verify_s > 0).all() and r.prefill_s > 0
    if tree.size == 0:
        assert res.steps == n - 1 and (res.accepted == 1).all() and res.tokens_per_step == 1.0


@pytest.mark.parametrize("name", ["mc_sim_7b_63_cut", "design_example", "chain", "wide"])
def test_greedy_tree_decoding_is_lossless_oracle_heads(tiny, name):
    """Heads that know the greedy future make most steps accept several tokens, sequences of
    a batch accept different lengths (cache holes), and the output is still exact."""
    _, lm = tiny
    tree = trees()[name]
    ids, mask = ragged_batch([5, 9, 2], seed=5)
    n = 24
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    prompts = unpadded(ids, mask)
    oracle = OracleHeads(lm.model, [p + r for p, r in zip(prompts, ref)], [len(p) for p in prompts])
    dec = TreeDecoder(lm.model, oracle, tree)
    res = dec.generate(ids, mask, max_new_tokens=n)
    assert res.tokens == ref
    # heads only ever ran on the greedy path (a sequence's last step may end past the stored
    # continuation)
    assert oracle.calls > 0 and oracle.calls - oracle.matched <= 3
    assert res.tokens_per_step > 1.5, res.accepted
    assert res.accepted.max() == tree.depth + 1  # full-depth acceptance happened
    both = (res.accepted > 0).all(1)
    assert (res.accepted[both].min(1) != res.accepted[both].max(1)).any()  # ragged acceptance
    one = TreeDecoder(lm.model, oracle, tree).generate(ids[:1, -5:], max_new_tokens=n)
    assert one.tokens == ref[:1] and one.tokens_per_step > 1.5


def test_the_next_draft_reads_the_last_accepted_tokens_hidden_state(tiny):
    """After every step the drafter reads the base model's hidden state at the step's last
    accepted token (the one that produced the new root), not at the step's root: the hidden
    state and the next tree equal those of an independent causal run over the prompt and the
    tokens kept so far (docs/decoder.md#the-step). Greedy output cannot show this bug, only
    the tokens per step."""
    _, lm = tiny
    tree = trees()["mc_sim_7b_63_cut"]
    ids, mask = ragged_batch([5, 9, 2], seed=5)
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=24)
    prompts = unpadded(ids, mask)
    oracle = OracleHeads(lm.model, [p + r for p, r in zip(prompts, ref)], [len(p) for p in prompts])
    dec = TreeDecoder(lm.model, oracle, tree, timing=False)
    tree_indices = torch.from_numpy(tree_buffers(tree, dec.topk).tree_indices)
    state = dec.prefill(ids, mask, capacity=64)
    seen, roots = [list(p) for p in prompts], state.root.tolist()  # the cache's tokens; the roots
    deep = 0
    for _ in range(4):
        new, n_keep = dec.step(state)
        deep += int((n_keep > 1).sum())
        with torch.inference_mode():
            drafted = dec.draft(state)
            for live, i in enumerate(state.rows.tolist()):
                kept = new[live, : n_keep[live]].tolist()
                seen[i] += [roots[i]] + kept[:-1]
                roots[i] = kept[-1]
                seq = torch.tensor([seen[i]])
                positions = torch.arange(seq.shape[1])[None]
                hidden = model_forward_hidden(lm.model, seq, attention_mask=None, position_ids=positions, cache=None)
                torch.testing.assert_close(state.hidden[live], hidden[0, -1], atol=1e-4, rtol=0)
                top = torch.stack([oracle[k](hidden[0, -1]) for k in range(tree.depth)]).topk(dec.topk).indices
                flat = torch.cat([torch.tensor([roots[i]]), top.reshape(-1)])
                assert drafted[live].tolist() == flat[tree_indices].tolist()
    assert deep >= 3  # steps that accepted past the root happened


def test_lossless_without_gqa(tiny_mha):
    _, lm = tiny_mha
    ids, mask = ragged_batch([6, 2, 8], seed=11)
    n = 20
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    assert ref == hf_generate(lm.model, ids, mask, n)
    prompts = unpadded(ids, mask)
    oracle = OracleHeads(lm.model, [p + r for p, r in zip(prompts, ref)], [len(p) for p in prompts])
    tree = cut_tree(load_tree("mc_sim_7b_63"), NUM_HEADS, 10)
    for heads in (lm.heads, oracle):
        dec = TreeDecoder(lm.model, heads, tree)
        assert not dec.force_gqa
        res = dec.generate(ids, mask, max_new_tokens=n)
        assert res.tokens == ref
    assert res.tokens_per_step > 1.5


def test_rank_one_acceptance_needs_rank_one_branch(tiny):
    """With oracle heads, a chain of rank-0 nodes accepts less than a tree that also holds the
    rank-1 branches: acceptance follows the ranks the tree covers."""
    _, lm = tiny
    ids, mask = ragged_batch([7], seed=6)
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=30)
    oracle = OracleHeads(lm.model, [unpadded(ids, mask)[0] + ref[0]], [7])
    chain = TreeDecoder(lm.model, oracle, trees()["chain"]).generate(ids, mask, max_new_tokens=30)
    full = make_tree([list(p) for p in np.ndindex(2, 2, 2)] + [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]])
    wide = TreeDecoder(lm.model, oracle, full).generate(ids, mask, max_new_tokens=30)
    assert chain.tokens == wide.tokens == ref
    assert wide.tokens_per_step > chain.tokens_per_step


def test_eos_stops_finished_sequences(tiny):
    _, lm = tiny
    ids, mask = ragged_batch([5, 9, 2], seed=7)
    n = 20
    free = greedy_decode(lm.model, ids, mask, max_new_tokens=n)
    eos = free[0][6]  # a token sequence 0 emits at step 7: it must stop there
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=n, eos_token_id=eos)
    assert ref[0] == free[0][: free[0].index(eos) + 1]
    assert ref == hf_generate(lm.model, ids, mask, n, eos=eos)
    prompts = unpadded(ids, mask)
    oracle = OracleHeads(lm.model, [p + r for p, r in zip(prompts, free)], [len(p) for p in prompts])
    for heads in (lm.heads, oracle):
        res = TreeDecoder(lm.model, heads, cut_tree(load_tree("mc_sim_7b_63"), NUM_HEADS, 10)).generate(
            ids, mask, max_new_tokens=n, eos_token_id=eos
        )
        assert res.tokens == ref
        stop = int(np.flatnonzero(res.emitted[:, 0])[-1]) if res.emitted[:, 0].any() else -1
        assert (res.accepted[stop + 1 :, 0] == 0).all() and (res.emitted[stop + 1 :, 0] == 0).all()
    # eos as the very first token: nothing else for that sequence
    first = free[1][0]
    res = TreeDecoder(lm.model, lm.heads, make_tree(DESIGN_EXAMPLE)).generate(
        ids, mask, max_new_tokens=n, eos_token_id=first
    )
    assert res.tokens[1] == [first]
    assert res.tokens == greedy_decode(lm.model, ids, mask, max_new_tokens=n, eos_token_id=first)
    # a list of eos ids: each stops its sequence
    both = [first, eos]
    res = TreeDecoder(lm.model, oracle, make_tree(DESIGN_EXAMPLE)).generate(
        ids, mask, max_new_tokens=n, eos_token_id=both
    )
    assert res.tokens == greedy_decode(lm.model, ids, mask, max_new_tokens=n, eos_token_id=both)
    assert res.tokens[0][-1] == eos and res.tokens[1] == [first]


def test_max_new_tokens_edges(tiny):
    _, lm = tiny
    dec = TreeDecoder(lm.model, lm.heads, make_tree(DESIGN_EXAMPLE))
    ids, mask = ragged_batch([4, 6], seed=8)
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=3)
    assert dec.generate(ids, mask, max_new_tokens=0).tokens == [[], []]
    r1 = dec.generate(ids, mask, max_new_tokens=1)
    assert r1.tokens == [t[:1] for t in ref] and r1.steps == 0
    assert dec.generate(ids, mask, max_new_tokens=3).tokens == ref


def test_typical_acceptance(tiny):
    """Seeded typical acceptance is deterministic; at a vanishing temperature it is greedy."""
    _, lm = tiny
    tree = cut_tree(load_tree("mc_sim_7b_63"), NUM_HEADS, 10)
    dec = TreeDecoder(lm.model, lm.heads, tree)
    ids, mask = ragged_batch([5, 9, 2], seed=9)
    kw = {"max_new_tokens": 16, "temperature": 0.8, "posterior_threshold": 0.09, "posterior_alpha": 0.3}
    a = dec.generate(ids, mask, seed=1, **kw)
    b = dec.generate(ids, mask, seed=1, **kw)
    c = dec.generate(ids, mask, seed=2, **kw)
    assert a.tokens == b.tokens and (a.accepted == b.accepted).all()
    assert a.tokens != c.tokens
    assert [len(t) for t in a.tokens] == [16, 16, 16]
    cold = dec.generate(ids, mask, max_new_tokens=16, temperature=1e-4, seed=3)
    assert cold.tokens == greedy_decode(lm.model, ids, mask, max_new_tokens=16)


def test_typical_acceptance_rule_by_hand(tiny):
    """accept(): p(x) > min(eps, alpha * exp(-H)) at the parent, H with Medusa's +1e-5."""
    _, lm = tiny
    dec = TreeDecoder(lm.model, lm.heads, make_tree([[0], [1], [0, 0]]))
    # buffer order: 0 root, 1 = [0], 2 = [1], 3 = [0, 0]
    p_root = np.array([0.5, 0.3, 0.12, 0.08] + [0.0] * (VOCAB - 4))
    p_n1 = np.array([0.0, 0.0, 0.0, 0.0, 0.02, 0.98] + [0.0] * (VOCAB - 6))
    probs = np.stack([p_root, p_n1, p_root, p_root])
    logits = torch.tensor(np.log(probs + 1e-30), dtype=torch.float32)[None]

    def thr(p, eps=0.09, alpha=0.3):
        h = -(p * np.log(p + 1e-5)).sum()
        return min(eps, alpha * np.exp(-h))

    # node [0] = token 1 (p 0.3), node [1] = token 2 (p 0.12), node [0,0] = token 4 (p 0.02)
    tokens = torch.tensor([[0, 1, 2, 4]])
    got = dec.verifier.accept(
        tokens, logits, AcceptanceRule(temperature=1.0, generator=torch.Generator().manual_seed(0))
    )
    n_keep, last, bonus = got.n_keep, got.last, got.bonus
    assert 0.3 > thr(p_root) and 0.12 > thr(p_root) and 0.02 < thr(p_n1)
    # both depth-1 nodes pass, [0,0] fails: length 2, the more likely of [0] and [1] wins
    assert int(n_keep[0]) == 2 and int(last[0]) == 1
    assert int(bonus[0]) == 5  # sampled from p at node [0]: 0.98 on token 5 (seed 0)
    # with a strict epsilon only the root stays; a greedy run picks argmax paths
    strict = AcceptanceRule(
        1.0, posterior_threshold=0.01, posterior_alpha=10.0, generator=torch.Generator().manual_seed(0)
    )
    got = dec.verifier.accept(tokens, logits, strict)
    assert int(got.n_keep[0]) == 3 and int(got.last[0]) == 3  # 0.02 > 0.01 now
    got = dec.verifier.accept(torch.tensor([[0, 0, 1, 5]]), logits)
    assert int(got.n_keep[0]) == 3 and got.path[0, :3].tolist() == [0, 1, 3] and int(got.bonus[0]) == 0


def test_plain_step_forward(tiny):
    _, lm = tiny
    from transformers import DynamicCache

    ids, mask = ragged_batch([5, 3], seed=10)
    ref = greedy_decode(lm.model, ids, mask, max_new_tokens=2)
    cache = DynamicCache()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, **cache_kwargs(lm.model, cache))
    tok = torch.tensor([[r[0]] for r in ref])
    m2 = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
    logits, head_logits = plain_step_forward(lm.model, lm.heads, cache, tok, m2, pos[:, -1:] + 1)
    assert logits.shape == (2, 1, VOCAB) and head_logits.shape == (NUM_HEADS, 2, 1, VOCAB)
    assert logits[:, 0].argmax(-1).tolist() == [r[1] for r in ref]
    assert cache.get_seq_length() == ids.shape[1] + 1


def test_bad_inputs(tiny):
    _, lm = tiny
    deep = make_tree([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(UserError, match="depth 4 needs 4 Medusa heads"):
        TreeDecoder(lm.model, lm.heads, deep)
    with pytest.raises(UserError, match="rank 12"):
        TreeDecoder(lm.model, lm.heads, make_tree([[12]]), topk=10)
    cut = cut_tree(load_tree("mc_sim_7b_63"), 2, 3)
    assert cut.depth == 2 and all(max(p) < 3 for p in cut.paths)
    assert list(cut.paths) == [p for p in load_tree("mc_sim_7b_63").paths if len(p) <= 2 and max(p) < 3]
    dec = TreeDecoder(lm.model, lm.heads, make_tree([[0]]))
    ids = torch.tensor([[5, 6]])
    with pytest.raises(UserError, match="no unmasked token"):
        dec.generate(ids, torch.tensor([[0, 0]]), max_new_tokens=2)


def test_decode_cli(tiny, capsys):
    from treeopt.cli import main

    path, lm = tiny
    prompt = "hello tree"
    main(
        [
            "decode",
            "--model",
            str(path),
            "--tree",
            "mc_sim_7b_63",
            "--prompt",
            prompt,
            "--prompt",
            "x",
            "--max-new-tokens",
            "12",
            "--device",
            "cpu",
            "--dtype",
            "float32",  # the reference below is float32; "auto" follows the CPU's bf16 support
            "--batch-size",
            "2",
            "--compare",
        ]
    )
    out = capsys.readouterr()
    ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"]
    ref = greedy_decode(lm.model, ids, max_new_tokens=12, eos_token_id=lm.tokenizer.eos_token_id)
    assert lm.tokenizer.decode(ref[0]) in out.out
    assert "tokens per step" in out.out and "identical to plain greedy: yes" in out.out
    assert "cut to 3 heads" in out.err

    with pytest.raises(SystemExit) as exc:
        main(["decode", "--model", str(path), "--tree", "[[0, 1]]", "--prompt", "a"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no parent" in err[0]
    with pytest.raises(SystemExit) as exc:
        main(["decode", "--model", str(path), "--tree", "[[0]]"])
    assert exc.value.code == 2 and "--prompt or --data" in capsys.readouterr().err
