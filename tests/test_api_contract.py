"""The API's contract: an argument of the wrong kind or value is a bnbwd_cli.InputError (a ValueError) with one
printable line, never a TypeError, AttributeError, OverflowError or a framework's error; and no NumPy warning
escapes a call on inputs with inf, NaN or zero variance (pytest's filterwarnings=error would fail the caller)."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import make_inputs


@pytest.fixture
def inputs(rng) -> dict:
    return dict(make_inputs(rng, (4, 3, 5)), epsilon=1e-5, data_format="NCX")


BAD_SETTINGS = {  # (keyword, value, what the message says)
    "epsilon-string": ("epsilon", "1e-5", "epsilon is '1e-5', expected a finite number > 0"),
    "epsilon-array": ("epsilon", np.array([1e-5, 1e-5]), "epsilon is array("),
    "epsilon-0d-array": ("epsilon", np.array(1e-5), "epsilon is array("),
    "epsilon-complex": ("epsilon", 1j, "epsilon is 1j,"),
    "epsilon-list": ("epsilon", [1e-5], "epsilon is [1e-05],"),
    "epsilon-bool": ("epsilon", True, "epsilon is True,"),
    "epsilon-decimal": ("epsilon", Decimal("1e-5"), "epsilon is Decimal("),
    "epsilon-huge-int": ("epsilon", 10**400, "epsilon is 1000"),
    "epsilon-nan": ("epsilon", float("nan"), "epsilon is nan"),
    "epsilon-negative": ("epsilon", -1.0, "epsilon"),
    "data-format-int": ("data_format", 3, "data_format is 3, expected a layout name"),
    "data-format-bytes": ("data_format", b"NCX", "data_format is b'NCX'"),
    "data-format-list": ("data_format", ["NCX"], "data_format is ['NCX']"),
    "data-format-unknown": ("data_format", "NQX", "data_format NQX is not allowed"),
    "data-format-10mb": ("data_format", "N" * 10_000_000, "data_format NNN"),
    "spec-int": ("spec", 3, "spec is 3, expected one of generic"),
    "spec-list": ("spec", [], "spec is [], expected one of generic"),
    "training-string": ("training", "no", "training is 'no', expected True or False"),
    "training-array": ("training", np.array([1, 0]), "training is array("),
    "training-none": ("training", None, "training is None"),
    "invstd-array": ("variance_is_invstd", np.array([True, True]), "variance_is_invstd is array("),
}
BAD_CHECK_ONLY = {
    "max-units-string": ("max_units", "16", "max_units is '16', expected a finite number >= 0"),
    "max-units-complex": ("max_units", 1j, "max_units is 1j"),
    "max-units-array": ("max_units", np.array([1, 2]), "max_units is array("),
    "max-units-list": ("max_units", [3], "max_units is [3]"),
    "max-units-negative": ("max_units", -1, "max_units is -1"),
    "max-units-nan": ("max_units", float("nan"), "max_units is nan"),
    "max-units-inf": ("max_units", float("inf"), "max_units is inf"),
    "max-units-huge-int": ("max_units", 10**400, "max_units is 1000"),
    "key-map-string": ("key_map", "abc", "key_map is 'abc', expected a mapping of names to names"),
    "key-map-pairs": ("key_map", [("dx", "diff_src")], "key_map is [("),
    "key-map-values": ("key_map", {"dx": 3}, "key_map is {'dx': 3}"),
    "only-int": ("only", 3, "only is 3, expected an output's name or a sequence of them"),
    "only-empty": ("only", (), "only is ()"),
    "only-set": ("only", {"diff_src"}, "only is {'diff_src'}"),
    "only-mixed": ("only", ["diff_src", 1], "only is ['diff_src', 1]"),
}


def assert_input_error(excinfo, fragment: str) -> None:
    error = excinfo.value
    assert type(error) is bnbwd_cli.InputError and isinstance(error, ValueError)
    message = str(error)
    assert fragment in message, message
    assert "\n" not in message and len(message) <= 1000 and "N" * 201 not in message


@pytest.mark.parametrize("name", list(BAD_SETTINGS))
def test_backward_check_and_assert_refuse_a_bad_setting_with_an_input_error(inputs, name):
    keyword, value, fragment = BAD_SETTINGS[name]
    grads = bnbwd_cli.backward(**inputs)
    for call in (lambda: bnbwd_cli.backward(**{**inputs, keyword: value}),
                 lambda: bnbwd_cli.check(grads, **{**inputs, keyword: value}),
                 lambda: bnbwd_cli.assert_backward_close(grads, **{**inputs, keyword: value})):
        with pytest.raises(ValueError) as excinfo:
            call()
        assert_input_error(excinfo, fragment)


@pytest.mark.parametrize("name", list(BAD_CHECK_ONLY))
def test_check_refuses_bad_max_units_and_key_maps_with_an_input_error(inputs, name):
    keyword, value, fragment = BAD_CHECK_ONLY[name]
    grads = bnbwd_cli.backward(**inputs)
    for call in (bnbwd_cli.check, bnbwd_cli.assert_backward_close):
        with pytest.raises(ValueError) as excinfo:
            call(grads, **inputs, **{keyword: value})
        assert_input_error(excinfo, fragment)


@pytest.mark.parametrize("actual, fragment", [
    ("diff_src", "actual is a str, expected a mapping"),
    (None, "actual is a NoneType"),
    (3, "actual is a int"),
    ((a for a in ()), "actual is a generator"),
    ([np.zeros(1)] * 4, "actual is a list of 4, expected 1 to 3 arrays"),
    ({}, "no kernel outputs to judge"),
    ((None, None, None), "no kernel outputs to judge"),
    ({"diff_src": [[1.0, 2.0], [3.0]]}, "diff_src: not an array"),
])
def test_check_refuses_actuals_of_the_wrong_kind_with_an_input_error(inputs, actual, fragment):
    with pytest.raises(ValueError) as excinfo:
        bnbwd_cli.check(actual, **inputs)
    assert_input_error(excinfo, fragment)


def test_check_takes_outputs_as_a_list_tuple_or_mapping_and_numpy_scalars_as_settings(inputs):
    grads = bnbwd_cli.backward(**inputs)
    ordered = [grads["diff_src"], grads["diff_gamma"], grads["diff_beta"]]
    for actual in (ordered, tuple(ordered), grads):
        assert bnbwd_cli.check(actual, **inputs, max_units=np.float32(16)).status == "pass"
    # fewer outputs: each one missing is structural, unless only= (the CLI's --only) leaves it out
    assert bnbwd_cli.check(ordered[:1], **inputs).status == "structural"
    assert bnbwd_cli.check(ordered[:1], **inputs, only="diff_src").status == "pass"
    assert bnbwd_cli.check((ordered[0], None, ordered[2]), **inputs, only=["diff_src", "diff_beta"]).status == "pass"
    settings = dict(inputs, epsilon=np.float32(1e-5), training=np.bool_(True), variance_is_invstd=0)
    assert bnbwd_cli.check(grads, **settings, key_map={}).status == "pass"


# --------------------------------------------------------------------------- no warning escapes


def _nonfinite_problems(rng) -> dict[str, dict]:
    base = dict(make_inputs(rng, (4, 3, 6)), epsilon=1e-5, data_format="NCX")
    problems = {}
    for name, where, value in (("inf-src", "src", np.inf), ("nan-src", "src", np.nan), ("inf-dy", "diff_dst", np.inf),
                               ("nan-dy", "diff_dst", np.nan), ("-inf-dy", "diff_dst", -np.inf)):
        array = base[where].copy()
        array[1, 2, 3] = value
        problems[name] = {**base, where: array}
    problems["nan-mean"] = {**base, "mean": np.full(3, np.nan, np.float32)}
    problems["inf-variance"] = {**base, "variance": np.full(3, np.inf, np.float32)}
    constant = np.ones_like(base["src"])
    problems["zero-variance"] = {**base, "src": constant, "mean": np.ones(3, np.float32),
                                 "variance": np.zeros(3, np.float32)}
    problems["huge-f64"] = {**base, "src": base["src"].astype(np.float64) * 1e300,
                            "diff_dst": base["diff_dst"].astype(np.float64) * 1e300,
                            "mean": base["mean"].astype(np.float64) * 1e300, "variance": np.full(3, 1e300)}
    return problems


@pytest.mark.filterwarnings("error")
def test_no_numpy_warning_escapes_inf_nan_or_zero_variance(rng):
    for name, problem in _nonfinite_problems(rng).items():
        grads = bnbwd_cli.backward(**problem)
        clean = {key: np.where(np.isfinite(value), value, 0).astype(value.dtype) for key, value in grads.items()}
        for actual in (grads, clean, {"diff_src": np.full_like(grads["diff_src"], np.nan)},
                       (np.full_like(grads["diff_src"], np.inf), None, grads["diff_beta"])):
            report = bnbwd_cli.check(actual, **problem)
            assert report.status in ("pass", "mismatch", "structural"), name
            assert report.text and report.to_json()
            try:
                bnbwd_cli.assert_backward_close(actual, **problem)
            except AssertionError as failure:
                assert str(failure).startswith("FAIL: "), name  # the verdict first (Report.summary)
