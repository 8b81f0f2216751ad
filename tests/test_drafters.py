"""Sequentially dependent drafters (calibration.drafters): Hydra heads and IBM's MLP speculator
read from checkpoints built in exactly their authors' layouts, each head's / stage's forward
against a direct implementation of the published equations; depth-by-depth drafting against a
per-node brute force; calibration ranks against a slow per-position reference; greedy tree
decoding with every drafter emits exactly plain greedy decoding, batch 1 and batch 3."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from calibration.decoder import TreeDecoder
from calibration.drafters import HydraHeads, MLPSpeculator, load_drafter
from calibration.drafters.base import Drafter
from calibration.greedy import greedy_decode
from calibration.labels import label_ranks, label_rows
from calibration.models import load_model, tiny_model_for_tests
from treeopt.accuracy import load_accuracy
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.fileio import write_json
from treeopt.tree import make_tree

VOCAB, HIDDEN = 64, 32
TREES = [
    [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0]],
    [[0], [2], [0, 0], [2, 1], [2, 1, 3], [0, 0, 0]],  # gaps in the ranks
    [[0], [0, 0], [0, 0, 0]],  # a chain
]


def rand(*shape, g):
    return torch.randn(*shape, generator=g) * 0.3


def hydra_state_dict(num_heads, num_layers, g):
    """A grounded Hydra MLP state dict with the authors' keys."""
    h, v = HIDDEN, VOCAB
    sd = {"input_embed_fn.weight": rand(v, h, g=g)}
    for k in range(num_heads):
        width = (k + 2) * h
        sd[f"hydra_mlp.{k}.0.linear.weight"] = rand(h, width, g=g)
        sd[f"hydra_mlp.{k}.0.linear.bias"] = rand(h, g=g)
        sd[f"hydra_mlp.{k}.0.res_connection.weight"] = rand(h, width, g=g)
        sd[f"hydra_mlp.{k}.0.res_connection.bias"] = rand(h, g=g)
        for j in range(1, num_layers):
            sd[f"hydra_mlp.{k}.{j}.linear.weight"] = rand(h, h, g=g)
            sd[f"hydra_mlp.{k}.{j}.linear.bias"] = rand(h, g=g)
        sd[f"hydra_lm_head.{k}.weight"] = rand(v, h, g=g)
        sd[f"hydra_lm_head.{k}.bias"] = rand(v, g=g)
    return sd


def write_hydra(path, num_heads=4, num_layers=2, seed=0):
    sd = hydra_state_dict(num_heads, num_layers, torch.Generator().manual_seed(seed))
    path.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path / "hydra_lm_head.pt")
    write_json(
        path / "config.json",
        {
            "hydra_num_heads": num_heads,
            "hydra_num_layers": num_layers,
            "hydra_head_arch": "mlp",
            "grounded_heads": True,
            "hidden_state_offset": 0,
            "base_model_name_or_path": "tiny",
        },
    )
    return sd


def mlp_state_dict(n_predict, emb_dim, inner_dim, g, scale_input):
    sd = {}
    for i in range(n_predict):
        sd[f"speculator.emb.{i}.weight"] = rand(VOCAB, inner_dim, g=g)
        sd[f"speculator.proj.{i}.weight"] = rand(inner_dim, emb_dim if i == 0 else inner_dim, g=g)
        sd[f"speculator.head.{i}.weight"] = rand(VOCAB, inner_dim, g=g)
        sd[f"speculator.ln.{i}.weight"] = 1 + rand(inner_dim, g=g)
        sd[f"speculator.ln.{i}.bias"] = rand(inner_dim, g=g)
    return sd


def write_mlp(path, n_predict=4, inner_dim=24, scale_input=True, seed=0):
    sd = mlp_state_dict(n_predict, HIDDEN, inner_dim, torch.Generator().manual_seed(seed), scale_input)
    path.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path / "model.safetensors"))
    write_json(
        path / "config.json",
        {
            "architectures": ["MLPSpeculatorPreTrainedModel"],
            "model_type": "mlp_speculator",
            "emb_dim": HIDDEN,
            "inner_dim": inner_dim,
            "vocab_size": VOCAB,
            "n_predict": n_predict,
            "top_k_tokens_per_head": [4, 3, 2, 2][:n_predict],
            "n_candidates": 5,
            "tie_weights": False,
            "scale_input": scale_input,
        },
    )
    return sd


# ---- the published equations, written out directly -----------------------------------------


def hydra_reference(sd, k, num_layers, hidden, path_tokens):
    """Ankner et al. 2024 section 3: head k reads [h, E(x_1), ..., E(x_{k+1})]."""
    x = torch.cat([hidden, *[sd["input_embed_fn.weight"][path_tokens[:, i]] for i in range(k + 1)]], -1)
    w, b = sd[f"hydra_mlp.{k}.0.linear.weight"], sd[f"hydra_mlp.{k}.0.linear.bias"]
    wr, br = sd[f"hydra_mlp.{k}.0.res_connection.weight"], sd[f"hydra_mlp.{k}.0.res_connection.bias"]
    y = x @ wr.T + br + torch.nn.functional.silu(x @ w.T + b)
    for j in range(1, num_layers):
        w, b = sd[f"hydra_mlp.{k}.{j}.linear.weight"], sd[f"hydra_mlp.{k}.{j}.linear.bias"]
        y = y + torch.nn.functional.silu(y @ w.T + b)
    return y @ sd[f"hydra_lm_head.{k}.weight"].T + sd[f"hydra_lm_head.{k}.bias"]


def mlp_reference(sd, n_predict, inner_dim, hidden, path_tokens, scale_input):
    """The speculator as IBM's published code runs it (fms-extras' MLPSpeculator.forward, and
    vLLM's MLPSpeculator.generate_proposals with the drafted tokens given): fms'
    LayerNormParameterized with its default use_mean=False, i.e. x / sqrt(mean(x^2) + 1e-6)
    with no mean subtracted, then weight and bias; the embedding added to proj(s) with weight
    w_e / w_s; the paper's constants w_s = 0.5^(0.5/n), w_e = sqrt((1 - w_s^2) inner / 2)."""
    sd = {k.removeprefix("speculator."): v for k, v in sd.items()}
    ws = 0.5 ** (0.5 / n_predict)
    we = math.sqrt(1 - ws**2) * math.sqrt(inner_dim / 2)

    def norm(x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    s = hidden
    if scale_input:
        s = norm(s) / math.sqrt(2)
    out = []
    for i in range(path_tokens.shape[1]):
        a = s @ sd[f"proj.{i}.weight"].T + sd[f"emb.{i}.weight"][path_tokens[:, i]] * (we / ws)
        s = torch.nn.functional.gelu(norm(a) * sd[f"ln.{i}.weight"] + sd[f"ln.{i}.bias"])
        out.append(s @ sd[f"head.{i}.weight"].T)
    return torch.stack(out, 1)


def test_hydra_layout_forward_equals_published_equations(tmp_path):
    sd = write_hydra(tmp_path / "hydra", num_heads=3, num_layers=2)
    heads = load_drafter(tmp_path / "hydra")
    assert isinstance(heads, HydraHeads) and heads.num_heads == 3 and heads.sequential
    g = torch.Generator().manual_seed(1)
    hidden, path = torch.randn(5, HIDDEN, generator=g), torch.randint(0, VOCAB, (5, 3), generator=g)
    with torch.no_grad():
        got = heads.teacher_forced_logits(hidden, path)
    for k in range(3):
        torch.testing.assert_close(got[:, k], hydra_reference(sd, k, 2, hidden, path), rtol=1e-5, atol=1e-5)


def test_mlp_speculator_layout_forward_equals_published_equations(tmp_path):
    for scale_input in (True, False):
        sd = write_mlp(tmp_path / f"mlp{scale_input}", n_predict=3, inner_dim=24, scale_input=scale_input)
        spec = load_drafter(tmp_path / f"mlp{scale_input}", kind="mlp-speculator")
        assert isinstance(spec, MLPSpeculator) and spec.num_heads == 3
        g = torch.Generator().manual_seed(2)
        hidden, path = torch.randn(6, HIDDEN, generator=g), torch.randint(0, VOCAB, (6, 3), generator=g)
        with torch.no_grad():
            got = spec.teacher_forced_logits(hidden, path)
        torch.testing.assert_close(got, mlp_reference(sd, 3, 24, hidden, path, scale_input), rtol=1e-4, atol=1e-4)


def test_mlp_speculator_tied_weights_share_stage_zero(tmp_path):
    sd = mlp_state_dict(3, HIDDEN, HIDDEN, torch.Generator().manual_seed(3), False)
    tied = {
        k: v
        for k, v in sd.items()
        if not any(k.startswith(f"speculator.{n}.{i}.") for n in ("emb", "head", "ln") for i in (1, 2))
    }
    tied.pop("speculator.proj.2.weight")
    (tmp_path / "t").mkdir()
    save_file(tied, str(tmp_path / "t" / "model.safetensors"))
    write_json(
        tmp_path / "t" / "config.json",
        {
            "model_type": "mlp_speculator",
            "emb_dim": HIDDEN,
            "inner_dim": 0,
            "vocab_size": VOCAB,
            "n_predict": 3,
            "tie_weights": True,
        },
    )
    spec = load_drafter(tmp_path / "t")
    untied = {k: v for k, v in tied.items()}
    for i in (1, 2):
        for n in ("emb", "head"):
            untied[f"speculator.{n}.{i}.weight"] = tied[f"speculator.{n}.0.weight"]
        untied[f"speculator.ln.{i}.weight"] = tied["speculator.ln.0.weight"]
        untied[f"speculator.ln.{i}.bias"] = tied["speculator.ln.0.bias"]
    untied["speculator.proj.2.weight"] = tied["speculator.proj.1.weight"]
    g = torch.Generator().manual_seed(4)
    hidden, path = torch.randn(4, HIDDEN, generator=g), torch.randint(0, VOCAB, (4, 3), generator=g)
    with torch.no_grad():
        got = spec.teacher_forced_logits(hidden, path)
    torch.testing.assert_close(got, mlp_reference(untied, 3, HIDDEN, hidden, path, False), rtol=1e-4, atol=1e-4)


def test_bad_drafter_configs_are_one_line_errors(tmp_path):
    write_hydra(tmp_path / "h", num_heads=2, num_layers=1)
    with pytest.raises(UserError, match="holds a hydra drafter, not mlp-speculator"):
        load_drafter(tmp_path / "h", kind="mlp-speculator")
    write_json(tmp_path / "h" / "config.json", {"hydra_num_heads": 2, "hydra_head_arch": "cross-attn"})
    with pytest.raises(UserError, match="hydra_head_arch 'cross-attn' is not supported"):
        load_drafter(tmp_path / "h")
    write_json(tmp_path / "h" / "config.json", {"something": 1})
    with pytest.raises(UserError, match="not a drafter config"):
        load_drafter(tmp_path / "h")
    write_mlp(tmp_path / "m", n_predict=2)
    torch.save({}, tmp_path / "m" / "pytorch_model.bin")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(UserError, match="weights lack key 'emb.0.weight'"):
        load_drafter(tmp_path / "m")


# ---- a tiny model with each drafter -----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"), vocab=VOCAB, hidden=HIDDEN, layers=2, heads=4, kv_heads=2, num_medusa_heads=3
    )
    write_hydra(path / "hydra", num_heads=4, num_layers=2)
    write_mlp(path / "mlp_speculator", n_predict=4, inner_dim=24)
    torch.set_num_threads(1)
    return path


class OracleDrafter(torch.nn.Module, Drafter):
    """A test drafter that reads the path: it knows the greedy continuations of the test
    prompts, keyed by the last two path tokens, and puts the known next token at rank
    ranks[depth]: acceptance is long (the chains of TREES) and KV pruning happens."""

    kind = "oracle"

    def __init__(self, table: dict, num_heads: int, ranks=(0, 0, 0, 0)):
        super().__init__()
        self.table, self.num_heads, self.ranks = table, num_heads, ranks
        self.vocab_size, self.hidden_size = VOCAB, HIDDEN

    def begin(self, hidden, root):
        return (torch.stack([torch.full_like(root, -1), root], 1),)

    def depth_logits(self, state, depth):
        last2 = state[0].tolist()
        logits = torch.zeros((len(last2), VOCAB))
        logits[:, :] = -torch.arange(VOCAB, dtype=torch.float32)  # fixed order of the other tokens
        for i, (a, b) in enumerate(last2):  # a test oracle; the decoder under test stays vectorised
            nxt = self.table.get((a, b), self.table.get((b,), 3))
            order = [t for t in range(VOCAB) if t != nxt]
            order.insert(self.ranks[depth % len(self.ranks)], nxt)
            logits[i, torch.tensor(order)] = -torch.arange(VOCAB, dtype=torch.float32)
        return logits, state

    def child_state(self, carry, depth, tokens):
        return (torch.stack([carry[0][:, 1], tokens], 1),)


def oracle_table(sequences):
    table = {}
    for seq in sequences:
        for j in range(1, len(seq) - 1):
            table[(seq[j - 1], seq[j])] = seq[j + 1]
            table[(seq[j],)] = seq[j + 1]
    return table


def prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids, mask


@pytest.mark.parametrize("drafter", ["hydra", "mlp-speculator", "oracle"])
@pytest.mark.parametrize("lengths", [(7,), (5, 9, 3)])
def test_greedy_tree_decoding_is_lossless_with_every_drafter(tiny, drafter, lengths):
    ids, mask = prompts(lengths, seed=len(lengths))
    lm = load_model(str(tiny), device="cpu", dtype="float32", drafter=None if drafter == "oracle" else drafter)
    reference = greedy_decode(lm.model, ids, mask, max_new_tokens=24)
    heads = lm.heads
    if drafter == "oracle":
        rows = [ids[i][mask[i].bool()].tolist() + reference[i] for i in range(len(lengths))]
        heads = OracleDrafter(oracle_table(rows), 4)
    longest = 0
    # the ragged batch verifies through the split attention (docs/decoder.md#split-verification-attention)
    attention = "split" if len(lengths) > 1 else None
    for paths in TREES:
        tree = make_tree(paths)
        decoder = TreeDecoder(lm.model, heads, tree, topk=4, timing=False, attention=attention)
        result = decoder.generate(ids, mask, max_new_tokens=24)
        assert result.tokens == reference, (drafter, paths)
        assert decoder.attention == (attention or "masked")
        longest = max(longest, int(result.accepted.max()))
    if drafter == "oracle":
        assert longest >= 4  # the oracle makes deep acceptance (and KV pruning) happen


def test_depth_by_depth_drafting_equals_per_node_brute_force(tiny):
    for kind in ("hydra", "mlp-speculator"):
        lm = load_model(str(tiny), device="cpu", dtype="float32", drafter=kind)
        tree = make_tree(TREES[0] + [[1, 0, 2], [1, 1]])
        decoder = TreeDecoder(lm.model, lm.heads, tree, topk=4, timing=False)
        g = torch.Generator().manual_seed(5)
        hidden, root = torch.randn(3, HIDDEN, generator=g), torch.randint(3, VOCAB, (3,), generator=g)
        with torch.no_grad():
            tokens = decoder.drafting.propose(hidden, root)
        index = {p: i + 1 for i, p in enumerate(tree.sorted_paths)}
        for b in range(3):
            for p, i in index.items():  # brute force: each node from its own path
                path = torch.tensor([[root[b].item()] + [tokens[b, index[p[:j]]].item() for j in range(1, len(p))]])
                with torch.no_grad():
                    logits = lm.heads.teacher_forced_logits(hidden[b : b + 1], path)[0, len(p) - 1]
                assert tokens[b, i].item() == logits.topk(p[-1] + 1).indices[-1].item()


def test_calibration_ranks_equal_slow_per_position_reference(tiny):
    for kind in ("hydra", "mlp-speculator"):
        lm = load_model(str(tiny), device="cpu", dtype="float32", drafter=kind)
        g = torch.Generator().manual_seed(6)
        seqs = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (9, 14, 4)]
        starts = [2, 3, 0]
        ranks = label_ranks(lm.model, lm.heads, seqs, starts, chunk_elements=5 * VOCAB)
        seq, t, has = label_rows([len(s) for s in seqs], starts, lm.heads.num_heads)
        for r in range(len(seq)):  # the slow reference: one position, one depth at a time
            x = seqs[seq[r]]
            with torch.no_grad():
                h = lm.model.model(input_ids=torch.tensor([x[: t[r] + 1]])).last_hidden_state[0, -1:]
            for k in range(lm.heads.num_heads):
                if not has[r, k]:
                    assert ranks[r, k] == -1
                    continue
                path = torch.tensor([x[t[r] + 1 : t[r] + k + 2]])
                with torch.no_grad():
                    logits = lm.heads.teacher_forced_logits(h, path)[0, k]
                label = x[t[r] + k + 2]
                assert ranks[r, k] == int((logits > logits[label]).sum()), (kind, r, k)
        assert (ranks[has] >= 0).all() and np.isin(ranks[~has], [-1]).all()


def test_cli_decode_and_calibrate_take_the_drafter(tiny, tmp_path, capsys):
    main(
        [
            "decode",
            "--model",
            str(tiny),
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
    out = capsys.readouterr().out
    assert "identical to plain greedy: yes" in out
    main(
        [
            "calibrate",
            "--model",
            str(tiny),
            "--drafter",
            "mlp-speculator",
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
    assert table.num_heads == 4  # one row per MLP speculator stage
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "decode",
                "--model",
                str(tiny),
                "--drafter",
                "hydra",
                "--heads",
                str(tiny / "mlp_speculator"),
                "--tree",
                "[[0]]",
                "--prompt",
                "x",
                "--device",
                "cpu",
            ]
        )
    assert exc.value.code == 2
    assert "holds a mlp-speculator drafter, not hydra" in capsys.readouterr().err
