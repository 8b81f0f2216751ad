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
from calibration.kv_cache import KVCache
from calibration.verification import TreeVerifier, Verified
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


def _one_hot_logits(argmax_rows):
    """Logits (b, q, 16) whose argmax at node j of sequence i is argmax_rows[i][j]."""
    logits = torch.zeros(len(argmax_rows), len(argmax_rows[0]), 16)
    for i, row in enumerate(argmax_rows):
        logits[i, torch.arange(len(row)), torch.tensor(row)] = 1.0
    return logits


def test_host_step_is_the_accepted_nodes_then_the_bonus():
    """The step's tokens, kept slots and whether the keep moves anything, by hand on a tree
    whose nodes in tree order are root, (0), (1), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2):
    node 3 is the leaf (0, 0), past the last parent (node 2), so its bonus comes from the one row
    read for it."""
    tree = make_tree([[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]])
    verifier = TreeVerifier(tree_buffers(tree, 10), None, torch.float32, torch.device("cpu"))
    #         root  (0)  (1) (0,0) (0,1) (0,2) (1,0) (1,1) (1,2)
    tokens = torch.tensor(
        [
            [1, 5, 6, 7, 8, 9, 10, 11, 12],  # sequence 0: (0) then (0, 0) accepted
            [1, 2, 3, 4, 8, 9, 10, 11, 12],  # sequence 1: nothing accepted
        ]
    )
    # argmax after each node: sequence 0 after the root is 5 = node (0), after (0) is 7 = (0, 0),
    # after (0, 0) is 14 (the bonus); sequence 1 after the root is 13, matching no child
    argmax = [[5, 7, 0, 14, 0, 0, 0, 0, 0], [13, 0, 0, 0, 0, 0, 0, 0, 0]]
    accepted = verifier.accept(tokens, _one_hot_logits(argmax))
    assert accepted.n_keep.tolist() == [3, 1]
    assert accepted.last.tolist() == [3, 0]
    assert accepted.bonus.tolist() == [14, 13]
    step = accepted.host
    assert step.new[0].tolist() == [5, 7, 14]  # nodes (0) and (0, 0), then the bonus
    assert step.new[1, 0] == 13  # no node accepted: the bonus first
    assert step.kept.tolist() == [[True, True, True], [True, False, False]]  # sequence 1: two holes
    # the paths are rows [0, 1, 3] and, for sequence 1, the first row [0, 2, 8]: only the roots
    # are in their kept slots already; the rest moves, the hole slots as the keep copies any
    assert step.settled == 1
    assert step.moved.tolist() == [[1, 3], [2, 8]]


@pytest.mark.parametrize(
    ("argmax", "in_place"), [([5, 0, 0, 0, 0, 0, 0, 0, 0], True), ([6, 0, 0, 0, 0, 0, 0, 0, 0], False)]
)
def test_host_keep_moves_nothing_only_when_the_path_is_in_place(argmax, in_place):
    """Node (0) is tree slot 1, the kept path's second slot: accepting it alone keeps the cache
    as it is; node (1) (slot 2) must move to slot 1. Either way the cache then holds the root's
    and the accepted node's entries in its first two new slots."""
    tree = make_tree([[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]])
    verifier = TreeVerifier(tree_buffers(tree, 10), None, torch.float32, torch.device("cpu"))
    tokens = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11, 12]])
    accepted = verifier.accept(tokens, _one_hot_logits([argmax]))
    assert accepted.host.settled == (2 if in_place else 1)
    cache = KVCache(num_layers=2)
    for layer in range(2):  # 4 cached slots, then the tree's 9: entry value = slot index
        keys = torch.arange(13.0)[None, None, :, None].expand(1, 1, 13, 2)
        cache.update(keys, keys + 100, layer)
    hidden = torch.arange(9.0)[None, :, None].expand(1, 9, 3)
    last = verifier.keep(cache, 4, Verified(None, hidden, None), accepted, along_path=False)
    node = 1 if in_place else 2
    assert cache.length == 6
    assert cache.layers[1].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 4 + node]
    assert cache.layers[0].values[0, 0, :, 0].tolist() == [100, 101, 102, 103, 104, 104 + node]
    assert last.tolist() == [[node] * 3]  # the accepted node's hidden state drafts next
