"""File input and output shared by every package.

Output is atomic: a reader never sees a half-written file, and a failed or interrupted run
leaves nothing behind. Input files given by the user are read through `read_text_input` /
`read_json_input`, so that a missing, unreadable or malformed file is one `UserError` line with
the same wording whichever command reads it (docs/formats.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from treeopt.errors import UserError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, else delete it.

    For writers that want a filename (savefig, to_csv, torch.save).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    # mkstemp makes the file 0600; give the final file the usual umask-based permissions.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj, indent: int | None = 1) -> None:
    write_text(path, json.dumps(obj, indent=indent) + "\n")


def read_text_input(path: str | os.PathLike, what: str) -> str:
    """The text of a user's input file, UTF-8 (a leading byte-order mark, as spreadsheet
    exports write, is dropped). `what` names the kind of file with its article ("an accuracy
    file"); UserError naming the path when it is missing, a directory, unreadable or not UTF-8.
    """
    name = os.fspath(path)  # messages name the file as the user gave it
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{name}: is a directory, not {what}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{name}: no such file (expected {what})") from None
    except OSError as err:
        raise UserError(f"{name}: cannot read ({err.strerror or err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserError(f"{name}: not a UTF-8 text file (byte {err.start})") from None


def parse_json_input(text: str, source) -> object:
    """`text` parsed as JSON; UserError naming `source` and the line of the first error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{source}: not valid JSON (line {err.lineno}: {err.msg})") from None


def read_json_input(path: str | os.PathLike, what: str) -> object:
    """A user's JSON input file parsed (`read_text_input`, then `parse_json_input`)."""
    return parse_json_input(read_text_input(path, what), path)
