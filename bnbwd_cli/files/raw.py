"""Raw binary dumps (`tensor.tofile()`, `.bin` from a kernel): `raw:DTYPE:SHAPE:PATH`, e.g. `raw:f32:8x64x56x56:x.bin`.

The source names everything a headerless file cannot: the dtype (f16, bf16, f32, f64, int16, uint16 or any
NumPy name such as '>f4' for big-endian), the shape (dimensions joined by 'x' or ','), then the path, last so
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

from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import memory_cap, reason

PREFIX = "raw:"
SYNTAX = "raw:DTYPE:SHAPE:PATH, e.g. raw:f32:8x64x56x56:x.bin"
# Names, not dtypes: bfloat16 needs ml_dtypes, loaded only when a raw bf16 dump is read.
SHORT_DTYPES = {"f16": "<f2", "bf16": "bf16", "f32": "<f4", "f64": "<f8", "i16": "<i2", "u16": "<u2"}


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
    if text.lower() in SHORT_DTYPES:
        return dtype_from_name(SHORT_DTYPES[text.lower()])
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "fiu" or dtype.itemsize == 0:
        raise BnbwdError(f"{source}: dtype {text!r} is not a number type; expected f16, bf16, f32, f64, int16, "
                         f"uint16 or a NumPy name such as '>f4' ({SYNTAX})")
    return dtype


def parse_raw(source: str) -> RawSource:
    """`raw:DTYPE:SHAPE:PATH` -> RawSource; a malformed one is a one-line error naming the syntax."""
    parts = source[len(PREFIX):].split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise BnbwdError(f"{source}: expected {SYNTAX}")
    dtype_text, shape_text, path = parts
    dims = re.split(r"[x,]", shape_text.lower())
    if not all(re.fullmatch(r"\d+", dim) for dim in dims):
        raise BnbwdError(f"{source}: shape {shape_text!r} is not dimensions joined by 'x' ({SYNTAX})")
    return RawSource(_dtype(dtype_text, source), tuple(int(dim) for dim in dims), Path(path))


def read_raw(source: str, what: str) -> np.ndarray:
    """The array a raw source describes, its file size checked against shape * itemsize before reading."""
    raw = parse_raw(source)
    label = f"{what} ({source})"
    try:
        with raw.path.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size != raw.nbytes:
                raise BnbwdError(f"{label}: shape {raw.shape} {raw.dtype} needs {raw.nbytes} bytes, the file holds "
                                 f"{size}")
            if raw.nbytes > memory_cap():
                raise BnbwdError(f"{label}: {raw.nbytes} bytes, more than the memory available")
            data = stream.read(raw.nbytes)
    except OSError as exc:
        raise BnbwdError(f"{label}: cannot read {raw.path} ({reason(exc)})") from None
    if len(data) != raw.nbytes:
        raise BnbwdError(f"{label}: the file ended after {len(data)} of {raw.nbytes} bytes (truncated while read)")
    array = np.frombuffer(data, dtype=raw.dtype).reshape(raw.shape)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
