"""The diagnosis's fitted models (judge/diagnosis/fitted_statistics.py, terms.py, own_outputs.py) name the bugs of
tools/fitted_bugs.py with the numbers planted, and never fire on a correct kernel.

Every family is planted at a random shape (seeded per case) in float32 and a 16-bit dtype, both layouts: the
cause must be the planted one and no other; the fitted numbers must be the planted ones within tolerance.
"""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge.diagnosis import fitted_statistics
from bnbwd_cli.judge.diagnosis.ranges import channel_ranges
from tools import bugs, fitted_bugs, zoo
from tests.oracle import backward_arrays

SIXTEEN = ("bf16", "f16")


def _truth(problem: dict) -> dict:
    result = backward_arrays(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
                             epsilon=problem["epsilon"], data_format=problem["data_format"], core="numpy")
    return {"diff_src": result.diff_src, "diff_gamma": result.diff_gamma, "diff_beta": result.diff_beta}


def _judge(problem: dict, outputs: dict, keep=("diff_src", "diff_gamma", "diff_beta")):
    truth = _truth(problem)
    return compare_sets({k: outputs[k] for k in keep}, {k: truth[k] for k in keep}, Judging(),
                        inputs=zoo.inputs_of(problem))


def _hints(result) -> list:
    return [h for o in result.outputs for h in o.comparison.diagnosis]


@pytest.fixture
def fits(monkeypatch):
    """The statistics fits the diagnosis makes, recorded."""
    seen = []
    original = fitted_statistics.fit_statistics

    def spy(case):
        fit = original(case)
        seen.append(fit)
        return fit

    monkeypatch.setattr(fitted_statistics, "fit_statistics", spy)
    return seen


def _number(text: str, pattern: str) -> float:
    found = re.search(pattern, text)
    assert found, (pattern, text)
    return float(found.group(1))


STATISTICS_GRID = [(family, dtype, fmt) for family in fitted_bugs.STATISTICS for dtype in ("f32", "sixteen")
                   for fmt in ("NCX", "NXC")]


@pytest.mark.parametrize("family, dtype, fmt", STATISTICS_GRID, ids=["-".join(g) for g in STATISTICS_GRID])
def test_other_statistics_are_fitted_per_channel(family, dtype, fmt, fits):
    rng = np.random.default_rng(zlib.crc32(f"{family}/{dtype}/{fmt}".encode()))
    dtype = dtype if dtype == "f32" else SIXTEEN[int(rng.integers(2))]
    problem, outputs, bug = fitted_bugs.plant(family, rng, fmt, dtype)
    result = _judge(problem, outputs)
    hints = _hints(result)
    assert result.status == "mismatch" and {h.cause for h in hints} == {"fitted-statistics"}, (bug, hints)
    text = hints[0].text
    assert text.startswith("your kernel used statistics other than the ones given: ") and "save_mean/save_invstd" in text
    fit = fits[-1]
    mean, invstd = fitted_bugs._given(problem)
    used_mean, used_invstd = bug.hooks["stats_used"]
    eps = used_invstd.astype(np.float32).astype(np.float64) / invstd - 1
    delta = (used_mean.astype(np.float32).astype(np.float64) - mean) * invstd
    tolerance = 0.02 if dtype == "f32" else 0.1
    assert np.allclose(fit.eps, eps, rtol=tolerance, atol=3e-7 if dtype == "f32" else 3e-4), (fit.eps, eps)
    assert np.allclose(fit.delta, delta, rtol=0.1, atol=3e-5 if dtype == "f32" else 3e-3), (fit.delta, delta)
    if family == "other_statistics":  # one eps in every channel, one delta in the channels hit
        said = _number(text, r"invstd ([-+][0-9.e+-]+) relative")
        assert said == pytest.approx(bug.numbers["eps"], rel=0.06) and "relative" in text.split(", mean")[0]
        assert "in every channel" in text.split(", mean")[0]
        said = _number(text, r"mean ([-+][0-9.e+-]+) sd")
        assert said == pytest.approx(bug.numbers["delta"], rel=0.06)
        assert f"sd in {channel_ranges(bug.channels)}" in text or f"sd ({text.split('sd (')[1].split(')')[0]}) in " \
            f"{channel_ranges(bug.channels)}" in text, text
    else:  # the saved invstd is a bfloat16 value, not always the nearest one
        assert "bfloat16 values" in text or dtype == "f32", text


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_own_float32_statistics_drifting_at_large_m_are_named(fmt, fits):
    """A correct kernel that computed its own float32 batch statistics (sums in storage order) at M = 1e5: they
    drift by tens of float32 units; "used other statistics" is said, with the drift fitted."""
    problem = zoo.make_problem(np.random.default_rng(3), zoo.shape_for(100_000, 4, fmt), fmt, np.float32, np.float32)
    result = _judge(problem, bugs.kernel(problem, {"own_stats32": "two-pass"}), ("diff_src", "diff_gamma"))
    hints = _hints(result)
    assert result.status == "mismatch" and {h.cause for h in hints} == {"fitted-statistics"}, hints
    assert "float32 units" in hints[0].text, hints[0].text
    mean32, invstd32 = zoo._statistics(problem, zoo._per_channel(problem["src"], fmt), {"own_stats32": "two-pass"})
    _, invstd = fitted_bugs._given(problem)
    eps = invstd32.astype(np.float64) / invstd - 1
    assert np.all(np.abs(eps) > 1e-6) and np.allclose(fits[-1].eps, eps, rtol=0.2, atol=1e-6), (fits[-1].eps, eps)


@pytest.mark.parametrize("dtype, fmt", [("f32", "NXC"), ("bf16", "NCX")])
def test_single_pass_variance_is_named_as_other_statistics(dtype, fmt):
    """var = E[x^2] - E[x]^2 in float32 on data with |mean|/sd ~ 30: the variance loses digits."""
    problem = zoo.make_problem(np.random.default_rng(4), zoo.shape_for(20_000, 5, fmt), fmt, bugs.DTYPES[dtype],
                               np.float32, center=30.0, spread=1.0)
    result = _judge(problem, bugs.kernel(problem, {"own_stats32": "single-pass"}))
    assert result.status == "mismatch" and {h.cause for h in _hints(result)} == {"fitted-statistics"}, _hints(result)


@pytest.mark.parametrize("dtype, m", [("f32", 3000), ("bf16", 3000), ("f16", 20_000)])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_own_float32_statistics_within_tolerance_get_no_hint(dtype, m, fmt):
    """The same kernel where its statistics' drift is within the tolerance: it passes, with no hint."""
    problem = zoo.make_problem(np.random.default_rng(5), zoo.shape_for(m, 3, fmt), fmt, bugs.DTYPES[dtype], np.float32)
    result = _judge(problem, bugs.kernel(problem, {"own_stats32": "two-pass"}))
    assert result.status == "pass" and not _hints(result) and all(not o.comparison.hints for o in result.outputs)


# --- the computed-narrower note is a hypothesis too (judge/hints.py) ---------------------------------------------


def _notes(result, name: str) -> list[str]:
    row = next(o for o in result.outputs if o.name == name)
    return [h.cause for h in row.comparison.diagnosis if h.cause == "computed-narrower"]


@pytest.mark.parametrize("narrow", ["bf16", "f16"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_computed_narrower_is_said_when_the_narrower_type_explains_the_output(narrow, fmt):
    """float32 outputs of a correct kernel made in a 16-bit type and upcast: the note is said."""
    problem = zoo.make_problem(np.random.default_rng(6), bugs.random_shape(np.random.default_rng(6), fmt), fmt,
                               np.float32, np.float32)
    outputs = {k: v.astype(bugs.DTYPES[narrow]).astype(np.float32) for k, v in bugs.correct(problem).items()}
    result = _judge(problem, outputs)
    assert result.status == "mismatch" and _notes(result, "diff_src") == ["computed-narrower"]


def test_computed_narrower_is_not_said_for_sums_that_cancel_onto_a_coarse_grid():
    """diff_dst of small integers: every float32 sum of it is an integer, exactly a bfloat16 value, the reference's
    too. A kernel that drops one element from its sums writes a diff_beta on that grid: not computed narrower."""
    rng = np.random.default_rng(7)
    problem = zoo.make_problem(rng, (6, 5, 12, 14), "NCX", np.float32, np.float32)
    problem["diff_dst"] = rng.integers(-3, 4, problem["diff_dst"].shape).astype(np.float32)
    outputs = bugs.kernel(problem, {"skip_tail": 1})
    truth = _truth(problem)
    assert np.all(truth["diff_beta"] == np.round(truth["diff_beta"]))  # the data's grid: integers
    result = _judge(problem, outputs)
    row = next(o for o in result.outputs if o.name == "diff_beta")
    assert row.comparison is not None and not row.comparison.passed
    assert not _notes(result, "diff_beta")


def test_computed_narrower_is_not_said_when_the_deviation_is_larger_than_the_narrower_type_explains():
    """Values on the bfloat16 grid, but twice the reference: rounding to bf16 does not make a factor of 2."""
    problem = zoo.make_problem(np.random.default_rng(8), (4, 6, 10, 12), "NXC", np.float32, np.float32)
    outputs = bugs.correct(problem)
    outputs["diff_src"] = (outputs["diff_src"].astype(np.float64) * 2).astype(zoo.BF16).astype(np.float32)
    result = _judge(problem, outputs)
    assert result.status == "mismatch" and not _notes(result, "diff_src")


# --- the formula's terms with fitted coefficients (judge/diagnosis/terms.py) ------------------------------------

TERMS_GRID = [(family, dtype, fmt, draw) for family in fitted_bugs.TERMS for dtype in ("f32", "sixteen")
              for fmt in ("NCX", "NXC") for draw in range(2)]


@pytest.mark.parametrize("family, dtype, fmt, draw", TERMS_GRID, ids=["-".join(map(str, g)) for g in TERMS_GRID])
def test_formula_terms_are_fitted_and_said_in_words(family, dtype, fmt, draw):
    rng = np.random.default_rng(zlib.crc32(f"{family}/{dtype}/{fmt}/{draw}".encode()))
    dtype = dtype if dtype == "f32" else SIXTEEN[int(rng.integers(2))]
    problem, outputs, bug = fitted_bugs.plant(family, rng, fmt, dtype)
    result = _judge(problem, outputs)
    hints = _hints(result)
    assert result.status == "mismatch" and {h.cause for h in hints} == {"fitted-terms"}, (bug, hints)
    text = hints[0].text
    if bug.family == "terms-unrecognised":  # no word: the coefficients, fitted
        said = re.search(r"\(([-0-9.e+]+)\*dy - ([-0-9.e+]+)\*mean\(dy\) - ([-0-9.e+]+)\*xhat", text)
        assert said, text
        assert np.allclose([float(v) for v in said.groups()], bug.numbers["coefficients"], rtol=0.01), text
    elif bug.family == "terms-scaled":
        scale = bug.numbers["coefficients"][0]
        assert _number(text, r"scaled by ([-0-9.e+]+)") == pytest.approx(scale, rel=0.01), text
    else:
        assert bug.numbers["words"] in text, (bug.numbers["words"], text)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_a_few_channels_with_their_own_wrong_term_are_named_as_ranges(fmt):
    """The xhat term's sign flipped in channels 2..4 only: the per-channel fit finds the channels and the word."""
    problem = zoo.make_problem(np.random.default_rng(9), bugs.random_shape(np.random.default_rng(9), fmt), fmt,
                               np.float32, np.float32)
    c = problem["mean"].shape[0]
    sign = np.ones(c)
    sign[2:5] = -1
    result = _judge(problem, bugs.kernel(problem, {"coefficients": (1.0, 1.0, sign)}))
    hints = _hints(result)
    assert {h.cause for h in hints} == {"fitted-terms"}, hints
    assert "in c=2..4 only: diff_src: the xhat*mean(dy*xhat) term has its sign flipped" in hints[0].text, hints[0].text


def test_every_output_scaled_alike_is_said_with_its_factor():
    """All three outputs times 1 + 1e-4 (diff_beta's deviation beyond its noise: statistics other than the given
    ones, which leave diff_beta as it is, do not explain it)."""
    problem = zoo.make_problem(np.random.default_rng(10), (6, 5, 12, 10), "NCX", np.float32, np.float32)
    truth = _truth(problem)
    outputs = {k: (v.astype(np.float64) * (1 + 1e-4)).astype(v.dtype) for k, v in truth.items()}
    hints = _hints(_judge(problem, outputs))
    assert {h.cause for h in hints} == {"fitted-terms"} and "every output is scaled by 1+0.0001" in hints[0].text, hints


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_a_float64_kernel_scaled_alike_is_said_with_its_factor(fmt):
    """float64 outputs times 1 + 3e-6: the three terms' fitted coefficients carry ~1e-12 of noise, hundreds of
    float64 units on the output, so the one scale is fitted directly against the reference (terms._whole_scale)."""
    rng = np.random.default_rng(zlib.crc32(f"scaled-f64/{fmt}".encode()))
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, np.float64, np.float64)
    truth = _truth(problem)
    scale = 1 + float(rng.choice([3e-6, -2e-5, 7e-4]))
    outputs = {k: v * scale for k, v in truth.items()}
    hints = _hints(_judge(problem, outputs))
    assert {h.cause for h in hints} == {"fitted-terms"}, hints
    said = _number(hints[0].text, r"every output is scaled by 1([-+][0-9.]+(?:e[-+][0-9]+)?)")  # 1+3e-06: 1 + 3e-06
    assert said == pytest.approx(scale - 1, rel=0.01), hints[0].text


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_correct_kernels_get_no_fitted_hint(dtype):
    rng = np.random.default_rng(zlib.crc32(f"correct-fitted/{dtype}".encode()))
    for fmt in ("NCX", "NXC"):
        problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, bugs.DTYPES[dtype], np.float32)
        result = _judge(problem, bugs.correct(problem))
        assert result.status == "pass" and not _hints(result)


# --- the kernel's own outputs against each other (judge/diagnosis/own_outputs.py) -------------------------------

OWN_GRID = [(family, dtype, fmt) for family in fitted_bugs.OWN for dtype in ("f32", "sixteen") for fmt in ("NCX", "NXC")]


@pytest.mark.parametrize("family, dtype, fmt", OWN_GRID, ids=["-".join(g) for g in OWN_GRID])
def test_outputs_against_each_other(family, dtype, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{family}/{dtype}/{fmt}".encode()))
    dtype = dtype if dtype == "f32" else SIXTEEN[int(rng.integers(2))]
    problem, outputs, bug = fitted_bugs.plant(family, rng, fmt, dtype)
    result = _judge(problem, outputs)
    hints = _hints(result)
    assert result.status == "mismatch" and {h.cause for h in hints} == {bug.cause}, (bug, hints)
    text = hints[0].text
    if bug.cause == "sums-wrong":  # the channels where the sums are off, as ranges, for each sum
        where = bug.numbers["words"]
        assert "the elementwise pass is right, the sums are wrong" in text, text
        assert f"diff_beta in {where}" in text and f"diff_gamma in {where}" in text, (where, text)
        assert hints[0].channels == bug.channels or where == "every channel"
    else:
        assert bug.numbers["words"] in text, (bug.numbers["words"], text)


def test_sums_right_and_diff_src_wrong_puts_the_bug_in_the_elementwise_pass():
    """Every 32nd element of diff_src off, the sums right: nothing explains it, and the hint says where the bug is."""
    problem = zoo.make_problem(np.random.default_rng(11), (4, 6, 10, 12), "NCX", np.float32, np.float32)
    outputs = bugs.correct(problem)
    outputs["diff_src"] = np.ascontiguousarray(outputs["diff_src"])
    outputs["diff_src"].reshape(-1)[31::32] += np.float32(0.05)
    hints = _hints(_judge(problem, outputs))
    assert [h.cause for h in hints] == ["unexplained"], hints
    assert "the sums are right: the bug is in the elementwise pass" in hints[0].text, hints[0].text


def test_diff_src_right_and_a_sum_wrong_puts_the_bug_in_the_sums_written():
    problem = zoo.make_problem(np.random.default_rng(12), (4, 6, 10, 12), "NXC", np.float32, np.float32)
    outputs = bugs.correct(problem)
    outputs["diff_gamma"] = outputs["diff_gamma"] + np.random.default_rng(0).normal(0, 1, 12).astype(np.float32)
    hints = _hints(_judge(problem, outputs))
    assert [h.cause for h in hints] == ["unexplained"], hints
    assert "diff_src passes, so the kernel used the right sums: the bug is in the sums written" in hints[0].text


def test_an_output_of_other_inputs_is_said_to_have_no_relation_to_these():
    problem = zoo.make_problem(np.random.default_rng(13), (4, 6, 10, 12), "NCX", np.float32, np.float32)
    other = zoo.make_problem(np.random.default_rng(14), (4, 6, 10, 12), "NCX", np.float32, np.float32)
    outputs = dict(bugs.correct(problem), diff_src=bugs.correct(other)["diff_src"])
    hints = _hints(_judge(problem, outputs))
    assert [h.cause for h in hints] == ["unexplained"], hints
    assert "diff_src has no relation to these inputs" in hints[0].text, hints[0].text


RANDOM_GRID = [(dtype, fmt) for dtype in ("f32", "sixteen") for fmt in ("NCX", "NXC")]


@pytest.mark.parametrize("dtype, fmt", RANDOM_GRID, ids=["-".join(g) for g in RANDOM_GRID])
def test_a_random_share_missing_from_the_sums_is_fitted(dtype, fmt):
    """A random share p of each channel's elements lost from both sums (unsynchronised atomics), in every channel or
    a run of at least 4, diff_src from those sums: sums-wrong, with the share fitted from the sums' deviations
    (own_outputs.random_share). One channel hit: too few deviations to judge, no share said."""
    rng = np.random.default_rng(zlib.crc32(f"random-share/{dtype}/{fmt}".encode()))
    dtype = dtype if dtype == "f32" else SIXTEEN[int(rng.integers(2))]
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, bugs.DTYPES[dtype], np.float32)
    c = problem["mean"].shape[0]
    share = float(rng.uniform(0.05, 0.3))
    first = int(rng.integers(0, max(1, c - 4)))
    channels = range(first, c) if rng.random() < 0.5 else range(c)
    hints = _hints(_judge(problem, bugs.kernel(problem, {"dropped": {ch: share for ch in channels}})))
    assert {h.cause for h in hints} == {"sums-wrong"}, hints
    said = _number(hints[0].text, r"consistent with a random share of about ([0-9.]+)% \(")
    spread = _number(hints[0].text, r"% \(± ([0-9.e+-]+)%\) of each channel's elements")
    assert abs(said - 100 * share) <= 3 * spread + 0.05 * said, (share, hints[0].text)
    assert f"both sums in {channel_ranges(list(channels), c) if len(channels) < c else 'every channel'}" in hints[0].text
    one = _hints(_judge(problem, bugs.kernel(problem, {"dropped": {first: share}})))
    assert {h.cause for h in one} == {"sums-wrong"} and "random share" not in one[0].text, one


@pytest.mark.parametrize("dtype, fmt", RANDOM_GRID, ids=["-".join(g) for g in RANDOM_GRID])
def test_a_factor_missing_in_a_tile_of_channels_is_named_with_the_channels(dtype, fmt):
    """diff_src without its gamma (or with an extra invstd) in one run of channels only (one tile of a kernel's
    launch): the per-channel factor and the channels, as a range."""
    rng = np.random.default_rng(zlib.crc32(f"factor-tile/{dtype}/{fmt}".encode()))
    dtype = dtype if dtype == "f32" else SIXTEEN[int(rng.integers(2))]
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, bugs.DTYPES[dtype], np.float32)
    c = problem["mean"].shape[0]
    lo = int(rng.integers(0, c - 1))
    hi = int(rng.integers(lo, c - 1))
    gamma = problem["gamma"].astype(np.float64)
    factor, said = (1 / gamma, "no factor gamma (k = invstd)") if rng.random() < 0.5 else \
        (fitted_bugs._given(problem)[1], "an extra factor invstd")
    f = np.ones(c)
    f[lo:hi + 1] = factor[lo:hi + 1]
    hints = _hints(_judge(problem, bugs.kernel(problem, {"coefficients": (f, f, f)})))
    assert {h.cause for h in hints} == {"fitted-terms"}, hints
    assert f"diff_src has {said} in {channel_ranges(list(range(lo, hi + 1)), c)} only" in hints[0].text, hints[0].text
