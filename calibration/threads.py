"""One policy for torch's CPU thread count, used by every command that runs a model.

A small model gains little from more threads, while on a CPU shared with other jobs every
operator waits for all its OpenMP threads to be scheduled: on the 2-core development VM with
one core busy, the demo model calibrated 40x slower with 2 threads than with 1
(docs/performance-model.md#measured-on-the-development-machine).
"""

from __future__ import annotations

import contextlib

import torch

from calibration.models import SMALL_MODEL_PARAMS
from treeopt.errors import UserError


def default_threads(model, device: torch.device) -> int | None:
    """1 for a small model on the CPU, else None (torch's own setting)."""
    if device.type != "cpu":
        return None
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS
    return 1 if small else None


@contextlib.contextmanager
def torch_threads(model, device: torch.device, threads: int | None):
    """Run the block with `threads` CPU threads (None: the default policy); yields the count in
    use, and restores torch's setting afterwards."""
    if threads is not None and threads < 1:
        raise UserError(f"--threads: must be at least 1, got {threads}")
    previous = torch.get_num_threads()
    chosen = threads if threads is not None else default_threads(model, device)
    if chosen is not None:
        torch.set_num_threads(chosen)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
