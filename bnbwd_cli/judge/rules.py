"""How one chunk's finite elements are judged: which fail, and what would have let them pass.

``FixedRule``: atol/rtol/ulp. ``ScaledRule``: K units of the error model's scale. Both return
``Verdicts``; err / allowance (``ratio``, > 1 fails) only when asked, since only the detailed
statistics (worst elements, per channel) use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge.tolerance import Scaled, Tolerance


@dataclass(frozen=True)
class Chunk:
    """One chunk's finite elements, float64, flat: |a - r|, r, the ULP spacing at r, the scale (scaled rule).

    ``scratch``: float64 arrays of the chunk's size the rule may fill (reused from chunk to chunk): three, or none.
    """

    abs_err: np.ndarray
    ref: np.ndarray
    spacing: np.ndarray
    scale: np.ndarray | None = None
    scratch: tuple[np.ndarray, ...] = ()


@dataclass(frozen=True)
class Verdicts:
    """One chunk's per-element judgement (non-finite elements are handled apart).

    ``need``: per "would pass with" statistic, its value at every element where it is not 0
    (the statistics only keep the largest values, so zeros can be left out).
    """

    fails: np.ndarray
    need: tuple[np.ndarray, ...]
    ulp_err: np.ndarray  # |a - r| / spacing
    units: np.ndarray | None = None  # scaled rule only
    ratio: np.ndarray | None = None  # error / allowance, when asked


class FixedRule:
    """|a - r| <= atol + rtol*|r|, or within `ulp` ULPs."""

    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance

    def judge(self, chunk: Chunk, with_ratio: bool) -> Verdicts:
        tol = self.tolerance
        with np.errstate(over="ignore"):  # f64 subnormal spacing: huge ULP counts are honest
            ulp_err = np.divide(chunk.abs_err, chunk.spacing, out=chunk.scratch[0] if chunk.scratch else None)
        within_ulp = ulp_err <= tol.ulp
        # Elements within ULPs pass and need nothing; the rest (usually few) are judged on their own.
        outside = np.flatnonzero(~within_ulp)
        err, ref = chunk.abs_err[outside], np.abs(chunk.ref[outside])
        fails = np.zeros(within_ulp.shape, dtype=bool)
        fails[outside] = ~(err <= tol.atol + tol.rtol * ref)
        need_atol = np.maximum(0.0, err - tol.rtol * ref)
        need_rtol = safe_ratio(err - tol.atol, ref)[err > tol.atol]
        ratio = None
        if with_ratio:
            bound = tol.atol + tol.rtol * np.abs(chunk.ref)
            by_ulp = ulp_err / tol.ulp if tol.ulp > 0 else safe_ratio(ulp_err, np.zeros(ulp_err.size))
            ratio = np.minimum(safe_ratio(chunk.abs_err, bound), by_ulp)
        return Verdicts(fails, (need_atol, need_rtol), ulp_err, None, ratio)


class ScaledRule:
    """|a - r| <= K*s + ulp_D(r): K units of the element's error scale s, plus one ulp of rounding."""

    def __init__(self, scaled: Scaled) -> None:
        self.scaled = scaled

    def judge(self, chunk: Chunk, with_ratio: bool) -> Verdicts:
        ulp_out, allowance, units = chunk.scratch or (None, None, None)
        allowance = np.multiply(self.scaled.max_units, chunk.scale, out=allowance)
        allowance += chunk.spacing
        fails = chunk.abs_err > allowance
        units = np.maximum(np.subtract(chunk.abs_err, chunk.spacing, out=units), 0.0, out=units)
        units = safe_ratio(units, chunk.scale, out=units)
        with np.errstate(over="ignore"):
            ulp_err = np.divide(chunk.abs_err, chunk.spacing, out=ulp_out)
        ratio = safe_ratio(chunk.abs_err, allowance) if with_ratio else None
        return Verdicts(fails, (units,), ulp_err, units, ratio)


def pass_flushed(verdicts: Verdicts, actual: np.ndarray, ref: np.ndarray, smallest_normal: float) -> int:
    """Let the failing elements that are a subnormal flushed to zero pass (FTZ: CUDA -ftz, --use_fast_math, x86
    fast-math): actual == 0 where the reference is subnormal in the output's dtype (0 < |r| < its smallest normal).
    Changes ``verdicts`` in place (the element needs nothing and uses no units) and returns how many it let pass.
    A passing chunk pays one scan of its verdicts; a failing one two more (its zeros), and only its failing zeros
    are gathered (none, usually: a kernel that fails most elements need not gather them all)."""
    if not verdicts.fails.any():
        return 0
    failing = np.flatnonzero(np.logical_and(verdicts.fails, actual == 0))
    if not failing.size:
        return 0
    ref_abs = np.abs(ref[failing])
    flushed = failing[(ref_abs > 0) & (ref_abs < smallest_normal)]
    verdicts.fails[flushed] = False
    for array in (verdicts.units, verdicts.ratio):
        if array is not None:
            array[flushed] = 0.0
    return int(flushed.size)


def safe_ratio(numerator: np.ndarray, denominator: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """numerator / denominator with x/0 = inf for x > 0 and 0/0 = 0. ``out`` may be the numerator."""
    zero = denominator == 0
    positive = numerator[zero] > 0 if zero.any() else None  # read before ``out`` overwrites the numerator
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.divide(numerator, denominator, out=out)
    if positive is not None:
        ratio[zero] = np.where(positive, np.inf, 0.0)
    return ratio
