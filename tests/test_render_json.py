"""render/json.py: every number a document carries is finite or null, never "Infinity" or "NaN", and the one
writer refuses a document that would hold one (JSON has no such numbers; a reader would choke on them)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.render.json import SCHEMA_VERSION, Source, document_text, finite, report_document
from tools import zoo


@pytest.mark.parametrize("value, shown", [(None, None), (math.inf, None), (-math.inf, None), (math.nan, None),
                                          (0.0, 0.0), (-2.5, -2.5), (np.float32(0.5), 0.5), (3, 3.0)])
def test_finite_keeps_numbers_and_makes_the_rest_null(value, shown):
    result = finite(value)
    assert result == shown and (result is None or type(result) is float)


def test_the_writer_refuses_a_non_finite_number():
    assert document_text({"a": 1.5, "b": None}) == '{\n  "a": 1.5,\n  "b": null\n}\n'
    with pytest.raises(ValueError):
        document_text({"a": math.inf})


def test_a_report_on_a_kernel_that_wrote_nan_and_inf_holds_nulls_not_infinities():
    problem = zoo.make_problem(np.random.default_rng(3), (2, 3, 4, 4), "NCX", np.float32, np.float32)
    truth = zoo.bnbwd_outputs(problem)
    broken = {**truth, "diff_src": truth["diff_src"].copy(), "diff_gamma": truth["diff_gamma"].copy()}
    broken["diff_src"][0, 1, 2, 3] = np.nan
    broken["diff_gamma"][2] = np.inf
    result = compare_sets(broken, truth, Judging(), inputs=zoo.inputs_of(problem))
    text = document_text(report_document(result, Source("test", "kernel", "bnbwd")))
    assert "Infinity" not in text and "NaN" not in text
    document = json.loads(text)
    assert document["schema_version"] == SCHEMA_VERSION and document["status"] == "mismatch"
    assert None in _numbers(document)  # an unbounded statistic (e.g. max units on a NaN) is there, as null


def _numbers(node) -> list:
    if isinstance(node, dict):
        return [n for value in node.values() for n in _numbers(value)]
    if isinstance(node, list):
        return [n for value in node for n in _numbers(value)]
    return [node] if node is None or isinstance(node, (int, float)) else []
