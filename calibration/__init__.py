"""Models with draft heads, the calibration runner, the reference tree decoder and the
measured-throughput sweep. Everything here needs torch.

The names below are importable from `calibration` directly; each module is imported on first
use. `treeopt.load_model`, `treeopt.load_prompts` and `treeopt.calibrate` are the short way in
(docs/python.md).
"""

from importlib import import_module

_EXPORTS = {
    "LoadedModel": "models",
    "ModelSource": "models",
    "load_model": "models",
    "resolve_device": "models",
    "resolve_dtype": "models",
    "PromptSet": "data",
    "load_prompts": "data",
    "CalibrationResult": "runner",
    "CalibrationSettings": "runner",
    "calibrate": "runner",
    "run_calibration": "runner",
    "load_drafter": "drafters",
    "TreeDecoder": "decoder",
    "greedy_decode": "greedy",
    "run_sweep": "sweep",
    "SweepSettings": "sweep",
    "run_hardware_bench": "hwbench",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"calibration.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'calibration' has no attribute {name!r}")
