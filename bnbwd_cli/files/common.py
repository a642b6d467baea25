"""What every reader shares: the errors malformed bytes raise, short error reasons, the memory a read may use."""

from __future__ import annotations

import lzma
import tokenize
import zipfile
import zlib

# Errors numpy and zipfile raise on malformed bytes; anything else is a bug and keeps its traceback.
# (tokenize.TokenError: NumPy tokenizes some headers; zlib/lzma errors: corrupt compressed .npz members;
# TypeError/OverflowError: header values of the wrong type, e.g. a float in the shape tuple.)
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, SyntaxError,
               tokenize.TokenError, zlib.error, lzma.LZMAError, TypeError, OverflowError)
# zipfile also raises RuntimeError (encrypted member) and NotImplementedError (unknown method or zip version).
ZIP_ERRORS = (*READ_ERRORS, RuntimeError, NotImplementedError)


def reason(exc: BaseException) -> str:
    """An exception as a short single-line reason."""
    text = " ".join(str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc).split())
    return (text or type(exc).__name__)[:200]


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


def memory_cap() -> int:
    """The most bytes one read may bring into memory: what is available (8 GiB when unknown)."""
    return available_memory() or (8 << 30)
