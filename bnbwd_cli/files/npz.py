""".npz archives: every wanted member's header and declared size vetted before anything is inflated.

Members the caller does not want are never inflated; a member declaring more than deflate can produce is refused.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterator

import numpy as np

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import common
from bnbwd_cli.files.common import READ_ERRORS, reason
from bnbwd_cli.files.npy import DECLARED_MIN_BYTES, Declared, NpyHeader, read_npy_header, read_npy_stream
from bnbwd_cli.files.stored import read_stored

if TYPE_CHECKING:
    import zipfile

# deflate cannot expand more than ~1032:1; a member that declares more lies about its size. bzip2 and lzma can, but
# np.savez never writes them: their members are held to the same bound (and inflated with a bounded output).
MAX_DEFLATE_RATIO = 1100
ZIP_METHODS = {0: "stored", 8: "deflate", 12: "bzip2", 14: "lzma"}  # what zipfile reads
SPOOL_MEMORY = 32 << 20  # an archive from a pipe is kept in memory up to this, then in a temp file
SPOOL_CHUNK = 1 << 20
MAX_CENTRAL_BYTES = 16 << 20  # what may follow the last member (the central directory) in a streamed archive


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


class LocalHeaders:
    """Follows a streamed archive's member headers as its bytes go past, so that garbage is refused at its first
    header, not after the whole stream was read: each member must start with a local header (PK\\3\\4) naming a
    method zipfile reads, unencrypted, and a stored .npy member must start with the .npy magic. A member whose sizes
    follow its data (bit 3, what zipfile writes to a pipe) cannot be skipped by size: from there on only the size cap
    applies. After the central directory starts, at most MAX_CENTRAL_BYTES may follow."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.pending = bytearray()  # bytes of the header being parsed
        self.skip = 0  # member data still to go past
        self.magic = bytearray()  # the first bytes of a stored .npy member's data
        self.magic_needed = 0
        self.offset = 0  # of the next byte not yet accounted for
        self.central: int | None = None  # bytes seen since the central directory started; None before
        self.following = True

    def feed(self, data: bytes) -> None:
        if self.central is not None:
            self.central += len(data)
            if self.central > MAX_CENTRAL_BYTES:
                raise BnbwdError(f"{self.what}: not a valid .npz archive (more than {MAX_CENTRAL_BYTES} bytes after its "
                                 "last member); not reading further")
            return
        position = 0
        while position < len(data) and self.following and self.central is None:
            if self.skip:
                taken = min(self.skip, len(data) - position)
                if len(self.magic) < self.magic_needed:
                    self.magic += data[position : position + min(taken, self.magic_needed - len(self.magic))]
                    if len(self.magic) == self.magic_needed:
                        self._check_npy_magic()
                self.skip -= taken
                self.offset += taken
                position += taken
                continue
            step = data[position : position + 4096]
            self.pending += step
            position += len(step)
            used = self._parse()
            if used is None:
                continue  # the header goes on in the next bytes
            position -= len(self.pending) - used  # bytes past the header: member data or the next header
            self.offset += used
            self.pending.clear()
        if self.central is not None:
            self.central = len(data) - position

    def _refuse(self, why: str) -> BnbwdError:
        return BnbwdError(f"{self.what}: not a valid .npz archive ({why} at byte {self.offset}); not reading further")

    def _check_npy_magic(self) -> None:
        from bnbwd_cli.files.sniff import NPY_MAGIC

        if not NPY_MAGIC.startswith(bytes(self.magic)):
            raise self._refuse("a stored .npy member that does not start with the .npy magic")

    def _parse(self) -> int | None:
        """Bytes of `pending` the header at its start takes (then the member data are skipped), or None for more."""
        head = bytes(self.pending)
        if len(head) < 4:
            return None
        if head[:4] in (b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06"):
            self.central = 0
            return 0
        if head[:4] != b"PK\x03\x04":
            raise self._refuse(f"{head[:4]!r} where a member header was expected")
        if len(head) < 30:
            return None
        flags, method = int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
        compressed = int.from_bytes(head[18:22], "little")
        name_length, extra_length = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
        if method not in ZIP_METHODS:
            raise self._refuse(f"a member compressed with method {method}, which zipfile does not read")
        if flags & 1:
            raise self._refuse("an encrypted member")
        if len(head) < 30 + name_length + extra_length:
            return None
        name = head[30 : 30 + name_length]
        if compressed == 0xFFFFFFFF:  # the real size is in the zip64 extra field
            compressed = _zip64_compressed_size(head[30 + name_length : 30 + name_length + extra_length], head)
        if flags & 8:  # sizes after the data: nothing to skip by
            self.following = False
            return 30 + name_length + extra_length
        self.skip = compressed
        self.magic.clear()
        self.magic_needed = min(6, compressed) if method == 0 and name.endswith(b".npy") else 0
        return 30 + name_length + extra_length


def _zip64_compressed_size(extra: bytes, head: bytes) -> int:
    """The compressed size from a local header's zip64 extra field (after the uncompressed size when that is
    0xFFFFFFFF too)."""
    position = 0
    while position + 4 <= len(extra):
        kind, size = int.from_bytes(extra[position : position + 2], "little"), int.from_bytes(extra[position + 2 : position + 4], "little")
        if kind == 1:
            fields = extra[position + 4 : position + 4 + size]
            index = 8 if int.from_bytes(head[22:26], "little") == 0xFFFFFFFF else 0
            if len(fields) >= index + 8:
                return int.from_bytes(fields[index : index + 8], "little")
        position += 4 + size
    return 0xFFFFFFFF


def spool_archive(stream: BinaryIO, what: str) -> BinaryIO:
    """A read-once archive (stdin, a pipe) copied into a seekable spool zipfile can read: memory up to SPOOL_MEMORY,
    then a temp file; read in chunks (never one allocation sized by the memory available), its member headers
    followed as they pass (LocalHeaders), the whole capped at the memory available."""
    import tempfile  # only for archives from pipes

    cap = common.memory_cap()
    headers = LocalHeaders(what)
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # returned, closed by its reader
    total = 0
    try:
        while chunk := stream.read(SPOOL_CHUNK):
            total += len(chunk)
            if total > cap:
                raise BnbwdError(f"{what}: more than {cap} bytes (the memory available); refusing to read further")
            headers.feed(chunk)
            spool.write(chunk)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool


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


MAX_LZMA_DICTIONARY = 64 << 20  # lzma's preset 9; a member declaring more would allocate it before any output


class BoundedInflate(io.RawIOBase):
    """A bzip2 or lzma member inflated with a bounded output: never more per read than asked, never more in all than
    the member declares, its CRC checked at the end. (zipfile inflates these without a bound: one 4 KiB read of a
    hostile bzip2 member can give hundreds of MB.)"""

    def __init__(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        import copy
        import zipfile

        raw_info = copy.copy(info)  # the compressed bytes as they are: zipfile reads them as a stored member
        raw_info.compress_type, raw_info.file_size, raw_info.CRC = zipfile.ZIP_STORED, info.compress_size, None
        self._raw = archive.open(raw_info)
        super().__init__()
        self._method, self._left, self._crc, self._expected_crc = info.compress_type, info.file_size, 0, info.CRC
        self._decompressor = None
        self._input = b""

    def readable(self) -> bool:
        return True

    def _start(self):  # a bz2 or lzma decompressor
        import bz2
        import lzma
        import zipfile

        if self._method == zipfile.ZIP_BZIP2:
            return bz2.BZ2Decompressor()
        head = self._raw.read(4)
        size = int.from_bytes(head[2:4], "little") if len(head) == 4 else 0
        properties = self._raw.read(size)
        if len(properties) != size or size < 5:
            raise EOFError("lzma member ends inside its properties")
        if int.from_bytes(properties[1:5], "little") > MAX_LZMA_DICTIONARY:
            raise ValueError(f"lzma member asks for a dictionary over {MAX_LZMA_DICTIONARY} bytes")
        filters = [lzma._decode_filter_properties(lzma.FILTER_LZMA1, properties)]  # as zipfile decodes them
        return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=filters)

    def readinto(self, buffer) -> int:  # io's signature
        import zlib

        view = memoryview(buffer).cast("B")
        if self._decompressor is None:
            self._decompressor = self._start()
        while self._left and view.nbytes:
            if self._decompressor.eof:
                raise EOFError("member data end before its declared size")
            if self._decompressor.needs_input and not self._input:
                self._input = self._raw.read(64 << 10)
                if not self._input:
                    raise EOFError("member data end before its declared size")
            out = self._decompressor.decompress(self._input, max_length=min(view.nbytes, self._left))
            self._input = b""  # what it did not use, it keeps (needs_input is False until it is used)
            if out:
                view[: len(out)] = out
                self._left -= len(out)
                self._crc = zlib.crc32(out, self._crc)
                if not self._left and self._crc != self._expected_crc:
                    raise ValueError("bad CRC-32 for the member")
                return len(out)
        return 0

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


def open_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo):  # a binary stream
    """A member's data as a stream whose output is bounded by what the caller reads (zipfile's own for stored and
    deflate members, which it bounds itself; BoundedInflate for bzip2 and lzma)."""
    import zipfile

    if info.compress_type in (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        return BoundedInflate(archive, info)
    return archive.open(info)


def _vet_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> NpyHeader:
    """The member's .npy header, checked against its declared sizes before any data is inflated."""
    import zipfile  # already loaded by open_zip

    method = ZIP_METHODS.get(info.compress_type, f"method {info.compress_type}")
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise BnbwdError(f"{what}: stored member declares {info.file_size} bytes but holds {info.compress_size} "
                         "(truncated, or its size is a lie)")
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
        raise BnbwdError(f"{what}: {method} member declares {info.file_size} bytes from {info.compress_size} "
                         f"compressed, more than deflate can produce (bnbwd holds every method to deflate's "
                         f"{MAX_DEFLATE_RATIO}:1); refusing to inflate it")
    try:
        with open_member(archive, info) as stream:
            header = read_npy_header(stream, info.file_size, what)
    except BnbwdError:
        raise
    except zip_errors() as exc:
        raise BnbwdError(f"{what}: cannot read {info.filename} ({reason(exc)})") from None
    return header


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> np.ndarray:
    import zipfile  # already loaded by open_zip

    try:
        if info.compress_type == zipfile.ZIP_STORED and hasattr(archive.fp, "readinto"):
            return read_stored(archive, info, what)
        with open_member(archive, info) as stream:
            return read_npy_stream(stream, info.file_size, what)
    except BnbwdError:
        raise
    except zip_errors() as exc:
        raise BnbwdError(f"{what}: cannot read {info.filename} ({reason(exc)})") from None


def read_npz(source: BinaryIO | str | Path, what: str, *, check_keys: Callable[[list[str]], None] | None = None,
             only: Iterable[str] | None = None, declared: bool = False) -> dict[str, np.ndarray | Declared]:
    """Arrays of an .npz by key. `check_keys` sees the key names before anything is inflated (and may raise);
    `only` limits the members read (the others are never inflated). Every wanted member's header and
    declared size are vetted, and their total checked against available memory, before any data is read.
    `declared`: members of DECLARED_MIN_BYTES or more come back as Declared stand-ins, read by their read()."""
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
        if declared and isinstance(source, (str, Path)):  # large members stay unread until the caller's checks pass
            return {key: Declared(headers[key].shape, headers[key].logical_dtype,
                                  functools.partial(read_npz_key, source, key, f"{what}:{key}"))
                    if headers[key].nbytes >= DECLARED_MIN_BYTES else _read_member(archive, infos[key], f"{what}:{key}")
                    for key in wanted}
        return {key: _read_member(archive, infos[key], f"{what}:{key}") for key in wanted}


def member_header(source: str | Path, key: str, what: str) -> NpyHeader | None:
    """The vetted .npy header of member `key` (None when there is none: the read says so)."""
    with open_zip(source, what) as archive:
        if f"{key}.npy" not in archive.namelist():
            return None
        return _vet_member(archive, archive.getinfo(f"{key}.npy"), what)


def vet_members(source: str | Path, what: str) -> list[str]:
    """The keys of an .npz whose every member's header and declared size pass the checks; nothing is inflated
    beyond the members' .npy headers."""
    with open_zip(source, what) as archive:
        keys = npz_keys(archive)
        for key in keys:
            _vet_member(archive, archive.getinfo(f"{key}.npy"), f"{what}:{key}")
        return keys


def read_npz_key(archive_source: BinaryIO | str | Path, key: str, what: str) -> np.ndarray:
    with open_zip(archive_source, what) as archive:
        if f"{key}.npy" not in archive.namelist():
            keys = ", ".join(npz_keys(archive)) or "none"
            raise BnbwdError(f"{what}: no array {key!r} in the archive (it has: {keys})")
        info = archive.getinfo(f"{key}.npy")
        _vet_member(archive, info, what)
        return _read_member(archive, info, what)
