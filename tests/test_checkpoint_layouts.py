"""Medusa heads in the layouts people have, each built here in exactly that layout with tiny
dimensions: a config that undercounts the heads, a config without medusa_num_layers, a
Medusa-1.0 full checkpoint (one file, .bin, sharded), "medusa2" heads that share the base
lm_head, the authors' medusa_lm_head.pt, and heads configs without hidden/vocab sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from calibration.heads import MedusaHeads
from calibration.medusa_import import import_medusa_accuracy
from calibration.models import load_model, tiny_model_for_tests
from roofline.shapes import DraftHeadsShape, load_heads_shape
from treeopt.accuracy import load_accuracy
from treeopt.build import build_tree
from treeopt.cli import main
from treeopt.errors import UserError

H, V = 8, 16


def medusa_state(num_heads: int, num_layers: int, *, projection: bool = True, seed: int = 0) -> dict:
    """Random weights under Medusa's keys: {k}.{j}.linear.weight/bias and {k}.{L}.weight."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for k in range(num_heads):
        for j in range(num_layers):
            state[f"{k}.{j}.linear.weight"] = torch.randn(H, H, generator=g)
            state[f"{k}.{j}.linear.bias"] = torch.randn(H, generator=g)
        if projection:
            state[f"{k}.{num_layers}.weight"] = torch.randn(V, H, generator=g)
    return state


def by_hand(state: dict, k: int, num_layers: int, x: torch.Tensor, projection=None) -> torch.Tensor:
    """Head k's logits: L times x <- x + SiLU(W x + b), then the projection (Medusa, section 2.1.1)."""
    for j in range(num_layers):
        w, b = state[f"{k}.{j}.linear.weight"], state[f"{k}.{j}.linear.bias"]
        z = x @ w.T + b
        x = x + z * torch.sigmoid(z)
    p = state[f"{k}.{num_layers}.weight"] if projection is None else projection
    return x @ p.T


def write_heads_dir(path, config: dict, state: dict, name: str = "medusa_lm_head.safetensors"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if name.endswith(".pt"):
        torch.save(state, path / name)
    else:
        save_file(state, str(path / name))
    return path


def test_more_heads_in_the_weights_than_the_config_says(tmp_path):
    # the published Vicuna v1.3 heads: config medusa_num_heads 2, weights with 5 heads
    state = medusa_state(5, 1)
    d = write_heads_dir(
        tmp_path / "h", {"medusa_num_heads": 2, "medusa_num_layers": 1}, state, name="medusa_lm_head.pt"
    )
    warnings = []
    heads = MedusaHeads.from_pretrained(d, warn=warnings.append)
    assert heads.num_heads == 2
    assert len(warnings) == 1 and "hold 5 heads but config.json says medusa_num_heads 2" in warnings[0]
    assert "--num-heads 5" in warnings[0]

    warnings.clear()
    heads = MedusaHeads.from_pretrained(d, num_heads=5, warn=warnings.append)
    assert heads.num_heads == 5 and warnings == []
    x = torch.randn(3, H)
    with torch.no_grad():
        logits = heads(x)
    for k in range(5):
        torch.testing.assert_close(logits[k], by_hand(state, k, 1, x))
    with pytest.raises(UserError, match="--num-heads: .* holds 5 heads, asked for 6"):
        MedusaHeads.from_pretrained(d, num_heads=6)


def test_config_without_num_layers_means_one(tmp_path):
    state = medusa_state(2, 1)
    d = write_heads_dir(tmp_path / "h", {"medusa_num_heads": 2}, state)
    heads = MedusaHeads.from_pretrained(d)
    assert heads.num_layers == 1
    x = torch.randn(2, H)
    with torch.no_grad():
        torch.testing.assert_close(heads(x)[1], by_hand(state, 1, 1, x))


@pytest.mark.parametrize("layout", ["safetensors", "bin", "sharded-safetensors", "sharded-bin"])
def test_medusa_1_0_full_checkpoint(tmp_path, layout):
    state = medusa_state(3, 2)
    full = {"model.embed_tokens.weight": torch.randn(V, H), "lm_head.weight": torch.randn(V, H)}
    full |= {f"medusa_head.{k}": v for k, v in state.items()}
    d = tmp_path / "full"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MedusaModelLlama"],
                "hidden_size": H,
                "vocab_size": V,
                "medusa_num_heads": 3,
                "medusa_num_layers": 2,
            }
        )
    )
    ext = "safetensors" if "safetensors" in layout else "bin"
    stem = "model" if ext == "safetensors" else "pytorch_model"

    def write(tensors, file):
        if ext == "safetensors":
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / file))
        else:
            torch.save(tensors, d / file)

    if layout.startswith("sharded"):
        keys = sorted(full)
        shards = {
            f"{stem}-00001-of-00002.{ext}": keys[: len(keys) // 2],
            f"{stem}-00002-of-00002.{ext}": keys[len(keys) // 2 :],
        }
        for file, ks in shards.items():
            write({k: full[k] for k in ks}, file)
        (d / f"{stem}.{ext}.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}})
        )
    else:
        write(full, f"{stem}.{ext}")
    heads = MedusaHeads.from_pretrained(d)
    assert (heads.num_heads, heads.num_layers, heads.hidden_size, heads.vocab_size) == (3, 2, H, V)
    x = torch.randn(2, H)
    with torch.no_grad():
        logits = heads(x)
    for k in range(3):
        torch.testing.assert_close(logits[k], by_hand(state, k, 2, x))


def test_medusa2_heads_project_with_the_base_lm_head(tmp_path):
    state = medusa_state(2, 1, projection=False)
    d = write_heads_dir(tmp_path / "m2", {"medusa_num_heads": 2, "medusa_num_layers": 1, "version": "2"}, state)
    lm_head = torch.randn(V, H)
    heads = MedusaHeads.from_pretrained(d, lm_head_weight=lm_head)
    x = torch.randn(4, H)
    with torch.no_grad():
        logits = heads(x)
    for k in range(2):
        torch.testing.assert_close(logits[k], by_hand(state, k, 1, x, projection=lm_head))
    with pytest.raises(UserError, match="medusa2 heads .* lm_head, which was not given"):
        MedusaHeads.from_pretrained(d)


def test_write_heads_as_medusa_lm_head_pt(tmp_path):
    heads = MedusaHeads(H, V, 2, 2)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    warnings = []
    heads.save_pretrained(tmp_path / "pt", format="pt", dtype=torch.float32, warn=warnings.append)
    assert (tmp_path / "pt" / "medusa_lm_head.pt").is_file()
    assert not (tmp_path / "pt" / "medusa_lm_head.safetensors").exists()
    assert len(warnings) == 1 and "shares one ResBlock object across layers" in warnings[0]
    # the keys the authors' `medusa_head.load_state_dict` expects
    saved = torch.load(tmp_path / "pt" / "medusa_lm_head.pt", weights_only=True)
    assert set(saved) == {f"{k}.{j}.linear.{t}" for k in range(2) for j in range(2) for t in ("weight", "bias")} | {
        f"{k}.2.weight" for k in range(2)
    }
    back = MedusaHeads.from_pretrained(tmp_path / "pt")
    for key, value in heads.state_dict().items():
        torch.testing.assert_close(back.state_dict()[key], value)
    one_layer = []
    MedusaHeads(H, V, 1, 1).save_pretrained(tmp_path / "one", format="pt", warn=one_layer.append)
    assert one_layer == []
    with pytest.raises(UserError, match="format: must be 'safetensors' or 'pt'"):
        heads.save_pretrained(tmp_path / "x", format="bin")


def test_heads_config_without_sizes_takes_the_models(tmp_path):
    model = tmp_path / "model"
    (model / "heads").mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "vocab_size": 100,
                "torch_dtype": "float32",
            }
        )
    )
    (model / "heads" / "config.json").write_text(json.dumps({"medusa_num_heads": 3}))
    assert load_heads_shape(model / "heads") == DraftHeadsShape(3, 1, 64, 100)
    assert load_heads_shape(model / "heads", hidden_size=32, vocab_size=50) == DraftHeadsShape(3, 1, 32, 50)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "config.json").write_text(json.dumps({"medusa_num_heads": 3}))
    with pytest.raises(UserError, match="missing key 'hidden_size'"):
        load_heads_shape(alone)
    # the commands that read the heads beside the model
    for argv in (
        ["roofline", "ops", "--model", model, "--hardware", "a100", "--tokens", "4"],
        [
            "roofline",
            "speedup",
            "--model",
            model,
            "--hardware",
            "a100",
            "--batch",
            "1",
            "--context",
            "64",
            "--max-nodes",
            "4",
            "--accuracy",
            str(tmp_path / "acc.json"),
        ],
    ):
        if argv[1] == "speedup":
            (tmp_path / "acc.json").write_text(json.dumps([[0.5, 0.1], [0.3, 0.1], [0.2, 0.1]]))
        main([str(a) for a in argv])


def test_load_model_full_checkpoint_and_num_heads(tmp_path, capsys):
    path = tiny_model_for_tests(tmp_path / "m", num_medusa_heads=3)
    heads_state = MedusaHeads.from_pretrained(path / "heads").state_dict()
    # turn it into a Medusa-1.0 full checkpoint: heads inside the model's weights, config says 2
    weights = load_file(str(path / "model.safetensors"))
    weights |= {f"medusa_head.{k}": v.contiguous() for k, v in heads_state.items()}
    save_file(weights, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text()) | {"medusa_num_heads": 2, "medusa_num_layers": 1}
    (path / "config.json").write_text(json.dumps(config))
    for f in (path / "heads").iterdir():
        f.unlink()
    (path / "heads").rmdir()
    lm = load_model(str(path), device="cpu", dtype="float32")
    assert lm.heads.num_heads == 2
    assert "hold 3 heads but config.json says medusa_num_heads 2" in capsys.readouterr().err
    lm = load_model(str(path), device="cpu", dtype="float32", num_heads=3)
    assert lm.heads.num_heads == 3
    for key, value in heads_state.items():
        torch.testing.assert_close(lm.heads.state_dict()[key], value)


def _authors_greedy(acc, max_depth: int, max_child: int, num_iterations: int) -> set:
    """medusa/eval/gen_results.py `explore_graph`, restated: start from (0,), repeatedly add
    the best neighbour (next sibling rank, or first child) by the product of accuracies."""

    def value(node):
        v = 1.0
        for depth, r in enumerate(node):
            v *= float(acc[depth, r])
        return v

    accepted = [(0,)]
    for _ in range(num_iterations):
        neighbours = []
        for node in accepted:
            if node[-1] < max_child - 1:
                neighbours.append(node[:-1] + (node[-1] + 1,))
            if len(node) < max_depth:
                neighbours.append(node + (0,))
        best, best_value = None, 0.0
        for n in neighbours:
            if n not in accepted and value(n) > best_value:
                best, best_value = n, value(n)
        accepted.append(best)
    return set(accepted)


def test_import_normalize_medusa_rebuilds_the_authors_tree(tmp_path, capsys):
    rng = np.random.default_rng(3)
    rows = (900, 880, 860)
    results = []
    for k, n in enumerate(rows):
        t = torch.zeros(n, 10, dtype=torch.bool)
        rank = rng.geometric(0.45 - 0.1 * k, size=n) - 1
        hit = rank < 10
        t[np.flatnonzero(hit), rank[hit]] = True
        results.append(t)
    path = tmp_path / "heads_accuracy.pt"
    torch.save(results, path)
    out = tmp_path / "acc.json"
    main(["calibrate", "--import", str(path), "--normalize", "medusa", "-o", str(out)])
    table = load_accuracy(out)
    # gen_results.py: test_accuracy[i].sum(0) / 16100
    authors = torch.stack([t.sum(0) / 16100 for t in results]).numpy()
    np.testing.assert_allclose(table.accuracy, authors)
    assert table.joint is None and "16100" in table.provenance["normalization"]
    tree = build_tree(table, 12, "greedy")
    assert set(tree.paths) == _authors_greedy(authors, max_depth=3, max_child=10, num_iterations=11)
    # each head by its own rows: a different table, so possibly a different tree
    own = import_medusa_accuracy(path)
    np.testing.assert_allclose(own.accuracy[1], results[1].sum(0).numpy() / 880)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--normalize", "medusa", "-o", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "--normalize: only meaningful with --import" in capsys.readouterr().err
