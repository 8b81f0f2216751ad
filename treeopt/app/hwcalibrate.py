"""`treeopt hw calibrate`: measure the machine at hand and write a hardware profile
(docs/performance-model.md#hardware-calibration).

The model's shape (roofline) sizes the microbenchmarks, calibration.hwbench runs them with
torch, roofline.hwfit turns the timings into a profile and checks it against full-model
forwards.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pandas as pd
import torch

from calibration.hwbench import run_hardware_bench
from calibration.models import SMALL_MODEL_PARAMS, TORCH_DTYPES, resolve_device, resolve_dtype
from calibration.sweep import measure_group
from roofline.hardware import HardwareProfile
from roofline.hwfit import fit_hardware_profile
from roofline.profile_fit import ProfileFit, fit_profile, predict_step_s, sweep_step_points
from roofline.shapes import ModelShape, normalize_dtype
from treeopt.app.models import heads_shape_of_drafter, shape_of
from treeopt.dtypes import torch_dtype_name
from treeopt.errors import UserError
from treeopt.hwmeasurements import ModelDims
from treeopt.timing import duration_text
from treeopt.tree import make_tree

__all__ = ["calibrate_hardware", "calibrate_engine_terms", "engine_bench_positions", "framework_probe"]

# A proxy's dimensions: small enough that its forwards are all framework overhead, with the
# model's ratio of query to KV heads (docs/performance-model.md#framework-overheads)
PROXY_HIDDEN, PROXY_INTERMEDIATE, PROXY_KV_HEADS, PROXY_HEAD_DIM, PROXY_VOCAB = 128, 256, 2, 64, 512


def calibrate_hardware(
    device: str = "cpu",
    model="demo",
    *,
    dtype: str | None = None,
    quick: bool = False,
    name: str | None = None,
    validate: bool = True,
    progress: bool = True,
    seed: int = 0,
    threads: int | None = None,
    graphs: bool | None = None,
) -> HardwareProfile:
    """Measure `device` (cpu, cuda, cuda:N, mps or auto) for `model` (a ModelShape or a model
    spec: demo, a built-in name, a config.json or directory) and return the profile. dtype: the
    compute dtype (None or auto: `calibration.models.resolve_dtype`'s rule). quick: fewer row
    counts and rounds (seconds instead of about a minute; still usable). validate: compare with
    full-model forwards (models of at most SMALL_MODEL_PARAMS parameters). threads: torch CPU
    threads while measuring (default: 1 for a model under SMALL_MODEL_PARAMS parameters on the
    CPU, as every command that runs a model, else torch's setting). progress: a bar on stderr.
    graphs: the forwards as the sweep runs its steps, `treeopt sweep --graphs/--no-graphs`
    (None: captured on CUDA, eager elsewhere), the microbenchmarks captured with them on CUDA
    (docs/performance-model.md#calibrating-for-captured-steps)."""
    shape = model if isinstance(model, ModelShape) else shape_of(model)
    if str(device).split(":")[0] not in ("auto", "cpu", "cuda", "mps"):
        raise UserError(f"--device: must be cpu or cuda (cuda:N), mps or auto, got '{device}'")
    dev = resolve_device(device)  # one line where CUDA or MPS is not available here
    if dtype not in (None, "auto") and normalize_dtype(dtype, what="--dtype") not in TORCH_DTYPES:
        raise UserError(f"--dtype: calibration supports fp32, bf16 and fp16, not {dtype}")
    # the one rule of --dtype auto (calibration.models.resolve_dtype)
    dt = normalize_dtype(str(resolve_dtype(dtype or "auto", dev)), what="--dtype")
    if threads is not None and threads < 1:
        raise UserError("--threads: must be >= 1")
    if threads is None and dev.type == "cpu" and shape.params < SMALL_MODEL_PARAMS:
        threads = 1  # the one policy of every command that runs a model (calibration.threads)
    shape = shape.with_dtype(dt)
    probe = framework_probe(shape)
    small = probe is shape
    notes = []
    if not small:
        notes.append(
            f"framework overhead measured on a small proxy of {shape.name} (hidden {probe.hidden}, "
            f"{probe.heads} heads / {probe.kv_heads} KV heads, vocab {probe.vocab}) and extrapolated to "
            f"{shape.layers} layers"
        )
    if validate and not small:
        notes.append("no full-model validation: the model is too large to run here")
    measurements = run_hardware_bench(
        str(dev),
        _dims(shape),
        None if small else _dims(probe),
        quick=quick,
        validate=validate and small,
        threads=threads,
        progress=progress,
        seed=seed,
        graphs=graphs,
    )
    name = name or (f"{dev.type}-calibrated" if dev.type == "mps" else None)  # hwfit names cpu and cuda
    return fit_hardware_profile(measurements, shape, probe, name=name, notes=tuple(notes))


def framework_probe(shape: ModelShape) -> ModelShape:
    """The model whose forwards give the framework overhead: `shape` itself when it is small
    enough to run (at most SMALL_MODEL_PARAMS parameters), else a small proxy with its layers."""
    if shape.params <= SMALL_MODEL_PARAMS:
        return shape
    group = shape.heads // shape.kv_heads
    return replace(
        shape,
        name=f"{shape.name}-proxy",
        hidden=PROXY_HIDDEN,
        intermediate=PROXY_INTERMEDIATE,
        heads=PROXY_KV_HEADS * group,
        kv_heads=PROXY_KV_HEADS,
        head_dim=PROXY_HEAD_DIM,
        vocab=PROXY_VOCAB,
    )


def _dims(shape: ModelShape) -> ModelDims:
    return ModelDims(
        name=shape.name,
        layers=shape.layers,
        hidden=shape.hidden,
        intermediate=shape.intermediate,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        vocab=shape.vocab,
        dtype=shape.dtype,
        tied_embeddings=shape.tied_embeddings,
        weight_bytes=shape.weight_bytes,
    )


#: the profile terms the decoder's tree steps are fitted for
ENGINE_TERMS = ("spec_step_overhead_s", "verified_token_s")
#: the batch sizes and the context of the tree steps `calibrate_engine_terms` times
ENGINE_BATCHES, ENGINE_CONTEXT = (1, 2), 64
#: the trees whose steps `calibrate_engine_terms` times: a breadth-first tree of up to 8 nodes,
#: cut to the drafter's depth (its prefixes are the tree sizes measured)
ENGINE_PROBE_TREE = ((0,), (1,), (0, 0), (2,), (0, 1), (1, 0), (0, 0, 0), (3,))


def calibrate_engine_terms(
    lm,
    profile: HardwareProfile,
    *,
    batches=ENGINE_BATCHES,
    context: int = ENGINE_CONTEXT,
    sizes=(0, 1, 2, 4, 8),
    repeats: int = 7,
    seed: int = 0,
    graphs: bool | None = None,
    log=None,
) -> ProfileFit:
    """The engine terms of `profile` (a fixed cost per speculative step, a cost per verified
    token, the attention kernel's KV bandwidth) measured with treeopt's own decoder: tree steps of
    the loaded model and drafter `lm` (calibration.models.load_model) timed as the sweep times
    them (`graphs` as the sweep takes it), then fitted to the microbenchmark profile
    (docs/performance-model.md#engine-terms-of-a-speculative-step). `log`: where to say, before
    the first step, how long the steps should take by `profile` and, after each batch size, how
    far it got (a 7B model on a CPU takes minutes here)."""
    depth = getattr(lm.heads, "num_heads", 1)
    proposal = make_tree([p for p in ENGINE_PROBE_TREE if len(p) <= depth], topk=10)
    sizes = tuple(n for n in sizes if n <= proposal.size)
    heads_by_nodes = [proposal.prefix(n).depth for n in range(proposal.size + 1)]
    shape = shape_of(lm.name, dtype=torch_dtype_name(lm.dtype))
    heads = heads_shape_of_drafter(lm.heads)
    say = log or (lambda line: None)
    planned = engine_terms_estimate_s(shape, heads, profile, batches, context, sizes, heads_by_nodes, repeats)
    say(
        f"  engine terms: {len(batches) * len(sizes) * (repeats + 1)} tree steps of {lm.name} (batch "
        f"{', '.join(map(str, batches))}, context {context}, trees of {', '.join(map(str, sizes))} nodes), "
        f"about {duration_text(planned)} by the profile just measured"
    )
    rows = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, batch in enumerate(batches, 1):
            rows += measure_group(
                lm, proposal, sizes, batch, context, repeats=repeats, warmup=1, topk=10, seed=seed, graphs=graphs
            )
            say(f"  engine terms: batch {batch} done ({i}/{len(batches)}, {duration_text(time.perf_counter() - t0)})")
    table = pd.DataFrame(rows)
    points = sweep_step_points(table, heads_by_nodes)
    # only the engine terms are free: the microbenchmarks measured everything else directly
    return fit_profile(
        shape,
        heads,
        profile,
        points,
        name=profile.name,
        terms=ENGINE_TERMS,
        source=f"treeopt's decoder on {lm.name}{_weights_note(lm)}: {len(points)} tree steps",
    )


def engine_terms_estimate_s(shape, heads, profile, batches, context, sizes, heads_by_nodes, repeats) -> float:
    """Seconds the engine-term steps should take by `profile`: each size of each batch timed
    `repeats` times after one warm-up step, each step priced by the roofline."""
    plan = pd.DataFrame(
        [{"batch": b, "context": context, "nodes": n, "step_time_s": 0.0} for b in batches for n in sizes]
    )
    step_s = predict_step_s(shape, heads, profile, sweep_step_points(plan, heads_by_nodes))
    return float(step_s.sum()) * (repeats + 1)


def _weights_note(lm) -> str:
    """' (random weights)' for a model built by `calibration.random_model`, else nothing."""
    return "" if getattr(lm, "random_seed", None) is None else " (random weights)"


def engine_bench_positions() -> int:
    """The positions of the longest tree step `calibrate_engine_terms` times: its context, the
    largest probe tree and the root."""
    return ENGINE_CONTEXT + len(ENGINE_PROBE_TREE) + 1
