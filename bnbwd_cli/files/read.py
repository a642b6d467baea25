"""Reading tensors: .npy, .npz, NAME.npz:key, stdin, pipes and directories (formats: files/npy.py, files/npz.py;
out-of-core blocks: files/blocks.py);
.safetensors (files/safetensors_file.py) and raw dumps (files/raw.py) are dispatched from here, and PyTorch
pickles are refused by name and content (files/sniff.py).

Everything is loaded with allow_pickle=False, and bounds come before work: a header is checked
against the bytes actually present (file size, zip member size) before any data is read; an .npz
member's declared size and compression ratio are checked before it is inflated, and members the
caller does not want are never inflated (verify and check get LazyArrays: members read on first use);
stdin must start with a .npy or zip magic: a .npy is read only as far as its header declares, an archive
is spooled (files/npz.spool_archive) with its member headers checked as they pass. Nothing here is memory-mapped: data is read with explicit reads, so a
file truncated while it is read is a clean error, never SIGBUS (.safetensors too: files/safetensors_file.py
reads the format itself rather than through the package, which maps its files). Raw 2-byte void arrays (`|V2`) are
how np.save stores ml_dtypes.bfloat16, so they are read back as bfloat16.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import raw, sniff
from bnbwd_cli.files.common import READ_ERRORS, cannot_read, open_regular, reason
from bnbwd_cli.files.npy import DECLARED_MIN_BYTES, Declared, read_exactly, read_npy_stream
from bnbwd_cli.files.npz import read_npz, read_npz_key, spool_archive
from bnbwd_cli.files.safetensors_file import read_safetensors, read_safetensors_key
from bnbwd_cli.files.sniff import has_key

# ---------------------------------------------------------------- sniffing


class Sniffed(io.RawIOBase):
    """A read-once stream (stdin, a pipe) whose first bytes can be looked at without consuming them."""

    def __init__(self, raw: BinaryIO, size: int = 8) -> None:
        super().__init__()
        self.raw = raw
        self.head = read_exactly(raw, size)
        self._pending = self.head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # io's signature
        view = memoryview(buffer).cast("B")
        if self._pending:
            count = min(len(view), len(self._pending))
            view[:count] = self._pending[:count]
            self._pending = self._pending[count:]
            return count
        data = self.raw.read(len(view))
        view[: len(data)] = data
        return len(data)


def _only_array(arrays: dict[str, np.ndarray], what: str) -> np.ndarray:
    if len(arrays) != 1:
        raise BnbwdError(f"{what}: the file holds {len(arrays)} arrays ({', '.join(arrays) or 'none'}); "
                         "name one with FILE.npz:key (or FILE.safetensors:key)")
    return next(iter(arrays.values()))


# ---------------------------------------------------------------- inputs known by their headers first

def _header_of(source: str, what: str) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of a file-backed source from its header alone; None when it cannot be had without reading
    the data (stdin, pipes, a whole .npz) or the header is bad (the read then says why)."""
    from bnbwd_cli.files.npy import read_npy_header

    label = f"{what} ({source})"
    try:
        if raw.is_raw(source):
            parsed = raw.parse_raw(source)
            return parsed.shape, parsed.dtype.newbyteorder("=")
        path_text, key = split_source(source)
        path = Path(path_text)
        if source == "-" or not path.is_file():
            return None
        kind = sniff.file_kind(path, label)
        if key and kind == "safetensors":
            from bnbwd_cli.files.safetensors_file import read_header

            entry = read_header(path, label).get(key)
            return (entry.shape, entry.dtype) if entry is not None else None
        if key and kind == "npz":
            from bnbwd_cli.files.npz import member_header

            header = member_header(path, key, label)
            return (header.shape, header.logical_dtype) if header is not None else None
        if kind == "npy" and not key:
            with open_regular(path, label) as stream:
                header = read_npy_header(stream, os.fstat(stream.fileno()).st_size, label)
            return header.shape, header.logical_dtype
    except BnbwdError:
        return None
    return None


def declared_array(source: str, what: str) -> Declared | np.ndarray:
    """read_array's result, as a Declared stand-in when its header alone tells shape and dtype and it is large."""
    header = _header_of(source, what)
    if header is None or math.prod(header[0]) * header[1].itemsize < DECLARED_MIN_BYTES:
        return read_array(source, what)
    return Declared(header[0], header[1], lambda: read_array(source, what))


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
            if not (sniffed.head.startswith(sniff.NPY_MAGIC) or sniffed.head[:4] in sniff.ZIP_MAGICS):
                raise BnbwdError(f"{what}: not a valid .npy or .npz (starts with {sniffed.head[:8]!r}, neither magic); "
                                 "not reading further")
            if npz_only and not _is_zip(sniffed.head):
                raise BnbwdError(f"{what}: not a valid .npz archive (it starts as a .npy); not reading further")
            yield sniffed
    except BnbwdError:
        raise  # names the input already: wrapped, it said the name twice
    except (OSError, ValueError) as exc:
        raise BnbwdError(f"{what}: cannot read ({reason(exc)})") from None


def _is_zip(head: bytes) -> bool:
    return head[:4] in sniff.ZIP_MAGICS


def _read_once_arrays(source: str, what: str, npz_only: bool = False, **npz_options) -> dict[str, np.ndarray] | np.ndarray:
    """A read-once source: an ndarray for a .npy, a dict for an .npz (read whole, capped: zip needs seeking)."""
    with _read_once(source, what, npz_only) as sniffed:
        if _is_zip(sniffed.head):
            with spool_archive(sniffed, what) as spool:
                return read_npz(spool, what, **npz_options)
        return read_npy_stream(sniffed, None, what)


def is_pipe_like(path: Path) -> bool:
    """An existing path that is neither a regular file nor a directory (a FIFO, bash's <(...), a device)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def split_source(source: str) -> tuple[str, str]:
    """`FILE.npz:key` (or .safetensors) -> (FILE.npz, key); `raw:DTYPE:SHAPE:PATH` -> (PATH, ""); else (source, "")."""
    if raw.is_raw(source):
        return str(raw.parse_raw(source).path), ""
    if has_key(source):
        path, _, key = source.rpartition(":")
        return path, key
    return source, ""


TENSOR_SUFFIXES = (".npy", ".npz", sniff.SAFETENSORS_SUFFIX)


def source_files(source: str) -> list[Path]:
    """The files an input argument may read, however it is named, so that no output replaces one: a path
    (also `FILE.npz:key` and `raw:DTYPE:SHAPE:PATH`), or a directory's tensor files (.npy, .npz, .safetensors).
    Outputs are compared with these by device and inode (files/write.py), so links to them count too."""
    if source == "-":
        return []
    path = Path(split_source(source)[0])
    if path.is_dir():
        try:
            return sorted(entry for entry in path.iterdir() if entry.suffix.lower() in TENSOR_SUFFIXES)
        except OSError:
            return [path]
    return [path]


def _read_npy_path(path: Path, what: str) -> np.ndarray:
    try:
        with open_regular(path, what) as stream:
            return read_npy_stream(stream, os.fstat(stream.fileno()).st_size, what)
    except BnbwdError:
        raise  # names the input already ("src (x.npy): not a valid .npy file"): wrapped, it named x.npy three times
    except READ_ERRORS as exc:
        raise BnbwdError(f"{cannot_read(what, path)} ({reason(exc)})") from None


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
        return read_npz_key(path, key, label)
    if kind == "npz":
        return _only_array(read_npz(path, label), label)
    return _read_npy_path(path, label)


def read_bundle(source: str, what: str = "bundle", check_keys: Callable[[list[str]], None] | None = None,
                only: Iterable[str] | None = None, declared: bool = False) -> dict[str, np.ndarray | Declared]:
    """The arrays of an input bundle (.npz or .safetensors path, pipe or `-` for stdin); `check_keys` vets the names first,
    `only` limits the members read, `declared` gives large members as Declared stand-ins (as for read_npz)."""
    label = f"{what} (stdin)" if source == "-" else f"{what} ({source})"
    path = Path(source)
    if source == "-" or is_pipe_like(path):
        return _read_once_arrays(source, label, npz_only=True, check_keys=check_keys, only=only)
    if not path.is_file():
        raise BnbwdError(f"{label}: no such file" if not path.exists() else f"{label}: not a file")
    kind = sniff.file_kind(path, label)
    if kind == "safetensors":
        return read_safetensors(path, label, check_keys=check_keys, only=only, declared=declared)
    if kind != "npz":
        raise BnbwdError(f"{label}: not an .npz archive or a .safetensors file")
    return read_npz(path, label, check_keys=check_keys, only=only, declared=declared)


class LazyArrays(MutableMapping):
    """Arrays by key whose names (and headers) are known up front and whose data are read on first access: a
    member nothing compares (a kernel's extra outputs, a bundle's inputs) is never inflated."""

    def __init__(self, keys: Iterable[str], load: Callable[[str], np.ndarray]) -> None:
        self._keys = list(dict.fromkeys(keys))
        self._load = load
        self._loaded: dict[str, np.ndarray] = {}

    def loaded_shape(self, key: str) -> tuple[int, ...] | None:
        """The shape of a member already read, else None (asking must not inflate it)."""
        return tuple(self._loaded[key].shape) if key in self._loaded else None

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._loaded:
            if key not in self._keys:
                raise KeyError(key)
            self._loaded[key] = self._load(key)
        return self._loaded[key]

    def __setitem__(self, key: str, array: np.ndarray) -> None:
        if key not in self._keys:
            self._keys.append(key)
        self._loaded[key] = array

    def __delitem__(self, key: str) -> None:
        self._keys.remove(key)
        self._loaded.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


def _npz_members(path: Path, source: str) -> LazyArrays:
    """An .npz's arrays, every member's header vetted now (declared sizes, compression ratio), data on access."""
    from bnbwd_cli.files.npz import vet_members

    keys = vet_members(path, source)
    return LazyArrays(keys, lambda key: read_npz_key(path, key, f"{source}:{key}"))


def _safetensors_members(path: Path, source: str) -> LazyArrays:
    from bnbwd_cli.files.safetensors_file import read_header

    keys = list(read_header(path, source))
    return LazyArrays(keys, lambda key: read_safetensors(path, source, only=[key])[key])


def _directory_members(path: Path, source: str) -> LazyArrays:
    """A directory's .npy files by stem; each must be a regular file (checked now, without opening any: a FIFO
    would block), read on access."""
    files = sorted(path.glob("*.npy"))
    if not files:
        raise BnbwdError(f"{source}: directory holds no .npy files")
    for file in files:
        try:
            regular = stat.S_ISREG(file.stat().st_mode)
        except OSError as exc:
            raise BnbwdError(f"{file}: cannot read ({reason(exc)})") from None
        if not regular:
            raise BnbwdError(f"{file}: not a regular file (a FIFO, device or socket); not reading it")
    by_stem = {file.stem: file for file in files}
    return LazyArrays(by_stem, lambda key: _read_npy_path(by_stem[key], str(by_stem[key])))


def read_tensor_set(source: str) -> MutableMapping[str, np.ndarray]:
    """Arrays by key from a .npy (key = stem), an .npz or .safetensors (its keys), a raw dump (key = stem),
    a directory of .npy files (stems) or a pipe. Files with several arrays are read lazily (LazyArrays)."""
    if raw.is_raw(source):
        return {raw.parse_raw(source).path.stem: raw.read_raw(source, source)}
    path = Path(source)
    if path.is_dir():
        return _directory_members(path, source)
    if not path.exists():
        raise BnbwdError(f"{source}: no such file or directory")
    if is_pipe_like(path):
        result = _read_once_arrays(source, source)
        return {path.stem: result} if isinstance(result, np.ndarray) else result
    kind = sniff.file_kind(path, source)
    if kind == "safetensors":
        return _safetensors_members(path, source)
    if kind == "npz":
        return _npz_members(path, source)
    return {path.stem: _read_npy_path(path, source)}


def known_shape(arrays: Mapping[str, np.ndarray], key: str) -> tuple[int, ...] | None:
    """An array's shape where knowing it reads nothing (a LazyArrays member not yet read: None)."""
    if isinstance(arrays, LazyArrays):
        return arrays.loaded_shape(key)
    return tuple(arrays[key].shape) if key in arrays else None
