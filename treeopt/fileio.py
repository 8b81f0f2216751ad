"""File input and output shared by every package.

Output is atomic: a reader never sees a half-written file, and a failed or interrupted run
leaves nothing behind. A command checks its outputs before any long work
(`refuse_overwriting_inputs`, `check_writable`), holds `output_lock` on each while it works,
and writes several outputs that belong together through `atomic_outputs` (docs/formats.md#output-safety). Input files
given by the user are read through `read_text_input` /
`read_json_input`, so that a missing, unreadable or malformed file is one `UserError` line with
the same wording whichever command reads it (docs/formats.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from treeopt.errors import UserError

#: the installed packages: their folders hold data every run reads (reference trees, engine
#: presets, the demo model and prompts), so no output is ever written inside them
PACKAGE_NAMES = ("treeopt", "calibration", "roofline")

#: the longest file name an output may have: its temporary ``.NAME.XXXXXXXX.tmp`` (`atomic_path`)
#: must fit the 255 bytes Linux and macOS allow a name (NAME_MAX)
MAX_NAME_BYTES = 255 - len("..XXXXXXXX.tmp")

#: errors of a write that mean the disk or the file system refused it, not a bug: one line
REFUSED_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.ENAMETOOLONG)


def package_folders() -> tuple[Path, ...]:
    """The folders of the installed packages, resolved (they are installed side by side)."""
    root = Path(__file__).resolve().parent.parent
    return tuple(root / name for name in PACKAGE_NAMES)


def _stat(path: Path, name: str) -> os.stat_result | None:
    """os.stat of `path`, None when it does not exist (yet)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:  # a name too long, a loop of links
        raise UserError(f"{name[:80]}: cannot be written ({err.strerror or err})") from None


def refuse_unsafe_output(out: str | os.PathLike, *, folder: bool = False) -> None:
    """UserError, one line naming `out`, when writing it would destroy something or cannot
    work (docs/formats.md#output-safety): it is inside an installed package, it exists and is
    not a regular file (a device such as /dev/full, a FIFO, a socket: the atomic rename would
    replace the node), a file name ends in a slash (`-o newdir/`), or the name is longer than
    a file system allows. `folder`: `out` is an output folder (a report), which may exist as
    a directory but must not hold a package either."""
    name = os.fspath(out)
    path = Path(out)
    if not folder and name.endswith(("/", os.sep)):
        raise UserError(f"{name}: names a folder (ends in /); give a file name to write")
    leaf = len(os.fsencode(path.name))
    if leaf > MAX_NAME_BYTES:
        raise UserError(f"{name[:60]}...: file name too long ({leaf} bytes; at most {MAX_NAME_BYTES})")
    found = _stat(path, name)
    if found is not None and folder and not stat.S_ISDIR(found.st_mode):
        raise UserError(f"{name}: is not a directory; give a folder to write the outputs in")
    if found is not None and not folder and not stat.S_ISREG(found.st_mode):
        kind = (
            "a directory; give a file name to write"
            if stat.S_ISDIR(found.st_mode)
            else ("not a regular file (a device, FIFO or socket), which writing would replace")
        )
        raise UserError(f"{name}: cannot write: is {kind}")
    real = Path(os.path.realpath(path))
    for package in package_folders():
        if real == package or package in real.parents:
            where = "is inside"
        elif folder and real in package.parents:  # the folder is replaced whole (`atomic_folder`)
            where = "holds"
        else:
            continue
        raise UserError(
            f"{name}: {where} the installed {package.name} package ({package}), whose files every "
            "run reads; write outputs elsewhere"
        )


def _refused_write(path: Path, err: BaseException) -> BaseException:
    """A disk that is full or read-only while writing `path` as one UserError line; any other
    error as it is."""
    if isinstance(err, OSError) and err.errno in REFUSED_WRITES:
        return UserError(f"{os.fspath(path)}: cannot write ({err.strerror or err}); nothing was written")
    return err


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, else delete it.

    For writers that want a filename (savefig, to_csv, torch.save). `path` must pass
    `refuse_unsafe_output`; a full disk is one UserError line.
    """
    path = Path(path)
    refuse_unsafe_output(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise _refused_write(path, err) from None
    os.close(fd)
    tmp = Path(tmp)
    # mkstemp makes the file 0600; give the final file the usual umask-based permissions.
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        refused = _refused_write(path, err)
        if refused is err:
            raise
        raise refused from None


def _umask() -> int:
    """The process's umask (reading it means setting it; it is set straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


#: the folder holding the treeopt, calibration and roofline packages (a checkout or site-packages)
_INSTALL_ROOT = Path(__file__).resolve().parent.parent


def portable_path(path: str | os.PathLike) -> str:
    """A path as outputs record it: relative to the working directory when under it, else to
    the installation when under it (the bundled demo: `calibration/demo_model/config.json`), else
    as given, so that a report committed from one machine does not carry that machine's folders."""
    resolved = Path(path).resolve()
    for root in (Path.cwd().resolve(), _INSTALL_ROOT):
        if resolved.is_relative_to(root):
            return resolved.relative_to(root).as_posix()
    return os.fspath(path)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def finite_json(obj):
    """`obj` with every float that is not finite (NaN, an infinity) replaced by None, so that
    it is valid JSON (RFC 8259 has no NaN; strict parsers refuse Python's `NaN` token). A value
    that can be missing carries its reason in a field beside it (docs/formats.md#strict-json)."""
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):  # numpy's float64 is a float too
        return None
    return obj


def dumps(obj, indent: int | None = None, **kwargs) -> str:
    """`json.dumps` of `finite_json(obj)` that refuses any non-finite number left: every JSON
    document the project writes or prints goes through here (or `json_rows`)."""
    return json.dumps(finite_json(obj), indent=indent, allow_nan=False, **kwargs)


def write_json(path: str | os.PathLike, obj, indent: int | None = 1) -> None:
    write_text(path, dumps(obj, indent=indent) + "\n")


def json_rows(obj, indent: int = 1) -> str:
    """JSON laid out as a table: objects and lists of rows one item per line, as
    `json.dumps(indent=...)` would, but a row (a list holding no object and nested at most two
    deep, such as `[3249, 1071, 293]` or `[[0, 2], 293]`) on one line. Parses to the same value
    as `json.dumps`; a 14,000-prefix joint table takes 14,000 lines instead of 100,000."""
    return _rows(finite_json(obj), indent, 0) + "\n"


def _depth(value) -> int:
    """Nesting depth of lists (a scalar 0); an object anywhere makes it a non-row (large)."""
    if isinstance(value, dict):
        return 1 << 30
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _rows(value, indent: int, level: int) -> str:
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(str(k))}: {_rows(v, indent, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and value and _depth(value) > 2:
        items = [f"{inner}{_rows(v, indent, level + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value, allow_nan=False)


def write_json_rows(path: str | os.PathLike, obj) -> None:
    """`write_json` for documents that are mostly tables (`json_rows`)."""
    write_text(path, json_rows(obj))


#: the largest input file read whole: 1 GiB (a ShareGPT dump is 0.7 GB); anything larger would
#: take many times its size in memory before a single check could fail
MAX_INPUT_BYTES = 1 << 30


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_input_file(path: str | os.PathLike, what: str, max_bytes: int = MAX_INPUT_BYTES) -> int:
    """The size of a user's input file, after checking it can be read whole without exhausting
    the machine: UserError naming the path when it is missing, a directory, not a regular file
    (a device such as /dev/zero or /dev/urandom never ends, a FIFO without a writer never
    opens), or larger than `max_bytes`. `what` names the kind of file with its article."""
    name = os.fspath(path)  # messages name the file as the user gave it
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{name}: no such file (expected {what})") from None
    except OSError as err:
        raise UserError(f"{name}: cannot read ({err.strerror or err})") from None
    if stat.S_ISDIR(found.st_mode):
        raise UserError(f"{name}: is a directory, not {what}")
    if not stat.S_ISREG(found.st_mode):
        raise UserError(f"{name}: is not a regular file (a device, FIFO or socket), not {what}")
    if found.st_size > max_bytes:
        raise UserError(
            f"{name}: {_size(found.st_size)}, more than {what} may be ({_size(max_bytes)}); give a smaller part of it"
        )
    return found.st_size


def read_text_input(path: str | os.PathLike, what: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of a user's input file, UTF-8 (a leading byte-order mark, as spreadsheet
    exports write, is dropped). `what` names the kind of file with its article ("an accuracy
    file"); UserError naming the path when it is missing, a directory, not a regular file,
    larger than `max_bytes` (`check_input_file`), unreadable or not UTF-8.
    """
    name = os.fspath(path)
    path = Path(path)
    check_input_file(path, what, max_bytes)
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


class DuplicateKey(ValueError):
    """A JSON object names one key twice: json.loads would keep the last value silently."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise DuplicateKey(key)
    return doc


def loads_strict(text: str) -> object:
    """json.loads that refuses an object naming a key twice (`DuplicateKey`): which of two
    values a reader keeps is not said by the JSON standard (RFC 8259, section 4)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def parse_json_input(text: str, source) -> object:
    """`text` parsed as JSON; UserError naming `source` and the line of the first error, or
    a key given twice in one object."""
    try:
        return loads_strict(text)
    except DuplicateKey as err:
        raise UserError(f"{source}: the key {str(err)[:60]!r} is given twice in one object") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{source}: not valid JSON (line {err.lineno}: {err.msg})") from None
    except RecursionError:
        raise UserError(f"{source}: JSON nested too deeply to read") from None
    except ValueError as err:
        if "integer string conversion" in str(err):  # Python's limit on int() of a long digit string
            raise UserError(
                f"{source}: not readable JSON (a number of more than {sys.get_int_max_str_digits()} digits)"
            ) from None
        raise UserError(f"{source}: not readable JSON ({str(err).splitlines()[0][:120]})") from None


def read_json_input(path: str | os.PathLike, what: str) -> object:
    """A user's JSON input file parsed (`read_text_input`, then `parse_json_input`)."""
    return parse_json_input(read_text_input(path, what), path)


# --------------------------------------------------------------------------------------------
# output safety (docs/formats.md#output-safety)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would resolve to
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_overwriting_inputs(outputs: Iterable, inputs: Iterable) -> None:
    """UserError (one line naming both) when an output is one of the inputs: the same file
    after resolving links, or, for an output that does not exist yet, the same resolved path.
    None entries are skipped, so optional inputs and outputs can be passed as they are."""
    ins = [Path(i) for i in inputs if i is not None]
    for out in outputs:
        if out is None:
            continue
        for inp in ins:
            if _same_file(Path(out), inp):
                raise UserError(
                    f"{os.fspath(out)}: is also an input ({os.fspath(inp)}); writing it "
                    "would destroy that input, choose another output file"
                )


def _probe_directory(directory: Path) -> str | None:
    """None when a file can be created in `directory`, else why not. Tries it for real: a
    read-only mount or a special file system refuses a write that os.access (as root) allows."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".treeopt-probe.")
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    os.unlink(probe)
    return None


def check_writable(outputs: Iterable) -> None:
    """Check every output location before any long work: the output is not a directory, and
    its folder exists and is writable, or can be created (its nearest existing ancestor is a
    writable directory). Creates nothing that stays. UserError, one line, naming the output."""
    for out in outputs:
        if out is None:
            continue
        name = os.fspath(out)
        path = Path(out)
        refuse_unsafe_output(out)
        ancestor = path.absolute().parent
        while not ancestor.exists() and not ancestor.is_symlink():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise UserError(f"{name}: cannot be written: {ancestor} is not a directory")
        problem = _probe_directory(ancestor)
        if problem:
            raise UserError(f"{name}: cannot be written in {ancestor} ({problem})")


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicOutputs:
    """The outputs collected by `atomic_outputs`: `path(final)` gives the temporary file to
    write in place of `final`."""

    def __init__(self):
        self._pending: list[tuple[Path, Path]] = []  # (temporary, final), in rename order

    def path(self, final: str | os.PathLike) -> Path:
        """A temporary path beside `final`, renamed onto it when the block ends without an
        exception. Outputs are renamed in the order their paths were asked for."""
        final = Path(final)
        refuse_unsafe_output(final)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
        except OSError as err:
            raise _refused_write(final, err) from None
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        self._pending.append((Path(tmp), final))
        return Path(tmp)

    def _discard(self) -> None:
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)

    def _commit(self) -> None:
        for tmp, _ in self._pending:
            _fsync_path(tmp)  # the data is on disk before any name points at it
        for tmp, final in self._pending:
            os.replace(tmp, final)
        for directory in {final.parent for _, final in self._pending}:
            _fsync_path(directory, directory=True)  # and the renames themselves


@contextlib.contextmanager
def atomic_outputs() -> Iterator[AtomicOutputs]:
    """Write several outputs together: all or none.

    Each ``outputs.path(final)`` is a temporary file beside `final`. When the block ends
    normally every temporary is flushed to disk (fsync), then renamed onto its final name in
    the order the paths were asked for, then the directories are synced. On an exception
    nothing is renamed and every temporary is removed.

    Limits: renaming N files is N atomic operations, not one. A crash between two renames
    leaves the first outputs new and the rest old. So ask for the path a reader checks last,
    last (e.g. the rank-vector sidecar before the accuracy table), and give outputs that
    belong together one shared fingerprint, which readers compare (docs/formats.md#output-safety).
    """
    outputs = AtomicOutputs()
    try:
        yield outputs
        outputs._commit()
    except BaseException as err:
        outputs._discard()
        finals = [final for _, final in outputs._pending]
        refused = _refused_write(finals[-1], err) if finals else err  # the main output: asked for last
        if refused is err:
            raise
        raise refused from None


def lock_path(output: str | os.PathLike) -> Path:
    """The lock file of `output`: ``.NAME.lock`` beside it."""
    output = Path(output)
    return output.with_name(f".{output.name}.lock")


def stale_temporaries(output: str | os.PathLike, *, whole_folder: bool = False) -> list[Path]:
    """The temporaries a killed writer of `output` left behind: ``.STEM.*.tmp`` and
    ``.STEM.*.old`` beside it (STEM: the name up to its first dot, so a sweep's CSV, metadata and
    samples are one family), or with `whole_folder` every ``.*.tmp``/``.*.old`` under its folder
    (a run folder belongs to its run). Only the holder of `output_lock(output)` may remove them:
    no other treeopt process is writing them then."""
    output = Path(output)
    stem = output.name.split(".", 1)[0]
    patterns = ("**/.*.tmp", "**/.*.old") if whole_folder else (f".{stem}.*.tmp", f".{stem}.*.old")
    if not output.parent.is_dir():
        return []
    return sorted({p for pattern in patterns for p in output.parent.glob(pattern)})


def _remove_stale(paths: Iterable[Path]) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


#: the lock files this process holds (resolved path -> times taken): a lock is re-entrant
#: within its process, so a command that locks its outputs up front (`treeopt.cli.safety`) runs
#: library code that locks them again
_HELD: dict[str, int] = {}


def _lock_owner(fd: int) -> str:
    return os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"


def _held_elsewhere(path: Path) -> str | None:
    """The pid (as written) of another process holding the lock file `path`, else None."""
    if not path.exists() or os.path.realpath(path) in _HELD:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _lock_owner(fd)
    finally:
        os.close(fd)  # closing releases a shared lock taken just to look
    return None


def refuse_inside_locked_folder(output: str | os.PathLike) -> None:
    """UserError when a folder holding `output` is being written by another treeopt process
    (`run -o R` locks R whole: `calibrate -o R/accuracy.json` beside it would break the run)."""
    path = Path(os.path.abspath(output))
    for folder in path.parents:
        owner = _held_elsewhere(lock_path(folder)) if folder != folder.parent else None
        if owner is not None:
            raise UserError(
                f"{os.fspath(output)}: is inside {folder}, which another treeopt process (pid {owner}) is writing"
            )


def _take_lock(path: Path, output) -> int:
    """An open descriptor of the lock file `path`, exclusively locked by this process."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise UserError(f"{os.fspath(output)}: cannot lock ({err.strerror or err})") from None
            try:
                owner = _lock_owner(fd)
            finally:
                os.close(fd)
            raise UserError(f"{os.fspath(output)}: is being written by another treeopt process (pid {owner})") from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and current.st_ino == os.fstat(fd).st_ino:
            return fd
        os.close(fd)  # the holder removed this file as we opened it: lock the new one


@contextlib.contextmanager
def output_lock(output: str | os.PathLike, *, whole_folder: bool = False) -> Iterator[Path]:
    """Hold an advisory exclusive lock on `output` for the block (fcntl.flock on
    `lock_path(output)`, which holds the owner's pid). A second treeopt process that asks for
    the same output, or for one inside a folder locked whole, fails at once: UserError "OUTPUT:
    is being written by another treeopt process (pid N)". Within one process the lock is
    re-entrant. The lock file is removed on release while still held, so it never
    outlives its writer; a process that opened it just before is told by the inode check
    and takes the new one. The lock dies with its process (SIGKILL included): the
    kernel releases a flock when the file is closed.

    Once locked, the temporaries of an earlier writer killed mid-write (SIGKILL skips every
    cleanup) are removed (`stale_temporaries`; `whole_folder` for a run folder), so a resumed
    run leaves the folder as a clean one would."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield path
        finally:
            _HELD[key] -= 1
        return
    refuse_inside_locked_folder(output)
    fd = _take_lock(path, output)
    _HELD[key] = 1
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _remove_stale(stale_temporaries(output, whole_folder=whole_folder))
        yield path
    finally:
        del _HELD[key]
        path.unlink(missing_ok=True)
        os.close(fd)


@contextlib.contextmanager
def atomic_folder(final: str | os.PathLike) -> Iterator[Path]:
    """Write a whole output folder (a report) all or nothing: the block writes into a temporary
    folder beside `final`, which replaces `final` when the block ends without an exception; on
    an exception it is removed and `final` is left as it was. Replacing an existing folder takes
    two renames (the old folder aside, the new one in), then the old one is deleted."""
    final = Path(final)
    refuse_unsafe_output(final, folder=True)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    except OSError as err:
        raise _refused_write(final, err) from None
    # mkdtemp makes the folder 0700; the report gets the permissions mkdir would give it (0755
    # under the usual umask), as `treeopt run`'s folder has
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        refused = _refused_write(final, err)
        if refused is err:
            raise
        raise refused from None
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
        os.rename(final, old / final.name)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
