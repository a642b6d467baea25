"""Reading tensors: .npy, .npz, NAME.npz:key, stdin, pipes and directories (out-of-core blocks: files/blocks.py);
.safetensors (files/safetensors_file.py) and raw dumps (files/raw.py) are dispatched from here, and PyTorch
pickles are refused by name and content (files/sniff.py).

Everything is loaded with allow_pickle=False, and bounds come before work: a header is checked
against the bytes actually present (file size, zip member size) before any data is read; an .npz
member's declared size and compression ratio are checked before it is inflated, and members the
caller does not want are never inflated; stdin must start with a .npy or zip magic and is read only
as far as its header declares. Nothing here is memory-mapped: data is read with explicit reads, so a
file truncated while it is read is a clean error, never SIGBUS (the safetensors package maps its files:
files/safetensors_file.py checks the size again after reading). Raw 2-byte void arrays (`|V2`) are
how np.save stores ml_dtypes.bfloat16, so they are read back as bfloat16.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import math
import os
import stat
import sys
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
from numpy.lib import format as npy_format

from bnbwd_cli import dtypes
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import raw, sniff
from bnbwd_cli.files.common import available_memory, memory_cap, reason  # noqa: F401 - re-exported
from bnbwd_cli.files.safetensors_file import read_safetensors, read_safetensors_key

ZIP_MAGIC = b"PK\x03\x04"
EMPTY_ZIP_MAGIC = b"PK\x05\x06"
NPY_MAGIC = b"\x93NUMPY"
# deflate cannot expand more than ~1032:1; a member that declares more lies about its size.
MAX_DEFLATE_RATIO = 1100
# Errors numpy and zipfile raise on malformed bytes; anything else is a bug and keeps its traceback.
# (tokenize.TokenError: NumPy tokenizes some headers; zlib/lzma errors: corrupt compressed .npz members;
# TypeError/OverflowError: header values of the wrong type, e.g. a float in the shape tuple.)
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, SyntaxError,
               tokenize.TokenError, zlib.error, lzma.LZMAError, TypeError, OverflowError)
# zipfile also raises RuntimeError (encrypted member) and NotImplementedError (unknown method or zip version).
ZIP_ERRORS = (*READ_ERRORS, RuntimeError, NotImplementedError)


def dtype_name(dtype: np.dtype) -> str:
    """Short, spec-style dtype name: f32, f16, bf16, f64, else numpy's own name (for messages)."""
    return dtypes.dtype_name(dtype) or np.dtype(dtype).name


# ---------------------------------------------------------------- sniffing


class Sniffed(io.RawIOBase):
    """A read-once stream (stdin, a pipe) whose first bytes can be looked at without consuming them."""

    def __init__(self, raw: BinaryIO, size: int = 8) -> None:
        super().__init__()
        self.raw = raw
        self.head = _read_exactly(raw, size)
        self._pending = self.head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - io's signature
        view = memoryview(buffer).cast("B")
        if self._pending:
            count = min(len(view), len(self._pending))
            view[:count] = self._pending[:count]
            self._pending = self._pending[count:]
            return count
        data = self.raw.read(len(view))
        view[: len(data)] = data
        return len(data)


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes (fewer only at the end of the stream)."""
    parts, got = [], 0
    while got < size:
        part = stream.read(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _read_capped(stream: BinaryIO, cap: int, what: str) -> bytes:
    """The whole stream, refusing one longer than `cap` bytes (an endless pipe fails, not memory)."""
    data = _read_exactly(stream, cap + 1)
    if len(data) > cap:
        raise BnbwdError(f"{what}: more than {cap} bytes (the memory available); refusing to read further")
    return data


# ---------------------------------------------------------------- .npy headers


@dataclass(frozen=True)
class NpyHeader:
    """A vetted .npy header: where the data starts and what it holds."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype  # as stored (byte order included)
    offset: int  # bytes from the start of the .npy to its data
    nbytes: int

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def logical_dtype(self) -> np.dtype:
        """The dtype arrays read from it get: native byte order, |V2 as bfloat16."""
        if self.dtype.kind == "V" and self.dtype.itemsize == 2 and self.dtype.names is None:
            return dtypes.BFLOAT16
        return self.dtype.newbyteorder("=") if self.dtype.byteorder not in ("=", "|") else self.dtype


def read_npy_header(stream: BinaryIO, available_bytes: int | None, what: str) -> NpyHeader:
    """Parse and vet a .npy header at the stream's position. Reads no data."""
    start = _tell(stream)
    try:
        with warnings.catch_warnings():  # NumPy warns (several lines) about Python-2-style headers; we vet them anyway
            warnings.simplefilter("ignore")
            version = npy_format.read_magic(stream)
            if version == (1, 0):
                shape, fortran_order, dtype = npy_format.read_array_header_1_0(stream)
            else:  # 2.0 and 3.0 share the 4-byte header length
                shape, fortran_order, dtype = npy_format.read_array_header_2_0(stream)
    except READ_ERRORS as exc:
        raise BnbwdError(f"{what}: not a valid .npy file ({reason(exc)})") from None
    if not isinstance(shape, tuple) or not all(type(dim) is int for dim in shape):
        raise BnbwdError(f"{what}: not a valid .npy file (shape {shape!r} is not a tuple of integers)")
    if dtype.hasobject:
        raise BnbwdError(f"{what}: holds Python objects (dtype {dtype}); refusing to unpickle")
    if dtype.names is not None:
        raise BnbwdError(f"{what}: has a structured dtype {dtype}, expected a plain float array")
    if dtype.itemsize == 0:
        raise BnbwdError(f"{what}: has a zero-size dtype {dtype}, expected a plain float array")
    if any(dim < 0 for dim in shape):
        raise BnbwdError(f"{what}: header declares shape {tuple(shape)} with a negative dimension")
    needed = math.prod(shape) * dtype.itemsize  # Python ints: a hostile shape cannot wrap around to 0
    offset = _tell(stream) - start if start is not None else 0
    if available_bytes is not None and needed > available_bytes - offset:
        raise BnbwdError(
            f"{what}: header declares shape {tuple(shape)} {dtype} ({needed} bytes) "
            f"but the file holds {max(available_bytes - offset, 0)} bytes of data"
        )
    return NpyHeader(tuple(shape), bool(fortran_order), dtype, offset, needed)


def _tell(stream: BinaryIO) -> int | None:
    try:
        return stream.tell()
    except (OSError, AttributeError, ValueError):
        return None


def _array_from_bytes(data: bytes | bytearray, header: NpyHeader, what: str) -> np.ndarray:
    try:
        array = np.frombuffer(data, dtype=header.dtype).reshape(header.shape, order="F" if header.fortran_order else "C")
    except ValueError as exc:
        raise BnbwdError(f"{what}: cannot use the data as shape {header.shape} {header.dtype} ({reason(exc)})") from None
    return as_native(as_bfloat16_if_void(array))


def read_npy_stream(stream: BinaryIO, available_bytes: int | None, what: str) -> np.ndarray:
    """One .npy from `stream`: the header is vetted, then exactly its declared data is read, no more."""
    header = read_npy_header(stream, available_bytes, what)
    if available_bytes is None and header.nbytes > memory_cap():
        raise BnbwdError(f"{what}: header declares shape {header.shape} {header.dtype} ({header.nbytes} bytes), "
                         "more than the memory available")
    data = _read_exactly(stream, header.nbytes)
    if len(data) != header.nbytes:
        raise BnbwdError(f"{what}: header declares shape {header.shape} {header.dtype} ({header.nbytes} bytes) "
                         f"but the data ends after {len(data)} bytes (truncated)")
    return _array_from_bytes(data, header, what)


def as_bfloat16_if_void(array: np.ndarray) -> np.ndarray:
    """np.save writes bfloat16 as raw |V2: view it back as bfloat16."""
    if array.dtype.kind == "V" and array.dtype.itemsize == 2 and array.dtype.names is None:
        return array.view(dtypes.BFLOAT16)
    return array


def as_native(array: np.ndarray) -> np.ndarray:
    """Big-endian data is valid input: convert it once to native byte order."""
    if array.dtype.byteorder not in ("=", "|") and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


# ---------------------------------------------------------------- .npz


def npz_keys(archive: zipfile.ZipFile) -> list[str]:
    return [name[: -len(".npy")] for name in archive.namelist() if name.endswith(".npy")]


@contextlib.contextmanager
def open_zip(source: BinaryIO | str | Path, what: str) -> Iterator[zipfile.ZipFile]:
    try:
        archive = zipfile.ZipFile(source)
    except ZIP_ERRORS as exc:
        raise BnbwdError(f"{what}: not a valid .npz archive ({reason(exc)})") from None
    with archive:
        yield archive


def _vet_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> NpyHeader:
    """The member's .npy header, checked against its declared sizes before any data is inflated."""
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
        raise BnbwdError(f"{what}: member declares {info.file_size} bytes from {info.compress_size} compressed, "
                         "more than deflate can produce; refusing to inflate it")
    try:
        with archive.open(info) as stream:
            header = read_npy_header(stream, info.file_size, what)
    except BnbwdError:
        raise
    except ZIP_ERRORS as exc:
        raise BnbwdError(f"{what}: cannot read {info.filename} ({reason(exc)})") from None
    return header


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> np.ndarray:
    try:
        with archive.open(info) as stream:
            return read_npy_stream(stream, info.file_size, what)
    except BnbwdError:
        raise
    except ZIP_ERRORS as exc:
        raise BnbwdError(f"{what}: cannot read {info.filename} ({reason(exc)})") from None


def read_npz(source: BinaryIO | str | Path, what: str, *, check_keys: Callable[[list[str]], None] | None = None,
             only: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Arrays of an .npz by key. `check_keys` sees the key names before anything is inflated (and may raise);
    `only` limits the members read (the others are never inflated). Every wanted member's header and
    declared size are vetted, and their total checked against available memory, before any data is read."""
    with open_zip(source, what) as archive:
        keys = npz_keys(archive)
        if check_keys is not None:
            check_keys(keys)
        wanted = [key for key in keys if only is None or key in set(only)]
        infos = {key: archive.getinfo(f"{key}.npy") for key in wanted}
        headers = {key: _vet_member(archive, infos[key], f"{what}:{key}") for key in wanted}
        total = sum(header.nbytes for header in headers.values())
        if total > memory_cap():
            raise BnbwdError(f"{what}: its arrays declare {total} bytes, more than the memory available")
        return {key: _read_member(archive, infos[key], f"{what}:{key}") for key in wanted}


def _read_npz_key(archive_source: BinaryIO | str | Path, key: str, what: str) -> np.ndarray:
    with open_zip(archive_source, what) as archive:
        if f"{key}.npy" not in archive.namelist():
            keys = ", ".join(npz_keys(archive)) or "none"
            raise BnbwdError(f"{what}: no array {key!r} in the archive (it has: {keys})")
        info = archive.getinfo(f"{key}.npy")
        _vet_member(archive, info, what)
        return _read_member(archive, info, what)


def _only_array(arrays: dict[str, np.ndarray], what: str) -> np.ndarray:
    if len(arrays) != 1:
        raise BnbwdError(f"{what}: the file holds {len(arrays)} arrays ({', '.join(arrays) or 'none'}); "
                         "name one with FILE.npz:key (or FILE.safetensors:key)")
    return next(iter(arrays.values()))


# ---------------------------------------------------------------- sources: files, pipes, stdin


def _stdin() -> BinaryIO:
    if sys.stdin is None:  # the shell closed it: `bnbwd run ... --src - <&-`
        raise BnbwdError("stdin: '-' reads an array from standard input, but stdin is closed")
    stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else sys.stdin
    if hasattr(stream, "isatty") and stream.isatty():
        raise BnbwdError("stdin: '-' reads an array from standard input, but stdin is a terminal")
    return stream


@contextlib.contextmanager
def _read_once(source: str, what: str, npz_only: bool = False) -> Iterator[Sniffed]:
    """stdin ('-') or a pipe path (bash's <(...)), sniffed: its first bytes must be a .npy or zip magic."""
    try:
        with contextlib.ExitStack() as stack:
            raw = _stdin() if source == "-" else stack.enter_context(open(source, "rb"))
            sniffed = Sniffed(raw)
            if not sniffed.head:
                if source == "-":
                    raise BnbwdError(f"{what.removesuffix(' (stdin)')}: stdin is empty, expected a .npy or .npz")
                raise BnbwdError(f"{what}: is empty, expected a .npy or .npz")
            if sniff.is_pickle_head(sniffed.head):
                raise sniff.refuse_pickle(what)
            if not (sniffed.head.startswith(NPY_MAGIC) or sniffed.head[:4] in (ZIP_MAGIC, EMPTY_ZIP_MAGIC)):
                raise BnbwdError(f"{what}: not a valid .npy or .npz (starts with {sniffed.head[:8]!r}, neither magic); "
                                 "not reading further")
            if npz_only and not _is_zip(sniffed.head):
                raise BnbwdError(f"{what}: not a valid .npz archive (it starts as a .npy); not reading further")
            yield sniffed
    except (OSError, ValueError) as exc:
        raise BnbwdError(f"{what}: cannot read ({reason(exc)})") from None


def _is_zip(head: bytes) -> bool:
    return head[:4] in (ZIP_MAGIC, EMPTY_ZIP_MAGIC)


def _read_once_arrays(source: str, what: str, npz_only: bool = False, **npz_options) -> dict[str, np.ndarray] | np.ndarray:
    """A read-once source: an ndarray for a .npy, a dict for an .npz (read whole, capped: zip needs seeking)."""
    with _read_once(source, what, npz_only) as sniffed:
        if _is_zip(sniffed.head):
            return read_npz(io.BytesIO(_read_capped(sniffed, memory_cap(), what)), what, **npz_options)
        return read_npy_stream(sniffed, None, what)


def is_pipe_like(path: Path) -> bool:
    """An existing path that is neither a regular file nor a directory (a FIFO, bash's <(...), a device)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def has_key(source: str) -> bool:
    """FILE.npz:key or FILE.safetensors:key."""
    head, sep, key = source.rpartition(":")
    return bool(sep) and head.lower().endswith(sniff.KEYED_SUFFIXES) and bool(key)


def split_source(source: str) -> tuple[str, str]:
    """`FILE.npz:key` (or .safetensors) -> (FILE.npz, key); `raw:DTYPE:SHAPE:PATH` -> (PATH, ""); else (source, "")."""
    if raw.is_raw(source):
        return str(raw.parse_raw(source).path), ""
    if has_key(source):
        path, _, key = source.rpartition(":")
        return path, key
    return source, ""


def _read_npy_path(path: Path, what: str) -> np.ndarray:
    try:
        with path.open("rb") as stream:
            return read_npy_stream(stream, os.fstat(stream.fileno()).st_size, what)
    except READ_ERRORS as exc:
        raise BnbwdError(f"{what}: cannot read {path} ({reason(exc)})") from None


def read_array(source: str, what: str) -> np.ndarray:
    """One array from `FILE.npy`, `FILE.npz:key`, `FILE.npz` holding one array, `FILE.safetensors[:key]`,
    `raw:DTYPE:SHAPE:PATH`, a pipe, or `-` (stdin).

    `what` names the input in error messages (e.g. "mean").
    """
    if raw.is_raw(source):
        return raw.read_raw(source, what)
    if source == "-":
        label = f"{what} (stdin)"
        result = _read_once_arrays("-", label)
        return result if isinstance(result, np.ndarray) else _only_array(result, label)
    path_text, key = split_source(source)
    path = Path(path_text)
    label = f"{what} ({source})"
    if not path.exists():
        raise BnbwdError(f"{label}: no such file")
    if path.is_dir():
        raise BnbwdError(f"{label}: is a directory, expected a .npy or .npz file")
    if is_pipe_like(path):  # read once, never seeked: sniffed, then read as far as its header says
        result = _read_once_arrays(path_text, label, only=[key] if key else None)
        if key and isinstance(result, dict) and key not in result:
            raise BnbwdError(f"{label}: no array {key!r} in the archive")
        if isinstance(result, np.ndarray):
            if key:
                raise BnbwdError(f"{label}: is a .npy, not an .npz holding {key!r}")
            return result
        return result[key] if key else _only_array(result, label)
    kind = sniff.file_kind(path, label)
    if kind == "safetensors":
        return read_safetensors_key(path, key, label) if key else _only_array(read_safetensors(path, label), label)
    if key:
        return _read_npz_key(path, key, label)
    if kind == "npz":
        return _only_array(read_npz(path, label), label)
    return _read_npy_path(path, label)


def read_bundle(source: str, what: str = "bundle", check_keys: Callable[[list[str]], None] | None = None,
                only: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an input bundle (.npz or .safetensors path, pipe or `-` for stdin); `check_keys` vets the names first,
    `only` limits the members read (as for read_npz)."""
    label = f"{what} (stdin)" if source == "-" else f"{what} ({source})"
    path = Path(source)
    if source == "-" or is_pipe_like(path):
        return _read_once_arrays(source, label, npz_only=True, check_keys=check_keys, only=only)
    if not path.is_file():
        raise BnbwdError(f"{label}: no such file" if not path.exists() else f"{label}: not a file")
    kind = sniff.file_kind(path, label)
    if kind == "safetensors":
        return read_safetensors(path, label, check_keys=check_keys, only=only)
    if kind != "npz":
        raise BnbwdError(f"{label}: not an .npz archive or a .safetensors file")
    return read_npz(path, label, check_keys=check_keys, only=only)


def read_tensor_set(source: str) -> dict[str, np.ndarray]:
    """Arrays by key from a .npy (key = stem), an .npz or .safetensors (its keys), a raw dump (key = stem),
    a directory of .npy files (stems) or a pipe."""
    if raw.is_raw(source):
        return {raw.parse_raw(source).path.stem: raw.read_raw(source, source)}
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise BnbwdError(f"{source}: directory holds no .npy files")
        return {file.stem: _read_npy_path(file, str(file)) for file in files}
    if not path.exists():
        raise BnbwdError(f"{source}: no such file or directory")
    if is_pipe_like(path):
        result = _read_once_arrays(source, source)
        return {path.stem: result} if isinstance(result, np.ndarray) else result
    kind = sniff.file_kind(path, source)
    if kind == "safetensors":
        return read_safetensors(path, source)
    if kind == "npz":
        return read_npz(path, source)
    return {path.stem: _read_npy_path(path, source)}
