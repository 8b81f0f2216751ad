"""`--random-weights`: timing without a checkpoint (docs/performance-model.md#timing-without-weights).
A model of a built-in shape or a config.json with random weights and a random drafter, built on
the device in its dtype after the weights and the cache are checked to fit."""

from __future__ import annotations

import json
import re
import resource
import time

import pandas as pd
import pytest
import torch

import calibration.random_model as random_model_module
from calibration.random_model import (
    RANDOM_DRAFT_HEADS,
    RandomModel,
    build_random_model,
    random_parameter_counts,
    random_weight_bytes,
)
from roofline.shapes import model_shape
from treeopt.app.random_weights import llama_config, model_config, random_model
from treeopt.cli import main
from treeopt.errors import UserError

#: the tiny model of these tests: grouped-query attention (4 heads, 2 KV heads) so that a KV
#: count taken from the wrong field shows
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
#: a per-rank accuracy matrix of 3 heads (treeopt.accuracy reads it as a table)
ACCURACY = [[0.6, 0.1, 0.05], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05]]
GIB = 2**30


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny_config.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture
def accuracy(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(ACCURACY))
    return path


def llama_params(layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied=False) -> int:
    """A Llama's parameters written out from its dims: embeddings; per layer q, k, v, o (k and v
    of the KV heads only), gate, up, down and two RMSNorms; the final norm; the lm_head."""
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden + layers * per_layer + hidden + (0 if tied else vocab * hidden)


def medusa_params(heads, hidden, vocab) -> int:
    """One-ResBlock Medusa heads: per head a hidden x hidden linear with bias, then hidden -> vocab."""
    return heads * (hidden * hidden + hidden + hidden * vocab)


def _error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# ---- the model ---------------------------------------------------------------------------------


def test_a_built_in_shape_counts_as_its_dims_say():
    shape = model_shape("llama-3-8b")
    config = llama_config(shape)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (32, 32, 8)
    assert (config.hidden_size, config.intermediate_size, config.head_dim, config.vocab_size) == (
        4096,
        14336,
        128,
        128256,
    )
    spec = RandomModel(config, "llama-3-8b")
    base, drafter = random_parameter_counts(spec)
    assert base == llama_params(32, 4096, 14336, 32, 8, 128, 128256)
    assert drafter == medusa_params(RANDOM_DRAFT_HEADS, 4096, 128256)
    # the bytes checked against the device: base and drafter in the dtype's element size
    assert random_weight_bytes(spec, torch.bfloat16) == 2 * (base + drafter)


def test_the_built_model_has_the_configs_layers_heads_and_kv_heads(tiny):
    lm = build_random_model(RandomModel(model_config(tiny), str(tiny), "medusa", 3), device="cpu", dtype="float32")
    model = lm.model
    assert lm.tokenizer is None and lm.random_seed == 0
    assert len(model.model.layers) == 2
    head_dim = 64 // 4
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (4 * head_dim, 64)
    assert attention.k_proj.weight.shape == (2 * head_dim, 64)
    assert attention.v_proj.weight.shape == (2 * head_dim, 64)
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (160, 64)
    assert sum(p.numel() for p in model.parameters()) == llama_params(2, 64, 160, 4, 2, head_dim, 256)
    assert lm.heads.num_heads == 3 and lm.heads.vocab_size == 256
    assert sum(p.numel() for p in lm.heads.parameters()) == medusa_params(3, 64, 256)
    # the rotary buffers are computed, not left as to_empty's garbage
    fresh = torch.tensor([1.0 / (10000.0 ** (i / head_dim)) for i in range(0, head_dim, 2)])
    assert torch.allclose(model.model.rotary_emb.inv_freq, fresh)


@pytest.mark.parametrize("kind", ["medusa", "hydra", "mlp-speculator"])
def test_same_seed_same_weights_and_finite_logits(tiny, kind):
    config = model_config(tiny)

    def build(seed):
        return build_random_model(RandomModel(config, "tiny", kind, 2, seed), device="cpu", dtype="bfloat16")

    a, b, c = build(0), build(0), build(1)
    for one, two in ((a.model, b.model), (a.heads, b.heads)):
        assert all(torch.equal(x, y) for x, y in zip(one.state_dict().values(), two.state_dict().values()))
    assert not torch.equal(a.model.lm_head.weight, c.model.lm_head.weight)
    assert a.heads.kind == kind and a.heads.num_heads == 2
    assert next(a.model.parameters()).dtype == torch.bfloat16
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = a.model(input_ids=ids).logits
    assert torch.isfinite(logits).all() and logits.float().std() > 0


def test_a_draft_model_and_a_drafter_directory_are_refused(tiny):
    with pytest.raises(UserError, match="--drafter: .*not draft-model"):
        random_model(tiny, drafter="draft-model")
    with pytest.raises(UserError, match="--heads: .*drop --heads"):
        random_model(tiny, heads="some/heads")


# ---- the commands ------------------------------------------------------------------------------


def test_sweep_with_random_weights_writes_every_cell(tiny, accuracy, tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", str(tiny), "--random-weights", "--accuracy", str(accuracy)]
    argv += ["--sizes", "0,1,3", "--batch", "1,2", "--context", "8,24", "--repeats", "5", "--budget", "0"]
    main([*argv, "--device", "cpu", "--dtype", "float32", "-o", str(out)])
    table = pd.read_csv(out)
    cells = set(zip(table["batch"], table["context"], table["nodes"]))
    assert cells == {(b, s, n) for b in (1, 2) for s in (8, 24) for n in (0, 1, 3)}
    assert (table["step_time_s"] > 0).all()
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["weights"] == "random, seed 0" and meta["model"] == str(tiny)
    assert f"wrote {out}" in capsys.readouterr().out


def test_hw_calibrate_times_the_engine_terms_on_random_weights(tiny, tmp_path, capsys):
    out = tmp_path / "hw.json"
    argv = ["hw", "calibrate", "--model", str(tiny), "--random-weights", "--quick", "--num-heads", "2"]
    t0 = time.perf_counter()
    main([*argv, "--device", "cpu", "--dtype", "float32", "-o", str(out)])
    assert time.perf_counter() - t0 < 60
    assert "engine terms from treeopt's decoder" in capsys.readouterr().out
    profile = json.loads(out.read_text())
    assert f"treeopt's decoder on {tiny} (random weights): " in profile["source"]
    # the drafter options belong to the random model
    with pytest.raises(SystemExit) as stop:
        main(["hw", "calibrate", "--model", str(tiny), "--drafter", "hydra", "-o", str(tmp_path / "no.json")])
    assert stop.value.code == 2
    assert _error_lines(capsys) == [
        "treeopt: error: --drafter: hw calibrate takes it with --random-weights (a model directory's own drafter runs)"
    ]
    assert not (tmp_path / "no.json").exists()


def test_decode_with_random_weights_prints_token_ids(tiny, capsys):
    argv = ["decode", "--model", str(tiny), "--random-weights", "--device", "cpu", "--dtype", "float32"]
    main([*argv, "--max-prompts", "2", "--prompt-tokens", "6", "--max-new-tokens", "5", "--tree", "[[0], [1], [0, 0]]"])
    captured = capsys.readouterr()
    assert "meaningless" in captured.err
    blocks = captured.out.split("=== generated (5 tokens) ===\n")
    assert len(blocks) == 3  # two sequences
    for block in blocks[1:]:
        ids = [int(t) for t in block.splitlines()[0].split()]
        assert len(ids) == 5 and all(0 <= t < 256 for t in ids)
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--prompt", "hello"])
    assert stop.value.code == 2
    assert _error_lines(capsys) == [
        "treeopt: error: --prompt: with --random-weights the prompts are random token ids "
        "(--max-prompts of --prompt-tokens each)"
    ]


def _free_64_gib(monkeypatch):
    """A device with 64 GiB free, whatever this machine has: a 70B model in float32 (about 260
    GiB of weights) must not fit."""
    monkeypatch.setattr(random_model_module, "available_bytes", lambda device: 64 * GIB)


@pytest.mark.parametrize("command", ["sweep", "decode", "hw calibrate"])
def test_a_model_too_large_is_refused_before_anything_is_allocated(command, accuracy, tmp_path, monkeypatch, capsys):
    _free_64_gib(monkeypatch)
    out = tmp_path / "out.file"
    argv = [*command.split(), "--model", "llama-2-70b", "--random-weights", "--dtype", "float32", "--device", "cpu"]
    argv += {"sweep": ["--accuracy", str(accuracy), "-o", str(out)], "decode": [], "hw calibrate": ["-o", str(out)]}[
        command
    ]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    elapsed = time.perf_counter() - t0
    assert stop.value.code == 2
    err = _error_lines(capsys)
    assert len(err) == 1, err
    assert err[0].startswith("treeopt: error: --model: llama-2-70b in fp32 needs about ")
    assert "GiB of weights" in err[0] and err[0].endswith("cpu has 64.0 GiB free")
    weights = float(err[0].split("needs about ")[1].split(" GiB")[0].replace(",", ""))
    assert weights == pytest.approx(llama_params(80, 8192, 28672, 64, 8, 128, 32000) * 4 / GIB, rel=0.05)
    assert list(tmp_path.iterdir()) == [accuracy]  # no output, no lock file
    assert elapsed < 10
    # ru_maxrss is in KiB on Linux: nothing near the weights' size was touched
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 2 * 2**20


def test_run_refuses_random_weights_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "--model", "llama-2-7b", "--random-weights", "-o", str(tmp_path / "run")])
    assert stop.value.code == 2
    err = _error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("treeopt: error: --random-weights: run calibrates")
    assert not (tmp_path / "run").exists()


def test_two_sweeps_in_one_folder_keep_their_own_fit_and_select_finds_the_profile(tiny, accuracy, tmp_path, capsys):
    """`sweep -o NAME.csv --hardware FILE` names its fitted profile and transfer table from -o
    (a second sweep in the folder no longer replaces the first one's), and records the profile
    file so that `select`'s pooled fit finds it again by the name the sweep recorded."""
    from dataclasses import replace as dc_replace

    from roofline.hardware import builtin_hardware
    from treeopt.app.pooled import sweep_model

    profile = tmp_path / "profiles" / "box.json"
    profile.parent.mkdir()
    dc_replace(builtin_hardware()["a100-80gb-sxm"], name="my-box").save(profile)
    argv = ["sweep", "--model", str(tiny), "--random-weights", "--accuracy", str(accuracy), "--hardware", str(profile)]
    argv += ["--sizes", "0,1", "--batch", "1,2", "--context", "8", "--repeats", "5", "--budget", "0"]
    argv += ["--device", "cpu", "--dtype", "float32"]
    for name in ("a", "b"):
        main([*argv, "-o", str(tmp_path / f"{name}.csv")])
        assert f"wrote {tmp_path / f'{name}.fitted_hardware.json'}" in capsys.readouterr().out
    for name in ("a", "b"):
        for suffix in ("fitted_hardware.json", "fit_transfer.csv", "fit_transfer.md"):
            assert (tmp_path / f"{name}.{suffix}").is_file()
    assert not (tmp_path / "fitted_hardware.json").exists()
    meta = json.loads((tmp_path / "a.meta.json").read_text())
    assert meta["hardware"] == "my-box" and meta["hardware_file"] == "profiles/box.json"
    assert sweep_model(meta, tmp_path / "a.csv", model="llama-7b").hardware.name == "my-box"
    # a sweep measured without --hardware: said so, never Python's None
    missing = sweep_model({"model": "llama-7b"}, tmp_path / "a.csv").missing
    assert "None" not in missing and "names no hardware profile" in missing


def test_hw_calibrate_says_how_long_the_engine_terms_take_and_how_far_they_got(tiny, tmp_path, capsys):
    """The engine-term steps of a large model take minutes on a CPU after the microbenchmarks:
    an estimate before the first step, then a line per batch size, on stderr."""
    argv = ["hw", "calibrate", "--model", str(tiny), "--random-weights", "--quick", "--num-heads", "2"]
    main([*argv, "--device", "cpu", "--dtype", "float32", "-o", str(tmp_path / "hw.json")])
    err = capsys.readouterr().err
    # the microbenchmarks first say how long their rounds will take (5 rounds with --quick)
    assert re.search(r"\d+ configurations x 5 rounds: about \d+ (s|min) \(priced by one sample of each\)", err)
    lines = [line.strip() for line in err.splitlines() if line.strip().startswith("engine terms:")]
    assert re.match(r"engine terms: \d+ tree steps of .* about \d+ (s|min) by the profile just measured", lines[0])
    assert lines[-1].startswith("engine terms: batch 2 done (2/2, ")
