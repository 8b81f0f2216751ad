"""What every command does with its outputs before any work (docs/formats.md#output-safety):
no output is one of its inputs or another of its outputs, and every output location can be
written. The inputs are given as the user wrote them; names that are not files (a built-in
hardware or model name, a tree literal, `demo`) resolve to paths that do not exist and match
no output."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from treeopt.errors import UserError
from treeopt.fileio import check_writable, refuse_overwriting_inputs

#: the file a folder output is probed with (it is never created)
_PROBE_NAME = "index.md"


def _is(path: Path, kind: str) -> bool:
    """path.exists() / path.is_dir(), False for a spec no file system could hold: an inline tree
    literal longer than a file name may be (OSError ENAMETOOLONG) is not a path."""
    try:
        return path.exists() if kind == "exists" else path.is_dir()
    except OSError:
        return False


def input_files(*specs) -> list[Path]:
    """The paths an input spec can name: the spec itself, and for a directory (a model) its
    config.json and heads/config.json; a `FILE:CELL` selection reference names FILE."""
    paths = []
    for spec in specs:
        if spec is None:
            continue
        text = os.fspath(spec)
        path = Path(text)
        paths.append(path)
        if ":" in text and not _is(path, "exists"):
            paths.append(Path(text.rsplit(":", 1)[0]))
        if _is(path, "dir"):
            paths += [path / "config.json", path / "heads" / "config.json"]
    return paths


def check_outputs(outputs: Iterable = (), inputs: Iterable = (), folders: Iterable = ()) -> None:
    """UserError, one line, before any work: an output file or folder is also an input (same
    file after resolving links), two outputs are the same file, or a location cannot be
    written. `folders` are output directories (a report): each must be a directory or not
    exist yet, and be creatable."""
    files = [Path(o) for o in outputs if o is not None]
    dirs = [Path(f) for f in folders if f is not None]
    ins = list(inputs)
    seen: dict[str, Path] = {}
    for out in files:
        key = os.path.realpath(out)
        if key in seen:
            raise UserError(f"{os.fspath(out)}: given twice as an output ({os.fspath(seen[key])} too)")
        seen[key] = out
    refuse_overwriting_inputs(files + dirs, ins)
    for out in files:
        if out.is_dir():
            raise UserError(f"{os.fspath(out)}: cannot write: is a directory; give a file name to write")
    for folder in dirs:
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{os.fspath(folder)}: is not a directory; give a folder to write the outputs in")
    check_writable(files + [d / _PROBE_NAME for d in dirs])


def require_file(path, option: str) -> None:
    """UserError naming `option` when `path` is not a readable file (missing or a folder)."""
    if path is None:
        return
    if Path(path).is_dir():
        raise UserError(f"{option}: {os.fspath(path)}: is a directory, not a file")
    if not Path(path).is_file():
        raise UserError(f"{option}: {os.fspath(path)}: no such file")
