"""EAGLE-3 and EAGLE-1/2 drafts (calibration.drafters.eagle): checkpoints written in each
published layout (the authors' ``midlayer.*``/``fc``/``d2t``/``t2d`` and the speculators/vLLM
``layers.0.*`` with ``transformer_layer_config``, ``draft_vocab_size``, ``target_hidden_size``)
with random weights, their logits against a reference forward transcribed here from vLLM's
``llama_eagle3.py``/``llama_eagle.py`` and the authors' ``cnets.py``/``cnets1.py`` (a plain
causal run over the pairs (feature_i, token_{i+1}) at positions i, the draft's own output fed
back at later depths, explicit softmax attention); the d2t mapping; the auxiliary layers; the
calibration's ranks against a slow per-position reference; one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from calibration.drafters import EagleDrafter, load_drafter
from calibration.labels import label_ranks, label_rows
from calibration.models import load_model, tiny_model_for_tests
from treeopt.accuracy import load_accuracy
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.fileio import write_json

VOCAB = 64
EPS = 1e-5


def rand(*shape, g, scale=0.3):
    return torch.randn(*shape, generator=g) * scale


# ---- checkpoints in the published layouts ----------------------------------------------------


def layer_weights(prefix, h, heads, kv, hd, inter, in_features, g, eagle3=True):
    sd = {
        f"{prefix}self_attn.q_proj.weight": rand(heads * hd, in_features, g=g),
        f"{prefix}self_attn.k_proj.weight": rand(kv * hd, in_features, g=g),
        f"{prefix}self_attn.v_proj.weight": rand(kv * hd, in_features, g=g),
        f"{prefix}self_attn.o_proj.weight": rand(h, heads * hd, g=g),
        f"{prefix}mlp.gate_proj.weight": rand(inter, h, g=g),
        f"{prefix}mlp.up_proj.weight": rand(inter, h, g=g),
        f"{prefix}mlp.down_proj.weight": rand(h, inter, g=g),
        f"{prefix}post_attention_layernorm.weight": 1 + rand(h, g=g, scale=0.1),
    }
    if eagle3:
        sd[f"{prefix}input_layernorm.weight"] = 1 + rand(h, g=g, scale=0.1)
        sd[f"{prefix}hidden_norm.weight"] = 1 + rand(h, g=g, scale=0.1)
    return sd


def write_eagle3(path, *, layout, h, target_h, draft_vocab, heads=4, kv=2, hd=None, aux=None, seed=0, with_embed=False):
    """An EAGLE-3 draft in `layout` ("authors" or "speculators") with random weights; returns
    its state dict (file keys)."""
    g = torch.Generator().manual_seed(seed)
    hd = hd or h // heads
    inter = 2 * h
    prefix = "midlayer." if layout == "authors" else "layers.0."
    sd = layer_weights(prefix, h, heads, kv, hd, inter, 2 * h, g)
    sd["fc.weight"] = rand(h, 3 * target_h, g=g)
    sd["norm.weight"] = 1 + rand(h, g=g, scale=0.1)
    sd["lm_head.weight"] = rand(draft_vocab, h, g=g)
    used = torch.sort(torch.randperm(VOCAB, generator=g)[:draft_vocab]).values  # the draft's target ids
    sd["d2t"] = used - torch.arange(draft_vocab)  # target = draft id + d2t[draft id] (the authors' rule)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    sd["t2d"] = t2d
    if with_embed or h != target_h:  # a draft narrower than its model holds its own embedding
        sd["embed_tokens.weight"] = rand(VOCAB, h, g=g)
    layer = {
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "rms_norm_eps": EPS,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        **({"head_dim": hd} if hd != h // heads else {}),
    }
    path.mkdir(parents=True, exist_ok=True)
    if layout == "authors":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": draft_vocab}
        if target_h != h:
            config["target_hidden_size"] = target_h
        if aux is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux)}
        torch.save(sd, path / "pytorch_model.bin")
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {"model_type": "llama", **layer},
            "draft_vocab_size": draft_vocab,
            "norm_before_residual": False,
            "target_hidden_size": target_h,
            "eagle_aux_hidden_state_layer_ids": list(aux) if aux is not None else None,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy"},
        }
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    write_json(path / "config.json", config)
    return sd


def write_eagle1(path, *, h, heads=4, kv=2, seed=0, fc_bias=True):
    """An EAGLE-1/2 draft in the authors' layout (config: the base Llama config cut to one
    layer; keys ``layers.0.*`` without input_layernorm, ``fc.weight``/``fc.bias``)."""
    g = torch.Generator().manual_seed(seed)
    sd = layer_weights("layers.0.", h, heads, kv, h // heads, 2 * h, h, g, eagle3=False)
    sd["fc.weight"] = rand(h, 2 * h, g=g)
    if fc_bias:
        sd["fc.bias"] = rand(h, g=g)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path / "pytorch_model.bin")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "intermediate_size": 2 * h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "rms_norm_eps": EPS,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "model_type": "llama",
    }
    write_json(path / "config.json", config)
    return sd


# ---- the reference forward, transcribed ------------------------------------------------------


def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, positions, hd):
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = positions[:, None].float() * inv[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[None] + rotated * sin[None]


def reference_layer(sd, p, x, residual, positions, heads, kv, hd):
    """One Llama layer over a sequence x (T, in) causally (the authors' LlamaAttention with
    repeat_kv and an explicit softmax), residual (T, h)."""
    t = x.shape[0]
    q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(t, heads, hd).transpose(0, 1)
    k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(t, kv, hd).transpose(0, 1)
    v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(t, kv, hd).transpose(0, 1)
    q, k = rope(q, positions, hd), rope(k, positions, hd)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, heads * hd) @ sd[p + "self_attn.o_proj.weight"].T
    h = residual + attn
    m = rms(h, sd[p + "post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)) @ sd[
        p + "mlp.down_proj.weight"
    ].T
    return h + mlp


def reference_eagle3(sd, embed, features, tokens, path, *, heads, kv, hd):
    """Logits (depths, VOCAB) in target ids: the context pairs (features_i, tokens_{i+1}) at
    positions i, the last of them the root's; then each path token paired with the previous
    depth's pre-norm output (vLLM's ``hidden_prenorm``, the authors' ``out_hidden``), as one
    growing causal sequence (what the drafts' KV cache holds)."""
    p = "midlayer." if "midlayer.fc" in sd or any(k.startswith("midlayer.") for k in sd) else "layers.0."
    hs = features @ sd["fc.weight"].T  # fc on the base features, first step only
    toks = list(tokens[1:])
    out_logits = []
    for depth in range(len(path) + 1):
        emb = embed[torch.tensor(toks)]
        x = torch.cat([rms(emb, sd[p + "input_layernorm.weight"]), rms(hs, sd[p + "hidden_norm.weight"])], -1)
        out = reference_layer(sd, p, x, hs, torch.arange(len(toks)), heads, kv, hd)
        draft = rms(out[-1], sd["norm.weight"]) @ sd["lm_head.weight"].T
        full = torch.full((VOCAB,), float("-inf"))
        full[torch.arange(len(draft)) + sd["d2t"]] = draft  # vLLM's compute_logits
        out_logits.append(full)
        if depth < len(path):
            hs = torch.cat([hs, out[-1:]], 0)  # the draft's own output, not fc again
            toks.append(int(path[depth]))
    return torch.stack(out_logits)


def reference_eagle1(sd, embed, lm_head, features, tokens, path, *, heads, kv, hd):
    """EAGLE-1/2: fc([embed(token), h]) with bias, no input norm, base lm_head, no final norm."""
    hs = features.clone()
    toks = list(tokens[1:])
    out_logits = []
    for depth in range(len(path) + 1):
        x = torch.cat([embed[torch.tensor(toks)], hs], -1) @ sd["fc.weight"].T + sd["fc.bias"]
        out = reference_layer(sd, "layers.0.", x, x, torch.arange(len(toks)), heads, kv, hd)
        out_logits.append(out[-1] @ lm_head.T)
        if depth < len(path):
            hs = torch.cat([hs, out[-1:]], 0)
            toks.append(int(path[depth]))
    return torch.stack(out_logits)


def drafter_chain(drafter, features, tokens, path):
    """The drafter's logits along `path` with its context read from the pairs before the root."""
    t = features.shape[0]
    valid = torch.ones((1, t), dtype=torch.bool)
    positions = torch.arange(t)[None]
    with torch.no_grad():
        drafter.read_context(features[None], torch.tensor(tokens[1:])[None], valid, positions)
        state = drafter.begin_at(
            features[t - 1 :],
            torch.tensor([tokens[t]]),
            torch.tensor([0]),
            torch.tensor([t - 1]),
            torch.tensor([t - 1]),
        )
        out = []
        for d in range(len(path) + 1):
            logits, carry = drafter.depth_logits(state, d)
            out.append(logits[0])
            if d < len(path):
                state = drafter.child_state(carry, d, torch.tensor([path[d]]))
    drafter.set_context(None)
    return torch.stack(out)


SHAPES = [  # (draft hidden, target hidden, draft vocabulary, heads, kv heads, head_dim)
    dict(h=32, target_h=32, draft_vocab=VOCAB, heads=4, kv=4, hd=None),
    dict(h=24, target_h=40, draft_vocab=40, heads=4, kv=2, hd=None),  # reduced vocabulary, wider target
    dict(h=16, target_h=24, draft_vocab=23, heads=2, kv=1, hd=12),  # head_dim of its own
]


def base_parts(target_h, layers=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    config = LlamaConfig(hidden_size=target_h, num_hidden_layers=layers, vocab_size=VOCAB, num_attention_heads=4)
    return config, rand(VOCAB, target_h, g=g), rand(VOCAB, target_h, g=g)


@pytest.mark.parametrize("layout", ["authors", "speculators"])
@pytest.mark.parametrize("shape", SHAPES)
def test_eagle3_logits_equal_the_transcribed_reference(tmp_path, layout, shape):
    sd = write_eagle3(tmp_path / "d", layout=layout, **shape)
    config, lm_head, embed = base_parts(shape["target_h"])
    drafter = load_drafter(tmp_path / "d", base_config=config, lm_head_weight=lm_head, input_embeddings=embed)
    assert isinstance(drafter, EagleDrafter) and drafter.kind == "eagle3"
    assert drafter.aux_layer_ids == (2, 3, 3)  # the engines' default (2, L // 2, L - 3), L = 6
    g = torch.Generator().manual_seed(7)
    t = 6
    features = rand(t, 3 * shape["target_h"], g=g, scale=1.0)
    tokens = torch.randint(0, VOCAB, (t + 1,), generator=g).tolist()
    path = torch.randint(0, VOCAB, (3,), generator=g).tolist()
    hd = shape["hd"] or shape["h"] // shape["heads"]
    own = sd.get("embed_tokens.weight", embed)
    want = reference_eagle3(sd, own, features, tokens, path, heads=shape["heads"], kv=shape["kv"], hd=hd)
    got = drafter_chain(drafter, features, tokens, path)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    assert int(finite[0].sum()) == shape["draft_vocab"]
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-5)


def test_eagle3_reads_its_own_embedding_when_the_file_has_one(tmp_path):
    sd = write_eagle3(tmp_path / "d", layout="speculators", h=32, target_h=32, draft_vocab=VOCAB, with_embed=True)
    config, lm_head, embed = base_parts(32)
    drafter = load_drafter(tmp_path / "d", base_config=config, lm_head_weight=lm_head, input_embeddings=embed)
    g = torch.Generator().manual_seed(8)
    features = rand(4, 96, g=g, scale=1.0)
    tokens, path = [5, 9, 3, 7, 11], [4, 8]
    want = reference_eagle3(sd, sd["embed_tokens.weight"], features, tokens, path, heads=4, kv=2, hd=8)
    torch.testing.assert_close(drafter_chain(drafter, features, tokens, path), want, rtol=1e-5, atol=1e-5)


def test_d2t_maps_draft_ids_to_target_ids(tmp_path):
    sd = write_eagle3(tmp_path / "d", layout="authors", h=24, target_h=40, draft_vocab=40)
    config, lm_head, embed = base_parts(40)
    drafter = load_drafter(tmp_path / "d", base_config=config, lm_head_weight=lm_head, input_embeddings=embed)
    out = torch.randn(5, 24)
    with torch.no_grad():
        logits = drafter.logits(out)
        draft = drafter.lm_head(drafter.norm(out))
    best = draft.argmax(-1)
    # the authors' topK_genrate: a draft id i proposes target id i + d2t[i]
    assert logits.argmax(-1).tolist() == (best + sd["d2t"][best]).tolist()
    unreachable = torch.nonzero(~sd["t2d"]).flatten()
    assert torch.isinf(logits[:, unreachable]).all()


def test_eagle1_logits_equal_the_transcribed_reference(tmp_path):
    for fc_bias in (True, False):
        sd = write_eagle1(tmp_path / f"e{fc_bias}", h=32, fc_bias=fc_bias)
        config, lm_head, embed = base_parts(32)
        with pytest.raises(UserError, match="holds a draft-model drafter, not eagle3"):
            load_drafter(tmp_path / f"e{fc_bias}", kind="eagle3", base_config=config)
        drafter = load_drafter(
            tmp_path / f"e{fc_bias}", kind="eagle", base_config=config, lm_head_weight=lm_head, input_embeddings=embed
        )
        assert drafter.kind == "eagle"
        sd.setdefault("fc.bias", torch.zeros(32))
        g = torch.Generator().manual_seed(9)
        features = rand(5, 32, g=g, scale=1.0)
        tokens, path = torch.randint(0, VOCAB, (6,), generator=g).tolist(), [3, 1, 4]
        want = reference_eagle1(sd, embed, lm_head, features, tokens, path, heads=4, kv=2, hd=8)
        # no norm precedes EAGLE-1's head and random weights grow the state depth by depth
        # (logits up to ~400 at depth 3): 1e-5 of the logits' scale is float32's rounding
        scale = want.abs().amax()
        got = drafter_chain(drafter, features, tokens, path)
        torch.testing.assert_close(got / scale, want / scale, rtol=0, atol=1e-5)


def test_bad_eagle_drafts_are_one_line_refusals(tmp_path):
    config, lm_head, embed = base_parts(40)
    base = dict(base_config=config, lm_head_weight=lm_head, input_embeddings=embed)
    write_eagle3(tmp_path / "a", layout="speculators", h=24, target_h=32, draft_vocab=40)
    with pytest.raises(UserError, match="target_hidden_size 32, but the model's hidden size is 40"):
        load_drafter(tmp_path / "a", **base)
    sd = write_eagle3(tmp_path / "b", layout="authors", h=24, target_h=40, draft_vocab=40)
    sd["d2t"][3] = VOCAB  # draft id 3 -> beyond the target vocabulary
    torch.save(sd, tmp_path / "b" / "pytorch_model.bin")
    with pytest.raises(UserError, match="d2t maps draft id 3 to target id .* outside the model's vocabulary of 64"):
        load_drafter(tmp_path / "b", **base)
    write_eagle3(tmp_path / "c", layout="speculators", h=24, target_h=40, draft_vocab=40, aux=[1, 3, 6])
    with pytest.raises(UserError, match="auxiliary layer 6 is not one of the model's 6 layers"):
        load_drafter(tmp_path / "c", **base)
    few, lm_head, embed = base_parts(40, layers=3)
    write_eagle3(tmp_path / "d", layout="authors", h=24, target_h=40, draft_vocab=40)
    with pytest.raises(UserError, match="names no eagle_aux_hidden_state_layer_ids and the model's 3 layers"):
        load_drafter(tmp_path / "d", base_config=few, lm_head_weight=lm_head, input_embeddings=embed)
    sd = write_eagle3(tmp_path / "e", layout="authors", h=24, target_h=40, draft_vocab=40)
    del sd["midlayer.hidden_norm.weight"]
    torch.save(sd, tmp_path / "e" / "pytorch_model.bin")
    with pytest.raises(UserError, match="weights lack key 'layers.0.hidden_norm.weight'"):
        load_drafter(tmp_path / "e", **base)
    with pytest.raises(UserError, match="holds a eagle3 drafter, not hydra"):
        load_drafter(tmp_path / "a", kind="hydra", **base)


# ---- on a tiny base model: auxiliary layers and calibration ---------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(tmp_path_factory.mktemp("tiny"), vocab=VOCAB, hidden=32, layers=5, heads=4, kv_heads=2)
    write_eagle3(path / "eagle3", layout="speculators", h=24, target_h=32, draft_vocab=40, aux=[1, 2, 4], seed=3)
    torch.set_num_threads(1)
    return path


def test_calibration_ranks_equal_slow_per_position_reference(tiny):
    lm = load_model(str(tiny), device="cpu", dtype="float32", drafter="eagle3")
    assert lm.heads.aux_layer_ids == (1, 2, 4)
    sd = load_drafter_sd(tiny / "eagle3")
    embed = sd["embed_tokens.weight"]  # the draft is narrower than the model: its own
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (9, 12, 4)]
    starts = [2, 3, 0]
    ranks = label_ranks(lm.model, lm.heads, seqs, starts, chunk_elements=5 * VOCAB)
    seq, t, has = label_rows([len(s) for s in seqs], starts, lm.heads.num_heads)
    checked = 0
    for r in range(len(seq)):  # one position at a time, the base model run on its prefix alone
        x = seqs[seq[r]]
        with torch.no_grad():
            states = lm.model.model(input_ids=torch.tensor([x[: t[r] + 1]]), output_hidden_states=True).hidden_states
            # the input of layers 1, 2 and 4 (vLLM and the authors capture it before the layer)
            features = torch.cat([states[1][0], states[2][0], states[4][0]], -1)
            depths = int(has[r].sum())
            path = x[t[r] + 2 : t[r] + 1 + depths]
            logits = reference_eagle3(sd, embed, features, x[: t[r] + 2], path, heads=4, kv=2, hd=6)
        for k in range(lm.heads.num_heads):
            if not has[r, k]:
                assert ranks[r, k] == -1
                continue
            label = x[t[r] + k + 2]
            assert ranks[r, k] == int((logits[k] > logits[k, label]).sum()), (r, k)
            checked += 1
    assert checked > 20


def load_drafter_sd(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_cli_calibrate_takes_an_eagle3_draft(tiny, tmp_path):
    main(
        [
            "calibrate",
            "--model",
            str(tiny),
            "--heads",
            str(tiny / "eagle3"),
            "--num-heads",
            "3",
            "--data",
            "demo",
            "--max-prompts",
            "2",
            "--steps",
            "6",
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
    assert table.num_heads == 3 and table.drafter == "eagle3"
    assert np.all(table.positions > 0)


TREES = [
    [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0]],
    [[0], [2], [0, 0], [2, 1], [2, 1, 3], [0, 0, 0]],  # gaps in the ranks
    [[0], [0, 0], [0, 0, 0]],  # a chain
]


def prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids, mask


@pytest.mark.parametrize("lengths", [(7,), (5, 9, 3)])
def test_greedy_decoding_with_an_eagle3_draft_is_lossless(tiny, lengths):
    from calibration.decoder import TreeDecoder
    from calibration.greedy import greedy_decode
    from treeopt.tree import make_tree

    ids, mask = prompts(lengths, seed=len(lengths))
    lm = load_model(str(tiny), device="cpu", dtype="float32", drafter="eagle3")
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=20)
    # the ragged batch verifies through the split attention (docs/decoder.md#split-verification-attention)
    attention = "split" if len(lengths) > 1 else None
    for paths in TREES:
        decoder = TreeDecoder(lm.model, lm.heads, make_tree(paths), topk=4, timing=False, attention=attention)
        result = decoder.generate(ids, mask, max_new_tokens=20)
        assert result.tokens == reference, paths
        assert decoder.attention == (attention or "masked")


def test_the_draft_cache_holds_every_pair_of_the_sequence_so_far(tiny):
    """After the prefill and each step, with ragged acceptance and holes, each sequence's valid
    draft slots equal the draft run once over the pairs of its whole sequence so far, and the
    tree drafted next equals a per-node reference run on that sequence."""
    from calibration.decoder import TreeDecoder
    from treeopt.tree import make_tree

    lm = load_model(str(tiny), device="cpu", dtype="float32", drafter="eagle3")
    sd = load_drafter_sd(tiny / "eagle3")
    tree = make_tree(TREES[0])
    decoder = TreeDecoder(lm.model, lm.heads, tree, topk=4, timing=False)
    ids, mask = prompts((6, 9), seed=11)
    emitted = [ids[i][mask[i].bool()].tolist() for i in range(2)]
    with torch.no_grad():
        state = decoder.prefill(ids, mask, capacity=64)
        for step in range(5):
            roots = state.root.tolist()
            tokens = decoder.draft(state)
            for b in range(2):
                seq = emitted[b]
                states = lm.model.model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
                features = torch.cat([states[1][0], states[2][0], states[4][0]], -1)
                # the cache: keys of the pairs (feature_i, x_{i+1}) at positions i, valid slots in order
                _, key, _ = lm.heads.context_pass(
                    features[None, :-1],
                    torch.tensor([seq[1:]]),
                    torch.ones((1, len(seq) - 1), dtype=torch.bool),
                    torch.arange(len(seq) - 1)[None],
                )
                got = state.draft_cache.layers[0].keys[b][:, state.draft_valid[b]]
                torch.testing.assert_close(got, key[0], rtol=1e-4, atol=1e-5)
                # the tree: each node the rank-th token of the reference chain along its path
                for i, path in enumerate(tree.sorted_paths):
                    node_path = [tokens[b, 1 + tree.sorted_paths.index(path[:j])].item() for j in range(1, len(path))]
                    logits = reference_eagle3(
                        sd, sd["embed_tokens.weight"], features, seq + [roots[b]], node_path, heads=4, kv=2, hd=6
                    )[-1]
                    assert tokens[b, i + 1].item() == logits.topk(path[-1] + 1).indices[-1].item(), (step, b, path)
            new, n_keep = decoder.step(state)
            for b in range(2):
                emitted[b] += [roots[b]] + new[b, : n_keep[b] - 1].tolist()


# ---- the roofline's price of a draft -----------------------------------------------------------


def _gemm_flops(ops, prefix):
    return sum(float(np.sum(o.flops)) for o in ops if o.name.startswith(prefix) and o.kind == "gemm")


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_roofline_prices_each_depth_as_one_layer_at_the_drafts_width(kind):
    from roofline.ops import DraftWork, operators
    from roofline.shapes import ModelShape
    from treeopt.drafter_cost import eagle_cost

    target_h, vocab = 256, 1000
    h, heads, kv, hd, inter, draft_vocab = 128, 2, 1, 64, 352, 300
    shape = ModelShape("base", 4, target_h if kind == "eagle3" else h, 704, 4, 4, 64, vocab)
    layer = {
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": inter,
    }
    cost = eagle_cost(
        kind, layer, target_hidden=shape.hidden, vocab_size=vocab, draft_vocab=draft_vocab, aux_layers=3, depth=3
    )
    rows, batch, accepted = [1.0, 3.0, 0.0], 2, 2.5
    ops = operators(shape, DraftWork(cost, np.array(rows), accepted), batch=batch, tokens=4, context=100)
    # by hand: per row, q/k/v over 2h (EAGLE-3) or h after fc (EAGLE-1/2), o, the gated MLP,
    # the lm_head (draft vocabulary or the base's); EAGLE-3's fc over 3 target widths at the
    # first depth only, EAGLE-1/2's fc over 2h at every depth
    qkv_in = 2 * h if kind == "eagle3" else h
    layer_flops = 2 * (qkv_in * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter)
    head = 2 * h * (draft_vocab if kind == "eagle3" else vocab)
    fc = [2 * 3 * target_h * h, 0, 0] if kind == "eagle3" else [2 * 2 * h * h] * 3
    want = sum(batch * r * (layer_flops + head + fc[d]) for d, r in enumerate(rows))
    assert _gemm_flops(ops, "eagle_depth_") == pytest.approx(want)
    assert _gemm_flops(ops, "eagle_depth_3.") == 0  # a depth the tree does not reach costs nothing
    context_fc = 2 * 3 * target_h * h if kind == "eagle3" else 2 * 2 * h * h
    assert _gemm_flops(ops, "draft_context.") == pytest.approx(batch * accepted * (layer_flops + context_fc))


def test_roofline_params_of_a_loaded_draft_are_its_weights(tmp_path):
    from treeopt.app.models import draft_cost_of_drafter

    write_eagle3(tmp_path / "d", layout="speculators", h=24, target_h=40, draft_vocab=40)
    config, lm_head, embed = base_parts(40)
    drafter = load_drafter(tmp_path / "d", base_config=config, lm_head_weight=lm_head, input_embeddings=embed)
    weights = sum(p.numel() for n, p in drafter.named_parameters() if not n.startswith("embed_tokens"))
    assert draft_cost_of_drafter(drafter).params == weights
    write_eagle1(tmp_path / "e", h=40)
    drafter = load_drafter(
        tmp_path / "e", kind="eagle", base_config=config, lm_head_weight=lm_head, input_embeddings=embed
    )
    shared = ("embed_tokens", "lm_head")  # the base model's
    weights = sum(p.numel() for n, p in drafter.named_parameters() if not n.startswith(shared))
    assert draft_cost_of_drafter(drafter).params == weights


# ---- exports ----------------------------------------------------------------------------------


def test_vllm_and_sglang_lines_name_the_eagle_draft():
    import json
    import shlex

    from treeopt.accuracy import AccuracyTable
    from treeopt.engines import eagle_draft, export_for, get_engine
    from treeopt.tree import make_tree

    hits = np.array([[60.0, 20.0, 5.0], [40.0, 15.0, 5.0]])
    for kind, algorithm in (("eagle3", "EAGLE3"), ("eagle", "EAGLE")):
        table = AccuracyTable(
            hits=hits,
            positions=np.full(2, 100.0),
            joint=None,
            provenance={"source": "treeopt calibrate", "heads": f"{kind}:/models/draft"},
        )
        assert eagle_draft(table) == (kind, "/models/draft")
        tree = make_tree([[0], [0, 0]])
        line = export_for(get_engine("vllm"), tree, drafter=eagle_draft(table)).line
        config = json.loads(shlex.split(line)[1])
        # vLLM's SpeculativeConfig: the method names the draft's kind, "model" its path
        assert config["method"] == kind and config["model"] == "/models/draft"
        assert config["num_speculative_tokens"] == 2
        line = export_for(get_engine("sglang"), tree, accuracy=table.accuracy, drafter=eagle_draft(table)).line
        assert line.startswith(f"--speculative-algorithm {algorithm} --speculative-num-steps 2 ")
        assert line.endswith("--speculative-draft-model-path /models/draft")
    medusa = AccuracyTable(hits=hits, positions=np.full(2, 100.0), joint=None, provenance={"heads": "x"})
    assert eagle_draft(medusa) is None
