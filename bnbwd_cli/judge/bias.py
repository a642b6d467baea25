"""Systematic deviations: a scale of actual vs reference beyond what rounding noise allows.

A wrong epsilon, an unbiased variance or a mean rounded to a narrower type moves every element of a
channel the same way by a fraction of an ulp: each element stays within tolerance, the channel as a
whole does not. Per channel c, diff_src's deviation d = a - r is fitted by least squares to

    d ~ offset + slope * xhat + scale * r

(offset and slope absorb the errors of a correct kernel's two sums, which shift whole channels;
``scale`` is what no correct kernel produces beyond a few roundings). Its standard error comes from
the fit's own residuals. The channel estimates are pooled (inverse-variance weights) into one
overall scale. For (C,) outputs (diff_gamma, diff_beta) one scale is fitted over the channels, with
the error model's scale as the noise. A scale fails when it is more than BIAS_Z standard errors from
zero *and* larger than BIAS_FLOOR_UNITS unit roundoffs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge.stats import Bias
from bnbwd_cli.judge.tolerance import BIAS_FLOOR_UNITS, BIAS_Z

MIN_ELEMENTS = 8  # fewer elements per channel than this: no per-channel estimate
MIN_CHANNELS = 4  # fewer channels than this: no scale for a (C,) output


@dataclass(frozen=True)
class ChannelFit:
    """Per-channel least-squares coefficients of d = offset + slope*xhat + scale*r (NaN where undefined)."""

    offset: np.ndarray
    slope: np.ndarray
    scale: np.ndarray
    stderr: np.ndarray  # of scale
    residual_rms: np.ndarray  # rms of d after the fit
    rms_xhat: np.ndarray
    rms_reference: np.ndarray


class ChannelRegression:
    """Sums of products of the basis [1, xhat, r] and d, per channel, over blocks."""

    def __init__(self, channels: int) -> None:
        self.gram = np.zeros((channels, 3, 3))
        self.rhs = np.zeros((channels, 3))
        self.dd = np.zeros(channels)

    def add(self, xhat: np.ndarray, reference: np.ndarray, deviation: np.ndarray, channels: slice, usable: np.ndarray) -> None:
        """Blocks of shape (n, c, s); `usable` masks finite elements."""
        w = usable.astype(np.float64)
        basis = (w, np.where(usable, xhat, 0.0), np.where(usable, reference, 0.0))
        d = np.where(usable, deviation, 0.0)
        for i in range(3):
            self.rhs[channels, i] += np.einsum("ncs,ncs->c", basis[i], d)
            for j in range(i, 3):
                value = np.einsum("ncs,ncs->c", basis[i], basis[j])
                self.gram[channels, i, j] += value
                if i != j:
                    self.gram[channels, j, i] += value
        self.dd[channels] += np.einsum("ncs,ncs->c", d, d)

    def fit(self) -> ChannelFit:
        count = self.gram[:, 0, 0]
        norms = np.sqrt(np.diagonal(self.gram, axis1=1, axis2=2))
        safe = np.where(norms > 0, norms, 1.0)
        gram = self.gram / safe[:, :, None] / safe[:, None, :]  # unit diagonal: better conditioned
        rhs = self.rhs / safe
        ok = (count >= MIN_ELEMENTS) & np.all(norms > 0, axis=1)
        ok &= np.abs(np.linalg.det(np.where(ok[:, None, None], gram, np.eye(3)))) > 1e-12
        inverse = np.linalg.inv(np.where(ok[:, None, None], gram, np.eye(3)))
        coef = np.einsum("cij,cj->ci", inverse, rhs)
        sse = np.maximum(self.dd - np.einsum("ci,ci->c", coef, rhs), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = sse / np.maximum(count - 3, 1)
            stderr = np.sqrt(variance * inverse[:, 2, 2]) / safe[:, 2]
            coef = coef / safe
            rms = np.sqrt(variance)
            rms_x = norms[:, 1] / np.sqrt(np.maximum(count, 1))
            rms_r = norms[:, 2] / np.sqrt(np.maximum(count, 1))
        nan = np.where(ok, 1.0, np.nan)
        return ChannelFit(coef[:, 0] * nan, coef[:, 1] * nan, coef[:, 2] * nan, stderr * nan, rms * nan, rms_x, rms_r)


def pooled_bias(scale: np.ndarray, stderr: np.ndarray, unit: float) -> Bias | None:
    """Pool per-channel scales into one; flag the overall scale and each significant channel."""
    usable = np.isfinite(scale) & np.isfinite(stderr)
    if not usable.any():
        return None
    floor = BIAS_FLOOR_UNITS * unit
    se = np.maximum(stderr[usable], unit * 1e-3)  # a perfect fit has no residual: still not infinitely sure
    weights = 1.0 / se**2
    overall = float(np.sum(weights * scale[usable]) / np.sum(weights))
    overall_se = float(1.0 / np.sqrt(np.sum(weights)))
    threshold = max(BIAS_Z * overall_se, floor)
    flagged = tuple(
        (int(c), float(scale[c]), float(max(stderr[c], unit * 1e-3)))
        for c in np.flatnonzero(usable)
        if abs(scale[c]) > max(BIAS_Z * max(stderr[c], unit * 1e-3), floor)
    )
    significant = bool(abs(overall) > threshold or flagged)
    return Bias(overall, overall_se, threshold, significant, flagged)


def vector_bias(actual: np.ndarray, reference: np.ndarray, noise: np.ndarray, unit: float) -> Bias | None:
    """One scale over the channels of a (C,) output: actual ~ (1 + scale) * reference, noise = its sd."""
    usable = np.isfinite(actual) & np.isfinite(reference) & (noise > 0) & (reference != 0)
    if usable.sum() < MIN_CHANNELS:
        return None
    r, d, w = reference[usable], actual[usable] - reference[usable], 1.0 / noise[usable] ** 2
    information = float(np.sum(w * r * r))
    scale = float(np.sum(w * r * d) / information)
    stderr = 1.0 / np.sqrt(information)
    threshold = max(BIAS_Z * stderr, BIAS_FLOOR_UNITS * unit)
    return Bias(scale, float(stderr), float(threshold), bool(abs(scale) > threshold), ())
