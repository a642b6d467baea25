"""Reading and writing tensors: .npy, .npz, NAME.npz:key, stdin, directories; atomic writes.

Everything is loaded with allow_pickle=False. Headers are checked against the bytes
actually present before any data is read, so a hostile header (a huge shape in a
tiny file) fails fast instead of allocating. Raw 2-byte void arrays (`|V2`) are how
np.save stores ml_dtypes.bfloat16, so they are read back as bfloat16.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import math
import os
import sys
import tempfile
import tokenize
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

import ml_dtypes
import numpy as np
from numpy.lib import format as npy_format

from bnbwd_cli.errors import BnbwdError

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))
ZIP_MAGIC = b"PK\x03\x04"
# Errors numpy and zipfile raise on malformed bytes; anything else is a bug and keeps its traceback.
# (tokenize.TokenError: NumPy tokenizes some headers; zlib/lzma errors: corrupt compressed .npz members.)
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, SyntaxError,
               tokenize.TokenError, zlib.error, lzma.LZMAError)
# zipfile also raises RuntimeError (encrypted member) and NotImplementedError (unknown method or zip version).
ZIP_ERRORS = (*READ_ERRORS, RuntimeError)


def dtype_name(dtype: np.dtype) -> str:
    """Short, spec-style dtype name: f32, f16, bf16, f64, else numpy's own name."""
    short = {"float16": "f16", "float32": "f32", "float64": "f64", "bfloat16": "bf16"}
    return short.get(np.dtype(dtype).name, np.dtype(dtype).name)


def as_bfloat16_if_void(array: np.ndarray) -> np.ndarray:
    """np.save writes bfloat16 as raw |V2: view it back as bfloat16."""
    if array.dtype.kind == "V" and array.dtype.itemsize == 2 and array.dtype.names is None:
        return array.view(BFLOAT16)
    return array


def _read_npy_header(stream: BinaryIO, available_bytes: int | None, what: str) -> tuple[tuple, bool, np.dtype, int]:
    """Parse and vet a .npy header: (shape, fortran_order, dtype, data bytes). Reads no data."""
    try:
        with warnings.catch_warnings():  # NumPy warns (several lines) about Python-2-style headers; we vet them anyway
            warnings.simplefilter("ignore")
            version = npy_format.read_magic(stream)
            if version == (1, 0):
                shape, fortran_order, dtype = npy_format.read_array_header_1_0(stream)
            else:  # 2.0 and 3.0 share the 4-byte header length
                shape, fortran_order, dtype = npy_format.read_array_header_2_0(stream)
    except READ_ERRORS as exc:
        raise BnbwdError(f"{what}: not a valid .npy file ({_reason(exc)})") from None
    if dtype.hasobject:
        raise BnbwdError(f"{what}: holds Python objects (dtype {dtype}); refusing to unpickle")
    if dtype.names is not None:
        raise BnbwdError(f"{what}: has a structured dtype {dtype}, expected a plain float array")
    if any(dim < 0 for dim in shape):
        raise BnbwdError(f"{what}: header declares shape {tuple(shape)} with a negative dimension")
    needed = math.prod(shape) * dtype.itemsize  # Python ints: a hostile shape cannot wrap around to 0
    if available_bytes is not None:
        header_end = stream.tell()
        if needed > available_bytes - header_end:
            raise BnbwdError(
                f"{what}: header declares shape {tuple(shape)} {dtype} ({needed} bytes) "
                f"but the file holds {max(available_bytes - header_end, 0)} bytes of data"
            )
    return tuple(shape), fortran_order, dtype, needed


def _read_npy_stream(stream: BinaryIO, available_bytes: int | None, what: str) -> np.ndarray:
    """Read one .npy from `stream`, refusing headers that claim more data than exists."""
    shape, fortran_order, dtype, needed = _read_npy_header(stream, available_bytes, what)
    data = stream.read(needed)
    if len(data) != needed:
        raise BnbwdError(f"{what}: truncated: expected {needed} bytes of data, found {len(data)}")
    order = "F" if fortran_order else "C"
    try:
        array = np.frombuffer(data, dtype=dtype).reshape(shape, order=order)
    except ValueError as exc:  # e.g. a zero-size dtype such as V0
        raise BnbwdError(f"{what}: cannot use the data as shape {shape} {dtype} ({_reason(exc)})") from None
    return as_native(as_bfloat16_if_void(array))


def as_native(array: np.ndarray) -> np.ndarray:
    """Big-endian data is valid input: convert it once to native byte order."""
    if array.dtype.byteorder not in ("=", "|") and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _read_npz_member(archive: zipfile.ZipFile, key: str, what: str) -> np.ndarray:
    member = f"{key}.npy"
    try:
        info = archive.getinfo(member)
    except KeyError:
        keys = ", ".join(npz_keys(archive)) or "none"
        raise BnbwdError(f"{what}: no array {key!r} in the archive (it has: {keys})") from None
    try:
        with archive.open(info) as stream:
            return _read_npy_stream(stream, info.file_size, what)
    except ZIP_ERRORS as exc:
        raise BnbwdError(f"{what}: cannot read {member} ({_reason(exc)})") from None


def npz_keys(archive: zipfile.ZipFile) -> list[str]:
    return [name[: -len(".npy")] for name in archive.namelist() if name.endswith(".npy")]


@contextlib.contextmanager
def _open_zip(source: BinaryIO | str | Path, what: str) -> Iterator[zipfile.ZipFile]:
    try:
        archive = zipfile.ZipFile(source)
    except ZIP_ERRORS as exc:
        raise BnbwdError(f"{what}: not a valid .npz archive ({_reason(exc)})") from None
    with archive:
        yield archive


def read_npz(source: BinaryIO | str | Path, what: str) -> dict[str, np.ndarray]:
    """Every array of an .npz, by key."""
    with _open_zip(source, what) as archive:
        return {key: _read_npz_member(archive, key, f"{what}:{key}") for key in npz_keys(archive)}


def _read_npy_path(path: Path, what: str, mmap: bool) -> np.ndarray:
    """Read (or, with `mmap`, map read-only) one .npy file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            if not mmap:
                return _read_npy_stream(stream, size, what)
            _read_npy_header(stream, size, what)
        return as_native(as_bfloat16_if_void(np.load(path, mmap_mode="r", allow_pickle=False)))
    except READ_ERRORS as exc:
        raise BnbwdError(f"{what}: cannot read {path} ({_reason(exc)})") from None


def _stdin_bytes() -> bytes:
    if sys.stdin is None:  # the shell closed it: `bnbwd run ... --src - <&-`
        raise BnbwdError("stdin: '-' reads an array from standard input, but stdin is closed")
    stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else sys.stdin
    if hasattr(stream, "isatty") and stream.isatty():
        raise BnbwdError("stdin: '-' reads an array from standard input, but stdin is a terminal")
    try:
        return stream.read()
    except (OSError, ValueError) as exc:
        raise BnbwdError(f"stdin: cannot read ({_reason(exc)})") from None


def read_array(source: str, what: str, *, mmap: bool = False) -> np.ndarray:
    """One array from `FILE.npy`, `FILE.npz:key`, `FILE.npz` holding one array, or `-` (stdin).

    `what` names the input in error messages (e.g. "mean").
    """
    if source == "-":
        data = _stdin_bytes()
        if not data:
            raise BnbwdError(f"{what}: stdin is empty, expected a .npy (or one-array .npz)")
        if data.startswith(ZIP_MAGIC):
            return _only_array(read_npz(io.BytesIO(data), f"{what} (stdin)"), f"{what} (stdin)")
        return _read_npy_stream(io.BytesIO(data), len(data), f"{what} (stdin)")
    path_text, _, key = source.rpartition(":") if _has_npz_key(source) else (source, "", "")
    path = Path(path_text)
    label = f"{what} ({source})"
    if not path.exists():
        raise BnbwdError(f"{label}: no such file")
    if path.is_dir():
        raise BnbwdError(f"{label}: is a directory, expected a .npy or .npz file")
    if not path.is_file():  # a pipe such as bash's <(...): it can be read only once, so read it whole
        return _array_from_pipe(path, label, key)
    if key:
        with _open_zip(path, label) as archive:
            return _read_npz_member(archive, key, label)
    if _looks_like_zip(path):
        return _only_array(read_npz(path, label), label)
    return _read_npy_path(path, label, mmap)


def _array_from_pipe(path: Path, label: str, key: str) -> np.ndarray:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BnbwdError(f"{label}: cannot read ({_reason(exc)})") from None
    if not data:
        raise BnbwdError(f"{label}: is empty, expected a .npy or .npz")
    if key:
        with _open_zip(io.BytesIO(data), label) as archive:
            return _read_npz_member(archive, key, label)
    if data.startswith(ZIP_MAGIC):
        return _only_array(read_npz(io.BytesIO(data), label), label)
    return _read_npy_stream(io.BytesIO(data), len(data), label)


def _has_npz_key(source: str) -> bool:
    head, sep, key = source.rpartition(":")
    return bool(sep) and head.lower().endswith(".npz") and bool(key)


def _looks_like_zip(path: Path) -> bool:
    try:
        with path.open("rb") as stream:
            return stream.read(4) == ZIP_MAGIC
    except OSError as exc:
        raise BnbwdError(f"{path}: cannot read ({_reason(exc)})") from None


def _only_array(arrays: dict[str, np.ndarray], what: str) -> np.ndarray:
    if len(arrays) != 1:
        raise BnbwdError(f"{what}: the .npz holds {len(arrays)} arrays ({', '.join(arrays) or 'none'}); name one with FILE.npz:key")
    return next(iter(arrays.values()))


def read_bundle(source: str, what: str = "bundle") -> dict[str, np.ndarray]:
    """All arrays of an input bundle (.npz path or `-` for stdin)."""
    if source == "-":
        data = _stdin_bytes()
        if not data:
            raise BnbwdError(f"{what}: stdin is empty, expected an .npz bundle")
        return read_npz(io.BytesIO(data), f"{what} (stdin)")
    path = Path(source)
    if path.exists() and not path.is_dir() and not path.is_file():  # a pipe such as bash's <(...): read it once
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise BnbwdError(f"{what} ({source}): cannot read ({_reason(exc)})") from None
        return read_npz(io.BytesIO(data), f"{what} ({source})")
    if not path.is_file():
        raise BnbwdError(f"{what} ({source}): no such file" if not path.exists() else f"{what} ({source}): not a file")
    if not _looks_like_zip(path):
        raise BnbwdError(f"{what} ({source}): not an .npz archive")
    return read_npz(path, f"{what} ({source})")


def read_tensor_set(source: str) -> dict[str, np.ndarray]:
    """Arrays by key from a .npy (key = stem), an .npz (its keys) or a directory of .npy files (stems)."""
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise BnbwdError(f"{source}: directory holds no .npy files")
        return {file.stem: _read_npy_path(file, str(file), mmap=False) for file in files}
    if not path.exists():
        raise BnbwdError(f"{source}: no such file or directory")
    if _looks_like_zip(path):
        return read_npz(path, source)
    return {path.stem: _read_npy_path(path, source, mmap=False)}


# ---------------------------------------------------------------- writing


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _create_temp(path: Path) -> tuple[int, str]:
    """A new temp file beside `path` (same directory, so the final rename is atomic): (fd, name)."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise BnbwdError(f"output {path}: cannot create a file in {directory} ({_reason(exc)})") from None
    with contextlib.suppress(OSError):  # mkstemp makes it 0600; outputs get the usual umask-based mode
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
    return fd, temp_name


def _sync_and_close(stream: BinaryIO) -> None:
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()


def _sync_directory(directory: Path) -> None:
    """Make the renames durable; best effort (not every file system allows opening a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _discard(temp_names: list[str], path: Path, exc: BaseException) -> None:
    """Remove the temp files; an OSError (disk full, read-only, ...) becomes one user-facing line."""
    for name in temp_names:
        with contextlib.suppress(OSError):
            os.unlink(name)
    if isinstance(exc, OSError):
        raise BnbwdError(f"output {path}: write failed ({_reason(exc)}); nothing was written") from None


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A temp file beside `path`, fsynced and renamed over it on success, removed on any failure."""
    fd, temp_name = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            _sync_and_close(stream)
        os.replace(temp_name, path)
    except BaseException as exc:
        _discard([temp_name], path, exc)
        raise
    _sync_directory(path.parent)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write arrays to an .npz atomically (bfloat16 stored as np.save does: |V2)."""
    with atomic_file(path) as stream:
        np.savez(stream, **arrays)


def write_npy_dir(directory: Path, arrays: dict[str, np.ndarray]) -> list[Path]:
    """Write DIR/<key>.npy for every array: all are written and fsynced as temp files first, then renamed.

    A failure while writing (disk full, Ctrl-C) removes every temp file and leaves the directory as it was.
    """
    paths = [directory / f"{key}.npy" for key in arrays]
    temp_names: list[str] = []
    path = directory
    try:
        for path, array in zip(paths, arrays.values()):
            fd, temp_name = _create_temp(path)
            temp_names.append(temp_name)
            with os.fdopen(fd, "wb") as stream:
                np.save(stream, array, allow_pickle=False)
                _sync_and_close(stream)
        for temp_name, path in zip(temp_names, paths):
            os.replace(temp_name, path)
    except BaseException as exc:
        _discard(temp_names, path, exc)
        raise
    _sync_directory(directory)
    return paths
