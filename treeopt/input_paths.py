"""Every file an input names, so that no output replaces one (docs/formats.md#output-safety):
the file itself, the sidecars read beside it, and for a model folder its weights, configuration
and tokenizer. Used by the commands (`treeopt.cli.safety`) and by calibration."""

from __future__ import annotations

import os
from pathlib import Path

from treeopt.acceptance import rank_vectors_path
from treeopt.chain import alpha_path
from treeopt.draft_scores import draft_scores_path


def _is(path: Path, kind: str) -> bool:
    """path.exists() / path.is_dir(), False for a spec no file system could hold: an inline tree
    literal longer than a file name may be (OSError ENAMETOOLONG) is not a path."""
    try:
        return path.exists() if kind == "exists" else path.is_dir()
    except OSError:
        return False


#: the files of a model or drafter folder that an output must never replace (its weights,
#: configuration and tokenizer), in the folder and its drafter subfolders
_MODEL_FILES = (
    "config.json",
    "*_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab*",
    "merges.txt",
    "*.safetensors",
    "*.safetensors.index.json",
    "*.bin",
    "*.bin.index.json",
    "*.pt",
    "*.model",
)


def sidecars(path: Path) -> list[Path]:
    """The files read beside an input `path`: an accuracy table's rank vectors, alpha and draft
    scores, a sweep's metadata and round samples (docs/formats.md)."""
    found = [rank_vectors_path(path), alpha_path(path), draft_scores_path(path)]
    if path.suffix == ".csv":  # the names of `treeopt.selection.sweep_meta_path` / `sweep_samples_path`
        found += [path.with_name(path.stem + ".meta.json"), path.with_name(path.stem + ".samples.npz")]
    return found


def _model_files(folder: Path) -> list[Path]:
    files = []
    for where in (folder, *[d for d in sorted(folder.iterdir()) if d.is_dir()]):
        files += [f for pattern in _MODEL_FILES for f in sorted(where.glob(pattern))]
    return files


def input_files(*specs) -> list[Path]:
    """The paths an input spec can name: the spec itself with its sidecars (`sidecars`), and for
    a directory (a model) its config.json, heads/config.json and the weight, configuration and
    tokenizer files in it and its subfolders; a `FILE:CELL` selection reference names FILE."""
    paths = []
    for spec in specs:
        if spec is None:
            continue
        text = os.fspath(spec)
        path = Path(text)
        paths.append(path)
        if ":" in text and not _is(path, "exists"):
            path = Path(text.rsplit(":", 1)[0])
            paths.append(path)
        if _is(path, "dir"):
            paths += [path / "config.json", path / "heads" / "config.json", *_model_files(path)]
        elif _is(path, "exists"):
            paths += sidecars(path)
    return paths
