"""Index sets in words: runs of consecutive indices as ranges (`0..7, 12`), an arithmetic progression as one
(`3, 7, ..., 63 (every 4th)`), and how many ranges a set takes (what `where` counts as a description's cost)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_RANGES = 6  # index ranges listed before "and N more"


def distinct(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """The sorted distinct values, as np.unique gives them (integers: no NaN to place). Not np.unique itself: from
    NumPy 2.3 its plain form imports numpy.ma for a masked-array check, ~10 ms of a fresh process's CPU that a
    failing run's `where` and diagnosis would pay for nothing."""
    v = np.sort(np.asarray(values).reshape(-1))
    return v[np.concatenate([[True], v[1:] != v[:-1]])] if v.size else v


def index_ranges(values: Sequence[int] | np.ndarray) -> tuple[tuple[int, int], ...]:
    """Sorted distinct indices as inclusive runs: [0, 1, 2, 7] -> ((0, 2), (7, 7))."""
    v = distinct(np.asarray(values, dtype=np.int64))
    if not v.size:
        return ()
    breaks = np.flatnonzero(np.diff(v) != 1)
    starts = np.concatenate([[0], breaks + 1])
    stops = np.concatenate([breaks, [v.size - 1]])
    return tuple((int(v[a]), int(v[b])) for a, b in zip(starts, stops))


def progression(values: np.ndarray) -> int | None:
    """The step of an arithmetic progression of at least 3 values with step > 1, else None."""
    if values.size < 3:
        return None
    steps = np.diff(values)
    return int(steps[0]) if steps[0] > 1 and (steps == steps[0]).all() else None


def ranges_text(ranges: Sequence[tuple[int, int]], limit: int = MAX_RANGES) -> str:
    """((0, 7), (12, 12)) -> "0..7, 12"; past ``limit`` ranges, "and N more"."""
    shown = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in ranges[:limit])
    return shown + (f" and {len(ranges) - limit} more" if len(ranges) > limit else "")


def indices_text(values: Sequence[int] | np.ndarray, limit: int = MAX_RANGES) -> str:
    """Indices in as few words as they take: "0..7, 12", or "3, 7, ..., 63 (every 4th)" for a progression."""
    v = distinct(np.asarray(values, dtype=np.int64))
    ranges = index_ranges(v)
    step = progression(v)
    if step is not None and len(ranges) > 2:
        return f"{v[0]}, {v[1]}, ..., {v[-1]} (every {ordinal(step)})"
    return ranges_text(ranges, limit)


def ranges_needed(values: np.ndarray) -> int:
    """Index ranges a set takes in words (a progression is one)."""
    ranges = len(index_ranges(values))
    return 1 if ranges > 2 and progression(distinct(values)) is not None else ranges


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
