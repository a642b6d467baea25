"""Parametrised families of buggy batch-norm backward kernels, each with the cause bnbwd should name.

Every family draws its parameters (block size, channels hit, which statistics, ...) from a random
generator, so the tests and scripts/diagnosis_check.py plant many instances, not a few fixed ones. The
kernel is a float32 NumPy emulation like tests/zoo.py's correct ones (upcast, xhat in float32, sums in
float32 in blocks, one rounding to the output dtype), with one hook per bug.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from bnbwd_cli.layout import view3
from tests import zoo

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"f32": np.dtype(np.float32), "bf16": BF16, "f16": np.dtype(np.float16)}


@dataclass(frozen=True)
class Bug:
    """One planted bug: its family, the cause the diagnosis must name, and the kernel's hooks."""

    family: str
    cause: str
    hooks: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Planted:
    """A problem (tests/zoo.make_problem's dict, possibly with changed inputs) and the buggy outputs."""

    problem: dict
    outputs: dict
    bug: Bug


def _rows(array: np.ndarray, fmt: str) -> np.ndarray:
    """(C, M) float32: each channel's elements in storage order."""
    x3 = view3(array, fmt)
    return np.ascontiguousarray(x3.astype(np.float32).transpose(1, 0, 2).reshape(x3.shape[1], -1))


def _unrows(rows: np.ndarray, like: np.ndarray, fmt: str) -> np.ndarray:
    n, c, s = view3(like, fmt).shape
    x3 = rows.reshape(c, n, s).transpose(1, 0, 2)
    return np.ascontiguousarray(x3).reshape(like.shape) if fmt == "NCX" else np.ascontiguousarray(
        x3.transpose(0, 2, 1)).reshape(like.shape)


def _blocked_sums(terms: np.ndarray, block: int, lost: dict | None) -> np.ndarray:
    """Per row: float32 partial sums of `block` elements, combined in float32; ``lost``: channel -> block
    index whose partial sum is dropped."""
    c, m = terms.shape
    nb = -(-m // block)
    padded = np.zeros((c, nb * block), np.float32)
    padded[:, :m] = terms
    partial = np.cumsum(padded.reshape(c, nb, block), axis=2, dtype=np.float32)[:, :, -1]
    for channel, index in (lost or {}).items():
        partial[channel, index] = 0
    return np.cumsum(partial, axis=1, dtype=np.float32)[:, -1]


def _running16(terms: np.ndarray, dtype) -> np.ndarray:
    total = np.zeros(terms.shape[0], np.float32)
    for k in range(terms.shape[1]):
        total = (total + terms[:, k]).astype(dtype).astype(np.float32)
    return total


def _convert(values: np.ndarray, dtype, truncate: bool) -> np.ndarray:
    out = values.astype(dtype)
    if not truncate or np.dtype(dtype) == np.dtype(np.float32):
        return out
    wider = np.abs(out.astype(np.float32)) > np.abs(values)
    bits = out.view(np.uint16).copy()
    bits[wider] -= np.uint16(1)  # one step toward zero in magnitude
    return bits.view(dtype)


def _swap_read(array: np.ndarray, fmt: str) -> np.ndarray:
    """The tensor read from ``array``'s buffer with H and W swapped."""
    shape = array.shape
    if fmt == "NCX":
        h, w = shape[-2:]
        return np.ascontiguousarray(array.reshape(*shape[:-2], w, h).swapaxes(-1, -2)).reshape(shape)
    h, w = shape[-3:-1]
    return np.ascontiguousarray(array.reshape(*shape[:-3], w, h, shape[-1]).swapaxes(-2, -3)).reshape(shape)


def _swap_write(array: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "NCX":
        return np.ascontiguousarray(array.swapaxes(-1, -2)).reshape(array.shape)
    return np.ascontiguousarray(array.swapaxes(-2, -3)).reshape(array.shape)


def kernel(problem: dict, hooks: dict) -> dict:
    """diff_src, diff_gamma, diff_beta of a float32 kernel with the given hooks (none: a correct kernel)."""
    h = hooks
    fmt = problem["data_format"]
    read_fmt = h.get("read_format", fmt)
    src, dy = problem["src"], problem["diff_dst"]
    if h.get("swap_read") == "diff_dst":
        dy = _swap_read(dy, fmt)
    if h.get("swap_read") == "src":
        src = _swap_read(src, fmt)
    x, g = _rows(src, read_fmt), _rows(dy, read_fmt)
    c, m = x.shape
    mean = problem["mean"].astype(F32)
    stat = problem["variance"].astype(F32)
    gamma = problem["gamma"].astype(F32)
    eps = F32(h.get("epsilon", problem["epsilon"]))
    if h.get("own_stats"):
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=1).astype(F32)
        stat = x64.var(axis=1).astype(F32)
    if h.get("invstd_given") or problem.get("variance_is_invstd"):
        invstd = stat
    elif h.get("variance_as_invstd"):
        invstd = stat
    else:
        variance = stat * F32(m / (m - 1)) if h.get("unbiased") else stat
        invstd = (F32(1) / np.sqrt(variance + eps)).astype(F32)
    if "stats16" in h:
        dtype, which = h["stats16"]
        if "mean" in which:
            mean = mean.astype(dtype).astype(F32)
        if "invstd" in which:
            invstd = invstd.astype(dtype).astype(F32)
    if "gamma" in h:
        gamma = {"ignored": np.ones_like(gamma), "twice": gamma * gamma, "next": np.roll(gamma, -1),
                 "previous": np.roll(gamma, 1)}[h["gamma"]]
    xhat = (x - mean[:, None]) * invstd[:, None]
    terms_g = {"xhat": g * xhat, "x": g * x, "x - mean": g * (x - mean[:, None])}[h.get("gamma_terms", "xhat")]
    keep = m - h.get("skip_tail", 0)
    if h.get("accumulate16") is not None:
        beta, gam = _running16(g, h["accumulate16"]), _running16(terms_g, h["accumulate16"])
    else:
        block, lost = h.get("block", 256), h.get("lost")
        beta = _blocked_sums(g[:, :keep], block, lost)
        gam = _blocked_sums(terms_g[:, :keep], block, lost)
    if h.get("single_pass"):
        sxdy = np.cumsum(g * x, axis=1, dtype=F32)[:, -1]
        beta = np.cumsum(g, axis=1, dtype=F32)[:, -1]
        gam = (sxdy - mean * beta) * invstd
    gam_src = gam if h.get("gamma_terms_in_src", True) or h.get("gamma_terms", "xhat") == "xhat" else \
        _blocked_sums((g * xhat)[:, :keep], 256, None)
    k = (gamma * invstd)[:, None]
    divisor = F32(1) if h.get("divisor_one") else F32(m)
    mean_dy = beta / divisor
    if "no_mean_dy" in h:
        mean_dy = mean_dy.copy()
        mean_dy[list(h["no_mean_dy"])] = 0
    if h.get("inference"):
        diff_src = k * g
    else:
        diff_src = k * (g - mean_dy[:, None] - xhat * (gam_src / divisor)[:, None])
    for channel in h.get("flip", ()):
        diff_src[channel] = -diff_src[channel]
    out_dtype = src.dtype
    written = _convert(diff_src, out_dtype, h.get("truncate", False))
    for channel, source in h.get("unwritten", {}).items():
        written[channel] = 0 if source is None else written[source]
    diff_src_out = _unrows(written, src, read_fmt)
    if h.get("swap_write"):
        diff_src_out = _swap_write(diff_src_out, fmt)
    stats_dtype = problem["mean"].dtype
    if h.get("sum_as_mean"):
        beta = beta / F32(m)
    return {"diff_src": diff_src_out,
            "diff_gamma": _convert(gam, stats_dtype, h.get("truncate", False)),
            "diff_beta": _convert(beta, stats_dtype, h.get("truncate", False))}


# --- the families: each draws one bug for a problem (and may change the problem's inputs) ---------------


def _some_channels(rng: np.random.Generator, c: int) -> list[int]:
    if rng.random() < 0.4:
        return list(range(c))
    return sorted(rng.choice(c, size=int(rng.integers(1, max(2, c // 2) + 1)), replace=False).tolist())


def _few_channels(rng: np.random.Generator, c: int) -> list[int]:
    return sorted(rng.choice(c, size=int(rng.integers(1, min(3, c - 1) + 1)), replace=False).tolist())


def missing_tail(rng, problem, m):
    """The partial last block of the sums skipped (M not a multiple of the block)."""
    for _ in range(20):
        block = int(rng.choice([64, 128, 256, 512, 1024]))
        t = m % block
        if 8 <= t < m:
            return Bug("missing-tail", "missing-tail", {"skip_tail": t, "block": block})
    return None


def vector_remainder(rng, problem, m):
    """A vector loop's remainder (M mod the vector width) left out of the sums."""
    for width in rng.permutation([4, 8, 16]):
        t = m % int(width)
        if t:
            return Bug("vector-remainder", "missing-tail", {"skip_tail": t})
    return None


def lost_block(rng, problem, m):
    c = problem["mean"].shape[0]
    block = int(rng.choice([32, 64, 128, 256]))
    nb = -(-m // block)
    if nb < 2:
        return None
    channels = _some_channels(rng, c) if rng.random() < 0.5 else _few_channels(rng, c)
    lost = {ch: int(rng.integers(0, nb - 1)) for ch in channels}  # a whole block (not the partial last one)
    return Bug("lost-block", "lost-partial-sum", {"block": block, "lost": lost})


def unwritten(rng, problem, m):
    c = problem["mean"].shape[0]
    channels = _few_channels(rng, c)
    if rng.random() < 0.5:
        return Bug("unwritten-zeros", "unwritten-channels", {"unwritten": {ch: None for ch in channels}})
    sources = {ch: int(rng.choice([k for k in range(c) if k not in channels])) for ch in channels}
    return Bug("unwritten-stale", "unwritten-channels", {"unwritten": sources})


def gamma_bug(rng, problem, m):
    kind = str(rng.choice(["ignored", "twice", "next", "previous"]))
    cause = {"ignored": "gamma-ignored", "twice": "gamma-applied-twice"}.get(kind, "gamma-off-by-one")
    return Bug(f"gamma-{kind}", cause, {"gamma": kind})


def gamma_terms(rng, problem, m):
    terms = str(rng.choice(["x", "x - mean"]))
    return Bug("gamma-sum-from-x", "gamma-sum-from-x", {"gamma_terms": terms, "gamma_terms_in_src": bool(rng.random() < 0.5)})


def mean_dy(rng, problem, m):
    c = problem["mean"].shape[0]
    return Bug("mean-dy-not-subtracted", "mean-dy-not-subtracted", {"no_mean_dy": tuple(_some_channels(rng, c))})


def variance_as_invstd(rng, problem, m):
    return Bug("variance-read-as-invstd", "variance-read-as-invstd", {"variance_as_invstd": True})


def invstd_given(rng, problem, m):
    """The inputs hold invstd under `variance` (PyTorch's save_invstd); the kernel is correct."""
    return Bug("variance-holds-invstd", "variance-holds-invstd", {"invstd_given": True, "_inputs": "invstd"})


def own_stats(rng, problem, m):
    """The problem passes running statistics (off the batch's); the kernel uses its own batch statistics."""
    return Bug("own-batch-statistics", "own-batch-statistics", {"own_stats": True, "_inputs": "running"})


def stats16(rng, problem, m):
    dtype = BF16 if rng.random() < 0.6 else np.float16
    which = str(rng.choice(["mean", "invstd", "mean invstd"]))
    return Bug("16-bit-statistics", "16-bit-statistics", {"stats16": (dtype, which)})


def spatial_swap(rng, problem, m):
    shape = problem["src"].shape
    hw = shape[2:4] if problem["data_format"] == "NCX" else shape[1:3]
    if len(shape) != 4 or hw[0] == hw[1]:
        return None
    if rng.random() < 0.5:
        return Bug("spatial-swap-write", "spatial-axes-swapped", {"swap_write": True})
    return Bug("spatial-swap-read", "spatial-axes-swapped", {"swap_read": str(rng.choice(["diff_dst", "src"]))})


def layout_mixup(rng, problem, m):
    """NHWC buffers read as NCHW or the reverse; needs C equal to the axis read as channels."""
    shape, fmt = problem["src"].shape, problem["data_format"]
    c = problem["mean"].shape[0]
    if len(shape) != 4 or (shape[1] if fmt == "NXC" else shape[-1]) != c:
        return None
    return Bug("layout-mixup", "layout-mixup", {"read_format": "NCX" if fmt == "NXC" else "NXC"})


def accumulate16(rng, problem, m):
    if m > 4096:
        return None
    dtype = BF16 if rng.random() < 0.6 else np.float16
    return Bug("16-bit-accumulation", "16-bit-accumulation", {"accumulate16": dtype})


def truncation(rng, problem, m):
    if problem["src"].dtype == np.float32:
        return None
    return Bug("truncation", "truncating-conversion", {"truncate": True})


def epsilon(rng, problem, m):
    return Bug("epsilon", "epsilon", {"epsilon": float(rng.choice([1e-3, 1e-2, 1e-1]))})


def unbiased(rng, problem, m):
    return Bug("unbiased-variance", "unbiased-variance", {"unbiased": True})


def missing_1m(rng, problem, m):
    return Bug("missing-1/M", "missing-1/M", {"divisor_one": True})


def inference(rng, problem, m):
    return Bug("inference-backward", "inference-backward", {"inference": True})


def sign_flip(rng, problem, m):
    return Bug("sign-flip", "sign-flip", {"flip": tuple(_few_channels(rng, problem["mean"].shape[0]))})


def sum_as_mean(rng, problem, m):
    return Bug("sum-as-mean", "sum-scaled-by-M", {"sum_as_mean": True})


FAMILIES = {f.__name__: f for f in (
    missing_tail, vector_remainder, lost_block, unwritten, gamma_bug, gamma_terms, mean_dy, variance_as_invstd, invstd_given,
    own_stats, stats16, spatial_swap, layout_mixup, accumulate16, truncation, epsilon, unbiased, missing_1m, inference,
    sign_flip, sum_as_mean)}


def _with_inputs(problem: dict, kind: str | None, rng: np.random.Generator) -> dict:
    if kind == "invstd":
        variance = problem["variance"].astype(np.float64)
        invstd = 1 / np.sqrt(variance + problem["epsilon"])
        return dict(problem, variance=invstd.astype(problem["variance"].dtype))
    if kind == "running":  # running statistics: a few percent off the batch's
        c = problem["mean"].shape[0]
        sd = np.sqrt(problem["variance"].astype(np.float64))
        mean = problem["mean"] + rng.normal(0, 0.05, c) * sd
        variance = problem["variance"] * rng.uniform(0.9, 1.1, c)
        return dict(problem, mean=mean.astype(problem["mean"].dtype), variance=variance.astype(problem["variance"].dtype))
    return problem


def random_shape(rng: np.random.Generator, fmt: str, m_range=(600, 6000), square: bool | None = None) -> tuple:
    """(N, C, H, W) or (N, H, W, C): 3-10 channels, about m_range elements per channel, non-square
    images unless ``square``."""
    c = int(rng.integers(3, 11))
    target = int(rng.integers(*m_range))
    h = int(rng.integers(4, 24))
    w = int(rng.integers(4, 24)) if not square else h
    if square is False and w == h:
        w += 1
    n = max(2, round(target / (h * w)))
    return (n, c, h, w) if fmt == "NCX" else (n, h, w, c)


def plant(family: str, rng: np.random.Generator, fmt: str, dtype: str, shape: tuple | None = None,
          m_range: tuple[int, int] = (600, 6000), stats: str = "f32") -> Planted | None:
    """One bug of ``family`` on a random problem (None when the family has no instance at this shape)."""
    if shape is None:
        shape = random_shape(rng, fmt, m_range)
        if family == "layout_mixup":  # the other layout's channel axis must have C entries too
            n, c = shape[0], shape[1] if fmt == "NCX" else shape[-1]
            w = int(rng.integers(4, 24))
            shape = (n, c, w, c) if fmt == "NCX" else (n, c, w, c)
    problem = zoo.make_problem(rng, shape, fmt, DTYPES[dtype], DTYPES[stats])
    m = problem["src"].size // problem["mean"].shape[0]
    bug = FAMILIES[family](rng, problem, m)
    if bug is None:
        return None
    problem = _with_inputs(problem, bug.hooks.get("_inputs"), rng)
    outputs = kernel(problem, bug.hooks)
    return Planted(problem, outputs, bug)


def correct(problem: dict) -> dict:
    return kernel(problem, {})


__all__ = ["Bug", "FAMILIES", "Planted", "correct", "kernel", "plant", "random_shape"]
