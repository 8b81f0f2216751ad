"""The architectures the roofline prices and those treeopt's decoder runs are kept in step: each
one the roofline lists either loads (sdpa, else the eager attention every transformers model
has: Gemma-2 refuses sdpa) and decodes, or `treeopt run` refuses it in one line before anything
loads or calibrates; an architecture the roofline does not price (GPT-NeoX) is refused before
calibration, not after it."""

from __future__ import annotations

import json

import pytest
import transformers

from calibration.model_calls import attention_refusal
from calibration.models import check_decodable
from calibration.random_model import RandomModel, build_random_model, read_model_config
from roofline.shapes import _LLAMA_LIKE, shape_from_config
from treeopt.app.stages import calibrate as stage
from treeopt.cli import main
from treeopt.errors import UserError

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 256,
    # special tokens inside the small vocabulary (Phi-3's default pad id 32000 is not)
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_config(tmp_path, arch: str, **extra) -> object:
    model_type = transformers.AutoConfig.for_model(arch.removesuffix("ForCausalLM").lower()).model_type
    doc = {"model_type": model_type, "architectures": [arch], **SMALL, **extra}
    folder = tmp_path / arch
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("arch", sorted(a for a in _LLAMA_LIKE if hasattr(transformers, a)))
def test_every_architecture_the_roofline_prices_loads_or_is_refused_up_front(tmp_path, arch):
    folder = tiny_config(tmp_path, arch)
    doc = json.loads((folder / "config.json").read_text())
    shape_from_config(doc, name=arch)  # the roofline prices it
    config = read_model_config(folder)
    loaded = build_random_model(RandomModel(config, arch, "medusa", 2, 0), device="cpu", dtype="float32")
    assert loaded.model.config._attn_implementation in ("sdpa", "eager")  # no traceback: it loads
    why = attention_refusal(loaded.model.config)
    if why is None:
        check_decodable(str(folder))
    else:  # the decoder cannot run it: refused before anything loads, in one line
        with pytest.raises(UserError, match="the roofline still prices it"):
            check_decodable(str(folder))


@pytest.mark.parametrize("arch", sorted(a for a in _LLAMA_LIKE if not hasattr(transformers, a)))
def test_an_architecture_whose_code_is_not_in_transformers_is_refused_up_front(tmp_path, arch):
    folder = tmp_path / arch
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": arch.lower(), "architectures": [arch], **SMALL}))
    with pytest.raises(UserError, match="trust_remote_code"):
        check_decodable(str(folder))


def test_gemma2_loads_with_eager_attention(tmp_path):
    config = read_model_config(tiny_config(tmp_path, "Gemma2ForCausalLM"))
    loaded = build_random_model(RandomModel(config, "g", "medusa", 2, 0), device="cpu", dtype="float32")
    assert loaded.model.config._attn_implementation == "eager"


def test_run_refuses_gpt_neox_before_calibrating(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "neox"
    folder.mkdir()
    doc = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], **SMALL}
    (folder / "config.json").write_text(json.dumps(doc))

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated a model the roofline cannot price")

    monkeypatch.setattr(stage, "calibrate", no_calibration)
    argv = ["run", "--model", str(folder), "--data", "demo", "--validation-data", "demo-validation"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "-o", str(tmp_path / "r")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPTNeoXForCausalLM" in err[0] and "not supported" in err[0]
    assert not (tmp_path / "r").exists()


def test_a_draft_models_steps_are_refused_before_loading_in_its_own_terms(tmp_path, monkeypatch, capsys):
    """The demo's draft model drafts up to 16 tokens: greedy labels for every draft position
    need 17 generated tokens per prompt; --steps 16 is refused before the model loads."""

    def no_calibration(*args, **kwargs):
        raise AssertionError("loaded and calibrated before refusing --steps")

    monkeypatch.setattr(stage, "calibrate", no_calibration)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--drafter", "draft-model", "--steps", "16", "-o", str(tmp_path / "r")])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "a draft model drafting up to 16 tokens needs at least 17" in line and "(heads + 1)" not in line
    assert not (tmp_path / "r").exists()
