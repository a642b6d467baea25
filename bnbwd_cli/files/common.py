"""What every reader shares: the errors malformed bytes raise, short error reasons and quoted values, opening only
regular files, the memory a read may use."""

from __future__ import annotations

import os
import stat
import tokenize
from pathlib import Path
from typing import BinaryIO

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.literal import clip

# Errors numpy raises on malformed .npy bytes; anything else is a bug and keeps its traceback.
# (tokenize.TokenError: NumPy tokenizes some headers; TypeError/OverflowError: header values of the wrong
# type, e.g. a float in the shape tuple.) What zipfile, zlib and lzma raise on a corrupt .npz is added by
# files/npz.py (npz.zip_errors), which imports them only when an archive is read.
READ_ERRORS = (OSError, ValueError, EOFError, KeyError, SyntaxError, tokenize.TokenError, TypeError, OverflowError)


def reason(exc: BaseException) -> str:
    """An exception as a short single-line reason."""
    text = " ".join(str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc).split())
    return (text or type(exc).__name__)[:200]


def cannot_read(what: str, path: str | os.PathLike) -> str:
    """"WHAT: cannot read PATH", the path left out where WHAT names it already ("src (x.npy)", or x.npy itself)."""
    shown = display(path)
    return f"{what}: cannot read" if shown in what else f"{what}: cannot read {shown}"


def display(path: str | os.PathLike) -> str:
    """A file name for a message: bytes that are not UTF-8 shown as Python escapes (out\\xff.npz), never a crash."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def short_repr(value: object, limit: int = 200) -> str:
    """repr(value) for an error line, at most `limit` characters (the middle elided): hostile values can be huge
    or nested thousands deep (reprlib stops at a few levels)."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = shortener.maxlong = limit
    try:
        text = shortener.repr(value)
    except ValueError:  # an int beyond Python's 4300-digit str limit
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return clip(text, limit)


def open_regular(path: Path, what: str) -> BinaryIO:
    """`path` opened for reading, refused unless it is a regular file. Opened without blocking, so a FIFO swapped in
    for a file (or listed in a directory) is an error, never a wait for a writer that never comes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BnbwdError(f"{what}: not a regular file (a FIFO, device or socket); not reading it")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), in bytes; None elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def address_space_left() -> int | None:
    """Bytes this process may still map under `ulimit -v` (RLIMIT_AS), or None without such a limit."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(limit - mapped, 0)
    except (ImportError, OSError, ValueError, IndexError):
        return None


def memory_cap() -> int:
    """The most bytes one read may bring into memory: what is available (8 GiB when unknown), and no more than
    `ulimit -v` leaves (an allocation past it fails as 'out of memory' instead of naming the input)."""
    limits = [value for value in (available_memory(), address_space_left()) if value is not None]
    return min(limits) if limits else 8 << 30
