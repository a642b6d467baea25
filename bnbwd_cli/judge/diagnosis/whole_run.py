"""diff_src's whole-run test of a prediction, block by block (prediction.blocks): ``confirmed`` counts its elements
beyond K units of the prediction and measures the share of the deviation it explains in one walk, which stops at
the first block where too many elements are beyond; the prediction's diff_src is never held whole for it. Where
the tolerance is a number wherever the reference is finite (``_cheap``), an element within K*u*|p| of the
prediction passes without its tolerance formed, and the error scale is formed only at the others (``_beyond``, or
gathered over blocks in the lean walk: ``_Unsure``). The test every hypothesis must pass, of which this walk is the
last and costliest step: judge/diagnosis/assess.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.judge.diagnosis.case import Case, Output
from bnbwd_cli.judge.diagnosis.measures import explained, prediction_tolerance, rounded, sum_of_squares
from bnbwd_cli.judge.diagnosis.prediction import Lean, blocks, chunks


Rows = Callable[[tuple], tuple[np.ndarray, np.ndarray | None]]


FLUSH = 1 << 14  # elements past the cheap test gathered over blocks before their full test (_Unsure)


def confirmed(case: Case, at: Rows, share: bool, lean: Lean | None = None) -> float | None:
    """diff_src's whole-run test, block by block (prediction.blocks): None when more elements than the judge allows
    are beyond K units of the prediction (found at the first block where they are), else the share of the deviation
    it explains (``share`` False: NaN, not measured). ``at(rows)``: the prediction's diff_src and noise at a block's
    rows; ``lean`` (Prediction.lean), when given and the tolerance is a number wherever the reference is finite
    (_cheap): the walk _confirmed_lean takes instead. Each block's numbers are the whole tensors' there, and the sums
    go block by block in order: the share is the one share_explained gives on the whole arrays (to the last bits of
    its sum's order)."""
    if lean is not None and _cheap(case):
        return _confirmed_lean(case, lean, share)
    out = case.outputs["diff_src"]
    dtype, allowed = out.comparison.dtype, out.comparison.allowed_mismatches
    count, squares = 0, 0.0
    cheap = _cheap(case)
    for rows in blocks(case.shape):
        p, extra = at(rows)
        a = out.actual_operand(rows)
        count += _beyond(case, rows, (a, p), extra, cheap)
        if count > allowed:
            return None
        if share:
            squares += _block_squares(out, rows, a, p, dtype)
    return explained(out.deviation_norm, math.sqrt(squares)) if share else math.nan


def _confirmed_lean(case: Case, lean: Lean, share: bool) -> float | None:
    """confirmed's walk with the prediction's noise formed only where the test needs it: an element within K*u*|p|
    of the prediction p passes (_cheap: its tolerance, at least that, is a number; the noise is NaN only where p is,
    and such an element is not within), the others are gathered, block after block, and tested in full FLUSH at a
    time (_Unsure): the same count as _beyond's, the same share."""
    out = case.outputs["diff_src"]
    dtype, allowed = out.comparison.dtype, out.comparison.allowed_mismatches
    k, unit = out.comparison.scaled.max_units, case.unit
    unsure = _Unsure(case, lean)
    count, squares = 0, 0.0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for rows in blocks(case.shape):
            p, xhat, dy = lean.at(rows)
            a = out.actual_operand(rows)
            off = np.abs(a - p)
            outside = ~(off <= k * (unit * np.abs(p)))
            if out.flushed is not None:
                outside &= out.kept(rows)
            positions = np.flatnonzero(outside)
            if positions.size:
                unsure.add(rows, positions, (p, off, xhat, dy))
                if unsure.size >= FLUSH:
                    count += unsure.count()
                    if count > allowed:
                        return None
            if share:
                squares += _block_squares(out, rows, a, p, dtype)
        count += unsure.count()
    if count > allowed:
        return None
    return explained(out.deviation_norm, math.sqrt(squares)) if share else math.nan


class _Unsure:
    """The elements of a lean walk farther than K*u*|p| from the prediction, gathered block after block (each one's
    channel, |a - p|, p, the reference, the case's xhat and dy for the error scale, the prediction's for its noise),
    and counted beyond their full tolerance many at a time: the numbers _beyond forms at them."""

    def __init__(self, case: Case, lean: Lean) -> None:
        self.case, self.lean = case, lean
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.size = 0

    def add(self, rows: tuple, positions: np.ndarray, values: tuple[np.ndarray, ...]) -> None:
        """``values``: a block's p, |a - p| (fresh float64 arrays) and the prediction's xhat and dy ((n, C, s) arrays,
        dy possibly as stored: Lean.at)."""
        case, lean = self.case, self.lean
        p, off, xhat, dy = values
        n, channels, s = p.shape
        index = np.unravel_index(positions, p.shape)
        p, off = p.reshape(-1)[positions], off.reshape(-1)[positions]
        xhat, dy = xhat[index], to_float64(dy[index])
        channel = positions // s % channels
        case_xhat = xhat if lean.case_xhat else case.xhat_gathered(rows, index, channel)
        case_dy = dy if lean.case_dy else case.dy_gathered(rows, index)
        reference = case.outputs["diff_src"].reference_at_positions(rows, index)
        self.parts.append((channel, off, p, reference, case_xhat, case_dy, xhat, dy))
        self.size += positions.size

    def count(self) -> int:
        """How many of the gathered elements are beyond K units of the prediction (then none is held)."""
        if not self.parts:
            return 0
        channel, off, p, r, case_xhat, case_dy, xhat, dy = (np.concatenate(v) for v in zip(*self.parts))
        self.parts, self.size = [], 0
        scale = self.case.model.at(channel, case_xhat, case_dy, r)
        tolerance = prediction_tolerance(self.case, "diff_src", p, r, self.lean.noise(channel, xhat, dy), scale)
        return int(np.count_nonzero(~(off <= tolerance)))


def _block_squares(out: Output, rows: tuple, a: np.ndarray, p: np.ndarray, dtype: str) -> float:
    """sum_of_squares(out.where(a, rows), rounded(out.where(p, rows), dtype)): the same differences, in the same order,
    taken from the whole block when most elements are measured, else gathered first."""
    with np.errstate(invalid="ignore", over="ignore"):
        if not out.some_beyond:
            d = a - rounded(p, dtype)
        else:
            mask = out.beyond[rows]
            measured = int(np.count_nonzero(mask))
            if measured == mask.size:
                d = a - rounded(p, dtype)
            elif 2 * measured > mask.size:
                d = (a - rounded(p, dtype))[mask]
            else:
                d = a[mask] - rounded(p[mask], dtype)
        d = d.reshape(-1)
        total = float(np.dot(d, d))
    if math.isfinite(total):  # (every difference finite: no element to leave out)
        return total
    return sum_of_squares(d, 0.0)


def _cheap(case: Case) -> bool:
    """Is diff_src's tolerance a number wherever its noise is (_sound, and the reference finite everywhere)? Then
    an element within K*u*|p| of the prediction passes without its tolerance formed (_confirmed_lean)."""
    return _sound(case) and case.once("reference_finite", lambda: _finite(case.outputs["diff_src"].expected))


def _finite(array: np.ndarray) -> bool:
    """Is every element of an (N, C, S) view finite (checked chunk by chunk)?"""
    return all(bool(np.isfinite(array[part]).all()) for part in chunks(array.shape))


def _beyond(case: Case, rows: tuple, values: tuple[np.ndarray, np.ndarray], extra: np.ndarray | None,
            cheap: bool) -> int:
    """How many elements of a block of diff_src are beyond K units of the prediction p (values: a, possibly as
    stored (case.operand), and p there). The tolerance is K*(max(scale, extra) + u|p| + u*sqrt(M)*|p - r|) + ulp(p),
    a sum of non-negative terms, so it is at least K*(u|p|) wherever it is not NaN: an element within that passes,
    and the scale, the costliest term, is formed only at the others, with the reference, xhat and dy gathered
    there. Where the tolerance could be NaN (``cheap`` False: a non-finite reference or ingredient of the scale; or
    a non-finite noise) every element is tested in full. The same count either way. Flushed subnormals (the judge
    let them pass) are not counted."""
    a, p = values
    out = case.outputs["diff_src"]
    k = out.comparison.scaled.max_units
    with np.errstate(invalid="ignore", over="ignore"):
        off = np.abs(a - p)
        elementwise = extra is None or np.shape(extra) == p.shape
        if not (elementwise and cheap and (extra is None or np.isfinite(extra).all())):
            tolerance = prediction_tolerance(case, "diff_src", p, out.reference_at(rows), extra, case.scale_at(rows))
            return int(np.count_nonzero(~(off <= tolerance) & out.kept(rows)))
        outside = ~(off <= k * (case.unit * np.abs(p)))
        if out.flushed is not None:
            outside &= out.kept(rows)
        unsure = np.flatnonzero(outside)
        if unsure.size == 0:
            return 0
        n, channels, s = p.shape
        channel = unsure // s % channels
        index = np.unravel_index(unsure, p.shape)
        xhat, dy = case.xhat_gathered(rows, index, channel), case.dy_gathered(rows, index)
        r_at, p_at = out.reference_at_positions(rows, index), p.reshape(-1)[unsure]
        scale = case.model.at(channel, xhat, dy, r_at)
        tolerance = prediction_tolerance(case, "diff_src", p_at, r_at, None if extra is None else extra.reshape(-1)[unsure], scale)
        return int(np.count_nonzero(~(off.reshape(-1)[unsure] <= tolerance)))


def _sound(case: Case) -> bool:
    """Is diff_src's error scale a number (>= 0, not NaN) wherever the reference is finite, and K >= 0? Every
    channel's xhat and dy finite (their norms are) and its coefficients finite (computed once a case)."""
    def sound() -> bool:
        model, facts = case.model, case.facts
        values = (facts.norm_gamma, facts.norm_beta, model.base, model.per_xhat, model.per_dy)
        k = case.outputs["diff_src"].comparison.scaled.max_units
        return bool(all(np.isfinite(v).all() for v in values) and k >= 0 and case.unit >= 0)
    return case.once("scale_sound", sound)
