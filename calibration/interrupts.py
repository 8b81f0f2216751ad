"""Ctrl-C during a calibration: what it leaves (`CalibrationInterrupted`) and the statements
it may not split (`deferred_interrupts`; docs/formats.md#calibration-checkpoint-treeoptcalibration-checkpointv1)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path


class CalibrationInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the counts so far are in `checkpoint` (None if nothing was done)."""

    def __init__(self, checkpoint: Path | None, prompts_done: int):
        super().__init__(f"interrupted after {prompts_done} prompts")
        self.checkpoint = checkpoint
        self.prompts_done = prompts_done


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back for the block and deliver it when the block ends.

    For the few statements that must happen together (a batch's counts and the progress
    marker): an interrupt between them would save hits without the prompts that produced them,
    and a resumed run would count the batch twice
    (docs/formats.md#calibration-checkpoint-treeoptcalibration-checkpointv1).
    Outside the main thread Python raises no KeyboardInterrupt, so there is nothing to hold.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt
