"""A zoo of batch-norm backward kernels in plain NumPy: correct ones in float32 with different
accumulation orders, and planted bugs. Used by tests/test_zoo.py and scripts/calibrate_tolerances.py.

A correct kernel here does what PyTorch, TF and oneDNN do on a CPU: upcast reduced-precision inputs
to float32, compute invstd and xhat = (x - mean) * invstd in float32, reduce sum(dy) and
sum(dy * xhat) per channel in float32 in some order, write diff_src in float32 and round it once to
the input dtype; diff_gamma/diff_beta are rounded once to the parameters' dtype.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from bnbwd_cli.layout import view3

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32
ORDERS = ("sequential", "blocked", "pairwise", "float64-combine")
BUGS = (
    "missing-1/M", "sign-flip-one-channel", "per-sample-stats", "inference-in-training", "epsilon-1e-3",
    "unbiased-variance", "bf16-accumulation", "nhwc-as-nchw",
)


def make_problem(rng: np.random.Generator, shape, data_format: str, dtype, stats_dtype, *, epsilon: float = 1e-5,
                 center: float = 0.5, spread: float = 2.0, dy_offset: float = 0.0) -> dict:
    """Inputs of a training step: src with per-channel centres, diff_dst, the batch mean and
    (biased) variance of src computed in float64 and rounded to stats_dtype, gamma, epsilon."""
    axis = 1 if data_format == "NCX" else len(shape) - 1
    channels = shape[axis]
    centre_shape = [1] * len(shape)
    centre_shape[axis] = channels
    centres = rng.normal(center, 1.0, size=channels).reshape(centre_shape)
    spreads = rng.uniform(0.5, 1.5, size=channels).reshape(centre_shape) * spread
    src = (centres + spreads * rng.normal(size=shape)).astype(dtype)
    diff_dst = (dy_offset + rng.normal(size=shape)).astype(dtype)
    x64 = view3(src.astype(np.float32).astype(np.float64), data_format)
    mean = x64.mean(axis=(0, 2)) if x64.size else np.zeros(channels)
    variance = x64.var(axis=(0, 2)) if x64.size else np.ones(channels)
    return {
        "src": src,
        "diff_dst": diff_dst,
        "mean": mean.astype(stats_dtype),
        "variance": variance.astype(stats_dtype),
        "gamma": rng.uniform(0.5, 1.5, size=channels).astype(stats_dtype),
        "epsilon": epsilon,
        "data_format": data_format,
    }


def _per_channel(array: np.ndarray, data_format: str) -> np.ndarray:
    """(C, M) float32 copy, each row a channel's elements in storage order."""
    x3 = view3(array, data_format)
    return np.ascontiguousarray(x3.astype(np.float32).transpose(1, 0, 2).reshape(x3.shape[1], -1))


def _from_per_channel(rows: np.ndarray, like: np.ndarray, data_format: str) -> np.ndarray:
    shape3 = view3(like, data_format).shape
    return rows.reshape(shape3[1], shape3[0], shape3[2]).transpose(1, 0, 2).reshape(like.shape)


def channel_sums(terms: np.ndarray, order: str, block: int = 256) -> np.ndarray:
    """Per-row sums of a (C, M) float32 array in one of the orders real kernels use."""
    c, m = terms.shape
    if m == 0:
        return np.zeros(c, np.float32)
    if order == "sequential":  # one accumulator per channel, element by element
        return np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]
    if order == "pairwise":  # NumPy's own float32 pairwise sum
        return terms.sum(axis=1, dtype=np.float32)
    if order == "bf16-sequential":  # the bug: a bfloat16 accumulator
        total = np.zeros(c, np.float32)
        for k in range(m):
            total = (total + terms[:, k]).astype(BF16).astype(np.float32)
        return total
    pad = (-m) % block
    blocks = np.pad(terms, ((0, 0), (0, pad))).reshape(c, -1, block)
    partial = np.cumsum(blocks, axis=2, dtype=np.float32)[:, :, -1]  # sequential within a block
    if order == "blocked":  # block partials combined in float32, one after another
        return np.cumsum(partial, axis=1, dtype=np.float32)[:, -1]
    if order == "float64-combine":  # PyTorch CPU: float32 partials combined in float64
        return partial.astype(np.float64).sum(axis=1).astype(np.float32)
    raise ValueError(order)


def kernel(problem: dict, order: str = "sequential", bug: str | None = None, bad_channel: int = 0) -> dict:
    """diff_src (dtype of src), diff_gamma, diff_beta (dtype of mean) as a float32 kernel computes them."""
    fmt = problem["data_format"]
    src, dy = problem["src"], problem["diff_dst"]
    if bug == "nhwc-as-nchw":  # the buffer of an NHWC tensor read as NCHW (needs C == H)
        fmt = "NCX"
    x, g = _per_channel(src, fmt), _per_channel(dy, fmt)
    mean = problem["mean"].astype(np.float32)
    variance = problem["variance"].astype(np.float32)
    gamma = problem["gamma"].astype(np.float32)
    m = x.shape[1]
    eps = F32(1e-3 if bug == "epsilon-1e-3" else problem["epsilon"])
    if bug == "unbiased-variance" and m > 1:
        variance = (variance * F32(m / (m - 1))).astype(np.float32)
    invstd = (F32(1) / np.sqrt(variance + eps)).astype(np.float32)
    xhat = (x - mean[:, None]) * invstd[:, None]
    sum_order = "bf16-sequential" if bug == "bf16-accumulation" else order
    beta = channel_sums(g, sum_order)
    gam = channel_sums(g * xhat, sum_order)
    k = (gamma * invstd)[:, None]
    if bug == "per-sample-stats":  # sums over each sample's spatial positions only
        n = view3(src, fmt).shape[0]
        gs, xs = g.reshape(g.shape[0], n, -1), xhat.reshape(g.shape[0], n, -1)
        per = gs.shape[2]
        mean_dy = gs.sum(axis=2, keepdims=True, dtype=np.float32) / F32(per)
        mean_dyx = (gs * xs).sum(axis=2, keepdims=True, dtype=np.float32) / F32(per)
        diff_src = (k[:, :, None] * (gs - mean_dy - xs * mean_dyx)).reshape(g.shape)
    elif bug == "inference-in-training":
        diff_src = k * g
    else:
        divisor = F32(1) if bug == "missing-1/M" else F32(max(m, 1))
        diff_src = k * (g - (beta / divisor)[:, None] - xhat * (gam / divisor)[:, None])
    if bug == "sign-flip-one-channel":
        diff_src[bad_channel] = -diff_src[bad_channel]
    stats_dtype = problem["mean"].dtype
    return {
        "diff_src": _from_per_channel(diff_src.astype(np.float32), src, fmt).astype(src.dtype),
        "diff_gamma": gam.astype(stats_dtype),
        "diff_beta": beta.astype(stats_dtype),
    }


def inputs_of(problem: dict):
    """The judge's view of a problem."""
    from bnbwd_cli.core import Op

    return Op(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
              epsilon=problem["epsilon"], data_format=problem["data_format"])


def exact_outputs(problem: dict) -> dict:
    """The float64 oracle's outputs (tests/oracle-grade: math.fsum sums)."""
    from bnbwd_cli.core import Op
    from bnbwd_cli.core.reference import reference_backward

    return reference_backward(Op(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
                              epsilon=problem["epsilon"], data_format=problem["data_format"]))


def shape_for(m_target: int, channels: int, data_format: str, spatial_rank: int = 2) -> tuple[int, ...]:
    """A (N, C, H, W) or (N, H, W, C) shape with about m_target elements per channel."""
    if m_target <= 16:
        n, hw = m_target, (1,) * spatial_rank
    else:
        side = max(1, int(math.sqrt(m_target / 4)))
        n, hw = max(1, round(m_target / side**2)), (side,) * spatial_rank
    return (n, channels, *hw) if data_format == "NCX" else (n, *hw, channels)
