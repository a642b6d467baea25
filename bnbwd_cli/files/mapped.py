"""Memory-mapped arrays (np.load(mmap_mode=...), np.memmap): finding their mappings, dropping their pages."""

from __future__ import annotations

import mmap

import numpy as np


def file_mappings(*arrays: np.ndarray | None) -> list[mmap.mmap]:
    """The mmap objects behind memory-mapped arrays (np.load(mmap_mode=...), np.memmap)."""
    found = []
    for array in arrays:
        while array is not None:
            mapping = getattr(array, "_mmap", None)
            if isinstance(mapping, mmap.mmap):
                found.append(mapping)
                break
            array = array.base if isinstance(array, np.ndarray) else None
    return found


def release(mappings: list[mmap.mmap]) -> None:
    """Unmap the resident pages of file mappings: they stay in the page cache, out of our RSS.

    Dirty pages of a shared (output) mapping are kept by the page cache and written back;
    a tile still in flight just faults its pages in again.
    """
    for mapping in mappings:
        try:
            mapping.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):
            pass
