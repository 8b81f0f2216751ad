"""What the reference decoders share around their steps: the state between steps, the result of
a generation, the phase clock and the loop that emits each step's tokens (docs/decoder.md#timing-a-step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from calibration.kv_cache import KVCache
from calibration.model_calls import synchronizer

__all__ = [
    "DecodeResult",
    "DecodeState",
    "PhaseClock",
    "emit_roots",
    "emit_tokens",
    "eos_set",
    "generation_loop",
]


@dataclass
class DecodeResult:
    """What one `TreeDecoder.generate` call produced.

    tokens:   new tokens per sequence, in input order (eos included if hit, nothing after; at
              most max_new_tokens). The first one comes from the prefill.
    accepted: (steps, b) int64, tokens a step produced per sequence = accepted nodes + 1 (the
              bonus), 0 for a sequence already finished. It is the verification outcome: on a
              sequence's last step it may exceed what was kept (see `emitted`).
    emitted:  (steps, b) int64, tokens actually appended to `tokens` per step (the step's
              accepted count cut at eos / max_new_tokens). ``1 + emitted.sum(0) == len(tokens)``.
    draft_s, verify_s, update_s: (steps,) wall seconds per step: candidate layout (head top-k,
              tree tokens, mask, positions); model work (the heads and the tree forward); the
              rest (acceptance, bonus, cache update, bookkeeping).
    prefill_s: wall seconds of the prefill (forward over the prompts, first token).
    """

    tokens: list[list[int]]
    accepted: np.ndarray
    draft_s: np.ndarray
    verify_s: np.ndarray
    update_s: np.ndarray
    prefill_s: float
    emitted: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    @property
    def steps(self) -> int:
        return int(self.accepted.shape[0])

    @property
    def tokens_per_step(self) -> float:
        """Mean of `accepted` over the (sequence, step) pairs where the sequence was active."""
        active = self.accepted > 0
        return float(self.accepted[active].mean()) if active.any() else float("nan")

    @property
    def step_s(self) -> np.ndarray:
        return self.draft_s + self.verify_s + self.update_s


@dataclass
class DecodeState:
    """The decoder's state between steps, for the b sequences still active.

    cache:    `KVCache` holding C slots per sequence.
    valid:    (b, C) bool, cache slots each sequence may attend to (False = padding or hole).
    next_pos: (b,) int64, position id of the root token (number of valid slots).
    root:     (b,) int64, the next token (already emitted, not yet in the cache).
    hidden:   (b, h), the base model's last hidden state at the token that produced `root`:
              the heads draft the next step from it (Hydra++: the prefix layer's output there).
    rows:     (b,) int64, each active sequence's index in the caller's batch.
    draft_cache: Hydra++'s prefix-layer `KVCache` (one layer), slot for slot as `cache` (the
              same `valid`); an EAGLE draft's cache of pairs (`calibration.eagle_decoding`);
              None for other drafters.
    draft_valid: (b, C) bool, the EAGLE draft's valid slots (a prompt's first token has no
              pair); None for other drafters.
    draft:    (b, q) the next step's tree tokens, drafted inside the step before
              (docs/decoder.md#captured-drafting); None: the next step drafts them itself.
    """

    cache: KVCache
    valid: torch.Tensor
    next_pos: torch.Tensor
    root: torch.Tensor
    hidden: torch.Tensor
    rows: torch.Tensor
    draft_cache: KVCache | None = None
    draft_valid: torch.Tensor | None = None
    draft: torch.Tensor | None = None


class PhaseClock:
    """Wall seconds per phase ("prefill", "draft", "verify", "update"), summed over the times
    a phase is entered; ``with clock("verify"): ...``. Disabled: no clock reads and no CUDA
    synchronisation. On CUDA every read synchronises, so a phase owns the kernels it queued."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = enabled
        self.sync = synchronizer(device)
        self.seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "update": 0.0}
        self._phase, self._t0 = "", 0.0

    def _now(self) -> float:
        self.sync()
        return time.perf_counter()

    def __call__(self, phase: str) -> PhaseClock:
        self._phase = phase
        return self

    def __enter__(self) -> None:
        if self.enabled:
            self._t0 = self._now()

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.seconds[self._phase] += self._now() - self._t0

    def lap(self) -> dict[str, float]:
        """The seconds so far, then zero."""
        out = dict(self.seconds)
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        return out


def eos_set(eos_token_id) -> frozenset[int]:
    """None | int | iterable of ints -> the set of end-of-sequence token ids."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset([int(eos_token_id)])
    return frozenset(int(t) for t in eos_token_id)


def emit_roots(out, roots, max_new_tokens: int, eos) -> list:
    """The prefill's first token of every sequence into its output; which ones are finished."""
    finished = []
    for i, tok in enumerate(roots.tolist()):
        out[i].append(tok)
        finished.append(tok in eos or max_new_tokens <= 1)
    return finished


def generation_loop(step, live_rows, drop_finished, out, batch: int, max_new_tokens: int, eos, clock) -> DecodeResult:
    """Step until every sequence has finished, emitting each step's tokens (`emit_tokens`) and
    timing its phases; `clock` has just timed the prefill. Shared by every decoder: `step()`
    returns (new tokens (b_live, q), tokens to keep (b_live,)), `live_rows()` the input index of
    each live sequence, `drop_finished(flags)` removes the finished ones from the state."""
    prefill_s = clock.lap()["prefill"]
    accepted, emitted, seconds = [], [], []
    while live_rows().numel():
        new, n_keep = step()
        with clock("update"):
            acc_row, emi_row, finished = emit_tokens(out, live_rows(), n_keep, new, batch, max_new_tokens, eos)
            drop_finished(finished)
        accepted.append(acc_row)
        emitted.append(emi_row)
        seconds.append(clock.lap())

    def col(phase):
        return np.array([s[phase] for s in seconds])

    return DecodeResult(
        out,
        np.array(accepted, np.int64).reshape(-1, batch),
        col("draft"),
        col("verify"),
        col("update"),
        prefill_s,
        np.array(emitted, np.int64).reshape(-1, batch),
    )


def emit_tokens(out, rows, n_keep, new, batch: int, max_new_tokens: int, eos) -> tuple[np.ndarray, np.ndarray, list]:
    """Append each live sequence's new tokens to its output (`out[i]`, in input order), cut at
    the first eos and at max_new_tokens. Returns the step's accepted and emitted counts per
    input sequence, (batch,) each, and whether each live sequence (in `rows` order) finished.
    A loop over sequences, not tree nodes: each one's cut is its own."""
    accepted, emitted = np.zeros(batch, np.int64), np.zeros(batch, np.int64)
    finished = []
    for i, count, toks in zip(rows.tolist(), n_keep.tolist(), new.tolist(), strict=True):
        take = toks[:count][: max_new_tokens - len(out[i])]
        stop = next((p for p, tok in enumerate(take) if tok in eos), None)
        if stop is not None:
            take = take[: stop + 1]
        out[i].extend(take)
        accepted[i], emitted[i] = count, len(take)
        finished.append(stop is not None or len(out[i]) >= max_new_tokens)
    return accepted, emitted, finished
