"""The NumPy core's tile budget and thread count: what the machine offers (never what the result is)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE_BYTES = 1 << 20  # 1 MiB: a typical per-core L2 when the OS will not say


def cache_sizes() -> dict[int, int]:
    """Data/unified cache size in bytes by level, from sysfs (Linux); empty elsewhere."""
    cache_dir = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = {}
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            sizes[level] = int(text.rstrip("KMG")) * scale
    return sizes


def default_block_bytes(threads: int) -> int:
    """Working-set budget of one tile (src, diff_dst, diff_src and scratch all count).

    Every thread's tile must stay in cache between the reduce and the write pass, so a
    thread gets half its share of the last-level cache (the other half absorbs the
    streaming inputs and outputs), at least 1 MiB and at most 16 MiB. Measured on a
    2-core EPYC (512 KiB L2 a core, 32 MiB L3), f32 (64,128,56,56): budgets of 4-8 MiB
    (one 0.8 MB channel plane a tile) beat 16 MiB; under ~1 MiB, per-call overhead wins.
    """
    sizes = cache_sizes()
    last_level = sizes[max(sizes)] if sizes else DEFAULT_CACHE_BYTES * 8
    shared = max(sizes, default=0) >= 3  # an L3 is shared by the cores; L1/L2 are per core
    share = last_level // (2 * max(threads, 1)) if shared else last_level // 2
    return int(min(max(share, DEFAULT_CACHE_BYTES), 16 << 20))


def usable_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)
