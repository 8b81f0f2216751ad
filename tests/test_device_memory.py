"""What a sweep cell needs in memory (calibration.device_memory), against the published size of
Llama-2-7B's KV cache: 0.5 MiB per token in fp16 (32 layers x 2 x 4096 x 2 bytes), 2 GiB at 4096."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from calibration.device_memory import bench_bytes, check_bench_fits
from treeopt.errors import UserError

LLAMA2_7B = SimpleNamespace(
    num_attention_heads=32,
    num_key_value_heads=32,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    max_position_embeddings=4096,
)


def test_a_cell_needs_its_kv_cache_and_its_prefill():
    kv = 2 * 2**30  # 0.5 MiB per token x 4096 tokens
    prefill = (2 * 4096 + 3 * 11008) * 4096 * 2
    assert bench_bytes(LLAMA2_7B, 1, 4096, 2) == kv + prefill
    # grouped-query attention: 8 KV heads keep a quarter of the cache
    gqa = SimpleNamespace(**{**vars(LLAMA2_7B), "num_key_value_heads": 8})
    assert bench_bytes(gqa, 1, 4096, 2) == kv // 4 + prefill


def test_a_cell_beyond_the_positions_or_the_memory_is_refused():
    model = SimpleNamespace(config=LLAMA2_7B, parameters=lambda: iter([torch.zeros(1, dtype=torch.bfloat16)]))
    cpu = torch.device("cpu")
    with pytest.raises(UserError, match="4,097 positions; the model has 4,096"):
        check_bench_fits(model, [1], [4000], 97, cpu)
    check_bench_fits(model, [1], [4000], 96, cpu)  # 4,096 positions, about 2.3 GiB: fits here
    with pytest.raises(UserError, match="GiB for its cache and prefill"):
        check_bench_fits(model, [10**6], [4000], 96, cpu)
