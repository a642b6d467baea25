"""How tests call the core and measure agreement with the oracles (float64 and long double)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import strategies as st

from bnbwd_cli.core import BackwardResult, Op, Settings, backward
from bnbwd_cli.dtypes import dtype_name, to_float64, ulp_spacing
from tests.conftest import INPUT_NAMES, make_inputs
from tools.accuracy import normalised_error as normalised_error  # the tests' import of it: from tests.oracle

# Normalised max error bounds per dtype, what each output may miss a float64 oracle by: max|out - ref| / max|ref|.
BOUNDS = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def op_args(rng: np.random.Generator, shape, data_format: str = "NCX", dtype=np.float32, stats_dtype=np.float32,
            with_gamma: bool = True) -> tuple:
    """src, diff_dst, mean, variance, gamma (or None): the shared factory's inputs in core.backward's order."""
    arrays = make_inputs(rng, shape, data_format, dtype, stats_dtype)
    return (*(arrays[name] for name in INPUT_NAMES[:4]), arrays["gamma"] if with_gamma else None)


def problem_arrays(problem: dict) -> tuple:
    """op_args for a hypothesis-drawn problem dict (see problems)."""
    return op_args(np.random.default_rng(problem["seed"]), problem["shape"], problem["data_format"],
                   problem["dtype"], problem["stats_dtype"], problem["with_gamma"])


@st.composite
def problems(draw, *, dtypes, max_rank: int, max_channels: int, max_batch: int, spatial_sizes=None,
             stats=("float32",), max_elements: int | None = None, **options):
    """A random op's description for problem_arrays: shape (either layout), dtypes, gamma, training, seed.

    spatial_sizes: the sizes each spatial dim is drawn from; None: 1..12 within a budget of ~3000 elements
    per channel; max_elements caps N*C*prod(X) for spatial_sizes (sizes that would pass it are not drawn).
    stats: the stats dtypes drawn from ("float32", "float64", "same" as the data); float64
    data always gets float64 stats. options: extra keys drawn from the given strategies (threads, epsilon...).
    """
    rank = draw(st.integers(2, max_rank))
    channels = draw(st.integers(1, max_channels))
    batch = draw(st.integers(1, max_batch))
    spatial, budget = [], 3000 // channels
    for _ in range(rank - 2):
        if spatial_sizes and max_elements is not None:
            room = max_elements // (batch * channels * math.prod(spatial))
            size = draw(st.sampled_from([s for s in spatial_sizes if s <= room] or [1]))
        else:
            size = draw(st.sampled_from(spatial_sizes) if spatial_sizes else st.integers(1, max(1, min(12, budget))))
        spatial.append(size)
        budget = max(1, budget // size)
    data_format = draw(st.sampled_from(["NCX", "NXC"]))
    dtype = draw(st.sampled_from(dtypes))
    choices = {"float32": np.float32, "float64": np.float64, "same": dtype}
    stats_dtype = np.float64 if dtype == np.float64 else draw(st.sampled_from([choices[name] for name in stats]))
    return {
        "shape": (batch, channels, *spatial) if data_format == "NCX" else (batch, *spatial, channels),
        "data_format": data_format, "dtype": dtype, "stats_dtype": stats_dtype,
        "with_gamma": draw(st.booleans()), "training": draw(st.booleans()), "seed": draw(st.integers(0, 2**32 - 1)),
        **{name: draw(strategy) for name, strategy in options.items()},
    }


def backward_arrays(src, diff_dst, mean, variance, gamma=None, **options) -> BackwardResult:
    """core.backward for loose arrays and keywords, as tests like to call it: Op's and Settings' fields by name."""
    op_fields = {f.name for f in dataclasses.fields(Op)}
    op = Op(src, diff_dst, mean, variance, gamma, **{k: v for k, v in options.items() if k in op_fields})
    return backward(op, Settings(**{k: v for k, v in options.items() if k not in op_fields}))


def exact_backward(src, diff_dst, mean, variance, gamma, *, epsilon: float, data_format: str,
                   training: bool = True) -> dict[str, np.ndarray]:
    """The outputs in long double (x87's 64-bit significand where NumPy has it) with math.fsum-exact sums.

    Every product and difference is formed in long double, so the oracle's own error is ~2**-64 of the
    terms: far below an ulp of float32, and a fair judge of faithful rounding.
    """
    wide = np.longdouble
    axis = 1 if data_format == "NCX" else src.ndim - 1
    x = np.moveaxis(to_float64(src), axis, -1).reshape(-1, src.shape[axis]).astype(wide)
    dy = np.moveaxis(to_float64(diff_dst), axis, -1).reshape(-1, src.shape[axis]).astype(wide)
    count = x.shape[0]
    invstd = 1 / np.sqrt(to_float64(variance).astype(wide) + wide(epsilon))
    scale = invstd * (to_float64(gamma).astype(wide) if gamma is not None else 1)
    d = x - to_float64(mean).astype(wide)
    sum_dy = np.array([_exact_sum(column) for column in dy.T], dtype=wide)
    sum_dy_d = np.array([_exact_sum(column) for column in (dy * d).T], dtype=wide)
    if training:
        diff_src = (dy - sum_dy / count - d * (invstd * invstd * sum_dy_d / count)) * scale
    else:
        diff_src = dy * scale
    layout_shape = tuple(np.delete(src.shape, axis)) + (src.shape[axis],)
    return {"diff_src": np.moveaxis(diff_src.reshape(layout_shape), -1, axis),
            "diff_gamma": sum_dy_d * invstd, "diff_beta": sum_dy}


def _exact_sum(values: np.ndarray):
    """Σ of long doubles: split each into float64 head + tail, fsum both (exact to ~2**-106 of the terms)."""
    head = values.astype(np.float64)
    tail = (values - head.astype(values.dtype)).astype(np.float64)
    try:
        return np.longdouble(math.fsum(head)) + np.longdouble(math.fsum(tail))
    except (ValueError, OverflowError):
        return values.sum()


def ulps(actual: np.ndarray, exact: np.ndarray) -> float:
    """max |actual - exact| in units of the last place of actual's dtype at exact (0 for an empty array)."""
    if exact.size == 0:
        return 0.0
    name = dtype_name(actual.dtype)
    exact64 = exact.astype(np.float64)
    difference = np.abs(to_float64(actual).astype(np.longdouble) - exact)
    with np.errstate(invalid="ignore"):
        units = (difference / ulp_spacing(exact64, name)).astype(np.float64)
    same = (to_float64(actual) == exact64) | (np.isnan(to_float64(actual)) & np.isnan(exact64))
    return float(np.max(np.where(same, 0.0, units)))
