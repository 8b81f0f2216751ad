"""`treeopt hw calibrate`'s attention microbenchmark: the verification attention as the sweep's
steps run it, over the (batch, query tokens, cached tokens) cells its fit needs
(docs/performance-model.md#hardware-calibration).

On a CPU one sequence over 256 cached tokens at q = 1..256 (and one-token attention of 8
sequences) keeps the kernel busy: its time is its throughput. On a GPU that cell is a few
microseconds of latency, and a profile fitted on it predicted large batch x context steps
several times too slow (issue 45). There the benchmark spans batch x context as the sweep
runs them, per query count, so the fit (`roofline.hwfit.attention_efficiency`) reads the
throughput off the slope of time over keys x sequences, and the latency off its intercept.
"""

from __future__ import annotations

import types

import torch

from calibration.model_calls import force_sdpa_gqa
from calibration.split_attention import run_verification_attention
from treeopt.hwmeasurements import AttentionSample, ModelDims

__all__ = [
    "ATTN_CONTEXT_TOKENS",
    "ATTN_QUERIES",
    "GPU_ATTN_BATCHES",
    "GPU_ATTN_CONTEXTS",
    "QUICK_ATTN_QUERIES",
    "add_attention",
    "attention_cells",
]

ATTN_QUERIES = (1, 4, 16, 64, 256)
QUICK_ATTN_QUERIES = (1, 16, 64)
ATTN_CONTEXT_TOKENS = 256
#: the batch x context grid on an accelerator (the sweep's batches and contexts span it)
GPU_ATTN_BATCHES = (1, 8, 64)
GPU_ATTN_CONTEXTS = (512, 2048, 8192)
#: at most this share of the device's memory in one cell's keys and values
GPU_ATTN_MEMORY_SHARE = 1 / 8


def attention_cells(
    device_type: str, queries, dims: ModelDims, dtype_bytes: int, capacity_bytes: float
) -> list[tuple[int, int, int]]:
    """The (batch, query tokens, cached tokens) cells timed on a device of `device_type`: on a
    CPU each query count over ATTN_CONTEXT_TOKENS for one sequence and 8 one-token sequences;
    elsewhere, in addition, every query count over the GPU_ATTN_BATCHES x GPU_ATTN_CONTEXTS grid
    whose keys and values fit in GPU_ATTN_MEMORY_SHARE of `capacity_bytes`."""
    cells = [(1, q, ATTN_CONTEXT_TOKENS) for q in queries] + [(8, 1, ATTN_CONTEXT_TOKENS)]
    if device_type == "cpu":
        return cells
    per_token = 2 * dims.kv_heads * dims.head_dim * dtype_bytes  # K and V of one token
    for q in queries:
        for b in GPU_ATTN_BATCHES:
            for s in GPU_ATTN_CONTEXTS:
                if b * (s + q) * per_token <= GPU_ATTN_MEMORY_SHARE * capacity_bytes:
                    cells.append((b, q, s))
    return cells


def add_attention(bench, timed, keep, dev, tdt, dims: ModelDims, *, quick: bool, capacity: float, path: str) -> None:
    """Time the verification attention of every `attention_cells` cell: q new tokens over s
    cached ones for b sequences, with the step's 4D float mask (the last q slots the block,
    causal among themselves), through the attention `path` the sweep takes (one token: the
    sdpa call, whatever the path), with grouped-query sdpa on a CPU as the decoder runs it
    (docs/decoder.md#gqa-and-sdpa)."""
    queries = QUICK_ATTN_QUERIES if quick else ATTN_QUERIES
    nh, nkv, d = dims.heads, dims.kv_heads, dims.head_dim
    module = types.SimpleNamespace(num_key_value_groups=nh // nkv, is_causal=True)
    size = torch.empty((), dtype=tdt).element_size()
    for b, q, s in attention_cells(dev.type, queries, dims, size, capacity):
        qt = torch.randn(b, nh, q, d, device=dev, dtype=tdt)
        kt = torch.randn(b, nkv, s + q, d, device=dev, dtype=tdt)
        vt = torch.randn(b, nkv, s + q, d, device=dev, dtype=tdt)
        block = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
        seen = torch.cat([torch.ones(q, s, dtype=torch.bool, device=dev), block], -1)
        mask = torch.where(seen, 0.0, torch.finfo(tdt).min).to(tdt)[None, None].expand(b, 1, q, s + q)
        keep.append((qt, kt, vt, mask))
        bench.add(
            "attn",
            lambda st, b=b, q=q, s=s: AttentionSample(b, q, s, st.median_s),
            timed(lambda qt=qt, kt=kt, vt=vt, mask=mask: _timed_call(path, module, qt, kt, vt, mask, d**-0.5)),
        )


def _timed_call(path: str, module, qt, kt, vt, mask, scale: float):
    with force_sdpa_gqa(qt.device.type == "cpu" and module.num_key_value_groups > 1):
        return run_verification_attention(path, module, qt, kt, vt, mask, scale)
