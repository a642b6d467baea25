"""Channel sets in words: runs of consecutive channels as ranges (`c=0..7, 12`), not one `c=` item each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct indices as (first, last) runs of consecutive values."""
    values = sorted({int(i) for i in indices})
    out: list[tuple[int, int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def channel_ranges(indices: Sequence[int] | np.ndarray, channels: int | None = None, limit: int = 6) -> str:
    """`c=32..63`, `c=0..7, 12`, `c=1, 5, 9 and 4 more runs`; "every channel" when all ``channels`` are named."""
    pieces = runs(list(np.asarray(indices).reshape(-1)))
    if channels is not None and pieces == [(0, channels - 1)]:
        return "every channel"
    shown = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in pieces[:limit])
    more = f" and {len(pieces) - limit} more runs" if len(pieces) > limit else ""
    return f"c={shown}{more}"
