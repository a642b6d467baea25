"""Reading .safetensors through the safetensors package's NumPy API (an optional extra), header vetted first.

The header (an 8-byte little-endian length, then JSON) is checked before any tensor is read: its length
against the file, each tensor's dtype, shape and byte range against the data actually present, and the
total against available memory. Only then does `safe_open(..., framework="np")` load the wanted tensors
(ml_dtypes is imported, so BF16 comes back as ml_dtypes.bfloat16). The package maps the file; its size
is checked again after reading, so a file truncated meanwhile is an error, not silent garbage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import memory_cap, reason

MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
DTYPES = {  # names: bfloat16 needs ml_dtypes, loaded only when a bf16 tensor is read
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "bf16",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
    "BOOL": "?",
}
INSTALL_HINT = "pip install 'bnbwd[safetensors]' (or pip install safetensors)"


@dataclass(frozen=True)
class Entry:
    """One tensor as the header declares it (offsets relative to the data section)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int


def _parse_header(path: Path, what: str) -> tuple[dict, int]:
    """The JSON header as a dict, and the size of the data section after it."""
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            prefix = stream.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise BnbwdError(f"{what}: not a valid .safetensors file (header length {length} in a {size}-byte "
                                 "file)")
            import json  # here: a run without .safetensors inputs never loads it

            header = json.loads(stream.read(length))
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BnbwdError(f"{what}: not a valid .safetensors file ({reason(exc)})") from None
    if not isinstance(header, dict):
        raise BnbwdError(f"{what}: not a valid .safetensors file (the header is not a JSON object)")
    return header, size - 8 - length


def _entry(key: str, info: object, data_bytes: int, what: str) -> Entry:
    if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
        dtype = info.get("dtype") if isinstance(info, dict) else info
        raise BnbwdError(f"{what}: tensor {key!r} has dtype {dtype!r}, which bnbwd cannot read "
                         f"(readable: {', '.join(DTYPES)})")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise BnbwdError(f"{what}: tensor {key!r} has shape {shape!r}, expected a list of integers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
        raise BnbwdError(f"{what}: tensor {key!r} has data_offsets {offsets!r}, outside the {data_bytes} bytes of "
                         "data the file holds")
    dtype = dtype_from_name(DTYPES[info["dtype"]])
    needed = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != needed:
        raise BnbwdError(f"{what}: tensor {key!r} declares shape {tuple(shape)} {info['dtype']} ({needed} bytes) "
                         f"but {offsets[1] - offsets[0]} bytes of data")
    return Entry(dtype, tuple(shape), needed)


def read_header(path: Path, what: str) -> dict[str, Entry]:
    """Every tensor's vetted header entry, by key. Reads no tensor data."""
    header, data_bytes = _parse_header(path, what)
    return {key: _entry(key, info, data_bytes, what) for key, info in header.items() if key != "__metadata__"}


def _package():
    """The safetensors module (imported only when a .safetensors file is read: it is an optional extra)."""
    try:
        import safetensors
    except ImportError:
        raise BnbwdError(f"reading .safetensors needs the safetensors package, which is not installed: "
                         f"{INSTALL_HINT}") from None
    return safetensors


def read_safetensors(path: Path, what: str, *, check_keys: Callable[[list[str]], None] | None = None,
                     only: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Tensors of a .safetensors file by key (all, or those in `only`); `check_keys` sees the names first."""
    package = _package()
    entries = read_header(path, what)
    if check_keys is not None:
        check_keys(list(entries))
    wanted = [key for key in entries if only is None or key in set(only)]
    total = sum(entries[key].nbytes for key in wanted)
    if total > memory_cap():
        raise BnbwdError(f"{what}: its tensors declare {total} bytes, more than the memory available")
    size = path.stat().st_size
    try:
        with package.safe_open(str(path), framework="np") as handle:
            arrays = {key: handle.get_tensor(key) for key in wanted}
    except (package.SafetensorError, OSError, ValueError, TypeError) as exc:
        raise BnbwdError(f"{what}: cannot read ({reason(exc)})") from None
    if path.stat().st_size != size:
        raise BnbwdError(f"{what}: {path} changed size while it was read; nothing was written")
    for key, array in arrays.items():
        if array.dtype != entries[key].dtype or array.shape != entries[key].shape:
            raise BnbwdError(f"{what}: tensor {key!r} read as {array.shape} {array.dtype}, the header says "
                             f"{entries[key].shape} {entries[key].dtype}")
    return arrays


def read_safetensors_key(path: Path, key: str, what: str) -> np.ndarray:
    """One tensor of a .safetensors file (FILE.safetensors:key)."""
    def has_key(keys: list[str]) -> None:
        if key not in keys:
            raise BnbwdError(f"{what}: no tensor {key!r} in the file (it has: {', '.join(keys) or 'none'})")

    return read_safetensors(path, what, check_keys=has_key, only=[key])[key]
