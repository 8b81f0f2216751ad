"""treeopt from Python: the library the `treeopt` command runs on, one call per thing it does.

Every name here is importable from `treeopt` directly (`treeopt.build_tree`, `treeopt.predict`,
...);
docs/python.md is the guide. Bad input raises `treeopt.UserError` with the one-line message the
command line prints; nothing here exits the interpreter, prints, or writes a file unless asked.

Units: times are in seconds (`step_time_s`), speedups and overheads are ratios to plain
decoding, tau is expected tokens per step, batch is sequences, context is cached tokens.

This module belongs to the application layer (docs/architecture.md): it joins the core, the
roofline and, on demand, the calibration package.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.engine_bench import RunOptions
from roofline.grid import DEFAULT_BATCHES, DEFAULT_CONTEXTS
from roofline.hardware import HardwareProfile, builtin_hardware, load_hardware
from roofline.profile_fit import ProfileFit, predict_step_s, read_step_points, step_points_frame
from roofline.profile_fit import fit_profile as _fit_profile
from roofline.shapes import ModelShape
from roofline.step_shape import ONE_GPU, GpuSplit
from treeopt.accuracy import AccuracyTable
from treeopt.accuracy import load_accuracy as load_accuracy
from treeopt.app.grid_outputs import close_call_section
from treeopt.app.models import heads_of, shape_of
from treeopt.app.pooled import add_sweep_pooled_evidence, sweep_model
from treeopt.app.prediction import Prediction, PredictionOptions, predict_speedup
from treeopt.chain_counts import ChainAcceptance, ExpectationCheck, check_expectation, expected_counts
from treeopt.chain_counts import chain_acceptance as _chain_acceptance
from treeopt.chain_counts import chain_table as _chain_table
from treeopt.chain_or_tree import chain_or_tree
from treeopt.dynamic_schedule import dynamic_tau_schedule, read_dynamic_taus
from treeopt.engine_readers import EngineWindow, load_engine_window
from treeopt.engines import EngineExport as EngineExport
from treeopt.engines import check as _check
from treeopt.engines import draft_model_dir, eagle_draft, export_for, get_engine
from treeopt.errors import UserError
from treeopt.mix import choose_mix_tree, mix_grid_from_sweep, mix_section, parse_mix
from treeopt.public_names import PUBLIC_NAMES
from treeopt.schedules import with_schedule
from treeopt.selection import (
    proposal_from_meta,
    read_grid_with_proposal,
    read_round_samples,
    read_sweep,
    selection_from_grid,
    sweep_confidence,
    sweep_samples_path,
)
from treeopt.selection import select as _select_sweep
from treeopt.selection_types import Selection as Selection
from treeopt.stats import DEFAULT_TOLERANCE
from treeopt.sweep_file import check_samples_cells
from treeopt.tree import Tree, make_tree
from treeopt.tree import load_tree as load_tree
from treeopt.tree_api import EngineCheck as EngineCheck
from treeopt.tree_api import _table
from treeopt.tree_api import build_tree as build_tree
from treeopt.tree_api import check as check
from treeopt.tree_api import engine_for_table as engine_for_table
from treeopt.tree_api import expected_tokens as expected_tokens
from treeopt.tree_api import export_tree as export_tree

# One list, in treeopt/__init__.py, so the two cannot differ; the names that live in the core
# (treeopt.tree_api and below) are imported "X as X" above to re-export them.
__all__ = list(PUBLIC_NAMES)


# ---------------------------------------------------------------------------------------------
# Trees


# ---------------------------------------------------------------------------------------------
# Step costs and predictions


def model_shape(model: str | Path, dtype: str | None = None) -> ModelShape:
    """A model's shape for the roofline: a built-in name (`llama-2-7b`, `vicuna-7b`, ...), a
    config.json, a model directory, or "demo"; `dtype` ("fp16", "bf16", "fp32", ...) overrides
    the model's."""
    return shape_of(str(model), dtype)


def hardware_profiles() -> dict[str, HardwareProfile]:
    """The built-in accelerator profiles by name (`treeopt hw list`)."""
    return dict(builtin_hardware())


def predict(
    model: str | Path | ModelShape,
    hardware: str | Path | HardwareProfile,
    accuracy: AccuracyTable | str | Path,
    *,
    batches=DEFAULT_BATCHES,
    contexts=DEFAULT_CONTEXTS,
    max_nodes: int = 64,
    engine: str | None = None,
    dtype: str | None = None,
    heads: int | None = None,
    head_layers: int | None = None,
    options: PredictionOptions | None = None,
) -> Prediction:
    """The predicted speedup of every tree size 0..max_nodes of the greedy proposal (within
    `engine`'s family when given) for every batch size and context, from the roofline model of
    `hardware` (docs/performance-model.md). `heads`: the draft heads a step runs (default: the
    table's); `options`: how a step is priced (default `PredictionOptions()`), such as
    `PredictionOptions(verification="candidates")`. Returns a `Prediction`: `.to_frame()`,
    `.best()`, `.plot()`, `.plot_best()`; `select(prediction)` turns it into a selection."""
    return predict_speedup(
        model if isinstance(model, ModelShape) else str(model),
        hardware,
        _table(accuracy),
        dtype=dtype,
        batches=batches,
        contexts=contexts,
        max_nodes=max_nodes,
        engine=engine,
        heads={"num_heads": heads, "num_layers": head_layers},
        options=options or PredictionOptions(),
    )


def load_grid(path: str | Path, accuracy: AccuracyTable | str | Path) -> Prediction:
    """A grid CSV written by `treeopt roofline speedup -o`, with the greedy proposal of the
    accuracy table it was computed from (the grid does not store its trees)."""
    table = _table(accuracy)
    grid, proposal = read_grid_with_proposal(str(path), table)
    tau_by_nodes = grid.groupby("nodes")["tau"].first().to_numpy()
    return Prediction(None, None, proposal, tau_by_nodes, grid, accuracy=table, source=str(path))


def _shapes(model, dtype: str | None, heads: int, head_layers: int | None):
    """The model's shape and, for `heads` > 0, its draft heads' (read beside a model directory)."""
    shape = model if isinstance(model, ModelShape) else shape_of(str(model), dtype)
    spec = shape.name if isinstance(model, ModelShape) else str(model)
    return shape, heads_of(spec, shape, num_heads=heads, num_layers=head_layers) if heads else None


def fit_profile(
    model: str | Path | ModelShape,
    hardware: str | Path | HardwareProfile,
    measurements: str | Path | pd.DataFrame | list,
    *,
    heads: int = 0,
    head_layers: int | None = None,
    attention: str = "fused",
    name: str | None = None,
    dtype: str | None = None,
    batch: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    tokens: int | None = None,
) -> ProfileFit:
    """Fit `hardware`'s engine terms to measured steps
    (docs/performance-model.md#fitting-a-profile-to-measured-steps): a DataFrame with columns
    batch, context, tokens, step_ms [, candidates, draft_stages, tree], or a file path (or a list of
    them, joined): that table as CSV, or an engine's own benchmark output (SGLang
    bench_one_batch JSONL, vLLM latency JSON, trtllm-bench report JSON;
    docs/performance-model.md#engine-benchmark-files). `batch`, `input_len`, `output_len`,
    `tokens`: what such a file does not record (tokens verified per step, root included; 1 =
    plain decoding). `heads`: the draft heads whose operators a speculative step's prediction
    includes (0: drafting is left to the fitted terms; use the same value wherever the profile
    is used). Returns a `ProfileFit`: `.profile` (save it with `.profile.save(path)`), `.terms`,
    `.free`, `.in_sample_error`, `.loo_error` (relative), and for every term `.values()`,
    `.intervals` (95%, Laplace), `.status` ("determined", "prior" or "at bound") and `.priors`
    (docs/performance-model.md#fitting-a-profile-to-measured-steps)."""
    shape, head_shape = _shapes(model, dtype, heads, head_layers)
    base = load_hardware(hardware)
    run = RunOptions(batch=batch, input_len=input_len, output_len=output_len, tokens=tokens)
    if isinstance(measurements, pd.DataFrame):
        given = [k for k, v in vars(run).items() if v is not None]
        if given:
            raise UserError("applies to benchmark files, not to a table of steps", param=given[0])
        frame = measurements.rename(columns=lambda c: str(c).strip().lower())
        points, source = step_points_frame(frame, source="measurements", heads=heads), "measurements"
    else:
        paths = [str(m) for m in measurements] if isinstance(measurements, (list, tuple)) else [str(measurements)]
        if not paths:
            raise UserError("no measurements file given", param="measurements")
        points, source = read_step_points(paths, heads=heads, run=run), ", ".join(paths)
    return _fit_profile(shape, head_shape, base, points, attention=attention, name=name, source=source)


def predict_steps(
    model: str | Path | ModelShape,
    hardware: str | Path | HardwareProfile,
    points: pd.DataFrame,
    *,
    source: str = "points",
    heads: int = 0,
    head_layers: int | None = None,
    attention: str = "fused",
    dtype: str | None = None,
    gpus: GpuSplit = ONE_GPU,
) -> np.ndarray:
    """Predicted step time in seconds of every row of `points` (columns batch, context, tokens
    [, candidates, draft_stages, tree]), as `treeopt roofline predict` does; `source` names the
    table in messages; `gpus`: the GPUs the model is spread over (`roofline.step_shape.GpuSplit`)."""
    shape, head_shape = _shapes(model, dtype, heads, head_layers)
    frame = points.rename(columns=lambda c: str(c).strip().lower())
    if "step_ms" not in frame.columns:  # rows to predict need no times; one reader for both
        frame = frame.assign(step_ms=1.0)
    steps = step_points_frame(frame, source=source, heads=heads)
    return predict_step_s(shape, head_shape, load_hardware(hardware), steps, attention=attention, gpus=gpus)


# ---------------------------------------------------------------------------------------------
# Measured sweeps and selection


@dataclass(frozen=True, eq=False)
class Sweep:
    """A measured sweep (`treeopt sweep` or `run`): the table (docs/formats.md, one row per
    batch, context and tree size), its metadata, the per-round step times behind its intervals,
    and the proposal tree whose prefixes were measured."""

    path: str
    frame: pd.DataFrame = field(repr=False)
    meta: dict = field(repr=False)
    samples: dict = field(repr=False)
    proposal: Tree

    @property
    def source(self) -> str:
        return self.path

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()

    def plot(self, selection: Selection | None = None):
        """Measured speedup against tree size with its interval band, the selection's picks
        marked (default: `select(self)`); a matplotlib Figure."""
        # matplotlib is loaded when a figure is asked for, not with the library
        from roofline.plots import measured_speedup_figure

        chosen = selection if selection is not None else select(self)
        return measured_speedup_figure(self.frame, chosen)


def load_sweep(path: str | Path) -> Sweep:
    """A sweep CSV with its `.meta.json` and round samples beside it, validated."""
    frame, meta = read_sweep(str(path))
    samples = read_round_samples(sweep_samples_path(path))
    check_samples_cells(samples, frame, sweep_samples_path(path))
    return Sweep(str(path), frame, meta, samples, proposal_from_meta(meta, str(path)))


def plot_selection(selection: Selection, *, title: str | None = None):
    """The chosen tree size and its speedup over batch x context; a matplotlib Figure."""
    # matplotlib is loaded when a figure is asked for, not with the library
    from roofline.plots import selection_heatmaps_figure

    return selection_heatmaps_figure(selection, title=title)


def select(
    source: Prediction | Sweep,
    *,
    by: str = "measured",
    threshold: float = 1.0,
    tolerance: float = DEFAULT_TOLERANCE,
    engine: str | None = None,
    accuracy: AccuracyTable | str | Path | None = None,
    mix: str | Path | None = None,
    verification: str | None = None,
    pooled: bool = True,
    model: str | Path | None = None,
    hardware: str | Path | HardwareProfile | None = None,
    fixed_rounds: bool = True,
) -> Selection:
    """The best tree per (batch, context) of a prediction or a measured sweep
    (docs/statistics.md for the measured rule); no tree unless it beats `threshold`. On a
    sweep, a smaller tree is as good as a bigger one when the lower bound of their paired
    speedup ratio is at least 1 - `tolerance` (a fraction; 0.03 = 3%).

    `by` ("measured" or "predicted"): which speedup of a sweep decides. `engine`: add each
    cell's tree as the line that engine takes (default: the prediction's engine); the heads and
    SGLang's flags come from `accuracy` (default: the prediction's table). `mix`: also choose
    one tree for this traffic mix (a CSV batch,context,weight or inline '1:0.5,8@2048:0.5').
    `verification`: how the engine verifies, recorded (a sweep knows its own).

    On a sweep, `pooled` adds the evidence of one profile fitted to every cell, as `treeopt run`
    does (docs/statistics.md#pooled-evidence): `model` and `hardware` default to those the
    sweep's metadata names (a built-in profile, or the `hardware.json` of a run folder); where
    they cannot be found, `selection.pooled.skipped` says what to give.

    `fixed_rounds` (a sweep's rounds are all there will be): a cell that neither its own rounds
    nor the pooled fit settle ships the tree of best worst-case paired bound where a tree beats
    `threshold` at its lower bound (reason "best bound", with the trees it is not shown to be
    within `tolerance` of; docs/statistics.md#a-sweep-that-cannot-be-measured-again); False
    leaves such cells "undecided"."""
    if isinstance(source, Sweep):
        chosen = _select_sweep(
            source.frame,
            source.proposal,
            by=by,
            threshold=threshold,
            hardware=source.meta.get("hardware", source.meta.get("device", "")),
            model=source.meta.get("model", ""),
            samples=source.samples,
            threads=source.meta.get("threads"),
            tolerance=tolerance,
            confidence=sweep_confidence(source.meta),
            fixed_rounds=fixed_rounds,
        )
        measured = source.meta.get("verification", "tree")
        if verification not in (None, measured):
            raise UserError(f"--verification {verification}: {source.path} was measured with {measured} verification")
        chosen = replace(chosen, provenance=replace(chosen.provenance, verification=measured))
        if pooled and by == "measured":
            found = sweep_model(source.meta, source.path, model=model, hardware=hardware)
            rule = {"tolerance": tolerance, "confidence": sweep_confidence(source.meta), "threshold": threshold}
            chosen = add_sweep_pooled_evidence(chosen, source.frame, source.samples, source.proposal, found, rule=rule)
        grid = mix_grid_from_sweep(source.frame, by)
    elif isinstance(source, Prediction):
        provenance = {"verification": verification or source.verification}
        if source.model is not None:
            provenance = {"heads": source.draft_heads, "attention": source.attention} | provenance
        chosen = selection_from_grid(
            source.grid,
            source.proposal,
            source.hardware.name if source.hardware is not None else "",
            source.model.name if source.model is not None else "",
            threshold=threshold,
            provenance=provenance,
        )
        # the model alone picks here: say where it cannot (docs/performance-model.md#close-calls)
        chosen = replace(chosen, close_calls=close_call_section(source))
        grid = source.grid
    else:
        raise UserError(f"select: expected a Prediction or a Sweep, got {type(source).__name__}")
    table = _table(accuracy) if accuracy is not None else getattr(source, "accuracy", None)
    engine = engine or getattr(source, "engine", None)
    if mix is not None:
        traffic = parse_mix(str(mix))
        choice = choose_mix_tree(grid, traffic, threshold=threshold, source=source.source, chosen=chosen.chosen_nodes())
        chosen = replace(chosen, mix=mix_section(choice, source.proposal, traffic, threshold))
    if engine is not None:
        chosen = with_engine(chosen, engine, table, grid=grid, proposal=source.proposal)
    target = get_engine(chosen.provenance.engine) if chosen.provenance.engine else None
    return replace(chosen, chain_or_tree=chain_or_tree(chosen, grid, source.proposal, target))


def with_engine(
    selection: Selection, engine: str, table: AccuracyTable | None, *, grid=None, proposal: Tree | None = None
) -> Selection:
    """`selection` with each cell's tree as the line `engine` takes (`engine_line`,
    docs/engines.md#exports) and the engine's per-batch `schedule` (docs/engines.md#schedules):
    for SGLang from the `grid` (batch, context, nodes, speedup) of the nested `proposal`, each
    size as the flags that draft it; a mix section already in the selection gives the contexts."""
    chosen = _with_engine_lines(selection, engine, table)
    acc = table.accuracy if table is not None else None
    target = get_engine(chosen.provenance.engine)
    return with_schedule(
        chosen,
        target,
        grid=grid,
        proposal=proposal,
        accuracy=acc,
        drafter=eagle_draft(table),
        draft_model=draft_model_dir(table) if table is not None else None,
    )


def with_dynamic_tau(
    selection: Selection, source: Prediction | Sweep, tau_file: str | Path, table: AccuracyTable | None, by: str
) -> Selection:
    """`selection` (with `engine` trtllm-eagle3-dynamic already added) with its schedule priced from
    the draft's own tau per (steps, topk, num_draft_tokens) in `tau_file` (`treeopt sglang-tau -o`)
    and the step times of `source`'s grid or sweep (`by`: measured or predicted), instead of the
    accuracy table's ranks (treeopt.dynamic_schedule, docs/engines.md#schedules)."""
    taus = read_dynamic_taus(tau_file)
    grid = mix_grid_from_sweep(source.frame, by) if isinstance(source, Sweep) else source.grid
    weights = {(c.batch, c.context): c.weight for c in selection.mix.cells} if selection.mix is not None else None
    engine = get_engine(selection.provenance.engine or "")
    section = dynamic_tau_schedule(
        selection.cells, engine, grid, taus, source=str(tau_file), weights=weights, drafter=eagle_draft(table)
    )
    return replace(selection, schedule=section)


def _with_engine_lines(selection: Selection, engine: str, table: AccuracyTable | None) -> Selection:
    """Each selected cell's medusa_choices as the line `engine` takes (docs/engines.md#exports)."""
    target = get_engine(engine)
    acc = table.accuracy if table is not None else None
    heads = table.num_heads if table is not None else None
    cells = []
    for cell in selection.cells:
        if not cell.nodes:
            cells.append(replace(cell, engine_line=None))
            continue
        tree = make_tree(
            [list(p) for p in cell.medusa_choices], source=f"cell batch={cell.batch},context={cell.context}"
        )
        drafted = _check(tree, target, heads=heads, accuracy=acc)
        if not drafted.as_written:
            raise UserError(
                f"--engine {target.name}: {tree.name}: not drafted as written ({drafted.reason}); "
                f"build the sweep or grid with --engine {target.name}"
            )
        cells.append(
            replace(
                cell, engine_line=export_for(target, tree, heads=heads, accuracy=acc, drafter=eagle_draft(table)).line
            )
        )
    return replace(selection, cells=tuple(cells), provenance=replace(selection.provenance, engine=target.name))


# ---------------------------------------------------------------------------------------------
# Calibration (torch is loaded by these calls only)


def load_model(
    model: str | Path = "demo",
    drafter: str | Path | None = None,
    *,
    kind: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    num_heads: int | None = None,
):
    """A causal LM and its drafter, loaded for calibration and decoding: `model` is a local
    transformers directory or "demo"; `drafter` a drafter directory (Medusa heads, Hydra heads,
    an MLP speculator or a draft model; default: the one next to the model), `kind` overrides
    the kind its config declares. Returns `calibration.models.LoadedModel`."""
    # torch and transformers load here, so that the tree and roofline calls never pay for them
    from calibration.models import load_model as _load_model

    return _load_model(
        str(model),
        str(drafter) if drafter is not None else None,
        device=device,
        dtype=dtype,
        num_heads=num_heads,
        drafter=kind,
    )


def load_prompts(loaded, data: str | Path = "demo", *, prompt_tokens: int = 128, max_prompts: int | None = None):
    """The calibration prompts of a data file (ShareGPT, OpenAI messages, Alpaca, JSON lines or
    text; docs/formats.md) or "demo", tokenised with the loaded model's tokenizer through its
    chat template, in chunks of at most `prompt_tokens` tokens."""
    # torch and transformers load here, so that the tree and roofline calls never pay for them
    from calibration.data import load_prompts as _load_prompts

    return _load_prompts(str(data), loaded.tokenizer, prompt_tokens=prompt_tokens, max_prompts=max_prompts)


def calibrate(loaded, prompts, *, steps: int = 32, topk: int = 10, batch_size: int = 8, **options) -> AccuracyTable:
    """The accuracy table of `loaded`'s drafter on `prompts` (greedy labels: what verification
    accepts), with the joint prefix counts. `options` are those of
    `calibration.runner.calibrate` and the fields of its `CalibrationSettings` (labels,
    max_prompts, seed, checkpoint, ...)."""
    # torch and transformers load here, so that the tree and roofline calls never pay for them
    from calibration import runner

    settings, rest = runner.CalibrationSettings.split(
        {"steps": steps, "topk": topk, "batch_size": batch_size, **options}
    )
    return runner.calibrate(loaded, prompts, settings, **rest).table


# ---------------------------------------------------------------------------------------------
# The engine's own acceptance (docs/python.md#the-engines-own-acceptance)


def engine_acceptance(files) -> EngineWindow:
    """The window of an engine's acceptance output: one or two vLLM /metrics scrapes (the later
    first; two make the window between them), or one per-request JSON / JSON-lines file of vLLM
    (`metrics.speculative_decoding`) or SGLang (`meta_info`). docs/formats.md#engine-acceptance-counts."""
    return load_engine_window([files] if isinstance(files, str | Path) else list(files))


def chain_table(window: EngineWindow | str | Path | list) -> AccuracyTable:
    """The chain accuracy table (treeopt.accuracy/v1, width 1, provenance naming the engine,
    window and counts) of an engine window or of the files `engine_acceptance` reads."""
    return _chain_table(window if isinstance(window, EngineWindow) else engine_acceptance(window))


def chain_acceptance(window: EngineWindow, *, confidence: float = 0.95, extra: int | None = None) -> ChainAcceptance:
    """Per-position conditional acceptance with Wilson intervals and tau of every chain length
    with its interval, extrapolated (flagged) up to `extra` lengths past K [default K]."""
    return _chain_acceptance(window.accepted_length_histogram, confidence=confidence, extra=extra)


def _acceptance_counts(files) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, tries) per chain position of an accuracy table file or engine output."""
    if isinstance(files, AccuracyTable):
        return expected_counts(files)
    if isinstance(files, EngineWindow):
        c = chain_acceptance(files, extra=0)
        return c.accepted, c.tries
    files = [files] if isinstance(files, str | Path) else list(files)
    if len(files) == 1 and _is_accuracy_file(files[0]):
        return expected_counts(load_accuracy(files[0]))
    c = chain_acceptance(engine_acceptance(files), extra=0)
    return c.accepted, c.tries


def _is_accuracy_file(path) -> bool:
    text = str(path)
    if text.lower().endswith(".csv"):
        return True
    try:
        with open(path, encoding="utf-8-sig") as f:
            head = f.read(4096).lstrip()
    except (OSError, UnicodeDecodeError):
        return False  # the engine reader says what is wrong, in one line
    return head.startswith("[[") or (head.startswith("{") and "treeopt.accuracy/" in head)


def check_acceptance(observed, expected, *, tolerance: float = 0.05, confidence: float = 0.95) -> ExpectationCheck:
    """The engine's per-position acceptance (`observed`: engine output files, an EngineWindow, a
    chain table file or an AccuracyTable) against `expected` (the same kinds: a calibration's or
    an earlier window's table, or engine output of an earlier window): `.consistent` and `.line()` say the verdict."""
    return check_expectation(
        _acceptance_counts(observed), _acceptance_counts(expected), tolerance=tolerance, confidence=confidence
    )
