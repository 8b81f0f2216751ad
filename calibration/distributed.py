"""Calibration in many processes: `torchrun --nproc-per-node N -m treeopt calibrate ...`
(docs/statistics.md#counts-from-many-processes).

torchrun starts N copies of the command and tells each its place through the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``). Each process takes a contiguous run of whole
batches of the prompts (`shard_bounds`), so every batch is exactly the batch one process would
have run, and calibrates it on its own device (``cuda:LOCAL_RANK`` on GPUs). The counts are
integers, so summing them is exact in any order: hits, positions and token totals are summed
with ``all_reduce`` on int64 tensors, and the joint counts and the rank vectors are gathered
in process order, which is prompt order. The combined table is the one-process table, bit for
bit.

Each process keeps its own checkpoint (`rank_checkpoint_path`) with a fingerprint that names
its shard; a process that fails leaves the others' checkpoints whole, and a rerun with
``--resume`` continues every process from its own. Process 0 writes the outputs, and only
after that, when every process has finished its shard, does each process remove its
checkpoint.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from calibration.counts import CalibrationCounts, rank_dtype
from treeopt.errors import UserError

#: seconds a collective waits for the slowest process before the run fails
COLLECTIVE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Processes:
    """This process's place among the calibration processes (``rank`` of ``world_size``;
    ``local_rank`` picks its device on a machine)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def many(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = Processes()


def processes_from_env(environ=None) -> Processes:
    """The process placement torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``);
    one process when they are absent."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return SINGLE
    try:
        world = int(env["WORLD_SIZE"])
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UserError("RANK/WORLD_SIZE/LOCAL_RANK: not integers (set by torchrun)") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise UserError(f"RANK/WORLD_SIZE: rank {rank} of {world} processes is not a valid placement")
    return Processes(rank, world, local)


def process_device(device: str, processes: Processes) -> str:
    """The device of this process: ``cuda:LOCAL_RANK`` for ``cuda``/``auto`` on a CUDA machine
    with many processes, else `device` unchanged."""
    if not processes.many:
        return device
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{processes.local_rank}"
    if device == "auto" or device == "cpu":
        return "cpu"
    raise UserError(
        f"--device: {device!r} with {processes.world_size} processes; use cuda (each process "
        "takes cuda:LOCAL_RANK) or cpu"
    )


@contextmanager
def process_group(processes: Processes, device: str) -> Iterator[None]:
    """Join the torch.distributed group of the run for the block (nothing for one process).
    CPU tensors travel by gloo, CUDA tensors by NCCL."""
    if not processes.many or dist.is_initialized():
        yield
        return
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(processes.local_rank)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=_dt.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard_bounds(total: int, batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Prompts [first, end) of process `rank`: a contiguous run of whole batches, the batches
    split as evenly as they divide (the last batch may be short)."""
    batches = -(-total // batch_size)
    first = rank * batches // world_size
    last = (rank + 1) * batches // world_size
    return min(total, first * batch_size), min(total, last * batch_size)


def rank_checkpoint_path(checkpoint: str | Path, processes: Processes) -> Path:
    """This process's checkpoint: ``CHECKPOINT.rankR-of-N`` (the path itself for one process)."""
    path = Path(checkpoint)
    if not processes.many:
        return path
    return path.with_name(f"{path.name}.rank{processes.rank}-of-{processes.world_size}")


def shard_fingerprint(fingerprint: dict, processes: Processes, first: int, end: int) -> dict:
    """A process checkpoint's fingerprint: the run's, plus which shard it holds."""
    if not processes.many:
        return fingerprint
    return {**fingerprint, "processes": processes.world_size, "process": processes.rank, "shard": [first, end]}


def all_agree(flag: bool, processes: Processes) -> bool:
    """True when `flag` is true in every process (a collective: every process must call it)."""
    if not processes.many:
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def combine_counts(counts: CalibrationCounts, first: int, processes: Processes) -> CalibrationCounts:
    """The counts of all processes together (a collective). `counts` holds this process's
    shard, begun at prompt `first`; ``prompts_done`` of the result is the number of prompts
    done in all, which is the one-process progress when every shard is done."""
    if not processes.many:
        return counts
    totals = torch.from_numpy(
        np.concatenate(
            [
                counts.hits.ravel(),
                counts.positions,
                np.array([counts.prompts_done - first, counts.tokens, counts.generated], np.int64),
            ]
        )
    )
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    totals = totals.numpy()
    K, width = counts.hits.shape
    ranks, sequence = counts.rank_vectors()
    parts: list = [None] * processes.world_size
    dist.all_gather_object(parts, (counts.joint, ranks, sequence, counts.draft_pools()))
    joint = None
    if counts.joint is not None:
        merged: Counter = Counter()
        for part_joint, *_ in parts:
            merged.update(part_joint)
        joint = dict(merged)
    combined = CalibrationCounts(
        totals[: K * width].reshape(K, width).copy(),
        totals[K * width : K * width + K].copy(),
        joint,
        int(totals[-3]),
        int(totals[-2]),
        int(totals[-1]),
    )
    all_ranks = np.concatenate([p[1] for p in parts]).astype(rank_dtype(width), copy=False)
    all_sequence = np.concatenate([p[2] for p in parts]).astype(np.int32, copy=False)
    if len(all_ranks):
        combined.rank_chunks, combined.sequence_chunks = [all_ranks], [all_sequence]
    # the draft scores' pools, row for row with the ranks (a shard without rows has none)
    pools = [p[3] for p in parts if p[3] is not None]
    if pools:
        combined.pool_chunks = [tuple(np.concatenate(part) for part in zip(*pools, strict=True))]
    return combined
