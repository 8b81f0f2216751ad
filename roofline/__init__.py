"""The analytical half: model shapes, hardware profiles, the operator-level latency model,
the speedup grid and the roofline plots. No torch at module level.

Modules: shapes (ModelShape, DraftHeadsShape, model_shape), hardware (HardwareProfile,
load_hardware), ops (operators), latency (step_time_s, op_timings), grid (speedup_grid),
hwfit (hardware profile from microbenchmark timings), profile_fit (engine terms fitted to
measured steps), published (public step times and how the built-in profiles predict them),
plots and report (matplotlib). The names below are also importable from `roofline` directly;
each module is imported on first use. The selection of a tree per cell is the core's
(`treeopt.selection`); `treeopt.predict` and `treeopt.select` join the two (docs/python.md).
"""

from importlib import import_module

_EXPORTS = {
    "ModelShape": "shapes",
    "DraftHeadsShape": "shapes",
    "model_shape": "shapes",
    "draft_heads_shape": "shapes",
    "resolve_heads": "shapes",
    "builtin_shapes": "shapes",
    "HardwareProfile": "hardware",
    "EfficiencyCurve": "hardware",
    "load_hardware": "hardware",
    "builtin_hardware": "hardware",
    "operators": "ops",
    "Op": "ops",
    "step_time_s": "latency",
    "op_timings": "latency",
    "memory_required_bytes": "latency",
    "fits_memory": "latency",
    "step_breakdown": "latency",
    "speedup_grid": "grid",
    "PerTreeSize": "grid",
    "GRID_COLUMNS": "grid",
    "heads_used_by_prefix": "grid",
    "fit_hardware_profile": "hwfit",
    "fit_profile": "profile_fit",
    "predict_step_s": "profile_fit",
    "ProfileFit": "profile_fit",
    "StepPoints": "profile_fit",
    "speedup_curves_figure": "plots",
    "best_heatmaps_figure": "plots",
    "measured_speedup_figure": "plots",
    "build_report": "report",
    "ReportRequest": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"roofline.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'roofline' has no attribute {name!r}")
