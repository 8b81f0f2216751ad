"""The microbenchmarks of `treeopt hw calibrate`: torch on a device, raw timings out
(treeopt.hwmeasurements); roofline.hwfit turns them into a hardware profile
(docs/performance-model.md#hardware-calibration).

What is timed, in the model's compute dtype:

1. `x + y` on 1K..2M elements (the per-kernel cost), and the framework's own elementwise
   work of a decoder layer (transformers' LlamaRMSNorm twice, apply_rotary_pos_emb,
   SiLU(gate) * up, two residual adds) at 1..1024 rows.
2. A read (`sum`) over a buffer the size of the model's weights (16 MiB to 1 GiB, 2 GiB on a
   GPU): that is where the weights live during a forward pass (on a CPU with a large L3 a
   small model's weights stay in cache, and a DRAM figure would be wrong).
3. Square GEMMs per dtype (the peak).
4. F.linear with every weight shape of the model at rows 1..1024, cycling through as many
   weight copies as the model has (up to 512 MiB) so caches behave as in a forward pass;
   large row counts of large shapes on a column slice (compute bound, so time scales with the
   columns).
5. The verification attention with the step's float 4D mask, through the path the sweep takes
   by default on the device (calibration.split_attention), at q = 1..256 over 256 cached
   tokens, and one-token attention of 8 sequences; on an accelerator also over batch x
   context (calibration.attention_bench); the KV-cache update of the decoder's own cache
   (calibration.kv_cache.new_cache).
6. Forwards of a random transformers LlamaForCausalLM of the probe shape with 1..L layers
   over the decoder's cache, with a 4D mask and explicit position ids (how tree verification
   calls it) at several (layers, b, q, s), and the draft heads (MedusaHeads, the modules the
   decoder calls).
7. Optionally forwards of the full model at several (b, q, s), to validate the profile.

Everything is timed together in interleaved rounds (treeopt.timing), so that a burst of
slowdown weighs on all configurations alike.

Steps as the decoder runs them (`graphs`, as `treeopt sweep` takes it; the default: captured on
CUDA, eager elsewhere): the forwards of 6 and 7 run as static-shape steps
(calibration.static_steps.StepRunner), captured as CUDA graphs on CUDA, and on CUDA the
microbenchmarks of 1 to 5 are captured too, `CAPTURED_CALLS` calls in one graph whose replay
time is divided among them: what a kernel costs inside a captured step, not a launch and a
host sync. The draft heads stay eager, as the decoder runs them
(docs/performance-model.md#calibrating-for-captured-steps).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone

import torch
import transformers
from torch.nn import functional as F
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from calibration.attention_bench import ATTN_QUERIES, QUICK_ATTN_QUERIES, add_attention
from calibration.device_info import capacity_bytes, device_name, loadavg
from calibration.fused_projections import use_projections
from calibration.heads import MedusaHeads
from calibration.kv_cache import new_cache
from calibration.model_calls import cache_kwargs, synchronizer
from calibration.models import TORCH_DTYPES
from calibration.split_attention import default_attention
from calibration.static_steps import (
    CAPTURE_FAILURES,
    GraphStep,
    StepRunner,
    graphs_enabled,
    record_capture_failure,
    step_mode,
    uses_static,
)
from treeopt.hwmeasurements import (
    DeviceFacts,
    ElementwiseSample,
    ForwardSample,
    GemmSample,
    HardwareMeasurements,
    HeadsSample,
    KvUpdateSample,
    LayerElementwiseSample,
    ModelDims,
    SquareGemmSample,
    StreamSample,
    WeightShape,
)
from treeopt.timing import TimingStats, duration_text, measure_interleaved, sample_size

__all__ = [
    "ATTN_QUERIES",
    "device_name",
    "GEMM_ROWS",
    "QUICK_ATTN_QUERIES",
    "QUICK_GEMM_ROWS",
    "TORCH_DTYPES",
    "device_available",
    "run_hardware_bench",
    "weight_shapes",
]

GEMM_ROWS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 512, 1024)
QUICK_GEMM_ROWS = (1, 4, 16, 64, 256, 1024)
# weights cycled through by the GEMM measurements: enough to spill the caches a forward
# spills (docs/performance-model.md#gemm-row-efficiency)
GEMM_POOL_BYTES = 512 << 20
#: calls of a microbenchmark captured in one CUDA graph (their replay is timed, then divided)
CAPTURED_CALLS = 16


def device_available(device: str) -> bool:
    """Whether torch can run on `device` ("cpu", "cuda", "cuda:N" or "mps") here."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    return True


def weight_shapes(dims: ModelDims) -> tuple[WeightShape, ...]:
    """The model's GEMM weight shapes, projections of equal shape merged (their uses added)."""
    h, i, L = dims.hidden, dims.intermediate, dims.layers
    qd, kvd = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    table: dict[tuple[int, int], list] = {}
    for label, k, n, uses in [
        ("q_proj", h, qd, L),
        ("k_proj/v_proj", h, kvd, 2 * L),
        ("o_proj", qd, h, L),
        ("gate/up", h, i, 2 * L),
        ("down", i, h, L),
        ("lm_head", h, dims.vocab, 1),
    ]:
        if (k, n) in table:
            table[(k, n)][0] += "+" + label
            table[(k, n)][1] += uses
        else:
            table[(k, n)] = [label, uses]
    return tuple(WeightShape(label, k, n, uses) for (k, n), (label, uses) in table.items())


class _Bench:
    """Timed functions from every stage, measured together in interleaved rounds; each comes
    with the sample it becomes (a function of its TimingStats) and the group it belongs to."""

    def __init__(self):
        self.entries = []
        self.keep = []  # tensors and models the timed closures use

    def add(self, group: str, make_sample, fn, *, inner: int | None = None) -> None:
        self.entries.append((group, make_sample, fn, inner))

    def run(self, *, rounds: int, seed: int, progress: bool) -> dict[str, tuple]:
        """Every entry's sample: its function's TimingStats per call (a replayed graph of
        several calls counts as that many)."""
        fns = [fn for _, _, fn, _ in self.entries]
        # sizing each entry calls it at least once: that is the warm-up, and it prices a round
        sized = [_sized(fn, inner) for _, _, fn, inner in self.entries]
        inners = [inner for inner, _ in sized]
        if progress:
            tqdm.write(
                f"  {len(fns)} configurations x {rounds} rounds: about "
                f"{duration_text(rounds * round_seconds(sized))} (priced by one sample of each)",
                file=sys.stderr,
            )
        with tqdm(
            total=rounds,
            desc=f"hw calibrate: {len(fns)} configurations",
            unit="round",
            file=sys.stderr,
            disable=not progress,
        ) as bar:
            stats = measure_interleaved(fns, rounds=rounds, warmup=0, inner=inners, seed=seed, after_round=bar.update)
        groups: dict[str, list] = {}
        for (group, make_sample, fn, _), st in zip(self.entries, stats):
            groups.setdefault(group, []).append(make_sample(per_call(st, getattr(fn, "calls", 1))))
        return {group: tuple(samples) for group, samples in groups.items()}


def _sized(fn, inner: int | None) -> tuple[int, float]:
    """(calls per sample, seconds per call) of an entry: sized to about 2 ms a sample, or its
    fixed count priced by one call."""
    if inner is None:
        return sample_size(fn, 2e-3, time.perf_counter)
    t0 = time.perf_counter()
    fn()
    return int(inner), time.perf_counter() - t0


def round_seconds(sized) -> float:
    """Seconds one interleaved round takes: every entry's calls per sample times its seconds
    per call."""
    return float(sum(inner * per_call_s for inner, per_call_s in sized))


def per_call(stats: TimingStats, calls: int) -> TimingStats:
    """`stats` of a function that made `calls` calls, per call."""
    if calls == 1:
        return stats
    return TimingStats(
        stats.median_s / calls,
        stats.p10_s / calls,
        stats.p90_s / calls,
        tuple(t / calls for t in stats.samples),
        stats.remeasured,
    )


class Replayed:
    """`calls` calls of `fn` captured once as a CUDA graph (`calibration.static_steps.
    GraphStep`); calling it replays them and waits for the device. Its `calls` tells
    `_Bench.run` to divide the time among them."""

    def __init__(self, fn, calls: int, sync):
        def body():  # returns nothing: each call's output is freed inside the graph's pool
            for _ in range(calls):
                fn()

        self.graph = GraphStep(body)
        self.calls, self.sync = int(calls), sync

    def __call__(self):
        self.graph()
        self.sync()


def run_hardware_bench(
    device: str,
    model: ModelDims,
    probe: ModelDims | None = None,
    *,
    quick: bool = False,
    validate: bool = True,
    threads: int | None = None,
    progress: bool = True,
    seed: int = 0,
    graphs: bool | None = None,
) -> HardwareMeasurements:
    """Time the microbenchmarks of `model` on `device` (module docstring).

    probe: the model whose forwards give the framework overhead (None: `model` itself; a
    small proxy for a model too large to run often). validate: also time forwards of the full
    model. threads: torch CPU threads while measuring (None: torch's current setting).
    quick: fewer row counts and rounds. progress: a tqdm bar on stderr. graphs: how the
    forwards run and whether the microbenchmarks are captured, as `treeopt sweep` runs its
    steps (module docstring; None: captured on CUDA, eager elsewhere)."""
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        with torch.inference_mode():
            return _measure(
                torch.device(device),
                model,
                probe,
                quick=quick,
                validate=validate,
                progress=progress,
                seed=seed,
                graphs=graphs,
            )
    finally:
        torch.set_num_threads(old_threads)


def _measure(
    dev: torch.device,
    model: ModelDims,
    probe: ModelDims | None,
    *,
    quick: bool,
    validate: bool,
    progress: bool,
    seed: int,
    graphs: bool | None = None,
) -> HardwareMeasurements:
    t_start = time.perf_counter()
    torch.manual_seed(seed)
    load_before = loadavg()
    rounds = 5 if quick else 11
    bench = _Bench()
    failures_before = len(CAPTURE_FAILURES)
    stream_bytes, wshapes = _prepare(
        bench, dev, model, probe, quick=quick, validate=validate, progress=progress, seed=seed, graphs=graphs
    )
    samples = bench.run(rounds=rounds, seed=seed, progress=progress)
    facts = DeviceFacts(
        name=device_name(dev),
        kind=dev.type,
        capacity_bytes=capacity_bytes(dev),
        threads=None if dev.type != "cpu" else int(torch.get_num_threads()),
        cpu_count=os.cpu_count() or 1,
        torch_version=torch.__version__,
        framework=f"transformers {transformers.__version__}",
        load_average_before=load_before,
        load_average_after=loadavg(),
    )
    return HardwareMeasurements(
        device=facts,
        dtype=model.dtype,
        quick=bool(quick),
        rounds=rounds,
        date_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        elapsed_s=time.perf_counter() - t_start,
        elementwise=samples["ew"],
        layer_elementwise=samples["mix"],
        stream=StreamSample(stream_bytes, samples["stream"][0].time_s),
        square_gemms=samples["peak"],
        gemm_weights=wshapes,
        gemms=samples["gemm"],
        attention=samples["attn"],
        kv_update=samples["kv"],
        forwards=samples["fw"],
        heads=samples.get("heads", ()),
        validation=samples.get("val", ()),
        steps=step_mode(graphs, dev),
        failed_captures=tuple(CAPTURE_FAILURES[failures_before:]),
    )


def _timer(sync, capture: bool):
    """`timed(fn)`: a function running `fn` once and waiting for the device, or with `capture`
    a `Replayed` graph of CAPTURED_CALLS calls of it (the eager one where capture fails,
    noted as `calibration.static_steps` notes a failed step capture)."""

    def eager(fn):
        def run():
            fn()
            sync()

        return run

    def timed(fn):
        if not capture:
            return eager(fn)
        try:
            return Replayed(fn, CAPTURED_CALLS, sync)
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager timing
            reason = record_capture_failure(err)
            print(f"note: CUDA graph capture of a microbenchmark failed ({reason}); timing it eagerly", file=sys.stderr)
            return eager(fn)

    timed.captured = capture
    return eager, timed


def _cache_spilling_copies(dev, weight_bytes: int) -> int:
    """Copies of a weight that a captured GEMM benchmark cycles through so that it reads them
    from device memory, as a forward pass does: twice the GPU's L2 cache (a captured graph
    repeats its calls back to back, and a 4096 x 4096 bf16 weight, 32 MiB, fits an H100's or
    H200's 50-60 MB L2)."""
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0) if dev.type == "cuda" else 0
    return max(1, -(-2 * l2 // max(weight_bytes, 1)))


def _prepare(
    bench: _Bench, dev, model: ModelDims, probe: ModelDims | None, *, quick, validate, progress, seed, graphs=None
):
    """Add every microbenchmark of `model` to `bench` (module docstring); returns the bytes the
    stream benchmark moves and the model's weight shapes."""
    accelerator = dev.type != "cpu"  # CUDA or MPS
    sync = synchronizer(dev)
    tdt = TORCH_DTYPES[model.dtype]
    keep = bench.keep
    eager, timed = _timer(sync, graphs_enabled(graphs, dev))

    # a pilot of the calibrated dtype's GEMM rate sizes the GEMM measurements
    n_pilot = 4096 if accelerator else 512
    pilot_matrix = torch.randn(n_pilot, n_pilot, device=dev, dtype=tdt)
    pilot = measure_interleaved([eager(lambda m=pilot_matrix: m @ m)], rounds=3, warmup=1, inner=1, seed=seed)[0]
    pilot_flops = 2.0 * n_pilot**3 / pilot.median_s
    del pilot_matrix

    if progress:
        tqdm.write("  preparing microbenchmarks", file=sys.stderr)
    _add_elementwise(bench, timed, keep, dev, tdt)
    _add_layer_elementwise(bench, timed, keep, dev, tdt, model, quick=quick)
    stream_bytes = _add_stream(bench, timed, keep, dev, model)
    _add_square_gemms(bench, timed, keep, dev, model.dtype)
    wshapes = weight_shapes(model)
    budget_flops = (20e-3 if quick else 40e-3) * pilot_flops
    _add_gemms(bench, timed, keep, dev, tdt, model, wshapes, budget_flops=budget_flops, quick=quick)
    # the verification attention the sweep's steps take by default on this device
    attention = default_attention(dev)
    add_attention(bench, timed, keep, dev, tdt, model, quick=quick, capacity=capacity_bytes(dev), path=attention)

    # the framework's forwards: few and more layers of the probe model
    probe_dims = probe or model
    layer_counts = (
        sorted({1, max(1, model.layers // 2), model.layers}) if probe is None and model.layers <= 8 else [1, 2, 4]
    )
    models = {L: _build_model(dev, tdt, probe_dims, L) for L in layer_counts}
    keep.append(models)
    _add_kv_update(bench, timed, keep, dev, tdt, model, models[layer_counts[0]], quick=quick)
    _add_framework_forwards(bench, models, dev, probe_dims, layer_counts, sync, quick=quick, graphs=graphs)
    _add_heads(bench, eager, keep, dev, tdt, probe_dims)  # the decoder runs the heads eagerly
    if validate:
        full = (models.get(model.layers) if probe is None else None) or _build_model(dev, tdt, model, model.layers)
        _add_validation(bench, full, dev, model, sync, keep, quick=quick, graphs=graphs)
    return stream_bytes, wshapes


def _add_elementwise(bench, timed, keep, dev, tdt) -> None:
    for n in (1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 21):
        x, y = torch.randn(n, device=dev, dtype=tdt), torch.randn(n, device=dev, dtype=tdt)
        keep.append((x, y))
        bench.add("ew", lambda st, n=n: ElementwiseSample(n, st.median_s), timed(lambda x=x, y=y: x + y))


def _add_layer_elementwise(bench, timed, keep, dev, tdt, dims: ModelDims, *, quick: bool) -> None:
    nh, nkv, d = dims.heads, dims.kv_heads, dims.head_dim
    norm = LlamaRMSNorm(dims.hidden).to(device=dev, dtype=tdt)
    act = ACT2FN["silu"]
    keep.append(norm)
    for r in (1, 64, 512) if quick else (1, 16, 64, 256, 1024):
        hs = torch.randn(1, r, dims.hidden, device=dev, dtype=tdt)
        qs = torch.randn(1, nh, r, d, device=dev, dtype=tdt)
        ks = torch.randn(1, nkv, r, d, device=dev, dtype=tdt)
        cos = torch.randn(1, r, d, device=dev, dtype=tdt)
        sin = torch.randn(1, r, d, device=dev, dtype=tdt)
        gs = torch.randn(1, r, dims.intermediate, device=dev, dtype=tdt)
        us = torch.randn(1, r, dims.intermediate, device=dev, dtype=tdt)
        keep.append((hs, qs, ks, cos, sin, gs, us))

        def mix(hs=hs, qs=qs, ks=ks, cos=cos, sin=sin, gs=gs, us=us):
            x = norm(hs)
            apply_rotary_pos_emb(qs, ks, cos, sin)
            y = hs + x
            x = norm(y)
            act(gs) * us
            return y + x

        bench.add("mix", lambda st, r=r: LayerElementwiseSample(r, st.median_s), timed(mix))


def _add_stream(bench, timed, keep, dev, dims: ModelDims) -> int:
    """A read over the model's weight footprint; returns the buffer's bytes."""
    cap = (2 << 30) if dev.type != "cpu" else (1 << 30)
    footprint = int(min(max(dims.weight_bytes, 16 << 20), cap))
    buf = torch.ones(footprint // 4, device=dev, dtype=torch.float32)
    keep.append(buf)
    bench.add("stream", lambda st: StreamSample(footprint, st.median_s), timed(lambda: buf.sum()), inner=1)
    return footprint


def _add_square_gemms(bench, timed, keep, dev, dtype: str) -> None:
    accelerator = dev.type != "cpu"  # CUDA or MPS
    dtypes = ["fp32", "bf16", "fp16"] if accelerator else ["fp32", "bf16"]
    if dtype not in dtypes:
        dtypes.append(dtype)
    for name_dt in dtypes:
        n = 8192 if accelerator else (1024 if name_dt in (dtype, "fp32") else 512)
        tt = TORCH_DTYPES[name_dt]
        a, b = torch.randn(n, n, device=dev, dtype=tt), torch.randn(n, n, device=dev, dtype=tt)
        keep.append((a, b))
        bench.add(
            "peak",
            lambda st, name_dt=name_dt, n=n: SquareGemmSample(name_dt, n, st.median_s),
            timed(lambda a=a, b=b: a @ b),
            inner=1,
        )


def _add_gemms(bench, timed, keep, dev, tdt, dims: ModelDims, wshapes, *, budget_flops: float, quick: bool) -> None:
    """GEMMs on the model's weight shapes across row counts. A small model's as whole passes
    over all its weights (as a forward pass touches them, so caches behave alike); a large
    model's per shape, on as many copies as fit the pool, big row counts on a column slice."""
    rows_list = QUICK_GEMM_ROWS if quick else GEMM_ROWS
    beta = torch.empty((), dtype=tdt).element_size()
    unique_bytes = sum(w.in_features * w.out_features * beta for w in wshapes)
    model_gemm_flops = sum(2.0 * w.uses * w.in_features * w.out_features for w in wshapes)
    whole_pass = (
        dims.layers * unique_bytes <= GEMM_POOL_BYTES and max(rows_list) * model_gemm_flops <= 12 * budget_flops
    )
    if whole_pass:
        _add_whole_pass_gemms(bench, timed, keep, dev, tdt, wshapes, rows_list)
    else:
        _add_per_shape_gemms(bench, timed, keep, dev, tdt, wshapes, rows_list, budget_flops=budget_flops)


def _add_whole_pass_gemms(bench, timed, keep, dev, tdt, wshapes, rows_list) -> None:
    """Each row count timed over every weight of the model in turn (`_add_gemms`)."""
    pool = [
        (
            w.in_features,
            [torch.randn(w.out_features, w.in_features, device=dev, dtype=tdt) * 0.02 for _ in range(w.uses)],
        )
        for w in wshapes
    ]
    keep.append(pool)
    for r in rows_list:
        xs = {k: torch.randn(r, k, device=dev, dtype=tdt) for k, _ in pool}
        keep.append(xs)

        def whole(xs=xs):
            for k, ws in pool:
                x = xs[k]
                for w in ws:
                    F.linear(x, w)

        bench.add("gemm", lambda st, r=r: GemmSample(r, st.median_s), timed(whole))


def _add_per_shape_gemms(bench, timed, keep, dev, tdt, wshapes, rows_list, *, budget_flops: float) -> None:
    """Each weight shape and row count timed on as many copies as fit the pool, big row counts
    on a column slice (`_add_gemms`)."""
    beta = torch.empty((), dtype=tdt).element_size()
    unique_bytes = sum(w.in_features * w.out_features * beta for w in wshapes)
    for shape in wshapes:
        k, n = shape.in_features, shape.out_features
        copies = int(max(1, min(shape.uses, GEMM_POOL_BYTES // max(unique_bytes, 1))))
        if getattr(timed, "captured", False):
            copies = max(copies, _cache_spilling_copies(dev, k * n * beta))
        ws = [torch.randn(n, k, device=dev, dtype=tdt) * 0.02 for _ in range(copies)]
        keep.append(ws)
        for r in rows_list:
            n_eff = n
            if 2.0 * r * k * n * copies > budget_flops:
                n_eff = int(min(n, max(64, budget_flops / (2.0 * r * k * copies))))
            subs = [w[:n_eff] for w in ws]
            x = torch.randn(r, k, device=dev, dtype=tdt)
            keep.append(x)

            def per_shape(x=x, subs=subs):
                for w in subs:
                    F.linear(x, w)

            bench.add(
                "gemm",
                lambda st, r=r, shape=shape, n_eff=n_eff, copies=copies: GemmSample(
                    r, st.median_s, shape, n_eff, copies
                ),
                timed(per_shape),
            )


def _add_kv_update(bench, timed, keep, dev, tdt, dims: ModelDims, probe_model, *, quick: bool) -> None:
    """The KV-cache update as the decoder does it: q tokens' K and V written in place into layer
    0 of the decoder's preallocated cache holding 256 tokens (4 sequences), cropped back. The
    bytes grow with q, not with the cached length (docs/performance-model.md#kv-cache-update)."""
    batch, s_kv = 4, 256
    for q in (1, 64) if quick else (1, 16, 64):
        cache = new_cache(probe_model, capacity=s_kv + q)
        cache.update(
            torch.randn(batch, dims.kv_heads, s_kv, dims.head_dim, device=dev, dtype=tdt),
            torch.randn(batch, dims.kv_heads, s_kv, dims.head_dim, device=dev, dtype=tdt),
            0,
        )
        k_new = torch.randn(batch, dims.kv_heads, q, dims.head_dim, device=dev, dtype=tdt)
        v_new = torch.randn(batch, dims.kv_heads, q, dims.head_dim, device=dev, dtype=tdt)
        keep.append((cache, k_new, v_new))

        def update(cache=cache, k_new=k_new, v_new=v_new, q=q):
            cache.update(k_new, v_new, 0)
            cache.crop(-q)

        bench.add("kv", lambda st, q=q: KvUpdateSample(batch, s_kv, st.median_s, new_tokens=q), timed(update))


def _add_framework_forwards(
    bench, models, dev, probe: ModelDims, layer_counts, sync, *, quick: bool, graphs: bool | None = None
) -> None:
    """(layers, b, q, s): one token over 64 cached ones for every layer count, then the
    deepest model with more sequences, more new tokens and a longer cache."""
    ctx_len = 64
    L_top = layer_counts[-1]
    configs = [(L, 1, 1, ctx_len) for L in layer_counts]
    if quick:
        configs += [(L_top, 8, 1, 512), (L_top, 1, 32, ctx_len), (L_top, 4, 16, 512)]
    else:
        configs += [
            (L_top, 8, 1, ctx_len),
            (L_top, 8, 1, 512),
            (L_top, 1, 1, 512),
            (L_top, 2, 8, 256),
            (L_top, 1, 32, ctx_len),
            (L_top, 4, 16, 128),
            (L_top, 4, 64, 128),
            (L_top, 4, 16, 512),
            (L_top, 8, 4, 512),
        ]
    for L, b, q, s in configs:
        bench.add(
            "fw",
            lambda st, L=L, b=b, q=q, s=s: ForwardSample(L, b, q, s, st.median_s, st.spread),
            _forward_fn(models[L], dev, batch=b, tokens=q, context=s, vocab=probe.vocab, sync=sync, graphs=graphs),
            inner=3 if b * q == 1 else 1,
        )


def _add_heads(bench, timed, keep, dev, tdt, probe: ModelDims) -> None:
    """Medusa heads are separate modules called once per step: their fixed cost per head."""
    hidden_1 = torch.randn(1, 1, probe.hidden, device=dev, dtype=tdt)
    keep.append(hidden_1)
    for K in (1, 4):
        mod = MedusaHeads(probe.hidden, probe.vocab, K, 1).to(device=dev, dtype=tdt).eval()
        keep.append(mod)
        bench.add("heads", lambda st, K=K: HeadsSample(K, st.median_s), timed(lambda mod=mod: mod(hidden_1)), inner=3)


def _add_validation(bench, full_model, dev, dims: ModelDims, sync, keep, *, quick: bool, graphs=None) -> None:
    keep.append(full_model)
    configs = (
        [(1, 1, 128), (1, 32, 128), (4, 1, 128), (4, 16, 128)]
        if quick
        else [(1, 1, 256), (1, 16, 256), (1, 64, 256), (4, 1, 256), (4, 32, 256), (8, 1, 128), (8, 64, 128)]
    )
    for b, q, s in configs:
        bench.add(
            "val",
            lambda st, b=b, q=q, s=s: ForwardSample(dims.layers, b, q, s, st.median_s, st.spread),
            _forward_fn(full_model, dev, batch=b, tokens=q, context=s, vocab=dims.vocab, sync=sync, graphs=graphs),
            inner=1,
        )


def _build_model(dev, tdt, dims: ModelDims, layers: int):
    """A randomly initialised transformers Llama of `dims` with `layers` layers (SDPA)."""
    cfg = LlamaConfig(
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        intermediate_size=dims.intermediate,
        num_hidden_layers=int(layers),
        num_attention_heads=dims.heads,
        num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=dims.tied_embeddings,
    )
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype=tdt).eval()
    use_projections(model, None, dev)  # as the sweep's steps run the model on this device
    return model


def _forward_fn(model, dev, *, batch: int, tokens: int, context: int, vocab: int, sync, graphs=None):
    """One decoding-step forward of `tokens` new tokens over a `context`-token cache of the
    decoder's kind, with a 4D additive mask and explicit position ids (how tree verification
    calls the model; for one token, the ordinary 2D mask of plain decoding); the cache is
    cropped back afterwards so every call sees the same context. Where `graphs` makes the
    sweep's steps static (`calibration.static_steps.uses_static`), the forward runs as the
    sweep's static-shape step (a 4D mask for one token too), captured on CUDA."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    cache = new_cache(model, capacity=context + tokens)
    prompt = torch.randint(0, vocab, (batch, context), generator=gen).to(dev)
    if context:
        model(input_ids=prompt, use_cache=True, **cache_kwargs(model, cache))
    ids = torch.randint(0, vocab, (batch, tokens), generator=gen).to(dev)
    dtype = next(model.parameters()).dtype
    pos = (context + torch.arange(tokens, device=dev)).expand(batch, tokens)
    if context and uses_static(graphs, dev):
        runner = StepRunner(model, graphs=graphs_enabled(graphs, dev), bucket=1)
        mask = torch.zeros(batch, 1, tokens, context + tokens, device=dev, dtype=dtype)

        def step():
            runner(cache, ids, mask, pos)
            cache.crop(-tokens)
            sync()

        return step
    if tokens == 1:
        # Plain decoding takes the framework's ordinary causal path (a 2D padding mask), as
        # the sweep's T(0) and serving engines do; a custom 4D mask costs more per cached key
        # (docs/performance-model.md#framework-overheads).
        mask = torch.ones(batch, context + 1, device=dev, dtype=torch.long)
    else:
        mask = torch.zeros(batch, 1, tokens, context + tokens, device=dev, dtype=dtype)

    def run():
        model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **cache_kwargs(model, cache))
        cache.crop(-tokens)
        sync()

    return run
