"""The details of one output's comparison, gathered chunk by chunk beside its summary (judge/compare.py's
Accumulator feeds them when its Setup is ``detailed``): max relative error, worst elements, per-channel table,
histogram, and the failing masks, from which where the failures sit (judge/where.py), their sign and the heat map
(judge/heat_map.py) are read when the details are finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.judge.accumulators import Channels, Masks, MaxLocated, Worst
from bnbwd_cli.judge.comparison import Details, ElementErrors
from bnbwd_cli.judge.failures import Failures
from bnbwd_cli.judge.heat_map import heat_map
from bnbwd_cli.judge.histogram import Decades
from bnbwd_cli.judge.rules import Chunk, Verdicts, safe_ratio
from bnbwd_cli.judge.where import Coordinates as WhereCoordinates, localize, with_sign
from bnbwd_cli.scratch import Scratch


@dataclass(frozen=True)
class Judged:
    """One chunk after judging: what the detail statistics need besides the ``Chunk``."""

    verdicts: Verdicts
    fails: np.ndarray  # non-finite failures included
    finite: np.ndarray | None  # None: every element is finite
    bad: np.ndarray | None  # non-finite positions that fail (None: none can)
    offset: int


class DetailStats:
    """Max relative error, worst elements, per-channel table, histogram; the failing masks, and from them where the
    failures sit and the heat map (judge/where.py, judge/heat_map.py)."""

    def __init__(self, shape: tuple[int, ...], top_k: int, axis: int | None, axis_names: tuple[str, ...] | None,
                 keep_errors: bool) -> None:
        """``top_k``, ``keep_errors``, ``axis_names``: the Setup's (judge/compare.py); ``axis``: its channel axis for
        this shape (Setup.channel_axis)."""
        self.max_rel, self.worst, self.decades = MaxLocated(), Worst(top_k), Decades()
        self.channels = Channels(shape, axis) if axis is not None else None
        self.masks = Masks(math.prod(shape), keep_errors)
        self.coordinates = WhereCoordinates(shape, axis_names, axis)
        self.scratch = Scratch()

    def update(self, chunk: Chunk, judged: Judged) -> None:
        ratio = judged.verdicts.ratio
        self.masks.update(judged.fails, judged.bad, judged.finite, (ratio, judged.verdicts.units), judged.offset)
        if judged.finite is not None:  # the worst elements and the channels' worst ratio are finite elements'
            ratio[~judged.finite] = -1.0
        nonzero = chunk.ref != 0
        magnitude, relative = self.scratch.take(("magnitude", "relative"), chunk.ref.size)
        relative = safe_ratio(chunk.abs_err, np.abs(chunk.ref, out=magnitude), out=relative)
        self.max_rel.update(relative, nonzero if judged.finite is None else judged.finite & nonzero, judged.offset)
        self.worst.update(ratio, judged.fails, judged.verdicts.units, judged.offset)
        self.decades.update(chunk.abs_err if judged.finite is None else chunk.abs_err[judged.finite])
        if self.channels is not None:
            self.channels.update(judged.fails, chunk.abs_err, ratio, judged.offset)

    def finish(self, actual: np.ndarray, reference: np.ndarray, dtype: str) -> Details:
        shape = tuple(int(s) for s in reference.shape)
        masks, coordinates = self.masks, self.coordinates
        where = nonfinite_where = picture = None
        if masks.failing is not None:
            failing = masks.failing.reshape(shape)
            nonfinite = masks.nonfinite.reshape(shape) if masks.nonfinite is not None else None
            finite_failing = failing if nonfinite is None else failing & ~nonfinite
            elevated = None if masks.elevated is None else masks.elevated.reshape(shape) | finite_failing
            # one reading of the failing mask for `where` and the heat map when they read the same one
            failures = Failures(failing) if nonfinite is None else None
            where = localize(finite_failing, coordinates, elevated, failures)
            if where is not None:  # the errors' sign (the finite failures', so a and r are comparable there)
                where = with_sign(where, *_above(actual, reference, finite_failing, failures))
            nonfinite_where = localize(nonfinite, coordinates) if nonfinite is not None else None
            picture = heat_map(failing, coordinates.channel_axis, failures=failures)
        return Details(self.max_rel.finish(shape), self.worst.finish(actual, reference, dtype),
                       self.channels.finish() if self.channels is not None else None, self.decades.finish(),
                       where, nonfinite_where, picture, self._errors(shape),
                       None if masks.failing is None else masks.failing.reshape(shape))

    def _errors(self, shape: tuple[int, ...]) -> ElementErrors | None:
        masks = self.masks
        if not masks.keep_errors:
            return None
        def whole(mask):
            return np.zeros(shape, dtype=bool) if mask is None else mask.reshape(shape)
        return ElementErrors(whole(masks.failing), whole(masks.nonfinite), masks.ratio.reshape(shape),
                             None if masks.units is None else masks.units.reshape(shape))


def _above(actual: np.ndarray, reference: np.ndarray, mask: np.ndarray,
           failures: Failures | None = None) -> tuple[int, int]:
    """How many elements of ``mask`` have an actual value above the reference, and how many one larger in magnitude
    (compared in float64: any dtype; two arrays of one NumPy float type as they are, which compares the same). A few
    failures (``failures``: Failures(mask), the caller's when it has one) are gathered by their positions; many are
    read in pieces in storage order: no gather of a mostly failing output's elements."""
    a_flat, r_flat, m_flat = actual.reshape(-1), reference.reshape(-1), mask.reshape(-1)
    native = actual.dtype == reference.dtype and actual.dtype in (np.float16, np.float32, np.float64)
    failures = failures if failures is not None else Failures(mask)  # (the caller's, read for `where` already)
    if failures.positions is not None:  # few: gathered (a lost block, a channel: ~4x cheaper)
        a, r = a_flat[failures.positions], r_flat[failures.positions]
        if not native:
            a, r = to_float64(a), to_float64(r)
        return int(np.count_nonzero(a > r)), int(np.count_nonzero(np.abs(a) > np.abs(r)))
    above = larger = 0
    for start in range(0, m_flat.size, SIGN_PIECE):
        piece = slice(start, start + SIGN_PIECE)
        a, r, m = a_flat[piece], r_flat[piece], m_flat[piece]
        if not native:
            a, r = to_float64(a), to_float64(r)
        above += int(np.count_nonzero((a > r) & m))
        larger += int(np.count_nonzero((np.abs(a) > np.abs(r)) & m))
    return above, larger


SIGN_PIECE = 1 << 15  # elements _above compares at a time (its temporaries stay in cache)
