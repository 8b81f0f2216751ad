"""`treeopt run`: the whole loop on one model, each stage kept in the output folder so that a
rerun resumes where the last one stopped: calibrate -> proposal trees -> hardware profile ->
prediction -> measured sweep -> selection -> validation -> report (docs/architecture.md#the-main-job).
Each stage is a module of `treeopt.app.stages`; this module runs them in order and keeps the
record of the stages done (`run_state.json`)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from calibration.calibration_settings import steps_too_few
from calibration.data import check_prompt_source
from calibration.drafters import DEFAULT_MAX_DEPTH, detect_kind
from calibration.models import check_decodable, load_model
from roofline.engine_presets import calibrated_line
from roofline.hardware import load_hardware
from treeopt.app.models import is_demo, shape_of
from treeopt.app.run_index import RunResults, run_index_markdown
from treeopt.app.stages import calibrate, hardware
from treeopt.app.stages.job import Job, RunSettings
from treeopt.app.stages.predict import predict
from treeopt.app.stages.proposal import build_proposal, check_engine_serves_drafter
from treeopt.app.stages.select import select_trees
from treeopt.app.stages.sweep import log_batch_transfer, measure_sweep
from treeopt.app.stages.validate import validate_held_out
from treeopt.app.sweep import DEMO_VALIDATION
from treeopt.errors import UserError
from treeopt.fileio import atomic_outputs, output_lock, write_json, write_text
from treeopt.mix import parse_mix
from treeopt.resume import differences_text


def _read_state(out: Path, log=None) -> dict:
    """The stages recorded in `out/run_state.json`; a file that is not a JSON object of stages
    (damaged by hand or by a full disk) counts as no stage done, with a warning: every stage
    then runs again, which is slower but never wrong."""
    state_file = out / "run_state.json"
    if not state_file.is_file():
        return {}
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        state = err
    if not isinstance(state, dict):
        if log is not None:
            log(
                f"treeopt: warning: {state_file}: not a run state ({str(state).splitlines()[0][:80]}); "
                "every stage runs again"
            )
        return {}
    return state


def _stage(out: Path, name: str, settings: dict, log) -> bool:
    """Whether stage `name` is already done in `out` with these settings (a rerun resumes)."""
    state = _read_state(out, log)
    done = state.get(name) == settings
    if done:
        log(f"[{name}] done earlier with the same settings: kept")
    elif name in state:
        log(f"[{name}] done earlier with other settings ({differences_text(state[name], settings)}): again")
    return done


def _mark(out: Path, name: str, settings: dict, writing: dict | None = None) -> None:
    """Record stage `name` as done, together with the outputs it writes (`writing`: final path
    -> function that writes a file): all land or none does, so an interrupted run never keeps
    a stage record without its outputs, nor outputs that a rerun would redo
    (docs/formats.md#output-safety)."""
    state = _read_state(out)
    state[name] = settings
    with atomic_outputs() as outputs:
        for final, write in (writing or {}).items():
            write(outputs.path(final))
        write_json(outputs.path(out / "run_state.json"), state)


def run_main_job(out_dir, settings: RunSettings | None = None, *, log=print, progress: bool = True, say=None) -> dict:
    """calibrate -> proposal trees -> hardware profile -> prediction -> sweep -> selection ->
    validation -> report, all into `out_dir`. Each stage's result is kept; a rerun (after an
    interruption) skips the stages already done with the same settings. `settings`: None for
    the defaults, the demo's run. `log` takes the progress lines, `say` the results (None: `log`)."""
    out = Path(out_dir)
    fresh = not out.exists()
    settings = _with_data(settings or RunSettings())
    try:
        # a second run into the folder, or any writer of a file inside it, fails at once
        with output_lock(out), output_lock(out / "run_state.json", whole_folder=True):
            return _run_main_job(Job(settings, out, log, progress, say))
    except UserError:
        # bad input found before anything was written: leave no empty report folder behind
        if fresh and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _with_data(s: RunSettings) -> RunSettings:
    """The demo's own prompts stand in only for the demo: any other model is calibrated and
    validated on prompts from its own use, which the user must name."""
    if is_demo(s.model):
        return replace(s, data=s.data or "demo", validation_data=s.validation_data or DEMO_VALIDATION)
    for option, value in (("--data", s.data), ("--validation-data", s.validation_data)):
        if value is None:
            raise UserError(
                f"{option}: required for --model {s.model} (the demo prompts are Python code; "
                "give prompts from your model's own use, the validation ones disjoint from --data)"
            )
    return s


@contextmanager
def _timed(timings: dict, key: str):
    t0 = time.perf_counter()
    yield
    timings[key] = time.perf_counter() - t0


def _calibrated(job: Job, dtype: str) -> Path:
    """Stage 1, kept from an earlier run with the same settings."""
    record = calibrate.record(job, dtype)
    acc_file = calibrate.accuracy_path(job)
    if not (_stage(job.out, calibrate.STAGE, record, job.log) and acc_file.is_file()):
        calibrate.calibrate(job, dtype)
        _mark(job.out, calibrate.STAGE, record)
    return acc_file


def _hardware_profile(job: Job, bench: hardware.Bench):
    """Stage 3, kept from an earlier run with the same settings."""
    record = hardware.record(job, bench)
    hw_file = job.out / "hardware.json"
    if not (_stage(job.out, hardware.STAGE, record, job.log) and hw_file.is_file()):
        hw = hardware.profile_hardware(job, bench)
        _mark(job.out, hardware.STAGE, record, writing={hw_file: hw.save})
    return load_hardware(hw_file)


def _drafter_kind(s: RunSettings) -> str:
    """The run's drafter kind before anything loads: --drafter, else what the --heads
    directory's config.json declares, else Medusa heads (the model's own). A config that cannot
    be read counts as Medusa heads here; the loader says what is wrong with it."""
    if s.drafter:
        return s.drafter
    if s.heads:
        try:
            config = json.loads((Path(s.heads) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return "medusa"
        return (detect_kind(config) if isinstance(config, dict) else None) or "medusa"
    return "medusa"


def _run_main_job(job: Job) -> dict:
    s, out = job.settings, job.out
    mix = parse_mix(s.mix) if s.mix is not None else None  # bad input fails before any work
    check_prompt_source(s.data, "--data")
    check_prompt_source(s.validation_data, "--validation-data")  # now, not at stage 7 after hours of work
    check_engine_serves_drafter(s, _drafter_kind(s))
    if _drafter_kind(s) == "draft-model" and s.steps < (s.num_heads or DEFAULT_MAX_DEPTH) + 1:
        raise UserError(steps_too_few(s.steps, s.num_heads or DEFAULT_MAX_DEPTH, "draft-model"))
    # the roofline must price the model and the decoder must run it: both said before the
    # calibration, not after it (docs/architecture.md#the-run-report)
    check_decodable(s.model)
    shape_of(s.model)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings = {}
    dtype = calibrate.run_dtype(s.dtype, s.device)  # the dtype every later stage runs in
    with _timed(timings, "calibrate_s"):
        acc_file = _calibrated(job, dtype)
    calibrate.check_heads_match(acc_file, s.heads)
    lm = load_model(s.model, s.heads, device=s.device, dtype=dtype, num_heads=s.num_heads, drafter=s.drafter)
    proposal = build_proposal(job, acc_file)
    bench = hardware.set_up_bench(job, lm)
    with _timed(timings, "hardware_s"):
        hw = _hardware_profile(job, bench)
    # the run predicts with this machine's calibrated profile, never an engine preset
    job.log(f"[hardware] {calibrated_line(hw.name, s.engine)}")
    with _timed(timings, "predict_s"):
        predict(job, proposal, bench, hw)
    with _timed(timings, "sweep_s"):
        measured = measure_sweep(job, proposal, bench, hw)
    log_batch_transfer(job, proposal, bench, hw, measured)
    selected = select_trees(job, proposal, bench, hw, measured, mix)
    selection = selected.selection
    timings.update(selected.timings_s)
    with _timed(timings, "validate_s"):
        result = validate_held_out(job, proposal, bench, measured, selection)
    timings["total_s"] = time.perf_counter() - t_start
    regime = f"{bench.dtype}, {bench.threads} torch thread(s)"
    report = RunResults(s, proposal, hw.name, selection, result, timings, regime, lm.heads.kind == "draft-model")
    write_text(out / "index.md", run_index_markdown(report))
    job.result(f"report: {out / 'index.md'} ({timings['total_s']:.0f} s)")
    return {"selection": selection, "validation": result, "timings": timings}
