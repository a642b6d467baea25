"""Channel sets in words: runs of consecutive channels as ranges (`c=0..7, 12`), not one `c=` item each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bnbwd_cli.judge.index_words import index_ranges


def channel_ranges(indices: Sequence[int] | np.ndarray, channels: int | None = None, limit: int = 6) -> str:
    """`c=32..63`, `c=0..7, 12`, `c=1, 5, 9 and 4 more runs`; "every channel" when all ``channels`` are named."""
    pieces = index_ranges(np.asarray(indices).reshape(-1))
    if channels is not None and pieces == ((0, channels - 1),):
        return "every channel"
    shown = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in pieces[:limit])
    more = f" and {len(pieces) - limit} more runs" if len(pieces) > limit else ""
    return f"c={shown}{more}"
