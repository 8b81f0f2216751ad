"""Positional acceptance of draft-model trees under recursive rejection sampling
(calibration.drafters.draft_model.positional_acceptance, treeopt.chain): hand-derived values,
brute-force enumeration over draw orders, the decoder's own rule, and the chain case.

Monte Carlo estimates are compared with exact values within 4 of their own standard errors
(a correct estimator fails that about once in 16,000 comparisons; the seeds are fixed, so each
test is deterministic)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from calibration.drafters.draft_model import draw_children, positional_acceptance
from calibration.speculative import children_table, recursive_rejection
from treeopt.build import tau_curve
from treeopt.chain import (
    ChainAcceptance,
    load_chain_acceptance,
    packed_tree,
    rejection_proposal,
    rejection_tau,
    rejection_tau_curve,
    rejection_tau_stderr,
)
from treeopt.errors import UserError
from treeopt.tree import make_tree

SIGMAS = 4.0


def test_positional_acceptance_by_hand():
    g = torch.Generator().manual_seed(0)
    # p = (0.1, 0.9), q = (0.9, 0.1): a_1 = 0.1 + 0.1 = 0.2. Child 2 is tried only after child 1
    # was token 0 and rejected (mass 0.9 - 0.1 = 0.8); then p = norm(max(0, p - q)) = (0, 1)
    # and q without token 0 = (0, 1): kept surely, so a_2 = 0.8.
    mean, se = positional_acceptance(torch.tensor([0.1, 0.9]), torch.tensor([0.9, 0.1]), 2, samples=4000, generator=g)
    assert mean[0].item() == pytest.approx(0.2, abs=1e-7) and se[0].item() == 0.0
    assert 0 < se[1].item() < 0.01
    assert abs(mean[1].item() - 0.8) < SIGMAS * se[1].item()
    # p = (0.5, 0.3, 0.2), q = (0.2, 0.3, 0.5): a_1 = 0.2 + 0.3 + 0.2 = 0.7; only token 2 is ever
    # rejected (mass 0.5 - 0.2 = 0.3), leaving p = (1, 0, 0), q = (0.4, 0.6, 0): child 2 is
    # token 0 (0.4, kept) or token 1 (0.6, rejected; then child 3 is token 0, kept):
    # a_2 = 0.3 x 0.4 = 0.12, a_3 = 0.3 x 0.6 = 0.18.
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    mean, se = positional_acceptance(p, q, 3, samples=4000, generator=g)
    assert mean[0].item() == pytest.approx(0.7, abs=1e-7)
    for j, want in ((1, 0.12), (2, 0.18)):
        assert abs(mean[j].item() - want) < SIGMAS * se[j].item()


def brute_force(p: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """a_1..a_k by enumerating every ordered draw of k distinct tokens from q and, for each,
    the recursive rejection rule written out token by token (Jeon et al. 2024, section 3)."""
    v = len(p)
    out = np.zeros(k)
    for order in itertools.permutations(range(v), k):
        prob, left = 1.0, 1.0
        for x in order:
            prob *= q[x] / left
            left -= q[x]
        pc, qc, reach = p.copy(), q.copy(), 1.0
        for j, x in enumerate(order):
            kept = min(1.0, pc[x] / qc[x]) if qc[x] > 0 else 0.0
            out[j] += prob * reach * kept
            reach *= 1.0 - kept
            res = np.maximum(pc - qc, 0.0)
            pc = res / res.sum() if res.sum() > 0 else res
            qc = qc.copy()
            qc[x] = 0.0
            qc = qc / qc.sum() if qc.sum() > 0 else qc
    return out


def test_positional_acceptance_against_brute_force_batched_over_positions():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 2, 5, generator=g) * 1.5  # (batch, positions, target/draft, V)
    p, q = torch.softmax(logits[..., 0, :], -1), torch.softmax(logits[..., 1, :], -1)
    mean, se = positional_acceptance(p, q, 3, samples=3000, generator=torch.Generator().manual_seed(4))
    assert mean.shape == se.shape == (2, 3, 3)
    for i, t in itertools.product(range(2), range(3)):
        want = brute_force(p[i, t].double().numpy(), q[i, t].double().numpy(), 3)
        assert mean[i, t, 0].item() == pytest.approx(want[0], abs=1e-6)
        assert np.all(np.abs(mean[i, t, 1:].numpy() - want[1:]) < SIGMAS * se[i, t, 1:].numpy() + 1e-6)


def test_positional_acceptance_matches_the_decoders_recursive_rejection():
    # a star of 3 children under the root: the decoder's frequency of keeping child j
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(6, generator=g), -1)
    q = torch.softmax(torch.randn(6, generator=g) * 2, -1)
    mean, se = positional_acceptance(p, q, 3, samples=4000, generator=g)
    tree = make_tree([[0], [1], [2]])
    table = torch.from_numpy(children_table(tree))
    b = 40000
    tokens = torch.zeros((b, 4), dtype=torch.int64)
    tokens[:, 1:] = draw_children(q.expand(b, -1), 3, 1.0, g)
    q_nodes = q.expand(b, 4, -1).clone()
    p_nodes = p.expand(b, 4, -1).clone()
    path, _, _, _ = recursive_rejection(tokens, table, q_nodes, p_nodes, g)
    freq = np.array([(path[:, 1] == j + 1).double().mean().item() for j in range(3)])
    sampling = np.sqrt(freq * (1 - freq) / b)
    assert np.all(np.abs(freq - mean.numpy()) < SIGMAS * np.sqrt(sampling**2 + se.numpy() ** 2))


def test_per_child_table_from_rows_by_hand():
    alpha = np.array([[0.5, 0.4], [1.0, 0.0]])
    child = np.array([[[0.5, 0.2], [0.4, 0.3]], [[1.0, 0.0], [0.0, 0.6]]])
    acc = ChainAcceptance.from_rows(alpha, 1.0, child_rows=child, samples=8)
    # depth 1: both rows weigh 1; depth 2: weights alpha(row, 1) = 0.5 and 1.0
    # a = [[(0.5 + 1) / 2, (0.2 + 0) / 2], [0.5 x 0.4 / 1.5, (0.5 x 0.3 + 0.6) / 1.5]]
    np.testing.assert_allclose(acc.per_child, [[0.75, 0.1], [0.2 / 1.5, 0.5]], rtol=1e-12)
    np.testing.assert_allclose(acc.alpha_per_depth, [0.75, 0.2 / 1.5], rtol=1e-12)
    # weighted standard error at depth 1, child 2: sqrt(0.1^2 + 0.1^2) / 2
    assert acc.accept_per_child_stderr[0][1] == pytest.approx(np.sqrt(0.02) / 2)
    assert acc.accept_per_child_stderr[0][0] == pytest.approx(np.sqrt(2 * 0.25**2) / 2)  # 0.5, 1 about 0.75
    assert acc.samples == 8


def test_tree_tau_by_hand_and_packing():
    a = np.array([[0.6, 0.2, 0.1], [0.5, 0.3, 0.0]])
    # 1 + 0.6 + 0.2 + 0.6 x 0.5 + 0.6 x 0.3 + 0.2 x 0.5 = 2.38
    tree = make_tree([[0], [1], [0, 0], [0, 1], [1, 0]])
    assert rejection_tau(tree, a) == pytest.approx(2.38)
    # ranks with gaps run as draw positions 0, 1, ...: [[0], [2], [2, 1]] is [[0], [1], [1, 0]]
    gaps = make_tree([[0], [2], [2, 1]])
    assert packed_tree(gaps).paths == ((0,), (1,), (1, 0))
    assert rejection_tau(gaps, a) == pytest.approx(1 + 0.6 + 0.2 + 0.2 * 0.5)
    assert rejection_tau(make_tree([], allow_empty=True), a) == 1.0
    with pytest.raises(UserError, match="depth 3"):
        rejection_tau(make_tree([[0], [0, 0], [0, 0, 0]]), a)
    with pytest.raises(UserError, match="4 children"):
        rejection_tau(make_tree([[0], [1], [2], [3]]), a)


def test_tau_stderr_by_hand():
    # chain of 2: tau = 1 + a + a b; d/da = 1 + b, d/db = a
    a, b, s1, s2 = 0.6, 0.5, 0.01, 0.02
    got = rejection_tau_stderr(make_tree([[0], [0, 0]]), [[a, 0.1], [b, 0.1]], [[s1, 0.3], [s2, 0.3]])
    assert got == pytest.approx(np.sqrt(((1 + b) * s1) ** 2 + (a * s2) ** 2))
    # a second child at the root adds its own term
    got = rejection_tau_stderr(make_tree([[0], [1], [0, 0]]), [[a, 0.1], [b, 0.1]], [[s1, 0.03], [s2, 0.3]])
    assert got == pytest.approx(np.sqrt(((1 + b) * s1) ** 2 + (a * s2) ** 2 + 0.03**2))


def test_chain_case_equals_chain_acceptance_tau():
    rng = np.random.default_rng(0)
    alpha = rng.uniform(0.3, 1.0, size=(50, 4))
    child = np.concatenate([alpha[..., None], rng.uniform(0, 1, size=(50, 4, 2)) * (1 - alpha[..., None]) / 2], -1)
    acc = ChainAcceptance.from_rows(alpha, 1.0, child_rows=child, samples=4)
    np.testing.assert_array_equal(acc.per_child[:, 0], acc.alpha_per_depth)
    for gamma in range(5):
        chain = make_tree([[0] * d for d in range(1, gamma + 1)], allow_empty=True)
        assert rejection_tau(chain, acc.per_child) == pytest.approx(acc.tau()[gamma], rel=1e-12)
        # the walk over the rows (per-row product, then the mean), independently
        assert rejection_tau(chain, acc.per_child) == pytest.approx(
            1 + np.cumprod(alpha, 1)[:, :gamma].sum(1).mean(), rel=1e-12
        )


def test_proposal_is_the_optimum_for_falling_rows_and_contiguous_otherwise():
    falling = np.array([[0.6, 0.2, 0.1], [0.7, 0.1, 0.05], [0.5, 0.3, 0.0]])
    proposal = rejection_proposal(falling, 10)
    assert proposal.name == "optimal" and proposal.size == 10
    curve = rejection_tau_curve(proposal, falling)
    # the builders' tau over the AccuracyTable view is the same numbers
    table = ChainAcceptance.from_rows(falling[None, :, 0], 1.0, child_rows=falling[None], samples=1)
    np.testing.assert_allclose(curve, tau_curve(proposal, table.acceptance_table()), rtol=1e-12)
    # brute force: no 3-node tree of ranks 0..m-1 per node beats the proposal's 3-node prefix
    candidates = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    best = 0.0
    for combo in itertools.combinations(candidates, 3):
        try:
            t = make_tree([list(c) for c in combo])
        except UserError:
            continue
        if packed_tree(t).paths == t.paths:
            best = max(best, rejection_tau(t, falling))
    assert curve[3] == pytest.approx(best)
    rising = np.array([[0.2, 0.7], [0.2, 0.7]])
    proposal = rejection_proposal(rising, 6)
    assert proposal.name == "greedy"
    for n in range(proposal.size + 1):  # every prefix runs as it is built
        assert packed_tree(proposal.prefix(n)).paths == proposal.prefix(n).paths


def test_sidecar_v2_round_trip_and_v1_still_read(tmp_path):
    alpha = np.array([[0.5, 0.4], [0.9, 0.7]])
    child = np.concatenate([alpha[..., None], np.full((2, 2, 1), 0.05)], -1)
    acc = ChainAcceptance.from_rows(alpha, 1.0, child_rows=child, samples=16)
    acc.save(tmp_path / "a.alpha.json")
    doc = json.loads((tmp_path / "a.alpha.json").read_text())
    assert doc["format"] == "treeopt.chain_acceptance/v2" and len(doc["accept_per_child"]) == 2
    assert load_chain_acceptance(tmp_path / "a.alpha.json") == acc
    v1 = {"format": "treeopt.chain_acceptance/v1", "temperature": 1.0, "alpha_per_depth": [0.5], "tau_walked": [1, 1.5]}
    (tmp_path / "v1.alpha.json").write_text(json.dumps({**v1, "rows": 3}))
    old = load_chain_acceptance(tmp_path / "v1.alpha.json")
    assert old.accept_per_child is None and old.alpha_per_depth == (0.5,)
    with pytest.raises(UserError, match="v1 file covers chains only"):
        old.per_child  # noqa: B018
    doc["accept_per_child"][0][0] = 0.1
    (tmp_path / "bad.alpha.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="first column must equal alpha_per_depth"):
        load_chain_acceptance(tmp_path / "bad.alpha.json")
    doc["accept_per_child"] = [[0.5, 0.9], [0.5, 0.0]]
    doc["alpha_per_depth"] = [0.5, 0.5]
    (tmp_path / "bad.alpha.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="sum to at most 1"):
        load_chain_acceptance(tmp_path / "bad.alpha.json")
