"""Reading .safetensors: the header vetted first, then each wanted tensor read with explicit reads (no memory map).

The format is an 8-byte little-endian header length, a JSON header (tensor name -> dtype, shape, data_offsets
relative to the data section), then the data, little-endian and C-ordered. Everything is checked before any
tensor is read: the header's length against the file and against MAX_HEADER_BYTES, how many JSON objects and
lists it holds (a header of a million empty tensors would take gigabytes once parsed), each tensor's dtype,
shape and byte range against the data actually present, and the total against available memory. The data is
then read with pread, never mapped: a file truncated while it is read is a clean error, never SIGBUS (the
safetensors package maps its files, so it is not used to read them). BF16 comes back as ml_dtypes.bfloat16.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import memory_cap, open_regular, reason, short_repr
from bnbwd_cli.files.npy import DECLARED_MIN_BYTES, Declared

# The format allows 100 MB of header; bnbwd reads headers up to 8 MiB holding at most MAX_JSON_ITEMS values (objects,
# lists and elements, counted by their brackets and commas before parsing; a tensor entry is about 8): tens of
# thousands of tensors, and a bounded parse whatever the file declares.
MAX_HEADER_BYTES = 8 << 20
MAX_JSON_ITEMS = 1 << 18
MAX_DIMENSIONS = 32  # NumPy's own limit is 64
MAX_BYTES = 1 << 62  # a shape whose size passes this (zeros counted as ones, as NumPy does) is no tensor a file holds
DTYPES = {  # names: bfloat16 needs ml_dtypes, loaded only when a bf16 tensor is read
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "bf16",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
    "BOOL": "?",
}


@dataclass(frozen=True)
class Entry:
    """One tensor as the header declares it (start: its offset in the file)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    start: int


def _parse_header(path: Path, what: str) -> tuple[dict, int, int]:
    """The JSON header as a dict, where the data section starts, and its size."""
    try:
        with open_regular(path, what) as stream:
            size = os.fstat(stream.fileno()).st_size
            prefix = stream.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < length <= size - 8:
                raise BnbwdError(f"{what}: not a valid .safetensors file (header length {length} in a {size}-byte "
                                 "file)")
            if length > MAX_HEADER_BYTES:
                raise BnbwdError(f"{what}: its header is {length} bytes, more than the {MAX_HEADER_BYTES} bnbwd reads; "
                                 "not reading further")
            text = stream.read(length)
        if text.count(b"{") + text.count(b"[") + text.count(b",") > MAX_JSON_ITEMS:
            raise BnbwdError(f"{what}: its header holds more than {MAX_JSON_ITEMS} JSON values (tens of thousands of "
                             "tensors); not reading further")
        import json  # here: a run without .safetensors inputs never loads it

        header = json.loads(text)
    except RecursionError:
        raise BnbwdError(f"{what}: not a valid .safetensors file (its header is nested too deeply)") from None
    except BnbwdError:  # a ValueError too: already says what is wrong
        raise
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BnbwdError(f"{what}: not a valid .safetensors file ({reason(exc)})") from None
    if not isinstance(header, dict):
        raise BnbwdError(f"{what}: not a valid .safetensors file (the header is not a JSON object)")
    return header, 8 + length, size - 8 - length


def _entry(key: str, info: object, data: tuple[int, int], what: str) -> Entry:
    data_start, data_bytes = data
    dtype_name = info.get("dtype") if isinstance(info, dict) else info
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise BnbwdError(f"{what}: tensor {short_repr(key)} has dtype {short_repr(dtype_name)}, which bnbwd cannot "
                         f"read (readable: {', '.join(DTYPES)})")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMENSIONS
            or not all(type(d) is int and 0 <= d < MAX_BYTES for d in shape)
            or math.prod(max(d, 1) for d in shape) >= MAX_BYTES):
        raise BnbwdError(f"{what}: tensor {short_repr(key)} has shape {short_repr(shape)}, expected a list of at most "
                         f"{MAX_DIMENSIONS} integers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
        raise BnbwdError(f"{what}: tensor {short_repr(key)} has data_offsets {short_repr(offsets)}, outside the "
                         f"{data_bytes} bytes of data the file holds")
    dtype = dtype_from_name(DTYPES[dtype_name])
    needed = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if offsets[1] - offsets[0] != needed:
        raise BnbwdError(f"{what}: tensor {short_repr(key)} declares shape {tuple(shape)} {dtype_name} ({needed} bytes) "
                         f"but {offsets[1] - offsets[0]} bytes of data")
    return Entry(dtype, tuple(shape), needed, data_start + offsets[0])


def read_header(path: Path, what: str) -> dict[str, Entry]:
    """Every tensor's vetted header entry, by key. Reads no tensor data."""
    header, data_start, data_bytes = _parse_header(path, what)
    return {key: _entry(key, info, (data_start, data_bytes), what) for key, info in header.items()
            if key != "__metadata__"}


def _read_entry(fd: int, entry: Entry, size: int, what: str) -> np.ndarray:
    from bnbwd_cli.files.blocks import pread_into

    buffer = np.empty(entry.nbytes, np.uint8)
    if pread_into(fd, buffer, entry.start) != entry.nbytes or os.fstat(fd).st_size != size:
        raise BnbwdError(f"{what}: the file changed size while it was read (was {size} bytes); nothing was written")
    array = buffer.view(entry.dtype).reshape(entry.shape)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def read_safetensors(path: Path, what: str, *, check_keys: Callable[[list[str]], None] | None = None,
                     only: Iterable[str] | None = None, declared: bool = False) -> dict[str, np.ndarray | Declared]:
    """Tensors of a .safetensors file by key (all, or those in `only`); `check_keys` sees the names first;
    `declared`: tensors of DECLARED_MIN_BYTES or more come back as Declared stand-ins (read by their read())."""
    entries = read_header(path, what)
    if check_keys is not None:
        check_keys(list(entries))
    wanted = [key for key in entries if only is None or key in set(only)]
    total = sum(entries[key].nbytes for key in wanted)
    if total > memory_cap():
        raise BnbwdError(f"{what}: its tensors declare {total} bytes, more than the memory available")
    if declared:
        big = [key for key in wanted if entries[key].nbytes >= DECLARED_MIN_BYTES]
        stand_ins = {key: Declared(entries[key].shape, entries[key].dtype,
                                   functools.partial(read_safetensors_key, path, key, what)) for key in big}
        small = read_safetensors(path, what, only=[key for key in wanted if key not in big])
        return {key: stand_ins[key] if key in stand_ins else small[key] for key in wanted}
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise BnbwdError(f"{what}: cannot read ({reason(exc)})") from None
    try:
        size = os.fstat(fd).st_size
        return {key: _read_entry(fd, entries[key], size, what) for key in wanted}
    except OSError as exc:
        raise BnbwdError(f"{what}: cannot read ({reason(exc)})") from None
    finally:
        os.close(fd)


def read_safetensors_key(path: Path, key: str, what: str) -> np.ndarray:
    """One tensor of a .safetensors file (FILE.safetensors:key)."""
    def has_key(keys: list[str]) -> None:
        if key not in keys:
            raise BnbwdError(f"{what}: no tensor {short_repr(key)} in the file (it has: {short_repr(', '.join(keys[:50]) or 'none')})")

    return read_safetensors(path, what, check_keys=has_key, only=[key])[key]
