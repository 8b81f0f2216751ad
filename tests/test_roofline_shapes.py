"""roofline.shapes: built-in shapes, Hugging Face config.json, draft heads."""

import json

import pytest

from roofline.shapes import (
    DraftHeadsShape,
    ModelShape,
    builtin_shapes,
    draft_heads_shape,
    load_heads_shape,
    model_shape,
    resolve_heads,
)
from treeopt.errors import UserError

LLAMA_CFG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}


def write_cfg(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "name, billions",
    [
        ("llama-7b", 6.738),
        ("llama-13b", 13.016),
        ("llama-33b", 32.529),
        ("llama-65b", 65.286),
        ("llama-2-70b", 68.977),
        ("llama-3-8b", 8.030),
        ("llama-3-70b", 70.554),
        ("mistral-7b", 7.242),
        ("qwen2-7b", 7.615),
    ],
)
def test_builtin_parameter_counts_match_published_sizes(name, billions):
    # published parameter counts (model cards); qwen2 without its small q/k/v biases
    assert model_shape(name).params / 1e9 == pytest.approx(billions, abs=0.01)


def test_llama_4_maverick_is_its_config_with_the_published_total():
    """Meta's Llama 4 blog: Maverick has 400B total parameters, 17B active, MoE layers of 128
    routed experts (each token to one) and a shared expert; its config.json text_config: 48 layers,
    hidden 5120, intermediate_size 8192 (experts), intermediate_size_mlp 16384 (the dense layers of
    interleave_moe_layer_step 2), 40 heads, 8 KV heads, head_dim 128, vocabulary 202048."""
    m = model_shape("llama-4-maverick")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab) == (48, 5120, 40, 8, 128, 202048)
    assert (m.intermediate, m.expert_intermediate, m.shared_intermediate) == (16384, 8192, 8192)
    assert (m.routed_experts, m.experts_per_token, m.dense_layers, m.moe_layers) == (128, 1, 24, 24)
    assert m.params / 1e9 == pytest.approx(400, rel=0.01)


def test_llama_4_scout_is_transformers_llama4_defaults_with_the_published_total():
    """Meta's Llama 4 blog and model card: Scout has 109B total parameters (the vision encoder
    among them, which a text step does not read), 17B active, 16 experts; transformers'
    Llama4TextConfig, whose defaults its docstring gives as Scout's: 48 layers, hidden 5120,
    intermediate_size 8192 (experts and the shared expert), 40 heads, 8 KV heads, head_dim 128,
    vocabulary 202048, 16 experts, top-1, every layer a MoE layer (interleave_moe_layer_step 1).
    The text model is 107.8B: embeddings and head 2 x 202048 x 5120, attention 48 x (2 x 5120^2 +
    2 x 5120 x 1024), experts 48 x 17 x 3 x 5120 x 8192 (the router's 48 x 5120 x 16 aside)."""
    m = model_shape("llama-4-scout")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab) == (48, 5120, 40, 8, 128, 202048)
    assert (m.expert_intermediate, m.shared_intermediate) == (8192, 8192)
    assert (m.routed_experts, m.experts_per_token, m.dense_layers, m.moe_layers) == (16, 1, 0, 48)
    by_hand = 2 * 202048 * 5120 + 48 * (2 * 5120**2 + 2 * 5120 * 1024) + 48 * 17 * 3 * 5120 * 8192
    assert m.params == pytest.approx(by_hand, rel=1e-3)
    assert m.params / 1e9 == pytest.approx(109, rel=0.02)


def test_vicuna_aliases_and_gqa_shapes():
    v = model_shape("vicuna-7b")
    l7 = model_shape("llama-7b")
    assert (v.layers, v.hidden, v.intermediate, v.heads, v.kv_heads, v.vocab) == (
        l7.layers,
        l7.hidden,
        l7.intermediate,
        l7.heads,
        l7.kv_heads,
        l7.vocab,
    )
    assert v.name == "vicuna-7b" and "same shape" in v.source
    assert model_shape("Vicuna-13B").hidden == 5120
    assert model_shape("vicuna-33b").layers == 60
    l3 = model_shape("llama-3-8b")
    assert (l3.heads, l3.kv_heads, l3.head_dim, l3.kv_dim) == (32, 8, 128, 1024)
    # KV cache per token: 2 (K, V) x 32 layers x 1024 x 2 bytes
    assert l3.kv_bytes_per_token == 2 * 32 * 1024 * 2
    assert set(builtin_shapes()) >= {
        "llama-7b",
        "llama-13b",
        "llama-33b",
        "llama-65b",
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3-8b",
        "llama-3-70b",
        "mistral-7b",
        "qwen2-7b",
    }
    for s in builtin_shapes().values():
        assert s.source


def test_config_json_llama_file_and_directory(tmp_path):
    path = write_cfg(tmp_path, LLAMA_CFG)
    s = model_shape(str(path))
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.vocab, s.dtype, s.dtype_bytes) == (
        32,
        4096,
        32,
        32,
        128,
        32000,
        "fp16",
        2,
    )
    assert model_shape(str(tmp_path)).params == s.params


def test_config_json_mistral_qwen2_defaults(tmp_path):
    mistral = dict(
        LLAMA_CFG,
        architectures=["MistralForCausalLM"],
        intermediate_size=14336,
        num_key_value_heads=8,
        torch_dtype="bfloat16",
    )
    s = model_shape(str(write_cfg(tmp_path, mistral)))
    assert (s.kv_heads, s.dtype) == (8, "bf16")
    qwen = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }
    s = model_shape(str(write_cfg(tmp_path, qwen, "q.json")))
    assert (s.head_dim, s.kv_heads, s.dtype) == (128, 4, "bf16")  # no torch_dtype: bf16
    # no num_key_value_heads: multi-head attention; explicit head_dim wins
    cfg = dict(LLAMA_CFG)
    del cfg["num_key_value_heads"]
    cfg["head_dim"] = 64
    s = model_shape(str(write_cfg(tmp_path, cfg, "c.json")))
    assert (s.kv_heads, s.head_dim, s.q_dim) == (32, 64, 2048)
    # model_type alone is enough
    cfg = dict(LLAMA_CFG)
    del cfg["architectures"]
    assert model_shape(str(write_cfg(tmp_path, cfg, "d.json"))).layers == 32


@pytest.mark.parametrize(
    "key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"]
)
def test_config_missing_key_is_named(tmp_path, key):
    cfg = dict(LLAMA_CFG)
    del cfg[key]
    with pytest.raises(UserError, match=f"missing key '{key}'"):
        model_shape(str(write_cfg(tmp_path, cfg)))


def test_config_errors(tmp_path):
    # a mixture of experts is read (docs/performance-model.md#mixture-of-experts), but not without its experts
    with pytest.raises(UserError, match="mixture-of-experts architecture without its experts"):
        model_shape(str(write_cfg(tmp_path, dict(LLAMA_CFG, architectures=["MixtralForCausalLM"]))))
    with pytest.raises(UserError, match="'GPT2LMHeadModel' is not supported"):
        model_shape(str(write_cfg(tmp_path, dict(LLAMA_CFG, architectures=["GPT2LMHeadModel"]))))
    cfg = dict(LLAMA_CFG)
    del cfg["architectures"], cfg["model_type"]
    with pytest.raises(UserError, match="missing key 'architectures'"):
        model_shape(str(write_cfg(tmp_path, cfg)))
    with pytest.raises(UserError, match="must be a positive integer"):
        model_shape(str(write_cfg(tmp_path, dict(LLAMA_CFG, hidden_size="big"))))
    with pytest.raises(UserError, match="not a multiple of kv_heads"):
        model_shape(str(write_cfg(tmp_path, dict(LLAMA_CFG, num_key_value_heads=5))))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="bad.json: not valid JSON"):
        model_shape(str(bad))
    with pytest.raises(UserError, match="no such file"):
        model_shape(str(tmp_path / "missing" / "config.json"))
    with pytest.raises(UserError, match="a directory without config.json"):
        model_shape(str(tmp_path / ".."))
    with pytest.raises(UserError, match="unknown model 'llama-9b'.*llama-7b"):
        model_shape("llama-9b")
    with pytest.raises(UserError, match="unknown dtype 'fp7'"):
        model_shape("llama-7b", dtype="fp7")


def test_demo_and_heads_next_to_the_model(tmp_path, monkeypatch):
    """`--model demo` resolves, in the application layer, to the bundled model's directory; the
    Medusa heads config next to a model gives the head count and layers unless told otherwise."""
    import treeopt.app.models as app_models

    monkeypatch.setattr(app_models, "DEMO_MODEL_DIR", tmp_path / "demo_model")
    with pytest.raises(UserError, match="demo model is not there"):
        app_models.shape_of("demo")
    (tmp_path / "demo_model" / "heads").mkdir(parents=True)
    write_cfg(
        tmp_path / "demo_model",
        dict(
            LLAMA_CFG,
            hidden_size=256,
            intermediate_size=704,
            num_hidden_layers=5,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=4096,
            torch_dtype="bfloat16",
        ),
    )
    (tmp_path / "demo_model" / "heads" / "config.json").write_text(
        json.dumps({"medusa_num_heads": 4, "medusa_num_layers": 1, "hidden_size": 256, "vocab_size": 4096})
    )
    s = app_models.shape_of("demo", dtype="fp32")
    assert (s.name, s.hidden, s.layers, s.dtype, s.dtype_bytes) == ("demo", 256, 5, "fp32", 4)
    heads = app_models.heads_of("demo", s)
    assert heads == DraftHeadsShape(4, 1, 256, 4096)
    # explicit and accuracy-table head counts win over the config next to the model
    assert resolve_heads(tmp_path / "demo_model", s, accuracy_heads=3).num_heads == 3
    assert resolve_heads(tmp_path / "demo_model", s, num_heads=2, accuracy_heads=3, num_layers=2) == DraftHeadsShape(
        2, 2, 256, 4096
    )


def test_draft_heads_shape():
    s = model_shape("vicuna-7b")
    hd = draft_heads_shape(s, 5, 1)
    assert hd.params == 5 * (4096 * 4096 + 4096 + 4096 * 32000)
    # default: 5 heads of 1 ResBlock, the model's hidden size and vocabulary
    assert resolve_heads("vicuna-7b", s) == DraftHeadsShape(5, 1, 4096, 32000)
    with pytest.raises(UserError, match="num_heads"):
        DraftHeadsShape(-1, 1, 8, 8)


def test_load_heads_shape(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 2, "hidden_size": 32, "vocab_size": 64})
    )
    assert load_heads_shape(tmp_path) == DraftHeadsShape(3, 2, 32, 64)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(UserError, match="missing key 'medusa_num_heads'"):
        load_heads_shape(tmp_path)


def test_modelshape_validation():
    with pytest.raises(UserError, match="'layers' must be a positive integer"):
        ModelShape("x", 0, 8, 16, 2, 2, 4, 32)
    with pytest.raises(UserError, match="dtype fp32 has 4 bytes"):
        ModelShape("x", 1, 8, 16, 2, 2, 4, 32, dtype="fp32", dtype_bytes=2)
