"""The latency model: time of one forward pass from its operators and a hardware profile.

    op time   = max(FLOPs / compute rate, bytes / memory rate) + kernels x kernel_overhead_s
                (+ K x head_overhead_s for the K draft heads)
    step time = framework + sum over ops of count x op time + speculation
    framework = forward_overhead_s + layers x (layer_overhead_s + token_overhead_s x b q
                + context_overhead_s or, for q = 1, plain_context_overhead_s x b s)
                (zero for the datasheet GPUs)
    speculation = spec_step_overhead_s (when q > 1) + verified_token_s x b q
                + draft_stage_s x draft stages
                + tree_verify_layer_s x layers (when q > 1 and the tokens branch: a tree)
                                                    (the engine terms; zero for the datasheet GPUs)

Compute rate: GEMMs peak[dtype] x eta_compute x gemm_efficiency(rows = b*q); attention
matmuls the same with attention_efficiency(q x heads/kv_heads); vector work (norms, rotary,
activation, softmax) vector_flops x eta_compute. Memory rate: bandwidth x eta_memory for
weights and activations of GEMMs, times attention_kv_efficiency(keys) for attention's reads of
the KV cache; elementwise_bytes_per_s for vector work.

Verification "candidates" (candidates = c per sequence) verifies the q tokens as c sequences
of q / c tokens that each re-read the context (roofline.ops; docs/performance-model.md#verification-modes).
An operator is "compute", "memory" or "overhead" bound by the largest of its three terms.

Memory: weights + draft heads + KV cache of b x (s + q) tokens + the largest activation
(logits of b x q tokens, or attention scores when unfused) must fit in capacity_bytes;
configurations that do not fit are flagged (NaN times by default, or an error).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from roofline.hardware import GIB, VERIFICATION_MODES, HardwareProfile
from roofline.ops import EAGLE_DEPTH, DraftWork, Op, eagle_layer_shape, kv_split, operators
from roofline.shapes import DraftHeadsShape, ModelShape
from roofline.step_shape import StepShape, step_of
from treeopt.errors import UserError

__all__ = [
    "OpTiming",
    "op_timings",
    "gemm_timing",
    "step_time_s",
    "memory_required_bytes",
    "fits_memory",
    "step_breakdown",
    "StepTerms",
    "step_terms",
    "framework_overhead_s",
    "speculation_overhead_s",
    "candidates_of",
    "stages_of",
]


@dataclass(frozen=True)
class OpTiming:
    """One operator with its predicted times (seconds, one instance; arrays broadcast)."""

    op: Op
    compute_s: np.ndarray
    memory_s: np.ndarray
    overhead_s: np.ndarray

    @property
    def time_s(self) -> np.ndarray:
        return np.maximum(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> np.ndarray:
        """'compute', 'memory' or 'overhead' per element (the largest term)."""
        stacked = np.stack(np.broadcast_arrays(self.compute_s, self.memory_s, self.overhead_s))
        return np.array(["compute", "memory", "overhead"])[np.argmax(stacked, axis=0)]

    @property
    def total_s(self) -> np.ndarray:
        return self.op.count * self.time_s

    @property
    def attained_flops(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.op.flops / self.time_s


def _time_terms(op: Op, dtype: str, hw: HardwareProfile, heads=None):
    if op.kind == "collective":
        # a ring all-reduce: its bytes over the GPU-to-GPU link, plus a fixed latency per collective
        # that does not shrink with batch (docs/performance-model.md#tensor-parallelism)
        memory = op.bytes / hw.interconnect_bytes_per_s
        return np.zeros_like(memory), memory, np.full_like(memory, hw.collective_latency_s)
    peak = hw.peak(dtype)
    if op.kind == "gemm":
        rate_c = peak * hw.eta_compute * hw.weight_gemm_efficiency(op.rows, op.in_features, op.out_features, dtype)
        rate_m = hw.bandwidth_bytes_per_s * hw.eta_memory
    elif op.kind == "attention":
        rate_c = peak * hw.eta_compute * hw.attention_curve(op.rows)
        # the attention kernel's own achieved KV bandwidth, which depends on the keys it reads
        # (docs/performance-model.md#attention-kv-bandwidth)
        rate_m = hw.bandwidth_bytes_per_s * hw.eta_memory * hw.attention_kv_fraction(op.keys)
    else:
        rate_c = hw.vector_flops_per_s * hw.eta_compute
        # the KV-cache update is a plain copy at memory speed; the rest is the framework's
        # elementwise work (norms, rotary, activation, residuals)
        if op.name == "kv_cache":
            rate_m = hw.kv_update_bytes_per_s or hw.bandwidth_bytes_per_s * hw.eta_memory
        else:
            rate_m = hw.elementwise_rate
    compute = op.flops / rate_c
    memory = op.bytes / rate_m
    overhead = np.full_like(compute, 1.0) * op.kernels * hw.kernel_overhead_s
    if op.name == "draft_heads" and heads is not None:
        overhead = overhead + heads.num_heads * hw.head_overhead_s
    elif op.name.startswith("draft_stage_") or (op.name.startswith(EAGLE_DEPTH) and op.name.endswith(".embedding")):
        # a stage is one call of one head module, as each Medusa head is
        # (docs/performance-model.md#drafter-cost); the engine's own per-stage cost is draft_stage_s
        overhead = overhead + (np.asarray(op.kernels) > 0) * hw.head_overhead_s
    # an EAGLE depth's attention has kernels per grid cell (0 where the depth does not run)
    if op.kind == "attention" and np.any(np.asarray(op.kernels) > 0) and hw.attention_block_overhead_s:
        overhead = overhead + op.blocks * hw.attention_block_overhead_s
    return compute, memory, overhead


def candidates_of(verification: str, tokens, candidates):
    """The `candidates` argument of roofline.ops.operators for a verification mode: None for
    "tree"; for "candidates" the given counts (default: every token its own candidate)."""
    if verification == "tree":
        return None
    if verification != "candidates":
        raise UserError(f"--verification: must be one of {', '.join(VERIFICATION_MODES)}, got '{verification}'")
    return tokens if candidates is None else candidates


def op_timings(
    shape: ModelShape, heads: DraftHeadsShape | None, hw: HardwareProfile, step: StepShape | None = None, **where
) -> list[OpTiming]:
    """Every operator of the forward pass of `step` (a `StepShape`, or its loose keywords
    batch, tokens, context, attention, candidates) with its compute, memory and overhead times."""
    ops = operators(shape, heads, step_of(step, where), kv_cache_update=hw.kv_cache_update)
    return [OpTiming(op, *_time_terms(op, shape.dtype, hw, heads)) for op in ops]


def gemm_timing(hw: HardwareProfile, *, dtype: str, dtype_bytes: int, rows, in_features: int, out_features: int):
    """One weight GEMM (rows x in_features times in_features x out_features), priced as a
    forward pass prices its linear layers: 2 r k n FLOPs, k n + r k + r n elements moved, one
    kernel (to set a predicted time beside a measured GEMM's)."""
    rows = np.asarray(rows, dtype=float)
    k, n = float(in_features), float(out_features)
    op = Op(
        "gemm",
        "gemm",
        1,
        2.0 * rows * k * n,
        dtype_bytes * (k * n + rows * k + rows * n),
        rows,
        in_features=k,
        out_features=n,
    )
    return OpTiming(op, *_time_terms(op, dtype, hw))


def memory_required_bytes(
    shape: ModelShape, heads: DraftHeadsShape | None, step: StepShape | None = None, **where
) -> np.ndarray:
    """Weights + heads + KV cache + the largest transient activation of `step`, in bytes.
    Candidate sequences share their sequence's cached keys (paged blocks), so only the
    unfused scores grow with them."""
    step = step_of(step, where)
    gpus = step.tensor_parallel_gpus
    if gpus > 1:
        # one GPU's share: weights and activations split, the KV cache as far as its heads go
        # (docs/performance-model.md#tensor-parallelism)
        one = memory_required_bytes(shape, heads, replace(step, tensor_parallel_gpus=1))
        kv = _kv_bytes(shape, heads, step)
        return (one - kv) / gpus + kv / kv_split(shape, gpus)
    b = np.asarray(step.batch_sequences, dtype=float)
    q = np.asarray(step.tokens_per_sequence, dtype=float)
    s = np.asarray(step.context_tokens, dtype=float)
    c = np.ones(()) if step.candidates_per_sequence is None else np.asarray(step.candidates_per_sequence, dtype=float)
    beta = shape.dtype_bytes
    weights = float(shape.weight_bytes)
    if heads is not None and heads.num_heads > 0:
        weights += heads.params * beta
    kv = b * (s + q) * shape.kv_bytes_per_token
    if isinstance(heads, DraftWork) and heads.cost.prefix_layer:
        # Hydra++'s prefix layer: one base layer and its norm, and its own cache of the context
        # (docs/performance-model.md#drafter-cost)
        one_layer = shape.with_layers(1)
        weights += (one_layer.layer_params + shape.hidden) * beta
        kv = kv + b * (s + q) * one_layer.kv_bytes_per_token
    if isinstance(heads, DraftWork) and heads.cost.own_cache:
        # an EAGLE draft's own cache of the context (docs/performance-model.md#drafter-cost)
        kv = kv + b * (s + q) * eagle_layer_shape(heads.cost, shape.dtype).kv_bytes_per_token
    if isinstance(heads, DraftWork):
        # one stage's logits live at a time: the widest stage's rows
        draft_logits = np.asarray(heads.rows_per_sequence, dtype=float).max(axis=-1) * heads.cost.vocab_size
        logits = b * (q * shape.vocab + draft_logits) * beta
    else:
        head_rows = (
            q if heads is None or heads.tokens_per_sequence is None else np.minimum(q, heads.tokens_per_sequence)
        )
        logits = b * (q + head_rows * (heads.num_heads if heads is not None else 0)) * shape.vocab * beta
    mlp = b * q * shape.intermediate * beta * 2
    scores = b * shape.heads * q * (s + q / c) * beta if step.attention == "unfused" else 0.0
    return weights + kv + np.maximum(np.maximum(logits, mlp), scores)


def _kv_bytes(shape: ModelShape, heads, step: StepShape) -> np.ndarray:
    """The KV cache of `memory_required_bytes` (the model's, and a Hydra++ prefix layer's or an
    EAGLE draft's)."""
    b = np.asarray(step.batch_sequences, dtype=float)
    tokens = np.asarray(step.context_tokens, dtype=float) + np.asarray(step.tokens_per_sequence, dtype=float)
    per_token = shape.kv_bytes_per_token
    if isinstance(heads, DraftWork) and heads.cost.prefix_layer:
        per_token = per_token + shape.with_layers(1).kv_bytes_per_token
    if isinstance(heads, DraftWork) and heads.cost.own_cache:
        per_token = per_token + eagle_layer_shape(heads.cost, shape.dtype).kv_bytes_per_token
    return b * tokens * per_token


def fits_memory(shape, heads, hw: HardwareProfile, step: StepShape | None = None, **where) -> np.ndarray:
    """Whether `step` fits in the profile's memory (broadcasting)."""
    return memory_required_bytes(shape, heads, step_of(step, where)) <= hw.capacity_bytes


@dataclass(frozen=True)
class StepTerms:
    """One decoding step's predicted seconds by term (arrays broadcast like b, q, s): every
    operator, the framework's fixed and per-token costs, and the engine terms of a speculative
    step."""

    timings: tuple[OpTiming, ...]
    framework_s: np.ndarray
    speculation_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        """framework + sum over operators of count x op time + speculation."""
        return self.framework_s + sum(t.total_s for t in self.timings) + self.speculation_s


def step_terms(
    shape: ModelShape, heads: DraftHeadsShape | None, hw: HardwareProfile, step: StepShape | None = None, **where
) -> StepTerms:
    """The terms of one decoding step (`step_time_s` without the memory check; arguments as
    there)."""
    step = step_of(step, where)
    return StepTerms(
        tuple(op_timings(shape, heads, hw, step)),
        framework_overhead_s(shape, hw, step),
        speculation_overhead_s(hw, step, draft_stages=stages_of(heads, step.draft_stages), layers=shape.layers),
    )


def step_time_s(
    shape: ModelShape,
    heads: DraftHeadsShape | None,
    hw: HardwareProfile,
    step: StepShape | None = None,
    *,
    on_oom: str = "nan",
    **where,
):
    """Predicted seconds of one decoding step (b sequences, q new tokens each, s cached): the
    forward pass plus, for q > 1, the profile's engine terms of a speculative step.

    step: a `roofline.step_shape.StepShape`, or its loose keywords (batch, tokens, context,
    attention, candidates, draft_stages). Vectorised: its counts broadcast; returns a float for
    scalar inputs, else an array. candidates: None (tree verification) or candidate sequences
    per sequence. draft_stages: sequential draft stages the step runs (None: those of a
    `DraftWork` drafter, else none). Configurations beyond memory capacity: on_oom="nan" gives
    NaN, "raise" a UserError, "ignore" computes them anyway.
    """
    if on_oom not in ("nan", "raise", "ignore"):
        raise ValueError("on_oom must be 'nan', 'raise' or 'ignore'")
    step = step_of(step, where)
    total = step_terms(shape, heads, hw, step).total_s
    if on_oom != "ignore":
        need = memory_required_bytes(shape, heads, step)
        bad = need > hw.capacity_bytes
        if np.any(bad):
            if on_oom == "raise":
                worst = float(np.max(need))
                raise UserError(
                    f"{shape.name} needs {worst / GIB:.1f} GiB (weights, KV cache, activations) "
                    f"but {hw.name} has {hw.capacity_text()}"
                )
            total = np.where(bad, np.nan, total)
    total = np.asarray(total, dtype=float)
    return float(total) if total.ndim == 0 else total


def framework_overhead_s(shape: ModelShape, hw: HardwareProfile, step: StepShape | None = None, **where):
    """Fixed and per-token framework costs of one forward pass (seconds, broadcasting). With
    candidates, each of the b c candidate sequences is a sequence of q / c tokens to the
    framework."""
    step = step_of(step, where)
    b = np.asarray(step.batch_sequences, dtype=float)
    q = np.asarray(step.tokens_per_sequence, dtype=float)
    s = np.asarray(step.context_tokens, dtype=float)
    c = np.ones(()) if step.candidates_per_sequence is None else np.asarray(step.candidates_per_sequence, dtype=float)
    # Per cached key: a tree step (q > 1) pays for its custom attention mask; plain decoding
    # (q = 1) takes the framework's ordinary causal path, with its own, smaller cost.
    per_key = np.where(q / c > 1, hw.context_overhead_s, hw.plain_context_overhead_s)
    per_layer = hw.layer_overhead_s + hw.token_overhead_s * b * q + per_key * b * c * s
    return hw.forward_overhead_s + shape.layers * per_layer


def speculation_overhead_s(hw: HardwareProfile, step: StepShape | None = None, *, draft_stages=None, layers=0, **where):
    """The engine's costs of a step beyond its forward pass (seconds, broadcasting): a fixed
    cost per speculative step (q > 1), a cost per verified token (b q, plain decoding's one
    included), a cost per sequential draft stage and, for a step whose verified tokens branch
    (`StepShape.tree_verify`, q > 1), a cost per target layer: `layers` (the model's; under
    tensor parallelism every GPU runs them all, so the wall time pays each once)
    (docs/performance-model.md#engine-terms-of-a-speculative-step).
    draft_stages: the stages to charge (default: the step's own, else none)."""
    step = step_of(step, where)
    b = np.asarray(step.batch_sequences, dtype=float)
    q = np.asarray(step.tokens_per_sequence, dtype=float)
    if draft_stages is None:
        draft_stages = 0 if step.draft_stages is None else step.draft_stages
    stages = np.asarray(draft_stages, dtype=float)
    tree = (q > 1) & np.asarray(step.tree_verify, dtype=bool)
    per_step = np.where(q > 1, hw.spec_step_overhead_s, 0.0) + np.where(tree, hw.tree_verify_layer_s * layers, 0.0)
    return per_step + hw.verified_token_s * b * q + hw.draft_stage_s * stages


def stages_of(heads, draft_stages=None):
    """Sequential draft stages of a step: `draft_stages` when given, else the stages a
    `DraftWork` runs, else 0 (Medusa's heads run in parallel)."""
    if draft_stages is not None:
        return draft_stages
    return heads.stages_run if isinstance(heads, DraftWork) else 0


def step_breakdown(shape, heads, hw, step: StepShape | None = None, **where) -> dict[str, float]:
    """Seconds per step by operator name (count included) plus 'framework' (per-forward and
    per-layer fixed costs) and 'speculation' (the engine terms), for scalar inputs."""
    terms = step_terms(shape, heads, hw, step_of(step, where))
    out = {t.op.name: float(t.total_s) for t in terms.timings}
    out["framework"] = float(terms.framework_s)
    out["speculation"] = float(terms.speculation_s)
    return out
