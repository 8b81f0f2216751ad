"""Medusa heads and model loading (calibration.heads, calibration.models): the published
layout round-trips (safetensors and Medusa's .pt), the forward pass is Medusa's ResBlock
formula, and broken or mismatched checkpoints fail with one clear UserError."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from calibration.heads import MedusaHeads
from calibration.models import (
    load_model,
    resolve_device,
    resolve_dtype,
    tiny_model_for_tests,
)
from treeopt.cli import main
from treeopt.errors import UserError

H, V = 8, 12


def random_heads(num_heads=3, num_layers=1, hidden=H, vocab=V, seed=0):
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.5)
    return heads.eval()


def write_published(path, state, num_heads, num_layers=1, fmt="pt", **config):
    """A heads directory as the Medusa authors publish it (e.g. medusa-vicuna-7b-v1.3):
    config.json with medusa_num_heads / medusa_num_layers / base_model_name_or_path and the
    state dict in medusa_lm_head.pt (torch.save of a dict of tensors)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
        **config,
    }
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "pt":
        torch.save(state, path / "medusa_lm_head.pt")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "medusa_lm_head.safetensors"))
    return path


def test_state_dict_keys_are_medusas():
    heads = MedusaHeads(H, V, num_heads=2, num_layers=2)
    assert sorted(heads.state_dict()) == sorted(
        [f"{k}.{j}.linear.{w}" for k in range(2) for j in range(2) for w in ("weight", "bias")]
        + ["0.2.weight", "1.2.weight"]
    )
    assert heads.state_dict()["0.2.weight"].shape == (V, H)


def test_forward_is_resblock_then_projection():
    heads = random_heads(num_heads=3, num_layers=2)
    x = torch.randn(2, 5, H)
    out = heads(x)
    assert out.shape == (3, 2, 5, V)
    sd = heads.state_dict()
    for k in range(3):
        h = x
        for j in range(2):
            h = h + torch.nn.functional.silu(h @ sd[f"{k}.{j}.linear.weight"].T + sd[f"{k}.{j}.linear.bias"])
        torch.testing.assert_close(out[k], h @ sd[f"{k}.2.weight"].T)


def test_fresh_heads_start_near_the_lm_head():
    """Medusa's init: ResBlock weight zero (bias keeps nn.Linear's default, as in Medusa), so a
    fresh head is the lm_head applied to x + silu(b)."""
    heads = MedusaHeads(H, V, 2)
    w = torch.randn(V, H)
    heads.init_projections_from(w)
    x = torch.randn(4, H)
    b = heads.state_dict()["1.0.linear.bias"]
    torch.testing.assert_close(heads(x)[1], (x + torch.nn.functional.silu(b)) @ w.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip(tmp_path, dtype):
    heads = random_heads(num_heads=3, num_layers=1)
    heads.save_pretrained(tmp_path / "h", base_model_name_or_path="my/base", dtype=dtype)
    assert (tmp_path / "h" / "medusa_lm_head.safetensors").is_file()
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 1
    assert cfg["base_model_name_or_path"] == "my/base"
    loaded = MedusaHeads.from_pretrained(tmp_path / "h", dtype=torch.float32)
    assert (loaded.num_heads, loaded.num_layers, loaded.hidden_size, loaded.vocab_size) == (3, 1, H, V)
    assert loaded.base_model_name_or_path == "my/base" and not loaded.training
    for key, value in heads.state_dict().items():
        # stored in `dtype`: exact after rounding to it
        torch.testing.assert_close(loaded.state_dict()[key], value.to(dtype).float(), rtol=0, atol=0)
    if dtype == torch.float32:
        x = torch.randn(3, H)
        torch.testing.assert_close(loaded(x), heads(x))


def test_load_published_pt_format(tmp_path):
    """Medusa's own layout: medusa_lm_head.pt holding a state dict (fp16, as published)."""
    heads = random_heads(num_heads=2, num_layers=1)
    state = {k: v.half() for k, v in heads.state_dict().items()}
    path = write_published(
        tmp_path / "medusa-vicuna", state, num_heads=2, transformers_version="4.34.0"
    )  # extra config keys are ignored
    loaded = MedusaHeads.from_pretrained(path, dtype=torch.float32)
    assert (loaded.num_heads, loaded.hidden_size, loaded.vocab_size) == (2, H, V)
    assert loaded.base_model_name_or_path == "lmsys/vicuna-7b-v1.3"
    for key, value in state.items():
        torch.testing.assert_close(loaded.state_dict()[key], value.float(), rtol=0, atol=0)
    bf = MedusaHeads.from_pretrained(path, dtype=torch.bfloat16)
    assert next(bf.parameters()).dtype == torch.bfloat16


def test_published_pt_heads_load_with_a_model(tmp_path):
    model_dir = tiny_model_for_tests(tmp_path / "m", vocab=64, hidden=32, num_medusa_heads=2)
    heads = random_heads(num_heads=4, hidden=32, vocab=64, seed=3)
    path = write_published(tmp_path / "pt_heads", heads.state_dict(), num_heads=4)
    lm = load_model(str(model_dir), str(path), device="cpu", dtype="float32")
    assert lm.heads.num_heads == 4 and lm.dtype == torch.float32 and lm.device.type == "cpu"
    x = torch.randn(2, 32)
    torch.testing.assert_close(lm.heads(x), heads(x))
    default = load_model(str(model_dir), device="cpu", dtype="float32")  # MODEL/heads
    assert default.heads.num_heads == 2 and default.name == str(model_dir)


def test_missing_and_misshapen_weights(tmp_path):
    heads = random_heads(num_heads=2, num_layers=1)
    state = heads.state_dict()

    partial = {k: v for k, v in state.items() if k != "1.0.linear.bias"}
    write_published(tmp_path / "missing", partial, num_heads=2)
    with pytest.raises(UserError, match=r"missing: weights lack key '1\.0\.linear\.bias' \(1 missing\)"):
        MedusaHeads.from_pretrained(tmp_path / "missing")

    write_published(tmp_path / "more_heads", state, num_heads=3)  # config says 3, weights hold 2
    with pytest.raises(UserError, match=r"weights lack key '2\.0\.linear\.weight'"):
        MedusaHeads.from_pretrained(tmp_path / "more_heads")

    write_published(tmp_path / "noproj", {k: v for k, v in state.items() if k != "0.1.weight"}, num_heads=2)
    with pytest.raises(UserError, match=r"lack key '0\.1\.weight' \(head 0's projection\)"):
        MedusaHeads.from_pretrained(tmp_path / "noproj")

    bad = dict(state)
    bad["1.1.weight"] = torch.zeros(V + 1, H)
    write_published(tmp_path / "shape", bad, num_heads=2, fmt="safetensors")
    with pytest.raises(UserError, match=r"weight '1\.1\.weight' has shape \(13, 8\), expected \(12, 8\)"):
        MedusaHeads.from_pretrained(tmp_path / "shape")

    bad = dict(state)
    bad["0.0.linear.weight"] = torch.zeros(H, H + 1)
    write_published(tmp_path / "shape2", bad, num_heads=2)
    with pytest.raises(UserError, match=r"'0\.0\.linear\.weight' has shape \(8, 9\), expected \(8, 8\)"):
        MedusaHeads.from_pretrained(tmp_path / "shape2")

    # weights written with 2 ResBlocks, config claims 1: head 0's projection key is absent
    deep = random_heads(num_heads=2, num_layers=2).state_dict()
    write_published(tmp_path / "layers", deep, num_heads=2, num_layers=1)
    with pytest.raises(UserError, match=r"0\.1\.weight' has shape \(8, 8\), expected|lack key '0\.1\.weight'"):
        MedusaHeads.from_pretrained(tmp_path / "layers")


def test_broken_heads_directories(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty: not a Medusa heads directory \(no config\.json\)"):
        MedusaHeads.from_pretrained(tmp_path / "empty")

    d = tmp_path / "badjson"
    d.mkdir()
    (d / "config.json").write_text("{medusa_num_heads: 2")
    with pytest.raises(UserError, match=r"config\.json: not valid JSON"):
        MedusaHeads.from_pretrained(d)

    d = tmp_path / "nokey"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"medusa_num_layers": 1}))
    with pytest.raises(UserError, match="missing or invalid 'medusa_num_heads'"):
        MedusaHeads.from_pretrained(d)

    d = tmp_path / "noweights"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(UserError, match="no medusa_lm_head.safetensors or medusa_lm_head.pt"):
        MedusaHeads.from_pretrained(d)

    (d / "medusa_lm_head.pt").write_bytes(b"garbage, not a pickle")
    with pytest.raises(UserError, match=r"medusa_lm_head\.pt: cannot read"):
        MedusaHeads.from_pretrained(d)

    torch.save([torch.zeros(2)], d / "medusa_lm_head.pt")
    with pytest.raises(UserError, match=r"medusa_lm_head\.pt: expected a state dict, found list"):
        MedusaHeads.from_pretrained(d)

    (d / "medusa_lm_head.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(UserError, match=r"medusa_lm_head\.safetensors: cannot read"):
        MedusaHeads.from_pretrained(d)


def test_heads_that_do_not_fit_the_model(tmp_path, capsys):
    model_dir = tiny_model_for_tests(tmp_path / "m", vocab=64, hidden=32, num_medusa_heads=2)
    random_heads(hidden=16, vocab=64).save_pretrained(tmp_path / "h16", dtype=torch.float32)
    with pytest.raises(UserError, match=r"h16 has hidden size 16, the model 32"):
        load_model(str(model_dir), str(tmp_path / "h16"), device="cpu")
    random_heads(hidden=32, vocab=100).save_pretrained(tmp_path / "v100", dtype=torch.float32)
    with pytest.raises(UserError, match=r"v100 has vocabulary 100, the model 64"):
        load_model(str(model_dir), str(tmp_path / "v100"), device="cpu")
    # through the CLI: one line, exit status 2, no traceback
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "calibrate",
                "--model",
                str(model_dir),
                "--heads",
                str(tmp_path / "v100"),
                "--data",
                "demo",
                "-o",
                str(tmp_path / "a.json"),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("treeopt: error: --heads:") and err.count("\n") == 1
    assert "Traceback" not in err


def test_bad_model_arguments(tmp_path):
    with pytest.raises(UserError, match="is not a model directory"):
        load_model(str(tmp_path), device="cpu")
    model_dir = tiny_model_for_tests(tmp_path / "m", vocab=64, hidden=32)
    with pytest.raises(UserError, match="not a Medusa heads directory"):
        load_model(str(model_dir), str(tmp_path), device="cpu")
    with pytest.raises(UserError, match="--device: unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(UserError, match="--dtype: unknown dtype 'int8'"):
        resolve_dtype("int8", torch.device("cpu"))
    # auto on a CPU follows its flags (calibration.models.resolve_dtype's rule)
    assert resolve_dtype("auto", torch.device("cpu"), cpuinfo="flags : fpu sse2 avx2") == torch.float32
    assert resolve_dtype("auto", torch.device("cpu"), cpuinfo="flags : fpu avx2 avx512_bf16") == torch.bfloat16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    # the spellings of treeopt.dtypes: torch's names, any case, a torch. prefix
    for spelling, dtype in [
        ("float32", torch.float32),
        ("FP16", torch.float16),
        ("half", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
    ]:
        assert resolve_dtype(spelling, torch.device("cpu")) == dtype
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            resolve_device("cuda")


def test_tiny_model_heads_are_usable(tmp_path):
    lm = load_model(str(tiny_model_for_tests(tmp_path, num_medusa_heads=3)), device="cpu")
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        hidden = lm.model.model(ids).last_hidden_state
        logits = lm.heads(hidden)
    assert logits.shape == (3, 1, 4, 64)
    assert np.isfinite(logits.float().numpy()).all()


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_heads_saved_through_medusa_model_load_as_the_published_keys(tmp_path, fmt):
    """Heads saved as `MedusaModel.state_dict()` keys (`medusa_head.0.0.linear.weight`, the
    attribute name in front of the published `0.0.linear.weight`) load to the same weights and
    the same logits as the published layout."""
    heads = random_heads(num_heads=3, num_layers=2)
    state = {f"medusa_head.{k}": v for k, v in heads.state_dict().items()}
    assert "medusa_head.0.0.linear.weight" in state and "medusa_head.2.2.weight" in state
    loaded = MedusaHeads.from_pretrained(write_published(tmp_path / "h", state, 3, 2, fmt=fmt))
    for key, value in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = torch.randn(4, H)
    assert torch.equal(loaded(x), heads(x))


def test_heads_with_both_key_spellings_are_one_line_naming_the_file(tmp_path):
    heads = random_heads(num_heads=2)
    state = {**heads.state_dict(), **{f"medusa_head.{k}": v.clone() for k, v in heads.state_dict().items()}}
    path = write_published(tmp_path / "h", state, 2, fmt="safetensors")
    with pytest.raises(UserError) as err:
        MedusaHeads.from_pretrained(path)
    message = str(err.value)
    assert message.startswith(f"{path / 'medusa_lm_head.safetensors'}: holds heads both as ")
    assert "medusa_head." in message and "\n" not in message


def test_calibrate_reads_prefixed_heads_as_the_published_ones(tmp_path, capsys):
    """`treeopt calibrate --heads DIR` with `medusa_head.`-prefixed keys counts exactly what
    the same heads in the published layout count."""
    model = tiny_model_for_tests(tmp_path / "tiny", num_medusa_heads=3)
    state = load_file(str(model / "heads" / "medusa_lm_head.safetensors"))
    write_published(tmp_path / "prefixed", {f"medusa_head.{k}": v for k, v in state.items()}, 3, fmt="safetensors")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"def f{i}(x): return x * {i}"}) + "\n" for i in range(3)))
    common = ["calibrate", "--model", str(model), "--data", str(data), "--device", "cpu", "-q"]
    main([*common, "-o", str(tmp_path / "published.json")])
    main([*common, "--heads", str(tmp_path / "prefixed"), "-o", str(tmp_path / "prefixed.json")])
    published = json.loads((tmp_path / "published.json").read_text())
    prefixed = json.loads((tmp_path / "prefixed.json").read_text())
    assert published["heads"] == prefixed["heads"]
