"""Write-through destinations: FIFOs, character devices and names of open descriptors (/dev/stdout), written to
directly and front to back, never replaced by a regular file."""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

COPY_CHUNK = 16 << 20  # write buffer of a write-through target, and the copy chunk of files/write.py


def is_descriptor_alias(path: Path) -> bool:
    """/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: a name for an open descriptor, whatever it points to
    (a pipe, a terminal, or the regular file the shell redirected it to). Replacing it would replace /dev's link."""
    parent = os.path.realpath(path.parent)
    return parent == "/dev" and path.name in ("stdout", "stderr") or (
        parent.startswith("/proc/") and parent.endswith("/fd"))


def is_stdout(target: str | Path) -> bool:
    """'-', or a descriptor alias (/dev/stdout, /dev/fd/1, /proc/self/fd/1, /dev/fd/N after `N>&1`) naming the
    open file that descriptor 1 is: whatever writes there lands in the same stream as the report on stdout."""
    text = str(target)
    if text == "-":
        return True
    if not text or not is_descriptor_alias(Path(text)):
        return False
    try:
        named, stdout = os.stat(text), os.fstat(1)
    except OSError:  # stdout closed, or the name's descriptor is: not the same stream
        return False
    return (named.st_dev, named.st_ino) == (stdout.st_dev, stdout.st_ino)


def is_write_through(path: Path) -> bool:
    """A FIFO, a character device (`/dev/null`) or a descriptor alias (`/dev/stdout`): written to directly, never
    replaced by a file."""
    if is_descriptor_alias(path):
        return True
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def is_terminal(path: Path) -> bool:
    """Whether a character device (or /dev/stdout's descriptor) is a terminal; a FIFO is never opened to ask (that
    would block, or fail, without a reader)."""
    try:
        if not stat.S_ISCHR(path.stat().st_mode):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


class ForwardOnly(io.RawIOBase):
    """A write-through target as a stream that cannot seek or tell. zipfile then writes the archive front to back
    (sizes after each member): /dev/null answers tell() with 0 after any write, which would corrupt a seeking writer,
    and a pipe cannot seek at all."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb", buffering=COPY_CHUNK)  # closed with this stream
        super().__init__()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # bytes-like
        return self._file.write(data)

    def tell(self) -> int:
        raise OSError(errno.ESPIPE, "a write-through target cannot tell its position")

    def flush(self) -> None:
        if not self.closed:
            self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()  # flushes first
            finally:
                if hasattr(self, "_file"):  # absent when open() failed in __init__
                    self._file.close()
