"""Predicted tau of draft-model trees under recursive rejection sampling against the decoder's
measured tokens per step at temperature 1 (treeopt.app.draft_model.validate_rejection_tau).

Tolerance: the prediction and the measurement must be less than 4 combined standard errors
apart (the measurement's over sequences, the calibration's by the delta method): a correct
prediction fails this about once in 16,000 comparisons, and the seeds are fixed. Each test has
a negative control, a prediction that ignores the tree's extra children, which the same
tolerance rejects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from calibration.drafters.draft_model import DraftModel, acceptance_per_child
from calibration.speculative import SpeculativeDecoder
from treeopt.app.draft_model import VALIDATION_SIGMAS, tokens_per_step_with_stderr, validate_rejection_tau
from treeopt.chain import ChainAcceptance, rejection_tau
from treeopt.tree import make_tree

STAR_THEN_CHAIN = [[0], [1], [2], [0, 0], [0, 0, 0]]
CHAIN = [[0], [0, 0], [0, 0, 0]]


def llama(vocab, hidden, layers, seed, *, constant=False):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
        if constant:
            # every token embeds alike, so every position's hidden state and distribution are
            # the same whatever the prefix: the teacher-forced statistic is then exact
            model.model.embed_tokens.weight[:] = model.model.embed_tokens.weight[0]
    return model.eval()


def noisy_copy(model, noise, seed, *, constant=False):
    copy = llama(model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers, 0)
    copy.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
        if constant:
            copy.model.embed_tokens.weight[:] = copy.model.embed_tokens.weight[0]
    return copy


def calibrate(target, drafter, sequences, start):
    rows = acceptance_per_child(
        target, drafter, sequences, [start] * len(sequences), temperature=1.0, children=3, samples=32
    )
    return ChainAcceptance.from_rows(rows[..., 0], 1.0, child_rows=rows, samples=32)


def check(df, acc):
    assert df["within"].all(), df.to_string()
    assert (df["steps"] > 1000).all()
    # negative control: the tree predicted as its chain alone (its extra children ignored)
    tree = df[df["tree"] == str(STAR_THEN_CHAIN)].iloc[0]
    chain_only = rejection_tau(make_tree(CHAIN), acc.per_child)
    combined = np.hypot(tree["measured_se"], tree["predicted_se"])
    assert abs(tree["measured_tokens_per_step"] - chain_only) > VALIDATION_SIGMAS * combined


def test_tree_tau_matches_the_decoder_when_the_statistic_is_exact():
    target = llama(12, 16, 1, 0, constant=True)
    draft = noisy_copy(target, 0.5, 1, constant=True)
    drafter = DraftModel(draft, max_depth=3)
    g = torch.Generator().manual_seed(2)
    acc = calibrate(target, drafter, torch.randint(0, 12, (16, 12), generator=g).tolist(), 0)
    assert 0.4 < acc.alpha_per_depth[0] < 0.9  # neither trivial nor hopeless
    prompts = torch.randint(0, 12, (200, 5), generator=g).tolist()
    df = validate_rejection_tau(
        target, drafter, acc, [STAR_THEN_CHAIN, CHAIN], prompts, max_new_tokens=40, batch_size=100, seed=3
    )
    check(df, acc)


def test_tree_tau_matches_the_decoder_on_a_prefix_dependent_pair():
    # Calibrated along continuations sampled from the target (docs/statistics.md#positional-acceptance-of-a-tree); the
    # per-depth product is an approximation here, which the 4
    # standard errors of 300 prompts x 24 tokens do not resolve on these models.
    target = llama(64, 32, 2, 0)
    drafter = DraftModel(noisy_copy(target, 0.02, 1), max_depth=3)
    n, new_tokens = 300, 24
    prompts = torch.randint(3, 64, (n, 7), generator=torch.Generator().manual_seed(6))
    plain = SpeculativeDecoder(target, drafter, make_tree([], allow_empty=True), timing=False)
    sampled = plain.generate(prompts, max_new_tokens=new_tokens + 4, temperature=1.0, seed=1).tokens
    acc = calibrate(target, drafter, [p + c for p, c in zip(prompts.tolist(), sampled, strict=True)], 6)
    df = validate_rejection_tau(
        target, drafter, acc, [STAR_THEN_CHAIN, CHAIN], prompts.tolist(), max_new_tokens=new_tokens, batch_size=100
    )
    check(df, acc)


def test_tokens_per_step_standard_error_by_hand():
    # two sequences: (2, 3) and (1, 1, 1, 0 = finished): R = 8 / 5; residuals a_i - R n_i =
    # 5 - 3.2 = 1.8 and 3 - 4.8 = -1.8; var = 2 / 1 x (1.8^2 + 1.8^2) / 5^2
    accepted = np.array([[2, 1], [3, 1], [0, 1]])
    mean, se, steps = tokens_per_step_with_stderr(accepted)
    assert mean == pytest.approx(1.6) and steps == 5
    assert se == pytest.approx(np.sqrt(2 * 2 * 1.8**2 / 25))
    mean, se, steps = tokens_per_step_with_stderr(np.array([[1], [3]]))  # one sequence: i.i.d. steps
    assert (mean, steps) == (2.0, 2) and se == pytest.approx(np.std([1, 3], ddof=1) / np.sqrt(2))
