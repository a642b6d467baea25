"""The NumPy core's tile budget and thread count: what the machine offers (never what the result is)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

DEFAULT_CACHE_BYTES = 1 << 20  # 1 MiB: a typical per-core L2 when the OS will not say
MIN_BLOCK_BYTES = 4 << 20  # tile budgets measured best on 8 and 32 MiB L3s: see default_block_bytes
MAX_BLOCK_BYTES = 8 << 20


@functools.lru_cache(maxsize=1)  # sysfs is read once a process (it cost ~0.9 ms a call)
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
    """Working-set budget of one tile (src, diff_dst, diff_src and scratch all count): half the thread's
    share of the last-level cache, but never under MIN_BLOCK_BYTES nor over MAX_BLOCK_BYTES.

    Re-measured after the lane sums became one call (ab_core, CPU time, 2 threads, 32 MiB L3): 8 MiB holds a
    whole f32 (64, ., 56, 56) channel plane with its float64 scratch, so both passes fuse (3 tensor passes
    of memory traffic, not 5): NCX f32 261 -> 193 ms, NXC 236 -> 211 ms against 4 MiB. Before that change:

    Small tiles cost per-call overhead (a tile is ~20 NumPy calls), big ones fall out of cache between the
    reduce and the write pass. Measured, f32 and f16 (64,128,56,56) both layouts, 2 threads (bench/ab_core.py,
    tables in bench/RESULTS.md): on a 32 MiB-L3 EPYC 4 MiB was best or tied in every cell (0.42-0.90x naive
    NumPy), 1-2 MiB up to 1.4x naive for f16, 16 MiB 0.6-0.7x; on an 8 MiB-L3 machine (issue 15) the old
    rule's 2 MiB was no faster than naive NumPy and 4-8 MiB were best. This rule gives 8 MiB and 4 MiB there.
    """
    sizes = cache_sizes()
    last_level = sizes[max(sizes)] if sizes else DEFAULT_CACHE_BYTES * 8
    shared = max(sizes, default=0) >= 3  # an L3 is shared by the cores; L1/L2 are per core
    share = last_level // max(threads, 1) if shared else last_level
    return int(min(max(share // 2, MIN_BLOCK_BYTES), MAX_BLOCK_BYTES))


def usable_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)
