"""The summary statistics the cores gather in their write pass (core/summary.py) against a direct NumPy computation."""

from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.core import summary
from bnbwd_cli.dtypes import to_float64
from tests.oracle import backward_arrays

CORES = ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])
SHAPES = [((3, 5, 17, 11), "NCX"), ((2, 7, 6, 9), "NXC"), ((2, 3, 700), "NCX")]  # planes, rows, few channels
DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]


def direct(array: np.ndarray) -> summary.OutputStats:
    values = to_float64(array).reshape(-1)
    finite = values[np.isfinite(values)]
    if not values.size:
        return summary.OutputStats(float("nan"), float("nan"), 0)
    lowest = float(finite.min()) if finite.size else np.inf
    highest = float(finite.max()) if finite.size else -np.inf
    return summary.OutputStats(lowest, highest, int(values.size - finite.size))


def _inputs(rng, shape, data_format, dtype, case):
    src = rng.normal(size=shape).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    channels = shape[1] if data_format == "NCX" else shape[-1]
    gamma = np.ones(channels, np.float32)
    index = (0, 1) if data_format == "NCX" else (0,) * (len(shape) - 1) + (1,)
    if case == "nan":
        src[index] = np.nan  # channel 1 all NaN
    elif case == "inf":
        dy[index] = np.inf
    elif case == "overflow":  # finite float64 results that round to inf in a narrow T1 (and in f32 from 1e39)
        gamma[1] = 1e5 if np.dtype(dtype) == np.float16 else 1e39
    return src, dy, np.zeros(channels, np.float32), np.ones(channels, np.float32), gamma


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("shape,data_format", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ["finite", "nan", "inf", "overflow"])
def test_write_pass_stats_equal_a_direct_computation(rng, core, shape, data_format, dtype, case):
    src, dy, mean, var, gamma = _inputs(rng, shape, data_format, dtype, case)
    if case == "overflow" and dtype != np.float64:
        gamma = gamma.astype(np.float64)  # 1e39 needs float64 stats
        mean, var = mean.astype(np.float64), var.astype(np.float64)
    result = backward_arrays(src, dy, mean, var, gamma, epsilon=1e-5, data_format=data_format, core=core,
                             block_bytes=4096)
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        got, want = result.stats[name], direct(getattr(result, name))
        assert got == want, (name, got, want)
    if case in ("nan", "inf") or (case == "overflow" and dtype != np.float64):
        assert result.stats["diff_src"].nonfinite > 0  # the case did make non-finite outputs


@pytest.mark.parametrize("core", CORES)
def test_stats_of_empty_and_skipped_outputs(core):
    empty = np.zeros((0, 3, 4), np.float32)
    result = backward_arrays(empty, empty, np.zeros(3, np.float32), np.ones(3, np.float32), epsilon=1e-5,
                             data_format="NCX", core=core)
    assert np.isnan(result.stats["diff_src"].minimum) and result.stats["diff_src"].nonfinite == 0
    src = np.ones((2, 3, 4), np.float32)
    only = backward_arrays(src, src, np.zeros(3, np.float32), np.ones(3, np.float32), epsilon=1e-5,
                           data_format="NCX", core=core, outputs=("diff_beta",))
    assert set(only.stats) == {"diff_beta"}


def test_from_extremes_scans_when_rounding_overflows():
    out = np.array([1.0, 7e4], np.float16)  # 7e4 is above float16's max: inf
    assert summary.from_extremes(1.0, 7e4, out) == summary.OutputStats(1.0, 1.0, 1)
    assert summary.from_extremes(float("nan"), float("nan"), np.array([2.0], np.float32)) == summary.OutputStats(2.0, 2.0, 0)
