"""Summary statistics of an output: min and max over its finite values, and its count of NaN/Inf.

The cores gather them in their write pass, where each block of diff_src is still in cache: per block the
min and max of the float64 values before rounding (numba), or of the float32/float64 values they were
rounded to or through (NumPy: half the bytes to read; NaN propagating). Rounding is monotone, so when no
block saw a NaN and the rounded extremes are finite, every rounded element is finite and the rounded
extremes are the output's extremes. Otherwise (NaN/Inf outputs, rare) the output is scanned (`scan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli.core.rounding import round_to

SCAN_CHUNK = 1 << 20  # elements per chunk: a scan never makes a full-size temporary
ROW_REDUCE_MIN = 256  # extremes: strided blocks with rows at least this long are reduced row by row first


@dataclass(frozen=True)
class OutputStats:
    minimum: float  # NaN when the output is empty; +inf/-inf when it has no finite value
    maximum: float
    nonfinite: int


def scan(array: np.ndarray) -> OutputStats:
    """Min, max (over finite values) and the count of NaN/Inf, in chunks of float32/float64."""
    flat = array.reshape(-1)
    lowest, highest, nonfinite = np.inf, -np.inf, 0
    for start in range(0, flat.size, SCAN_CHUNK):
        chunk = flat[start : start + SCAN_CHUNK]
        chunk = chunk.astype(np.float32) if chunk.dtype.itemsize == 2 else chunk
        finite = np.isfinite(chunk)
        nonfinite += int(chunk.size - np.count_nonzero(finite))
        if finite.any():
            values = chunk if finite.all() else chunk[finite]  # the usual case: no boolean-indexed copy
            lowest, highest = min(lowest, float(values.min())), max(highest, float(values.max()))
    return OutputStats(lowest if flat.size else float("nan"), highest if flat.size else float("nan"), nonfinite)


def from_extremes(lowest: float, highest: float, out: np.ndarray) -> OutputStats:
    """The stats of `out` (T1) from the min and max of the float64 values it was rounded from.

    lowest/highest NaN (a NaN was among the values) or rounding to Inf: `out` is scanned instead.
    """
    if out.size == 0 or not (np.isfinite(lowest) and np.isfinite(highest)):
        return scan(out)
    rounded = round_to(np.array([lowest, highest]), out.dtype).astype(np.float64)
    if not np.isfinite(rounded).all():
        return scan(out)
    return OutputStats(float(rounded[0]), float(rounded[1]), 0)


def extremes(values: np.ndarray) -> tuple[float, float]:
    """(min, max) of a block of values, NaN if it holds one. A strided block with long rows (an NCX channel plane,
    rows a plane apart) is reduced along its rows first: NumPy's whole-array reduction of such a view walks it
    in a slower order."""
    if values.flags.c_contiguous or values.shape[-1] < ROW_REDUCE_MIN:
        return np.minimum.reduce(values, axis=None), np.maximum.reduce(values, axis=None)
    return np.minimum.reduce(values, axis=-1).min(), np.maximum.reduce(values, axis=-1).max()


def combine(lows: np.ndarray, highs: np.ndarray) -> tuple[float, float]:
    """The min and max of per-block extremes, NaN if any block had a NaN (np.min/np.max propagate it)."""
    if lows.size == 0:
        return float("nan"), float("nan")
    return float(np.min(lows)), float(np.max(highs))
