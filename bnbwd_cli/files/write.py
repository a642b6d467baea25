"""Writing outputs: every file bnbwd writes (npz, --out-dir npy set, the streamed diff_src, JSON) goes through here.

- Destinations are vetted before any work (files/destinations.py): not empty, not a directory (nor a name
  ending in '/'), in an existing writable directory, not the same file as any input.
- A regular destination is written to a temp file beside it (unique name, within NAME_MAX when the
  target's own name fits, the umask's mode) and renamed over it only when every file of the set is
  complete (`OutputSet`): all or nothing. Any failure, Ctrl-C and SIGTERM included, removes the temp files.
  Inside `one_commit()` (a whole `run`: its outputs and its --json report) the renames wait for the end of the
  block and happen together; Ctrl-C, SIGTERM and SIGHUP are held while they run (`signals_deferred`).
- A FIFO or character device (`-o /dev/stdout`, a named pipe) is written through, never replaced by a file.
- fsync is opt-in (`--fsync`): it protects only against power loss, and the outputs can be recomputed.
- Nothing is memory-mapped: the streamed diff_src is preallocated with posix_fallocate (a full disk fails
  there, cleanly) and written with pwrite.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import swap
from bnbwd_cli.files.blocks import CHUNK_BYTES, SPAN_MIN_BYTES, pread_into
from bnbwd_cli.files.commit import _PENDING_GROUPS, one_commit, signals_deferred  # noqa: F401 - one_commit: the API
from bnbwd_cli.files.common import display, reason
from bnbwd_cli.files.encode import save_npz, write_npy, write_npy_header
from bnbwd_cli.files.through import COPY_CHUNK, ForwardOnly, is_write_through

TEMP_SUFFIX = ".tmp"


# ---------------------------------------------------------------- temp files


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def temp_path(path: Path) -> Path:
    """A fresh name beside `path`: .NAME.XXXXXXXX.tmp, NAME shortened so the whole fits in NAME_MAX."""
    directory = path.parent
    tag = os.urandom(4).hex()  # what secrets.token_hex(4) does, without importing secrets (start-up time)
    room = _name_max(directory) - len(f"..{tag}{TEMP_SUFFIX}".encode())
    name = os.fsdecode(os.fsencode(path.name)[: max(room, 1)])  # bytes as the file system has them, UTF-8 or not
    return directory / f".{name}.{tag}{TEMP_SUFFIX}"


def create_temp(path: Path) -> tuple[int, Path]:
    """The one temp-file creator: a new file beside `path` (same directory, so the rename is atomic),
    created exclusively with mode 0666 & ~umask. Returns (fd, temp path)."""
    for _ in range(100):
        temp = temp_path(path)
        try:
            return os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), temp
        except FileExistsError:
            continue
        except OSError as exc:
            raise BnbwdError(f"output {display(path)}: cannot create a file in {display(path.parent)} "
                             f"({reason(exc)})") from None
    raise BnbwdError(f"output {display(path)}: cannot find a free temp name in {display(path.parent)}")


def _fsync_directory(directory: Path) -> None:
    """Make renames durable; best effort (not every file system allows opening a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class OutputSet:
    """Files that appear together or not at all.

    Each `new_file` is a temp file (or, for a FIFO/device, the target itself opened for writing);
    `commit` (on leaving the `with` block without an exception) optionally fsyncs, then renames them
    all; any exception removes every temp file. OSError becomes a one-line BnbwdError.
    """

    def __init__(self, *, fsync: bool = False) -> None:
        self.fsync = fsync
        self._entries: list[tuple[Path, Path | None, BinaryIO]] = []  # (target, temp or None, stream)

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        where = self._entries[-1][0] if self._entries else None
        if exc is None:
            try:
                self.commit()
            except BaseException as error:
                self.abort()
                self._raise(error, where)
            return
        self.abort()
        self._raise(exc, where)

    @staticmethod
    def _raise(exc: BaseException, where: Path | None) -> None:
        if isinstance(exc, OSError):
            name = f"output {display(where)}" if where is not None else "output"
            raise BnbwdError(f"{name}: write failed ({reason(exc)}); nothing was written") from None
        raise exc

    def new_file(self, path: Path) -> BinaryIO:
        """A binary stream whose bytes become `path` at commit."""
        if is_write_through(path):
            try:
                stream = ForwardOnly(path)
            except OSError as exc:
                raise BnbwdError(f"output {display(path)}: cannot open it for writing ({reason(exc)})") from None
            self._entries.append((path, None, stream))
            return stream
        fd, temp = create_temp(path)
        stream = os.fdopen(fd, "wb")  # a BufferedWriter: large writes go straight to the file (BufferedRandom copies them)
        self._entries.append((path, temp, stream))
        return stream

    def new_npy(self, path: Path, shape: tuple[int, ...], dtype: np.dtype) -> NpyBlockWriter:
        """A .npy of `shape`/`dtype` written by channel blocks (see NpyBlockWriter), committed with the set."""
        if is_write_through(path):
            raise BnbwdError(f"output {path}: --stream writes diff_src by blocks and needs a regular file, "
                             "not a FIFO or device")
        stream = self.new_file(path)
        return NpyBlockWriter(stream, shape, dtype, path)

    def commit(self) -> None:
        """Complete every file, then rename them all; inside `one_commit()` the renames wait for its end."""
        for _, temp, stream in self._entries:
            stream.flush()
            if self.fsync and temp is not None:
                os.fsync(stream.fileno())
        for _, _, stream in self._entries:
            stream.close()
        if _PENDING_GROUPS:
            _PENDING_GROUPS[-1].append(self)
            return
        with signals_deferred(target.parent for target, temp, _ in self._entries if temp is not None):
            self._rename()

    def _rename(self) -> None:
        directories = set()
        for target, temp, _ in self._entries:
            if temp is not None:
                swap.replace(temp, target)  # os.replace, or an exchange where ext4 would flush on it
                directories.add(target.parent)
        self._entries = [(t, None, s) for t, _, s in self._entries]  # committed: nothing left to remove
        if self.fsync:
            for directory in directories:
                _fsync_directory(directory)

    def abort(self) -> None:
        for _, temp, stream in self._entries:
            with contextlib.suppress(OSError, ValueError):
                stream.close()
            if temp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
        self._entries = []


# ---------------------------------------------------------------- .npy written by blocks (the --stream output)


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """bfloat16 is stored as np.save stores it (raw |V2), so the file round-trips."""
    return np.dtype("V2") if dtype.kind == "V" or dtype.name == "bfloat16" else np.dtype(dtype)


class NpyBlockWriter:
    """A C-ordered .npy in a file, preallocated (a full disk fails here, not later), filled by channel blocks."""

    def __init__(self, stream: BinaryIO, shape: tuple[int, ...], dtype: np.dtype, path: Path) -> None:
        self.stream, self.shape, self.dtype, self.path = stream, tuple(shape), np.dtype(dtype), path
        write_npy_header(stream, {"descr": npy_format.dtype_to_descr(stored_dtype(dtype)), "fortran_order": False,
                                  "shape": self.shape})
        stream.flush()
        self.offset = stream.tell()
        self.nbytes = int(np.prod(self.shape, dtype=object) or 0) * self.dtype.itemsize
        self.fd = stream.fileno()
        if self.nbytes:
            try:
                os.posix_fallocate(self.fd, self.offset, self.nbytes)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(self.fd, self.offset + self.nbytes)  # no preallocation here: writes report ENOSPC

    def write_channels(self, axis: int, c0: int, c1: int, block: np.ndarray) -> None:
        """Store `block` (the sub-array [..., c0:c1, ...] along `axis`, this file's dtype) with pwrite."""
        outer = int(np.prod(self.shape[:axis], dtype=object) or 1) if axis else 1
        channels = self.shape[axis]
        inner = int(np.prod(self.shape[axis + 1 :], dtype=object)) if axis + 1 < len(self.shape) else 1
        itemsize = self.dtype.itemsize
        data = np.ascontiguousarray(block).view(np.uint8).reshape(outer, (c1 - c0) * inner * itemsize)
        row = channels * inner * itemsize
        span = (c1 - c0) * inner * itemsize
        if span >= SPAN_MIN_BYTES or c1 - c0 == channels:
            for o in range(outer):
                self._pwrite(data[o], self.offset + o * row + c0 * inner * itemsize)
            return
        rows = max(CHUNK_BYTES // max(row, 1), 1)  # short runs: read-modify-write whole rows, in one reused buffer
        chunk = np.empty(min(rows, outer) * row, np.uint8)
        for o0 in range(0, outer, rows):
            o1 = min(o0 + rows, outer)
            current = chunk[: (o1 - o0) * row]
            if pread_into(self.fd, current, self.offset + o0 * row) != current.nbytes:
                raise OSError(errno.EIO, f"{self.path}: short read")
            rows_of = current.reshape(o1 - o0, channels, inner * itemsize)
            rows_of[:, c0:c1] = data[o0:o1].reshape(o1 - o0, c1 - c0, inner * itemsize)
            self._pwrite(current, self.offset + o0 * row)

    def _pwrite(self, data, offset: int) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            written = os.pwrite(self.fd, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, "short write")
            view, offset = view[written:], offset + written

    def read_all(self) -> np.ndarray:
        """The whole array back in memory (for --reference on a streamed run)."""
        data = np.empty(self.nbytes, np.uint8)
        if pread_into(self.fd, data, self.offset) != self.nbytes:
            raise OSError(errno.EIO, f"{self.path}: short read")
        return data.view(self.dtype).reshape(self.shape)


# ---------------------------------------------------------------- the writers


def write_npz(path: Path, arrays: dict[str, np.ndarray], *, fsync: bool = False) -> None:
    """Arrays as a stored .npz, as np.savez writes it (save_npz), all or nothing."""
    with OutputSet(fsync=fsync) as outputs:
        save_npz(outputs.new_file(path), arrays)


def write_npy_dir(directory: Path, arrays: dict[str, np.ndarray], *, fsync: bool = False,
                  outputs: OutputSet | None = None) -> list[Path]:
    """DIR/<key>.npy for every array, all or nothing (joining `outputs` when given: the caller commits)."""
    paths = [directory / f"{key}.npy" for key in arrays]
    with contextlib.ExitStack() as stack:
        target = outputs if outputs is not None else stack.enter_context(OutputSet(fsync=fsync))
        for path, array in zip(paths, arrays.values()):
            write_npy(target.new_file(path), np.asanyarray(array))  # np.save's bytes, without its copy of the data
    return paths


def write_npz_with_streamed(path: Path, arrays: dict[str, np.ndarray], streamed: dict[str, NpyBlockWriter], *,
                            fsync: bool = False) -> None:
    """An .npz (stored, zip64) of small arrays plus members copied from streamed .npy files, all or nothing."""
    import zipfile  # only here: a run writing .npy files never loads it (files/npz.py)

    with OutputSet(fsync=fsync) as outputs:
        with zipfile.ZipFile(outputs.new_file(path), "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, array in arrays.items():
                with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                    if key in streamed:
                        _copy_stream(streamed[key], member)
                    else:
                        write_npy(member, np.asanyarray(array))


def _copy_stream(writer: NpyBlockWriter, member: BinaryIO) -> None:
    position, end = 0, writer.offset + writer.nbytes
    while position < end:
        data = os.pread(writer.fd, min(COPY_CHUNK, end - position), position)
        if not data:
            raise OSError(errno.EIO, f"{writer.path}: short read")
        member.write(data)
        position += len(data)


class DiscardedSet(OutputSet):
    """Never commits: its files (the streamed diff_src before it goes into an .npz) are removed at the end, always."""

    def commit(self) -> None:
        self.abort()


def staging() -> DiscardedSet:
    return DiscardedSet()


def write_text(target: str, text: str, *, fsync: bool = False, what: str = "--json") -> None:
    """Text to a path (all or nothing, or written through for a FIFO/device), or to stdout for "-"."""
    if target == "-":  # a report: a closed or full stdout stays an OSError, and the verdict's exit code stands
        _write_to_stdout(text.encode())
        return
    try:
        with OutputSet(fsync=fsync) as outputs:
            outputs.new_file(Path(target)).write(text.encode())
    except BnbwdError as exc:
        raise BnbwdError(f"{what} {exc.message}") from None


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    save_npz(buffer, arrays)
    return buffer.getvalue()


def write_stdout(data: bytes) -> None:
    """Bytes to stdout; a closed reader stays BrokenPipeError (reported by the CLI), any other failure
    (a full device, a closed descriptor) is one line and exit 3."""
    try:
        _write_to_stdout(data)
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        raise BnbwdError(f"stdout: write failed ({reason(exc)})") from None


def _write_to_stdout(data: bytes) -> None:
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        raise OSError(errno.EBADF, "stdout is closed")
    stream = getattr(sys.stdout, "buffer", sys.stdout)
    stream.write(data)
    stream.flush()
