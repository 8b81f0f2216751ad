"""Which path a verification keeps when several are accepted to the same length: greedy keeps
the first longest, typical acceptance the most likely of the longest, as Medusa's reference
code does (FasterDecoding/Medusa, medusa/model/utils.py `evaluate_posterior`: among the
candidates of the longest accepted length, the one of largest summed log-probability).
Expected paths chosen by hand."""

from __future__ import annotations

import math

import torch

from calibration.verification import _longest_accepted


def _paths():
    # one sequence, three root-to-leaf paths of root + 2 drafted tokens; paths 0 and 2 are
    # accepted whole, path 1 only up to its first drafted token
    on_path = torch.tensor([[[True, True, True], [True, True, False], [True, True, True]]])
    return on_path


def test_typical_acceptance_keeps_the_most_likely_of_the_longest_paths():
    # path 0: p = 0.2, 0.2 (log sum -3.22); path 2: p = 0.5, 0.5 (-1.39); path 1 is shorter,
    # whatever its likelihood (0.9 and 0.9 would win if length did not come first)
    log = math.log
    loglik = torch.tensor([[[0.0, log(0.2), log(0.2)], [0.0, log(0.9), log(0.9)], [-50.0, log(0.5), log(0.5)]]])
    best, n_keep = _longest_accepted(_paths(), loglik)
    assert best.tolist() == [2] and n_keep.tolist() == [3]


def test_the_roots_own_probability_does_not_count():
    # the same two full paths, path 2's root given a log-probability that would sink it if counted
    log = math.log
    loglik = torch.tensor([[[0.0, log(0.3), log(0.3)], [0.0, 0.0, 0.0], [-100.0, log(0.4), log(0.4)]]])
    best, _ = _longest_accepted(_paths(), loglik)
    assert best.tolist() == [2]


def test_greedy_keeps_the_first_longest_path():
    best, n_keep = _longest_accepted(_paths(), None)
    assert best.tolist() == [0] and n_keep.tolist() == [3]
