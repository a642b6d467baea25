"""The histogram of |a - r|: counts per decade [10**k, 10**(k+1)) after a bin of exact matches, fed chunk by chunk
(Decades) or from one array (log_histogram); the same bins whatever the chunking."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.scratch import Scratch


@dataclass(frozen=True)
class HistogramBin:
    """Count of |a - r| in [low, high); the bin low == high == 0 counts exact matches."""

    low: float
    high: float
    count: int


class Decades:
    """Counts of finite |a - r| per decade, and of exact matches."""

    def __init__(self) -> None:
        self.exact = 0
        self.counts: dict[int, int] = {}
        self.scratch = Scratch()  # (a chunk's logarithms and bins: no fresh temporaries per chunk)

    def update(self, finite_err: np.ndarray) -> None:
        self.exact += int(np.count_nonzero(finite_err == 0))  # (a count of a mask: several times a sum's speed)
        for decade, number in _decade_counts(finite_err, self.scratch).items():
            self.counts[decade] = self.counts.get(decade, 0) + number

    def finish(self) -> tuple[HistogramBin, ...]:
        return histogram_bins(self.exact, self.counts)


_FLOAT_MAX = float(np.finfo(np.float64).max)
_BOOL, _INTP = np.dtype(bool), np.dtype(np.intp)
_LOWEST_DECADE = -330  # below log10 of the smallest subnormal (-323.3): a bincount offset


def _decade_counts(abs_err: np.ndarray, scratch: Scratch | None = None) -> dict[int, int]:
    """{k: how many non-zero values lie in [10**k, 10**(k+1))}: floor(log10), then a bincount (not a sort), in
    ``scratch``'s buffers when given."""
    scratch = Scratch() if scratch is None else scratch
    positive = np.greater(abs_err, 0, out=scratch.get("positive", abs_err.shape, _BOOL))
    nonzero = abs_err if np.count_nonzero(positive) == abs_err.size else abs_err[positive]
    if not nonzero.size:
        return {}
    # |a - r| of two finite values can overflow to inf (1e308 against -1e308): counted in the top decade, [1e308, max].
    decades = np.minimum(nonzero, _FLOAT_MAX, out=scratch.get("decades", nonzero.shape))
    np.floor(np.log10(decades, out=decades), out=decades)  # (integers, as floats)
    if decades.min() < _LOWEST_DECADE:
        values, numbers = np.unique(decades.astype(np.intp), return_counts=True)
        return dict(zip(values.tolist(), numbers.tolist()))
    bins = np.subtract(decades, _LOWEST_DECADE, out=scratch.get("bins", nonzero.shape, _INTP), casting="unsafe")
    counts = np.bincount(bins.reshape(-1))
    return {int(i) + _LOWEST_DECADE: int(counts[i]) for i in np.flatnonzero(counts)}


def _power_of_ten(k: int) -> float:
    """10**k as a bin edge; the top decade's upper edge is the largest float (10**309 is past float64)."""
    return 10.0**k if k <= 308 else _FLOAT_MAX


def histogram_bins(exact: int, decades: Mapping[int, int], max_bins: int = 12) -> tuple[HistogramBin, ...]:
    bins = [HistogramBin(0.0, 0.0, exact)]
    if not decades:
        return tuple(bins)
    highest, lowest = max(decades), min(decades)
    bottom = max(lowest, highest - max_bins + 1)
    for k in range(bottom, highest + 1):
        low_edge = k == bottom and lowest < bottom
        count = sum(n for d, n in decades.items() if d <= k) if low_edge else decades.get(k, 0)
        bins.append(HistogramBin(0.0 if low_edge else _power_of_ten(k), _power_of_ten(k + 1), count))
    return tuple(bins)


def log_histogram(abs_err: np.ndarray, max_bins: int = 12) -> tuple[HistogramBin, ...]:
    """Counts of finite |a - r| per decade [10**k, 10**(k+1)), after a bin of exact zeros.

    At most ``max_bins`` decades: the lowest bin then starts at 0 and collects everything
    below it (exact zeros still have their own bin).
    """
    return histogram_bins(int((abs_err == 0).sum()), _decade_counts(abs_err), max_bins)
