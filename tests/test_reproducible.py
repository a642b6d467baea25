"""The reference itself: faithfully rounded (within 1 ulp of a long-double oracle), and the same bits for any
thread count, block size, streaming and core (docs/guarantees.md)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bnbwd_cli.app import streaming
from bnbwd_cli.files.blocks import NpyBlocks
from bnbwd_cli.files.write import OutputSet
from bnbwd_cli.core import Op, Settings, rounding
from tests.oracle import backward_arrays, exact_backward, normalised_error, op_args, problem_arrays, problems, ulps

BF16 = np.dtype(ml_dtypes.bfloat16)
NARROW = [np.float32, np.float16, ml_dtypes.bfloat16]
OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")
# Shapes for the configuration sweeps: planes split in lane blocks, rows grouped, NXC, several chunks with a short
# last one (planes: 64 rows a chunk; one element a row: 1024).
SHAPES = [((3, 5, 7, 9), "NCX"), ((2100, 3, 1), "NCX"), ((2, 2, 9000), "NCX"), ((3, 7, 9, 5), "NXC"),
          ((2500, 3), "NXC"), ((9, 300, 2), "NXC"), ((130, 2, 40), "NCX")]


def _bits(array: np.ndarray) -> np.ndarray:
    """The bit patterns, NaNs made one pattern (the cores may quiet a NaN differently)."""
    bits = array.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[array.itemsize]).copy()
    bits[np.isnan(array.astype(np.float64))] = 0
    return bits


def assert_same_bits(result, other, label=""):
    for name in OUTPUTS:
        np.testing.assert_array_equal(_bits(getattr(other, name)), _bits(getattr(result, name)), err_msg=f"{name} {label}")


# ---------------------------------------------------------------- faithful rounding


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(dtypes=NARROW, max_rank=4, max_channels=6, max_batch=40, spatial_sizes=[1, 2, 5, 40, 300],
               max_elements=200_000, stats=("float32", "float64", "same"), epsilon=st.sampled_from([1e-5, 0.1])))
def test_every_narrow_output_within_one_ulp_of_long_double_oracle(problem):
    arrays = problem_arrays(problem)
    common = dict(epsilon=problem["epsilon"], data_format=problem["data_format"], training=problem["training"])
    result = backward_arrays(*arrays, **common, core="numpy")
    exact = exact_backward(*arrays, **common)
    for name in OUTPUTS:
        output = getattr(result, name)
        if output.dtype == np.float64:  # float64 stats: the float64 promise (1e-12 on ordinary conditioning)
            assert normalised_error(output, exact[name].astype(np.float64)) <= 1e-12, name
        else:
            assert ulps(output, exact[name]) <= 1.0, name


# ---------------------------------------------------------------- the same bits in every configuration


@pytest.mark.parametrize("shape,data_format", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16, np.float16], ids=["f64", "f32", "bf16", "f16"])
def test_same_bits_for_any_threads_and_block_size(rng, shape, data_format, dtype):
    arrays = op_args(rng, shape, data_format, dtype, np.float64 if dtype == np.float64 else np.float32)
    base = backward_arrays(*arrays, epsilon=1e-5, data_format=data_format, core="numpy", threads=1)
    for threads, block_bytes in [(2, None), (3, 64), (7, 4096), (2, 1 << 16), (1, 1 << 24)]:
        other = backward_arrays(*arrays, epsilon=1e-5, data_format=data_format, core="numpy", threads=threads,
                                block_bytes=block_bytes)
        assert_same_bits(base, other, f"threads={threads} block_bytes={block_bytes}")


@pytest.mark.parametrize("shape,data_format", SHAPES[:4], ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16], ids=["f64", "f32", "bf16"])
def test_streamed_run_gives_the_in_memory_bits(tmp_path, rng, monkeypatch, shape, data_format, dtype):
    """--stream: blocks of whole channels read from the files, one channel a block here."""
    src, diff_dst, *stats = op_args(rng, shape, data_format, dtype)
    in_memory = backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numpy")
    np.save(tmp_path / "src.npy", src)
    np.save(tmp_path / "dy.npy", diff_dst)
    monkeypatch.setattr(streaming, "STREAM_BLOCK_BYTES", 1)  # one channel a block
    op = Op(NpyBlocks(tmp_path / "src.npy", "src"), NpyBlocks(tmp_path / "dy.npy", "diff_dst"), *stats, epsilon=1e-5,
            data_format=data_format)
    run = Settings(block_bytes=512, threads=3, core="numpy")
    with OutputSet() as outputs:
        streamed = streaming.run_streamed(op, run, outputs.new_npy(tmp_path / "out.npy", src.shape, src.dtype))
    streamed_src = np.load(tmp_path / "out.npy")
    if dtype is ml_dtypes.bfloat16:
        streamed_src = streamed_src.view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(_bits(streamed_src), _bits(in_memory.diff_src))
    for name in ("diff_gamma", "diff_beta"):
        np.testing.assert_array_equal(_bits(getattr(streamed, name)), _bits(getattr(in_memory, name)))


@pytest.mark.parametrize("shape,data_format", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16, np.float16], ids=["f64", "f32", "bf16", "f16"])
@pytest.mark.numba
def test_numba_core_gives_the_numpy_core_bits(rng, shape, data_format, dtype):
    pytest.importorskip("numba")
    from bnbwd_cli.runtime import load_numba_core

    if not load_numba_core().supports(dtype):
        pytest.skip("float16 needs hardware half conversions in the numba core")
    arrays = op_args(rng, shape, data_format, dtype, np.float64 if dtype == np.float64 else np.float32)
    for training in (True, False):
        expected = backward_arrays(*arrays, epsilon=1e-5, data_format=data_format, training=training, core="numpy")
        for threads in (1, 2, 3, 7):
            result = backward_arrays(*arrays, epsilon=1e-5, data_format=data_format, training=training, core="numba",
                                     threads=threads)
            assert result.core == "numba"
            assert_same_bits(expected, result, f"threads={threads} training={training}")


# ---------------------------------------------------------------- the hard cases: large means, extreme scales, rounding once


def _stats(src, data_format):
    """Consistent float64 batch statistics of src."""
    axes = tuple(i for i in range(src.ndim) if i != (1 if data_format == "NCX" else src.ndim - 1))
    wide = src.astype(np.float64)
    return wide.mean(axis=axes), wide.var(axis=axes)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_large_mean_with_float64_stats_is_not_rounded_to_float32(rng, data_format):
    # |mean| = 1e4: rounding mean to float32 before src - mean left errors of 4e-4.
    shape = (16, 3, 50) if data_format == "NCX" else (16, 50, 3)
    src = (1e4 + rng.normal(size=shape)).astype(np.float32)
    mean, variance = _stats(src, data_format)
    diff_dst = rng.normal(size=shape).astype(np.float32)
    result = backward_arrays(src, diff_dst, mean, variance, None, epsilon=1e-5, data_format=data_format)
    exact = exact_backward(src, diff_dst, mean, variance, None, epsilon=1e-5, data_format=data_format)
    assert ulps(result.diff_src, exact["diff_src"]) <= 1.0
    for name in ("diff_gamma", "diff_beta"):  # float64 stats, float64 outputs
        assert normalised_error(getattr(result, name), exact[name].astype(np.float64)) <= 1e-12, name


def test_diff_dst_with_large_mean_is_not_rounded_first(rng):
    # dy = 1e3 + N(0, 1): rounding mean(dy) before dy - mean(dy) left errors of 6e-6.
    src = rng.normal(size=(8, 4, 300)).astype(np.float32)
    diff_dst = (1e3 + rng.normal(size=src.shape)).astype(np.float32)
    stats = (np.zeros(4, np.float32), np.ones(4, np.float32), np.full(4, 1.5, np.float32))
    result = backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format="NCX")
    exact = exact_backward(src, diff_dst, *stats, epsilon=1e-5, data_format="NCX")
    for name in OUTPUTS:
        assert ulps(getattr(result, name), exact[name]) <= 1.0, name


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_huge_gamma_with_tiny_variance_stays_finite(rng, dtype):
    # gamma 1e25, var 1e-30: invstd·gamma = 1e40 overflowed float32 and every diff_src was inf (exact max ~1e30).
    src = (1e-15 * rng.normal(size=(6, 2, 40))).astype(dtype)
    diff_dst = (1e-10 * rng.normal(size=src.shape)).astype(dtype)
    mean, variance = _stats(src, "NCX")
    gamma = np.full(2, 1e25)
    result = backward_arrays(src, diff_dst, mean, variance, gamma, epsilon=1e-300, data_format="NCX")
    exact = exact_backward(src, diff_dst, mean, variance, gamma, epsilon=1e-300, data_format="NCX")
    assert np.isfinite(result.diff_src).all() and np.abs(result.diff_src).max() > 1e20
    if dtype == np.float32:
        assert ulps(result.diff_src, exact["diff_src"]) <= 1.0
    else:
        assert normalised_error(result.diff_src, exact["diff_src"].astype(np.float64)) <= 1e-12


def test_float64_scale_beyond_range_is_applied_in_two_steps(rng):
    # gamma·invstd = 1e320 is not a float64, but diff_src = dy·gamma·invstd ~1e300 is: the scale is split.
    src = rng.normal(size=(5, 2, 30))
    diff_dst = 1e-20 * rng.normal(size=src.shape)
    invstd, gamma = np.full(2, 1e20), np.full(2, 1e300)
    result = backward_arrays(src, diff_dst, np.zeros(2), invstd, gamma, epsilon=1.0, data_format="NCX",
                             variance_is_invstd=True, training=False)
    expected = diff_dst.astype(np.longdouble) * np.longdouble(1e20) * np.longdouble(1e300)
    assert np.isfinite(result.diff_src).all()
    assert normalised_error(result.diff_src, expected.astype(np.float64)) <= 1e-15


def test_tiny_gamma_keeps_subnormal_results_faithful(rng):
    # gamma 1.5e-38: a float32 scale loses bits to the subnormal range (errors of 4e-2 before).
    src = rng.normal(size=(8, 3, 40)).astype(np.float32)
    diff_dst = rng.normal(size=src.shape).astype(np.float32)
    stats = (np.zeros(3, np.float32), np.full(3, 0.7, np.float32), np.full(3, 1.5e-38, np.float32))
    result = backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format="NCX")
    exact = exact_backward(src, diff_dst, *stats, epsilon=1e-5, data_format="NCX")
    assert ulps(result.diff_src, exact["diff_src"]) <= 1.0


def test_diff_dst_near_float32_max_does_not_overflow_on_the_way(rng):
    # |dy| near 3e38: dy - mean(dy) overflowed float32; in float64 it does not, and the result is representable.
    src = rng.normal(size=(6, 2, 50)).astype(np.float32)
    diff_dst = (rng.choice([-3e38, 3e38], size=src.shape) * rng.uniform(0.9, 1.0, size=src.shape)).astype(np.float32)
    stats = (np.zeros(2, np.float32), np.full(2, 9.0, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = backward_arrays(src, diff_dst, *stats, None, epsilon=0.0, data_format="NCX")
    exact = exact_backward(src, diff_dst, *stats, None, epsilon=0.0, data_format="NCX")
    assert np.isfinite(result.diff_src).all()
    assert ulps(result.diff_src, exact["diff_src"]) <= 1.0


def test_float32_src_near_max_with_consistent_stats_gives_zero_not_inf(rng):
    # src = ±3e38 and dy = src with their float64 batch stats: the exact diff_src is 0 (dy is a multiple of xhat).
    src = (rng.choice([-1.0, 1.0], size=(4, 2, 64)) * 3e38).astype(np.float32)
    mean, variance = _stats(src, "NCX")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = backward_arrays(src, src, mean, variance, None, epsilon=0.0, data_format="NCX")
    assert np.isfinite(result.diff_src).all()
    assert np.abs(result.diff_src).max() < 1e-6  # float64 rounding of terms of 3e38, times invstd ~3e-39


def test_bfloat16_stat_outputs_are_rounded_once():
    # Σdy = 1 + 2**-8 + 2**-30 lies just above the midpoint of 1 and 1 + 2**-7: bf16 rounds it up. Through
    # float32 first it would become 1 + 2**-8, a tie, and round to even: 1.
    diff_dst = np.array([1.0, 2**-8, 2**-30, 0.0], dtype=BF16).reshape(4, 1)
    src = np.zeros((4, 1), BF16)
    stats = (np.zeros(1, BF16), np.ones(1, BF16))
    result = backward_arrays(src, diff_dst, *stats, None, epsilon=0.0, data_format="NXC")
    assert result.diff_beta.dtype == BF16 and float(result.diff_beta[0]) == 1 + 2**-7


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_round_to_rounds_float64_once(rng, dtype):
    # Values just off the midpoints of the narrow grid: rounding through float32 first would make them ties.
    grid = rng.normal(size=2000).astype(dtype)
    narrow = grid.astype(np.float64)
    step = np.abs(np.nextafter(grid.astype(np.float32), np.float32(np.inf)).astype(dtype).astype(np.float64) - narrow)
    if dtype == np.float16:
        step = np.spacing(grid).astype(np.float64)
    nudge = rng.choice([-1.0, 1.0], size=grid.shape) * 2.0**-40 * np.abs(narrow)
    values = narrow + step / 2 + nudge
    rounded = rounding.round_to(values, np.dtype(dtype)).astype(np.float64)
    expected = np.where(nudge > 0, narrow + step, narrow)
    np.testing.assert_array_equal(rounded, expected)


def _round_to_odd_plainly(values: np.ndarray) -> np.ndarray:
    """Rounding to odd by its definition, one element at a time: the float32 at or toward zero from the value,
    its last bit set when it is not the value (NaN stays NaN; beyond float32's range: its largest, odd)."""
    result = np.empty(values.shape, np.uint32)
    for i, value in enumerate(values):
        with np.errstate(over="ignore", invalid="ignore"):
            narrow = np.float32(value)
        if abs(float(narrow)) > abs(value):
            narrow = np.nextafter(narrow, np.float32(0))
        bits = int(narrow.view(np.uint32))
        result[i] = bits | 1 if (float(narrow) != value) else bits
    return result


def test_round_to_odd_follows_its_definition(rng):
    """The f16/bf16 write rounds float64 to odd float32 first: every element as defined, over float32's whole
    range and beyond (subnormals, overflow, zeros of both signs, infinities, NaN, exact values)."""
    values = rng.standard_normal(777) * 10.0 ** rng.integers(-50, 45, 777)
    values[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.5e38, -1e-46, float(np.float32(1.5))]
    out = np.empty(values.shape, np.float32)
    rounding.round_to_odd_float32(values, out)
    assert np.array_equal(out.view(np.uint32)[1:], _round_to_odd_plainly(values)[1:])
    assert np.isnan(out[0])


def test_bfloat16_store_rounds_once_where_float32_lands_on_a_tie(rng):
    """bf16 writes round to float32 and on to bf16, except where the float32 is a bf16 tie: every element is the
    bits of the float32-rounded-to-odd route (which rounds once), into a strided view, specials and ties included."""
    grid = rng.normal(size=3000).astype(BF16).astype(np.float64)
    step = np.abs(np.nextafter(grid.astype(BF16), BF16.type(np.inf)).astype(np.float64) - grid)
    near_ties = grid + step / 2 + rng.choice([-1.0, 0.0, 1.0], size=grid.shape) * 2.0**-40 * np.abs(grid)
    wide = rng.standard_normal(3000) * 10.0 ** rng.integers(-45, 40, 3000)
    values = np.concatenate([near_ties, wide, [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.3961e38, 3.5e38, -1e-41, 2.0**-134 * 3]])
    values = values.reshape(-1, 1)
    storage = np.zeros((values.shape[0], 3), BF16)
    returned = rounding.store(values, storage[:, 1:2])  # a strided column, as the NumPy core's tiles are
    odd = np.empty(values.shape, np.float32)
    rounding.round_to_odd_float32(values, odd)
    expected = odd.astype(BF16)
    assert np.array_equal(_bits(storage[:, 1]), _bits(expected[:, 0]))
    assert not storage[:, [0, 2]].astype(np.float64).any()  # nothing written beside the view
    assert np.array_equal(_bits(returned.astype(BF16)), _bits(expected))  # the extremes' source rounds the same
