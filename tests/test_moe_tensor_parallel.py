"""Mixture-of-experts shapes and tensor parallelism (docs/performance-model.md#mixture-of-experts,
docs/performance-model.md#tensor-parallelism): the expected-experts formula against a brute-force
simulation of uniform top-k routing, configs in the three published layouts, the all-reduce by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from roofline.hardware import load_hardware
from roofline.latency import memory_required_bytes, op_timings, step_time_s
from roofline.ops import operators
from roofline.shapes import model_shape
from roofline.step_shape import StepShape
from treeopt.errors import UserError


@pytest.mark.parametrize(("experts", "top_k", "tokens"), [(256, 8, 48), (8, 2, 3), (128, 8, 1), (64, 6, 20)])
def test_expected_experts_matches_a_simulation_of_uniform_routing(experts, top_k, tokens):
    rng = np.random.default_rng(7)
    trials = 4000
    # each token picks top_k distinct experts uniformly at random; count the distinct experts the step reads
    picks = np.argsort(rng.random((trials, tokens, experts)), axis=2)[:, :, :top_k]
    hit = np.zeros((trials, experts), bool)
    np.put_along_axis(hit, picks.reshape(trials, -1), True, axis=1)
    simulated = hit.sum(axis=1).mean()
    shape = model_shape("deepseek-v3").__class__(
        name="t", layers=1, hidden=8, intermediate=8, heads=1, kv_heads=1, head_dim=8, vocab=8,
        routed_experts=experts, experts_per_token=top_k, expert_intermediate=8,
    )  # fmt: skip
    assert float(shape.expected_experts(tokens)) == pytest.approx(simulated, rel=0.01)


def test_48_tokens_with_top_8_of_256_read_78_percent_of_the_experts():
    # the practitioners' figure (DeepSeek-V3's routing): 256 (1 - (1 - 8/256)^48) = 200.1 experts
    ds = model_shape("deepseek-v3")
    assert float(ds.expected_experts(48)) / 256 == pytest.approx(0.7817, abs=1e-3)
    assert float(ds.expected_experts(1)) == pytest.approx(8.0)


def test_routing_skew_reads_fewer_experts():
    from dataclasses import replace

    ds = model_shape("deepseek-v3")
    skewed = replace(ds, routing_skew=2.0)
    # as if 128 equally likely experts: 128 (1 - (1 - 8/128)^48)
    assert float(skewed.expected_experts(48)) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 48))
    with pytest.raises(UserError, match="routing skew"):
        replace(ds, routing_skew=0.5)


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return str(path)


def test_moe_configs_in_the_three_published_layouts(tmp_path):
    # Mixtral-8x7B-v0.1's config.json keys (every expert has the dense MLP's size)
    mixtral = {
        "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "num_local_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "bfloat16",
    }  # fmt: skip
    m = model_shape(_write(tmp_path, mixtral))
    assert (m.routed_experts, m.experts_per_token, m.expert_intermediate, m.shared_intermediate) == (8, 2, 14336, 0)
    # 46.7 B parameters, as Mistral AI states for Mixtral 8x7B
    assert m.params / 1e9 == pytest.approx(46.7, abs=0.1)
    # Qwen2-MoE-57B-A14B's keys: a shared expert of its own size
    qwen = {
        "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 3584, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 151936,
        "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 2560,
        "shared_expert_intermediate_size": 20480, "mlp_only_layers": [], "torch_dtype": "bfloat16",
    }  # fmt: skip
    q = model_shape(_write(tmp_path, qwen))
    assert (q.routed_experts, q.expert_intermediate, q.shared_intermediate, q.dense_layers) == (64, 2560, 20480, 0)
    # DeepSeek-V3's keys: shared experts counted, dense first layers, MLA's latent
    deepseek = {
        "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432, "vocab_size": 129280,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
        "first_k_dense_replace": 3, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "q_lora_rank": 1536, "torch_dtype": "bfloat16",
    }  # fmt: skip
    d = model_shape(_write(tmp_path, deepseek))
    assert (d.routed_experts, d.shared_intermediate, d.dense_layers, d.mla_kv_dim) == (256, 2048, 3, 576)
    # MLA caches 576 values per token per layer, not 2 x 128 heads x 128
    assert d.kv_bytes_per_token == 61 * 576 * 2


def test_moe_step_reads_the_expected_experts_weights():
    mix = model_shape("mixtral-8x7b")
    h, ie = 4096, 14336
    for b in (1, 4):
        op = {o.name: o for o in operators(mix, None, StepShape(b, 1, 0))}["experts"]
        distinct = 8 * (1 - (1 - 2 / 8) ** b)
        weights = distinct * 3 * h * ie
        activations = b * 2 * (2 * h + 3 * ie)
        assert float(op.bytes) == pytest.approx(2 * (weights + activations), rel=1e-12)
        assert float(op.flops) == pytest.approx(2 * b * 2 * 3 * h * ie, rel=1e-12)
        assert op.count == 32


def test_a_wider_step_costs_an_moe_more_than_a_dense_model():
    hw = load_hardware("h100-sxm")
    moe, dense = model_shape("qwen3-30b-a3b"), model_shape("llama-3-8b")

    def ratio(shape):
        return step_time_s(shape, None, hw, StepShape(1, 8, 1024)) / step_time_s(shape, None, hw, StepShape(1, 1, 1024))

    # 8 tokens reach ~ 128 (1 - (1 - 1/16)^8) = 51 experts instead of 8: verification is not nearly free
    assert ratio(moe) > 1.5 * ratio(dense)


def test_all_reduce_priced_by_hand():
    hw = load_hardware("h100-sxm")
    shape = model_shape("llama-3-70b")
    b, q, n = 8, 4, 8
    ar = [
        t
        for t in op_timings(shape, None, hw, StepShape(b, q, 1024, tensor_parallel_gpus=n))
        if t.op.name == "all_reduce"
    ]
    assert len(ar) == 1 and ar[0].op.count == 2 * 80
    # ring all-reduce of b q x 8192 bf16 values: 2 (N - 1) / N of them over NVLink's 450 GB/s a direction
    message = b * q * 8192 * 2
    # 5 us: the engines' one-shot all-reduce in a captured step on H100 (published, docs)
    by_hand = 5e-6 + 2 * 7 / 8 * message / 450e9
    assert float(ar[0].time_s) == pytest.approx(by_hand, rel=1e-12)


def test_tensor_parallel_splits_weights_and_kv_per_gpu():
    shape = model_shape("llama-3-70b")
    one = StepShape(4, 1, 4096)
    eight = StepShape(4, 1, 4096, tensor_parallel_gpus=8)
    kv = 4 * 4097 * 2 * 80 * 8 * 128 * 2  # 8 KV heads: one per GPU
    full = float(memory_required_bytes(shape, None, one))
    per_gpu = float(memory_required_bytes(shape, None, eight))
    assert per_gpu == pytest.approx((full - kv) / 8 + kv / 8, rel=1e-12)
    # 16 GPUs: the 8 KV heads cannot split further, each GPU keeps its head's whole cache
    sixteen = float(memory_required_bytes(shape, None, StepShape(4, 1, 4096, tensor_parallel_gpus=16)))
    assert sixteen == pytest.approx((full - kv) / 16 + kv / 8, rel=1e-12)
    # llama-3-70b does not fit one H100 but fits eight
    hw = load_hardware("h100-sxm")
    assert np.isnan(step_time_s(shape, None, hw, one))
    assert np.isfinite(step_time_s(shape, None, hw, eight))


def test_projections_split_by_heads_and_the_latent_cache_is_replicated():
    def ops_of(shape, n):
        return {o.name: o for o in operators(shape, None, StepShape(2, 1, 512, tensor_parallel_gpus=n))}

    llama = model_shape("llama-3-70b")  # 8 KV heads: K/V projections split 8 ways at most
    assert float(ops_of(llama, 16)["k_proj"].bytes) == pytest.approx(float(ops_of(llama, 1)["k_proj"].bytes) / 8)
    assert float(ops_of(llama, 16)["q_proj"].bytes) == pytest.approx(float(ops_of(llama, 1)["q_proj"].bytes) / 16)
    ds = model_shape("deepseek-v3")  # MLA: the heads' projections split 8 ways, the cached latent is read whole
    one, eight = ops_of(ds, 1), ops_of(ds, 8)
    assert float(eight["k_proj"].bytes) == pytest.approx(float(one["k_proj"].bytes) / 8)
    assert float(eight["kv_cache"].bytes) == pytest.approx(float(one["kv_cache"].bytes))


def test_mla_models_have_their_published_parameter_counts(tmp_path):
    """DeepSeek-V3 (technical report, arXiv 2412.19437: 671 B without its 14 B multi-token
    prediction module) and DeepSeek-V2-Lite (model card: 15.7 B, no query rank), from their
    config.json keys: MLA's low-rank projections, not multi-head attention's (which gave 688 B)."""
    from roofline.shapes import model_shape as from_config

    v3 = model_shape("deepseek-v3")
    assert v3.params == pytest.approx(671e9, rel=5e-4)
    lite = {
        "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 10944, "vocab_size": 102400,
        "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2,
        "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16",
    }  # fmt: skip
    shape = from_config(_write(tmp_path, lite))
    assert shape.mla_q_rank == 0
    assert shape.params == pytest.approx(15.7e9, abs=0.05e9)


def test_mla_attention_works_in_the_latent():
    """Absorbed MLA by hand (DeepSeek-V2, arXiv 2405.04434 section 2.1.2) for DeepSeek-V3 at batch
    1, 1 token, 1000 cached: the scores over 512 + 64 dimensions, the output over 512, per head
    and key, one 576-value latent read per key for all 128 heads; the projections' weights once."""
    ds = model_shape("deepseek-v3")
    ops = {o.name: o for o in operators(ds, None, StepShape(1, 1, 1000))}
    keys = 1001
    assert float(ops["qk"].flops) == pytest.approx(2 * 128 * keys * 576)
    assert float(ops["pv"].flops) == pytest.approx(2 * 128 * keys * 512)
    assert float(ops["qk"].bytes) == pytest.approx(2 * (128 * 576 + keys * 576))
    weights = {"q_a_proj": 7168 * 1536, "q_proj": 1536 * 128 * 192, "kv_a_proj": 7168 * 576,
               "k_proj": 128 * 128 * 512, "v_proj": 128 * 512 * 128, "o_proj": 128 * 128 * 7168}  # fmt: skip
    for name, elements in weights.items():
        # weights dominate a one-token step: within the row's activations of the weights
        assert elements * 2 <= float(ops[name].bytes) <= elements * 2 * 1.01, name
    assert float(ops["kv_cache"].bytes) == pytest.approx(2 * 2 * 576)  # the new latent read and written
