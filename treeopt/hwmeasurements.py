"""Raw timings of `treeopt hw calibrate`, before any fit (docs/performance-model.md#hardware-calibration).

calibration.hwbench measures them on a device with torch; roofline.hwfit turns them into a
hardware profile with numpy. Every time is seconds per call: the median of interleaved rounds
(treeopt.timing), so bursts of slowdown do not end up in the profile.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AttentionSample",
    "DeviceFacts",
    "ElementwiseSample",
    "ForwardSample",
    "GemmSample",
    "HardwareMeasurements",
    "HeadsSample",
    "KvUpdateSample",
    "LayerElementwiseSample",
    "ModelDims",
    "SquareGemmSample",
    "StreamSample",
    "WeightShape",
]


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a Llama-like decoder that size the microbenchmarks.

    dtype: the compute dtype, "fp32", "bf16" or "fp16"; weight_bytes: all weights in it.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype: str
    tied_embeddings: bool
    weight_bytes: int


@dataclass(frozen=True)
class WeightShape:
    """One weight matrix shape (in_features x out_features) and how many times a forward pass
    multiplies by a weight of that shape; label names the projections that share it."""

    label: str
    in_features: int
    out_features: int
    uses: int


@dataclass(frozen=True)
class ElementwiseSample:
    """`x + y` on two vectors of `elements` each (reads two, writes one)."""

    elements: int
    time_s: float


@dataclass(frozen=True)
class LayerElementwiseSample:
    """The framework's own elementwise work of one decoder layer (two RMSNorms, rotary on q
    and k, SiLU(gate) * up, two residual adds) on `rows` token rows."""

    rows: int
    time_s: float


@dataclass(frozen=True)
class StreamSample:
    """One read (a sum) over a buffer of `buffer_bytes`."""

    buffer_bytes: int
    time_s: float


@dataclass(frozen=True)
class SquareGemmSample:
    """One `size` x `size` by `size` x `size` matrix product in `dtype`."""

    dtype: str
    size: int
    time_s: float

    @property
    def flops(self) -> float:
        return 2.0 * self.size**3


@dataclass(frozen=True)
class GemmSample:
    """F.linear on `rows` rows. weight None: one pass over every weight of the model (each
    WeightShape `uses` times), time_s for the whole pass. Otherwise `copies` calls on distinct
    weights of that shape, computing only the first `columns_timed` output columns, time_s for
    all of them."""

    rows: int
    time_s: float
    weight: WeightShape | None = None
    columns_timed: int = 0
    copies: int = 1


@dataclass(frozen=True)
class AttentionSample:
    """scaled_dot_product_attention with a float 4D mask: `query_rows` new tokens per sequence
    over `context_tokens` cached ones, for `batch` sequences (all of the model's heads)."""

    batch: int
    query_rows: int
    context_tokens: int
    time_s: float


@dataclass(frozen=True)
class KvUpdateSample:
    """The decoder's KV-cache update of one layer: `new_tokens` tokens' K and V written after
    `context_tokens` cached ones for `batch` sequences, then cropped back."""

    batch: int
    context_tokens: int
    time_s: float
    new_tokens: int = 1


@dataclass(frozen=True)
class ForwardSample:
    """One forward of a `layers`-layer model: `tokens` new tokens for each of `batch`
    sequences over `context_tokens` cached ones. spread: (p90 - p10) / median of the samples."""

    layers: int
    batch: int
    tokens: int
    context_tokens: int
    time_s: float
    spread: float = 0.0


@dataclass(frozen=True)
class HeadsSample:
    """`num_heads` Medusa heads on one token's hidden state."""

    num_heads: int
    time_s: float


@dataclass(frozen=True)
class DeviceFacts:
    """The measured machine. kind: "cpu" or "cuda"; threads: torch CPU threads (None on CUDA);
    load averages (1, 5, 15 minutes) before and after measuring, None where unknown."""

    name: str
    kind: str
    capacity_bytes: float
    threads: int | None
    cpu_count: int
    torch_version: str
    framework: str
    load_average_before: tuple[float, ...] | None
    load_average_after: tuple[float, ...] | None


@dataclass(frozen=True)
class HardwareMeasurements:
    """Everything one calibration run measured.

    forwards: the probe model (the model itself when small, else a small proxy) at several
    (layers, batch, tokens, context); validation: the full model's forwards (none when it is
    too large to run). gemm_weights: the weight shapes the GEMM samples cover.
    """

    device: DeviceFacts
    dtype: str
    quick: bool
    rounds: int
    date_utc: str
    elapsed_s: float
    elementwise: tuple[ElementwiseSample, ...]
    layer_elementwise: tuple[LayerElementwiseSample, ...]
    stream: StreamSample
    square_gemms: tuple[SquareGemmSample, ...]
    gemm_weights: tuple[WeightShape, ...]
    gemms: tuple[GemmSample, ...]
    attention: tuple[AttentionSample, ...]
    kv_update: tuple[KvUpdateSample, ...]
    forwards: tuple[ForwardSample, ...]
    heads: tuple[HeadsSample, ...]
    validation: tuple[ForwardSample, ...] = ()
    #: how the forwards ran ("eager", "static" or "cuda-graphs", as a sweep's steps) and the
    #: captures that failed and were timed eagerly instead
    steps: str = "eager"
    failed_captures: tuple[str, ...] = ()
