""".npy data: vetted headers (bounds before work) and streams read exactly as far as their header declares.

Nothing is memory-mapped and nothing unpickled; raw 2-byte void (`|V2`, how np.save stores ml_dtypes.bfloat16)
is read back as bfloat16, big-endian data converted once to native order.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from bnbwd_cli import dtypes
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import common
from bnbwd_cli.files.common import READ_ERRORS, reason


def read_exactly(stream: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes (fewer only at the end of the stream)."""
    parts, got = [], 0
    while got < size:
        part = stream.read(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


# Reads ask for at most this much at a time: a zip member's stream (zipfile's) inflates and CRC-checks each read
# in a bytes object of the size asked, which then stays in cache for the copy into the array.
READ_CHUNK = 1 << 20


def read_exactly_into(stream: BinaryIO, size: int) -> tuple[np.ndarray, int]:
    """Up to `size` bytes read straight into a new uint8 array (no bytes object of the whole, no second copy of
    the data), READ_CHUNK at a time, and how many arrived (fewer only at the end of the stream)."""
    buffer = np.empty(size, np.uint8)
    view, got = memoryview(buffer), 0
    while got < size:
        count = stream.readinto(view[got : got + READ_CHUNK])
        if not count:
            break
        got += count
    return buffer, got


class _Shaped:
    """ndim and size from a `shape`, as an ndarray gives them: what the input checks read from a header too."""

    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class NpyHeader(_Shaped):
    """A vetted .npy header: where the data starts and what it holds."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype  # as stored (byte order included)
    offset: int  # bytes from the start of the .npy to its data
    nbytes: int

    @property
    def logical_dtype(self) -> np.dtype:
        """The dtype arrays read from it get: native byte order, |V2 as bfloat16."""
        if self.dtype.kind == "V" and self.dtype.itemsize == 2 and self.dtype.names is None:
            return dtypes.BFLOAT16
        return self.dtype.newbyteorder("=") if self.dtype.byteorder not in ("=", "|") else self.dtype


DECLARED_MIN_BYTES = 1 << 20  # smaller arrays are simply read


@dataclass(frozen=True)
class Declared(_Shaped):
    """An array known so far by its vetted header: shape and dtype as reading it will give them, so that the
    input checks (shapes, dtypes) run before any of its data is read; read() reads it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    load: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def view(self, dtype: np.dtype) -> Declared:
        """As ndarray.view for a dtype of the same item size (--bf16)."""
        return Declared(self.shape, np.dtype(dtype), lambda: self.load().view(dtype))

    def read(self) -> np.ndarray:
        return self.load()


def read_declared(arrays: dict, keep: tuple[str, ...] = ()) -> bool:
    """Every Declared value of `arrays` not named in `keep` replaced by its data, in place; whether any was read."""
    names = [name for name, value in arrays.items() if isinstance(value, Declared) and name not in keep]
    arrays.update({name: arrays[name].read() for name in names})
    return bool(names)


def read_npy_header(stream: BinaryIO, available_bytes: int | None, what: str) -> NpyHeader:
    """Parse and vet a .npy header at the stream's position. Reads no data."""
    start = _tell(stream)
    try:
        version = npy_format.read_magic(stream)
        header = _bounded_header(stream, version)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(header)
        else:  # 2.0 and 3.0 share the 4-byte header length
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(header)
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


# NumPy's own bound on a header it parses without allow_pickle (max_header_size): np.save never writes more.
HEADER_LIMIT = 10_000


def _bounded_header(stream: BinaryIO, version: tuple[int, int]) -> io.BytesIO:
    """The header's length field and text, its length bounded before they are read: a 2.0/3.0 header may declare
    up to 4 GiB, which NumPy reads into memory before its own check (a pipe of 500 MB peaked at 1 GB)."""
    width = 2 if version == (1, 0) else 4
    field = read_exactly(stream, width)
    if len(field) != width:
        raise EOFError("the header's length is cut short")
    length = int.from_bytes(field, "little")
    if length > HEADER_LIMIT:
        raise ValueError(f"its header declares {length} bytes; a .npy header holds at most {HEADER_LIMIT}")
    text = read_exactly(stream, length)
    if version <= (2, 0):
        text = _python3_header(text)
    return io.BytesIO(len(text).to_bytes(width, "little") + text)


def _python3_header(text: bytes) -> bytes:
    """A header written by Python 2 ('shape': (4L,)) with its long-integer suffixes dropped, as NumPy drops them
    itself, but without NumPy's warning: silencing it took warnings.catch_warnings, which is not thread-safe (the
    API reads files from several threads at once)."""
    import ast
    import tokenize

    decoded = text.decode("latin1")
    try:
        ast.literal_eval(decoded)
        return text
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        pass
    tokens, after_number = [], False
    try:
        for token in tokenize.generate_tokens(io.StringIO(decoded).readline):
            if not (after_number and token.type == tokenize.NAME and token.string == "L"):
                tokens.append((token.type, token.string))
            after_number = token.type == tokenize.NUMBER
    except (tokenize.TokenError, SyntaxError):
        return text  # NumPy says what is wrong with it
    return tokenize.untokenize(tokens).encode("latin1")


def _tell(stream: BinaryIO) -> int | None:
    try:
        return stream.tell()
    except (OSError, AttributeError, ValueError):
        return None


def array_from_bytes(data: bytes | bytearray | np.ndarray, header: NpyHeader, what: str) -> np.ndarray:
    try:
        array = np.frombuffer(data, dtype=header.dtype).reshape(header.shape, order="F" if header.fortran_order else "C")
    except ValueError as exc:
        raise BnbwdError(f"{what}: cannot use the data as shape {header.shape} {header.dtype} ({reason(exc)})") from None
    return as_native(as_bfloat16_if_void(array))


def read_npy_stream(stream: BinaryIO, available_bytes: int | None, what: str) -> np.ndarray:
    """One .npy from `stream`: the header is vetted, then exactly its declared data is read, no more."""
    header = read_npy_header(stream, available_bytes, what)
    if available_bytes is None and header.nbytes > common.memory_cap():
        raise BnbwdError(f"{what}: header declares shape {header.shape} {header.dtype} ({header.nbytes} bytes), "
                         "more than the memory available")
    data, got = read_exactly_into(stream, header.nbytes)
    if got != header.nbytes:
        raise BnbwdError(f"{what}: header declares shape {header.shape} {header.dtype} ({header.nbytes} bytes) "
                         f"but the data ends after {got} bytes (truncated)")
    return array_from_bytes(data, header, what)


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
