"""Engine presets: the step costs of a serving engine family, fitted to published measurements
(docs/performance-model.md#engine-presets).

roofline/data/engine_presets.json (written by tools/fit_engine_presets.py, never by hand) holds per
family the engine terms of a speculative step and the framework cost per forward
(`PRESET_FIELDS`), each with its source, how it was fitted, on which rows, and its range. A family
with no published speculative step has `measured: false` and the ideal terms (the built-in
profiles' own: no cost beyond the forward pass).

`engine_family(engine)` maps a tree-constraint engine (`treeopt.engines.ENGINE_NAMES`) to its
family; `step_costs(hw, family=..., engine=...)` applies the family's terms to a built-in profile
and says in one line which preset priced the answer. A profile from a file (calibrated or fitted)
keeps its own terms: it describes the engine it was measured on.

numpy-free and torch-free, like the rest of `roofline`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from roofline.hardware import HardwareProfile, builtin_hardware
from treeopt.engine_data import get_engine
from treeopt.errors import UserError

__all__ = [
    "DATA_FILE",
    "FAMILIES",
    "ENGINE_FAMILY",
    "PRESET_FIELDS",
    "DRAFTER_KINDS",
    "EnginePreset",
    "fitted_tables",
    "StepCosts",
    "load_presets",
    "engine_family",
    "apply_preset",
    "step_costs",
    "builtin_base",
    "calibrated_line",
]

DATA_FILE = Path(__file__).resolve().parent / "data" / "engine_presets.json"
PRESET_FORMAT = "treeopt.engine_presets/v1"

#: the unit of a drafter kind's cost charged once per speculative step instead of per drafted depth
PER_STEP = "s per step"

#: the families, in the order `treeopt hw list` shows them
FAMILIES = ("ideal", "hf-eager", "ibm-tgis", "trtllm", "vllm", "sglang")

#: the profile fields a preset sets (all others, the roofs and efficiencies, stay the GPU's)
PRESET_FIELDS = (
    "forward_overhead_s",
    "layer_overhead_s",
    "spec_step_overhead_s",
    "verified_token_s",
    "draft_stage_s",
    "tree_verify_layer_s",
    "attention_kv_efficiency",
)

#: drafter kinds a preset prices per drafted depth (docs/performance-model.md#engine-presets)
DRAFTER_KINDS = ("eagle", "eagle3", "mtp", "draft-model", "medusa", "hydra", "mlp-speculator", "ngram")

#: tree-constraint engine (docs/engines.md) -> the family whose step costs it pays. The Medusa and
#: Hydra authors' code and treeopt's reference decoder run Hugging Face models eagerly.
ENGINE_FAMILY = {
    "medusa": "hf-eager",
    "hydra": "hf-eager",
    "treeopt": "hf-eager",
    "trtllm": "trtllm",
    "vllm": "vllm",
    "trtllm-draft-model": "trtllm",
    "trtllm-eagle3": "trtllm",
    "trtllm-eagle3-dynamic": "trtllm",
    "trtllm-eagle3-tree@1.3": "trtllm",
    "vllm@0.20": "vllm",
    "vllm-medusa@0.32": "vllm",
    "vllm-mlp-speculator@0.10": "vllm",
    "vllm-draft-model": "vllm",
    "sglang": "sglang",
    "sglang-standalone": "sglang",
}

_SHORT = {
    "ideal": "ideal engine",
    "hf-eager": "HF eager",
    "ibm-tgis": "IBM TGIS",
    "trtllm": "TensorRT-LLM",
    "vllm": "vLLM",
    "sglang": "SGLang",
}


@dataclass(frozen=True)
class EnginePreset:
    """One family's record of the data file: `terms` maps a `PRESET_FIELDS` name to its fitted
    value (seconds); `ranges` to its (low, high) uncertainty; `sources`: (paper, where) pairs."""

    family: str
    title: str
    measured: bool
    terms: dict
    ranges: dict
    sources: tuple[tuple[str, str], ...]
    fit_rows: str = ""
    held_out: str = ""
    not_known: tuple[str, ...] = ()
    drafting: dict = field(default_factory=dict)
    drafting_ranges: dict = field(default_factory=dict)
    #: drafter kinds whose cost is per speculative step (a host cost, e.g. TensorRT-LLM's CPU n-gram
    #: drafter), not per drafted depth
    drafting_per_step: frozenset = frozenset()
    carried_from: str | None = None
    #: per term, how it was set (the data file's "how"), and the published tables a term of the
    #: preset's own was fitted on (not held out from any check)
    hows: dict = field(default_factory=dict)
    fitted_tables: tuple[str, ...] = ()
    #: the terms of a carried preset fitted on its own engine's published steps
    own_terms: tuple[str, ...] = ()

    @property
    def priced(self) -> bool:
        """Whether the preset sets terms of its own or carried from the closest family."""
        return self.measured or self.carried_from is not None

    @property
    def short(self) -> str:
        return _SHORT.get(self.family, self.family)

    def source_text(self) -> str:
        """'paper, where and where; paper, where': the sources, each paper once."""
        papers: dict[str, list[str]] = {}
        for paper, where in self.sources:
            papers.setdefault(paper, []).append(where)
        return "; ".join(f"{paper}, {' and '.join(wheres)}" for paper, wheres in papers.items())


@lru_cache(maxsize=4)
def _read(path: str) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("format") != PRESET_FORMAT:
        raise UserError(f"{path}: format '{data.get('format')}' is not {PRESET_FORMAT}")
    return data


def load_presets(path=DATA_FILE) -> dict[str, EnginePreset]:
    """Every family of the data file, by name, in `FAMILIES` order."""
    families = _read(str(path))["families"]
    out = {}
    for name in FAMILIES:
        raw = families[name]
        terms = raw.get("terms", {})
        unknown = sorted(set(terms) - set(PRESET_FIELDS))
        if unknown:
            raise UserError(f"{path}: family {name}: unknown term '{unknown[0]}'")
        out[name] = EnginePreset(
            family=name,
            title=raw["title"],
            measured=bool(raw["measured"]),
            terms={k: float(v["value"]) for k, v in terms.items()},
            ranges={k: tuple(float(x) for x in v["range"]) for k, v in terms.items()},
            sources=tuple((s["paper"], s["where"]) for s in raw.get("sources", [])),
            fit_rows=raw.get("fit_rows", ""),
            held_out=raw.get("held_out", ""),
            not_known=tuple(raw.get("not_known", [])),
            drafting={k: float(v["value"]) for k, v in raw.get("drafting", {}).items()},
            drafting_ranges={k: tuple(float(x) for x in v["range"]) for k, v in raw.get("drafting", {}).items()},
            drafting_per_step=frozenset(k for k, v in raw.get("drafting", {}).items() if v["unit"] == PER_STEP),
            carried_from=raw.get("carried_from"),
            hows={k: v.get("how", "") for k, v in terms.items()},
            fitted_tables=tuple(dict.fromkeys(t for v in terms.values() for t in v.get("tables", []))),
            own_terms=tuple(k for k, v in terms.items() if v.get("tables")),
        )
    return out


def fitted_tables() -> frozenset[str]:
    """The published tables some preset term was fitted on: no check may count them as held out
    (docs/performance-model.md#close-calls)."""
    return frozenset(t for p in load_presets().values() for t in p.fitted_tables)


def engine_family(engine: str | None) -> str:
    """The family whose step costs `engine` (an `ENGINE_NAMES` entry, or a family name) pays;
    None: the ideal engine."""
    if engine is None:
        return "ideal"
    if engine in FAMILIES:
        return engine
    if engine not in ENGINE_FAMILY and "@" in engine:
        engine = get_engine(engine).name  # a release alias (vllm@0.33 is vllm), or its one-line refusal
    if engine not in ENGINE_FAMILY:
        raise UserError(f"--engine: {engine!r} has no engine family (known: {', '.join(ENGINE_FAMILY)})")
    return ENGINE_FAMILY[engine]


def apply_preset(profile: HardwareProfile, family: str, drafter: str | None = None) -> HardwareProfile:
    """`profile` with `family`'s terms: the fields of `PRESET_FIELDS` the preset fitted (or carried
    from the closest family), the rest of them at their ideal values (those of the built-in
    profiles); roofs and efficiencies as they were. An unmeasured family (and "ideal") gives the
    ideal terms. drafter: the drafter kind (`DRAFTER_KINDS`) whose cost per drafted depth sets
    draft_stage_s (None: the preset's own, that of the drafter it was fitted on); a kind whose cost
    is per step (`PER_STEP`) adds it to spec_step_overhead_s and drafts at no cost per depth."""
    preset = load_presets()[engine_family(family)]
    ideal = {k: (None if k == "attention_kv_efficiency" else 0.0) for k in PRESET_FIELDS}
    changes = {**ideal, **preset.terms}
    if drafter is not None:
        if drafter not in DRAFTER_KINDS:
            raise UserError(f"drafter kind: {drafter!r} is not one of {', '.join(DRAFTER_KINDS)}")
        if drafter in preset.drafting_per_step:
            changes["spec_step_overhead_s"] += preset.drafting[drafter]
            changes["draft_stage_s"] = 0.0
        elif drafter in preset.drafting:
            changes["draft_stage_s"] = preset.drafting[drafter]
    if preset.priced:
        changes["source"] = (
            f"{profile.source}; engine terms: the {preset.family} preset (roofline/data/engine_presets.json)"
        )
    return profile.with_(**changes)


def builtin_base(profile: HardwareProfile) -> HardwareProfile | None:
    """The built-in profile `profile` is, possibly with a preset's terms (None: not a built-in)."""
    base = builtin_hardware().get(profile.name)
    if base is None:
        return None
    stripped = profile.with_(**{k: getattr(base, k) for k in PRESET_FIELDS}, source=base.source)
    return base if stripped == base else None


@dataclass(frozen=True)
class StepCosts:
    """Which preset priced a prediction: the profile to use, the family (None: the profile's
    own terms) and the one line that says so."""

    profile: HardwareProfile
    family: str | None
    line: str


def step_costs(
    profile: HardwareProfile, *, engine: str | None = None, family: str | None = None, drafter: str | None = None
) -> StepCosts:
    """The profile a prediction uses and the line naming its step costs. `family` (--engine-costs)
    wins over `engine`'s family; neither: the ideal engine. A built-in profile takes the family's
    preset; any other profile (calibrated, fitted, a file) keeps its own terms, and the line says
    the preset was not applied when one was asked for. drafter: the drafter kind whose cost per
    drafted depth the preset charges (`apply_preset`)."""
    asked = family if family is not None else (engine_family(engine) if engine is not None else None)
    if builtin_hardware().get(profile.name) != profile:
        own = (
            "fitted"
            if (profile.calibration or {}).get("fit")
            else "calibrated"
            if profile.calibration
            else "from a file"
        )
        line = f"step costs: the profile's own terms ({profile.name}, {own})"
        if asked is not None and asked != "ideal":
            line += f"; the {asked} preset is not applied: a profile that is not built in keeps its own terms"
        return StepCosts(profile, None, line)
    name = asked or "ideal"
    preset = load_presets()[name]
    if name == "ideal":
        line = "step costs: ideal engine (no cost beyond the forward pass)"
    elif preset.measured:
        line = f"step costs: {name} preset ({preset.source_text()})"
    elif preset.carried_from:
        own = f"; its {', '.join(preset.own_terms)} fitted on {name}'s own steps" if preset.own_terms else ""
        line = (
            f"step costs: {name} preset, the {preset.carried_from} preset's terms with wider ranges "
            f"(no published step of {name} fits them{own}; {preset.source_text()})"
        )
    else:
        who = engine if engine is not None and family is None else name
        line = f"step costs: ideal engine (no published measurement of {who})"
    return StepCosts(apply_preset(profile, name, drafter), name, line)


def calibrated_line(profile_name: str, engine: str | None) -> str:
    """The step-costs line of a prediction from a calibrated profile (`treeopt run`): its own terms,
    and with `engine`, that its family's preset is not applied."""
    line = f"step costs: the profile's own terms ({profile_name}, calibrated: treeopt's reference decoder here)"
    family = engine_family(engine) if engine is not None else "ideal"
    if family != "ideal":
        line += f"; the {family} preset of --engine {engine} is not applied: a calibrated profile keeps its own terms"
    return line
