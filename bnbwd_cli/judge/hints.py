"""Likely causes of a failure, named from the shape of the deviation.

diff_src's per-channel fit d = offset + slope*xhat + scale*r (judge/bias.py) is compared with what
each usual bug predicts, in closed form from the per-channel facts (k = gamma*invstd, B = diff_beta,
G = diff_gamma, M):

- missing 1/M:            offset = -k*B*(1 - 1/M), slope = -k*G*(1 - 1/M)
- inference-style:        offset = k*B/M,          slope = k*G/M
- invstd scaled by q (a wrong epsilon, an unbiased variance): scale = q - 1
- mean moved by dm (rounded to a narrower type): offset = k*dm*invstd*G/M, slope = k*dm*invstd*B/M
- a sign flip:            scale = -2 in that channel

A hypothesis is named when it accounts for at least 90% of the fitted deviation (75% for scales and the mean,
whose per-channel estimates carry rounding noise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from bnbwd_cli.dtypes import exact_narrower
from bnbwd_cli.judge.bias import ChannelFit
from bnbwd_cli.judge.model import ChannelFacts
from bnbwd_cli.judge.stats import Comparison

if TYPE_CHECKING:
    from bnbwd_cli.core import Op

_EPSILONS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 0.0)


def _explains(fitted: np.ndarray, predicted: np.ndarray, share: float) -> bool:
    """Does `predicted` account for `share` of `fitted` (rows: channels, columns: effect sizes)?"""
    usable = np.all(np.isfinite(fitted), axis=1) & np.all(np.isfinite(predicted), axis=1)
    size = np.abs(fitted[usable]).sum()
    return bool(size > 0 and np.abs(fitted[usable] - predicted[usable]).sum() <= (1 - share) * size)


def _variance(facts: ChannelFacts, inputs: Op) -> np.ndarray:
    return 1.0 / facts.invstd**2 - (0.0 if inputs.variance_is_invstd else inputs.epsilon)


def _scale_cause(scale: np.ndarray, facts: ChannelFacts, inputs: Op) -> str | None:
    """An unbiased variance or another epsilon that explains per-channel scales of invstd."""
    usable = np.isfinite(scale)
    if not usable.any() or inputs.variance_is_invstd:
        return None
    v, m, eps = _variance(facts, inputs), facts.count, inputs.epsilon
    if m > 1:
        q = np.sqrt((v + eps) / (v * m / (m - 1) + eps))
        if _explains(scale[usable, None], (q - 1)[usable, None], 0.75):
            return f"an unbiased variance (divided by M-1 = {m - 1}, not M) explains the scale"
    for candidate in _EPSILONS:
        if candidate == eps:
            continue
        q = np.sqrt((v + eps) / (v + candidate))
        if _explains(scale[usable, None], (q - 1)[usable, None], 0.75):
            return f"an epsilon of {candidate:g} (you passed {eps:g}) explains the scale"
    return None


def diff_src_hints(comparison: Comparison, fit: ChannelFit, facts: ChannelFacts, inputs: Op) -> tuple[str, ...]:
    """Causes for a failing (or systematically scaled) diff_src."""
    if comparison.passed and comparison.bias is None:
        return ()
    if comparison.passed and not comparison.bias.significant:
        return ()
    hints: list[str] = []
    k, b, g, m = facts.scale, facts.diff_beta, facts.diff_gamma, max(facts.count, 1)
    fitted = np.stack([fit.offset, fit.slope * fit.rms_xhat, fit.scale * fit.rms_reference], axis=1)

    def predicted(offset, slope, scale=0.0) -> np.ndarray:
        shape = fit.offset.shape
        return np.stack([np.broadcast_to(offset, shape), np.broadcast_to(slope, shape) * fit.rms_xhat,
                         np.broadcast_to(scale, shape) * fit.rms_reference], axis=1)

    if inputs.training and m > 1 and _explains(fitted, predicted(-k * b * (1 - 1 / m), -k * g * (1 - 1 / m)), 0.9):
        hints.append(f"missing 1/M: diff_src's mean terms are M = {m} times too large (sums not divided by M)")
    elif inputs.training and _explains(fitted, predicted(k * b / m, k * g / m), 0.9):
        hints.append("inference-style backward in training: diff_src = gamma*invstd*diff_dst, without the mean terms")
    clean = fit.residual_rms < 0.1 * np.abs(fit.scale) * fit.rms_reference  # the scale is the whole story there
    flipped = [int(c) for c in np.flatnonzero((np.abs(fit.scale + 2) < 0.05) & clean)]
    if flipped:
        hints.append(f"sign flipped in channel(s) {', '.join(f'c={c}' for c in flipped[:8])}: actual = -reference there")
    if comparison.bias is not None and comparison.bias.significant:
        cause = _scale_cause(fit.scale, facts, inputs)
        if cause:
            hints.append(cause)
    hints += _mean_hints(comparison, fitted, predicted, facts, inputs)
    if comparison.mismatch_fraction > 0.5 and not hints:
        hints += _layout_hint(inputs)
    return tuple(hints)


def _mean_hints(comparison, fitted, predicted, facts: ChannelFacts, inputs: Op) -> list[str]:
    """A mean rounded to a narrower type, or errors that grow with |mean|/sd (the kernel cancels)."""
    k, b, g, m = facts.scale, facts.diff_beta, facts.diff_gamma, max(facts.count, 1)
    for name, dtype in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
        with np.errstate(over="ignore"):
            shift = facts.mean.astype(dtype).astype(np.float64) - facts.mean
        if not np.any(shift) or not np.all(np.isfinite(shift)):
            continue
        g_moved = g - shift * facts.invstd * b
        if _explains(fitted, predicted(k * shift * facts.invstd * g_moved / m, k * shift * facts.invstd * b / m), 0.75):
            return [f"the kernel used the mean rounded to {name}: pass it the mean it used (or compute xhat from the "
                    "mean as passed)"]
    if comparison.channels is None or len(comparison.channels) < 4:
        return []
    ratio = np.array([ch.max_ratio for ch in comparison.channels])
    offset = np.abs(facts.mean) * facts.invstd
    usable = np.isfinite(ratio) & (ratio > 0) & (offset > 0)
    if usable.sum() >= 4 and offset[usable].max() >= 10 * offset[usable].min():
        rank_r, rank_o = np.argsort(np.argsort(ratio[usable])), np.argsort(np.argsort(offset[usable]))
        if np.corrcoef(rank_r, rank_o)[0, 1] > 0.8 and comparison.mismatches:
            return ["errors grow with |mean|/sd across channels: the kernel cancels (e.g. sum(x*dy) - mean*sum(dy) "
                    "instead of sum((x - mean)*dy)), or it used a mean rounded to a narrower type than the one passed"]
    return []


def _layout_hint(inputs: Op) -> list[str]:
    shape = inputs.src.shape
    channels = inputs.mean.shape[0]
    if inputs.data_format == "NXC" and len(shape) > 2 and shape[1] == channels:
        return [f"wrong almost everywhere and src's axis 1 also has C = {channels} elements: did the kernel read "
                "NHWC data as NCHW?"]
    if inputs.data_format == "NCX" and len(shape) > 2 and shape[-1] == channels:
        return [f"wrong almost everywhere and src's last axis also has C = {channels} elements: did the kernel read "
                "NCHW data as NHWC?"]
    return []


def sum_hints(output: str, comparison: Comparison, actual: np.ndarray, reference: np.ndarray, facts: ChannelFacts,
              inputs: Op) -> tuple[str, ...]:
    """Causes for a failing diff_gamma or diff_beta ((C,) float64 arrays)."""
    if comparison.passed:
        return ()
    hints: list[str] = []
    usable = np.isfinite(actual) & np.isfinite(reference) & (reference != 0)
    if usable.any():
        ratio = np.median(actual[usable] / reference[usable])
        m = facts.count
        if m > 1 and abs(ratio * m - 1) < 0.05:
            hints.append(f"{output} is {m} = M times too small: the mean over M, not the sum")
        elif m > 1 and abs(ratio / m - 1) < 0.05:
            hints.append(f"{output} is M = {m} times too large")
        flipped = [int(c) for c in np.flatnonzero(usable & (np.abs(actual + reference) <= 1e-3 * np.abs(reference)))]
        if flipped:
            hints.append(f"sign flipped in channel(s) {', '.join(f'c={c}' for c in flipped[:8])}")
        errors = np.abs(actual[usable] / reference[usable] - 1)
        relative = np.median(errors)
        uneven = errors.std() > 0.3 * relative  # a wrong scale moves every channel alike; a 16-bit sum does not
        if m >= 64 and 2.0**-11 <= relative <= 2.0**-3 and uneven and not hints:
            hints.append(f"relative error ~{relative:.0e} per channel, the precision of bfloat16/float16: "
                         "were the sums accumulated in a 16-bit type?")
    if output == "diff_gamma" and comparison.bias is not None and comparison.bias.significant and usable.any():
        scale = np.where(usable, actual / np.where(usable, reference, 1.0) - 1, np.nan)
        cause = _scale_cause(scale, facts, inputs)
        if cause:
            hints.append(cause)
    if output == "diff_beta" and not hints:
        hints.append("diff_beta = sum of diff_dst over N and the spatial axes, per channel: check the reduction axes "
                     "and the layout (--format)")
    return tuple(hints)


def precision_hints(comparison: Comparison, actual: np.ndarray) -> tuple[str, ...]:
    """A failing f32/f64 output whose every element is exactly a bf16 (or f16) value: it was made in that
    precision and upcast, so it is being held to the wider format's tolerance."""
    if comparison.passed:
        return ()
    narrower = exact_narrower(actual)
    if narrower is None or narrower == comparison.dtype:
        return ()
    name = {"bf16": "bfloat16", "f16": "float16"}[narrower]
    bits = " (or its int16 bits, read with --bf16 KEY)" if narrower == "bf16" else ""
    return (f"every element of actual is exactly a {name} value although it is stored as {comparison.actual_dtype}: "
            f"the kernel computed it in {narrower} and upcast it, and it is judged at {comparison.dtype} precision; "
            f"save the {name} tensor itself{bits} to judge it as {narrower}",)
