"""A failing mask read the cheaper way, for `where` and the heat map: from the failures' flat positions when they
are few, from the mask itself (rows of bytes added unwidened) when they are many."""

from __future__ import annotations

import math

import numpy as np

SPARSE = 64  # failures at most 1/SPARSE of the elements: counted from their positions, not the mask
LANE_ROW = 1 << 10  # bytes: dense lanes are counted on rows about this long (few rows: few calls' overhead)
LONG_ROW = 1 << 12  # elements: rows this long are counted one by one (a Python call each) rather than along an axis


def counts_dtype(bound: int) -> np.dtype:
    """The narrowest unsigned integer that holds counts up to ``bound``: NumPy adds rows of bytes fastest unwidened."""
    return np.dtype(np.uint8 if bound < 1 << 8 else np.uint16 if bound < 1 << 16 else np.uint32 if bound < 1 << 32
                    else np.uint64)


class Failures:
    """The failing elements, read the cheaper way: from their flat positions when they are few (a bincount per
    question), from the mask when they are many (a reduction per question, rows of bytes added unwidened)."""

    def __init__(self, mask: np.ndarray) -> None:
        self.mask, self.flat = mask, mask.reshape(-1)
        self.count = int(np.count_nonzero(self.flat))
        self.positions = np.flatnonzero(self.flat) if self.count * SPARSE <= self.flat.size else None
        self._coordinates: dict[int, np.ndarray] = {}
        self._lanes: dict[tuple[int, int | None], np.ndarray] = {}  # (period, prefix) -> dense per_lane counts
        self._positions: dict[int, np.ndarray] = {}  # channel axis -> per_position

    def coordinate(self, axis: int) -> np.ndarray:
        """Each failure's index on ``axis`` (computed once)."""
        if axis not in self._coordinates:
            shape = self.mask.shape
            self._coordinates[axis] = self.positions // math.prod(shape[axis + 1:]) % shape[axis]
        return self._coordinates[axis]

    def per_axis(self) -> list[np.ndarray]:
        """Failures at each index of each axis."""
        shape = self.mask.shape
        if self.positions is not None:
            return [np.bincount(self.coordinate(axis), minlength=shape[axis]) for axis in range(len(shape))]
        # Dense: the leading axis's counts row by row, then the mask summed over that axis (adding whole rows, as
        # fast as a copy) and the rest counted on that far smaller array, and so on down.
        counts, rest = [], self.mask.view(np.uint8)
        for axis in range(len(shape)):
            rows = rest.reshape(shape[axis], -1)
            if axis == 0 and rows.shape[1] >= LONG_ROW:  # a count of each long row of booleans (np.count_nonzero's
                # fast path; along an axis it converts every element: ~10x slower)
                counts.append(np.array([np.count_nonzero(row) for row in self.mask.reshape(shape[0], -1)]))
            else:
                counts.append(np.count_nonzero(rows, axis=1) if axis == 0 else rows.sum(axis=1, dtype=np.int64))
            if axis + 1 < len(shape):
                rest = rest.sum(axis=0, dtype=counts_dtype(int(rest.max(initial=0)) * shape[axis]))
        return [np.asarray(c, dtype=np.int64).reshape(-1) for c in counts]

    def inside(self, sets: list[np.ndarray]) -> int:
        """Failures inside the product of these index sets (one per axis, each distinct indices: np.flatnonzero's)."""
        if self.positions is not None:
            inside = np.ones(self.count, dtype=bool)
            for axis, chosen in enumerate(sets):
                member = np.zeros(self.mask.shape[axis], dtype=bool)
                member[chosen] = True
                inside &= member[self.coordinate(axis)]
            return int(np.count_nonzero(inside))
        # Dense: the sub-box taken one axis at a time, the most selective first (np.ix_'s fancy index of every axis
        # at once costs tens of nanoseconds an element; a take along one axis copies whole runs), full axes left be.
        box = self.mask
        for axis in sorted(range(len(sets)), key=lambda a: len(sets[a]) / max(1, self.mask.shape[a])):
            if len(sets[axis]) < self.mask.shape[axis]:
                box = np.take(box, sets[axis], axis=axis)
        return int(np.count_nonzero(box))

    def per_lane(self, period: int, prefix: int | None = None) -> np.ndarray:
        """Failures at each residue of the flat index modulo ``period`` (among the first ``prefix`` elements).
        Dense: counted modulo a multiple of the period about LANE_ROW long (one count serves every period that
        divides it, 32 and 64 alike: the flat index modulo the multiple, taken modulo the period), then folded."""
        if self.positions is not None:
            return np.bincount(self.positions % period, minlength=period)
        wide = period * max(1, LANE_ROW // period)
        if (wide, prefix) not in self._lanes:
            self._lanes[wide, prefix] = self._dense_lanes(wide, prefix)
        return self._lanes[wide, prefix].reshape(-1, period).sum(axis=0)

    def _dense_lanes(self, period: int, prefix: int | None) -> np.ndarray:
        """per_lane from the mask itself: rows of ``period`` bytes added 255 at a time."""
        flat = self.flat[:prefix].view(np.uint8)
        groups = flat.size // period
        stacked = groups // 255 * 255  # groups of 255 rows added as bytes (no widening: 3x faster), then the rest
        lanes = flat[:stacked * period].reshape(-1, 255, period).sum(axis=1, dtype=np.uint8).sum(axis=0, dtype=np.int64)
        lanes += flat[stacked * period:groups * period].reshape(-1, period).sum(axis=0, dtype=np.int64)
        return lanes + np.bincount(np.arange(flat.size - groups * period), weights=flat[groups * period:],
                                   minlength=period).astype(np.int64)

    def per_position_of(self, axis: int) -> np.ndarray:
        """Each failure's position in its channel's reduction order (the axes other than ``axis`` flattened)."""
        shape = self.mask.shape
        inner = math.prod(shape[axis + 1:])
        return self.positions // (shape[axis] * inner) * inner + self.positions % inner

    def per_position(self, axis: int) -> np.ndarray:
        """Failures at each position of the channels' reduction order (the axes other than ``axis`` flattened;
        computed once: `where` reads it for a range and for each warp's lanes). Read only."""
        if axis not in self._positions:
            self._positions[axis] = self._per_position(axis)
        return self._positions[axis]

    def _per_position(self, axis: int) -> np.ndarray:
        shape = self.mask.shape
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        if self.positions is not None:
            return np.bincount(self.per_position_of(axis), minlength=outer * inner)
        by_channel = self.mask.reshape(outer, shape[axis], inner).view(np.uint8)
        return by_channel.sum(axis=1, dtype=counts_dtype(shape[axis])).reshape(-1)

    def bounds(self) -> tuple[int, int]:
        """[first, last + 1) of the failing flat positions."""
        if self.positions is not None:
            return int(self.positions[0]), int(self.positions[-1]) + 1
        flat = self.flat
        block = 1 << 12
        whole = flat.size // block * block
        tail = np.flatnonzero(flat[whole:])
        if tail.size:
            return int(np.argmax(flat)), whole + int(tail[-1]) + 1
        last = int(np.flatnonzero(flat[:whole].reshape(-1, block).any(axis=1))[-1])  # the last block that fails
        return int(np.argmax(flat)), last * block + int(np.flatnonzero(flat[last * block:(last + 1) * block])[-1]) + 1

    def first(self, count: int) -> np.ndarray:
        """The first ``count`` failing flat positions."""
        if self.positions is not None:
            return self.positions[:count]
        start = int(np.argmax(self.flat))
        return np.flatnonzero(self.flat[start:start + count * 4]) [:count] + start
