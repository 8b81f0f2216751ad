"""Greedy acceptance on the host (calibration.verification.host_greedy_accept,
docs/decoder.md#greedy-acceptance): the chosen path, kept length, last token and bonus equal a
per-path walk written from the rule (a node is accepted when it is the base argmax at its
parent and its parent is accepted; the first longest root-to-leaf path; the bonus is the argmax
at its last accepted node), and the torch path the decoder takes off the CPU gives the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.decoder import cut_tree
from calibration.verification import TreeVerifier, host_step_tokens
from treeopt.tree import load_tree, make_tree, tree_buffers

VOCAB = 5  # few tokens: matches, deep paths and ties between paths are common


def _walk(tree, pred_row, tokens_row):
    """The rule by hand: walk every root-to-leaf path of `tree` (its nodes in tree order,
    index 0 the root) until the first token that is not the argmax at its parent."""
    index = {(): 0, **{p: i + 1 for i, p in enumerate(tree.sorted_paths)}}
    leaves = [p for p in tree.sorted_paths if not any(len(o) == len(p) + 1 and o[:-1] == p for o in tree.paths)]
    walked = []
    for leaf in leaves or [()]:
        nodes = [index[leaf[:d]] for d in range(len(leaf) + 1)]
        n = 1
        while n < len(nodes) and tokens_row[nodes[n]] == pred_row[nodes[n - 1]]:
            n += 1
        walked.append((n, nodes[n - 1]))
    n = max(w[0] for w in walked)
    # random tokens may repeat among siblings (a drafter's top-k never does): then several
    # paths are accepted as far, and the rule's tie-break (the first retrieve row) picks one
    return n, {(n, last, pred_row[last]) for k, last in walked if k == n}


@pytest.mark.parametrize("name", ["chain", "design", "mc_sim_7b_63_cut", "empty"])
def test_host_greedy_acceptance_is_the_rule(name):
    tree = {
        "chain": make_tree([[0], [0, 0], [0, 0, 0]]),
        "design": make_tree([[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]]),
        "mc_sim_7b_63_cut": cut_tree(load_tree("mc_sim_7b_63"), 3, 10),
        "empty": make_tree([], allow_empty=True),
    }[name]
    verifier = TreeVerifier(tree_buffers(tree, 10), None, torch.float32, torch.device("cpu"))
    assert verifier.host is not None
    g = torch.Generator().manual_seed(3)
    b, q = 6, tree.size + 1
    deepest = 0
    for _ in range(20):
        logits = torch.randn(b, q, VOCAB, generator=g)
        pred = logits.argmax(-1)
        # a node is its parent's argmax about 70% of the time: deep and ragged acceptance
        guessed = pred[:, np.maximum(tree_buffers(tree, 10).parent, 0)]
        tokens = torch.where(torch.rand(b, q, generator=g) < 0.6, guessed, torch.randint(0, VOCAB, (b, q), generator=g))
        host = verifier.accept(tokens, logits)
        saved, verifier.host = verifier.host, None
        device = verifier.accept(tokens, logits)  # the torch path, as off the CPU
        verifier.host = saved
        for acc in (host, device):
            for i in range(b):
                n, longest = _walk(tree, pred[i].tolist(), tokens[i].tolist())
                assert (int(acc.n_keep[i]), int(acc.last[i]), int(acc.bonus[i])) in longest
                assert acc.path[i, n - 1] == acc.last[i]
            assert acc.keep == max(int(k) for k in acc.n_keep)
        for field in ("path", "n_keep", "last", "bonus"):
            assert torch.equal(getattr(host, field), getattr(device, field))
        deepest = max(deepest, host.keep)
    assert deepest == tree.depth + 1  # some step accepted a whole path


def test_host_step_tokens_are_the_accepted_nodes_then_the_bonus():
    tokens = np.array([[10, 11, 12, 13], [20, 21, 22, 23]])
    path = np.array([[0, 1, 3], [0, 2, 3]])
    n_keep = np.array([3, 1])  # sequence 0 kept both nodes, sequence 1 none
    bonus = np.array([99, 98])
    got = host_step_tokens(tokens, path, n_keep, bonus)
    assert got[0].tolist() == [11, 13, 99]  # nodes 1 and 3, then the bonus
    assert got[1, 0] == 98  # no node accepted: the bonus first
