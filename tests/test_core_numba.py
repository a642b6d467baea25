"""The optional compiled core (numba) against the float64 oracle and against the NumPy core."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")
pytestmark = pytest.mark.numba  # kernels compiled once a session (conftest.numba_jit)

import os
import subprocess
import sys
from pathlib import Path

import numba

from bnbwd_cli import runtime
from bnbwd_cli.op import Op
from bnbwd_cli.runtime import choose_core
from bnbwd_cli.core.reference import reference_backward
from tests.conftest import save_npy_flags
from tests.oracle import BOUNDS, backward_arrays, normalised_error, op_args, problem_arrays, problems

# Through runtime.load_numba_core, as a run loads it: it sets the kernels' cache directory first (numba was imported
# above, so it also reloads numba's settings). A direct import would cache beside the source and miss what the
# session's warm-up compiled (conftest.numba_jit).
numba_core = runtime.load_numba_core()

DTYPES = [np.float64, np.float32, ml_dtypes.bfloat16, np.float16]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(dtypes=DTYPES, max_rank=4, max_channels=9, max_batch=5,
               spatial_sizes=[1, 3, 40, 150],  # short runs take the row-block kernel, long ones the plane kernel
               invstd=st.booleans(), threads=st.sampled_from([1, 2])))
def test_numba_core_matches_oracle_and_numpy_core(problem):
    src, diff_dst, mean, variance, gamma = problem_arrays(problem)
    common = dict(epsilon=1e-3, data_format=problem["data_format"], training=problem["training"],
                  variance_is_invstd=problem["invstd"])
    fast = backward_arrays(src, diff_dst, mean, variance, gamma, **common, threads=problem["threads"], core="numba")
    slow = backward_arrays(src, diff_dst, mean, variance, gamma, **common, core="numpy")
    expected = reference_backward(Op(src, diff_dst, mean, variance, gamma, **common))

    assert fast.diff_src.dtype == src.dtype and fast.diff_src.shape == src.shape
    assert fast.diff_gamma.dtype == mean.dtype and fast.diff_beta.dtype == mean.dtype
    src_bound = BOUNDS[np.dtype(src.dtype).name]
    assert normalised_error(fast.diff_src, expected["diff_src"]) <= src_bound
    assert normalised_error(fast.diff_src, slow.diff_src.astype(np.float64)) <= src_bound
    for name in ("diff_gamma", "diff_beta"):
        bound = BOUNDS[np.dtype(mean.dtype).name]
        assert normalised_error(getattr(fast, name), expected[name]) <= bound, name
        assert normalised_error(getattr(fast, name), getattr(slow, name).astype(np.float64)) <= bound, name


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_same_bits_as_numpy_core_and_outputs_subset(rng, dtype, data_format):
    shape = (3, 4, 50, 5) if data_format == "NCX" else (3, 50, 5, 4)
    src, diff_dst, *stats, _ = op_args(rng, shape, data_format, dtype)
    out = np.empty_like(src)
    fast = backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numba",
                              diff_src_out=out)
    slow = backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numpy")
    assert fast.diff_src is out
    # Same formula, same order, no fastmath: identical bits except where float64 sums differ in the last place.
    assert np.mean(out.view(np.uint16 if out.itemsize == 2 else np.uint32)
                   == slow.diff_src.view(np.uint16 if out.itemsize == 2 else np.uint32)) > 0.99
    only = backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numba",
                              outputs=("diff_gamma",))
    assert only.diff_src is None and only.diff_beta is None
    np.testing.assert_allclose(only.diff_gamma, slow.diff_gamma, rtol=1e-6)


def test_bfloat16_rounding_and_nan(rng):
    # Inference: diff_src = bf16(f32(dy) * f32(invstd)), rounded to nearest even as ml_dtypes does; the
    # first two scales make exact ties (1 * (1 + 2**-8) rounds down to 1, 1 * (1 + 3 * 2**-8) up to 1 + 2**-6).
    scales = np.array([1 + 2**-8, 1 + 3 * 2**-8, 0.3, 1e-3, 3e38], np.float32)
    dy = rng.normal(size=(4, 5, 64)).astype(np.float32)
    dy[:, :, :4] = [1.0, np.nan, np.inf, -np.inf]
    dy = dy.astype(ml_dtypes.bfloat16)
    result = backward_arrays(dy, dy, np.zeros(5, np.float32), scales, None, epsilon=1.0, data_format="NCX",
                                training=False, variance_is_invstd=True, core="numba")
    with np.errstate(over="ignore", invalid="ignore"):
        expected = (dy.astype(np.float32) * scales[None, :, None]).astype(ml_dtypes.bfloat16)
    is_nan = np.isnan(expected.astype(np.float32))
    np.testing.assert_array_equal(result.diff_src.view(np.uint16)[~is_nan], expected.view(np.uint16)[~is_nan])
    np.testing.assert_array_equal(np.isnan(result.diff_src.astype(np.float32)), is_nan)
    assert np.isnan(result.diff_src[:, :, 1].astype(np.float32)).all()
    assert result.diff_src[0, 0, 0] == 1.0 and result.diff_src[0, 1, 0] == 1 + 2**-6


def test_float16_rounding_nan_inf_and_subnormals(rng):
    # Inference: diff_src = f16(f32(dy) * f32(invstd)); NumPy's own float32 -> float16 cast is the reference
    # (round to nearest even, overflow to inf, subnormal results, NaN kept).
    scales = np.array([1 + 2**-11, 1 + 3 * 2**-11, 0.3, 1e-6, 1e5], np.float32)
    dy = rng.normal(size=(4, 5, 64)).astype(np.float32)
    dy[:, :, :6] = [1.0, np.nan, np.inf, -np.inf, 6e-8, -65504.0]
    dy = dy.astype(np.float16)
    result = backward_arrays(dy, dy, np.zeros(5, np.float32), scales, None, epsilon=1.0, data_format="NCX",
                                training=False, variance_is_invstd=True, core="numba")
    with np.errstate(over="ignore", invalid="ignore"):
        expected = (dy.astype(np.float32) * scales[None, :, None]).astype(np.float16)
    is_nan = np.isnan(expected)
    np.testing.assert_array_equal(result.diff_src.view(np.uint16)[~is_nan], expected.view(np.uint16)[~is_nan])
    np.testing.assert_array_equal(np.isnan(result.diff_src), is_nan)
    assert np.isinf(result.diff_src[0, 4, 5])  # -65504 * 1e5 overflows
    assert result.diff_src[0, 3, 4] == 0 and result.diff_src[0, 0, 0] == 1.0  # 6e-8 * 1e-6 underflows; a tie rounds to even


@pytest.mark.parametrize("data_format, shape", [("NCX", (3, 3, 5000)), ("NXC", (300, 5000)), ("NCX", (2, 1, 9000))])
def test_results_do_not_depend_on_threads(rng, data_format, shape):
    # Few channels split the planes into chunks (one thread a chunk) and wide rows split into column chunks;
    # the chunk sums are folded in one fixed order, so every thread count gives the same bits.
    src, diff_dst, *stats, _ = op_args(rng, shape, data_format)
    results = [backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numba",
                                  threads=threads) for threads in (1, 2, 8)]
    for other in results[1:]:
        for name in ("diff_src", "diff_gamma", "diff_beta"):
            np.testing.assert_array_equal(getattr(other, name), getattr(results[0], name), err_msg=name)
    expected = reference_backward(Op(src, diff_dst, *stats, None, epsilon=1e-5, data_format=data_format))
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        assert normalised_error(getattr(results[0], name), expected[name]) <= BOUNDS["float32"], name


def _op(src):
    return Op(src, src, np.zeros(src.shape[1], np.float32), np.ones(src.shape[1], np.float32), epsilon=1e-5,
              data_format="NCX")


def test_auto_core_choice_depends_on_element_count_alone(tmp_path, monkeypatch):
    src = np.ones((2, 3, 4), np.float32)
    assert choose_core("numba", _op(src.astype(np.float16)), None) == "numba"
    # Small inputs stay on NumPy whether or not numba is loaded already (numba's start-up costs more).
    assert "bnbwd_cli.core.numba_core" in sys.modules
    assert choose_core("auto", _op(src), None) == "numpy"
    monkeypatch.setattr(runtime, "AUTO_NUMBA_MIN_ELEMENTS", 24)
    assert choose_core("auto", _op(src), None) == "numba"
    # Elements decide, not bytes: numba saves a time an element whatever the dtype.
    assert choose_core("auto", _op(src.astype(np.float16)), None) == "numba"  # 24 elements in 48 bytes
    assert choose_core("auto", _op(np.ones((1, 3, 4))), None) == "numpy"  # 12 elements in 96 bytes
    path = tmp_path / "src.npy"
    np.save(path, src)
    assert choose_core("auto", _op(np.load(path, mmap_mode="r")), None) == "numpy"  # mapped: bounded RSS
    monkeypatch.setenv("BNBWD_CORE", "numpy")
    assert choose_core("auto", _op(src), None) == "numpy"
    with pytest.raises(ValueError):
        backward_arrays(src, src, np.zeros(3, np.float32), np.ones(3, np.float32), epsilon=1e-5, data_format="NCX",
                        core="fortran")


def test_importing_the_core_sets_nothing_process_wide():
    # The OpenMP wait policy is a default for numba's pool: set where the numba core is chosen, not at import.
    code = ("import os, bnbwd_cli.core, bnbwd_cli.cli; assert 'OMP_WAIT_POLICY' not in os.environ; "
            "import sys; assert 'numba' not in sys.modules")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parent.parent)


@pytest.mark.parametrize("core", ["numba", "numpy"])
def test_cli_core_option(cli, tmp_path, rng, core):
    shape = (2, 3, 5, 7)
    arrays = dict(src=rng.normal(size=shape).astype(np.float32), diff_dst=rng.normal(size=shape).astype(np.float32),
                  mean=np.zeros(3, np.float32), variance=np.ones(3, np.float32))
    out = tmp_path / f"out_{core}.npz"
    result = cli("run", *save_npy_flags(tmp_path, arrays, names=tuple(arrays)), "--epsilon", "1e-5",
                 "--format", "NCHW", "--core", core, "-q", "-o", out)
    assert result.exit_code == 0, result.output
    expected = reference_backward(Op(*arrays.values(), None, epsilon=1e-5, data_format="NCX"))
    with np.load(out) as written:
        assert normalised_error(written["diff_src"], expected["diff_src"]) <= BOUNDS["float32"]


def test_cli_core_numba_missing_is_a_usage_error(cli, monkeypatch):
    monkeypatch.setattr(runtime, "numba_available", lambda: False)
    result = cli("run", "--core", "numba", "x.npz")
    assert result.exit_code == 2
    assert "numba" in result.output + (result.stderr if hasattr(result, "stderr") else "")


def test_cli_numba_core_runs_streamed_blocks(cli, tmp_path):
    # --stream reads blocks of channels into memory (no mmap any more), so the numba core can run them.
    src = np.ones((2, 3, 4), np.float32)
    np.save(tmp_path / "src.npy", src)
    np.savez(tmp_path / "b.npz", diff_dst=src, mean=np.zeros(3, np.float32), variance=np.ones(3, np.float32))
    result = cli("run", "-q", tmp_path / "b.npz", "--src", tmp_path / "src.npy", "--epsilon", "1e-5", "--format", "NCX",
                 "--stream", "--core", "numba", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.stderr
    with np.load(tmp_path / "out.npz") as written:
        assert written["diff_src"].shape == src.shape


@pytest.mark.parametrize("data_format, shape", [("NCX", (64, 4, 3000)), ("NXC", (20000, 4)), ("NCX", (4, 2, 70000))])
def test_cancellation_prone_inputs_keep_float32_accuracy(data_format, shape):
    # src sits 1e4 standard deviations from zero: a one-pass Σdy·src - mean·Σdy in float32 would lose every
    # digit of Σdy·(src - mean). The reassociated float64 sums must match the fsum oracle to float32 accuracy.
    rng = np.random.default_rng(7)
    channels = shape[1] if data_format == "NCX" else shape[-1]
    offset = rng.uniform(-1e4, 1e4, channels).astype(np.float32)
    per_element = offset[:, None] if data_format == "NCX" else offset  # broadcast along the channel axis
    src = (per_element + rng.normal(size=shape)).astype(np.float32)
    diff_dst = rng.normal(size=shape).astype(np.float32)
    mean = src.astype(np.float64).mean(axis=0 if data_format == "NXC" else (0, 2)).astype(np.float32)
    variance = np.ones(channels, np.float32)
    fast = backward_arrays(src, diff_dst, mean, variance, None, epsilon=1e-5, data_format=data_format, core="numba")
    expected = reference_backward(Op(src, diff_dst, mean, variance, None, epsilon=1e-5, data_format=data_format))
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        assert normalised_error(getattr(fast, name), expected[name]) <= BOUNDS["float32"], name


def test_float16_without_hardware_half_conversions_stays_on_numpy(monkeypatch, rng):
    # Without F16C (or with NUMBA_CPU_NAME=generic) numba's JIT cannot link LLVM's half conversions and the
    # process would abort: float16 must then run on the NumPy core, even with core="numba".
    monkeypatch.setattr(numba.config, "CPU_NAME", "generic")
    assert not numba_core.half_is_native()
    src = rng.normal(size=(2, 3, 300)).astype(np.float16)
    assert choose_core("numba", _op(src), None) == "numpy"
    assert choose_core("numba", _op(src.astype(np.float32)), None) == "numba"
    result = backward_arrays(src, src, np.zeros(3, np.float32), np.ones(3, np.float32), epsilon=1e-3,
                                data_format="NCX", core="numba")
    assert result.core == "numpy"


def _rounding_cases(rng: np.random.Generator) -> np.ndarray:
    """float64 values that stress rounding once to f32/f16/bf16: random magnitudes from f32 subnormals to
    overflow, exact ties of bf16 and f16 neighbours and their float64 neighbours, and the special values."""
    random = rng.uniform(1, 2, 4000) * 2.0 ** rng.integers(-160, 135, 4000) * rng.choice([-1, 1], 4000)
    neighbours = rng.standard_normal(2000).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 30, 2000)
    bf16_ties = (neighbours.view(np.uint32) & np.uint32(0xFFFF0000) | np.uint32(0x8000)).view(np.float32)
    f16_values = rng.standard_normal(2000).astype(np.float16) * np.float16(2.0) ** rng.integers(-14, 15, 2000)
    f16_ties = (f16_values.astype(np.float64) + np.nextafter(f16_values, np.float16(np.inf)).astype(np.float64)) / 2
    subnormal_ties = (np.arange(-40, 40) + 0.5) * 2.0**-24  # f16 subnormal midpoints
    ties = np.concatenate([bf16_ties.astype(np.float64), f16_ties, subnormal_ties])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65520.0, -65520.0, 3.4028234663852886e38,
                         3.4028235677973366e38, 1e39, -1e300, 1e-40, 1e-45, 5e-324, 2.0**-149 * 1.5, 2.0**-25])
    return np.concatenate([random, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), specials])


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_store_rounds_once_as_the_numpy_core(rng, dtype):
    # The kernels' element store (float64 -> T1; f16/bf16 through float32 rounded to odd, written without
    # branches so the loops vectorise) must give rounding.store's bits, the NumPy core's, on every value.
    from numba import njit

    from bnbwd_cli.core import numba_bits, rounding

    @njit
    def store_all(values, out):
        for i in range(values.shape[0]):
            numba_bits.store(out, i, values[i])

    values = _rounding_cases(rng)
    expected = rounding.round_to(values, np.dtype(dtype))
    out = np.empty(values.shape, dtype)
    store_all(values, numba_core._bits_view(out))
    bits = np.uint16 if out.itemsize == 2 else np.uint32
    is_nan = np.isnan(expected.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(out.astype(np.float64)), is_nan)
    np.testing.assert_array_equal(out.view(bits)[~is_nan], expected.view(bits)[~is_nan])
    if dtype == np.float16:  # the tie above float16's largest value rounds to even: inf
        assert np.isinf(out[values == 65520.0].astype(np.float64)).all()


def test_read_only_inputs_reuse_the_compiled_kernels(rng):
    # numba types a read-only array apart from a writable one: --stream's read-only blocks would compile (and
    # cache) a second version of each kernel, unless the core hands its kernels read-only views always.
    from bnbwd_cli.core import numba_kernels

    kernels = [numba_kernels.planes_fused, numba_kernels.plane_partials, numba_kernels.plane_write,
               numba_kernels.row_partials, numba_kernels.row_write]
    for shape, data_format in [((2, 4, 300), "NCX"), ((2, 1, 300), "NCX"), ((50, 3), "NXC")]:
        src, diff_dst, *stats, _ = op_args(rng, shape, data_format)
        backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numba", threads=1)
    versions = [len(kernel.signatures) for kernel in kernels]
    for shape, data_format in [((2, 4, 300), "NCX"), ((2, 1, 300), "NCX"), ((50, 3), "NXC")]:
        src, diff_dst, *stats, _ = op_args(rng, shape, data_format)
        for read_only in (src, diff_dst):
            read_only.flags.writeable = False
            backward_arrays(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format, core="numba", threads=1)
    assert [len(kernel.signatures) for kernel in kernels] == versions
