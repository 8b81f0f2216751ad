"""A draft model wired into every command: detection and loading, decode (greedy and sampled),
calibrate (rank vectors and the alpha sidecar), the sweep's step timing and validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from calibration.demo_draft import DraftRecipe, train_demo_draft
from calibration.drafters import DraftModel, detect_kind, load_drafter
from calibration.greedy import greedy_decode
from calibration.models import load_model, tiny_model_for_tests
from calibration.speculative import SpeculativeDecoder
from calibration.sweep import measure_group
from calibration.validate import measure_acceptance
from treeopt.accuracy import load_accuracy
from treeopt.chain import ChainAcceptance, alpha_path, chain_tau, load_chain_acceptance
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.tree import make_tree

VOCAB = 48


def write_draft(path, vocab=VOCAB, hidden=16, seed=3):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
    model.save_pretrained(str(path))
    return model.eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"), vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, num_medusa_heads=3
    )
    write_draft(path / "draft")
    torch.set_num_threads(1)
    return path


def test_detection_and_from_pretrained_give_the_saved_model(tiny, tmp_path):
    config = json.loads((tiny / "draft" / "config.json").read_text())
    assert detect_kind(config) == "draft-model"
    assert detect_kind({"medusa_num_heads": 3, "architectures": ["LlamaForCausalLM"]}) == "medusa"
    original = write_draft(tmp_path / "again")
    drafter = load_drafter(tmp_path / "again", num_heads=5)
    assert isinstance(drafter, DraftModel) and drafter.num_heads == 5 and drafter.vocab_size == VOCAB
    ids = torch.tensor([[3, 9, 4, 17, 5]])
    with torch.no_grad():
        want = original(input_ids=ids).logits
        got = drafter.model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-6)
    with pytest.raises(UserError, match="holds a draft-model drafter, not hydra"):
        load_drafter(tmp_path / "again", kind="hydra")


def test_load_model_finds_the_draft_and_checks_its_vocabulary(tiny, tmp_path):
    lm = load_model(str(tiny), device="cpu", dtype="float32", drafter="draft-model")
    assert lm.heads.kind == "draft-model" and lm.heads.hidden_size == 16  # its own hidden size
    lm = load_model(str(tiny), str(tiny / "draft"), device="cpu", dtype="float32")  # detected
    assert lm.heads.kind == "draft-model"
    write_draft(tmp_path / "other", vocab=VOCAB + 2)
    with pytest.raises(UserError, match="vocabulary 50, the model 48"):
        load_model(str(tiny), str(tmp_path / "other"), device="cpu", dtype="float32")


def test_cli_decode_greedy_is_plain_greedy_and_sampling_runs(tiny, capsys):
    for tree in ("[[0], [0, 0], [0, 0, 0]]", "[[0], [1], [0, 0], [1, 0]]"):
        main(
            [
                "decode",
                "--model",
                str(tiny),
                "--drafter",
                "draft-model",
                "--tree",
                tree,
                "--prompt",
                "def f(x):",
                "--prompt",
                "a",
                "--max-new-tokens",
                "12",
                "--device",
                "cpu",
                "--compare",
            ]
        )
        assert "identical to plain greedy: yes" in capsys.readouterr().out
    main(
        [
            "decode",
            "--model",
            str(tiny),
            "--drafter",
            "draft-model",
            "--tree",
            "[[0], [0, 0]]",
            "--prompt",
            "def f(x):",
            "--max-new-tokens",
            "12",
            "--device",
            "cpu",
            "--temperature",
            "0.8",
        ]
    )
    out = capsys.readouterr().out
    assert "rejection sampling (T=0.8" in out and "tokens per step:" in out


def test_cli_calibrate_writes_ranks_and_the_alpha_sidecar(tiny, tmp_path):
    acc = tmp_path / "acc.json"
    main(
        [
            "calibrate",
            "--model",
            str(tiny),
            "--drafter",
            "draft-model",
            "--num-heads",
            "4",
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
            str(acc),
        ]
    )
    assert load_accuracy(acc).num_heads == 4
    side = load_chain_acceptance(alpha_path(acc))
    assert side.temperature == 1.0 and len(side.alpha_per_depth) == 4 and side.rows > 0
    # the stored conditional alphas reproduce the stored walked tau (chain_tau's product rule)
    assert np.allclose(chain_tau(side.alpha_per_depth), side.tau_walked, rtol=1e-12)


def test_sweep_step_restores_both_caches_and_validation_is_lossless(tiny):
    lm = load_model(str(tiny), device="cpu", dtype="float32", drafter="draft-model", num_heads=3)
    chain = make_tree([[0], [0, 0], [0, 0, 0]])
    rows = measure_group(lm, chain, [1, 3], 2, 20, repeats=2, warmup=1, topk=4, seed=0)
    assert [r["nodes"] for r in rows] == [0, 1, 3]  # it raises if a cache kept what a step appended

    class Curve:  # the fields measure_acceptance reads
        proposal, independent, joint, walked = chain, np.ones(4), None, None

    df = measure_acceptance(lm, Curve, [1, 3], ["def f(x):", "a = 1"], max_new_tokens=10, batch_size=2, progress=False)
    assert (df["agreement"] == 1.0).all()


def test_chain_acceptance_from_rows_by_hand():
    rows = np.array([[1.0, 0.5], [0.5, 0.0], [np.nan, 1.0]])
    side = ChainAcceptance.from_rows(rows, 1.0)
    # walked: row 1 -> 1 + 1 + 0.5, row 2 -> 1 + 0.5 + 0; P(reach 1) = 0.75, P(reach 2) = 0.25
    assert side.rows == 2
    assert np.allclose(side.tau_walked, [1.0, 1.75, 2.0])
    assert np.allclose(side.alpha_per_depth, [0.75, 0.25 / 0.75])


def test_demo_draft_recipe_at_a_tiny_size_gives_a_loadable_lossless_draft(tmp_path):
    target = tiny_model_for_tests(tmp_path / "t", vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2)
    recipe = DraftRecipe(hidden_size=16, intermediate_size=32, seq_len=16, batch_size=2, steps=3, warmup_steps=1)
    info = train_demo_draft(target, recipe, max_files=2)
    assert info["log"][-1]["step"] == 3 and (target / "draft" / "model.safetensors").is_file()
    train_demo_draft(target, recipe, max_files=2)  # resumes from the finished checkpoint
    lm = load_model(str(target), device="cpu", dtype="float32", drafter="draft-model", num_heads=3)
    ids = torch.tensor([[5, 9, 7, 11]])
    ref = greedy_decode(lm.model, ids, max_new_tokens=10)
    out = SpeculativeDecoder(lm.model, lm.heads, make_tree([[0], [0, 0]]), timing=False).generate(
        ids, max_new_tokens=10
    )
    assert out.tokens == ref
