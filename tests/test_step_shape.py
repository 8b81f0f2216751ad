"""The step shape: one frozen value through the latency model, the operators and the grid
(docs/performance-model.md#notation)."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.hardware import load_hardware
from roofline.latency import framework_overhead_s, memory_required_bytes, speculation_overhead_s, step_time_s
from roofline.ops import operators
from roofline.shapes import model_shape
from roofline.step_shape import StepShape, step_of

SHAPE = model_shape("llama-7b")


def test_loose_keywords_name_the_fields_with_units():
    step = StepShape.of(batch=4, tokens=5, context=512, attention="unfused", candidates=2, draft_stages=3)
    assert (step.batch_sequences, step.tokens_per_sequence, step.context_tokens) == (4, 5, 512)
    assert (step.attention, step.candidates_per_sequence, step.draft_stages) == ("unfused", 2, 3)


def test_plain_step_keeps_the_sequences_and_decodes_one_token():
    plain = StepShape(8, 17, 1024, "unfused", 4, 3, tree_verify=True).plain()
    assert (plain.batch_sequences, plain.context_tokens, plain.attention) == (8, 1024, "unfused")
    assert (plain.tokens_per_sequence, plain.candidates_per_sequence, plain.draft_stages) == (1, None, None)
    assert plain.tree_verify is False


def test_a_step_and_loose_arguments_are_not_mixed():
    with pytest.raises(TypeError):
        step_of(StepShape(), {"batch": 2})
    with pytest.raises(TypeError):
        StepShape.of(batch=2, cached=5)


def test_memory_of_a_step_is_weights_plus_its_kv_cache_plus_the_logits():
    # hand-derived: fused attention, no heads; llama-7b fp16: 2 x 32 layers x 4096 x 2 bytes
    # of KV per token; the logits (b q V) are the largest activation at q = 1
    b, s = 3, 100
    kv_per_token = 2 * 32 * 4096 * 2
    logits = b * 1 * 32000 * 2
    mlp = b * 11008 * 2 * 2
    expected = SHAPE.weight_bytes + b * (s + 1) * kv_per_token + max(logits, mlp)
    assert float(memory_required_bytes(SHAPE, None, StepShape(b, 1, s))) == pytest.approx(expected, rel=1e-12)


def test_engine_terms_read_batch_tokens_and_stages_from_the_step():
    hw = load_hardware("h100-sxm").with_(spec_step_overhead_s=1e-3, verified_token_s=1e-5, draft_stage_s=2e-4)
    # 1 ms per speculative step + 10 us x 4 x 5 verified tokens + 0.2 ms x 3 stages
    got = float(speculation_overhead_s(hw, StepShape(4, 5, 0, draft_stages=3)))
    assert got == pytest.approx(1e-3 + 1e-5 * 20 + 2e-4 * 3, rel=1e-12)
    hw0 = hw.with_(spec_step_overhead_s=0.0, verified_token_s=0.0, draft_stage_s=0.0)
    assert float(framework_overhead_s(SHAPE, hw0, StepShape(4, 5, 0))) == pytest.approx(
        hw0.forward_overhead_s + SHAPE.layers * (hw0.layer_overhead_s + hw0.token_overhead_s * 20), rel=1e-12
    )


def test_a_grid_of_steps_is_one_step_shape():
    hw = load_hardware("h100-sxm")
    b = np.array([1, 8])[:, None]
    q = np.array([1, 5, 9])[None, :]
    grid = step_time_s(SHAPE, None, hw, StepShape(b, q, 512), on_oom="ignore")
    assert grid.shape == (2, 3)
    for i, bb in enumerate((1, 8)):
        for j, qq in enumerate((1, 5, 9)):
            assert grid[i, j] == pytest.approx(step_time_s(SHAPE, None, hw, StepShape(bb, qq, 512)), rel=1e-12)
    names = {op.name for op in operators(SHAPE, None, StepShape(2, 3, 4))}
    assert {"q_proj", "qk", "lm_head"} <= names
