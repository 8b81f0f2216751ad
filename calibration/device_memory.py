"""Whether a measurement fits the model and the device, said before anything is allocated.

A sweep cell builds a KV cache of batch x (context + tree) positions and prefills it in one
forward; a batch of 4096 at a context of 100,000 would ask for hundreds of GB and die inside
torch. `check_bench_fits` turns that into one line naming the option and the estimate.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from treeopt.errors import UserError

#: transient activations of a one-forward prefill, per token, in hidden-size units: the
#: residual stream and a norm's output, plus the MLP's gate, up and product (3 x intermediate)
PREFILL_HIDDEN_COPIES = 2
PREFILL_INTERMEDIATE_COPIES = 3


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on `device`: CUDA's free memory, the CPU's MemAvailable
    (Linux); None where it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def bench_bytes(config, batch: int, positions: int, element_bytes: int) -> int:
    """Bytes a step bench of `batch` sequences of `positions` positions needs beyond the
    weights: the KV cache (2 x layers x KV heads x head size per position) and the prefill's
    activations (`PREFILL_*_COPIES`)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_position = 2 * config.num_hidden_layers * kv_heads * head_dim
    per_position += PREFILL_HIDDEN_COPIES * config.hidden_size
    per_position += PREFILL_INTERMEDIATE_COPIES * getattr(config, "intermediate_size", 4 * config.hidden_size)
    return batch * positions * per_position * element_bytes


def check_bench_fits(model, batches, contexts, max_tokens: int, device: torch.device) -> None:
    """UserError, before any allocation, when the longest context plus `max_tokens` verified
    tokens exceeds the model's positions, or the largest (batch, context) cell's cache and
    prefill exceed the device's free memory."""
    config = model.config
    longest = max(contexts) + max_tokens
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and longest > limit:
        raise UserError(
            f"--context: {max(contexts):,} + {max_tokens} verified tokens is {longest:,} positions; "
            f"the model has {limit:,}"
        )
    free = available_bytes(device)
    if free is None:
        return
    element = next(model.parameters()).element_size()
    need = bench_bytes(config, max(batches), longest, element)
    if need > free:
        raise UserError(
            f"--batch x --context: batch {max(batches):,} at context {max(contexts):,} needs about "
            f"{need / 2**30:,.1f} GiB for its cache and prefill; {device.type} has {free / 2**30:,.1f} GiB free"
        )
