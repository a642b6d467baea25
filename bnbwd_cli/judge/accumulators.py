"""Small accumulators, one per statistic: each is fed chunk by chunk (update) and then read (finish).

Chunks are flat ranges of the tensor in storage order; ``offset`` is the chunk's first flat index.
Every accumulator gives the same answer whatever the chunking (ties go to the lowest index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bnbwd_cli.dtypes import to_float64, ulp_spacing
from bnbwd_cli.judge.where import ELEVATED


@dataclass(frozen=True)
class Located:
    """A statistic and the index where it occurs (None when there is no such element)."""

    value: float
    index: tuple[int, ...] | None


@dataclass(frozen=True)
class Element:
    """One element of the worst-k list. ``ratio`` = error / allowance; > 1 fails."""

    index: tuple[int, ...]
    actual: float
    expected: float
    abs_err: float
    rel_err: float
    ulp_err: float
    ratio: float
    passed: bool
    units: float | None = None  # scaled rule: the error in units of the element's scale


@dataclass(frozen=True)
class ChannelStat:
    """Mismatches and the worst errors in one channel."""

    channel: int
    elements: int
    mismatches: int
    max_abs: float
    max_ratio: float


@dataclass(frozen=True)
class NonFinite:
    """NaN/Inf counts per side and how many positions fail because of them; the first of those positions (indices,
    in storage order) and the channels whose every element is NaN in actual where the reference is finite."""

    nan_actual: int
    nan_reference: int
    nan_mismatches: int
    inf_actual: int
    inf_reference: int
    inf_mismatches: int
    # (out of the repr: the judged path's hash, bench/judge_bits, covers what the counts above already say)
    first: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    nan_channels: tuple[int, ...] = field(default=(), repr=False)

    @property
    def mismatches(self) -> int:
        """Positions that fail for a NaN or an Inf: NaN/Inf where the other side differs."""
        return self.nan_mismatches + self.inf_mismatches


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def top(values: np.ndarray, k: int) -> np.ndarray:
    """Flat positions of the k largest values; ties go to the lowest positions."""
    if k <= 0 or values.size == 0:
        return np.zeros(0, dtype=np.intp)
    if values.size <= k:
        return np.arange(values.size)
    if k == 1:  # the common case (no outliers allowed): a max, not a partition
        return np.array([int(np.argmax(values))])
    threshold = np.partition(values, values.size - k)[values.size - k]
    above = np.flatnonzero(values > threshold)
    ties = np.flatnonzero(values == threshold)[: k - above.size]
    return np.concatenate([above, ties])


class MaxLocated:
    """Running maximum of a statistic and the flat index of its first occurrence."""

    def __init__(self) -> None:
        self.value, self.index = -math.inf, -1

    def update(self, values: np.ndarray, mask: np.ndarray | None, offset: int) -> None:
        """``mask``: the elements that count (None: all of them)."""
        if mask is not None and not mask.all():  # (every element counting, the usual case: no masked copy)
            if not mask.any():
                return
            values = np.where(mask, values, -np.inf)
        if values.size == 0:
            return
        i = int(np.argmax(values))
        self.offer(values[i], offset + i)

    def offer(self, value: float, index: int) -> None:
        """One candidate at flat ``index``: kept when larger than the maximum so far (a tie keeps the earlier one)."""
        if value > self.value:
            self.value, self.index = float(value), index

    def finish(self, shape: tuple[int, ...]) -> Located:
        if self.index < 0:
            return Located(float("nan"), None)
        return Located(self.value, unravel(self.index, shape))


class Largest:
    """The k largest values seen (for the minimum tolerance with k-1 allowed outliers)."""

    def __init__(self, k: int) -> None:
        self.k, self.kept = k, np.zeros(0)

    def update(self, values: np.ndarray) -> None:
        """``values``: any subset of the chunk's values that holds all its non-zero ones at or above ``floor()``
        (all are >= 0): a smaller one can never be among the k largest."""
        self.kept = np.concatenate([self.kept, values[top(values, self.k)]])
        if self.kept.size > 4 * self.k:
            self.kept = self.kept[top(self.kept, self.k)]

    def floor(self) -> float:
        """The k-th largest value kept so far (-inf while fewer than k are, or when one is NaN: a scale that is not
        sound somewhere, whose NaN units rank above any number): what a value must reach to count."""
        if self.kept.size < self.k or self.k <= 0 or np.isnan(self.kept).any():
            return -math.inf
        return float(np.partition(self.kept, self.kept.size - self.k)[self.kept.size - self.k])

    def finish(self) -> float:
        """The k-th largest value; 0 when fewer than k non-zero values were seen."""
        if self.kept.size < self.k:
            return 0.0
        return float(np.partition(self.kept, self.kept.size - self.k)[self.kept.size - self.k])


class Worst:
    """The top-k elements by error/allowance (positive ratios only), with their pass/fail."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.index = np.zeros(0, dtype=np.intp)
        self.ratio = np.zeros(0)
        self.fail = np.zeros(0, dtype=bool)
        self.units = np.zeros(0)

    def update(self, ratio: np.ndarray, fails: np.ndarray, units: np.ndarray | None, offset: int) -> None:
        if self.k and self.ratio.size >= self.k:
            # Only an element at or above the k-th largest ratio kept can be among the worst (ties included: finish
            # orders them by index): those few are ranked, not the whole chunk.
            floor = np.partition(self.ratio, self.ratio.size - self.k)[self.ratio.size - self.k]
            candidates = np.flatnonzero(ratio >= floor)
            best = candidates[top(ratio[candidates], self.k)]
        else:
            best = top(np.where(ratio > 0, ratio, -1.0), self.k)
            best = best[ratio[best] > 0]
        self.index = np.concatenate([self.index, offset + best])
        self.ratio = np.concatenate([self.ratio, ratio[best]])
        self.fail = np.concatenate([self.fail, fails[best]])
        self.units = np.concatenate([self.units, units[best] if units is not None else np.full(best.size, np.nan)])

    def finish(self, actual: np.ndarray, reference: np.ndarray, dtype: str) -> tuple[Element, ...]:
        """The elements, re-read from the tensors (only k of them) for their values and errors."""
        order = np.lexsort((self.index, -self.ratio))[: self.k]
        a_flat, r_flat = actual.reshape(-1), reference.reshape(-1)
        elements = []
        for i in order:
            flat = int(self.index[i])
            a, r = float(to_float64(a_flat[flat : flat + 1])[0]), float(to_float64(r_flat[flat : flat + 1])[0])
            units = None if math.isnan(self.units[i]) else float(self.units[i])
            err, rel, ulp = _errors(a, r, dtype)
            elements.append(Element(unravel(flat, actual.shape), a, r, err, rel, ulp, float(self.ratio[i]), not bool(self.fail[i]), units))
        return tuple(elements)


def _errors(a: float, r: float, dtype: str) -> tuple[float, float, float]:
    """Absolute, relative and ULP error of one element (NaN when either side is not finite)."""
    if not (math.isfinite(a) and math.isfinite(r)):
        return math.nan, math.nan, math.nan
    err = abs(a - r)
    rel = err / abs(r) if r != 0 else (math.inf if err > 0 else 0.0)
    return err, rel, err / float(ulp_spacing(np.array([r]), dtype)[0])


class Channels:
    """Mismatches, max |a-r| and max err/allowance per channel."""

    def __init__(self, shape: tuple[int, ...], channel_axis: int) -> None:
        count = shape[channel_axis]
        self.stride = math.prod(shape[channel_axis + 1 :])
        self.fail = np.zeros(count, dtype=np.int64)
        self.abs = np.zeros(count)
        self.ratio = np.zeros(count)
        self.rows = math.prod(shape) // count if count else 0

    def update(self, fails: np.ndarray, abs_err: np.ndarray, ratio: np.ndarray, offset: int) -> None:
        """Counts and maxima need no order: reduced per run of one channel, not per element."""
        count = self.fail.size
        if fails.size == 0:
            return
        if self.stride == 1 and offset % count == 0 and fails.size % count == 0:  # channels last, whole rows
            self.fail += np.count_nonzero(fails.reshape(-1, count), axis=0)
            np.maximum(self.abs, abs_err.reshape(-1, count).max(axis=0), out=self.abs)
            np.maximum(self.ratio, ratio.reshape(-1, count).max(axis=0), out=self.ratio)
            return
        starts = np.arange((-offset) % self.stride, fails.size, self.stride)  # where a channel's run begins
        if starts.size == 0 or starts[0] != 0:
            starts = np.concatenate([[0], starts])
        channel = ((offset + starts) // self.stride) % count
        np.add.at(self.fail, channel, np.add.reduceat(fails, starts, dtype=np.int64))
        np.maximum.at(self.abs, channel, np.maximum.reduceat(abs_err, starts))
        np.maximum.at(self.ratio, channel, np.maximum.reduceat(ratio, starts))

    def finish(self) -> tuple[ChannelStat, ...]:
        return tuple(ChannelStat(c, self.rows, int(self.fail[c]), float(self.abs[c]), float(self.ratio[c])) for c in range(self.fail.size))


class NonFiniteCounts:
    """NaN/Inf per side, and which positions fail because of them (classified only when a chunk has any): their
    count, the first FIRST_POSITIONS of them, and per channel the NaN of actual where the reference is finite."""

    FIRST_POSITIONS = 5

    def __init__(self, equal_nan: bool, shape: tuple[int, ...] = (), channel_axis: int | None = None) -> None:
        self.equal_nan, self.shape, self.channel_axis = equal_nan, shape, channel_axis
        self.nan_a = self.nan_r = self.nan_bad = self.inf_a = self.inf_r = self.inf_bad = 0
        self.first = np.zeros(0, dtype=np.int64)
        self.nan_per_channel: np.ndarray | None = None

    def update(self, a: np.ndarray, r: np.ndarray, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(finite, bad): both sides finite; a non-finite position that fails. ``offset``: the chunk's first flat index."""
        finite = np.isfinite(a) & np.isfinite(r)
        nan_a, nan_r, inf_a, inf_r = np.isnan(a), np.isnan(r), np.isinf(a), np.isinf(r)
        any_nan = nan_a | nan_r
        bad = ~finite & ~((nan_a & nan_r & self.equal_nan) | (inf_a & inf_r & (a == r)))
        self.nan_a += int(nan_a.sum())
        self.nan_r += int(nan_r.sum())
        self.nan_bad += int((bad & any_nan).sum())
        self.inf_a += int(inf_a.sum())
        self.inf_r += int(inf_r.sum())
        self.inf_bad += int((bad & ~any_nan).sum())
        # the lowest positions seen (chunks may come in any order: diff_src's blocks run by channels)
        self.first = np.sort(np.concatenate([self.first, offset + np.flatnonzero(bad)[: self.FIRST_POSITIONS]]))
        self.first = self.first[: self.FIRST_POSITIONS]
        if self.channel_axis is not None:
            self._count_channels(np.flatnonzero(nan_a & np.isfinite(r)) + offset)
        return finite, bad

    def _count_channels(self, positions: np.ndarray) -> None:
        count = self.shape[self.channel_axis]
        if self.nan_per_channel is None:
            self.nan_per_channel = np.zeros(count, dtype=np.int64)
        if positions.size:
            inner = math.prod(self.shape[self.channel_axis + 1:])
            self.nan_per_channel += np.bincount(positions // inner % count, minlength=count)

    def finish(self) -> NonFinite:
        first = tuple(unravel(int(i), self.shape) for i in self.first[: self.FIRST_POSITIONS])
        channels: tuple[int, ...] = ()
        if self.nan_per_channel is not None and self.shape:
            per_channel = math.prod(self.shape) // self.shape[self.channel_axis]
            channels = tuple(int(c) for c in np.flatnonzero(self.nan_per_channel == per_channel)) if per_channel else ()
        return NonFinite(self.nan_a, self.nan_r, self.nan_bad, self.inf_a, self.inf_r, self.inf_bad, first, channels)


class Masks:
    """Which elements fail, as masks of the whole output (flat), allocated at the first failure: a passing output
    holds none. The non-finite failures apart. With ``keep_errors``, every element's error / allowance (and its
    units under the scaled rule) as float32, NaN where a side is not finite (--save-error)."""

    def __init__(self, size: int, keep_errors: bool = False) -> None:
        self.size, self.keep_errors = size, keep_errors
        self.failing: np.ndarray | None = None
        self.nonfinite: np.ndarray | None = None
        self.ratio = np.empty(size, dtype=np.float32) if keep_errors else None
        self.units: np.ndarray | None = None
        # elements off by more than ELEVATED of their allowance (judge/where.py: a region of a small error fails in
        # only some of its elements), allocated at the first one: a correct kernel's errors stay far below
        self.elevated: np.ndarray | None = None

    def update(self, fails: np.ndarray, bad: np.ndarray | None, finite: np.ndarray | None,
               errors: tuple[np.ndarray, np.ndarray | None], offset: int) -> None:
        """A chunk at flat ``offset``: its failures, the non-finite ones (``bad``), where both sides are finite
        (None: everywhere) and its (error / allowance, units or None)."""
        ratio, units = errors
        stop = offset + fails.size
        if ratio is not None:
            hot = ratio > ELEVATED
            if finite is not None:
                hot &= finite
            if self.elevated is not None or hot.any():
                if self.elevated is None:
                    self.elevated = np.zeros(self.size, dtype=bool)
                self.elevated[offset:stop] = hot
        if fails.any():
            if self.failing is None:
                self.failing = np.zeros(self.size, dtype=bool)
            self.failing[offset:stop] = fails
            if bad is not None and bad.any():
                if self.nonfinite is None:
                    self.nonfinite = np.zeros(self.size, dtype=bool)
                self.nonfinite[offset:stop] = bad
        if self.ratio is not None:
            self.ratio[offset:stop] = ratio
            if units is not None:
                if self.units is None:
                    self.units = np.empty(self.size, dtype=np.float32)
                self.units[offset:stop] = units
            if finite is not None:
                self.ratio[offset:stop][~finite] = np.nan
                if units is not None:
                    self.units[offset:stop][~finite] = np.nan


def count_zeros(values: np.ndarray) -> int:
    """How many elements are 0 (either sign): a count of a boolean mask, several times faster than
    np.count_nonzero of the floats themselves."""
    return int(np.count_nonzero(values == 0))


class ZeroCounts:
    """Fractions of exact zeros per side (an output never written is mostly zeros)."""

    def __init__(self) -> None:
        self.actual = self.reference = self.seen = 0

    def update(self, a: np.ndarray, r: np.ndarray) -> None:
        self.add(count_zeros(a), count_zeros(r), a.size)

    def add(self, actual: int, reference: int, seen: int) -> None:
        """Counts of zeros already made: in ``actual``, in ``reference``, out of ``seen`` elements."""
        self.actual += actual
        self.reference += reference
        self.seen += seen

    def finish(self) -> tuple[float, float]:
        if not self.seen:
            return 0.0, 0.0
        return self.actual / self.seen, self.reference / self.seen
