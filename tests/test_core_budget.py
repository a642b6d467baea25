"""The NumPy core's default tile budget: the rule measured on three cache sizes (runtime.py)."""

from __future__ import annotations

import pytest

from bnbwd_cli import runtime

MIB = 1 << 20


@pytest.mark.parametrize("caches,threads,expected", [
    ({1: 32 << 10, 2: 512 << 10, 3: 32 * MIB}, 2, 8 * MIB),  # the bench machine: 8 MiB measured best (fused planes)
    ({1: 32 << 10, 2: 512 << 10, 3: 8 * MIB}, 2, 4 * MIB),  # an 8 MiB L3: 4 MiB, not the 2 MiB that ran no faster than naive NumPy
    ({1: 48 << 10, 2: 2 * MIB, 3: 480 * MIB}, 2, 32 * MIB),  # a 480 MiB L3: 32 MiB measured best there, the cap
    ({1: 32 << 10, 2: 1 * MIB, 3: 64 * MIB}, 1, 32 * MIB),  # half of one thread's 64 MiB
    ({1: 32 << 10, 2: 1 * MIB, 3: 1024 * MIB}, 1, 32 * MIB),  # a bigger cache a thread: capped
    ({1: 32 << 10, 2: 1 * MIB, 3: 256 * MIB}, 64, 4 * MIB),  # many threads: never under the floor
    ({}, 2, 4 * MIB),  # the OS does not say
])
def test_default_block_bytes(monkeypatch, caches, threads, expected):
    monkeypatch.setattr(runtime, "cache_sizes", lambda: caches)
    assert runtime.default_block_bytes(threads) == expected
