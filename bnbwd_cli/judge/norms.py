"""Norms without overflow or underflow: a sum of squares kept as total * 4**exponent (SumOfSquares) and the
relative L2 error ||a - r|| / ||r|| built on it (RelativeL2); ordinary data keeps a plain sum's bits."""

from __future__ import annotations

import math

import numpy as np


def _ldexp(value: float, exponent: int) -> float:
    """value * 2**exponent, inf past the float64 range (math.ldexp raises there)."""
    try:
        return math.ldexp(value, exponent)
    except OverflowError:
        return math.inf


# A chunk's sum of squares below this (values near 1e-154 or smaller) has lost digits to underflow.
_UNDERFLOWING_SQUARES = 2.0**-900
_LARGE_TOTAL = 2.0**600  # a running total past this is rescaled (totals of ordinary data never get near)


class SumOfSquares:
    """A sum of squares kept as total * 4**exponent, so that values near the float64 limits neither overflow
    (1e200 squared is inf) nor underflow (1e-200 squared is 0). Ordinary chunks are summed as they are (the
    exponent stays 0, the same bits as a plain sum); only a chunk whose plain sum overflows or underflows is
    scaled by a power of two first."""

    def __init__(self) -> None:
        self.total, self.exponent = 0.0, 0

    def add(self, values: np.ndarray) -> None:
        # einsum, not np.dot: BLAS's dot wakes its thread pool on every call (costly on a busy machine,
        # whatever the chunk size) and its sum order depends on the thread count.
        with np.errstate(over="ignore", under="ignore"):
            plain = float(np.einsum("i,i->", values, values))
        if math.isfinite(plain) and plain >= _UNDERFLOWING_SQUARES:
            self._add(plain, 0)
        elif values.size and (largest := float(np.max(np.abs(values)))) > 0:
            if not math.isfinite(largest):  # |a - r| itself overflowed: the norm is infinite
                self._add(math.inf, 0)
                return
            exponent = math.frexp(largest)[1]
            scaled = np.ldexp(values, -exponent)
            with np.errstate(under="ignore"):
                self._add(float(np.einsum("i,i->", scaled, scaled)), exponent)
        else:
            self._add(plain, 0)

    def _add(self, total: float, exponent: int) -> None:
        if total == 0:
            return
        if self.total == 0:
            self.total, self.exponent = total, exponent
        else:
            common = max(self.exponent, exponent)
            self.total = _ldexp(self.total, 2 * (self.exponent - common)) + _ldexp(total, 2 * (exponent - common))
            self.exponent = common
        while math.isfinite(self.total) and self.total > _LARGE_TOTAL:  # keep room to add more without overflow
            self.total, self.exponent = math.ldexp(self.total, -500), self.exponent + 250

    def norm(self) -> float:
        return _ldexp(math.sqrt(self.total), self.exponent)


class RelativeL2:
    """||a - r||2 / ||r||2 over the finite elements (without overflow or underflow: see SumOfSquares)."""

    def __init__(self) -> None:
        self.diff, self.ref = SumOfSquares(), SumOfSquares()

    def update(self, diff: np.ndarray, ref: np.ndarray) -> None:
        self.diff.add(diff)
        self.ref.add(ref)

    def finish(self) -> tuple[float, float]:
        """(rel_l2, ||r||2): rel_l2 is 0 when both norms are 0, inf when only ||r|| is."""
        diff, ref = self.diff, self.ref
        if ref.total == 0:
            return (0.0 if diff.total == 0 else math.inf), 0.0
        if math.isinf(diff.total):  # an |a - r| that overflowed: the difference is past any bound
            return math.inf, ref.norm()
        return _ldexp(math.sqrt(diff.total / ref.total), diff.exponent - ref.exponent), ref.norm()
