"""Operators of one forward pass: FLOPs and minimum bytes moved (docs/performance-model.md#operators, the
Medusa paper's Appendix G, Table 5).

A step processes q new tokens per sequence for b sequences that already have s cached tokens:
prefill is q = prompt length with s = 0, plain decoding q = 1, tree verification q = n + 1.
The q new tokens attend to s + q keys. All quantities broadcast over numpy arrays of b, q, s,
so a whole grid of configurations is one call.

Per decoder layer (count = layers): attn_norm, q_proj, k_proj, v_proj, rotary, kv_cache,
qk, softmax, pv, o_proj, attn_residual, mlp_norm, gate, up, act, down, mlp_residual.
Once per step: embedding, final_norm, lm_head, draft_heads (K heads on every one of the q
tokens, or on `tokens_per_sequence` of them; absent when there are no heads). A sequential
drafter (`DraftWork`: Hydra heads, the MLP speculator) instead runs one operator per stage,
draft_stage_1 .. draft_stage_D, each on the nodes of the depth above that have children
(docs/performance-model.md#drafter-cost); Hydra++ adds one decoder layer, prefix_layer.

Verification (docs/performance-model.md#verification-modes): "tree" attends the q tokens of a
sequence under a tree mask and reads its KV cache once; "candidates" splits them into c
candidate sequences of q / c tokens each, verified as c independent sequences (batch
expansion): every candidate re-reads its sequence's s cached keys. Only attention differs;
every token-wise operator sees the same b q rows.

Bytes are the minimum traffic in units of the model's dtype size β: weights once, inputs read
once, outputs written once. Fused (flash) attention keeps the q x (s+q) scores on chip;
unfused attention (Medusa's reference code) writes them, softmax reads and writes them, and PV
reads them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from roofline.shapes import DraftHeadsShape, ModelShape
from roofline.step_shape import StepShape, step_of
from treeopt.drafter_cost import DraftCost
from treeopt.errors import UserError

__all__ = [
    "Op",
    "operators",
    "check_candidates",
    "LAYER_OPS",
    "MLA_LAYER_OPS",
    "STEP_OPS",
    "ATTENTION_MODES",
    "DraftWork",
    "draft_stage_ops",
    "EAGLE_DEPTH",
    "eagle_layer_shape",
    "drafter_work",
    "split_over_gpus",
    "kv_split",
    "SPLIT_OPS",
    "KV_OPS",
]

ATTENTION_MODES = ("fused", "unfused")
LAYER_OPS = (
    "attn_norm",
    "q_proj",
    "k_proj",
    "v_proj",
    "rotary",
    "kv_cache",
    "qk",
    "softmax",
    "pv",
    "o_proj",
    "attn_residual",
    "mlp_norm",
    "gate",
    "up",
    "act",
    "down",
    "mlp_residual",
)
#: a multi-head latent attention layer's operators beside LAYER_OPS (`_mla_projection_ops`)
MLA_LAYER_OPS = ("q_a_proj", "q_a_norm", "kv_a_proj", "kv_a_norm")
STEP_OPS = ("embedding", "final_norm", "lm_head", "draft_heads")


@dataclass(frozen=True)
class Op:
    """One operator; flops, bytes and rows are per instance and broadcast like b, q, s.

    kind: "gemm" (weight matmul; efficiency by rows = b*q), "attention" (qk, pv; efficiency
    by query rows per KV head = q * heads / kv_heads), "vector" (elementwise and softmax).
    count: instances per step (the number of layers for per-layer operators).
    kernels: kernel launches per instance (an array for a draft stage, which runs in some
    configurations of a grid and not in others).
    """

    name: str
    kind: str
    count: int
    flops: np.ndarray
    bytes: np.ndarray
    rows: np.ndarray
    kernels: np.ndarray | float = 1.0
    blocks: np.ndarray | float = 0.0  # attention: sequences x heads per call
    keys: np.ndarray | float = 0.0  # attention: keys each attending sequence reads (s + its tokens)
    in_features: float = 0.0  # a weight GEMM's K and N (0: not one GEMM of known shape)
    out_features: float = 0.0

    @property
    def intensity(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.bytes > 0, self.flops / np.where(self.bytes > 0, self.bytes, 1), np.inf)


@dataclass(frozen=True)
class DraftWork:
    """A sequential drafter's work in one step: its shape and, per stage, the rows per
    sequence it runs on, (..., stages) broadcasting like b, q, s over the leading axes (0: the
    stage does not run; `roofline.grid.draft_rows_by_prefix` gives them for a tree).

    prefix_tokens_per_sequence: Hydra++ only, the tokens per sequence its prefix layer reads in
    the step: the previous step's accepted tokens, τ of the tree in the steady state
    (`roofline.grid.speedup_grid` sets it); any real >= 1, broadcasting like b, q, s."""

    cost: DraftCost
    rows_per_sequence: np.ndarray
    prefix_tokens_per_sequence: np.ndarray | float = 1.0

    @property
    def stages_run(self) -> np.ndarray:
        """Stages that run (rows > 0), broadcasting like b, q, s."""
        return (np.asarray(self.rows_per_sequence) > 0).sum(axis=-1)

    @property
    def num_heads(self) -> int:
        return self.cost.stages

    @property
    def params(self) -> int:
        return self.cost.params

    def describe(self) -> str:
        return self.cost.describe()


def drafter_work(
    cost: DraftCost, *, rows_per_stage, heads_run: int, tokens_per_sequence=None
) -> DraftWork | DraftHeadsShape:
    """A drafter's work in one step from its cost shape (docs/performance-model.md#drafter-cost):
    a sequential drafter runs stage d on rows_per_stage[d] rows per sequence (the stages past
    them do not run); parallel heads (Medusa's) run `heads_run` heads, each on
    `tokens_per_sequence` tokens per sequence (None: all q)."""
    if cost.sequential:
        rows = np.zeros(cost.stages)
        rows[: len(rows_per_stage)] = rows_per_stage
        return DraftWork(cost, rows)
    return DraftHeadsShape(
        heads_run, cost.layers, cost.hidden_size, cost.vocab_size, tokens_per_sequence=tokens_per_sequence
    )


def draft_stage_ops(work: DraftWork, batch) -> list[Op]:
    """One operator per stage of a sequential drafter over b x rows_d rows (d = 1..D), without
    dtype scaling of bytes (elements; `operators` multiplies by β).

    Hydra head d (docs/performance-model.md#drafter-cost): first block over the w = (d + 2)·h
    wide input [h_t, path embeddings]: two biased GEMMs w x h (linear, residual projection) +
    6 FLOP per output element (bias, SiLU, residual); L - 1 ResBlocks as Medusa's; the biased
    projection h x V; the gather of the children's embeddings (h each) and the copy that
    widens their input. MLP speculator stage d: the gather of the token's embedding (inner
    wide), the state projection w x inner, ~10 FLOP per element for the weighted sum,
    LayerNorm and GELU, the head inner x V."""
    cost = work.cost
    rows_all = np.asarray(work.rows_per_sequence, dtype=float)
    b = np.asarray(batch, dtype=float)
    h, w, V, L = float(cost.hidden_size), float(cost.inner_size), float(cost.vocab_size), float(cost.layers)
    ops = []
    for d in range(cost.stages):  # at most a handful of stages; every array op below is vectorised
        r = b * rows_all[..., d] if d < rows_all.shape[-1] else np.zeros_like(b)
        runs = (r > 0).astype(float)
        width = float(cost.first_input_width(d))
        if cost.drafter == "mlp-speculator":
            flops = 2 * r * width * w + 10 * r * w + 2 * r * w * V
            weights = (width * w + 2 * w + w * V) * runs
            acts = 2 * r * w + r * width + 3 * r * w + r * V
            kernels = 7.0
        else:
            gemms = 2.0 if cost.grounded else 1.0
            flops = (
                gemms * 2 * r * width * h + 6 * r * h + (L - 1) * (2 * r * h * h + 6 * r * h) + 2 * r * h * V + r * V
            )
            weights = (gemms * (width * h + h) + (L - 1) * (h * h + h) + h * V + V) * runs
            acts = gemms * r * width + 3 * r * h + (L - 1) * 4 * r * h + r * h + r * V
            kernels = gemms + 2 + 3 * (L - 1) + 1
            if cost.grounded and d + 1 < cost.stages:
                # the children's inputs: gather their embeddings (h each) and copy the widened input
                nxt = b * rows_all[..., d + 1] if d + 1 < rows_all.shape[-1] else np.zeros_like(b)
                acts = acts + nxt * (2 * h + 2 * (width + h))
                kernels = kernels + 2 * (nxt > 0)
        ops.append(
            Op(
                f"draft_stage_{d + 1}",
                "gemm",
                1,
                np.asarray(flops, dtype=float),
                np.asarray(weights + acts, dtype=float),
                np.asarray(r, dtype=float),
                kernels * runs,
            )
        )
    return ops


def _check(name: str, value, minimum: int) -> np.ndarray:
    arr = np.asarray(value)
    if (
        arr.dtype.kind not in "iuf"
        or np.any(~np.isfinite(arr))
        or np.any(arr < minimum)
        or np.any(arr != np.round(arr))
    ):
        raise UserError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return arr.astype(np.float64)


def check_candidates(tokens, candidates) -> np.ndarray:
    """Candidate sequences per sequence: integers in 1..tokens (ones for tree verification)."""
    c = _check("--candidates", candidates, 1)
    if np.any(c > np.asarray(tokens, dtype=float)):
        raise UserError(f"--candidates: must be at most the tokens verified per sequence, got {candidates!r}")
    return c


def operators(
    shape: ModelShape,
    heads: DraftHeadsShape | DraftWork | None = None,
    step: StepShape | None = None,
    *,
    kv_cache_update: str = "append",
    **where,
) -> list[Op]:
    """Every operator of one forward pass over a step's new tokens.

    step: a `roofline.step_shape.StepShape` (or its loose keywords batch, tokens, context,
    attention, candidates): batch (b >= 1), tokens (q >= 1), context (s >= 0, cached tokens
    before this step) may be numpy arrays; they broadcast. heads=None or heads.num_heads == 0:
    no draft heads; a `DraftWork`: a sequential drafter's stages (`draft_stage_ops`) and, for
    Hydra++, its prefix layer once per step: one base decoder layer and its final norm over the
    tokens the previous step accepted (`DraftWork.prefix_tokens_per_sequence`), attending to its
    own cache of the s context entries (docs/performance-model.md#drafter-cost).
    kv_cache_update: "append" writes the q new K/V rows; "concat" (transformers'
    DynamicCache) reads the s cached rows and writes all s + q.
    The step's candidates: None (tree verification) or the c candidate sequences the q tokens
    of each sequence are split into (batch expansion, 1 <= c <= q; broadcasts).
    """
    step = step_of(step, where)
    attention = step.attention
    if attention not in ATTENTION_MODES:
        raise UserError(f"--attention: must be one of {', '.join(ATTENTION_MODES)}, got '{attention}'")
    if kv_cache_update not in ("append", "concat"):
        raise UserError(f"kv_cache_update: must be 'append' or 'concat', got '{kv_cache_update}'")
    b = _check("--batch", step.batch_sequences, 1)
    q = _check("--tokens", step.tokens_per_sequence, 1)
    s = _check("--context", step.context_tokens, 0)
    candidates = step.candidates_per_sequence
    c = np.ones(()) if candidates is None else check_candidates(step.tokens_per_sequence, candidates)
    ops = _forward_ops(shape, heads, b, q, s, c, attention, kv_cache_update)
    n = step.tensor_parallel_gpus
    if step.expert_parallel and not shape.is_moe:
        raise UserError(f"--expert-parallel: {shape.name} has no routed experts to spread over the GPUs")
    if n == 1:
        return ops
    return split_over_gpus(ops, shape, n, np.broadcast_arrays(b, q, s)[0] * q, expert_parallel=step.expert_parallel)


#: operators whose work Megatron-style tensor parallelism splits over the GPUs: heads, MLP
#: columns and rows, experts, the vocabulary (docs/performance-model.md#tensor-parallelism)
SPLIT_OPS = frozenset(
    {"q_proj", "o_proj", "rotary", "softmax", "gate", "up", "act", "down", "lm_head", "embedding"}
    | {"experts", "expert_act", "shared_gate_up", "shared_act", "shared_down"}
)
#: operators over the KV heads: split as far as there are KV heads (one latent is not split)
KV_OPS = frozenset({"k_proj", "v_proj", "kv_cache", "qk", "pv"})


def kv_split(shape: ModelShape, gpus: int) -> int:
    """How many ways the KV cache splits over `gpus`: by KV heads, at most their number; a
    multi-head latent is replicated on every GPU."""
    return 1 if shape.mla_kv_dim else min(gpus, shape.kv_heads)


@lru_cache(maxsize=64)
def expected_max_standard_normal(count: int) -> float:
    """E[max] of `count` independent standard normals (0 for one; 0.5642 for two, 1.4236 for
    eight): the integral of x N phi(x) Phi(x)^(N - 1) on a fine grid."""
    # scipy only when expert parallelism is priced: every command imports this module
    from scipy.special import ndtr

    x = np.linspace(-12.0, 12.0, 48001)
    density = count * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi) * ndtr(x) ** (count - 1)
    return float(np.sum(x * density) * (x[1] - x[0]))


def slowest_gpu_experts(shape: ModelShape, routed_tokens, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Expert parallelism (docs/performance-model.md#expert-parallelism): each of `gpus` GPUs
    holds E / N whole routed experts; per MoE layer, the expected distinct experts the slowest
    GPU reads and the expected token-expert pairs it runs, for T = `routed_tokens` (broadcasts).

    Experts read: each expert is read with the probability p = experts(T) / E of
    `ModelShape.expected_experts`; a GPU's count is taken as Binomial(E / N, p), independent
    across GPUs, and E[max] = sum over m < E / N of 1 - F(m)^N. Pairs: T k / N on average, with
    the variance of a token's k distinct picks landing on one GPU (hypergeometric) summed over T
    tokens and corrected for the N counts summing to T k, T k (E - k) / (N (E - 1)); E[max] in
    the normal approximation, mean + sd E[max of N standard normals], at least the experts read
    (every read expert runs a pair) and at most T min(k, E / N)."""
    # scipy only when expert parallelism is priced: every command imports this module
    from scipy.special import bdtr

    e, k = shape.routed_experts, shape.experts_per_token
    per_gpu = e // gpus
    t = np.asarray(routed_tokens, dtype=float)
    hit = np.clip(shape.expected_experts(t) / e, 0.0, 1.0)
    levels, where = np.unique(hit, return_inverse=True)
    below = bdtr(np.arange(per_gpu)[None, :], per_gpu, levels[:, None])
    experts = (1.0 - below**gpus).sum(axis=1)[where].reshape(t.shape)
    spread = np.sqrt(t * k * (e - k) / (gpus * (e - 1.0)))
    pairs = t * k / gpus + spread * expected_max_standard_normal(gpus)
    return experts, np.clip(np.maximum(pairs, experts), None, t * min(k, per_gpu))


def split_over_gpus(ops: list[Op], shape: ModelShape, gpus: int, tokens, expert_parallel: bool = False) -> list[Op]:
    """One GPU's share of a forward pass split over `gpus` (docs/performance-model.md#tensor-parallelism):
    split operators' FLOPs and bytes over the GPUs, the KV heads' as far as they go, the rest
    (norms, residuals, router, drafters) on every GPU; then the two all-reduces per layer (after
    attention's output projection and after the MLP) of b q x hidden activations, a ring
    all-reduce moving 2 (N - 1) / N of them per GPU. `expert_parallel`: the routed experts are
    spread whole over the GPUs instead, and the slowest GPU's share is priced
    (`slowest_gpu_experts`; docs/performance-model.md#expert-parallelism)."""
    out = []
    kv = float(kv_split(shape, gpus))
    # MLA's projections belong to its heads, which split over every GPU; only the latent cache is replicated
    kv_proj = float(gpus if shape.mla_kv_dim else kv)
    slowest = _expert_parallel_share(shape, gpus, tokens) if expert_parallel and shape.is_moe else None
    for op in ops:
        if slowest is not None and op.name in slowest:
            out.append(slowest[op.name](op))
        elif op.name in SPLIT_OPS:
            out.append(replace(op, flops=op.flops / gpus, bytes=op.bytes / gpus))
        elif op.name in ("k_proj", "v_proj"):
            out.append(replace(op, flops=op.flops / gpus, bytes=op.bytes / kv_proj))
        elif op.name in KV_OPS:
            # attention's query heads split over every GPU, its cached keys over the KV heads
            out.append(replace(op, flops=op.flops / gpus, bytes=op.bytes / kv))
        else:
            out.append(op)
    message = np.asarray(tokens, dtype=float) * shape.hidden * shape.dtype_bytes
    moved = 2.0 * (gpus - 1) / gpus * message
    out.append(Op("all_reduce", "collective", 2 * shape.layers, np.zeros_like(moved), moved, tokens + 0 * moved))
    return out


def _expert_parallel_share(shape: ModelShape, gpus: int, tokens) -> dict:
    """Per routed-expert operator, the slowest GPU's share of it under expert parallelism: the
    weights of the experts it reads, the activations and FLOPs of the pairs it runs."""
    if shape.routed_experts % gpus:
        raise UserError(
            f"--expert-parallel: {shape.name}'s {shape.routed_experts} routed experts do not spread evenly over "
            f"{gpus} GPUs"
        )
    t = np.asarray(tokens, dtype=float)
    experts, pairs = slowest_gpu_experts(shape, t, gpus)
    h, ie = float(shape.hidden), float(shape.expert_intermediate)
    mean_experts, mean_pairs = shape.expected_experts(t), t * shape.experts_per_token
    # the experts operator moves each read expert's weights and each pair's activations
    weights, activations = 3 * h * ie, 2 * h + 3 * ie
    moved = (experts * weights + pairs * activations) / (mean_experts * weights + mean_pairs * activations)
    ran = pairs / mean_pairs
    return {
        "experts": lambda op: replace(op, flops=op.flops * ran, bytes=op.bytes * moved, rows=pairs / experts),
        "expert_act": lambda op: replace(op, flops=op.flops * ran, bytes=op.bytes * ran, rows=pairs),
    }


@dataclass
class _Pass:
    """One forward pass being priced: b, q, s broadcast together, b q token rows, the b c
    attending sequences of k = q / c query tokens over s + k keys each, the dtype's bytes β,
    and the operators so far."""

    b: np.ndarray
    q: np.ndarray
    s: np.ndarray
    bq: np.ndarray
    zeros: np.ndarray
    seqs: np.ndarray
    k: np.ndarray
    att_keys: np.ndarray
    beta: float
    hidden: float
    nh: float
    ops: list[Op] = field(default_factory=list)

    def add(self, name, kind, count, flops, nbytes, rows, kernels=1.0, in_features=0.0, out_features=0.0):
        zeros, seqs, nh = self.zeros, self.seqs, self.nh
        attending = kind == "attention"
        blocks = np.asarray(seqs * nh, dtype=float) if attending else 0.0
        self.ops.append(
            Op(
                name,
                kind,
                count,
                np.asarray(flops + zeros, dtype=float),
                np.asarray(nbytes * self.beta + zeros, dtype=float),
                np.asarray(rows + zeros, dtype=float),
                float(kernels) if np.ndim(kernels) == 0 else np.asarray(kernels + zeros, dtype=float),
                blocks,
                np.asarray(self.att_keys + zeros, dtype=float) if attending else 0.0,
                float(in_features),
                float(out_features),
            )
        )

    def linear(self, name, count, k_in, n_out, kernels=1.0):
        bq = self.bq
        flops, moved = 2 * bq * k_in * n_out, k_in * n_out + bq * k_in + bq * n_out
        self.add(name, "gemm", count, flops, moved, bq, kernels, in_features=k_in, out_features=n_out)

    def rmsnorm(self, name, count):
        bq, h = self.bq, self.hidden
        # read x, write y, read the weight; square, mean, rsqrt, two multiplies ~ 4 FLOP/elem
        self.add(name, "vector", count, 4 * bq * h, 2 * bq * h + h, bq)


def _new_pass(shape: ModelShape, b, q, s, c) -> _Pass:
    b, q, s, c = np.broadcast_arrays(b, q, s, c)
    bq = b * q
    # attention sees b c sequences of k = q / c query tokens, each over s + k keys; tree
    # verification is c = 1 (docs/performance-model.md#verification-modes)
    seqs = b * c
    k = q / c
    att_keys = s + k
    return _Pass(
        b,
        q,
        s,
        bq,
        np.zeros_like(bq),
        seqs,
        k,
        att_keys,
        float(shape.dtype_bytes),
        float(shape.hidden),
        float(shape.heads),
    )


def _forward_ops(shape, heads, b, q, s, c, attention: str, kv_cache_update: str) -> list[Op]:
    """`operators` on checked arrays; q may be an expected (real) token count."""
    p = _new_pass(shape, b, q, s, c)
    h, V = float(shape.hidden), float(shape.vocab)
    # ---- once per step, before the layers
    p.add("embedding", "vector", 1, p.zeros, 2 * p.bq * h, p.bq)  # gather rows, write them
    _layer_ops(p, shape, attention, kv_cache_update)
    # ---- once per step, after the layers
    p.rmsnorm("final_norm", 1)
    p.linear("lm_head", 1, h, V)
    if isinstance(heads, DraftWork):
        _sequential_drafter_ops(p, shape, heads, attention, kv_cache_update)
    elif heads is not None and heads.num_heads > 0:
        _draft_heads_op(p, heads)
    return p.ops


def _layer_ops(p: _Pass, shape: ModelShape, attention: str, kv_cache_update: str, qkv_in: float = 0.0) -> None:
    """The operators of every decoder layer (count = layers); `qkv_in`: the width q, k and v
    read when it is not the hidden size (EAGLE-3's 2·hidden)."""
    b, q, s, bq, zeros = p.b, p.q, p.s, p.bq, p.zeros
    h, i = float(shape.hidden), float(shape.intermediate)
    qkv_in = qkv_in or h
    nh, nkv, d = float(shape.heads), float(shape.kv_heads), float(shape.head_dim)
    L = shape.layers
    keys = s + q
    p.rmsnorm("attn_norm", L)
    if shape.mla_kv_dim:
        _mla_projection_ops(p, shape, kv_cache_update)
    else:
        p.linear("q_proj", L, qkv_in, nh * d)
        p.linear("k_proj", L, qkv_in, nkv * d)
        p.linear("v_proj", L, qkv_in, nkv * d)
        # rotary on q and k: read, write, and the cos/sin tables of the positions one attending
        # sequence covers (k of them); ~3 FLOP per element
        p.add("rotary", "vector", L, 3 * bq * (nh + nkv) * d, 2 * bq * (nh + nkv) * d + 2 * p.k * d, bq)
        if kv_cache_update == "append":
            p.add("kv_cache", "vector", L, zeros, 2 * (2 * bq * nkv * d), bq)  # read new K,V; write them
        else:
            p.add("kv_cache", "vector", L, zeros, 2 * (b * s * nkv * d + bq * nkv * d + b * keys * nkv * d), bq)
    _attention_ops(p, shape, attention)
    p.linear("o_proj", L, nh * d, h)
    p.add("attn_residual", "vector", L, bq * h, 3 * bq * h, bq)
    p.rmsnorm("mlp_norm", L)
    dense = L - shape.moe_layers
    if dense:
        p.linear("gate", dense, h, i)
        p.linear("up", dense, h, i)
        # SiLU(gate) * up: read two, write one; ~5 FLOP per element
        p.add("act", "vector", dense, 5 * bq * i, 3 * bq * i, bq)
        p.linear("down", dense, i, h)
    if shape.moe_layers:
        _moe_ops(p, shape, shape.moe_layers)
    p.add("mlp_residual", "vector", L, bq * h, 3 * bq * h, bq)


def _mla_projection_ops(p: _Pass, shape: ModelShape, kv_cache_update: str) -> None:
    """Multi-head latent attention's projections as engines run them in decode, with the
    latent's up-projections absorbed (DeepSeek-V2, arXiv 2405.04434 section 2.1.2): `q_a_proj`
    (hidden -> query rank; with its norm) and `q_proj` (rank -> every head's query, or hidden ->
    it without a rank), `kv_a_proj` (hidden -> latent + rotary key: the one thing cached),
    `k_proj` (each head's non-rotary query into the latent: the keys' up-projection, absorbed)
    and `v_proj` (attention's latent output up to each head's value). Every weight is read once
    per step; attention itself works in the latent (`_attention_ops`)."""
    bq, zeros, L = p.bq, p.zeros, shape.layers
    h, nh, d = float(shape.hidden), float(shape.heads), float(shape.head_dim)
    rank, rope, nope = float(shape.mla_q_rank), float(shape.mla_rope_dim), float(shape.mla_nope_dim)
    latent, cached = float(shape.mla_latent), float(shape.mla_kv_dim)
    if rank:
        p.linear("q_a_proj", L, h, rank)
        p.add("q_a_norm", "vector", L, 4 * bq * rank, 2 * bq * rank + rank, bq)
    p.linear("q_proj", L, rank or h, nh * (nope + rope))
    p.linear("kv_a_proj", L, h, cached)
    p.add("kv_a_norm", "vector", L, 4 * bq * latent, 2 * bq * latent + latent, bq)
    # per head: a (nope x latent) and a (latent x value) matrix, applied to every token row
    p.add("k_proj", "gemm", L, 2 * bq * nh * nope * latent, nh * nope * latent + bq * nh * (nope + latent), bq)
    p.add("v_proj", "gemm", L, 2 * bq * nh * latent * d, nh * latent * d + bq * nh * (latent + d), bq)
    p.add("rotary", "vector", L, 3 * bq * (nh + 1) * rope, 2 * bq * (nh + 1) * rope + 2 * p.k * rope, bq)
    if kv_cache_update == "append":
        p.add("kv_cache", "vector", L, zeros, 2 * bq * cached, bq)  # read the new latent; write it
    else:
        p.add("kv_cache", "vector", L, zeros, (p.b * p.s + bq + p.b * (p.s + p.q)) * cached, bq)


def _moe_ops(p: _Pass, shape: ModelShape, count: int) -> None:
    """A mixture-of-experts MLP (docs/performance-model.md#mixture-of-experts): the router, the
    shared experts as a dense gated MLP, and the routed experts: every one of the b q tokens runs
    k experts, and each distinct expert the step's tokens reach is read once. Expected distinct
    experts: `ModelShape.expected_experts` of the b q routed tokens (a batch shares its experts)."""
    bq, h = p.bq, float(shape.hidden)
    ie, k = float(shape.expert_intermediate), float(shape.experts_per_token)
    p.linear("router", count, h, float(shape.routed_experts))
    if shape.shared_intermediate:
        si = float(shape.shared_intermediate)
        p.linear("shared_gate_up", count, h, 2 * si)
        p.add("shared_act", "vector", count, 5 * bq * si, 3 * bq * si, bq)
        p.linear("shared_down", count, si, h)
    pairs = bq * k
    experts = shape.expected_experts(bq)
    # gate and up (h -> 2 ie) and down (ie -> h) per token-expert pair; weights once per distinct expert
    flops = 2 * pairs * 3 * h * ie
    moved = experts * 3 * h * ie + pairs * (2 * h + 3 * ie)
    rows = pairs / np.maximum(experts, 1e-12)
    p.add("experts", "gemm", count, flops, moved, rows, kernels=2.0, in_features=h, out_features=ie)
    p.add("expert_act", "vector", count, 5 * pairs * ie, 3 * pairs * ie, pairs)


def _attention_ops(p: _Pass, shape: ModelShape, attention: str) -> None:
    """QK, softmax and PV of every layer over the attending sequences' keys."""
    b, q, zeros, seqs, k, att_keys = p.b, p.q, p.zeros, p.seqs, p.k, p.att_keys
    nh, nkv, d = float(shape.heads), float(shape.kv_heads), float(shape.head_dim)
    L = shape.layers
    att_rows = k * (nh / nkv)
    scores = seqs * nh * k * att_keys
    qk_flops = 2 * scores * d
    sm_flops = 5 * scores
    pv_flops = 2 * scores * d
    kv_read = seqs * nkv * att_keys * d
    q_in = out = b * nh * q * d
    if shape.mla_kv_dim:
        # why: multi-head latent attention works in the latent: every head's query (non-rotary
        # part absorbed into the latent, plus the rotary part) against one cached latent and
        # rotary key per key, read once for all heads; the output is in the latent too
        # (DeepSeek-V2, arXiv 2405.04434; docs/performance-model.md#mixture-of-experts)
        cached, latent = float(shape.mla_kv_dim), float(shape.mla_latent)
        att_rows = k * nh
        qk_flops, pv_flops = 2 * scores * cached, 2 * scores * latent
        kv_read = seqs * att_keys * cached
        q_in, out = b * nh * q * cached, b * nh * q * latent
    if attention == "unfused":
        p.add("qk", "attention", L, qk_flops, q_in + kv_read + scores, att_rows)
        p.add("softmax", "vector", L, sm_flops, 2 * scores, att_rows)
        p.add("pv", "attention", L, pv_flops, scores + kv_read + out, att_rows)
    else:
        # one kernel: Q and K in, scores on chip; softmax on chip; V in, output out
        p.add("qk", "attention", L, qk_flops, q_in + kv_read, att_rows, kernels=1.0)
        p.add("softmax", "vector", L, sm_flops, zeros, att_rows, kernels=0.0)
        p.add("pv", "attention", L, pv_flops, kv_read + out, att_rows, kernels=0.0)


#: the prefix of an EAGLE depth's operators; its ".embedding" gather marks the depth's one
#: module call (`roofline.latency` charges head_overhead_s there, as once per Hydra stage)
EAGLE_DEPTH = "eagle_depth_"


def eagle_layer_shape(cost: DraftCost, dtype: str) -> ModelShape:
    """An EAGLE draft's decoder layer as a one-layer model shape (its own width and vocabulary)."""
    return ModelShape(
        f"{cost.drafter} draft",
        1,
        cost.hidden_size,
        cost.inner_size,
        cost.attention_heads,
        cost.kv_heads,
        cost.head_dim,
        cost.vocab_size,
    ).with_dtype(dtype)


def _eagle_pass(p: _Pass, cost: DraftCost, draft: ModelShape, rows, context, fc_in: float, attention, kv_update):
    """One EAGLE layer over `rows` tokens per sequence seeing `context` keys before them: fc
    (fc_in wide; 0: none), the layer with EAGLE-3's 2·hidden-wide q, k, v, and for a depth the
    norm and lm_head (`rows` > 0 only: a depth the tree does not reach costs nothing)."""
    sub = _new_pass(draft, p.b, rows + p.zeros, context + p.zeros, np.ones(()))
    h = float(cost.hidden_size)
    eagle3 = cost.drafter == "eagle3"
    sub.add("embedding", "vector", 1, sub.zeros, 2 * sub.bq * h, sub.bq)
    if fc_in:
        sub.linear("fc", 1, fc_in, h)
    if eagle3:
        sub.rmsnorm("embed_norm", 1)
    _layer_ops(sub, draft, attention, kv_update, qkv_in=2 * h if eagle3 else h)
    return sub


def _eagle_ops(p: _Pass, shape: ModelShape, heads: DraftWork, attention: str, kv_cache_update: str) -> None:
    """An EAGLE draft's work in a step (docs/performance-model.md#drafter-cost): depth d, one
    layer over its rows seeing the draft's cache of the context and the d path entries, then
    the lm_head (EAGLE-3: a norm and the draft vocabulary; EAGLE-1/2: the base lm_head); EAGLE-3's
    fc at the first depth only, EAGLE-1/2's at every depth; and once per step the pairs of the
    tokens the step before accepted (`DraftWork.prefix_tokens_per_sequence`) into that cache."""
    cost = heads.cost
    draft = eagle_layer_shape(cost, shape.dtype)
    h = float(cost.hidden_size)
    eagle3 = cost.drafter == "eagle3"
    aux = float(cost.aux_layers * cost.target_hidden)
    rows_all = np.asarray(heads.rows_per_sequence, dtype=float)
    for d in range(cost.stages):
        rows = rows_all[..., d] if d < rows_all.shape[-1] else np.zeros(())
        fc_in = (aux if d == 0 else 0.0) if eagle3 else 2 * h
        sub = _eagle_pass(p, cost, draft, rows, p.s + d, fc_in, attention, kv_cache_update)
        if eagle3:
            sub.rmsnorm("final_norm", 1)
        sub.linear("lm_head", 1, h, float(cost.vocab_size))
        runs = (p.b * rows + p.zeros > 0).astype(float)
        p.ops.extend(_scaled(o, f"{EAGLE_DEPTH}{d + 1}.", runs) for o in sub.ops)
    tokens = np.asarray(heads.prefix_tokens_per_sequence, dtype=float)
    if np.any(~np.isfinite(tokens)) or np.any(tokens < 1):
        raise UserError(f"EAGLE draft: accepted tokens per sequence must be >= 1, got {tokens!r}")
    sub = _eagle_pass(p, cost, draft, tokens, p.s, aux if eagle3 else 2 * h, attention, kv_cache_update)
    p.ops.extend(_scaled(o, "draft_context.", 1.0) for o in sub.ops)


def _scaled(o: Op, prefix: str, runs) -> Op:
    """`o` renamed, its work times `runs` (0 where the stage does not run)."""
    kernels = o.kernels * runs
    return Op(
        prefix + o.name,
        o.kind,
        o.count,
        o.flops * runs,
        o.bytes * runs,
        o.rows * runs,
        float(kernels) if np.ndim(kernels) == 0 else kernels,
        o.blocks * runs if np.ndim(o.blocks) else o.blocks,
        o.keys,
        o.in_features,
        o.out_features,
    )


def _sequential_drafter_ops(p: _Pass, shape: ModelShape, heads: DraftWork, attention: str, kv_cache_update: str):
    """A sequential drafter's stages and, for Hydra++, its prefix layer."""
    if heads.cost.own_cache:
        _eagle_ops(p, shape, heads, attention, kv_cache_update)
        return
    b, s, zeros = p.b, p.s, p.zeros
    for op in draft_stage_ops(heads, b):
        p.add(op.name, op.kind, op.count, op.flops, op.bytes, op.rows, op.kernels)
    if not heads.cost.prefix_layer:
        return
    # why: Hydra++ (Ankner et al. 2024, the Hydra++ section) queries its decoder layer once per
    # step on the tokens just accepted, over its own cache of the context
    # (docs/performance-model.md#drafter-cost)
    tokens = np.asarray(heads.prefix_tokens_per_sequence, dtype=float)
    if np.any(~np.isfinite(tokens)) or np.any(tokens < 1):
        raise UserError(f"prefix layer: tokens per sequence must be >= 1, got {tokens!r}")
    layer = _forward_ops(shape.with_layers(1), None, b, tokens + zeros, s, np.ones(()), attention, kv_cache_update)
    p.ops.extend(
        Op(
            "prefix_layer." + o.name,
            o.kind,
            o.count,
            o.flops + zeros,
            o.bytes + zeros,
            o.rows + zeros,
            o.kernels,
            o.blocks,
            o.keys,
            o.in_features,
            o.out_features,
        )
        for o in layer
        if o.name in LAYER_OPS or o.name in MLA_LAYER_OPS or o.name == "final_norm"
    )


def _draft_heads_op(p: _Pass, heads: DraftHeadsShape) -> None:
    """Medusa's K parallel heads on the step's rows."""
    b, q, bq = p.b, p.q, p.bq
    K, Lh, hh, Vh = float(heads.num_heads), float(heads.num_layers), float(heads.hidden), float(heads.vocab)
    # rows the heads run on: all q tokens per sequence, or the decoder's fixed count
    hr = bq if heads.tokens_per_sequence is None else b * np.minimum(q, heads.tokens_per_sequence)
    # K x (L ResBlocks: h x h GEMM + bias + SiLU + residual; then h x V projection)
    flops = K * (Lh * (2 * hr * hh * hh + 6 * hr * hh) + 2 * hr * hh * Vh)
    weights = K * (Lh * (hh * hh + hh) + hh * Vh)
    acts = K * (Lh * 4 * hr * hh + hr * hh + hr * Vh)
    p.add("draft_heads", "gemm", 1, flops, weights + acts, hr, kernels=K * (3 * Lh + 1))
