"""What every reader shares: the errors malformed bytes raise, short error reasons, the memory a read may use."""

from __future__ import annotations

import tokenize

# Errors numpy raises on malformed .npy bytes; anything else is a bug and keeps its traceback.
# (tokenize.TokenError: NumPy tokenizes some headers; TypeError/OverflowError: header values of the wrong
# type, e.g. a float in the shape tuple.) What zipfile, zlib and lzma raise on a corrupt .npz is added by
# files/npz.py (npz.zip_errors), which imports them only when an archive is read.
READ_ERRORS = (OSError, ValueError, EOFError, KeyError, SyntaxError, tokenize.TokenError, TypeError, OverflowError)


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
