"""Stored (uncompressed) .npz members read from the archive's file straight into their arrays, a chunk at a time,
each chunk's CRC-32 computed while it is still in cache: one copy and one pass over the data (zipfile's member
stream copies every chunk twice and, asked for a whole member, CRC-checks it after it has left the cache).

The member's .npy header is vetted as for every read (files/npy.read_npy_header) before its array is allocated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.npy import READ_CHUNK, array_from_bytes, read_exactly, read_npy_header

if TYPE_CHECKING:
    import zipfile


def _data_start(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """Where a member's data start in the archive: after its local header, which must be the one the central
    directory names (as zipfile's open checks it)."""
    import zipfile

    stream = archive.fp
    stream.seek(info.header_offset)
    local = read_exactly(stream, 30)  # the local header's fixed part
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile("Bad magic number for file header")
    name_length, extra_length = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
    name = read_exactly(stream, name_length)
    if name.decode("utf-8" if info.flag_bits & 0x800 else "cp437") != info.orig_filename:
        raise zipfile.BadZipFile(f"File name in directory {info.orig_filename!r} and header {name!r} differ.")
    return info.header_offset + 30 + name_length + extra_length


def read_stored(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> np.ndarray:
    """A stored member read from the archive's file straight into its array, READ_CHUNK at a time, each chunk's
    CRC-32 computed while it is still in cache: one copy and one pass (zipfile's stream copies every chunk twice).
    Bytes after the array, if any, are CRC-checked too; a short member is truncated, a wrong CRC an error."""
    import zlib

    stream = archive.fp
    start = _data_start(archive, info)
    stream.seek(start)
    header = read_npy_header(stream, info.file_size, what)
    stream.seek(start)
    crc = zlib.crc32(read_exactly(stream, header.offset))
    data = np.empty(header.nbytes, np.uint8)
    crc, got = _read_checked(stream, memoryview(data), crc)
    rest = info.file_size - header.offset - header.nbytes  # bytes after the array (np.save writes none)
    spare = memoryview(np.empty(min(rest, READ_CHUNK), np.uint8))
    while got == header.nbytes and rest:
        crc, count = _read_checked(stream, spare[: min(rest, READ_CHUNK)], crc)
        if not count:
            break
        rest -= count
    if got != header.nbytes or rest:
        raise BnbwdError(f"{what}: cannot read {info.filename} (the archive ends inside the member: truncated)")
    if crc != info.CRC:
        raise BnbwdError(f"{what}: cannot read {info.filename} (Bad CRC-32 for file {info.filename!r})")
    return array_from_bytes(data, header, what)


def _read_checked(stream: BinaryIO, view: memoryview, crc: int) -> tuple[int, int]:
    """Fill `view` from `stream` READ_CHUNK at a time, the CRC-32 carried over each chunk as it arrives; the CRC and
    how many bytes arrived (fewer only at the end of the stream)."""
    import zlib

    got = 0
    while got < view.nbytes:
        count = stream.readinto(view[got : got + READ_CHUNK])
        if not count:
            break
        crc = zlib.crc32(view[got : got + count], crc)
        got += count
    return crc, got
