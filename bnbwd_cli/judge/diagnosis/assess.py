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
many elements are beyond (``confirmed``, judge/diagnosis/whole_run.py): the prediction's diff_src is never held
whole for it. How a prediction is measured (its tolerance, rounding, share explained): judge/diagnosis/measures.py.
"""

from __future__ import annotations

import math

import numpy as np

from bnbwd_cli.dtypes import dtype_name, ulp_spacing
from bnbwd_cli.judge.bias import ChannelRegression, pooled_bias, vector_bias
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Assessment, Prediction, blocks
from bnbwd_cli.judge.diagnosis.measures import explained, prediction_tolerance, rounded, share_explained, sum_of_squares
from bnbwd_cli.judge.diagnosis.sample import screening_sample
from bnbwd_cli.judge.diagnosis.whole_run import Rows, confirmed

MIN_SHARE = 0.9  # of an element-wise failure's deviation a hypothesis must explain
MIN_SCALE_SHARE = 0.75  # of a systematic scale (its estimate carries the fit's noise)
SCREEN_SLACK = 1e-6  # the sample's tolerance widened by this (relative): the screen never rejects what the whole accepts
SAMPLE = 1 << 16  # diff_src elements of _sample_agrees' strided look


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
        beyond = ~(np.abs(out.actual - p) <= prediction_tolerance(case, name, p, out.reference, extra)) & out.kept()
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
        tolerance = prediction_tolerance(case, "diff_src", p, sample.reference, extra, sample.scale) * (1 + SCREEN_SLACK)
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
    before, after = math.sqrt(sum_of_squares(a, r)), math.sqrt(sum_of_squares(a, rounded(p, out.comparison.dtype)))
    return explained(before, after) >= MIN_SHARE - 0.1


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
