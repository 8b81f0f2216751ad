"""A user's `.npz` input read without trusting its headers (docs/formats.md#output-safety).

`np.load` allocates what an array's header claims before reading a byte of it: a rank-vector
sidecar whose header says (10^11, 4) int16 asks for 745 GiB, a samples file with a huge round
index for terabytes. Every member's header is read first (`numpy.lib.format`, the documented
.npy layout) and the file refused in one line when an array claims more than an input may hold,
holds Python objects (loading those could run code: they are refused, never loaded), or is not
an array at all.
"""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from treeopt.errors import UserError
from treeopt.fileio import MAX_INPUT_BYTES, atomic_path, check_input_file

_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _member_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> tuple[tuple[int, ...], np.dtype]:
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise UserError(f"{name}: '{info.filename}' is an .npy version {version}, not 1.0 or 2.0")
        shape, _, dtype = reader(fh, max_header_size=10_000)
    return shape, dtype


def read_npz(path: str | os.PathLike, what: str, max_bytes: int = MAX_INPUT_BYTES) -> dict[str, np.ndarray]:
    """Every array of the `.npz` file `path` by name (without `.npy`), after checking each
    header: UserError naming the file and the array when one claims more than `max_bytes`,
    holds Python objects, or the archive is damaged. `what` names the kind of file."""
    name = os.fspath(path)
    check_input_file(path, what)
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                shape, dtype = _member_header(zf, info, name)
                member = info.filename.removesuffix(".npy")
                if dtype.hasobject:
                    raise UserError(
                        f"{name}: '{member}' holds Python objects, which are never loaded (that could run code)"
                    )
                claimed = math.prod(shape) * dtype.itemsize
                if claimed > max_bytes:
                    raise UserError(
                        f"{name}: '{member}' claims shape {shape} of {dtype} ({claimed / 2**30:.3g} GiB), "
                        f"more than {what} may hold"
                    )
        with np.load(path, allow_pickle=False) as z:
            return {key: z[key] for key in z.files}
    except UserError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{name}: not a readable {what.split(' ', 1)[-1]} ({text[:160]})") from None


def write_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` as an .npz atomically: what ``np.savez_compressed`` writes, with a fixed
    member timestamp so that equal inputs give byte-identical files (numpy stamps the current
    time)."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o600 << 16
            with zf.open(info, "w", force_zip64=True) as fid:
                np.lib.format.write_array(fid, np.asarray(value), allow_pickle=False)
