"""Static-shape verification steps, replayed as CUDA graphs on CUDA (docs/decoder.md#static-shape-steps).

A step's forward (the base model over q new tokens against a `KVCache`, then the base lm_head on
all q) runs with the same tensor shapes on every call of a (batch, q, window) step, as gpt-fast
runs its decoding step:

- the q tokens' keys and values are written into the cache's preallocated buffer with
  ``index_copy_`` at an index tensor (filled .. filled + q - 1), not by slicing with Python ints;
- attention reads a fixed window of the buffer, its first `window` slots: the filled slots
  plus q, rounded up to a multiple of `bucket` (the buffer grows to hold it if need be);
- the 4D additive mask (b, 1, q, window) is the eager step's mask (b, 1, q, filled + q), then
  the dtype's most negative value over the slots past it (not yet written, or left over);
- the token ids, position ids, mask and write index live in preallocated buffers
  (`StaticInputs`) that each call copies its inputs into.

On every device the step runs this way (`StepRunner`). On CUDA with ``graphs`` it is captured
once per (batch, q, window, cache buffer) with ``torch.cuda.CUDAGraph`` (PyTorch's recipe:
warm-up calls on a side stream, capture, then ``replay()`` after copying the inputs into the
static buffers) and replayed; a capture that fails falls back to the eager call with a one-line
note. Elsewhere the same function is called eagerly: the CUDA code differs only in the capture.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict

import torch

from calibration.kv_cache import KVCache
from calibration.model_calls import force_sdpa_gqa, lm_head, model_forward_hidden
from calibration.split_attention import split_block

__all__ = [
    "CAPTURE_FAILURES",
    "DEFAULT_BUCKET",
    "GraphStep",
    "STEP_MODES",
    "StaticInputs",
    "StepRunner",
    "graphs_enabled",
    "record_capture_failure",
    "static_window",
    "step_mode",
    "uses_static",
]

#: the decoder's attention window grows in steps of this many slots (one capture per step of it)
DEFAULT_BUCKET = 64
#: captured steps a runner keeps (the oldest is dropped beyond)
MAX_STEPS = 32
#: the reason of every capture that failed in this process (each runner then ran eagerly): a
#: report of captured steps reads it, so that eager steps are never shown as captured ones
CAPTURE_FAILURES: list[str] = []


def record_capture_failure(err: Exception) -> str:
    """The one-line reason of a failed capture, recorded in CAPTURE_FAILURES."""
    reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    CAPTURE_FAILURES.append(reason)
    return reason


def uses_static(graphs: bool | None, device: torch.device) -> bool:
    """Whether verification forwards run in static shapes: `graphs` True always, None (the
    default) on CUDA only, False never. On a CPU there is nothing to capture, and the static
    step times as the eager one does (docs/decoder.md#static-shape-steps), so by default it
    stays eager there and CPU sweeps measured before stay resumable."""
    return graphs is True or (graphs is None and torch.device(device).type == "cuda")


def graphs_enabled(graphs: bool | None, device: torch.device) -> bool:
    """Whether steps are captured as CUDA graphs: on CUDA, where they run in static shapes."""
    return torch.device(device).type == "cuda" and uses_static(graphs, device)


#: how a decoder's verification forwards run (`step_mode`)
STEP_MODES = ("eager", "static", "cuda-graphs")


def step_mode(graphs: bool | None, device: torch.device) -> str:
    """The mode a `graphs` setting gives on `device` (`uses_static`): "eager" (dynamic shapes),
    else "cuda-graphs" on CUDA and "static" (static shapes, run eagerly) elsewhere."""
    if not uses_static(graphs, device):
        return "eager"
    return "cuda-graphs" if graphs_enabled(graphs, device) else "static"


def static_window(filled: int, q: int, bucket: int) -> int:
    """The slots a step's attention reads: filled + q rounded up to a multiple of `bucket`
    (the cache is grown to hold them, as for any write)."""
    return -(-(filled + q) // bucket) * bucket


class StaticInputs:
    """The input buffers of one step shape: token ids and position ids (b, q), the additive
    mask (b, 1, q, window), the cache write index (q,)."""

    def __init__(self, b: int, q: int, window: int, dtype: torch.dtype, device: torch.device):
        self.neg = torch.finfo(dtype).min
        self.tokens = torch.zeros((b, q), dtype=torch.long, device=device)
        self.positions = torch.zeros((b, q), dtype=torch.long, device=device)
        self.mask = torch.full((b, 1, q, window), self.neg, dtype=dtype, device=device)
        self.write = torch.zeros(q, dtype=torch.long, device=device)
        self._arange = torch.arange(q, device=device)
        self._width = 0  # the mask's slots past this one hold `neg`

    def load(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> None:
        """Copy a step's inputs in: mask (b, 1, q, w) with w <= window covers the slots 0..w-1,
        the rest is hidden; the q new entries go to slots start..start+q-1."""
        width = mask.shape[-1]
        if tokens is not self.tokens:  # why: a captured draft is already there (calibration/captured_drafting.py)
            self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.mask[..., :width].copy_(mask)
        if width < self._width:  # why: only a narrower mask than the last leaves slots to hide
            self.mask[..., width : self._width].fill_(self.neg)
        self._width = width
        torch.add(self._arange, start, out=self.write)


class GraphStep:
    """`body()` captured as a CUDA graph (PyTorch's recipe: warm up on a side stream, capture,
    replay); `__call__` replays it and returns the captured outputs, overwritten by the next
    replay. `restore`: input buffers the body itself overwrites (a captured draft writes the
    next step's tokens, calibration/captured_drafting.py), put back after every warm-up call,
    so the first replay reads what the caller staged."""

    def __init__(self, body, warmup: int = 2, restore: tuple[torch.Tensor, ...] = ()):
        saved = [t.clone() for t in restore]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                body()
                for buffer, value in zip(restore, saved, strict=True):
                    buffer.copy_(value)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = body()

    def __call__(self):
        self.graph.replay()
        return self.outputs


class _Step:
    """One (batch, q, window, buffer) step: its input buffers, the cache it writes (the one of
    the latest call: a graph writes the buffer at the address it was captured with, which the
    key matches) and how it runs (a captured graph or the eager body)."""

    def __init__(self, inputs: StaticInputs):
        self.inputs, self.cache = inputs, None
        self.body = self.run = None


class StepRunner:
    """Runs a verification forward in static shapes (the module docstring): ``runner(cache,
    tokens, mask, positions)`` takes the eager step's arguments, tokens (b, q), additive mask
    (b, 1, q, cache.length + q) and positions (b, q), and returns (base logits (b, q, V), last
    hidden states (b, q, h)), the q tokens' keys and values written after the cache's filled
    slots and its length grown by q, exactly as the eager forward leaves it.

    `graphs`: capture on CUDA (`graphs_enabled`). `bucket`: the window's granularity (1: the
    window is exactly filled + q, as the sweep's fixed cells want). On CUDA the returned
    tensors are the graph's outputs, valid until the next call of the same shape.
    `staging_s` lists the seconds each call spent copying its inputs in (decoder work, not
    model work). `split`: attend through the prefix/block split (`calibration.split_attention`),
    else the masked sdpa path. `epilogue(inputs, cache, logits, hidden)`: work after the forward
    inside the same step (and the same graph), its outputs appended to the returned pair
    (`calibration.captured_drafting`: acceptance, the cache keep and the next draft)."""

    def __init__(
        self,
        model,
        *,
        force_gqa: bool = False,
        graphs: bool = False,
        bucket: int = DEFAULT_BUCKET,
        split: bool = False,
        epilogue=None,
    ):
        self.model, self.force_gqa, self.bucket, self.split = model, force_gqa, int(bucket), bool(split)
        self.epilogue = epilogue
        self.graphs = bool(graphs)
        self.notes: list[str] = []
        self.staging_s: list[float] = []
        self._steps: OrderedDict = OrderedDict()

    def __call__(self, cache, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
        t0 = time.perf_counter()
        b, q = tokens.shape
        if not isinstance(cache, KVCache) or cache.buffer is None:
            # another Cache class, or nothing cached yet (the eager forward allocates the buffer)
            with force_sdpa_gqa(self.force_gqa), split_block(self.model, None, self.split):
                hidden = model_forward_hidden(
                    self.model, tokens, attention_mask=mask, position_ids=positions, cache=cache
                )
            return lm_head(self.model, hidden), hidden
        start = cache.length
        window = static_window(start, q, self.bucket)
        if window > cache.capacity:  # rare: the decoder's prefill sizes the buffer for its last window
            cache.reserve(window, cache.buffer[0, 0])
        buffer = cache.buffer
        key = (b, q, window, buffer.data_ptr(), tuple(buffer.shape), buffer.dtype)
        step = self._steps.get(key)
        if step is None:
            step = self._new_step(key, cache, window)
        step.cache = cache
        step.inputs.load(tokens, positions, mask, start)
        self.staging_s.append(time.perf_counter() - t0)
        if step.run is step.body and self.graphs:
            step.run = self._capture(step)
        out = step.run()
        for layer in cache.layers:
            layer.length = start + q
        return out

    def _new_step(self, key, cache, window: int) -> _Step:
        b, q = key[0], key[1]
        inputs = StaticInputs(b, q, window, cache.buffer.dtype, cache.buffer.device)

        step = _Step(inputs)

        def body():
            cache = step.cache
            cache.static_write = (inputs.write, window)
            try:
                with (
                    torch.inference_mode(),
                    force_sdpa_gqa(self.force_gqa),
                    split_block(self.model, inputs.write, self.split),
                ):
                    hidden = model_forward_hidden(
                        self.model,
                        inputs.tokens,
                        attention_mask=inputs.mask,
                        position_ids=inputs.positions,
                        cache=cache,
                    )
                    logits = lm_head(self.model, hidden)
                    if self.epilogue is None:
                        return logits, hidden
                    return (logits, hidden, *self.epilogue(inputs, cache, logits, hidden))
            finally:
                cache.static_write = None

        step.body = step.run = body
        self._steps[key] = step
        while len(self._steps) > MAX_STEPS:
            self._steps.popitem(last=False)
        return step

    def _capture(self, step: _Step):
        """The step's body as a replayable CUDA graph; on any failure the eager body, once noted."""
        body = step.body
        try:
            if self.epilogue is None:
                return GraphStep(body)
            return GraphStep(body, restore=(step.inputs.tokens,))
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
            note = f"note: CUDA graph capture failed ({record_capture_failure(err)}); running steps eagerly"
            self.notes.append(note)
            print(note, file=sys.stderr)
            self.graphs = False
            return body
