"""The blocked core against the float64 oracle: hypothesis properties and hand-computed cases."""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bnbwd_cli.core import Op

from bnbwd_cli.core.reference import reference_backward
from tests.oracle import BOUNDS, backward_arrays, normalised_error, problem_arrays, problems

numpy_backward = functools.partial(backward_arrays, core="numpy")  # the NumPy core; test_core_numba.py: numba

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(dtypes=DTYPES, max_rank=5, max_channels=70, max_batch=8, stats=("float32", "same"),
               block_bytes=st.sampled_from([None, 2048, 65536]),  # small budgets force split tiles
               threads=st.sampled_from([1, 2]), epsilon=st.sampled_from([1e-5, 1e-3, 0.1])))
def test_core_matches_float64_oracle(problem):
    src, diff_dst, mean, variance, gamma = problem_arrays(problem)
    common = dict(epsilon=problem["epsilon"], data_format=problem["data_format"], training=problem["training"])
    result = numpy_backward(src, diff_dst, mean, variance, gamma, **common,
                                block_bytes=problem["block_bytes"], threads=problem["threads"])
    expected = reference_backward(Op(src, diff_dst, mean, variance, gamma, **common))

    assert result.diff_src.dtype == src.dtype and result.diff_src.shape == src.shape
    assert result.diff_gamma.dtype == mean.dtype and result.diff_beta.dtype == mean.dtype
    assert normalised_error(result.diff_src, expected["diff_src"]) <= BOUNDS[np.dtype(src.dtype).name]
    for name in ("diff_gamma", "diff_beta"):
        # Param grads are rounded once to T2: their bound is T2's.
        assert normalised_error(getattr(result, name), expected[name]) <= BOUNDS[np.dtype(mean.dtype).name], name


def test_hand_computed_single_channel():
    # C=1, M=4: src 1..4, mean 2.5, var 1.25 (the batch stats), eps 0 -> xhat = (x-2.5)/sqrt(1.25)
    src = np.array([[1.0], [2.0], [3.0], [4.0]])
    diff_dst = np.array([[1.0], [0.0], [0.0], [-1.0]])
    result = numpy_backward(src, diff_dst, np.array([2.5]), np.array([1.25]), np.array([2.0]),
                                epsilon=1e-300, data_format="NXC")
    invstd = 1 / math.sqrt(1.25)
    xhat = (src[:, 0] - 2.5) * invstd
    assert result.diff_beta[0] == pytest.approx(0.0, abs=1e-15)
    assert result.diff_gamma[0] == pytest.approx(xhat[0] - xhat[3])  # = -3 * invstd
    expected = 2.0 * invstd * (diff_dst[:, 0] - 0.0 - xhat * (-3 * invstd) / 4)
    np.testing.assert_allclose(result.diff_src[:, 0], expected, rtol=1e-14)


def test_inference_is_scaled_diff_dst(rng):
    src = rng.normal(size=(3, 4, 5)).astype(np.float32)
    diff_dst = rng.normal(size=src.shape).astype(np.float32)
    variance = np.full(4, 3.0, np.float32)
    gamma = np.arange(1, 5, dtype=np.float32)
    result = numpy_backward(src, diff_dst, np.zeros(4, np.float32), variance, gamma,
                                epsilon=1.0, data_format="NCX", training=False)
    np.testing.assert_allclose(result.diff_src, diff_dst * (gamma / 2.0)[None, :, None], rtol=1e-6)


def test_invstd_input_equals_variance_input(rng):
    src = rng.normal(size=(6, 3, 7)).astype(np.float64)
    diff_dst = rng.normal(size=src.shape)
    mean, variance = rng.normal(size=3), rng.uniform(1, 2, size=3)
    by_variance = numpy_backward(src, diff_dst, mean, variance, None, epsilon=1e-3, data_format="NCX")
    invstd = 1 / np.sqrt(variance + 1e-3)
    by_invstd = numpy_backward(src, diff_dst, mean, invstd, None, epsilon=123.0, data_format="NCX",
                                   variance_is_invstd=True)
    np.testing.assert_allclose(by_invstd.diff_src, by_variance.diff_src, rtol=1e-13)


def test_layouts_agree_after_transpose(rng):
    src = rng.normal(size=(2, 5, 4, 3)).astype(np.float32)
    diff_dst = rng.normal(size=src.shape).astype(np.float32)
    stats = (rng.normal(size=5).astype(np.float32), rng.uniform(1, 2, 5).astype(np.float32))
    ncx = numpy_backward(src, diff_dst, *stats, epsilon=1e-5, data_format="NCX")
    nxc = numpy_backward(np.moveaxis(src, 1, -1).copy(), np.moveaxis(diff_dst, 1, -1).copy(), *stats,
                             epsilon=1e-5, data_format="NXC")
    np.testing.assert_allclose(np.moveaxis(nxc.diff_src, -1, 1), ncx.diff_src, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nxc.diff_gamma, ncx.diff_gamma, rtol=1e-5)


def test_empty_batch_gives_zero_param_grads():
    src = np.zeros((0, 3, 4), np.float32)
    result = numpy_backward(src, src, np.zeros(3, np.float32), np.ones(3, np.float32), None,
                                epsilon=1e-5, data_format="NCX")
    assert result.diff_src.shape == (0, 3, 4)
    np.testing.assert_array_equal(result.diff_gamma, 0)
    np.testing.assert_array_equal(result.diff_beta, 0)


def test_nan_propagates_only_in_its_channel():
    src = np.ones((4, 3, 2), np.float32)
    diff_dst = np.ones_like(src)
    diff_dst[1, 2, 0] = np.nan
    result = numpy_backward(src, diff_dst, np.zeros(3, np.float32), np.ones(3, np.float32), None,
                                epsilon=1e-5, data_format="NCX")
    assert np.isnan(result.diff_beta[2]) and np.isfinite(result.diff_beta[:2]).all()
    assert np.isnan(result.diff_src[:, 2]).all() and np.isfinite(result.diff_src[:, :2]).all()


def test_float16_sums_do_not_overflow():
    # 2e5 values of 1.5 sum to 3e5 > float16 max (65504): accumulating in f16 would give inf.
    src = np.full((1, 1, 200_000), 1.5, np.float16)
    result = numpy_backward(src, src, np.zeros(1, np.float32), np.ones(1, np.float32), None,
                                epsilon=1e-5, data_format="NCX")
    assert result.diff_beta[0] == pytest.approx(300_000.0)


def test_nxc_sum_is_accurate_for_long_columns():
    # A naive f32 running sum down a column of 2**22 values of 0.1 drifts by ~1e-2 relative; float64 sums do not.
    src = np.full((1 << 22, 2), 0.1, np.float32)
    result = numpy_backward(src, src, np.zeros(2, np.float32), np.ones(2, np.float32), None,
                                epsilon=1e-5, data_format="NXC", outputs=("diff_beta",))
    assert result.diff_beta[0] == pytest.approx(float(np.float32(0.1)) * (1 << 22), rel=1e-7)


def test_outputs_subset(rng):
    src = rng.normal(size=(2, 3, 4)).astype(np.float32)
    result = numpy_backward(src, src, np.zeros(3, np.float32), np.ones(3, np.float32), None,
                                epsilon=1e-5, data_format="NCX", outputs=("diff_src",))
    assert result.diff_gamma is None and result.diff_beta is None and result.diff_src is not None
