"""Inputs that read but do not fit the op, through `bnbwd run`: dtypes that are not floats, ranks, shapes and
dtypes that disagree, statistics out of range, bundle attributes (epsilon, data_format), epsilon from the command
line, a spec's restrictions; and odd but valid values (NaN/Inf, empty dimensions, float16, extreme epsilon),
checked against the float64 oracle (tests/catalogue.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main
from tests.catalogue import (
    Case, NONFINITE_WARNING, SHAPE, WARNINGS_ARE_ERRORS, Workspace, assert_fails_cleanly, assert_works, bundle_with,
    each_case, invoke, make_inputs, with_value,
)
from tests.conftest import error_line

pytestmark = WARNINGS_ARE_ERRORS

CASES = [
    Case("npy-int32-src", bundle_with(src=lambda a: a["src"].astype(np.int32)), 3, r"src has dtype int32, expected a float"),
    Case("npy-complex-src", bundle_with(src=lambda a: a["src"].astype(np.complex64), diff_dst=lambda a: a["diff_dst"].astype(np.complex64)),
         3, r"src has dtype complex64, expected a float"),
    Case("npy-bool-diff-dst", bundle_with(diff_dst=lambda a: a["diff_dst"] > 0), 3, r"diff_dst has dtype bool, expected a float"),
    Case("npy-int-variance", bundle_with(variance=np.array([1, 2, 3], dtype=np.int64)), 3, r"variance has dtype int64"),
    Case("npy-unicode-mean", bundle_with(mean=np.array(["a", "b", "c"])), 3, r"mean has dtype <U1, expected a float"),
    Case("npy-datetime-src", bundle_with(src=lambda a: np.zeros(SHAPE, dtype="datetime64[s]")), 3, r"src has dtype datetime64"),
    Case("npy-void4-src", bundle_with(src=lambda a: np.zeros(SHAPE, dtype="V4")), 3, r"src has dtype \|?V4, expected a float"),
    Case("src-0d", bundle_with(src=np.array(1.0, dtype=np.float32), diff_dst=np.array(1.0, dtype=np.float32)), 3,
         r"src has rank 0"),
    Case("src-1d", bundle_with(src=np.ones(3, np.float32), diff_dst=np.ones(3, np.float32)), 3, r"src has rank 1"),
    Case("bundle-duplicate-alias", lambda ws: [ws.bundle(make_inputs() | {"x": make_inputs()["src"]})], 3,
         r"both 'src' and 'x' give src"),
    Case("bundle-missing-variance", bundle_with(variance=None), 3, r"missing input variance"),
    Case("bundle-epsilon-not-0d", lambda ws: [ws.bundle(epsilon=np.array([1e-3, 1e-3]))], 3, r"'epsilon' must be a 0-d"),
    Case("bundle-epsilon-string", lambda ws: [ws.bundle(epsilon=np.array("1e-3"))], 3, r"'epsilon' must be a real number"),
    Case("bundle-epsilon-nan", lambda ws: [ws.bundle(epsilon=np.array(np.nan))], 3, r"epsilon is nan, expected a finite number > 0"),
    Case("bundle-epsilon-negative", lambda ws: [ws.bundle(epsilon=np.array(-1e-5))], 3, r"epsilon is -1e-05"),
    Case("bundle-data-format-bogus", lambda ws: [ws.bundle(data_format=np.array("NQHW"))], 3, r"data_format.*NQHW"),
    Case("bundle-data-format-number", lambda ws: [ws.bundle(data_format=np.array(4))], 3, r"'data_format' must be a string"),
    Case("diff-dst-shape-mismatch", bundle_with(diff_dst=lambda a: a["diff_dst"][:1]), 3,
         r"diff_dst has shape \(1, 3, 4, 5\), expected \(2, 3, 4, 5\)"),
    Case("mean-wrong-length", bundle_with(mean=lambda a: a["mean"][:2]), 3, r"mean has shape \(2,\), expected \(3,\)"),
    Case("diff-dst-dtype-mismatch", bundle_with(diff_dst=lambda a: a["diff_dst"].astype(np.float64)), 3,
         r"diff_dst has dtype f64, expected f32"),
    Case("variance-negative", bundle_with(variance=with_value("variance", 1, -0.5)), 3, r"variance at c=1 is -0\.5, expected >= 0"),
    Case("variance-nan", bundle_with(variance=with_value("variance", 2, np.nan)), 3, r"variance at c=2 is nan"),
    Case("invstd-zero", lambda ws: [*bundle_with(variance=with_value("variance", 0, 0.0))(ws), "--variance-is-invstd"], 3,
         r"variance \(as invstd\) at c=0"),
    Case("format-rank-mismatch", lambda ws: [ws.bundle(), "--format", "NCW"], 3, r"NCW needs a rank-3 src, found rank 4"),
    Case("spec-format-not-allowed", lambda ws: [ws.bundle(), "--spec", "ngraph", "--format", "NHWC"], 3,
         r"data_format NHWC is not allowed by spec ngraph"),
    Case("spec-dtype-pair-not-allowed", lambda ws: [ws.bundle(make_inputs(dtype=np.float16, stats_dtype=np.float16)), "--spec", "openvino"],
         3, r"spec openvino does not allow src f16 with mean/variance f16"),
    Case("bf16-flag-on-float32", lambda ws: [ws.bundle(), "--bf16", "mean"], 3, r"--bf16 mean: mean has dtype float32"),
    Case("epsilon-zero", lambda ws: [ws.bundle(), "--epsilon", "0"], 3, r"epsilon is 0\.0, expected a finite number > 0"),
    Case("epsilon-negative", lambda ws: [ws.bundle(), "--epsilon", "-1e-5"], 3, r"epsilon is -1e-05"),
    Case("epsilon-nan", lambda ws: [ws.bundle(), "--epsilon", "nan"], 3, r"epsilon is nan"),
    Case("epsilon-inf", lambda ws: [ws.bundle(), "--epsilon", "inf"], 3, r"epsilon is inf"),
    Case("epsilon-overflows-f32", lambda ws: [ws.bundle(), "--spec", "openvino", "--epsilon", "1e39"], 3,
         r"epsilon 1e\+39 .*float32"),
    Case("epsilon-underflows-f32", lambda ws: [ws.bundle(), "--spec", "onednn", "--epsilon", "1e-50"], 3,
         r"epsilon 1e-50 .*float32"),
    Case("epsilon-not-a-number", lambda ws: [ws.bundle(), "--epsilon", "small"], 2, r"'small' is not a valid float"),
]

VALID_CASES = [
    Case("float16", lambda ws: [ws.bundle(make_inputs(dtype=np.float16, stats_dtype=np.float32))], 0, ""),
    Case("channels-zero", lambda ws: [ws.bundle(make_inputs(shape=(2, 0, 4, 5)))], 0, ""),
    Case("batch-zero", lambda ws: [ws.bundle(make_inputs(shape=(0, 3, 4, 5)))], 0, ""),
    Case("spatial-zero", lambda ws: [ws.bundle(make_inputs(shape=(2, 3, 0, 5)))], 0, ""),
    Case("batch-one-spatial-one", lambda ws: [ws.bundle(make_inputs(shape=(1, 3, 1, 1)))], 0, ""),
    Case("nan-in-src", bundle_with(src=with_value("src", (0, 1, 2, 3), np.nan)), 0, NONFINITE_WARNING),
    Case("inf-in-diff-dst", bundle_with(diff_dst=with_value("diff_dst", (1, 2, 0, 0), np.inf)), 0, NONFINITE_WARNING),
    Case("nan-in-gamma", bundle_with(gamma=with_value("gamma", 0, np.nan)), 0, NONFINITE_WARNING),
    Case("inf-variance", bundle_with(variance=with_value("variance", 1, np.inf)), 0, ""),
    Case("stream-nan-in-diff-dst", lambda ws: [*ws.flags(make_inputs() | {"diff_dst": with_value("diff_dst", (0, 0, 0, 0), np.nan)(make_inputs())}),
                                               "--stream"], 0, NONFINITE_WARNING),
    Case("epsilon-huge", lambda ws: [ws.bundle(), "--epsilon", "1e30"], 0, ""),
    Case("epsilon-tiny", lambda ws: [ws.bundle(), "--epsilon", "1e-300"], 0, ""),
]


@each_case(VALID_CASES)
def test_odd_but_valid_input_works(ws: Workspace, case: Case) -> None:
    assert_works(ws, case)


@each_case(CASES)
def test_bad_input_fails_cleanly(ws: Workspace, case: Case) -> None:
    assert_fails_cleanly(ws, case)


def test_zero_batch_gives_empty_diff_src_and_zero_param_grads(ws: Workspace) -> None:
    result, _ = invoke(ws, Case("n0", lambda w: [w.bundle(make_inputs(shape=(0, 3, 4, 5)))], 0, ""))
    assert result.exit_code == 0, result.stderr
    with np.load(ws.out / "grads.npz") as written:
        assert written["diff_src"].shape == (0, 3, 4, 5)
        assert np.array_equal(written["diff_gamma"], np.zeros(3)) and np.array_equal(written["diff_beta"], np.zeros(3))


def test_nan_propagates_through_its_channel_only(ws: Workspace) -> None:
    case = Case("nan", bundle_with(src=with_value("src", (0, 1, 2, 3), np.nan)), 0, NONFINITE_WARNING)
    result, _ = invoke(ws, case)
    assert result.exit_code == 0, result.stderr
    with np.load(ws.out / "grads.npz") as written:
        assert np.isnan(written["diff_src"][:, 1]).all() and np.isfinite(written["diff_src"][:, [0, 2]]).all()
        assert np.isnan(written["diff_gamma"][1]) and np.isfinite(written["diff_gamma"][[0, 2]]).all()
        assert np.isfinite(written["diff_beta"]).all()  # Σdy does not see src


@pytest.mark.parametrize("value", ["", "   "], ids=["empty", "blank"])
@pytest.mark.parametrize("command", ["run", "verify"])
def test_empty_data_format_entry_is_an_error_not_absent(ws: Workspace, value: str, command: str) -> None:
    bundle = ws.bundle(data_format=np.array(value))
    if command == "run":
        result = CliRunner().invoke(main, ["run", bundle, "-o", str(ws.out / "grads.npz")])
    else:
        result = CliRunner().invoke(main, ["verify", bundle, bundle, "--inputs", bundle])
    assert result.exit_code == 3, result.stderr
    assert re.search(r"'data_format' is empty", error_line(result.stderr))
    assert list(ws.out.iterdir()) == []

