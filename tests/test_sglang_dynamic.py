"""SGLang's dynamic EAGLE tree (docs/decoder.md#sglangs-dynamic-tree,
docs/statistics.md#dynamic-trees): the pool and draft against SGLang's drafting code transcribed
here (`select_top_k_tokens`, `organize_draft_results` and the parent rule of
`build_tree_kernel_efficient`, python/sglang/srt/speculative/eagle_utils.py and
sgl-kernel/csrc/speculative/eagle_utils.cu), the static expectation `treeopt.engines.sglang_tree`
on a drafter whose probabilities do not depend on the path, tau from recorded pools against a
hand-derived case and a brute force, and on the demo EAGLE-3 draft the predicted tau against
the reference decoder drafting SGLang's way (lossless, and equal walk for walk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treeopt.dynamic_tree import dynamic_accepted, dynamic_tau
from treeopt.engines import sglang_tree
from treeopt.errors import UserError

VOCAB = 40


class HashDrafter:
    """A sequential drafter whose logits at a node are a fixed random row chosen by a hash of
    the node's path (or, `by_depth`, by its depth only)."""

    kind, sequential, num_heads, vocab_size = "hash", True, 6, VOCAB

    def __init__(self, seed: int, *, by_depth: bool = False, rows: int = 997):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(rows, VOCAB, generator=g) * 2.0
        self.by_depth = by_depth

    def begin(self, hidden, root):
        return (root.long() + 1000 * hidden.long(),)

    def depth_logits(self, state, depth):
        key = torch.full_like(state[0], depth) if self.by_depth else state[0] * 7 + depth
        return self.table[key % self.table.shape[0]], state

    def child_state(self, carry, depth, tokens):
        return ((carry[0] * 31 + tokens) % 1_000_003,)


def sglang_transcribed(drafter, hidden, root, steps, topk, num_draft_tokens):
    """SGLang's EAGLE drafting, transcribed: returns per row the drafted nodes as token paths
    (tuples from the root's child down) and the flat score list."""
    b = len(root)
    state = drafter.begin(hidden, root)
    logits, _ = drafter.depth_logits(state, 0)
    topk_p, topk_index = torch.softmax(logits.float(), -1).topk(topk, dim=-1)
    hidden_states = state[0]
    score_list, token_list, parents_list = [], [], []
    scores = None
    for i in range(steps):
        # select_top_k_tokens
        if i == 0:
            input_ids = topk_index.flatten()
            hidden_states = hidden_states.repeat_interleave(topk, dim=0)
            scores = topk_p
            tree_info = (topk_p.unsqueeze(1), topk_index, torch.arange(-1, topk).unsqueeze(0).repeat(b, 1))
        else:
            expand_scores = torch.mul(scores.unsqueeze(2), topk_p.reshape(-1, topk, topk))
            topk_cs_p, topk_cs_index = expand_scores.flatten(start_dim=1).topk(topk, dim=-1)
            scores = topk_cs_p
            topk_index = topk_index.reshape(-1, topk**2)
            input_ids = torch.gather(topk_index, index=topk_cs_index, dim=1).flatten()
            selected_input_index = topk_cs_index.flatten() // topk + torch.arange(
                0, hidden_states.shape[0], step=topk
            ).repeat_interleave(topk)
            hidden_states = hidden_states[selected_input_index]
            tree_info = (expand_scores, topk_index, topk_cs_index + (topk**2 * (i - 1) + topk))
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        if i == steps - 1:
            break
        # the draft forward on input_ids from their parents' states
        child = drafter.child_state((hidden_states,), i, input_ids)
        logits, _ = drafter.depth_logits(child, i + 1)
        topk_p, topk_index = torch.softmax(logits.float(), -1).topk(topk, dim=-1)
        hidden_states = child[0]
    # organize_draft_results
    flat_scores = torch.cat(score_list, dim=1).flatten(1)
    ss_token_list = torch.cat(token_list, dim=1)
    top = torch.topk(flat_scores, num_draft_tokens - 1, dim=-1).indices.sort().values
    parent_list = torch.cat(parents_list[:-1], dim=1) if len(parents_list) > 1 else torch.empty(b, 0, dtype=torch.long)
    drafts = []
    for r in range(b):
        # build_tree_kernel_efficient: the parent of score index s is the root when s // topk is
        # 0, else the score index parent_list[s // topk]
        def path(s, r=r):
            up = int(s) // topk
            own = (int(ss_token_list[r, s]),)
            return own if up == 0 else path(int(parent_list[r, up])) + own

        drafts.append({path(s) for s in top[r].tolist()})
    return drafts, flat_scores


@pytest.mark.parametrize(("steps", "topk", "n"), [(1, 3, 3), (3, 2, 6), (4, 3, 12), (3, 4, 20), (5, 1, 6)])
def test_the_pool_and_draft_are_sglangs(steps, topk, n):
    from calibration.sglang_drafting import draft_pool, select_draft

    drafter = HashDrafter(steps * 10 + topk)
    root = torch.arange(5) * 3 + 1
    hidden = torch.arange(5)
    pool = draft_pool(drafter, drafter.begin(hidden, root), 5, steps, topk)
    n = steps + 1 if topk == 1 else n
    expected, flat = sglang_transcribed(drafter, hidden, root, steps, topk, n)
    torch.testing.assert_close(pool.scores, flat, rtol=0, atol=0)
    chosen = select_draft(pool, n)
    for r in range(5):

        def path(i, r=r):
            up = int(pool.parent[r, i])
            own = (int(pool.tokens[r, i]),)
            return own if up < 0 else path(up) + own

        assert {path(i) for i in chosen[r].tolist()} == expected[r]


@pytest.mark.parametrize(("steps", "topk", "n"), [(3, 2, 6), (4, 3, 10), (3, 4, 17)])
def test_a_path_independent_drafter_drafts_the_static_expectation(steps, topk, n):
    """With the same probabilities under every parent of a depth, SGLang's dynamic tree is the
    static one `sglang_tree` builds from those probabilities as the per-rank table."""
    from calibration.sglang_drafting import draft_pool, select_draft

    drafter = HashDrafter(7, by_depth=True)
    root = torch.ones(1, dtype=torch.long)
    pool = draft_pool(drafter, drafter.begin(0 * root, root), 1, steps, topk)
    probs = torch.softmax(drafter.table[: drafter.num_heads], -1).sort(-1, descending=True)
    rank_of = {d: {int(t): r for r, t in enumerate(probs.indices[d])} for d in range(drafter.num_heads)}

    def ranks(i):
        up = int(pool.parent[0, i])
        own = (rank_of[int(pool.depth[i]) - 1][int(pool.tokens[0, i])],)
        return own if up < 0 else ranks(up) + own

    got = {ranks(i) for i in select_draft(pool, n)[0].tolist()}
    table = probs.values[:, :topk].double().numpy()
    assert got == set(sglang_tree(table, steps, topk, n).paths)


def test_accepted_nodes_by_hand():
    # steps 2, topk 2: level 1 scores 0.6, 0.35; level 2 beams 0 and 1, children p 0.5, 0.2
    # and 0.9, 0.05: 0.30, 0.12, 0.315, 0.0175. The path goes through node 1 (0.35), then node 4
    # (0.315, the first child of beam 1).
    scores = np.array([[0.6, 0.35, 0.30, 0.12, 0.315, 0.0175]])
    on_path = np.array([[1, 4]])
    # 1 drafted node: only 0.6; 2: 0.6 and 0.35; 3: and 0.315
    assert [int(dynamic_accepted(scores, on_path, 2, 2, n)[0]) for n in (2, 3, 4, 5)] == [0, 1, 2, 2]
    assert int(dynamic_accepted(scores, on_path, 1, 2, 3)[0]) == 1  # one step: node 4 is not in the pool
    assert int(dynamic_accepted(scores, np.array([[1, -1]]), 2, 2, 6)[0]) == 1  # the path left the pool
    with pytest.raises(UserError, match="num-draft-tokens: 8 is outside 2..7 for 2 steps"):
        dynamic_accepted(scores, on_path, 2, 2, 8)
    with pytest.raises(UserError, match="pool of 6 scores"):
        dynamic_accepted(scores[:, :4], on_path, 2, 2, 3)


def test_tau_from_recorded_pools_is_the_brute_force_walk():
    g = np.random.default_rng(3)
    steps, topk = 3, 3
    m = topk + (steps - 1) * topk * topk
    rows = 400
    scores = g.random((rows, m))
    on_path = np.stack([g.integers(0, topk, rows), g.integers(topk, topk + 9, rows), g.integers(12, m, rows)], 1)
    on_path[g.random((rows, steps)) < 0.2] = -1
    sequence = np.sort(g.integers(0, 12, rows))
    for n in (2, 5, 9, 16, m + 1):
        accepted = []
        for r in range(rows):
            drafted = set(sorted(range(m), key=lambda i, r=r: -scores[r, i])[: n - 1])
            a = 0
            while a < steps and on_path[r, a] in drafted:
                a += 1
            accepted.append(a)
        assert dynamic_accepted(scores, on_path, steps, topk, n).tolist() == accepted
        tokens = walked = 0
        for s in np.unique(sequence):
            block = np.flatnonzero(sequence == s)
            t = 0
            while t < len(block):
                tokens += 1 + accepted[block[t]]
                walked += 1
                t += 1 + accepted[block[t]]
        tau, se, steps_walked = dynamic_tau(scores, on_path, sequence, steps, topk, n)
        assert (tau, steps_walked) == (pytest.approx(tokens / walked, rel=1e-12), walked)
        assert 0 < se < 0.2 or n == 2


# ---- on the demo EAGLE-3 draft --------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_eagle3():
    from calibration.demo_files import DEMO_MODEL_DIR
    from calibration.models import load_model

    torch.set_num_threads(1)
    return load_model(str(DEMO_MODEL_DIR), device="cpu", dtype="float32", drafter="eagle3")


def demo_prompts(count, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (count, 12), generator=g)


TRIPLES = [(3, 2, 4), (4, 4, 8), (5, 4, 16), (3, 1, 4)]


def test_predicted_tau_equals_the_decoder_drafting_sglangs_way(demo_eagle3):
    """Calibrated on the decoder's own greedy continuations, the walk over the recorded pools is
    the decoder's tokens per step exactly (`simulate_tokens_per_step`'s contract), and decoding
    is lossless."""
    from calibration.greedy import greedy_decode
    from calibration.labels import label_rows
    from calibration.sglang_decoder import SGLangTreeDecoder
    from calibration.sglang_drafting import pool_records

    lm = demo_eagle3
    prompts = demo_prompts(6, seed=1)
    new_tokens = 24
    reference = greedy_decode(lm.model, prompts, None, max_new_tokens=new_tokens + 8)
    sequences = [p + c for p, c in zip(prompts.tolist(), reference, strict=True)]
    starts = [prompts.shape[1] - 1] * len(sequences)
    for steps, topk, n in TRIPLES:
        scores, on_path = pool_records(lm.model, lm.heads, sequences, starts, steps=steps, topk=topk)
        seq, _, _ = label_rows([len(s) for s in sequences], starts, steps)
        predicted, _, _ = dynamic_tau(scores, on_path, seq, steps, topk, n, start_rows=new_tokens - 1)
        result = SGLangTreeDecoder(lm.model, lm.heads, steps, topk, n).generate(prompts, max_new_tokens=new_tokens)
        assert result.tokens == [r[:new_tokens] for r in reference], (steps, topk, n)
        assert predicted == pytest.approx(result.tokens_per_step, rel=1e-12), (steps, topk, n)
        assert result.tokens_per_step > 1.2  # the draft is accepted: the check is not vacuous
    # the split verification attention takes each sequence's own tree block
    split = SGLangTreeDecoder(lm.model, lm.heads, 4, 4, 8, attention="split")
    assert split.attention == "split"
    assert split.generate(prompts, max_new_tokens=new_tokens).tokens == [r[:new_tokens] for r in reference]


def test_predicted_tau_holds_on_held_out_prompts_within_the_intervals(demo_eagle3):
    """Calibrated on demo prompts, the predicted tau of a triple against the decoder's tokens
    per step on the held-out demo-validation prompts: within 3 standard errors of both (the
    prediction's over groups of sequences, the measurement's over its sequences)."""
    from calibration.data import load_prompts
    from calibration.greedy import greedy_decode
    from calibration.labels import label_rows
    from calibration.sglang_decoder import SGLangTreeDecoder
    from calibration.sglang_drafting import pool_records

    lm = demo_eagle3

    def first(data, count):
        ids = load_prompts(data, lm.tokenizer, prompt_tokens=32, max_prompts=2 * count).token_ids
        return torch.tensor([list(p) for p in ids if len(p) == 32][:count])

    calibration, held_out = first("demo", 16), first("demo-validation", 12)
    new_tokens = 24
    continuation = greedy_decode(lm.model, calibration, None, max_new_tokens=new_tokens + 8)
    sequences = [p + c for p, c in zip(calibration.tolist(), continuation, strict=True)]
    starts = [calibration.shape[1] - 1] * len(sequences)
    for steps, topk, n in [(4, 4, 8), (3, 1, 4)]:
        scores, on_path = pool_records(lm.model, lm.heads, sequences, starts, steps=steps, topk=topk)
        seq, _, _ = label_rows([len(s) for s in sequences], starts, steps)
        predicted, se, _ = dynamic_tau(scores, on_path, seq, steps, topk, n, start_rows=new_tokens - 1)
        result = SGLangTreeDecoder(lm.model, lm.heads, steps, topk, n).generate(held_out, max_new_tokens=new_tokens)
        per_sequence = np.array([row[row > 0].mean() for row in result.accepted.T])
        measured_se = per_sequence.std(ddof=1) / np.sqrt(per_sequence.size)
        assert abs(predicted - result.tokens_per_step) <= 3 * np.hypot(se, measured_se), (steps, topk, n)
        assert se < 0.15 and measured_se < 0.15  # intervals narrow enough to mean something


def test_the_sglang_decoder_refuses_what_it_cannot_draft(demo_eagle3):
    from calibration.sglang_decoder import SGLangTreeDecoder

    lm = demo_eagle3
    with pytest.raises(UserError, match="num-steps: 9 is outside 1..8"):
        SGLangTreeDecoder(lm.model, lm.heads, 9, 2, 4)
    with pytest.raises(UserError, match="num-draft-tokens: 8 is outside 2..7 for 2 steps of topk 2"):
        SGLangTreeDecoder(lm.model, lm.heads, 2, 2, 8)
    decoder = SGLangTreeDecoder(lm.model, lm.heads, 2, 2, 4)
    with pytest.raises(UserError, match="greedily only"):
        decoder.generate(demo_prompts(1, seed=0), max_new_tokens=4, temperature=0.7)


def test_the_command_predicts_what_the_decoder_measures_on_the_same_prompts(tmp_path, capsys):
    """`treeopt sglang-tau` with the calibration prompts as held-out ones: the prediction is the
    decoder's own measurement (the walk's contract), prompts of several lengths padded."""
    import pandas as pd

    from treeopt.cli import main

    out = tmp_path / "tau.csv"
    args = ["sglang-tau", "--drafter", "eagle3", "--steps", "3", "--topk", "2", "--draft-tokens", "3,6"]
    args += ["--max-prompts", "4", "--prompt-tokens", "24", "--new-tokens", "12", "--dtype", "float32"]
    main([*args, "--data", "demo", "--validate-data", "demo", "-o", str(out)])
    rows = pd.read_csv(out)
    assert rows["num_draft_tokens"].tolist() == [3, 6]
    assert rows["tau_predicted"].to_numpy() == pytest.approx(rows["tau_measured"].to_numpy(), rel=1e-12)
    assert "tau_measured" in capsys.readouterr().out


def test_the_command_refuses_a_triple_sglang_cannot_draft_before_loading(tmp_path, capsys):
    from treeopt.cli import main

    out = tmp_path / "tau.csv"
    with pytest.raises(SystemExit) as stop:
        main(["sglang-tau", "--steps", "2", "--topk", "2", "--draft-tokens", "8", "-o", str(out)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == "treeopt: error: --draft-tokens: 8 is outside 2..7 for 2 steps of topk 2"
    assert not out.exists()
