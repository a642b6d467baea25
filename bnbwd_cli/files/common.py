"""What every reader shares: short error reasons and the memory a single read may use."""

from __future__ import annotations


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
