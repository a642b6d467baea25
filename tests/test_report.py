"""Golden report text (fixed-width console, no colour) and the JSON schema, pinned."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from bnbwd_cli.judge import Judging, SetComparison, compare_sets
from bnbwd_cli.judge.tolerance import PerOutput
from bnbwd_cli.files.write import write_text
from bnbwd_cli.render.json import SCHEMA_VERSION, Source, document_text, report_document
from bnbwd_cli.render.text import Labels, ReportStyle, coordinates, fmt, render_report


def render(result: SetComparison, verbose: bool = False) -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    render_report(console, result, Labels("actual.npz", "reference.npz"), ReportStyle(verbose=verbose))
    # rich pads table titles with spaces; editors strip trailing blanks from the golden text
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()) + "\n"


def mismatch_case() -> SetComparison:
    """diff_src: channel 1 off at two elements; diff_gamma: one ulp off (passes); diff_beta exact."""
    reference = {
        "diff_src": np.array([[[[0.5, -0.25], [1.0, 0.0]], [[2.0, -1.0], [0.125, 4.0]]]], dtype=np.float32),
        "diff_gamma": np.array([1.5, -2.0], dtype=np.float32),
        "diff_beta": np.array([0.0, 3.0], dtype=np.float32),
    }
    actual = {key: value.copy() for key, value in reference.items()}
    actual["diff_src"][0, 1, 1, 0] = 0.25
    actual["diff_src"][0, 1, 0, 1] = -1.0001
    actual["diff_gamma"][1] = np.float32(-2.0) + np.float32(2**-22)
    judging = Judging(atol=PerOutput(by_name={"diff_gamma": 1e-4}), top=3)
    return compare_sets(actual, reference, judging, data_format="NCHW")


def structural_case() -> SetComparison:
    reference = {"diff_src": np.zeros((2, 3, 4, 4), np.float32), "diff_gamma": np.ones(3, np.float32), "diff_beta": np.ones(3, np.float32)}
    actual = {"diff_src": np.zeros((2, 4, 4, 3), np.float32), "diff_gamma": np.ones(3, np.float32), "junk": np.ones(3, np.float32)}
    return compare_sets(actual, reference, Judging(), data_format="NCHW")


GOLDEN_VERBOSE = '''\
Comparison: actual actual.npz vs reference reference.npz
fixed tolerances: element passes if |a-r| <= atol + rtol*|r| or ULP <= ulp; output passes if ||a-r||2/||r||2 <= rel_l2
   f32  atol=0.0001 rtol=1e-05 ulp=1 rel_l2=7.6e-06 (overridden)
   f32  atol=1e-05 rtol=1e-05 ulp=1 rel_l2=7.6e-06
note: diff_gamma, diff_beta are sums over M elements; their correct error grows with the size of the terms, not of the result. Give --inputs (or use run --reference) for a fair judgement.

output      shape      dtype  status  mismatched  max abs  max ULP   rel L2  min atol
─────────────────────────────────────────────────────────────────────────────────────
diff_src    (1,2,2,2)  f32    FAIL       2 (25%)  1.2e-01    8e+06  2.6e-02   1.2e-01
diff_gamma  (2,)       f32    PASS        0 (0%)  2.4e-07        1  9.5e-08         0
diff_beta   (2,)       f32    PASS        0 (0%)        0        0        0         0

diff_src: FAIL ─────────────────────────────────────────────────────────────────────────────────────
Mismatched elements: 2 / 8 (25%), allowed 0
max abs 1.2e-01 at n=0 c=1 h=1 w=0; max ULP 8e+06 at n=0 c=1 h=1 w=0
rel L2 2.6e-02 (bound 7.6e-06): FAIL
would pass (element-wise) with atol >= 1.2e-01 (rtol as set) or rtol >= 1.0e+00 (atol as set)
Worst 2 elements by error / allowance
where                 actual  expected  abs err    ULP  rel err  err/allowed
───────────────────────────────────────────────────────────────────────────────
n=0 c=1 h=1 w=0         0.25     0.125  1.2e-01  8e+06  1.0e+00     1.11e+04  x
n=0 c=1 h=0 w=1  -1.00010002        -1  1.0e-04    839  1.0e-04            5  x
Channels with mismatches: 1 of 2
c  mismatched  max abs  max err/allowed
───────────────────────────────────────
1       2 / 4  1.2e-01         1.11e+04
where: 2 elements: n=0 c=1 h=0 w=1; n=0 c=1 h=1 w=0; all larger in magnitude than the reference
failing share: rows c, columns 4 blocks of each channel's 4 positions (n, h, w flattened in storage order)
     0  3
c=0  ····
c=1  ·██·
     · none  ░ < 25%  ▒ < 50%  ▓ < 75%  █ >= 75% of the cell's elements fail
|a-r| histogram (finite elements)
|a-r|           count
─────────────────────────────────────────────────────
0 (exact)           6  ##############################
[1e-04, 1e-03)      1  #####
[1e-03, 1e-02)      0
[1e-02, 1e-01)      0
[1e-01, 1e+00)      1  #####

diff_gamma: PASS ───────────────────────────────────────────────────────────────────────────────────
Mismatched elements: 0 / 2 (0%), allowed 0
max abs 2.4e-07 at c=1; max ULP 1 at c=1
rel L2 9.5e-08 (bound 7.6e-06): ok
would pass (element-wise) with atol >= 0 (rtol as set) or rtol >= 0 (atol as set)
Worst 1 element by error / allowance
where       actual  expected  abs err  ULP  rel err  err/allowed
───────────────────────────────────────────────────────────────────
c=1    -1.99999976        -2  2.4e-07    1  1.2e-07      0.00199
|a-r| histogram (finite elements)
|a-r|           count
─────────────────────────────────────────────────────
0 (exact)           1  ##############################
[1e-07, 1e-06)      1  ##############################

diff_beta: PASS ────────────────────────────────────────────────────────────────────────────────────
Mismatched elements: 0 / 2 (0%), allowed 0
max abs 0 at c=0; max ULP 0 at c=0
rel L2 0 (bound 7.6e-06): ok
would pass (element-wise) with atol >= 0 (rtol as set) or rtol >= 0 (atol as set)
|a-r| histogram (finite elements)
|a-r|      count
────────────────────────────────────────────────
0 (exact)      2  ##############################

FAIL (exit 1): numerical mismatch in diff_src
'''

GOLDEN_STRUCTURAL = '''\
Comparison: actual actual.npz vs reference reference.npz
fixed tolerances: element passes if |a-r| <= atol + rtol*|r| or ULP <= ulp; output passes if ||a-r||2/||r||2 <= rel_l2
   f32  atol=1e-05 rtol=1e-05 ulp=1 rel_l2=7.6e-06
note: diff_gamma is a sum over M elements; their correct error grows with the size of the terms, not of the result. Give --inputs (or use run --reference) for a fair judgement.
note: not compared: junk (only in actual)

output      shape  dtype  status   mismatched  max abs  max ULP  rel L2  min atol
─────────────────────────────────────────────────────────────────────────────────
diff_src    -      -      SHAPE             -        -        -       -         -
diff_gamma  (3,)   f32    PASS         0 (0%)        0        0       0         0
diff_beta   -      -      MISSING           -        -        -       -         -

FAIL (exit 3): 2 structural problem(s), each named on stderr
'''


def test_golden_verbose_report():
    assert render(mismatch_case(), verbose=True) == GOLDEN_VERBOSE


def test_golden_structural_report():
    assert render(structural_case()) == GOLDEN_STRUCTURAL


def test_default_report_details_only_failing_outputs():
    text = render(mismatch_case())
    assert "diff_src: FAIL" in text and "diff_gamma: PASS" not in text
    assert "Mismatched elements: 2 / 8 (25%), allowed 0" in text


def test_mostly_zeros_warning_and_nan_counts_rendered():
    reference = {"diff_src": np.arange(1.0, 9.0, dtype=np.float32).reshape(1, 2, 2, 2)}
    actual = {"diff_src": np.zeros((1, 2, 2, 2), np.float32)}
    actual["diff_src"][0, 0, 0, 0] = np.nan
    text = render(compare_sets(actual, reference, Judging(), data_format="NHWC"))
    assert "warning: actual is 87.5% exact zeros, reference 0%: was the output written at all?" in text
    assert "NaN: actual 1, reference 0, mismatched 1; Inf: actual 0, reference 0, mismatched 0" in text
    assert "n=0 h=0 w=0 c=0" in text  # NHWC coordinates


@pytest.mark.parametrize(
    ("value", "text"), [(float("nan"), "-"), (float("inf"), "inf"), (0.0, "0"), (1.234e-5, "1.2e-05")], ids=["nan", "inf", "zero", "num"]
)
def test_number_format(value, text):
    assert fmt(value) == text


def test_coordinates():
    assert coordinates((3, 17, 5, 9), ("n", "c", "h", "w")) == "n=3 c=17 h=5 w=9"
    assert coordinates((3, 17), None) == "(3, 17)"


def _types(value):
    """The JSON document's shape: dict keys and value types, lists by their first element."""
    if isinstance(value, dict):
        return {key: _types(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_types(value[0])] if value else []
    return type(value).__name__


def test_json_schema_pinned():
    document = report_document(mismatch_case(), Source("bnbwd verify", "a.npz", "r.npz"))
    json.dumps(document, allow_nan=False)
    assert document["schema_version"] == SCHEMA_VERSION == 4
    assert (document["status"], document["exit_code"]) == ("mismatch", 1)
    schema = _types(document)
    assert schema["default_tolerances"]["bf16"] == {"atol": "float", "rtol": "float", "ulp": "float", "rel_l2": "float"}
    assert document["default_max_units"] == {"diff_src": 16.0, "diff_gamma": 5.0, "diff_beta": 5.0}
    output = schema["outputs"][0]
    assert output.keys() == {"name", "actual_key", "reference_key", "status", "problem", "comparison"}
    comparison = output["comparison"]
    assert comparison == {
        "shape": ["int"],
        "dtype": "str",
        "actual_dtype": "str",
        "reference_dtype": "str",
        "rule": "str",
        "passed": "bool",
        "tolerance": {"atol": "float", "rtol": "float", "ulp": "float", "rel_l2": "float"},
        "scaled": "NoneType",
        "max_mismatch": "str",
        "equal_nan": "bool",
        "elements": "int",
        "mismatches": "int",
        "mismatch_fraction": "float",
        "allowed_mismatches": "int",
        "flushed_to_zero": "int",
        "read_as_zero": "int",
        "max_abs": {"value": "float", "index": ["int"], "where": "str"},
        "max_rel": {"value": "float", "index": ["int"], "where": "str"},
        "max_ulp": {"value": "float", "index": ["int"], "where": "str"},
        "max_units": "NoneType",
        "units_unbounded": "bool",
        "criteria": [{"statistic": "str", "value": "float", "threshold": "float", "passed": "bool", "channel": "NoneType",
                   "checked": "bool"}],
        "rel_l2": "float",
        "rel_l2_passed": "bool",
        "min_atol": "float",
        "min_rtol": "float",
        "min_units": "NoneType",
        "bias": "NoneType",
        "hints": [],
        "nan": {"actual": "int", "reference": "int", "mismatches": "int"},
        "inf": {"actual": "int", "reference": "int", "mismatches": "int"},
        "nonfinite": {"mismatches": "int", "first": [], "nan_channels": [], "where": "NoneType"},
        "where": {"kind": "str", "text": "str", "failing": "int", "covered": "int", "region": "int", "axes": {},
                  "start": "NoneType", "stop": "NoneType", "period": "NoneType", "lanes": [], "above": "int",
                  "below": "int", "larger": "int", "smaller": "int"},
        "heat_map": {"channels": [["int"]], "positions": [["int"]], "failing": [["int"]], "elements": [["int"]]},
        "axis_names": ["str"],
        "channel_axis": "int",
        "worst": [
            {
                "index": ["int"],
                "where": "str",
                "actual": "float",
                "expected": "float",
                "abs_err": "float",
                "rel_err": "float",
                "ulp_err": "float",
                "units": "NoneType",
                "ratio": "float",
                "passed": "bool",
            }
        ],
        "channels": [{"channel": "int", "elements": "int", "mismatches": "int", "max_abs": "float", "max_ratio": "float"}],
        "histogram": [{"low": "float", "high": "float", "count": "int"}],
        "zero_fraction_actual": "float",
        "zero_fraction_reference": "float",
        "mostly_zeros": "bool",
    }
    diff_src = document["outputs"][0]["comparison"]
    assert diff_src["max_abs"] == {"value": 0.125, "index": [0, 1, 1, 0], "where": "n=0 c=1 h=1 w=0"}
    assert [c["mismatches"] for c in diff_src["channels"]] == [0, 2]


def test_json_structural_rows_and_non_finite_encoding(tmp_path):
    document = report_document(structural_case(), Source("bnbwd verify", "a", "r"))
    assert (document["status"], document["exit_code"]) == ("structural", 3)
    assert [(o["name"], o["status"], o["problem"], o["comparison"]) for o in document["outputs"]
            if o["comparison"] is None] == [
        ("diff_src", "structural", "shape", None),
        ("diff_beta", "structural", "missing", None),
    ]
    assert [p["kind"] for p in document["problems"]] == ["shape", "missing"]
    assert document["notes"] == ["not compared: junk (only in actual)"]
    nan_case = compare_sets({"x": np.array([np.nan, 1.0])}, {"x": np.array([1.0, 1.0])}, Judging())
    path = tmp_path / "r.json"
    write_text(str(path), document_text(report_document(nan_case, Source("bnbwd verify", "a", "r"))))
    loaded = json.loads(path.read_text())["outputs"][0]["comparison"]
    assert loaded["min_atol"] is None and loaded["worst"] == []  # the worst elements are finite ones
    assert loaded["nonfinite"] == {"mismatches": 1, "first": [{"index": [0], "where": "(0)"}], "nan_channels": [],
                                   "where": {"kind": "elements", "text": "1 element: dim0=0", "failing": 1, "covered": 1,
                                             "region": 1, "axes": {}, "start": None, "stop": None, "period": None,
                                             "lanes": [], "above": None, "below": None, "larger": None,
                                             "smaller": None}}
