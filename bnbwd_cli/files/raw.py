"""Raw binary dumps (`tensor.tofile()`, `.bin` from a kernel): `raw:DTYPE:SHAPE:PATH`, e.g. `raw:f32:8x64x56x56:x.bin`.

The source names everything a headerless file cannot: the dtype (f16, bf16, f32, f64, int16, uint16, a short
name after a byte order such as '>f16' for big-endian half, or any NumPy name such as '>f4'), the shape (dimensions joined by 'x' or ','), then the path, last so
that it may hold ':' itself. The file's size must be exactly the shape's element count times the item size,
checked before any data is read; data is C-ordered (row-major), as `tofile()` and `torch`'s `numpy().tofile()` write it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name, is_bfloat16
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import cannot_read, clip, memory_cap, open_regular, reason, short_repr

PREFIX = "raw:"
SYNTAX = "raw:DTYPE:SHAPE:PATH, e.g. raw:f32:8x64x56x56:x.bin"
MAX_DIMENSIONS = 32  # NumPy's own limit is 64
MAX_BYTES = 1 << 62  # a shape whose byte count passes this (zeros as ones, as NumPy counts) is no file's
# Aliases of dtype_from_name's names; short names little-endian, as the dumps of every machine a kernel runs on.
SHORT_DTYPES = {"f16": "<f16", "f32": "<f32", "f64": "<f64", "i16": "<i2", "u16": "<u2"}


@dataclass(frozen=True)
class RawSource:
    """A parsed `raw:DTYPE:SHAPE:PATH`."""

    dtype: np.dtype
    shape: tuple[int, ...]
    path: Path

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def is_raw(source: str) -> bool:
    return source.startswith(PREFIX)


def _dtype(text: str, source: str) -> np.dtype:
    short = text.lower()  # the short names in any case (F16, BF16), NumPy's names as NumPy spells them
    name = SHORT_DTYPES.get(short, short) if short.lstrip("<>=|") in ("f16", "f32", "f64", "bf16", "i16", "u16") else text
    try:
        dtype = dtype_from_name(name)
    except TypeError:
        dtype = None
    if dtype is not None and is_bfloat16(dtype):
        return dtype
    if dtype is None or dtype.kind not in "fiu" or dtype.itemsize == 0:
        raise BnbwdError(f"{clip(source)}: dtype {short_repr(text)} is not a number type; expected f16, bf16, f32, f64, int16, "
                         f"uint16 or a NumPy name such as '>f4' ({SYNTAX})")
    if dtype.itemsize > 8:  # float128 / long double ('g'): no kernel's output, and no reader downstream takes it
        raise BnbwdError(f"{clip(source)}: dtype {short_repr(text)} is {dtype.name}, which bnbwd does not read; "
                         f"expected f16 (half), bf16, f32, f64, int16, uint16 ({SYNTAX})")
    return dtype


def parse_raw(source: str) -> RawSource:
    """`raw:DTYPE:SHAPE:PATH` -> RawSource; a malformed one is a one-line error naming the syntax."""
    parts = source[len(PREFIX):].split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise BnbwdError(f"{clip(source)}: expected {SYNTAX}")
    dtype_text, shape_text, path = parts
    dims = re.split(r"[x,]", shape_text.lower())
    if not all(re.fullmatch(r"\d+", dim) for dim in dims):
        raise BnbwdError(f"{clip(source)}: shape {short_repr(shape_text)} is not dimensions joined by 'x' "
                         f"({SYNTAX})")
    if len(dims) > MAX_DIMENSIONS:
        raise BnbwdError(f"{clip(source)}: shape has {len(dims)} dimensions, at most {MAX_DIMENSIONS} are read")
    # A dimension is at most 19 digits (int() of thousands of digits is slow, and beyond 4300 an error).
    digits = [dim.lstrip("0") or "0" for dim in dims]
    shape = tuple(int(dim) if len(dim) <= 19 else MAX_BYTES for dim in digits)
    dtype = _dtype(dtype_text, source)
    if any(dim >= MAX_BYTES for dim in shape) or math.prod(max(dim, 1) for dim in shape) * dtype.itemsize >= MAX_BYTES:
        raise BnbwdError(f"{clip(source)}: shape {short_repr(shape_text)} describes more bytes than any file "
                         "holds")
    return RawSource(dtype, shape, Path(path))


def read_raw(source: str, what: str) -> np.ndarray:
    """The array a raw source describes, its file size checked against shape * itemsize before reading."""
    raw = parse_raw(source)
    label = clip(source) if what == source else f"{clip(what)} ({clip(source)})"  # verify's sides are their names
    try:
        with open_regular(raw.path, label) as stream:
            size = os.fstat(stream.fileno()).st_size
            if size != raw.nbytes:
                raise BnbwdError(f"{label}: shape {raw.shape} {raw.dtype} needs {raw.nbytes} bytes, the file holds "
                                 f"{size}")
            if raw.nbytes > memory_cap():
                raise BnbwdError(f"{label}: {raw.nbytes} bytes, more than the memory available")
            data = stream.read(raw.nbytes)
    except OSError as exc:
        raise BnbwdError(f"{cannot_read(label, raw.path)} ({reason(exc)})") from None
    if len(data) != raw.nbytes:
        raise BnbwdError(f"{label}: the file ended after {len(data)} of {raw.nbytes} bytes (truncated while read)")
    array = np.frombuffer(data, dtype=raw.dtype).reshape(raw.shape)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
