"""The float64 oracle: the formula in the plainest NumPy, one channel at a time.

Slow on purpose and kept apart from the fast core: tests compare the core against it.
Sums use math.fsum (exactly rounded), so the oracle's own error is a few ulps of float64.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.layout import channel_axis

if TYPE_CHECKING:
    from bnbwd_cli.op import Op


def exact_sum(values: np.ndarray) -> float:
    """Correctly rounded sum; with inf/nan among the values, fsum refuses, and IEEE order does."""
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return float(np.sum(values))


def reference_backward(op: Op) -> dict[str, np.ndarray]:
    """diff_src (shape of src), diff_gamma and diff_beta (C,), all float64, for the op's inputs (core.Op)."""
    src, diff_dst, mean, variance, gamma = op.src, op.diff_dst, op.mean, op.variance, op.gamma
    epsilon, data_format, training, variance_is_invstd = op.epsilon, op.data_format, op.training, op.variance_is_invstd
    axis = channel_axis(data_format, src.ndim)
    x = np.moveaxis(to_float64(src), axis, -1)
    dy = np.moveaxis(to_float64(diff_dst), axis, -1)
    channels = x.shape[-1]
    count = math.prod(x.shape[:-1])  # not reshape(-1, C): that is ambiguous when C = 0
    x = x.reshape(count, channels)
    dy = dy.reshape(count, channels)
    mean64, var64 = to_float64(mean), to_float64(variance)
    gamma64 = np.ones(channels) if gamma is None else to_float64(gamma)

    diff_src = np.empty_like(x)
    diff_gamma = np.zeros(channels)
    diff_beta = np.zeros(channels)
    for c in range(channels):
        invstd = var64[c] if variance_is_invstd else 1.0 / math.sqrt(var64[c] + epsilon)
        xhat = (x[:, c] - mean64[c]) * invstd
        diff_beta[c] = exact_sum(dy[:, c])
        diff_gamma[c] = exact_sum(dy[:, c] * xhat)
        if training and count:
            diff_src[:, c] = gamma64[c] * invstd * (dy[:, c] - diff_beta[c] / count - xhat * diff_gamma[c] / count)
        else:
            diff_src[:, c] = gamma64[c] * invstd * dy[:, c]
    layout_shape = tuple(np.delete(src.shape, axis)) + (channels,)
    diff_src = np.moveaxis(diff_src.reshape(layout_shape), -1, axis)
    return {"diff_src": diff_src, "diff_gamma": diff_gamma, "diff_beta": diff_beta}
