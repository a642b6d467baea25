"""Writing a suite of files (`bnbwd cases`): a directory that appears complete or not at all, and .npz
files whose bytes depend only on the arrays.

The archive and the .npy members are laid out here byte by byte (stored members, a fixed 1980-01-01
date, version-1.0 .npy headers padded to 64 bytes), not by zipfile or numpy.lib.format: their output
may change between Python or NumPy versions, and a suite's bytes must not (a committed hash tests it).
np.load and bnbwd's readers read these files as any .npz.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import reason

NPY_MAGIC = b"\x93NUMPY\x01\x00"
NPY_ALIGN = 64
DOS_DATE_1980_01_01 = (0 << 9) | (1 << 5) | 1  # (year - 1980) << 9 | month << 5 | day
DOS_TIME_MIDNIGHT = 0
ZIP_VERSION = 20  # 2.0: what a stored member needs
MADE_BY_UNIX = 3 << 8
FILE_MODE = 0o644 << 16  # external attributes: a regular file, rw-r--r--
ZIP32_LIMIT = 0xFFFFFFFF
ZIP_LOCAL_SIZE, ZIP_CENTRAL_SIZE, ZIP_END_SIZE = 30, 46, 22  # the fixed parts of the three records


def _descr(dtype: np.dtype) -> str:
    """The .npy descr of a little-endian array; bfloat16 as np.save stores it ('<V2': raw 2-byte void)."""
    if dtype.kind == "V" or dtype.name == "bfloat16":
        return "<V2"
    return np.dtype(dtype).newbyteorder("<").str


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy (format 1.0) header of a C-ordered, little-endian array, padded to 64 bytes as np.save pads it."""
    if dtype.kind not in "fUV" and dtype.name != "bfloat16":
        raise ValueError(f"npy_header: unsupported dtype {dtype}")
    header = f"{{'descr': '{_descr(dtype)}', 'fortran_order': False, 'shape': {tuple(int(n) for n in shape)!r}, }}"
    padding = -(len(NPY_MAGIC) + 2 + len(header) + 1) % NPY_ALIGN
    text = (header + " " * padding + "\n").encode("latin1")
    return NPY_MAGIC + struct.pack("<H", len(text)) + text


def npy_bytes(array: np.ndarray) -> bytes:
    """A C-ordered, little-endian .npy (format 1.0) of `array`."""
    array = np.asarray(array)
    descr = _descr(array.dtype)
    data = array if descr == "<V2" else array.astype(descr, copy=False)
    return npy_header(array.shape, array.dtype) + np.ascontiguousarray(data).tobytes()


def npz_size(members: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> int:
    """The size npz_bytes gives arrays of these (shape, dtype), known before any value is drawn."""
    size = ZIP_END_SIZE
    for key, (shape, dtype) in members.items():
        name = len(f"{key}.npy".encode())
        size += ZIP_LOCAL_SIZE + ZIP_CENTRAL_SIZE + 2 * name + len(npy_header(shape, dtype))
        size += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return size


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An .npz (a zip of stored NAME.npy members, in the order given) whose bytes depend only on the arrays."""
    parts: list[bytes] = []
    directory: list[bytes] = []
    offset = 0
    for key, array in arrays.items():
        name = f"{key}.npy".encode()
        data = npy_bytes(array)
        if offset + len(data) > ZIP32_LIMIT:
            raise BnbwdError(f"npz member {key}: the archive would pass 4 GiB; write a smaller case")
        crc = zlib.crc32(data)
        fields = (ZIP_VERSION, 0, 0, DOS_TIME_MIDNIGHT, DOS_DATE_1980_01_01, crc, len(data), len(data), len(name), 0)
        local = struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields) + name
        directory.append(struct.pack("<IH", 0x02014B50, MADE_BY_UNIX | ZIP_VERSION)
                         + struct.pack("<HHHHHIIIHH", *fields) + struct.pack("<HHHII", 0, 0, 0, FILE_MODE, offset)
                         + name)
        parts += [local, data]
        offset += len(local) + len(data)
    central = b"".join(directory)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(directory), len(directory), len(central), offset, 0)
    return b"".join([*parts, central, end])


def check_new_directory(target: Path) -> None:
    """Refuse, before any work, a target that exists and is not an empty directory, or has no parent."""
    if target.exists() or target.is_symlink():
        if not target.is_dir() or target.is_symlink():
            raise BnbwdError(f"output directory {target}: exists and is not a directory")
        if any(target.iterdir()):
            raise BnbwdError(f"output directory {target}: exists and is not empty; give a new or empty directory")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise BnbwdError(f"output directory {target}: its parent {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise BnbwdError(f"output directory {target}: its parent {parent} is not writable")


@contextlib.contextmanager
def new_directory(target: Path) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success its files appear in `target`, on any failure (Ctrl-C,
    SIGTERM and SIGHUP included) it is removed. An absent target is the temporary sibling renamed into place; an
    existing empty one is kept (its mode, a shell standing in it) and the files are renamed into it, the manifest
    last, with the signals held while they move."""
    check_new_directory(target)
    in_place = target.is_dir()
    home = target if in_place else target.absolute().parent
    try:
        temp = Path(tempfile.mkdtemp(prefix=f".{target.absolute().name[:200]}.", suffix=".tmp", dir=home))
    except OSError as exc:
        raise BnbwdError(f"output directory {target}: cannot create a directory in {home} ({reason(exc)})") from None
    try:
        yield temp
        if in_place:
            _move_into(temp, target)
        else:
            os.chmod(temp, 0o777 & ~_umask())  # mkdtemp makes it 0700: give it a new directory's mode
            os.rename(temp, target)  # fails if the target appeared meanwhile
    except BaseException as exc:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise BnbwdError(f"output directory {target}: write failed ({reason(exc)}); nothing was written") from None
        raise


def _move_into(temp: Path, target: Path) -> None:
    """temp's files renamed into target (same file system: each rename is atomic), the manifests last: a reader
    that sees a manifest sees every case. A name that appeared in target meanwhile is never replaced."""
    from bnbwd_cli.files.commit import signals_deferred

    names = sorted(os.listdir(temp), key=lambda name: (name.startswith("manifest."), name))
    moved = []
    with signals_deferred([target]):
        try:
            for name in names:
                _place(temp / name, target / name)
                moved.append(name)
        except OSError:
            for name in moved:
                with contextlib.suppress(OSError):
                    os.unlink(target / name)
            raise
    shutil.rmtree(temp, ignore_errors=True)


def _place(source: Path, destination: Path) -> None:
    """A hard link, which fails on an existing name (a rename would replace it); a rename where the file system
    has no hard links."""
    try:
        os.link(source, destination)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP) or destination.exists():
            raise
        os.rename(source, destination)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
