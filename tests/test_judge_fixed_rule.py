"""Hand-computed micro cases for every statistic of the fixed rule (bnbwd_cli/judge)."""

from __future__ import annotations

import math
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bnbwd_cli.dtypes import ulp_spacing
from bnbwd_cli.judge.keys import match_keys, permutation_hint, structural_problem
from bnbwd_cli.judge.compare import Coordinates, Setup, compare_arrays, log_histogram
from bnbwd_cli.judge.tolerance import DEFAULT_TOLERANCES, Judging, MaxMismatch, PerOutput, Tolerance, comparison_dtype

LOOSE_ULP_OFF = Tolerance(atol=0.1, rtol=0.0, ulp=0.0, rel_l2=1.0)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# ---------------------------------------------------------------- element-wise rule


def test_element_rule_atol_plus_rtol_times_reference():
    reference = np.array([0.0, 10.0, 10.0, -10.0])
    # bound = 0.1 + 0.01*|r|: 0.1 at r=0, 0.2 at |r|=10
    actual = np.array([0.1, 10.2, 10.25, -10.3])
    result = compare_arrays(actual, reference, Tolerance(atol=0.1, rtol=0.01, ulp=0.0, rel_l2=1.0))
    assert result.mismatches == 2
    assert [e.index for e in result.worst if not e.passed] == [(3,), (2,)]  # ratio 1.5, then 1.25
    assert result.worst[0].ratio == pytest.approx(1.5)


def test_ulp_bound_passes_elements_outside_atol_rtol():
    reference = f32(1.0, 1.0)
    actual = np.array([np.nextafter(np.float32(1), np.float32(2)), np.float32(1) + 2 * np.finfo(np.float32).eps], dtype=np.float32)
    strict = Tolerance(atol=0.0, rtol=0.0, ulp=1.0, rel_l2=1.0)
    result = compare_arrays(actual, reference, strict)
    assert result.max_ulp.value == 2.0 and result.max_ulp.index == (1,)
    assert result.mismatches == 1  # the 1-ulp element passes through the ULP bound
    assert compare_arrays(actual, reference, Tolerance(0.0, 0.0, 2.0, 1.0)).mismatches == 0


def test_ulp_spacing_matches_numpy_spacing_for_ieee_types(rng):
    values = np.concatenate([rng.standard_normal(100) * 10.0 ** rng.integers(-4, 4, 100), [0.0, 1.0, 2.0, -4.0]])
    for dtype, name in ((np.float16, "f16"), (np.float32, "f32"), (np.float64, "f64")):
        rounded = values.astype(dtype)
        expected = np.spacing(np.abs(rounded)).astype(np.float64)
        np.testing.assert_array_equal(ulp_spacing(rounded.astype(np.float64), name), expected)


def test_ulp_spacing_bfloat16_has_7_mantissa_bits():
    np.testing.assert_array_equal(ulp_spacing(np.array([1.0, 1.5, 2.0, -0.75]), "bf16"), [2**-7, 2**-7, 2**-6, 2**-8])
    assert ulp_spacing(np.array([0.0]), "bf16")[0] == 2.0 ** (-126 - 7)  # smallest subnormal
    one = np.array([1.0], dtype=ml_dtypes.bfloat16)
    next_up = np.array([1.0078125], dtype=ml_dtypes.bfloat16)
    assert compare_arrays(next_up, one, DEFAULT_TOLERANCES["bf16"]).max_ulp.value == 1.0


def test_coarser_dtype_sets_tolerance_grid():
    assert comparison_dtype(np.dtype(np.float16), np.dtype(np.float32)) == "f16"
    assert comparison_dtype(np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)) == "bf16"
    result = compare_arrays(np.float16([1.0]), np.float32([1.0 + 2**-10]), DEFAULT_TOLERANCES["f16"])
    assert result.dtype == "f16" and result.max_ulp.value == 1.0


# ---------------------------------------------------------------- statistics


def test_max_abs_rel_with_locations_and_rel_skips_zero_reference():
    reference = np.array([[0.0, 2.0], [4.0, -1.0]])
    actual = np.array([[0.5, 2.2], [4.4, -1.0]])
    result = compare_arrays(actual, reference, LOOSE_ULP_OFF)
    assert result.max_abs.value == pytest.approx(0.5) and result.max_abs.index == (0, 0)
    # rel: 0.1 at (0,1) and (1,0); the zero reference at (0,0) is skipped
    assert result.max_rel.value == pytest.approx(0.1) and result.max_rel.index == (0, 1)


def test_relative_l2_and_its_gate():
    reference = np.array([3.0, 4.0])  # ||r|| = 5
    actual = np.array([3.0, 4.5])  # ||a-r|| = 0.5
    assert compare_arrays(actual, reference, Tolerance(1.0, 0.0, 0.0, 0.1)).rel_l2 == pytest.approx(0.1)
    failing = compare_arrays(actual, reference, Tolerance(1.0, 0.0, 0.0, 0.09))
    assert failing.mismatches == 0 and not failing.rel_l2_passed and not failing.passed


def test_relative_l2_gate_skipped_for_zero_reference():
    result = compare_arrays(np.array([1e-9, 0.0]), np.zeros(2), Tolerance(1e-6, 0.0, 0.0, 1e-3))
    assert result.rel_l2 == math.inf and result.rel_l2_passed and result.passed


def test_minimum_passing_tolerances():
    reference = np.array([1.0, 2.0, 4.0])
    actual = np.array([1.1, 2.0, 4.8])  # errors 0.1, 0, 0.8
    result = compare_arrays(actual, reference, Tolerance(atol=0.0, rtol=0.1, ulp=0.0, rel_l2=1.0))
    assert result.min_atol == pytest.approx(0.8 - 0.4)  # the 4.0 element: 0.8 - 0.1*4
    assert result.min_rtol == pytest.approx(0.2)  # 0.8 / 4
    with_min = compare_arrays(actual, reference, Tolerance(atol=result.min_atol, rtol=0.1, ulp=0.0, rel_l2=1.0))
    assert with_min.mismatches == 0


def test_minimum_tolerance_accounts_for_allowed_outliers():
    reference = np.zeros(4)
    actual = np.array([0.0, 0.1, 0.3, 0.2])
    result = compare_arrays(actual, reference, Tolerance(0.0, 0.0, 0.0, 1.0), Setup(max_mismatch=MaxMismatch(1)))
    assert result.min_atol == pytest.approx(0.2)  # the worst one may fail
    assert result.min_rtol == math.inf  # zero references: no rtol helps


@pytest.mark.parametrize(
    ("allowance", "allowed", "passed"),
    [(MaxMismatch(0), 0, False), (MaxMismatch(2), 2, True), (MaxMismatch(10, percent=True), 1, False), (MaxMismatch(20, percent=True), 2, True)],
    ids=["none", "count", "percent-too-small", "percent"],
)
def test_max_mismatch_count_or_percent(allowance, allowed, passed):
    reference = np.zeros(10)
    actual = np.zeros(10)
    actual[[2, 7]] = 1.0
    result = compare_arrays(actual, reference, LOOSE_ULP_OFF, Setup(max_mismatch=allowance))
    assert (result.mismatches, result.allowed_mismatches, result.passed) == (2, allowed, passed)
    assert result.mismatch_fraction == pytest.approx(0.2)


def test_worst_elements_ranked_with_layout_coordinates_and_values():
    reference = np.zeros((1, 2, 2, 2))
    actual = reference.copy()
    actual[0, 1, 0, 1] = 0.5
    actual[0, 0, 1, 1] = -0.3
    actual[0, 1, 1, 0] = 0.05  # passes
    result = compare_arrays(actual, reference, LOOSE_ULP_OFF, Setup(layout=Coordinates(("n", "c", "h", "w"), 1), top_k=2))
    assert [(e.index, e.actual, e.passed) for e in result.worst] == [((0, 1, 0, 1), 0.5, False), ((0, 0, 1, 1), -0.3, False)]
    assert result.worst[0].ratio == pytest.approx(5.0) and result.worst[0].abs_err == 0.5


def test_per_channel_table_points_at_bad_channel(rng):
    reference = rng.standard_normal((4, 3, 5)).astype(np.float32)  # NCW
    actual = reference.copy()
    actual[:, 2, :] += 1e-3
    ncx = compare_arrays(actual, reference, DEFAULT_TOLERANCES["f32"], Setup(layout=Coordinates(channel_axis=1)))
    assert [c.mismatches for c in ncx.channels] == [0, 0, 20]
    assert ncx.channels[2].max_abs == pytest.approx(1e-3, rel=1e-3) and ncx.channels[2].elements == 20
    nxc = compare_arrays(np.moveaxis(actual, 1, -1), np.moveaxis(reference, 1, -1), DEFAULT_TOLERANCES["f32"], Setup(layout=Coordinates(channel_axis=2)))
    assert [c.mismatches for c in nxc.channels] == [0, 0, 20]
    assert compare_arrays(actual, reference, DEFAULT_TOLERANCES["f32"]).channels is None


def test_log_histogram_decades_and_exact_zeros():
    bins = log_histogram(np.array([0.0, 0.0, 2e-6, 5e-6, 3e-4]))
    assert [(b.low, b.high, b.count) for b in bins] == [
        (0.0, 0.0, 2),
        (1e-6, 1e-5, 2),
        (1e-5, 1e-4, 0),
        (1e-4, pytest.approx(1e-3), 1),
    ]
    capped = log_histogram(np.array([1e-30, 1e-3]), max_bins=2)
    assert [(b.low, b.count) for b in capped] == [(0.0, 0), (0.0, 1), (1e-3, 1)]


def test_mostly_zeros_warning_flag():
    reference = np.arange(1.0, 11.0)
    actual = np.zeros(10)
    actual[:3] = reference[:3]
    result = compare_arrays(actual, reference, LOOSE_ULP_OFF)
    assert result.mostly_zeros and result.zero_fraction_actual == pytest.approx(0.7)
    assert not compare_arrays(np.zeros(10), np.zeros(10), LOOSE_ULP_OFF).mostly_zeros


# ---------------------------------------------------------------- NaN / Inf


def test_nan_fails_unless_both_nan_and_equal_nan():
    reference = np.array([np.nan, np.nan, 1.0])
    actual = np.array([np.nan, 1.0, np.nan])
    plain = compare_arrays(actual, reference, LOOSE_ULP_OFF)
    assert plain.mismatches == 3 and plain.nonfinite.nan_mismatches == 3
    assert (plain.nonfinite.nan_actual, plain.nonfinite.nan_reference) == (2, 2)
    allowed = compare_arrays(actual, reference, LOOSE_ULP_OFF, Setup(equal_nan=True))
    assert allowed.mismatches == 2
    assert allowed.min_atol == math.inf


def test_infinities_must_match_in_sign():
    reference = np.array([np.inf, -np.inf, np.inf, 1.0])
    actual = np.array([np.inf, np.inf, 1e308, np.inf])
    result = compare_arrays(actual, reference, LOOSE_ULP_OFF)
    assert result.mismatches == 3 and result.nonfinite.inf_mismatches == 3 and result.nonfinite.nan_mismatches == 0
    assert (result.nonfinite.inf_actual, result.nonfinite.inf_reference) == (3, 3)
    assert all(e.ratio == math.inf for e in result.worst)
    assert result.rel_l2 == 0.0  # the L2 gate only sees positions finite on both sides


def test_empty_tensor_passes():
    result = compare_arrays(np.zeros((0, 3)), np.zeros((0, 3)), LOOSE_ULP_OFF, Setup(layout=Coordinates(channel_axis=1)))
    assert result.passed and result.elements == 0 and result.max_abs.index is None


@settings(max_examples=60, deadline=None)
@example([1.0, -3.0, 100.0], 0.01, 0.001)  # both "a little less fails" checks run on it
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=20), st.floats(0, 1), st.floats(0, 0.1))
def test_min_tolerance_is_tight(values, atol, rtol):
    """min_atol (rtol as set) and min_rtol (atol as set) pass, and a little less fails."""
    reference = np.array(values, dtype=np.float32)
    actual = (reference * np.float32(1.001) + np.float32(1e-3)).astype(np.float32)
    result = compare_arrays(actual, reference, Tolerance(atol=atol, rtol=rtol, ulp=0.0, rel_l2=1.0))

    def mismatches(atol_: float, rtol_: float) -> int:
        return compare_arrays(actual, reference, Tolerance(atol_, rtol_, 0.0, 1.0)).mismatches

    # "A little less": 1e-6 relative, far above the rounding of atol + rtol*|r| (~1e-16 of max |a - r|).
    resolvable = 1e-6 * result.max_abs.value
    if math.isfinite(result.min_atol):
        assert mismatches(result.min_atol * (1 + 1e-12) + 1e-300, rtol) == 0
        if result.min_atol > resolvable:
            assert mismatches(result.min_atol * (1 - 1e-6), rtol) > 0
    if math.isfinite(result.min_rtol):
        assert mismatches(atol, result.min_rtol * (1 + 1e-12) + 1e-300) == 0
        smallest_ref = float(np.abs(reference[reference != 0]).min(initial=np.inf))
        if result.min_rtol * smallest_ref > resolvable:
            assert mismatches(atol, result.min_rtol * (1 - 1e-6)) > 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=20), st.floats(0, 1), st.floats(0, 0.1))
def test_min_tolerance_is_the_smallest_that_passes(values, atol, rtol):
    # Tightness (test_min_tolerance_is_tight checks only that it suffices): a little less fails an element.
    reference = np.array(values, dtype=np.float32)
    actual = (reference * np.float32(1.001) + np.float32(1e-3)).astype(np.float32)
    result = compare_arrays(actual, reference, Tolerance(atol=atol, rtol=rtol, ulp=0.0, rel_l2=1.0))
    largest_error = float(np.max(np.abs(actual.astype(np.float64) - reference.astype(np.float64))))
    if math.isfinite(result.min_atol) and result.min_atol > 1e-9 * largest_error:  # not lost to rounding
        below = Tolerance(atol=result.min_atol * (1 - 1e-6), rtol=rtol, ulp=0.0, rel_l2=1.0)
        assert compare_arrays(actual, reference, below).mismatches >= 1
    if math.isfinite(result.min_rtol) and result.min_rtol > 1e-9:
        below = Tolerance(atol=atol, rtol=result.min_rtol * (1 - 1e-6), ulp=0.0, rel_l2=1.0)
        assert compare_arrays(actual, reference, below).mismatches >= 1


# ---------------------------------------------------------------- settings


def test_per_output_overrides_beat_global_beat_defaults():
    settings_ = Judging(atol=PerOutput(1.0, {"diff_gamma": 1e-4}), ulp=PerOutput(by_name={"x_backprop": 3.0}))
    assert settings_.tolerance_for(("diff_gamma",), "f32") == Tolerance(1e-4, 1e-5, 1.0, 2**-17)
    assert settings_.tolerance_for(("x_backprop", "diff_src"), "bf16") == Tolerance(1.0, 1.6e-2, 3.0, 2**-6)
    assert settings_.max_mismatch_for(("diff_src",)) == MaxMismatch()
    assert settings_.output_names() == {"atol": {"diff_gamma"}, "ulp": {"x_backprop"}}


# ---------------------------------------------------------------- keys and structure


def test_keys_by_name_in_reference_order():
    match = match_keys(["diff_beta", "diff_src"], ["diff_src", "diff_beta"])
    assert [p.name for p in match.pairs] == ["diff_src", "diff_beta"] and match.problems == ()


def test_missing_key_is_a_problem_and_extra_keys_a_note():
    match = match_keys(["diff_src", "junk"], ["diff_src", "diff_gamma"])
    assert [(p.kind, p.name) for p in match.problems] == [("missing", "diff_gamma")]
    assert match.notes == ("not compared: junk (only in actual)",)


def test_inputs_next_to_outputs_are_not_compared_nor_missing():
    """A case file holds the op's inputs too: they are neither missing outputs nor extras (one note)."""
    match = match_keys(["diff_src", "diff_beta"], ["x", "dy", "reserve_space_1", "epsilon", "diff_src", "diff_beta"],
                       {"dy": "diff_dst"})
    assert [p.name for p in match.pairs] == ["diff_src", "diff_beta"] and match.problems == ()
    assert match.notes == ("not compared: x, dy, reserve_space_1, epsilon (the op's inputs)",)


def test_map_renames_on_both_sides_and_output_aliases_match():
    """THEIRS=OURS renames a key wherever it is; the specs' output names match ours without a map."""
    match = match_keys(["dx", "scale_backprop"], ["diff_src", "diff_gamma"], {"dx": "diff_src"})
    assert [(p.actual_key, p.reference_key) for p in match.pairs] == [("dx", "diff_src"), ("scale_backprop", "diff_gamma")]
    flipped = match_keys(["diff_src"], ["dx"], {"dx": "diff_src"})
    assert [(p.actual_key, p.reference_key) for p in flipped.pairs] == [("diff_src", "dx")]
    for_inputs = match_keys(["diff_src"], ["diff_src"], {"dy": "diff_dst", "dq": "diff_src"})
    assert for_inputs.notes == ("not compared: dq=diff_src (--map matched no key)",)  # dy=diff_dst is for the inputs
    twice = match_keys(["x_backprop", "diff_src"], ["diff_src"])
    assert [p.kind for p in twice.problems] == ["extra"] and "both 'x_backprop' and 'diff_src'" in twice.problems[0].message


def test_map_only_ignore():
    match = match_keys(
        ["x_backprop", "scale_backprop", "offset_backprop"],
        ["diff_src", "diff_gamma", "diff_beta"],
        {"x_backprop": "diff_src", "scale_backprop": "diff_gamma", "offset_backprop": "diff_beta"},
        ignore=["diff_beta"],
    )
    assert [p.name for p in match.pairs] == ["x_backprop=diff_src", "scale_backprop=diff_gamma"]
    assert match.problems == ()
    only = match_keys(["diff_src", "diff_gamma"], ["diff_src", "diff_gamma"], only=["diff_gamma"])
    assert [p.name for p in only.pairs] == ["diff_gamma"] and only.problems == ()


def test_map_to_unknown_key_and_only_unknown_and_empty_selection():
    match = match_keys(["a"], ["b"], {"a": "c", "q": "b"}, only=["zz", "b", "c"])
    assert [(p.kind, p.name) for p in match.problems] == [("missing", "zz"), ("missing", "b")]
    assert match.notes == ("not compared: a (only in actual); q=b (--map matched no key)",)
    assert match_keys(["a"], ["a"], ignore=["a"]).problems[0].kind == "empty"


@pytest.mark.parametrize(
    ("actual", "reference", "expected"),
    [
        ((2, 8, 8, 3), (2, 3, 8, 8), "actual looks like the NHWC transpose of reference (NCHW)"),
        ((2, 3, 8, 8), (2, 8, 8, 3), "actual looks like the NCHW transpose of reference (NHWC)"),
        ((2, 5, 3), (2, 3, 5), "NWC transpose of reference (NCW)"),
        ((3, 2), (2, 3), "transposed with axes (1, 0)"),
        ((6,), (2, 3), "a reshape, not a transpose"),
    ],
    ids=["nhwc", "nchw", "nwc", "generic", "reshape"],
)
def test_permutation_hint(actual, reference, expected):
    assert expected in permutation_hint(actual, reference)


def test_structural_problem_shape_and_dtype():
    problem = structural_problem("diff_src", np.zeros((2, 4, 4, 3)), np.zeros((2, 3, 4, 4)))
    assert problem.kind == "shape" and "NHWC transpose" in problem.message and "(2, 4, 4, 3)" in problem.message
    assert structural_problem("x", np.zeros(3, dtype=np.int32), np.zeros(3)).kind == "dtype"
    assert structural_problem("x", np.zeros(3, dtype=np.complex64), np.zeros(3)).kind == "dtype"
    assert permutation_hint((4, 5), (2, 3)) is None
    assert structural_problem("x", np.zeros(3, dtype=ml_dtypes.bfloat16), np.zeros(3)) is None


def test_chunked_statistics_equal_one_pass(rng, monkeypatch):
    """Chunk boundaries (here every 7 elements) change nothing: maxima, ties, top-k, channels, histogram."""
    from bnbwd_cli.judge import compare

    reference = rng.standard_normal((3, 4, 5)).astype(np.float32)
    actual = reference + rng.choice([0.0, 1e-6, 1e-4, 1e-2], size=reference.shape).astype(np.float32)
    actual[1, 2, 3] = np.nan
    actual[2, 0, 0] = reference[2, 0, 0] + 1e-2  # ties with other 1e-2 errors
    setup = Setup(max_mismatch=MaxMismatch(3), layout=Coordinates(channel_axis=1), top_k=6)
    whole = compare_arrays(actual, reference, DEFAULT_TOLERANCES["f32"], setup)
    monkeypatch.setattr(compare, "CHUNK", 7)
    chunked = compare_arrays(actual, reference, DEFAULT_TOLERANCES["f32"], setup)
    assert chunked.rel_l2 == pytest.approx(whole.rel_l2, rel=1e-12)  # only the sum order differs
    assert repr(replace(chunked, rel_l2=0.0)) == repr(replace(whole, rel_l2=0.0))  # repr: NaN == NaN
    assert repr(chunked.details) == repr(whole.details)
    assert whole.mismatches > 3 and len(whole.worst) == 6
