"""Hydra++ "prefix-mlp" heads (calibration.drafters.hydra): a checkpoint written here in exactly
the authors' key layout (their HydraPrefixMLP: every block and projection behind a Dropout in a
Sequential, a one-layer LlamaModel as ``prefix_embeding_layer``) loads, and its prefix layer and
heads equal a hand-written implementation of the equations (RMSNorm, rotary, causal GQA
attention, SwiGLU MLP, final norm); calibration equals a slow per-position reference; the
decoder's prefix cache gives at every step the prefix output of the whole sequence so far; greedy
decoding stays lossless; the CLI calibrates and decodes with such a directory."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig

from calibration.decoder import TreeDecoder
from calibration.demo_files import DEMO_VALIDATION_PROMPTS as DEMO_VALIDATION
from calibration.drafters import HydraHeads, load_drafter
from calibration.greedy import greedy_decode
from calibration.kv_cache import KVCache
from calibration.labels import label_ranks, label_rows
from calibration.models import load_model, tiny_model_for_tests
from roofline.grid import draft_rows_by_prefix, speedup_grid
from roofline.hardware import EfficiencyCurve, HardwareProfile
from roofline.latency import memory_required_bytes, step_time_s
from roofline.ops import DraftWork, operators
from roofline.shapes import ModelShape
from treeopt.accuracy import load_accuracy
from treeopt.cli import main
from treeopt.drafter_cost import DraftCost
from treeopt.errors import UserError
from treeopt.fileio import write_json
from treeopt.tree import make_tree

VOCAB, HIDDEN, HEADS, KV_HEADS, INTER = 64, 32, 4, 2, 64
HEAD_DIM = HIDDEN // HEADS
TREES = [
    [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0]],
    [[0], [2], [0, 0], [2, 1], [2, 1, 3], [0, 0, 0]],
    [[0], [0, 0], [0, 0, 0]],
]


def rand(*shape, g, scale=0.3):
    return torch.randn(*shape, generator=g) * scale


def prefix_state_dict(num_heads, num_layers, g):
    """A grounded prefix-mlp state dict with the authors' keys: Sequential(Dropout, ResBlock(h,
    k + 1), [Dropout, ResBlock(h)] * (L - 1)) per head, whose later blocks are ONE module in
    their code (list repetition), so the file holds the same tensors under each index; the
    projections Sequential(Dropout, Linear); the one-layer LlamaModel with its unused
    embed_tokens and an old-style rotary buffer."""
    h, v = HIDDEN, VOCAB
    sd = {"input_embed_fn.weight": rand(v, h, g=g)}
    for k in range(num_heads):
        width = (k + 2) * h
        sd[f"hydra_mlp.{k}.1.linear.weight"] = rand(h, width, g=g)
        sd[f"hydra_mlp.{k}.1.linear.bias"] = rand(h, g=g)
        sd[f"hydra_mlp.{k}.1.res_connection.weight"] = rand(h, width, g=g)
        sd[f"hydra_mlp.{k}.1.res_connection.bias"] = rand(h, g=g)
        shared_w, shared_b = rand(h, h, g=g), rand(h, g=g)
        for j in range(1, num_layers):
            sd[f"hydra_mlp.{k}.{2 * j + 1}.linear.weight"] = shared_w.clone()
            sd[f"hydra_mlp.{k}.{2 * j + 1}.linear.bias"] = shared_b.clone()
        sd[f"hydra_lm_head.{k}.1.weight"] = rand(v, h, g=g)
        sd[f"hydra_lm_head.{k}.1.bias"] = rand(v, g=g)
    p = "prefix_embeding_layer."
    sd[p + "embed_tokens.weight"] = rand(v, h, g=g)
    sd[p + "layers.0.self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, h, g=g)
    sd[p + "layers.0.self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, h, g=g)
    sd[p + "layers.0.self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, h, g=g)
    sd[p + "layers.0.self_attn.o_proj.weight"] = rand(h, HEADS * HEAD_DIM, g=g)
    sd[p + "layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(HEAD_DIM // 2)
    sd[p + "layers.0.mlp.gate_proj.weight"] = rand(INTER, h, g=g)
    sd[p + "layers.0.mlp.up_proj.weight"] = rand(INTER, h, g=g)
    sd[p + "layers.0.mlp.down_proj.weight"] = rand(h, INTER, g=g)
    sd[p + "layers.0.input_layernorm.weight"] = 1 + rand(h, g=g, scale=0.1)
    sd[p + "layers.0.post_attention_layernorm.weight"] = 1 + rand(h, g=g, scale=0.1)
    sd[p + "norm.weight"] = 1 + rand(h, g=g, scale=0.1)
    return sd


def write_prefix(path, num_heads=4, num_layers=3, seed=0):
    sd = prefix_state_dict(num_heads, num_layers, torch.Generator().manual_seed(seed))
    path.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path / "hydra_lm_head.pt")
    write_json(
        path / "config.json",
        {
            "hydra_num_heads": num_heads,
            "hydra_num_layers": num_layers,
            "hydra_head_arch": "prefix-mlp",
            "grounded_heads": True,
            "hidden_state_offset": 0,
            "base_model_name_or_path": "tiny",
        },
    )
    return sd


# ---- the equations, written out ------------------------------------------------------------


def rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate(x, positions, theta=10000.0):
    """Llama's rotary embedding (the half-split form transformers uses): pairs (i, i + d/2)
    rotated by position * theta^(-2i/d)."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * freq[None]  # (n, d/2)
    cos, sin = torch.cos(angle).float()[:, None], torch.sin(angle).float()[:, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def prefix_reference(sd, hidden, eps):
    """The prefix layer over one sequence's hidden states (n, h), positions 0..n-1, causal."""
    p = "prefix_embeding_layer.layers.0."
    n = hidden.shape[0]
    x = rms(hidden, sd[p + "input_layernorm.weight"], eps)
    q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(n, HEADS, HEAD_DIM)
    k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    pos = torch.arange(n)
    q, k = rotate(q, pos), rotate(k, pos)
    heads = []
    for i in range(HEADS):
        j = i // (HEADS // KV_HEADS)  # the query head's KV group
        scores = q[:, i] @ k[:, j].T / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v[:, j])
    h1 = hidden + torch.cat(heads, -1) @ sd[p + "self_attn.o_proj.weight"].T
    m = rms(h1, sd[p + "post_attention_layernorm.weight"], eps)
    gate, up = m @ sd[p + "mlp.gate_proj.weight"].T, m @ sd[p + "mlp.up_proj.weight"].T
    h2 = h1 + (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return rms(h2, sd["prefix_embeding_layer.norm.weight"], eps)


def head_reference(sd, k, num_layers, h, path_tokens):
    """Head k on [h, E(path...)], the authors' indices: block 1 widened, 3, 5, ... ordinary."""
    x = torch.cat([h, *(sd["input_embed_fn.weight"][t] for t in path_tokens)])
    silu = torch.nn.functional.silu
    lin = f"hydra_mlp.{k}.1."
    x = (
        x @ sd[lin + "res_connection.weight"].T
        + sd[lin + "res_connection.bias"]
        + silu(x @ sd[lin + "linear.weight"].T + sd[lin + "linear.bias"])
    )
    for j in range(1, num_layers):
        blk = f"hydra_mlp.{k}.{2 * j + 1}."
        x = x + silu(x @ sd[blk + "linear.weight"].T + sd[blk + "linear.bias"])
    return x @ sd[f"hydra_lm_head.{k}.1.weight"].T + sd[f"hydra_lm_head.{k}.1.bias"]


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"),
        vocab=VOCAB,
        hidden=HIDDEN,
        layers=2,
        heads=HEADS,
        kv_heads=KV_HEADS,
        num_medusa_heads=3,
    )
    sd = write_prefix(path / "hydra", num_heads=4, num_layers=3)
    torch.set_num_threads(1)
    return path, sd


def test_prefix_layout_forward_equals_the_equations(tiny):
    path, sd = tiny
    config = AutoConfig.from_pretrained(path)
    heads = load_drafter(path / "hydra", dtype=torch.float32, base_config=config)
    assert heads.kind == "hydra" and heads.prefix_layer and heads.sequential and heads.num_layers == 3
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 7, HIDDEN, generator=g)
    with torch.no_grad():
        out = heads.context_states(hidden, torch.ones(1, 7, dtype=torch.bool), torch.arange(7)[None])
    expected = prefix_reference(sd, hidden[0], config.rms_norm_eps)
    assert torch.allclose(out[0], expected, atol=1e-5), (out[0] - expected).abs().max()
    path_tokens = [5, 17, 33, 2, 40]
    with torch.no_grad():
        logits = heads.teacher_forced_logits(out[0, -1:], torch.tensor([path_tokens[:4]]))[0]
    for k in range(4):
        want = head_reference(sd, k, 3, expected[-1], path_tokens[: k + 1])
        assert torch.allclose(logits[k], want, atol=1e-4), k


def test_ungrounded_prefix_heads_read_the_prefix_output_alone(tiny, tmp_path):
    """grounded_heads false: head k is Sequential([Dropout, ResBlock(h)] * L) on the prefix
    output (the authors' training forward), keys hydra_mlp.{k}.{1,3,...}.linear.*."""
    path, sd = tiny
    config = AutoConfig.from_pretrained(path)
    g = torch.Generator().manual_seed(3)
    flat = {k: v for k, v in sd.items() if not k.startswith(("hydra_mlp.", "hydra_lm_head."))}
    for k in range(2):
        w, b = rand(HIDDEN, HIDDEN, g=g), rand(HIDDEN, g=g)
        for j in range(2):  # one module repeated in their code: the same tensors at 1 and 3
            flat[f"hydra_mlp.{k}.{2 * j + 1}.linear.weight"], flat[f"hydra_mlp.{k}.{2 * j + 1}.linear.bias"] = w, b
        flat[f"hydra_lm_head.{k}.1.weight"], flat[f"hydra_lm_head.{k}.1.bias"] = (
            rand(VOCAB, HIDDEN, g=g),
            rand(VOCAB, g=g),
        )
    (tmp_path / "u").mkdir()
    torch.save(flat, tmp_path / "u" / "hydra_lm_head.pt")
    write_json(
        tmp_path / "u" / "config.json",
        {"hydra_num_heads": 2, "hydra_num_layers": 2, "hydra_head_arch": "prefix-mlp", "grounded_heads": False},
    )
    heads = load_drafter(tmp_path / "u", dtype=torch.float32, base_config=config)
    hidden = torch.randn(1, 5, HIDDEN, generator=g)
    with torch.no_grad():
        p_t = heads.context_states(hidden, torch.ones(1, 5, dtype=torch.bool), torch.arange(5)[None])[0, -1:]
        logits = heads.teacher_forced_logits(p_t, torch.tensor([[7, 9]]))[0]
    expected_p = prefix_reference(sd, hidden[0], config.rms_norm_eps)[-1]
    silu = torch.nn.functional.silu
    for k in range(2):
        x = expected_p
        for j in range(2):
            x = x + silu(
                x @ flat[f"hydra_mlp.{k}.{2 * j + 1}.linear.weight"].T + flat[f"hydra_mlp.{k}.{2 * j + 1}.linear.bias"]
            )
        want = x @ flat[f"hydra_lm_head.{k}.1.weight"].T + flat[f"hydra_lm_head.{k}.1.bias"]
        assert torch.allclose(logits[k], want, atol=1e-4), k


def test_prefix_layer_with_padding_and_a_cache_equals_one_pass(tiny):
    """Left padding is invisible, and feeding a sequence in two pieces through the cache gives
    the outputs of one pass (positions continue)."""
    path, sd = tiny
    config = AutoConfig.from_pretrained(path)
    heads = load_drafter(path / "hydra", dtype=torch.float32, base_config=config)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(1, 9, HIDDEN, generator=g)
    expected = prefix_reference(sd, hidden[0], config.rms_norm_eps)
    padded = torch.cat([torch.randn(1, 3, HIDDEN, generator=g), hidden], 1)
    valid = torch.tensor([[False] * 3 + [True] * 9])
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    cache = KVCache(1)
    with torch.no_grad():
        first = heads.context_states(padded[:, :8], valid[:, :8], positions[:, :8], cache=cache)
        second = heads.context_states(
            padded[:, 8:], valid[:, 8:], positions[:, 8:], past_valid=valid[:, :8], cache=cache
        )
    out = torch.cat([first, second], 1)[0, 3:]
    assert torch.allclose(out, expected, atol=1e-5)


def test_prefix_checkpoint_round_trips_in_the_authors_layout(tiny, tmp_path):
    path, sd = tiny
    config = AutoConfig.from_pretrained(path)
    heads = load_drafter(path / "hydra", dtype=torch.float32, base_config=config)
    heads.save_pretrained(tmp_path / "out", dtype=torch.float32, format="pt")
    saved = torch.load(tmp_path / "out" / "hydra_lm_head.pt", weights_only=True)
    # everything the authors' file holds, except the unused embed_tokens and the rotary buffer
    ignored = {
        "prefix_embeding_layer.embed_tokens.weight",
        "prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq",
    }
    assert set(saved) == set(sd) - ignored
    for key in saved:
        assert torch.equal(saved[key], sd[key]), key
    again = load_drafter(tmp_path / "out", dtype=torch.float32, base_config=config)
    assert again.prefix_layer and again.head_arch == "prefix-mlp"


def test_prefix_bad_inputs_are_one_line_errors(tiny, tmp_path):
    path, sd = tiny
    with pytest.raises(UserError, match="needs the base model's config"):
        load_drafter(path / "hydra")
    bad = tmp_path / "bad"
    write_prefix(bad)
    state = torch.load(bad / "hydra_lm_head.pt", weights_only=True)
    del state["prefix_embeding_layer.layers.0.mlp.up_proj.weight"]
    torch.save(state, bad / "hydra_lm_head.pt")
    config = AutoConfig.from_pretrained(path)
    with pytest.raises(UserError, match="lack key 'prefix_embeding_layer.layers.0.mlp.up_proj.weight'"):
        load_drafter(bad, base_config=config)


# ---- calibration ----------------------------------------------------------------------------


def test_prefix_calibration_equals_slow_per_position_reference(tiny):
    path, _ = tiny
    lm = load_model(str(path), device="cpu", dtype="float32", drafter="hydra")
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (9, 14, 4)]
    starts = [2, 3, 0]
    ranks = label_ranks(lm.model, lm.heads, seqs, starts, chunk_elements=5 * VOCAB)
    seq, t, has = label_rows([len(s) for s in seqs], starts, lm.heads.num_heads)
    for r in range(len(seq)):  # one position at a time: the prefix layer over x_0..x_t alone
        x = seqs[seq[r]][: t[r] + 1]
        with torch.no_grad():
            base = lm.model.model(input_ids=torch.tensor([x])).last_hidden_state
            h = lm.heads.context_states(base, torch.ones(1, len(x), dtype=torch.bool), torch.arange(len(x))[None])
        for k in range(lm.heads.num_heads):
            if not has[r, k]:
                assert ranks[r, k] == -1
                continue
            full = seqs[seq[r]]
            with torch.no_grad():
                logits = lm.heads.teacher_forced_logits(h[0, -1:], torch.tensor([full[t[r] + 1 : t[r] + k + 2]]))[0, k]
            label = full[t[r] + k + 2]
            assert ranks[r, k] == int((logits > logits[label]).sum()), (r, k)
    assert (ranks[has] >= 0).all()


# ---- decoding -------------------------------------------------------------------------------


def prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids, mask


@pytest.mark.parametrize("verification", ["tree", "candidates"])
@pytest.mark.parametrize("lengths", [(7,), (5, 9, 3)])
def test_greedy_decoding_with_prefix_heads_is_lossless(tiny, lengths, verification):
    path, _ = tiny
    ids, mask = prompts(lengths, seed=len(lengths))
    lm = load_model(str(path), device="cpu", dtype="float32", drafter="hydra")
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=24)
    # the ragged batch verifies through the split attention (docs/decoder.md#split-verification-attention)
    attention = "split" if len(lengths) > 1 else None
    for paths in TREES:
        decoder = TreeDecoder(
            lm.model, lm.heads, make_tree(paths), topk=4, timing=False, verification=verification, attention=attention
        )
        result = decoder.generate(ids, mask, max_new_tokens=24)
        assert result.tokens == reference, paths
        assert decoder.attention == (attention or "masked")


class OraclePrefixHeads(HydraHeads):
    """Prefix-mlp heads whose guesses come from a table of the true continuations (keyed by
    the last two path tokens), so that steps accept several tokens and a batch gets holes;
    the prefix layer and its cache are the real ones."""

    table: dict = {}

    def begin(self, hidden, root):
        return (*super().begin(hidden, root), torch.stack([torch.full_like(root, -1), root], 1))

    def depth_logits(self, state, depth):
        logits = -torch.arange(VOCAB, dtype=torch.float32).repeat(len(state[-1]), 1)
        for i, (a, b) in enumerate(state[-1].tolist()):  # a test oracle, not the code under test
            nxt = self.table.get((a, b), self.table.get((b,), 3))
            logits[i, nxt] = 1.0
        return logits, state

    def child_state(self, carry, depth, tokens):
        return (*super().child_state(carry[:-1], depth, tokens), torch.stack([carry[-1][:, 1], tokens], 1))


@pytest.mark.parametrize("verification", ["tree", "candidates"])
def test_prefix_cache_gives_the_prefix_output_of_the_whole_sequence(tiny, verification):
    """After the prefill and every step, each live sequence's drafting state equals the prefix
    layer run once over the base hidden states of its whole sequence so far, taken at the token
    that produced its root: the cache kept the accepted tokens, in order, across holes and a
    dropped sequence."""
    path, _ = tiny
    lm = load_model(str(path), device="cpu", dtype="float32", drafter="hydra")
    heads = OraclePrefixHeads(HIDDEN, VOCAB, 4, 3, prefix_config=lm.model.config)
    heads.load_state_dict(lm.heads.state_dict())
    heads.eval()
    lengths = (5, 9, 3)
    ids, mask = prompts(lengths, seed=3)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=30)
    rows = [ids[i][mask[i].bool()].tolist() + reference[i] for i in range(3)]
    table = {}
    for j, seq in enumerate(rows):
        for p in range(1, len(seq) - 1):
            if j != 1 or p % 4:  # sequence 1's guesses go wrong now and then: ragged acceptance
                table[(seq[p - 1], seq[p])] = seq[p + 1]
                table[(seq[p],)] = seq[p + 1]
    OraclePrefixHeads.table = table
    decoder = TreeDecoder(lm.model, heads, make_tree(TREES[0]), topk=4, timing=False, verification=verification)
    state = decoder.prefill(ids, mask, capacity=64)
    seen = [ids[i][mask[i].bool()].tolist() for i in range(3)]  # tokens whose hidden states are in
    roots = state.root.tolist()
    accepted = []

    def check():
        for live, i in enumerate(state.rows.tolist()):
            with torch.no_grad():
                base = lm.model.model(input_ids=torch.tensor([seen[i]])).last_hidden_state
                want = heads.context_states(
                    base, torch.ones(1, len(seen[i]), dtype=torch.bool), torch.arange(len(seen[i]))[None]
                )[0, -1]
            assert torch.allclose(state.hidden[live], want, atol=1e-4), (i, len(seen[i]))

    check()
    for step in range(5):
        new, n_keep = decoder.step(state)
        for live, i in enumerate(state.rows.tolist()):
            kept = new[live, : n_keep[live]].tolist()
            seen[i] += [roots[i]] + kept[:-1]
            roots[i] = kept[-1]
        accepted.append(n_keep.tolist())
        check()
        if step == 1:
            decoder._drop_finished(state, [False, True, False])
    for i in (0, 2):
        assert seen[i] + [roots[i]] == rows[i][: len(seen[i]) + 1]
    flat = [a for row in accepted for a in row]
    assert max(flat) >= 3 and len(set(accepted[0])) > 1  # deep and ragged acceptance happened


def test_candidate_rows_keep_the_tree_forms_state(tiny):
    """Verified as candidate sequences, every step accepts the tree form's tokens and leaves
    the same drafting state (the prefix layer fed from the chosen row), also where the
    accepted row is not the first."""
    path, _ = tiny
    lm = load_model(str(path), device="cpu", dtype="float32", drafter="hydra")
    heads = OraclePrefixHeads(HIDDEN, VOCAB, 4, 3, prefix_config=lm.model.config)
    heads.load_state_dict(lm.heads.state_dict())
    heads.eval()
    ids, mask = prompts((5, 9), seed=4)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=30)
    rows = [ids[i][mask[i].bool()].tolist() + reference[i] for i in range(2)]
    OraclePrefixHeads.table = {
        key: seq[p + 1] for seq in rows for p in range(1, len(seq) - 1) for key in ((seq[p - 1], seq[p]), (seq[p],))
    }
    tree = make_tree([[0], [1], [0, 0], [1, 1], [1, 1, 1]])  # rows: [1, 1, 1] first, then [0, 0]
    decoders = [
        TreeDecoder(lm.model, heads, tree, topk=4, timing=False, verification=v) for v in ("tree", "candidates")
    ]
    states = [d.prefill(ids, mask, capacity=64) for d in decoders]
    deep = 0
    for _ in range(4):
        (new_t, keep_t), (new_c, keep_c) = (d.step(st) for d, st in zip(decoders, states, strict=True))
        assert torch.equal(keep_t, keep_c)
        for i in range(2):
            assert new_t[i, : keep_t[i]].tolist() == new_c[i, : keep_c[i]].tolist()
        assert torch.allclose(states[0].hidden, states[1].hidden, atol=1e-4)
        deep += int((keep_c >= 3).sum())
    assert deep  # accepted along [0, 0], the second candidate row


# ---- the CLI --------------------------------------------------------------------------------


def test_cli_calibrates_and_decodes_with_a_prefix_checkpoint(tiny, tmp_path, capsys):
    path, _ = tiny
    main(
        [
            "decode",
            "--model",
            str(path),
            "--drafter",
            "hydra",
            "--tree",
            "[[0], [0, 0], [1]]",
            "--prompt",
            "def f(x):",
            "--max-new-tokens",
            "8",
            "--topk",
            "4",
            "--device",
            "cpu",
            "--compare",
        ]
    )
    assert "identical to plain greedy: yes" in capsys.readouterr().out
    main(
        [
            "calibrate",
            "--model",
            str(path),
            "--drafter",
            "hydra",
            "--data",
            "demo",
            "--max-prompts",
            "3",
            "--steps",
            "8",
            "--topk",
            "4",
            "--device",
            "cpu",
            "-q",
            "-o",
            str(tmp_path / "acc.json"),
        ]
    )
    table = load_accuracy(tmp_path / "acc.json")
    assert table.num_heads == 4  # one row per Hydra head


# ---- the cost: one decoder layer per step on the accepted tokens, over the context -----------

SHAPE = ModelShape(
    "tiny",
    layers=2,
    hidden=HIDDEN,
    intermediate=INTER,
    heads=HEADS,
    kv_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    vocab=VOCAB,
    dtype="fp32",
    dtype_bytes=4,
)
PREFIX_COST = DraftCost("hydra", True, 2, 1, HIDDEN, HIDDEN, VOCAB, grounded=True, prefix_layer=True)
MATMULS = ("q_proj", "k_proj", "v_proj", "qk", "pv", "o_proj", "gate", "up", "down")


def prefix_ops(batch, tokens, context):
    work = DraftWork(PREFIX_COST, np.array([1, 1]), prefix_tokens_per_sequence=tokens)
    ops = operators(SHAPE, work, batch=batch, tokens=5, context=context)
    return {o.name[len("prefix_layer.") :]: o for o in ops if o.name.startswith("prefix_layer.")}


@pytest.mark.parametrize(("batch", "tokens", "context"), [(1, 1, 6), (3, 4, 10)])
def test_prefix_layer_matmul_flops_equal_the_layers_own_count(tiny, batch, tokens, context):
    """The roofline's matrix FLOPs of the prefix layer (weights, QK^T, PV) equal those torch
    counts while the real layer reads `tokens` new positions per sequence over a cache of
    `context` entries, once per step."""
    path, _ = tiny
    config = AutoConfig.from_pretrained(path)
    heads = HydraHeads(HIDDEN, VOCAB, 2, 1, prefix_config=config).eval()
    # eager attention: its QK^T and PV are matmuls torch's counter sees (CPU sdpa it does not)
    heads.prefix_embeding_layer.layers[0].self_attn.config._attn_implementation = "eager"
    cache = KVCache(1)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        heads.context_states(
            torch.randn(batch, context, HIDDEN, generator=g),
            torch.ones(batch, context, dtype=torch.bool),
            torch.arange(context).expand(batch, -1),
            cache=cache,
        )
        with FlopCounterMode(display=False) as counter:
            heads.context_states(
                torch.randn(batch, tokens, HIDDEN, generator=g),
                torch.ones(batch, tokens, dtype=torch.bool),
                (context + torch.arange(tokens)).expand(batch, -1),
                past_valid=torch.ones(batch, context, dtype=torch.bool),
                cache=cache,
            )
    ops = prefix_ops(batch, tokens, context)
    assert sum(float(ops[n].flops) * ops[n].count for n in MATMULS) == counter.get_total_flops()
    assert all(ops[n].count == 1 for n in ops)  # one layer, once per step


def test_prefix_layer_cost_by_hand():
    """b = 3 sequences, p = 2 accepted tokens each, s = 10 cached: q_proj 2 b p h (nh d) FLOPs
    and β (h nh d + b p h + b p nh d) bytes; attention 2 b nh p (s + p) d; the final norm 4 b p h;
    an expected p = 2.5 costs the mean of p = 2 and p = 3 in every token-linear operator."""
    b, p, s, h, nh, d, beta = 3, 2, 10, HIDDEN, HEADS, HEAD_DIM, 4
    ops = prefix_ops(b, p, s)
    assert float(ops["q_proj"].flops) == 2 * b * p * h * nh * d
    assert float(ops["q_proj"].bytes) == beta * (h * nh * d + b * p * h + b * p * nh * d)
    assert float(ops["qk"].flops) == 2 * b * nh * p * (s + p) * d
    assert float(ops["final_norm"].flops) == 4 * b * p * h
    assert float(ops["down"].flops) == 2 * b * p * INTER * h
    half = prefix_ops(b, 2.5, s)
    lo, hi = prefix_ops(b, 2, s), prefix_ops(b, 3, s)
    for name in ("q_proj", "gate", "down", "final_norm", "act"):
        assert float(half[name].flops) == pytest.approx((float(lo[name].flops) + float(hi[name].flops)) / 2)
        assert float(half[name].bytes) == pytest.approx((float(lo[name].bytes) + float(hi[name].bytes)) / 2)


def test_grid_charges_the_prefix_layer_on_tau_tokens():
    """In the speedup grid the prefix layer of the tree of n nodes reads τ[n] tokens per
    sequence: the step time there is that of a step whose prefix layer reads τ[n]; with no
    prefix layer a different τ changes nothing."""
    hw = HardwareProfile(
        name="bandwidth-only",
        peak_flops={"fp32": 1e30},
        vector_flops=1e30,
        bandwidth_bytes_per_s=1e9,
        capacity_bytes=1e12,
        kernel_overhead_s=0.0,
        gemm_efficiency=EfficiencyCurve((1.0,), (1.0,)),
    )
    tree = make_tree([[0], [1], [0, 0]])
    rows = draft_rows_by_prefix(tree, 2)
    tau = np.array([1.0, 1.5, 1.8, 2.6])
    grid = speedup_grid(SHAPE, DraftWork(PREFIX_COST, rows), hw, tau, batches=[2], contexts=[16])
    for n in (1, 2, 3):
        work = DraftWork(PREFIX_COST, rows[n], prefix_tokens_per_sequence=tau[n])
        want = step_time_s(SHAPE, work, hw, batch=2, tokens=n + 1, context=16)
        assert float(grid.step_time_s[n]) == pytest.approx(float(want))
    one = step_time_s(SHAPE, DraftWork(PREFIX_COST, rows[3]), hw, batch=2, tokens=4, context=16)
    assert float(grid.step_time_s[3]) > float(one)  # 2.6 tokens read cost more than 1


def test_verify_forward_runs_the_prefix_layer_once(tiny):
    """The sweep's timed step (`verify_forward`) includes the prefix layer: one call on one
    token per sequence, its stand-in cache back at the context length afterwards."""
    path, _ = tiny
    lm = load_model(str(path), device="cpu", dtype="float32", drafter="hydra")
    decoder = TreeDecoder(lm.model, lm.heads, make_tree(TREES[0]), topk=4, timing=False)
    ids, mask = prompts((6, 6), seed=4)
    state = decoder.prefill(ids, mask, capacity=32)
    calls = []
    hook = lm.heads.prefix_embeding_layer.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    try:
        for _ in range(2):
            logits, tokens = decoder.verify_forward(
                state.cache, state.root[:, None].repeat(1, decoder.q), state.valid, state.next_pos
            )
            state.cache.crop(-decoder.q)
    finally:
        hook.remove()
    assert calls == [torch.Size([2, 1, HIDDEN])] * 2 and tokens.shape == (2, decoder.q)
    assert decoder._timing_draft_cache.layers[0].length == state.valid.shape[1]


def test_cli_run_with_a_prefix_checkpoint(tiny, tmp_path, capsys):
    """calibrate -> sweep -> validate -> report with prefix-mlp heads, tiny sizes."""
    path, _ = tiny
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--model",
                str(path),
                "--drafter",
                "hydra",
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--data",
                "demo",
                "--validation-data",
                str(DEMO_VALIDATION),
                "--steps",
                "8",
                "--sizes",
                "0,1,4",
                "--batch",
                "1,2",
                "--context",
                "16",
                "--repeats",
                "5",
                "--time-budget",
                "0",
                "--quick",
                "-o",
                str(tmp_path / "run"),
            ]
        )
        raise SystemExit(0)
    assert (exc.value.code or 0) == 0
    assert "100.00% of generated tokens identical" in capsys.readouterr().out  # a result: stdout
    prediction = (tmp_path / "run" / "prediction" / "index.md").read_text()
    assert "4 heads x 3 layer(s) + a prefix decoder layer" in prediction


def test_memory_adds_the_prefix_layer_and_its_cache():
    """One base layer's weights and a norm, β (h nh d + 2 h nkv d + nh d h + 3 h i + 2 h + h),
    and one layer of K and V for the b (s + q) tokens, β 2 nkv d b (s + q)."""
    b, q, s, h, beta = 2, 5, 40, HIDDEN, 4
    rows = np.array([1, 2])
    plain = DraftCost("hydra", True, 2, 1, HIDDEN, HIDDEN, VOCAB, grounded=True)
    with_prefix = memory_required_bytes(SHAPE, DraftWork(PREFIX_COST, rows), batch=b, tokens=q, context=s)
    without = memory_required_bytes(SHAPE, DraftWork(plain, rows), batch=b, tokens=q, context=s)
    layer = h * HEADS * HEAD_DIM + 2 * h * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * h + 3 * h * INTER + 2 * h
    assert float(with_prefix - without) == beta * (layer + h) + beta * 2 * KV_HEADS * HEAD_DIM * b * (s + q)
