"""Planted bugs for `bnbwd cases` suites: a float32 centred kernel with one bug switched on at a time.

tests/zoo.py holds a few bugs (missing 1/M, a flipped sign, per-sample statistics, inference's formula,
epsilon 1e-3, unbiased variance, bf16 accumulation, NHWC read as NCHW); this file adds the other bug
classes of the diagnosis issue, each as a realistic kernel would make it. BUGS maps a bug to the
manifest target (app/cases.BUG_CLASSES) whose cases must expose it.
"""

from __future__ import annotations

import numpy as np

from bnbwd_cli.core.reference import reference_backward
from tests import zoo

F32 = np.float32
VECTOR = 8  # a vector loop's width
TAIL_BLOCK = 256  # a block-reduction's block, whose last partial block is skipped
LOST_BLOCK = 32  # a warp's partial sum, lost in two channels
CHANNEL_TILE = 8

# bug -> (the manifest target that must expose it, where the bug lives: "zoo" or "local")
BUGS = {
    "missing-1/M": ("formula", "zoo"),
    "sign-flip-one-channel": ("formula", "zoo"),
    "per-sample-stats": ("formula", "zoo"),
    "inference-in-training": ("formula", "zoo"),
    "epsilon-1e-3": ("epsilon", "zoo"),
    "unbiased-variance": ("unbiased_variance", "zoo"),
    "bf16-accumulation": ("sum16", "zoo"),
    "nhwc-as-nchw": ("layout_mixup", "zoo"),  # NXC suites only: an NCX buffer is already read as NCX
    "other-layout": ("layout_mixup", "local"),
    "lost-partial": ("lost_partial", "local"),
    "skipped-remainder": ("skipped_remainder", "local"),
    "skipped-tail-block": ("skipped_remainder", "local"),
    "unwritten-channels": ("unwritten_channels", "local"),
    "gamma-shift": ("gamma_shift", "local"),
    "gamma-ignored": ("gamma_ignored", "local"),
    "gamma-twice": ("gamma_twice", "local"),
    "x-for-xhat": ("x_for_xhat", "local"),
    "x-minus-mean-for-xhat": ("x_for_xhat", "local"),
    "mean-dy-not-subtracted": ("mean_dy_not_subtracted", "local"),
    "variance-as-invstd": ("variance_invstd", "local"),
    "own-batch-stats": ("other_statistics", "local"),
    "stats-in-bf16": ("other_statistics", "local"),
    "swapped-spatial": ("swapped_spatial", "local"),
    "truncation": ("truncation", "local"),
    "epsilon-ignored": ("epsilon", "local"),
    "single-pass": ("cancellation", "local"),
}


def problem_from_bundle(arrays: dict) -> dict:
    """An .npz of `bnbwd cases` as zoo's problem dict (bfloat16 back from raw |V2, 0-d entries as scalars)."""
    problem = dict(arrays)
    for key in ("src", "diff_dst"):
        if problem[key].dtype == np.dtype("V2"):
            problem[key] = problem[key].view(zoo.BF16)
    problem["epsilon"] = float(problem["epsilon"])
    problem["data_format"] = str(problem["data_format"])
    return problem


def run(problem: dict, bug: str | None = None) -> dict:
    """The outputs of a float32 kernel with `bug` planted (None: a correct one)."""
    if bug is not None and BUGS[bug][1] == "zoo":
        return zoo.kernel(problem, "sequential", bug=bug)
    if bug == "truncation":
        return _truncated(problem)
    return _kernel(problem, bug)


def _sums(terms: np.ndarray, bug: str | None) -> np.ndarray:
    c, m = terms.shape
    if bug == "skipped-remainder":  # the vector loop's last m % 8 elements never added
        return zoo.channel_sums(terms[:, : m - m % VECTOR], "sequential")
    if bug == "skipped-tail-block":  # the last partial block of 256 never added
        return zoo.channel_sums(terms[:, : m - m % TAIL_BLOCK] if m >= TAIL_BLOCK else terms[:, :0], "sequential")
    if bug == "lost-partial" and m > LOST_BLOCK:  # a race: block 1's partial sum lost in channels 0 and C/2
        kept = terms.copy()
        kept[[0, c // 2], LOST_BLOCK: 2 * LOST_BLOCK] = 0
        return zoo.channel_sums(kept, "blocked", LOST_BLOCK)
    if bug == "bf16-accumulation":
        return zoo.channel_sums(terms, "bf16-sequential")
    return zoo.channel_sums(terms, "sequential")


def _kernel(problem: dict, bug: str | None) -> dict:
    fmt = problem["data_format"]
    if bug == "other-layout":  # the buffer read, and diff_src written, in the other layout
        fmt = "NXC" if fmt == "NCX" else "NCX"
    x, g = zoo._per_channel(problem["src"], fmt), zoo._per_channel(problem["diff_dst"], fmt)
    if bug == "swapped-spatial":
        order = _swapped_rows(problem["src"].shape, fmt)
        x, g = x[:, order], g[:, order]
    c, m = x.shape
    mean, variance, gamma = (problem[key].astype(F32) for key in ("mean", "variance", "gamma"))
    eps = F32(0.0 if bug == "epsilon-ignored" else problem["epsilon"])
    if bug == "own-batch-stats":  # one pass in float32: E[x^2] - E[x]^2
        mean = x.sum(axis=1, dtype=F32) / F32(m)
        variance = np.maximum((x * x).sum(axis=1, dtype=F32) / F32(m) - mean * mean, F32(0))
    if bug == "stats-in-bf16":
        mean = mean.astype(zoo.BF16).astype(F32)
    invstd = variance if bug == "variance-as-invstd" else (F32(1) / np.sqrt(variance + eps)).astype(F32)
    if bug == "stats-in-bf16":
        invstd = invstd.astype(zoo.BF16).astype(F32)
    centred = x - mean[:, None]
    xhat = centred * invstd[:, None]
    beta = _sums(g, bug)
    if bug == "single-pass":  # sum(dy * (x - mean)) as sum(dy * x) - mean * sum(dy)
        gam = (_sums(g * x, bug) - mean * beta) * invstd
    else:
        terms = {"x-for-xhat": g * x, "x-minus-mean-for-xhat": g * centred}.get(bug, g * xhat)
        gam = _sums(terms, bug)
    scale = {"gamma-shift": np.roll(gamma, -1), "gamma-ignored": np.ones_like(gamma),
             "gamma-twice": gamma * gamma}.get(bug, gamma) * invstd
    mean_dy = np.zeros_like(beta) if bug == "mean-dy-not-subtracted" else beta / F32(max(m, 1))
    diff_src = scale[:, None] * (g - mean_dy[:, None] - xhat * (gam / F32(max(m, 1)))[:, None])
    if bug == "unwritten-channels" and c % CHANNEL_TILE:  # the last, partial tile of channels never written
        diff_src[c - c % CHANNEL_TILE:] = 0
    out = zoo._from_per_channel(diff_src.astype(F32), problem["src"], fmt)
    return {"diff_src": out.astype(problem["src"].dtype), "diff_gamma": gam.astype(problem["mean"].dtype),
            "diff_beta": beta.astype(problem["mean"].dtype)}


def _swapped_rows(shape: tuple[int, ...], fmt: str) -> np.ndarray:
    """The elements a kernel reads when its row stride is H where W belongs (H and W swapped in its shape
    parameters; loops still run to the true H and W): element (n, ..., h, w) of each channel is read at
    (..., h*H + w) of the sample, spilling into the next sample past its end. On a square image it reads the
    right element; otherwise most elements are wrong, some read twice, some never."""
    spatial = shape[2:] if fmt == "NCX" else shape[1:-1]
    n, positions = shape[0], int(np.prod(spatial))
    if len(spatial) < 2:
        return np.arange(n * positions)
    *lead, h, w = spatial
    outer, hh, ww = np.meshgrid(np.arange(int(np.prod(lead)) * n), np.arange(h), np.arange(w), indexing="ij")
    sample, inner = np.divmod(outer, int(np.prod(lead)))
    return ((sample * positions + inner * h * w + hh * h + ww) % (n * positions)).reshape(-1)


def _truncated(problem: dict) -> dict:
    """Exact outputs (float64) converted to the output dtypes by truncation (round toward zero)."""
    from bnbwd_cli.core import Op

    exact = reference_backward(Op(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"],
                                  problem["gamma"], epsilon=problem["epsilon"], data_format=problem["data_format"]))
    dtypes = {"diff_src": problem["src"].dtype, "diff_gamma": problem["mean"].dtype, "diff_beta": problem["mean"].dtype}
    return {name: truncate(exact[name], dtype) for name, dtype in dtypes.items()}


def truncate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 -> dtype, rounded toward zero: the nearest value, one step back toward zero where it rounded away."""
    nearest = values.astype(F32).astype(dtype)
    away = np.abs(nearest.astype(np.float64)) > np.abs(values)
    bits = nearest.view(np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint16).copy()
    bits[away] -= 1  # sign and magnitude: one step down in magnitude, whatever the sign
    return bits.view(dtype)
