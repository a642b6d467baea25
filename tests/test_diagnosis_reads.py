"""The diagnosis reads the run where a test needs it (judge/diagnosis/case.py): the values it reads at some rows are
the whole float64 tensors' there, bit for bit; a failing run's diagnosis of the common bugs forms no whole float64
copy of a tensor; and the whole-run test's shortcut (judge/diagnosis/assess.py: the error scale formed only where
|a - p| > K*u*|p|) counts exactly the elements the full tolerance counts, NaN and Inf included."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge.diagnosis import build as build_module
from bnbwd_cli.judge.diagnosis.build import build_case
from bnbwd_cli.judge.diagnosis.prediction import blocks
from bnbwd_cli.judge.diagnosis.sample import screening_sample
from bnbwd_cli.judge.model import channel_facts
from bnbwd_cli.layout import PER_CHANNEL_RUN
from tools import bugs, zoo

whole_run = importlib.import_module("bnbwd_cli.judge.diagnosis.whole_run")
measures = importlib.import_module("bnbwd_cli.judge.diagnosis.measures")
WHOLE = ("x", "dy", "xhat", "src_scale")


def _case(fmt: str, dtype, hooks: dict, seed: int = 3):
    shape = (8, 5, 16, 18) if fmt == "NCX" else (8, 16, 18, 5)
    problem = zoo.make_problem(np.random.default_rng(seed), shape, fmt, dtype, np.float32)
    outputs = bugs.kernel(problem, hooks)
    reference = zoo.bnbwd_outputs(problem)
    inputs = zoo.inputs_of(problem)
    result = compare_sets(outputs, reference, Judging(), inputs=inputs)
    judged = {o.name: (outputs[o.name], reference[o.name], o.comparison) for o in result.outputs}
    return build_case(inputs, channel_facts(inputs), judged)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_values_read_at_rows_are_the_whole_tensors(fmt, dtype):
    case = _case(fmt, zoo.BF16 if dtype == "bfloat16" else np.float32, {"epsilon": 1e-2})
    fresh = _case(fmt, zoo.BF16 if dtype == "bfloat16" else np.float32, {"epsilon": 1e-2})  # (no whole arrays)
    out, fresh_out = case.outputs["diff_src"], fresh.outputs["diff_src"]
    sample = screening_sample(fresh).rows
    for rows in [*blocks(case.shape, 97)[:5], sample, (slice(0, 8, 3), slice(None), slice(1, None, 5))]:
        for name, whole in (("x", case.x), ("dy", case.dy), ("xhat", case.xhat), ("scale", case.src_scale)):
            at = getattr(fresh, f"{name}_at")(rows)
            assert np.array_equal(at, whole[rows], equal_nan=True), name
        assert np.array_equal(fresh_out.actual_at(rows), out.actual[rows], equal_nan=True)
        assert np.array_equal(fresh_out.reference_at(rows), out.reference[rows], equal_nan=True)
    for c in (0, case.channels - 1):
        dy, xhat = fresh.channel(c)
        assert np.array_equal(dy, case.dy[:, c, :]) and np.array_equal(xhat, case.xhat[:, c, :])
    assert not any(name in fresh.__dict__ for name in WHOLE)


def test_blocks_cover_the_view_once_with_every_channel():
    for shape, size in [((8, 5, 288), 64), ((3, 128, 3136), 8192), ((100, 7, 1), 50), ((2, 3, 5), 1000)]:
        seen = np.zeros(shape, int)
        for rows in blocks(shape, size):
            assert rows[1] == slice(None)
            seen[rows] += 1
            n, c, s = seen[rows].shape
            assert s < PER_CHANNEL_RUN or s == shape[2]  # (layout.per_channel broadcasts: one call an operation)
        assert (seen == 1).all()


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("hooks, cause", [({"epsilon": 1e-2}, "epsilon"), ({"gamma": "next"}, "gamma-off-by-one"),
                                          ({"block": 64, "lost": {1: 3}}, "lost-partial-sum"),
                                          ({"no_mean_dy": (0, 2)}, "mean-dy-not-subtracted"),
                                          ({"skip_tail": 19}, "missing-tail")], ids=lambda v: str(v)[:12])
def test_a_failing_run_forms_no_whole_float64_tensor(fmt, hooks, cause, monkeypatch):
    built = []
    original = build_module.build_case

    def keeping(*args):
        built.append(original(*args))
        return built[-1]

    monkeypatch.setattr(importlib.import_module("bnbwd_cli.judge.diagnosis"), "build_case", keeping)
    # square images and M > reductions.MAX_EMULATED, as at (32, 128, 56, 56): the families that need a whole tensor by
    # their nature (src or diff_dst read with H and W swapped, a 16-bit running sum emulated) do not apply
    shape = (16, 3, 48, 48) if fmt == "NCX" else (16, 48, 48, 3)
    problem = zoo.make_problem(np.random.default_rng(4), shape, fmt, np.float32, np.float32)
    result = compare_sets(bugs.kernel(problem, hooks), zoo.bnbwd_outputs(problem), Judging(), inputs=zoo.inputs_of(problem))
    assert {h.cause for o in result.outputs for h in o.comparison.diagnosis} == {cause}
    (case,) = built
    assert not any(name in case.__dict__ for name in WHOLE), [n for n in WHOLE if n in case.__dict__]
    assert not {"actual", "reference"} & set(case.outputs["diff_src"].__dict__)


def _full_count(case, rows, a, p, r, extra) -> int:
    with np.errstate(invalid="ignore", over="ignore"):
        tolerance = measures.prediction_tolerance(case, "diff_src", p, r, extra, case.scale_at(rows))
        return int(np.count_nonzero(~(np.abs(a - p) <= tolerance)))


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_the_whole_run_count_is_the_full_tolerances(fmt):
    case = _case(fmt, np.float32, {"epsilon": 1e-2})
    out = case.outputs["diff_src"]
    rng = np.random.default_rng(7)
    for rows in blocks(case.shape, 200)[:6]:
        a, r = out.actual_at(rows), out.reference_at(rows)
        for spread in (0.0, 1e-7, 1e-5, 1e-3):
            p = a * (1 + spread * rng.standard_normal(a.shape))
            extra = np.abs(p) * 1e-6 * rng.random(a.shape)
            for planted in (None, np.nan, np.inf):
                e = extra.copy()
                if planted is not None:
                    e.reshape(-1)[::7] = planted
                for noise in (None, e):
                    expected = _full_count(case, rows, a, p, r, noise)
                    for cheap in (True, False):  # (False: the reference is not finite everywhere: no shortcut)
                        assert whole_run._beyond(case, rows, (a, p), noise, cheap) == expected, (spread, planted)
    assert whole_run._cheap(case)
    r_bad = out.expected.copy()
    r_bad.reshape(-1)[3] = np.nan  # a non-finite reference: no shortcut anywhere
    assert not whole_run._finite(r_bad) and whole_run._finite(out.expected)


@pytest.mark.parametrize("fmt, shape", [("NCX", (4, 3, 5, 6)), ("NXC", (4, 5, 6, 3)), ("NCX", (2, 3, 7))])
def test_diff_src_written_in_the_other_layout_is_computed_at_rows(fmt, shape):
    """writes._written_in_other_layout gathers its prediction at any rows from the reference's buffer: the whole
    transposed copy's numbers there."""
    from bnbwd_cli.judge.diagnosis import writes
    from bnbwd_cli.layout import view3

    problem = zoo.make_problem(np.random.default_rng(1), shape, fmt, np.float32, np.float32)
    outputs, reference, inputs = bugs.kernel(problem, {"epsilon": 1e-2}), zoo.bnbwd_outputs(problem), zoo.inputs_of(problem)
    result = compare_sets(outputs, reference, Judging(), inputs=inputs)
    case = build_case(inputs, channel_facts(inputs), {o.name: (outputs[o.name], reference[o.name], o.comparison)
                                                      for o in result.outputs})
    (candidate,) = writes._written_in_other_layout(case)
    nd = len(shape)
    order = (0, nd - 1, *range(1, nd - 1)) if fmt == "NXC" else (0, *range(2, nd), 1)
    full = writes._full(case.outputs["diff_src"].reference, shape, fmt)
    whole = view3(np.ascontiguousarray(full.transpose(order)).reshape(shape), fmt)
    for rows in [(slice(None),) * 3, screening_sample(case).rows, *blocks(case.shape, 7)[:3]]:
        assert np.array_equal(candidate.prediction.diff_src(rows)[0], whole[rows])
