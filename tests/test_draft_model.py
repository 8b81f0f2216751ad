"""Draft-model speculative decoding (calibration.speculative, calibration.drafters.draft_model).

Distribution tests: sequences produced by rejection sampling are compared with the target's
EXACT distribution by Pearson's chi-square test at significance level 0.001 (with the fixed
seeds here each test is deterministic; 0.001 is the rate at which a correct rule would fail
over seeds). Each test has a negative control: a wrong rule on the same draws is rejected, so
the test has the power to see a wrong output distribution. Greedy (temperature 0) must emit
exactly plain greedy decoding, batch 1 and batch 3 with padding.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from calibration.drafters.draft_model import DraftModel, acceptance_alpha, chain_tau, chain_tau_iid
from calibration.greedy import greedy_decode
from calibration.labels import label_ranks, label_rows
from calibration.speculative import (
    SpeculativeDecoder,
    chain_rejection,
    children_table,
    draw_children,
    recursive_rejection,
)
from treeopt.acceptance import simulate_tokens_per_step
from treeopt.tree import make_tree

SIGNIFICANCE = 0.001
TREES = [
    [[0], [0, 0], [0, 0, 0]],  # a chain, gamma = 3
    [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
    [[0], [2], [2, 1]],  # gaps in the ranks
]


def markov(v, seed, scale=0.8):
    """(v, v) row-stochastic transition table: row = previous token."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(v, v, generator=g) * scale, dim=-1)


def chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson's test, cells with an expected count under 5 pooled into one (the usual
    validity condition of the chi-square approximation)."""
    n = counts.sum()
    expected = expected_probs / expected_probs.sum() * n  # float32 tables sum to 1 up to rounding
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


def sequence_counts(seqs: torch.Tensor, v: int) -> np.ndarray:
    length = seqs.shape[1]
    code = (seqs * (v ** torch.arange(length - 1, -1, -1))).sum(-1)
    return np.bincount(code.numpy(), minlength=v**length)


def markov_exact(P: torch.Tensor, start: int, length: int) -> np.ndarray:
    """Exact probability of every token sequence of `length` after `start`, by enumeration."""
    v = P.shape[0]
    probs = np.empty(v**length)
    for i, seq in enumerate(itertools.product(range(v), repeat=length)):
        prev, pr = start, 1.0
        for x in seq:
            pr *= float(P[prev, x])
            prev = x
        probs[i] = pr
    return probs


def run_markov(step, n_rows: int, length: int, start: int = 0) -> torch.Tensor:
    """Decode `length` tokens per row with `step(last) -> (new (N, W), count (N,))`, the rows
    at once; returns (N, length)."""
    buf = torch.zeros((n_rows, length + 16), dtype=torch.int64)
    have = torch.zeros(n_rows, dtype=torch.int64)
    last = torch.full((n_rows,), start, dtype=torch.int64)
    while bool((have < length).any()):
        new, count = step(last)
        active = have < length
        cols = have[:, None] + torch.arange(new.shape[1])[None]
        write = active[:, None] & (torch.arange(new.shape[1])[None] < count[:, None])
        buf[write.nonzero()[:, 0], cols[write]] = new[write]
        have = torch.where(active, have + count, have)
        last = torch.where(active, new[torch.arange(n_rows), count - 1], last)
    return buf[:, :length]


# --------------------------------------------------------------------------------------------
# The verification rules on synthetic p and q


def chain_step(P, Q, gamma, g, rule="leviathan"):
    def step(last):
        drafts, qs, ps, cur = [], [], [], last
        for _ in range(gamma):
            q = Q[cur]
            x = torch.multinomial(q, 1, generator=g)[:, 0]
            drafts.append(x)
            qs.append(q)
            ps.append(P[cur])
            cur = x
        ps.append(P[cur])
        drafts_t, qs_t, ps_t = torch.stack(drafts, 1), torch.stack(qs, 1), torch.stack(ps, 1)
        if rule == "leviathan":
            n, nxt = chain_rejection(drafts_t, qs_t, ps_t, g)
        elif rule == "accept-all":  # wrong: the draft's distribution
            n = torch.full((last.shape[0],), gamma)
            nxt = torch.multinomial(ps_t[:, -1], 1, generator=g)[:, 0]
        else:  # wrong: at a rejection, resample from p instead of the residual
            n, _ = chain_rejection(drafts_t, qs_t, ps_t, g)
            nxt = torch.multinomial(ps_t[torch.arange(len(n)), n], 1, generator=g)[:, 0]
        new = torch.cat([drafts_t, nxt[:, None]], 1)
        new[torch.arange(len(n)), n] = nxt
        return new, n + 1

    return step


def test_chain_rejection_keeps_the_target_distribution():
    v, length, n_rows = 4, 3, 40000
    P, Q = markov(v, 1), markov(v, 2)
    exact = markov_exact(P, 0, length)
    assert (exact * n_rows >= 5).all()  # no pooling needed: the test sees every cell
    g = torch.Generator().manual_seed(0)
    seqs = run_markov(chain_step(P, Q, 3, g), n_rows, length)
    assert chi_square_p(sequence_counts(seqs, v), exact) > SIGNIFICANCE
    for wrong in ("accept-all", "resample-from-p"):
        seqs = run_markov(chain_step(P, Q, 3, g, wrong), n_rows, length)
        assert chi_square_p(sequence_counts(seqs, v), exact) < SIGNIFICANCE, wrong


def test_chain_rejection_by_hand():
    # p = (0.5, 0.5, 0), q = (0.25, 0.75, 0): draft token 1 is kept with probability
    # p/q = 2/3; a rejection resamples from norm(max(0, p - q)) = (1, 0, 0).
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]]).expand(30000, -1, -1)
    q = torch.tensor([[[0.25, 0.75, 0.0]]]).expand(30000, -1, -1)
    n, nxt = chain_rejection(torch.ones(30000, 1, dtype=torch.int64), q, p, torch.Generator().manual_seed(3))
    kept = n.float().mean().item()
    assert abs(kept - 2 / 3) < 4 * (2 / 9 / 30000) ** 0.5
    assert (nxt[n == 0] == 0).all() and (nxt[n == 1] == 2).all()
    # temperature 0 (one-hot p and q): kept exactly when the draft is the target's argmax
    one = torch.eye(3)
    drafts = torch.tensor([[1, 2], [1, 0]])
    argmaxes = torch.tensor([[1, 2, 0], [1, 2, 0]])
    n, nxt = chain_rejection(drafts, one[drafts], one[argmaxes])
    assert n.tolist() == [2, 1] and nxt.tolist() == [0, 2]


def tree_step(P, Q, tree, g, rule="recursive"):
    table = torch.from_numpy(children_table(make_tree(tree)))
    q = table.shape[0]

    def step(last):
        b = last.shape[0]
        tokens = torch.zeros((b, q), dtype=torch.int64)
        tokens[:, 0] = last
        for node in range(q):  # test code: the tree's nodes are in depth order
            kids = table[node][table[node] >= 0]
            if len(kids):
                tokens[:, kids] = draw_children(Q[tokens[:, node]], len(kids), 1.0, g)
        p_nodes, q_nodes = P[tokens], Q[tokens]
        if rule == "with-replacement-residual-only":  # wrong: q is not renormalised without c
            return _rrs_without_q_update(tokens, table, q_nodes, p_nodes, g)
        path, n_keep, _, nxt = recursive_rejection(tokens, table, q_nodes, p_nodes, g)
        new = torch.cat([tokens.gather(1, path[:, 1:]), nxt[:, None]], 1)
        new[torch.arange(b), n_keep - 1] = nxt
        return new, n_keep

    return step


def _rrs_without_q_update(tokens, table, q_nodes, p_nodes, g):
    """SpecInfer-style residuals with the draws made WITHOUT replacement: not lossless."""
    b = tokens.shape[0]
    rows = torch.arange(b)
    p = p_nodes[:, 0].clone()
    qd = q_nodes[:, 0]
    nxt = torch.full((b,), -1)
    for j in range(table.shape[1]):
        child = table[0, j]
        if child < 0:
            break
        x = tokens[:, child]
        kept = (nxt < 0) & (torch.rand(b, generator=g) * qd[rows, x] < p[rows, x])
        nxt = torch.where(kept, x, nxt)
        res = (p - qd).clamp(min=0)
        p = torch.where(kept[:, None], p, res / res.sum(-1, keepdim=True).clamp(min=1e-30))
    fallback = torch.multinomial(p.clamp(min=0) + 1e-12, 1, generator=g)[:, 0]
    return torch.where(nxt >= 0, nxt, fallback)[:, None], torch.ones(b, dtype=torch.int64)


def test_recursive_rejection_keeps_the_target_distribution():
    v, length, n_rows = 4, 3, 40000
    P, Q = markov(v, 5), markov(v, 6)
    exact = markov_exact(P, 0, length)
    g = torch.Generator().manual_seed(1)
    tree = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    seqs = run_markov(tree_step(P, Q, tree, g), n_rows, length)
    assert chi_square_p(sequence_counts(seqs, v), exact) > SIGNIFICANCE
    seqs = run_markov(tree_step(P, Q, tree, g, "with-replacement-residual-only"), n_rows, length)
    assert chi_square_p(sequence_counts(seqs, v), exact) < SIGNIFICANCE


def test_draw_children_without_replacement():
    # Two draws without replacement from (0.5, 0.3, 0.2): P(first=0, second=1) = 0.5 * 0.3/0.5.
    probs = torch.tensor([0.5, 0.3, 0.2]).expand(60000, 3)
    draws = draw_children(probs, 2, 1.0, torch.Generator().manual_seed(2))
    assert (draws[:, 0] != draws[:, 1]).all()
    pairs = draws[:, 0] * 3 + draws[:, 1]
    counts = np.bincount(pairs.numpy(), minlength=9)
    p = np.array([0.5, 0.3, 0.2])
    exact = np.array([p[a] * p[b] / (1 - p[a]) if a != b else 0.0 for a in range(3) for b in range(3)])
    keep = exact > 0
    assert chi_square_p(counts[keep], exact[keep]) > SIGNIFICANCE


# --------------------------------------------------------------------------------------------
# The decoder on tiny models


def llama(vocab, hidden, layers, seed, kv_heads=2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
    return model.eval()


def noisy_copy(model, noise, seed):
    """The model with noise on every weight: a draft that agrees with it often, not always."""
    copy = llama(
        model.config.vocab_size,
        model.config.hidden_size,
        model.config.num_hidden_layers,
        0,
        model.config.num_key_value_heads,
    )
    copy.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return copy


@pytest.fixture(scope="module")
def pair():
    target = llama(64, 32, 2, 0)
    return target, noisy_copy(target, 0.02, 1), llama(64, 16, 1, 2, kv_heads=1)


@pytest.mark.parametrize("tree", TREES)
def test_greedy_is_lossless(pair, tree):
    target, close, small = pair
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :6] = 0
    for rows in (slice(0, 1), slice(0, 3)):
        ref = greedy_decode(target, ids[rows], mask[rows], max_new_tokens=24)
        # the ragged batch verifies through the split attention (docs/decoder.md#split-verification-attention)
        attention = "split" if rows.stop > 1 else None
        for draft in (close, small):
            decoder = SpeculativeDecoder(target, DraftModel(draft), make_tree(tree), attention=attention)
            assert decoder.td.attention == (attention or "masked")
            out = decoder.generate(ids[rows], mask[rows], max_new_tokens=24)
            assert out.tokens == ref
            assert out.emitted.sum(0).tolist() == [len(t) - 1 for t in ref]
    accepted = (
        SpeculativeDecoder(target, DraftModel(close), make_tree(tree))
        .generate(ids, mask, max_new_tokens=24)
        .tokens_per_step
    )
    assert accepted > 1.3  # the close draft is accepted often: the test exercises acceptance


def exact_continuations(model, prompt: torch.Tensor, length: int, temperature: float) -> np.ndarray:
    """The target's exact probability of every continuation of `length` tokens, by one
    forward over all of them (the vocabulary is tiny)."""
    v = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=length)))
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double() / temperature, -1)
    start = prompt.shape[1] - 1
    steps = logp[:, start : start + length].gather(-1, seqs[..., None])[..., 0]
    return steps.sum(-1).exp().numpy()


@pytest.mark.parametrize("tree", [[[0], [0, 0]], [[0], [1], [0, 0], [1, 0]]])
def test_sampled_decoding_has_the_targets_distribution(tree):
    v, length, n_rows, temperature = 6, 3, 12000, 0.8
    target = llama(v, 16, 1, 3)
    draft = noisy_copy(target, 0.3, 4)
    prompt = torch.tensor([[1, 4, 2, 5]])
    exact = exact_continuations(target, prompt, length, temperature)
    dec = SpeculativeDecoder(target, DraftModel(draft), make_tree(tree), timing=False)
    out = dec.generate(prompt.expand(n_rows, -1), max_new_tokens=length, temperature=temperature, seed=7)
    assert out.tokens_per_step > 1.2
    counts = sequence_counts(torch.tensor(out.tokens), v)
    assert chi_square_p(counts, exact) > SIGNIFICANCE
    # negative control: the draft's own samples (what accepting everything would emit)
    wrong = SpeculativeDecoder(draft, DraftModel(draft), make_tree([], allow_empty=True), timing=False).generate(
        prompt.expand(n_rows, -1), max_new_tokens=length, temperature=temperature, seed=7
    )
    assert chi_square_p(sequence_counts(torch.tensor(wrong.tokens), v), exact) < SIGNIFICANCE


# --------------------------------------------------------------------------------------------
# Calibration: ranks, alpha and the predicted tokens per step


def test_draft_ranks_against_a_per_position_brute_force(pair):
    _, close, _ = pair
    drafter = DraftModel(close, max_depth=3)
    g = torch.Generator().manual_seed(5)
    sequences = [torch.randint(3, 64, (n,), generator=g).tolist() for n in (9, 14, 6)]
    starts = [2, 4, 1]
    ranks = label_ranks(None, drafter, sequences, starts)
    seq, t, has = label_rows([len(s) for s in sequences], starts, 3)
    assert ranks.shape == has.shape and ((ranks >= 0) == has).all()
    for row in range(len(seq)):  # the slow reference: the draft on the prefix alone
        s = sequences[seq[row]]
        for d in range(3):
            if has[row, d]:
                prefix = torch.tensor([s[: t[row] + d + 2]])
                with torch.no_grad():
                    logits = close(prefix).logits[0, -1]
                assert ranks[row, d] == int((logits > logits[s[t[row] + d + 2]]).sum())


def test_greedy_walk_predicts_measured_tokens_per_step_exactly(pair):
    target, close, _ = pair
    gamma, new_tokens = 3, 20
    prompts = torch.randint(3, 64, (4, 7), generator=torch.Generator().manual_seed(6))
    continuation = greedy_decode(target, prompts, max_new_tokens=new_tokens + gamma + 1)
    sequences = [p + c for p, c in zip(prompts.tolist(), continuation, strict=True)]
    drafter = DraftModel(close, max_depth=gamma)
    ranks = label_ranks(None, drafter, sequences, [6] * 4)
    seq, _, _ = label_rows([len(s) for s in sequences], [6] * 4, gamma)
    chain = make_tree([[0] * k for k in range(1, gamma + 1)])
    predicted, _ = simulate_tokens_per_step(ranks, seq, chain, start_rows=new_tokens - 1)
    measured = SpeculativeDecoder(target, drafter, chain).generate(prompts, max_new_tokens=new_tokens)
    assert predicted == pytest.approx(measured.tokens_per_step, rel=1e-12)
    # alpha at temperature 0 is the rank-0 indicator
    alpha = acceptance_alpha(target, drafter, sequences, [6] * 4, temperature=0.0)
    np.testing.assert_array_equal(alpha[ranks >= 0], (ranks[ranks >= 0] == 0).astype(float))


def test_chain_tau_formulas_by_hand():
    # iid: (1 - a^(g+1)) / (1 - a); a = 0.5, g = 2: 1.75 (Leviathan et al., equation 1)
    assert chain_tau_iid(0.5, 2) == pytest.approx(1.75)
    assert chain_tau_iid(1.0, 4) == 5.0
    # rows (0.5, 0.4) and (1, 0): 1 + mean(0.5 + 0.2, 1 + 0) = 1.85
    assert chain_tau(np.array([[0.5, 0.4], [1.0, 0.0]]), 2) == pytest.approx(1.85)
    assert chain_tau(np.array([[0.5, 0.4]]), 0) == 1.0


def test_alpha_predicts_sampled_tokens_per_step(pair):
    # Rejection sampling at T = 1: alpha along continuations sampled from the target predicts
    # the measured tokens per step of a chain of gamma (here within 0.7% for gamma 1..3 over
    # 300 prompts; 3% leaves room for the measurement's own sampling error, about 1%).
    target, close, _ = pair
    drafter = DraftModel(close, max_depth=3)
    n, new_tokens = 300, 24
    prompts = torch.randint(3, 64, (n, 7), generator=torch.Generator().manual_seed(6))
    plain = SpeculativeDecoder(target, drafter, make_tree([], allow_empty=True), timing=False)
    sampled = plain.generate(prompts, max_new_tokens=new_tokens + 4, temperature=1.0, seed=1).tokens
    sequences = [p + c for p, c in zip(prompts.tolist(), sampled, strict=True)]
    alpha = acceptance_alpha(target, drafter, sequences, [6] * n, temperature=1.0)
    alpha = alpha[~np.isnan(alpha).any(1)]
    assert 0.5 < alpha.mean() < 0.9  # neither trivial nor hopeless
    for gamma in (1, 2, 3):
        chain = make_tree([[0] * k for k in range(1, gamma + 1)])
        measured = (
            SpeculativeDecoder(target, drafter, chain, timing=False)
            .generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=2)
            .tokens_per_step
        )
        assert chain_tau(alpha, gamma) == pytest.approx(measured, rel=0.03)
