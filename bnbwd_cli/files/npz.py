""".npz archives: every wanted member's header and declared size vetted before anything is inflated.

Members the caller does not want are never inflated; a member declaring more than deflate can produce is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterator

import numpy as np

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import common
from bnbwd_cli.files.common import READ_ERRORS, reason
from bnbwd_cli.files.npy import NpyHeader, read_npy_header, read_npy_stream

if TYPE_CHECKING:
    import zipfile

# deflate cannot expand more than ~1032:1; a member that declares more lies about its size.
MAX_DEFLATE_RATIO = 1100


def zip_errors() -> tuple[type[BaseException], ...]:
    """What a corrupt archive raises: READ_ERRORS, zipfile's and the decompressors' errors, and RuntimeError
    (encrypted member) and NotImplementedError (unknown method or zip version).

    zipfile is imported here, by the first archive read, not with this module: it brings bz2, lzma and
    shutil, several ms of start-up that a run on .npy files never uses (tests/test_startup.py).
    """
    import lzma
    import zipfile
    import zlib

    return (*READ_ERRORS, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, RuntimeError,
            NotImplementedError)


def npz_keys(archive: zipfile.ZipFile) -> list[str]:
    return [name[: -len(".npy")] for name in archive.namelist() if name.endswith(".npy")]


@contextlib.contextmanager
def open_zip(source: BinaryIO | str | Path, what: str) -> Iterator[zipfile.ZipFile]:
    import zipfile  # see zip_errors

    try:
        archive = zipfile.ZipFile(source)
    except zip_errors() as exc:
        raise BnbwdError(f"{what}: not a valid .npz archive ({reason(exc)})") from None
    with archive:
        yield archive


def _vet_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> NpyHeader:
    """The member's .npy header, checked against its declared sizes before any data is inflated."""
    import zipfile  # already loaded by open_zip

    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
        raise BnbwdError(f"{what}: member declares {info.file_size} bytes from {info.compress_size} compressed, "
                         "more than deflate can produce; refusing to inflate it")
    try:
        with archive.open(info) as stream:
            header = read_npy_header(stream, info.file_size, what)
    except BnbwdError:
        raise
    except zip_errors() as exc:
        raise BnbwdError(f"{what}: cannot read {info.filename} ({reason(exc)})") from None
    return header


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> np.ndarray:
    try:
        with archive.open(info) as stream:
            return read_npy_stream(stream, info.file_size, what)
    except BnbwdError:
        raise
    except zip_errors() as exc:
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
        if total > common.memory_cap():
            raise BnbwdError(f"{what}: its arrays declare {total} bytes, more than the memory available")
        return {key: _read_member(archive, infos[key], f"{what}:{key}") for key in wanted}


def read_npz_key(archive_source: BinaryIO | str | Path, key: str, what: str) -> np.ndarray:
    with open_zip(archive_source, what) as archive:
        if f"{key}.npy" not in archive.namelist():
            keys = ", ".join(npz_keys(archive)) or "none"
            raise BnbwdError(f"{what}: no array {key!r} in the archive (it has: {keys})")
        info = archive.getinfo(f"{key}.npy")
        _vet_member(archive, info, what)
        return _read_member(archive, info, what)
