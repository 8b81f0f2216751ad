"""What every command does with its outputs before any work (docs/formats.md#output-safety):
no output is one of its inputs, a sidecar of one, or another of its outputs, none lies inside
the installed packages (which hold the inputs `demo` resolves to) or is a device, and every
output location can be written. The inputs are given as the user wrote them; names that are not
files (a built-in hardware or model name, a tree literal, `demo`) resolve to paths that do not
exist and match no output."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import click

from treeopt.errors import UserError
from treeopt.fileio import check_writable, output_lock, refuse_overwriting_inputs, refuse_unsafe_output
from treeopt.input_paths import input_files

__all__ = ["check_outputs", "input_files", "require_file"]

#: the file a folder output is probed with (it is never created)
_PROBE_NAME = "index.md"


def check_outputs(outputs: Iterable = (), inputs: Iterable = (), folders: Iterable = ()) -> None:
    """UserError, one line, before any work: an output file or folder is also an input (same
    file after resolving links) or a sidecar of one, two outputs are the same file, or a
    location cannot be written (`treeopt.fileio.refuse_unsafe_output`, `check_writable`).
    `folders` are output directories (a report): each must be a directory or not exist yet,
    and be creatable. Then, inside a command, every output is locked for the rest of it
    (`lock_outputs`)."""
    outputs = [o for o in outputs if o is not None]
    folders = [f for f in folders if f is not None]
    files = [Path(o) for o in outputs]
    dirs = [Path(f) for f in folders]
    ins = list(inputs)
    seen: dict[str, Path] = {}
    for out in files:
        key = os.path.realpath(out)
        if key in seen:
            raise UserError(f"{os.fspath(out)}: given twice as an output ({os.fspath(seen[key])} too)")
        seen[key] = out
    refuse_overwriting_inputs(files + dirs, ins)
    for out in outputs:  # as given: `newdir/` keeps its slash
        refuse_unsafe_output(out)
    for folder in folders:
        refuse_unsafe_output(folder, folder=True)
    check_writable(files + [d / _PROBE_NAME for d in dirs])
    lock_outputs(files + dirs)


def lock_outputs(paths: Iterable) -> None:
    """Hold the writer's lock (`treeopt.fileio.output_lock`) on each path until the running
    command ends (its click context closes): a second treeopt process writing the same file,
    or into a folder locked whole, fails at once. Outside a command (a Python caller) this
    does nothing. A path whose folder does not exist yet is not locked: the lock file would
    leave that folder behind when the command then fails."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    for path in paths:
        if Path(path).absolute().parent.is_dir():
            ctx.with_resource(output_lock(path))


def require_file(path, option: str) -> None:
    """UserError naming `option` when `path` is not a readable file (missing or a folder)."""
    if path is None:
        return
    if Path(path).is_dir():
        raise UserError(f"{option}: {os.fspath(path)}: is a directory, not a file")
    if not Path(path).is_file():
        raise UserError(f"{option}: {os.fspath(path)}: no such file")
