"""Parametrised families of buggy batch-norm backward kernels, each with the cause bnbwd should name.

Every family draws its parameters (block size, channels hit, which statistics, ...) from a random
generator, so the tests and tools/diagnosis_check.py plant many instances, not a few fixed ones. The
kernel is tools/zoo.py's float32 NumPy emulation (upcast, xhat in float32, sums in float32 in blocks of
256, one rounding to the output dtype) with the family's hooks. tests/test_judge_diagnosis.py plants them on
random problems and tests/test_cases.py on the cases of `bnbwd cases` (CLASSES: the manifest class, and
so the cases, where each cause must show).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tools import zoo

F32 = np.float32
BF16 = zoo.BF16
DTYPES = {"f32": np.dtype(np.float32), "bf16": BF16, "f16": np.dtype(np.float16)}


@dataclass(frozen=True)
class Bug:
    """One planted bug: its family, the cause the diagnosis must name, and the kernel's hooks (tools/zoo.py's
    HOOKS; "_inputs" says how the family changes the problem's inputs, see _with_inputs)."""

    family: str
    cause: str
    hooks: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Planted:
    """A problem (tools/zoo.make_problem's dict, possibly with changed inputs) and the buggy outputs."""

    problem: dict
    outputs: dict
    bug: Bug


def kernel(problem: dict, hooks: dict) -> dict:
    """diff_src, diff_gamma, diff_beta of a float32 kernel (blocks of 256) with the given hooks (none: correct)."""
    return zoo.kernel(problem, "blocked", hooks=hooks)


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


def _channel_shape(problem: dict) -> tuple[int, ...]:
    """A channel's elements as (N, *spatial) in storage order."""
    shape = problem["src"].shape
    return (shape[0], *shape[2:]) if problem["data_format"] == "NCX" else (shape[0], *shape[1:-1])


def _range(rng, length: int, avoid_end: bool) -> tuple[int, int] | None:
    """lo..hi inside 0..length-1, not the whole (nor reaching the end when avoid_end)."""
    if length < 3:
        return None
    last = length - 2 if avoid_end else length - 1
    lo = int(rng.integers(0, last + 1))
    hi = int(rng.integers(lo, min(last, lo + max(1, length // 3)) + 1))
    return None if (lo, hi) == (0, length - 1) else (lo, hi)


def partial_reduction(rng, problem, m):
    """A subset of each channel's elements (a range of samples, rows or columns, lanes j0..j1 of every group of
    L, the first t elements) left out of the sums or counted twice, in all or some channels. "_words": what the
    hint must say of the subset."""
    shape = _channel_shape(problem)
    c = problem["mean"].shape[0]
    twice = bool(rng.random() < 0.4)
    names = ("n", "h", "w")[: len(shape)] if len(shape) == 3 else ("n",) + tuple(f"x{i}" for i in range(len(shape) - 1))
    kind = str(rng.choice(["axis", "axis", "lanes", "head"]))
    flat = np.arange(m)
    if kind == "axis":
        axis = int(rng.integers(0, len(shape)))
        found = _range(rng, shape[axis], avoid_end=not twice)
        if found is None:
            return None
        lo, hi = found
        index = np.indices(shape)[axis].reshape(-1)
        mask = (index >= lo) & (index <= hi)
        words = f"{names[axis]}={lo}" if lo == hi else f"{names[axis]}={lo}..{hi}"
    elif kind == "lanes":
        lanes = int(rng.choice([8, 16, 32]))
        if lanes == shape[-1]:  # lanes of a row: a range of columns (said as w=...)
            return None
        lo = int(rng.integers(0, lanes))
        hi = int(rng.integers(lo, min(lanes - 1, lo + lanes // 4) + 1))
        mask = (flat % lanes >= lo) & (flat % lanes <= hi)
        words = f"lane {lo} of every group of {lanes}" if lo == hi else f"lanes {lo}..{hi} of every group of {lanes}"
    else:
        t = int(rng.integers(3, max(4, m // 3)))
        if t & (t - 1) == 0:
            t += 1
        mask = flat < t
        words = f"the first {t} elements"
    channels = None if rng.random() < 0.5 else tuple(_some_channels(rng, c))
    cause = "partial-reduction-doubled" if twice else "partial-reduction-missing"
    if rng.random() < 0.25:  # one sum written from part of its reduction, diff_src from the whole sums
        name = str(rng.choice(["diff_beta", "diff_gamma"]))
        return Bug("partial-reduction-written", cause, {"subset_written": (name, mask, twice, channels),
                                                        "_words": f"{name} as written {'counts twice' if twice else 'misses'} {words}"})
    return Bug("partial-reduction", cause, {"subset": (mask, twice, channels), "_words": words})


def param_misread(rng, problem, m):
    """gamma, the mean or invstd of channel c read at another index: shifted by k (wrapped or clamped; gamma
    by 2 or more: gamma[c±1] is gamma-off-by-one's), reversed, a stride, or c XOR 2^j (a vector load's halves
    swapped); the mean and invstd both (a packed array of statistics); invstd in the elementwise pass only.
    "_words": the map the hint names."""
    c = problem["mean"].shape[0]
    if c < 4:
        return None
    param = str(rng.choice(["gamma", "mean", "invstd", "mean invstd", "invstd elementwise"]))
    kind = str(rng.choice(["wrapped", "clamped", "reversed", "stride", "xor"] if c % 2 == 0 else
                          ["wrapped", "clamped", "reversed", "stride"]))
    index = np.arange(c)
    said = {"mean invstd": "mean and invstd", "invstd elementwise": "invstd"}.get(param, param)
    if kind == "xor":
        k = int(rng.choice([2**j for j in range(8) if c % 2 ** (j + 1) == 0]))
        index, words = index ^ k, f"c XOR {k}" if 2 * k < c else f"c+{k} (wrapped around)"  # (c XOR C/2: a shift)
    elif kind == "wrapped":
        k = int(rng.integers(2, c - 1))
        shift = k if k <= c // 2 else k - c
        index, words = (index + k) % c, f"c{shift:+d} (wrapped around)"
    elif kind == "clamped":
        k = int(rng.integers(2, c - 1))
        if rng.random() < 0.5:
            index, words = np.minimum(index + k, c - 1), f"c+{k} (clamped"
        else:
            index, words = np.maximum(index - k, 0), f"c-{k} (clamped"
    elif kind == "reversed":
        index, words = c - 1 - index, "C-1-c (the channels reversed)"
    else:
        strides = [s for s in range(2, c) if np.gcd(s, c) == 1 and (s * np.arange(c) % c != c - 1 - np.arange(c)).any()]
        if not strides:
            return None
        s = int(rng.choice(strides))
        index, words = index * s % c, f"c*{s} mod {c}"
    if param == "invstd elementwise":  # said before the map
        said = "in the elementwise pass only (the sums use the right one), read at the wrong channel: the kernel used invstd"
    return Bug("param-misread", "parameter-misread", {"read_at": (param, index), "_words": f"{said}[{words}"})


def param_axis(rng, problem, m):
    """gamma or the mean indexed by another axis as long as C (plant() draws a shape that has one)."""
    shape = _channel_shape(problem)
    c = problem["mean"].shape[0]
    axes = [a for a in range(len(shape)) if shape[a] == c]
    if not axes:
        return None
    axis = int(rng.choice(axes))
    param = str(rng.choice(["gamma", "mean"]))
    name = ("n", "h", "w")[axis] if len(shape) == 3 else f"axis {axis}"
    return Bug("param-axis", "parameter-misread", {"param_axis": (param, axis), "_words": f"{param}[{name}]"})


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
    """NHWC buffers read as NCHW or the reverse (needs C equal to the axis read as channels), or diff_src computed
    right and written in the other layout's order (any shape)."""
    shape, fmt = problem["src"].shape, problem["data_format"]
    c = problem["mean"].shape[0]
    if rng.random() < 0.5 or len(shape) != 4 or (shape[1] if fmt == "NXC" else shape[-1]) != c:
        names = ("NCHW", "NHWC") if fmt == "NXC" else ("NHWC", "NCHW")
        words = f"diff_src was written in {names[0]} order into the {names[1]} buffer"
        return Bug("layout-written", "layout-mixup", {"write_other_layout": True, "_words": words})
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
    missing_tail, vector_remainder, lost_block, partial_reduction, param_misread, param_axis, unwritten, gamma_bug, gamma_terms, mean_dy, variance_as_invstd, invstd_given,
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
        if family == "param_axis":  # an axis as long as C: the last spatial one
            n, c = shape[0], shape[1] if fmt == "NCX" else shape[-1]
            h = int(rng.integers(4, 24))
            shape = (n, c, h, c) if fmt == "NCX" else (n, h, c, c)
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


# --- on the cases of `bnbwd cases` ----------------------------------------------------------------------

# The bug class (app/cases.BUG_CLASSES, a case's manifest `targets`) of each cause: the cases that target it
# are where a bug with that cause must fail.
CLASSES = {
    "missing-tail": "skipped_remainder", "lost-partial-sum": "lost_partial", "unwritten-channels": "unwritten_channels",
    "gamma-off-by-one": "gamma_shift", "gamma-ignored": "gamma_ignored", "gamma-applied-twice": "gamma_twice",
    "gamma-sum-from-x": "x_for_xhat", "mean-dy-not-subtracted": "mean_dy_not_subtracted",
    "variance-read-as-invstd": "variance_invstd", "variance-holds-invstd": "variance_invstd",
    "own-batch-statistics": "other_statistics", "16-bit-statistics": "other_statistics",
    "spatial-axes-swapped": "swapped_spatial", "layout-mixup": "layout_mixup", "16-bit-accumulation": "sum16",
    "truncating-conversion": "truncation", "epsilon": "epsilon", "unbiased-variance": "unbiased_variance",
    "missing-1/M": "formula", "inference-backward": "formula", "sign-flip": "formula", "sum-scaled-by-M": "formula",
    "single-pass-cancellation": "cancellation",
    "partial-reduction-missing": "lost_partial", "partial-reduction-doubled": "lost_partial",
    "parameter-misread": "gamma_shift",
}


def single_pass(rng, problem, m):
    """sum(dy * (x - mean)) as sum(dy * x) - mean * sum(dy): loses digits only on data with |mean|/sd >> 1, which
    the random problems lack (no family of FAMILIES; tests/test_judge_diagnosis.py plants it on offset data)."""
    return Bug("single-pass", "single-pass-cancellation", {"single_pass": True})


# The families planted on the cases: every family, and the single-pass formula for the cancellation class.
CASE_FAMILIES = dict(FAMILIES, single_pass=single_pass)


def plant_on_case(family: str, problem: dict, targets: tuple[str, ...], rng: np.random.Generator) -> Planted | None:
    """One bug of ``family`` whose class is among a case's ``targets``, on the case's problem (None when the
    family has no such instance there). The case's inputs stay as the suite wrote them except where the bug lies
    in them: invstd under `variance` (PyTorch's save_invstd, the batch's own: not where a case passes running
    statistics). A kernel that uses its own statistics is exposed by the cases that pass running ones
    (other_statistics), so own_stats does not change a case's."""
    m = problem["src"].size // problem["mean"].shape[0]
    for _ in range(20):  # a family may draw an instance of another class, or none at a draw's block size
        bug = CASE_FAMILIES[family](rng, problem, m)
        if bug is not None and CLASSES[bug.cause] in targets:
            break
    else:
        return None
    inputs = bug.hooks.get("_inputs")
    if inputs == "invstd" and not _batch_statistics(problem):
        return None
    changed = _with_inputs(problem, inputs, rng) if inputs == "invstd" else problem
    return Planted(changed, kernel(changed, bug.hooks), bug)


def _batch_statistics(problem: dict) -> bool:
    """Whether the problem's variance is its batch's (within 1%)."""
    x = zoo._per_channel(problem["src"], problem["data_format"]).astype(np.float64)
    return bool(np.allclose(problem["variance"].astype(np.float64), x.var(axis=1), rtol=0.01, atol=0))


__all__ = ["Bug", "CASE_FAMILIES", "CLASSES", "FAMILIES", "Planted", "correct", "kernel", "plant", "plant_on_case",
           "random_shape"]
