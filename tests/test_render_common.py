"""render/common.py and render/brief.py's wording helpers: how numbers are written in every report, and advice
phrased for the face the reader uses."""

from __future__ import annotations

import math

import pytest

from bnbwd_cli.render.brief import op_text, phrase
from bnbwd_cli.render.common import fmt, fmt_ulp, fmt_value


@pytest.mark.parametrize("value, text", [(None, "-"), (math.nan, "-"), (math.inf, "inf"), (-math.inf, "-inf"),
                                         (0.0, "0"), (1234.5, "1.2e+03"), (-2.5e-7, "-2.5e-07")])
def test_a_statistic_in_two_significant_digits(value, text):
    assert fmt(value) == text


@pytest.mark.parametrize("value, text", [(None, "-"), (math.nan, "-"), (math.inf, "inf"), (0.0, "0"),
                                         (3.14159, "3.14"), (9990.0, "9.99e+03"), (10000.0, "1e+04"),
                                         (123456.0, "1e+05")])
def test_units_plain_below_ten_thousand_and_scientific_above(value, text):
    assert fmt_ulp(value) == text


def test_an_element_keeps_enough_digits_to_tell_float32_neighbours_apart():
    import numpy as np

    a = np.float32(1.0)
    b = np.nextafter(a, np.float32(2.0))
    assert fmt_value(float(a)) != fmt_value(float(b))
    assert np.float32(fmt_value(float(b))) == b  # 9 digits: a float32 reads back as itself


def test_a_statistic_against_its_threshold_as_judge_decided():
    """">" or "<=" is the criterion's own ``beyond`` (judge/criteria.py), never a comparison made here."""
    from dataclasses import replace

    from bnbwd_cli.judge.criteria import Criterion

    beyond = Criterion("max_units", 2.0, 1.0, passed=True, beyond=True)  # beyond K, within its ulp: it passes
    assert op_text(beyond) == ">" and op_text(replace(beyond, value=0.5)) == ">"
    assert op_text(replace(beyond, beyond=False)) == "<="


def test_advice_is_phrased_for_the_api_and_left_alone_for_the_cli():
    advice = "pass --variance-is-invstd, or would pass with --max-units 40 (--format NHWC?)"
    assert phrase(advice, "cli") == advice
    assert phrase(advice, "api") == "pass variance_is_invstd=True, or would pass with max_units=40 (data_format NHWC?)"
