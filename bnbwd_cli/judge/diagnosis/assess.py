"""The test every hypothesis must pass: ``assess`` accepts a prediction only when it explains the whole run down to
rounding noise:

- every output, suspicious or not, is within K units of the prediction, where the unit is the error
  model's scale of a correct kernel (judge/model.py) widened by the roundings of the predicted values
  themselves (u*|p|) and of the bug's larger sums (u*sqrt(M)*|p - r|), plus one ulp of the output dtype;
- every output that failed element-wise has >= MIN_SHARE of its deviation explained:
  1 - ||a - p|| / ||a - r|| (the number a hint reports);
- every output with a significant systematic deviation but no element beyond K units (where the share above
  says nothing: the deviation is rounding-sized) has none left after the prediction is taken out
  (the same least-squares fit and threshold as judge/bias.py), and its scale shrank by >= MIN_SCALE_SHARE
  or what is left is within 3 standard errors of zero.

The (C,) sums are tested first (cheap: they reject most hypotheses), then diff_src on the screening sample
(judge/diagnosis/sample.py: what the sample rejects the whole run would reject too), and only then on the whole
run, block by block, its share and its count beyond K units in one walk that stops at the first block where too
many elements are beyond (``confirmed``): the prediction's diff_src is never held whole for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name, dtype_name, to_float64, ulp_spacing
from bnbwd_cli.judge.bias import ChannelRegression, pooled_bias, vector_bias
from bnbwd_cli.judge.diagnosis.case import Case, Output
from bnbwd_cli.judge.diagnosis.prediction import Assessment, Lean, Prediction, blocks, chunks
from bnbwd_cli.judge.diagnosis.sample import screening_sample

MIN_SHARE = 0.9  # of an element-wise failure's deviation a hypothesis must explain
MIN_SCALE_SHARE = 0.75  # of a systematic scale (its estimate carries the fit's noise)
SCREEN_SLACK = 1e-6  # the sample's tolerance widened by this (relative): the screen never rejects what the whole accepts
SAMPLE = 1 << 16  # diff_src elements of _sample_agrees' strided look


def _tolerance(case: Case, name: str, p: np.ndarray, r: np.ndarray, extra: np.ndarray | None,
               base: np.ndarray | None = None) -> np.ndarray:
    """K units of the prediction's noise plus one ulp of p; ``base``: the correct kernel's scale where p lies
    (default: the sum's; diff_src's callers give it)."""
    out = case.outputs[name]
    if base is None:
        base = case.sum_scale(name)
    if extra is not None:
        base = np.maximum(base, extra)
    u, root = case.unit, math.sqrt(max(case.count, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        noise = base + u * np.abs(p) + u * root * np.abs(p - r)
        return out.comparison.scaled.max_units * noise + ulp_spacing(p, out.comparison.dtype)


def rounded(p: np.ndarray, dtype: str) -> np.ndarray:
    """The prediction rounded to the output's dtype, as the kernel rounds its own values (float64 out)."""
    if dtype == "f64":
        return p
    with np.errstate(invalid="ignore", over="ignore"):
        return p.astype(dtype_from_name({"f32": "float32", "f16": "float16"}.get(dtype, dtype))).astype(np.float64)


def _squares(a: np.ndarray, q: np.ndarray | float) -> float:
    """The sum of squares of the finite a - q (flat)."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.reshape(a - q, -1)
    d = np.where(np.isfinite(d), d, 0.0)
    return float(np.dot(d, d))


def share_explained(out: Output, p: np.ndarray) -> float:
    """1 - ||a - p|| / ||a - r|| with p rounded to the output's dtype (as a and r are), over the elements
    beyond K units of the reference (all when none is): the share of the deviation the prediction accounts
    for, not diluted by the rounding noise of the elements the bug left alone. (diff_src: ``confirmed``.)"""
    after = math.sqrt(_squares(out.where(out.actual), out.where(rounded(p, out.comparison.dtype))))
    return _share(out.deviation_norm, after)


def _share(before: float, after: float) -> float:
    return 1.0 - after / before if before > 0 else 0.0


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
    return _share(out.deviation_norm, math.sqrt(squares)) if share else math.nan


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
    return _share(out.deviation_norm, math.sqrt(squares)) if share else math.nan


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
        tolerance = _tolerance(self.case, "diff_src", p, r, self.lean.noise(channel, xhat, dy), scale)
        return int(np.count_nonzero(~(off <= tolerance)))


def _block_squares(out: Output, rows: tuple, a: np.ndarray, p: np.ndarray, dtype: str) -> float:
    """_squares(out.where(a, rows), rounded(out.where(p, rows), dtype)): the same differences, in the same order,
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
    return _squares(d, 0.0)


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
            tolerance = _tolerance(case, "diff_src", p, out.reference_at(rows), extra, case.scale_at(rows))
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
        tolerance = _tolerance(case, "diff_src", p_at, r_at, None if extra is None else extra.reshape(-1)[unsure], scale)
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


def _whole_rows(p: np.ndarray, extra: np.ndarray | None) -> Rows:
    """``at`` for a whole prediction array and its noise (element-wise, or applied as it is)."""
    elementwise = extra is not None and np.shape(extra) == p.shape
    return lambda rows: (p[rows], extra[rows] if elementwise else extra)


def within(case: Case, name: str, p: np.ndarray, extra: np.ndarray | None = None) -> bool:
    """Is the actual output within K units of ``p`` (as many elements beyond as the judge allows)?"""
    out = case.outputs[name]
    if name == "diff_src":
        return confirmed(case, _whole_rows(p, extra), share=False) is not None
    with np.errstate(invalid="ignore", over="ignore"):
        beyond = ~(np.abs(out.actual - p) <= _tolerance(case, name, p, out.reference, extra)) & out.kept()
    return int(np.count_nonzero(beyond)) <= out.comparison.allowed_mismatches


def screened(case: Case, prediction: Prediction) -> bool:
    """The first look at diff_src: False when the prediction misses the actual output beyond K units at more
    elements of the screening sample than the judge allows in the whole output. The sample is part of the whole
    and its numbers are the whole's (the same formulas element for element; the tolerance widened by
    SCREEN_SLACK), so what this rejects ``within`` would reject too: only the survivors are computed in full."""
    out = case.outputs.get("diff_src")
    if out is None or prediction.diff_src is None:
        return True
    sample = screening_sample(case)
    p, extra = prediction.rows(sample.rows)
    if extra is not None and np.shape(extra) != np.shape(p):
        return True  # its noise has no element-wise form to take the sample of
    with np.errstate(invalid="ignore", over="ignore"):
        tolerance = _tolerance(case, "diff_src", p, sample.reference, extra, sample.scale) * (1 + SCREEN_SLACK)
        beyond = ~(np.abs(sample.actual - p) <= tolerance) & out.kept(sample.rows)
    return int(np.count_nonzero(beyond)) <= out.comparison.allowed_mismatches


def _sample_agrees(case: Case, prediction: Prediction) -> bool:
    """Does the prediction explain MIN_SHARE - 0.1 of the deviation on a sample of about SAMPLE elements
    (every few samples and spatial positions, every channel)?"""
    out = case.outputs["diff_src"]
    n, _, s = case.shape
    factor = -(-math.prod(case.shape) // SAMPLE)
    if factor <= 1:
        return True
    step_n = min(n, factor)
    step_s = min(s, -(-factor // step_n))
    rows = (slice(0, n, step_n), slice(None), slice(0, s, step_s))
    a, r, p = out.actual_at(rows), out.reference_at(rows), prediction.rows(rows)[0]
    beyond = out.beyond[rows]
    if beyond.any():
        a, r, p = a[beyond], r[beyond], p[beyond]
    before, after = math.sqrt(_squares(a, r)), math.sqrt(_squares(a, rounded(p, out.comparison.dtype)))
    return _share(before, after) >= MIN_SHARE - 0.1


def _whole_src(case: Case, prediction: Prediction) -> np.ndarray:
    """The prediction's whole diff_src (computed chunk by chunk): for the tests that need it whole."""
    prediction.resolve_in_chunks(case.shape)
    return prediction.of("diff_src")


def _bias_left(case: Case, name: str, p: np.ndarray):
    """The systematic deviation of actual from ``p`` (judge/bias.py's fit and threshold), or None."""
    out = case.outputs[name]
    # d = a - p against the reference's basis, p rounded to the output's grid as a and r are (else every
    # element carries p's distance to the grid, noise that a - r does not have)
    shifted = out.actual - rounded(p, out.comparison.dtype) + out.reference
    if out.flushed is not None:  # a flushed subnormal passed: no deviation there
        shifted = np.where(out.flushed, out.reference, shifted)
    if name == "diff_src":
        regression = ChannelRegression(case.channels, out.comparison.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            regression.add(case.xhat, out.reference, shifted, case.dy, slice(0, case.channels))
        fit = regression.fit()
        return pooled_bias(fit.scale, fit.stderr, case.unit)
    noise = case.sum_scale(name) + ulp_spacing(out.reference, out.comparison.dtype) / 2
    sys_beta, sys_gamma = case.facts.systematic(case.unit)
    return vector_bias(shifted, out.reference, noise, case.unit, sys_gamma if name == "diff_gamma" else sys_beta)


def _bias_share(case: Case, name: str, p: np.ndarray) -> float | None:
    """The share of a significant systematic deviation that ``p`` explains, or None when what is left is
    still significant or more than noise (3 standard errors) and MIN_SCALE_SHARE of the original."""
    before = case.outputs[name].comparison.bias
    left = _bias_left(case, name, p)
    if left is None:
        return 1.0
    if left.significant:
        return None
    if abs(before.scale) <= before.threshold:  # only single channels were flagged, and none is now
        return 1.0
    share = 1.0 - abs(left.scale) / abs(before.scale)
    if share < MIN_SCALE_SHARE and abs(left.scale) > 3 * left.stderr:
        return None
    return max(share, 0.0)


def _diff_src_share(case: Case, prediction: Prediction) -> tuple[bool, float | None]:
    """(whether the prediction changes diff_src, the share it explains: NaN when diff_src did not fail, None when
    it is rejected)."""
    out = case.outputs["diff_src"]
    if prediction.diff_src is None:
        if out.failed and dtype_name(out.expected.dtype) == out.comparison.dtype:
            return False, 0.0  # the reference on the output's grid explains none of a failure: no walk to say so
        return False, confirmed(case, lambda rows: (out.reference_at(rows), None), out.failed)
    if not screened(case, prediction):
        return True, None
    if out.failed and not _sample_agrees(case, prediction):
        return True, None
    return True, confirmed(case, prediction.rows, out.failed, prediction.lean)


def assess(case: Case, prediction: Prediction) -> Assessment | None:
    """The shares explained when ``prediction`` explains the whole run down to rounding noise, else None."""
    shares: dict[str, float] = {}
    changed = False
    # the (C,) sums first: cheap, and they reject most hypotheses before diff_src is computed
    names = sorted(case.outputs, key=lambda n: n == "diff_src")
    for name in names:
        out = case.outputs[name]
        if name == "diff_src":
            changes, share = _diff_src_share(case, prediction)
            changed |= changes
            if share is None or (out.failed and share < MIN_SHARE):
                return None
            if out.failed:
                shares[name] = share
            continue
        p = prediction.of(name)
        if p is None:
            p = out.reference
        else:
            changed = True
        if out.failed:
            shares[name] = share_explained(out, p)
            if shares[name] < MIN_SHARE:
                return None
        if not within(case, name, p, prediction.noise(name)):
            return None
    for name in names:  # the systematic deviations of outputs within K units last: a least-squares pass each
        out = case.outputs[name]
        if out.biased and not out.failed:
            if name == "diff_src":
                p = out.reference if prediction.diff_src is None else _whole_src(case, prediction)
            else:
                p = prediction.of(name)
                p = out.reference if p is None else p
            share = _bias_share(case, name, p)
            if share is None:
                return None
            shares[name] = min(shares.get(name, 1.0), share)
    if not changed or not shares:
        return None
    statistical = not any(out.failed for out in case.outputs.values())
    return Assessment(shares, statistical, _misses(case, prediction) if statistical else 1.0)


def _misses(case: Case, prediction: Prediction) -> float:
    """Share of the suspicious outputs' elements whose actual value is not the prediction rounded to the
    output's grid: when every element is within an ulp, what tells two explanations of a scale apart."""
    differ = total = 0
    for name, out in case.outputs.items():
        if not out.suspicious:
            continue
        if name == "diff_src":
            for rows in blocks(case.shape):
                p = out.reference_at(rows) if prediction.diff_src is None else prediction.rows(rows)[0]
                differ += int(np.count_nonzero(out.actual_at(rows) != rounded(p, out.comparison.dtype)))
        else:
            p = prediction.of(name)
            p = out.reference if p is None else rounded(p, out.comparison.dtype)
            differ += int(np.count_nonzero(out.actual != p))
        total += out.actual.size if name != "diff_src" else math.prod(case.shape)
    return differ / total if total else 1.0
