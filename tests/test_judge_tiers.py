"""The judge's two tiers agree: the verdict pass (no details) and the detailed pass give the same numbers."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli import dtypes
from bnbwd_cli.judge import compare
from bnbwd_cli.judge.rules import FixedRule, ScaledRule
from bnbwd_cli.judge.compare import Accumulator, Coordinates, Setup, compare_arrays
from bnbwd_cli.judge.tolerance import DEFAULT_TOLERANCES, MaxMismatch, Scaled, Tolerance


def _awkward_pair(rng: np.random.Generator, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(actual, reference) of shape (3, 4, 50): noise of every size, exact matches, zeros, NaN/Inf, subnormals."""
    reference = rng.standard_normal((3, 4, 50)).astype(dtype)
    reference[0, 0, :5] = 0.0
    reference[1, 1, 0] = np.finfo(np.float32).smallest_subnormal if dtype == np.float32 else 0.0
    actual = (reference.astype(np.float64) + rng.choice([0.0, 1e-7, 1e-5, 1e-3, 1e-1], size=reference.shape)).astype(dtype)
    actual[2, 3, 7], reference[2, 3, 7] = np.nan, np.nan
    actual[0, 2, 9] = np.inf
    actual[1, 0, 1], reference[1, 0, 1] = -np.inf, -np.inf
    return actual, reference


def _summary(comparison) -> str:
    """Every field the verdict pass fills (repr: NaN == NaN)."""
    return repr([(f.name, getattr(comparison, f.name)) for f in fields(comparison) if f.name not in ("details_of", "errors_of")])


def _pass(actual, reference, rule, setup: Setup, scale: np.ndarray | None = None) -> compare.Comparison:
    state = Accumulator(actual, reference, rule, setup)
    a, r = dtypes.to_float64(actual.reshape(-1)), dtypes.to_float64(reference.reshape(-1))
    for start in range(0, a.size, 128):  # several chunks, boundaries inside channels
        stop = min(start + 128, a.size)
        state.add(a[start:stop], r[start:stop], start, None if scale is None else scale[start:stop])
    return state.result()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("tolerance", [DEFAULT_TOLERANCES["f32"], Tolerance(1e-4, 0.0, 0.0, 1.0), Tolerance(0.0, 1e-2, 4.0, 1e-3)],
                         ids=["default", "atol-only", "rtol-ulp"])
def test_verdict_pass_and_detailed_pass_agree(rng, dtype, tolerance):
    actual, reference = _awkward_pair(rng, dtype)
    name = dtypes.dtype_name(np.dtype(dtype))
    setup = Setup(name, MaxMismatch(3), equal_nan=True, layout=Coordinates(("n", "c", "w"), 1), top_k=5)
    fast = _pass(actual, reference, FixedRule(tolerance), replace(setup, detailed=False))
    full = _pass(actual, reference, FixedRule(tolerance), setup)
    assert _summary(fast) == _summary(full)
    assert fast.passed == full.passed and fast.max_abs == full.max_abs and fast.max_ulp == full.max_ulp
    assert full.mismatches > 0 and full.max_abs.value > 0  # the case is not trivial
    # compare_arrays: the verdict pass, with the details computed on first use by the detailed pass.
    lazy = compare_arrays(actual, reference, tolerance, setup)
    assert _summary(lazy) == _summary(full)
    assert repr(lazy.details) == repr(full.details) and len(lazy.worst) == 5 and lazy.channels is not None


def test_scaled_rule_passes_agree(rng):
    actual, reference = _awkward_pair(rng, np.float32)
    scale = rng.uniform(1e-6, 1e-3, size=reference.size)
    rule = ScaledRule(Scaled(max_units=16.0, unit=2.0**-24))
    setup = Setup("f32", layout=Coordinates(("n", "c", "w"), 1))
    fast = _pass(actual, reference, rule, Setup("f32", layout=setup.layout, detailed=False), scale)
    full = _pass(actual, reference, rule, setup, scale)
    assert _summary(fast) == _summary(full) and fast.max_units == full.max_units and fast.min_units == full.min_units
    assert not full.passed and full.worst[0].units is not None


def test_details_are_computed_once_and_only_when_asked(rng, monkeypatch):
    """A passing output's details: a second pass on first use, once. A failing one's (its report reads them): in its
    one pass, from the chunk where it is seen to fail on, after a detailed pass over the chunks before (``end``)."""
    actual, reference = _awkward_pair(rng, np.float32)
    passes = []
    real = compare._fixed_pass
    monkeypatch.setattr(compare, "CHUNK", 128)
    monkeypatch.setattr(compare, "_fixed_pass",
                        lambda *args: passes.append((args[3].detailed, args[4] if len(args) > 4 else None)) or real(*args))
    within = DEFAULT_TOLERANCES["f32"]
    close = np.nextafter(reference, np.float32(np.inf))  # one ulp off: passes
    close[~np.isfinite(reference)] = reference[~np.isfinite(reference)]
    passing = compare_arrays(close, reference, within, replace(Setup(), equal_nan=True))
    assert passing.passed and passes == [(False, None)]
    assert passing.worst and passes == [(False, None), (True, None)]
    passes.clear()
    comparison = compare_arrays(actual, reference, within)
    assert not comparison.passed and passes == [(False, None), (True, 128)]  # (the first chunk fails already)
    first = comparison.worst
    assert comparison.histogram and comparison.max_rel.index is not None and comparison.worst is first
    assert passes == [(False, None), (True, 128)]
    assert repr(comparison.details) == repr(compare_arrays(actual, reference, within, lazy_details=False).details)


def test_ulp_spacing_from_exponent_bits_equals_frexp_route():
    values = np.array([0.0, -0.0, 1.0, -1.5, 2.0**-126, 2.0**-127, 2.0**-149, 5e-324, 2.2e-308, 1e308, -3.4e38,
                       65504.0, 6e-8, 1e-45, np.inf, -np.inf, np.nan, 2.0**127, 1e-300])
    values = np.concatenate([values, np.random.default_rng(3).standard_normal(1000) * 10.0 ** np.arange(-40, 40, 0.08)])
    for name, (nmant, emin) in dtypes.FLOAT_FORMAT.items():
        expected = dtypes._ulp_spacing_frexp(values, nmant, emin)
        np.testing.assert_array_equal(dtypes.ulp_spacing(values, name), expected, err_msg=name)
        np.testing.assert_array_equal(dtypes.ulp_spacing(values.reshape(-1, 1), name), expected.reshape(-1, 1))
        scratch = np.empty(values.size, dtype=np.int64)
        np.testing.assert_array_equal(dtypes.ulp_spacing(values, name, out=scratch), expected)
    assert dtypes.ulp_spacing(np.float64(1.0), "f32").shape == () and math.isclose(dtypes.ulp_spacing(np.float64(1.0), "f32"), 2**-23)
