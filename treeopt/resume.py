"""The one rule every resume follows (docs/formats.md#output-safety): work kept from an earlier
run (a calibration checkpoint or finished table, a sweep's finished groups, a `treeopt run`
stage, the demo's training folder) is reused only when the settings recorded with it equal the
settings now; otherwise the user is told which settings differ.

The functions here name the differences; the callers keep their own files and their own words
for what to do."""

from __future__ import annotations

__all__ = ["differing_settings", "setting_differences", "differences_text"]


def setting_differences(stored, current: dict) -> list[str]:
    """One "name: stored vs now current" for every setting of `current` whose recorded value
    differs, in `current`'s order; a nested record (a dict in both) compares field by field
    ("name.field: ..."), a tree as "a different tree". `stored` that is not a dict differs in
    every setting."""
    stored = stored if isinstance(stored, dict) else {}
    out = []
    for key, value in current.items():
        old = stored.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out += [f"{key}.{d}" for d in setting_differences(old, value)]
        elif old != value:
            out.append(f"{key}: a different tree" if key == "proposal" else f"{key}: {old!r} vs now {value!r}")
    return out


def differing_settings(stored, current: dict) -> list[str]:
    """The names of the settings `setting_differences` lists."""
    return [d.split(":", 1)[0] for d in setting_differences(stored, current)]


def differences_text(stored, current: dict, most: int = 3) -> str:
    """The first `most` differences, joined for one line."""
    diff = setting_differences(stored, current)
    return ", ".join(diff[:most]) + (f", and {len(diff) - most} more" if len(diff) > most else "")
