"""The diagnosis' cheaper whole-run walks give the numbers of the plain ones: a hypothesis confirmed with its noise
formed only where the test needs it (Prediction.lean, whole_run.confirmed) counts and shares as with its noise formed
everywhere; a tail's sums from the end of a channel's row are the sums from the whole row (reductions._tail_sums)."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge import diagnosis
from bnbwd_cli.judge.diagnosis import kernels, reductions
from bnbwd_cli.judge.diagnosis.build import build_case
from bnbwd_cli.judge.model import channel_facts
from tools import bugs, zoo

whole_run = importlib.import_module("bnbwd_cli.judge.diagnosis.whole_run")
measures = importlib.import_module("bnbwd_cli.judge.diagnosis.measures")
build_module = importlib.import_module("bnbwd_cli.judge.diagnosis.build")

PLANTED = [{"block": 64, "lost": {1: 3}}, {"epsilon": 1e-2}, {"gamma": "next"}, {"no_mean_dy": (0, 3)},
           {"skip_tail": 19}]


def _case(fmt: str, hooks: dict, seed: int = 3, spoil=None):
    shape = (8, 5, 16, 18) if fmt == "NCX" else (8, 16, 18, 5)
    problem = zoo.make_problem(np.random.default_rng(seed), shape, fmt, np.float32, np.float32)
    outputs = bugs.kernel(problem, hooks)
    if spoil is not None:
        spoil(outputs)
    reference = zoo.bnbwd_outputs(problem)
    result = compare_sets(outputs, reference, Judging(), inputs=zoo.inputs_of(problem))
    judged = {o.name: (outputs[o.name], reference[o.name], o.comparison) for o in result.outputs}
    inputs = zoo.inputs_of(problem)
    return build_case(inputs, channel_facts(inputs), judged)


def _same(x: float | None, y: float | None) -> bool:
    return x is y or (x is not None and y is not None and (x == y or (math.isnan(x) and math.isnan(y))))


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("hooks", PLANTED, ids=[next(iter(h)) for h in PLANTED])
def test_a_lean_walk_counts_and_shares_as_the_plain_one(hooks, fmt):
    """Every hypothesis of the run that offers a lean form: the same share (bit for bit) or the same rejection,
    with and without it, and with a smaller allowance (the count itself: rejected at the same allowances)."""
    case = _case(fmt, hooks)
    out = case.outputs["diff_src"]
    offered = 0
    for candidate in diagnosis._candidates(case):
        prediction = candidate.prediction
        if prediction.lean is None:
            continue
        offered += 1
        for share in (True, False):
            plain = whole_run.confirmed(case, prediction.rows, share)
            lean = whole_run.confirmed(case, prediction.rows, share, prediction.lean)
            assert _same(plain, lean), (candidate.cause, plain, lean)
        assert _counts(case, prediction, out) == _counts(case, prediction, out, lean=True), candidate.cause
    assert offered >= 5


def _counts(case, prediction, out, lean=False) -> int:
    """The elements beyond K units of the prediction over the whole run: whole_run._beyond block by block, or the
    lean walk's (elements past K*u*|p| gathered into whole_run._Unsure, counted at the end)."""
    total = 0
    unsure = whole_run._Unsure(case, prediction.lean) if lean else None
    k = out.comparison.scaled.max_units
    with np.errstate(invalid="ignore", over="ignore"):
        for rows in whole_run.blocks(case.shape):
            a = out.actual_at(rows)
            if lean:
                p, xhat, dy = prediction.lean.at(rows)
                off = np.abs(a - p)
                positions = np.flatnonzero(~(off <= k * (case.unit * np.abs(p))))
                if positions.size:
                    unsure.add(rows, positions, (p, off, xhat, dy))
            else:
                p, extra = prediction.rows(rows)
                total += _plain_beyond(case, rows, a, p, out.reference_at(rows), extra)
    return unsure.count() if lean else total


def _plain_beyond(case, rows, a, p, r, extra) -> int:
    """The elements of a block beyond their whole tolerance, every element's formed (no shortcut)."""
    out = case.outputs["diff_src"]
    tolerance = measures.prediction_tolerance(case, "diff_src", p, r, extra, case.scale_at(rows))
    return int(np.count_nonzero(~(np.abs(a - p) <= tolerance) & out.kept(rows)))


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("hooks", PLANTED[:3], ids=[next(iter(h)) for h in PLANTED[:3]])
def test_the_shortcut_count_of_a_block_is_the_whole_tolerances(hooks, fmt):
    """whole_run._beyond's count (the scale, reference, xhat and dy formed only past K*u*|p|) is the count of the whole
    tolerance formed at every element, for every hypothesis of the run, block by block."""
    case = _case(fmt, hooks)
    out = case.outputs["diff_src"]
    assert whole_run._cheap(case)
    for candidate in diagnosis._candidates(case):
        prediction = candidate.prediction
        if prediction.diff_src is None:
            continue
        for rows in whole_run.blocks(case.shape)[:40]:
            p, extra = prediction.rows(rows)
            a = out.actual_at(rows)
            with np.errstate(invalid="ignore", over="ignore"):
                plain = _plain_beyond(case, rows, a, p, out.reference_at(rows), extra)
                assert whole_run._beyond(case, rows, (out.actual_operand(rows), p), extra, True) == plain


def test_the_lean_noise_is_the_noise_at_those_positions():
    """_noise_at gathers each element's coefficients: the numbers _noise gives the whole rows, bit for bit."""
    rng = np.random.default_rng(1)
    xhat, dy = rng.standard_normal((2, 3, 7)), rng.standard_normal((2, 3, 7))
    xhat[0, 1, 2], dy[1, 2, 3] = np.inf, np.nan

    def column():
        return rng.uniform(0.1, 2.0, (3, 1))

    positions = np.array([0, 5, 9, 17, 26, 41])
    channel = positions // 7 % 3
    for coefficients in (kernels._Coefficients(column(), column(), column(), column(), column()),
                         kernels._Coefficients(column())):
        whole = kernels._noise(coefficients, 2.0 ** -24, xhat, dy).reshape(-1)
        at = kernels._noise_at(coefficients, 2.0 ** -24, channel, xhat.reshape(-1)[positions], dy.reshape(-1)[positions])
        assert np.array_equal(at, whole[positions], equal_nan=True)
        assert kernels._noise_never_nan(coefficients, 2.0 ** -24)
    assert not kernels._noise_never_nan(kernels._Coefficients(np.zeros((3, 1))), 2.0 ** -24)  # 0*inf would be NaN
    zero_gamma = kernels._Coefficients(column(), column(), column(), column(), np.zeros((3, 1)))
    assert not kernels._noise_never_nan(zero_gamma, 2.0 ** -24)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_a_lean_walk_with_non_finite_outputs_counts_as_the_plain_one(fmt):
    """NaN and Inf in the kernel's diff_src (the lean test must send them to the full test) and in the reference
    (the plain walk is used: the same numbers)."""
    def spoil(outputs):
        spoiled = outputs["diff_src"].copy()
        spoiled.reshape(-1)[::97] = np.nan
        spoiled.reshape(-1)[5::131] = np.inf
        outputs["diff_src"] = spoiled
    case = _case(fmt, {"epsilon": 1e-2}, spoil=spoil)
    out = case.outputs["diff_src"]
    assert np.isnan(out.given).any() and np.isinf(out.given).any()
    for candidate in diagnosis._candidates(case):
        if candidate.prediction.lean is not None:
            assert _counts(case, candidate.prediction, out) == _counts(case, candidate.prediction, out, lean=True)
            break
    else:
        raise AssertionError("no lean hypothesis")


def test_a_tail_from_the_end_of_the_row_sums_as_from_the_whole():
    """A running sum adds one element at a time: the sums of the last t elements from a row's end are the whole
    row's, bit for bit, and _row(last=t) holds at least those t elements, the whole row's numbers."""
    rng = np.random.default_rng(2)
    row = rng.standard_normal(1000) * np.exp(rng.uniform(-20, 20, 1000))
    lengths = np.array([1, 2, 37, 400, 999])
    whole = np.cumsum(row[::-1])[lengths - 1]
    assert np.array_equal(reductions._tail_sums(row, lengths), whole)
    assert np.array_equal(reductions._tail_sums(row[-400:], lengths[:4]), whole[:4])
    case = _case("NXC", {"skip_tail": 19})
    for t in (1, 19, 300):
        dy, terms = reductions._row(case, 2, t)
        full_dy, full_terms = reductions._row(case, 2)
        assert dy.size >= t and np.array_equal(dy, full_dy[-dy.size:]) and np.array_equal(terms, full_terms[-dy.size:])


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("hooks", PLANTED, ids=[next(iter(h)) for h in PLANTED])
def test_the_judges_failing_elements_are_the_ones_the_case_finds(hooks, fmt):
    """A failed diff_src's case takes the judge's failing mask (build._judged_failing) instead of judging every
    element again: the same elements beyond, deviation norm and per-channel sums, bit for bit."""
    case = _case(fmt, hooks)
    out = case.outputs["diff_src"]
    comparison = out.comparison
    failing = build_module._judged_failing(comparison, case.inputs.data_format)
    assert failing is not None and out.failed
    given, given_sums = build_module._diff_src_pass(case, out.given, out.expected, comparison, failing)
    judged, judged_sums = build_module._diff_src_pass(case, out.given, out.expected, comparison)
    assert np.array_equal(given.beyond, judged.beyond) and given.deviation_norm == judged.deviation_norm
    for name in ("count", "x", "xx", "d", "xd", "ar", "rr"):
        assert np.array_equal(getattr(given_sums, name), getattr(judged_sums, name)), name


def test_no_failing_mask_is_taken_where_it_could_differ():
    """NaN in the kernel's output (the judge classes NaN/Inf apart), or an output that passed (its details are not
    gathered): the case judges every element itself."""
    def spoil(outputs):
        spoiled = outputs["diff_src"].copy()
        spoiled.reshape(-1)[::97] = np.nan
        outputs["diff_src"] = spoiled
    case = _case("NCX", {"epsilon": 1e-2}, spoil=spoil)
    assert build_module._judged_failing(case.outputs["diff_src"].comparison, "NCX") is None
    case = _case("NCX", {"epsilon": 1e-2})
    assert build_module._judged_failing(case.outputs["diff_src"].comparison, "NCX") is not None
    assert build_module._judged_failing(case.outputs["diff_beta"].comparison, "NCX") is None  # (C,): it passed


def test_the_sums_of_a_block_with_non_finite_values_are_the_checked_ones():
    """DiffSrcSums.add sums a block as it is when its channel sums are finite, else as the checked path does:
    the same sums whichever way a block goes (a kept mask of all True forces the checked path)."""
    rng = np.random.default_rng(4)
    blocks = [rng.standard_normal((3, 2, 3, 5)) for _ in range(5)]
    blocks[1][0, 0, 1, 2] = np.nan  # a NaN in a
    blocks[2][1, 1, 2, 3] = np.inf  # an Inf in r
    blocks[3][:2, :, :, 3] = 1e300  # finite a and r whose products overflow
    blocks[4][2, 0, 1, 0] = -np.inf  # an Inf in xhat
    sums = [build_module.DiffSrcSums(*(np.zeros(3) for _ in range(7))) for _ in range(2)]
    for a, r, x in blocks:
        with np.errstate(invalid="ignore", over="ignore"):
            d = a - r
            sums[0].add(a, r, d, x)
            sums[1].add(a, r, d, x, np.ones(a.shape, bool))
    assert not np.isfinite(sums[0].ar).all() and sums[0].count.sum() < 5 * 30
    for name in ("count", "x", "xx", "d", "xd", "ar", "rr"):
        assert np.array_equal(getattr(sums[0], name), getattr(sums[1], name), equal_nan=True), name
