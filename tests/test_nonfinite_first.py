"""NaN/Inf first: a NaN or an Inf where the reference is finite (or the reverse) always fails, in every dtype, layout
and output, whatever the allowance; it is counted and placed before any units in every form (the full report, the
few lines of --brief and the API's AssertionError, JSON); units and the worst element are the finite elements'; no
advice names a K (the CLI refuses --max-units inf)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.judge import compare_sets
from bnbwd_cli.judge.tolerance import Judging, MaxMismatch, PerOutput
from tests.conftest import make_inputs

DTYPES = ("float32", "bf16", "float16", "float64")


def _problem(dtype: str, layout: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (3, 6, 5, 7) if layout == "NCHW" else (3, 5, 7, 6)
    kind = dtype_from_name(dtype)
    stats = np.float64 if dtype == "float64" else np.float32
    arrays = make_inputs(rng, shape, "NCX" if layout == "NCHW" else "NXC", dtype=kind, stats_dtype=stats)
    inputs = dict(arrays, epsilon=1e-3, data_format=layout)
    return inputs, {k: np.array(v) for k, v in bnbwd_cli.backward(**inputs).items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("output", ["diff_src", "diff_gamma", "diff_beta"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_nan_or_inf_always_fails_and_leads_every_form(dtype, layout, output, value):
    inputs, grads = _problem(dtype, layout)
    wrong = dict(grads)
    broken = grads[output].copy()
    flat = broken.reshape(-1)
    flat[[1, flat.size - 1]] = value
    wrong[output] = broken
    report = bnbwd_cli.check(wrong, **inputs, max_units=1e30)  # no K lets a NaN pass
    assert not report and report.status == "mismatch"
    row = next(o for o in report.result.outputs if o.name == output)
    kind = "NaN" if np.isnan(value) else "Inf"
    c = row.comparison
    assert row.status == "mismatch" and c.nonfinite.mismatches == 2 and c.finite_mismatches == 0
    first = [tuple(int(i) for i in np.unravel_index(p, broken.shape)) for p in (1, flat.size - 1)]
    assert list(c.nonfinite.first) == first
    names = ("c",) if output != "diff_src" else tuple("nchw" if layout == "NCHW" else "nhwc")
    at = "; ".join(" ".join(f"{n}={i}" for n, i in zip(names, index)) for index in first)
    lead = f"2 {kind} where the reference is finite (first at {at})"
    # the few lines (the API's AssertionError, --brief): the count and positions before the units
    line = next(li for li in report.summary.splitlines() if li.startswith(f"{output}: FAIL"))
    assert line.startswith(f"{output}: FAIL {lead}"), line
    assert line.index(lead) < line.index("on the finite elements: max ")
    # the full report: its first line under the output's rule, and no advice to pass any K
    text = report.text
    section = text[text.index(f"{output}: FAIL ─"):]
    assert section.splitlines()[1] == f"NaN/Inf: {lead}"
    assert "max_units=inf" not in text and "no K passes the NaN/Inf" in section
    # JSON: the same facts
    document = json.loads(report.to_json())
    nonfinite = next(o for o in document["outputs"] if o["name"] == output)["comparison"]["nonfinite"]
    assert nonfinite["mismatches"] == 2 and [f["index"] for f in nonfinite["first"]] == [list(i) for i in first]
    with pytest.raises(AssertionError, match=f"FAIL {kind}|FAIL 2 {kind}"):
        bnbwd_cli.assert_backward_close(wrong, **inputs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_rule_fails_a_nan_within_any_allowance(dtype):
    kind = dtype_from_name(dtype)
    reference = {"x": np.linspace(-1, 1, 40).astype(kind)}
    actual = {"x": reference["x"].copy()}
    actual["x"][7] = np.nan
    loose = Judging(max_mismatch=PerOutput(MaxMismatch(50, percent=True)))
    result = compare_sets(actual, reference, loose)
    c = result.outputs[0].comparison
    assert c.mismatches == 1 <= c.allowed_mismatches and not c.passed and result.status == "mismatch"
    equal = compare_sets({"x": np.full(3, np.nan)}, {"x": np.full(3, np.nan)}, Judging(equal_nan=True))
    assert equal.status == "pass"  # NaN where the reference has NaN, asked to be equal: no mismatch


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_whole_nan_channels_are_named_and_located(layout):
    inputs, grads = _problem("float32", layout, seed=3)
    d = grads["diff_src"].copy()
    axis = 1 if layout == "NCHW" else 3
    for c in (1, 3, 4):
        np.moveaxis(d, axis, 0)[c] = np.nan
    report = bnbwd_cli.check(dict(grads, diff_src=d), **inputs)
    c = next(o for o in report.result.outputs if o.name == "diff_src").comparison
    assert c.nonfinite.nan_channels == (1, 3, 4)
    assert "; c=1, 3..4 all NaN; where: c=1, 3..4 only (3 of 6 channels); all " in report.summary
    assert c.details.nonfinite_where.axes == (("c", ((1, 1), (3, 4))),)


def test_units_and_the_worst_element_are_the_finite_elements():
    inputs, grads = _problem("float32", "NCHW", seed=5)
    d = grads["diff_src"].astype(np.float64)
    d[0, 2, 1, 1] = np.nan
    d[2, 4, 3, 3] *= 1.5  # the finite failure
    report = bnbwd_cli.check(dict(grads, diff_src=d.astype(np.float32)), **inputs)
    c = next(o for o in report.result.outputs if o.name == "diff_src").comparison
    assert c.finite_mismatches == 1 and c.nonfinite.mismatches == 1
    assert c.worst[0].index == (2, 4, 3, 3) and all(np.isfinite(e.actual) for e in c.worst)
    assert c.max_units.index == (2, 4, 3, 3)
    assert "  worst (of the finite elements): n=2 c=4 h=3 w=3 actual " in report.summary
    assert "Worst 10 finite elements by error / allowance" in report.text or "Worst" in report.text
