"""Every JSON document bnbwd writes, their schema versions, and the one writer (document_text).

`run --json`: the run's facts (RUN_SCHEMA_VERSION). `verify --json`, `run --reference --json`: the comparison,
the same facts as the text report (SCHEMA_VERSION). `check --json` (render/cases.py builds it): one comparison
per case (CHECK_SCHEMA_VERSION).

JSON has no NaN or infinity. Statistics that are undefined are null; an infinite statistic
(e.g. a relative error against a zero reference) is the string "inf" or "-inf". The minimum
passing tolerances (min_atol, min_rtol, min_units) are numbers or null, never strings: null means
no tolerance would pass (NaN/Inf positions differ) or that rule was not used.

Version 2 (from 1): the scaled rule (rule, scaled, max_units, min_units), bias, hints, passed;
tolerance is null under the scaled rule; max_mismatch and equal_nan moved out of tolerance.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from bnbwd_cli.dtypes import dtype_label
from bnbwd_cli.judge.tolerance import DEFAULT_MAX_UNITS, DEFAULT_TOLERANCES
from bnbwd_cli.layout import coordinates

if TYPE_CHECKING:  # annotations only: `run --json` writes its document without loading the comparison
    from bnbwd_cli.judge import SetComparison
    from bnbwd_cli.judge.stats import Bias, Comparison, Located
    from bnbwd_cli.render.run import RunFacts

SCHEMA_VERSION = 2  # the comparison report (verify, run --reference)
RUN_SCHEMA_VERSION = 1  # run --json
CHECK_SCHEMA_VERSION = 1  # check --json


def _number(value: float | None) -> float | str | None:
    """NaN (undefined) -> null, infinities -> "inf"/"-inf"."""
    if value is None or math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _finite(value: float | None) -> float | None:
    """A finite number, else null."""
    return float(value) if value is not None and math.isfinite(value) else None


def _located(located: Located | None, axis_names) -> dict[str, Any] | None:
    if located is None:
        return None
    index = located.index
    return {"value": _number(located.value), "index": list(index) if index is not None else None,
            "where": coordinates(index, axis_names) if index is not None else None}


def _bias(bias: Bias | None, failed: bool) -> dict[str, Any] | None:
    if bias is None:
        return None
    return {"scale": bias.scale, "stderr": bias.stderr, "z": _number(bias.z), "threshold": bias.threshold,
            "significant": bias.significant, "failed": failed,
            "channels": [{"channel": c, "scale": s, "stderr": e} for c, s, e in bias.channels]}


def _comparison_json(c: Comparison) -> dict[str, Any]:
    n = c.nonfinite
    tol = c.tolerance
    return {
        "shape": list(c.shape),
        "dtype": c.dtype,
        "actual_dtype": c.actual_dtype,
        "reference_dtype": c.reference_dtype,
        "rule": "scaled" if c.scaled is not None else "fixed",
        "passed": c.passed,
        "tolerance": None if tol is None else {"atol": tol.atol, "rtol": tol.rtol, "ulp": tol.ulp, "rel_l2": tol.rel_l2},
        "scaled": None if c.scaled is None else {"max_units": c.scaled.max_units, "unit": c.scaled.unit,
                                                   "bias_check": c.scaled.bias_check},
        "max_mismatch": str(c.max_mismatch),
        "equal_nan": c.equal_nan,
        "elements": c.elements,
        "mismatches": c.mismatches,
        "mismatch_fraction": c.mismatch_fraction,
        "allowed_mismatches": c.allowed_mismatches,
        "max_abs": _located(c.max_abs, c.axis_names),
        "max_rel": _located(c.max_rel, c.axis_names),
        "max_ulp": _located(c.max_ulp, c.axis_names),
        "max_units": _located(c.max_units, c.axis_names),
        "rel_l2": _number(c.rel_l2),
        "rel_l2_passed": c.rel_l2_passed,
        "min_atol": _finite(c.min_atol),
        "min_rtol": _finite(c.min_rtol),
        "min_units": _finite(c.min_units),
        "bias": _bias(c.bias, c.bias_failed),
        "hints": list(c.hints),
        "nan": {"actual": n.nan_actual, "reference": n.nan_reference, "mismatches": n.nan_mismatches},
        "inf": {"actual": n.inf_actual, "reference": n.inf_reference, "mismatches": n.inf_mismatches},
        "axis_names": list(c.axis_names) if c.axis_names is not None else None,
        "channel_axis": c.channel_axis,
        "worst": [
            {"index": list(e.index), "where": coordinates(e.index, c.axis_names), "actual": _number(e.actual),
             "expected": _number(e.expected), "abs_err": _number(e.abs_err), "rel_err": _number(e.rel_err),
             "ulp_err": _number(e.ulp_err), "units": _number(e.units), "ratio": _number(e.ratio), "passed": e.passed}
            for e in c.worst
        ],
        "channels": None if c.channels is None else [
            {"channel": ch.channel, "elements": ch.elements, "mismatches": ch.mismatches, "max_abs": _number(ch.max_abs),
             "max_ratio": _number(ch.max_ratio)}
            for ch in c.channels
        ],
        "histogram": [{"low": b.low, "high": b.high, "count": b.count} for b in c.histogram],
        "zero_fraction_actual": c.zero_fraction_actual,
        "zero_fraction_reference": c.zero_fraction_reference,
        "mostly_zeros": c.mostly_zeros,
    }


def report_document(result: SetComparison, *, actual_label: str, reference_label: str) -> dict[str, Any]:
    """The JSON document: the same facts as the rich report."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "bnbwd verify",
        "actual": actual_label,
        "reference": reference_label,
        "status": result.status,
        "exit_code": int(result.exit_code),
        "inputs_known": result.inputs_known,
        "default_tolerances": {
            name: {"atol": t.atol, "rtol": t.rtol, "ulp": t.ulp, "rel_l2": t.rel_l2} for name, t in DEFAULT_TOLERANCES.items()
        },
        "default_max_units": DEFAULT_MAX_UNITS,
        "notes": list(result.notes),
        "problems": [{"kind": p.kind, "name": p.name, "message": p.message} for p in result.all_problems],
        "outputs": [
            {"name": o.name, "actual_key": o.actual_key, "reference_key": o.reference_key, "status": o.status,
             "comparison": _comparison_json(o.comparison) if o.comparison is not None else None}
            for o in result.outputs
        ],
    }


def run_document(facts: RunFacts) -> dict[str, Any]:
    """The facts of one run: what it read, what it wrote, each output's range and NaN/Inf count."""
    return {
        "schema_version": RUN_SCHEMA_VERSION,
        "command": "run",
        "spec": facts.spec,
        "data_format": facts.data_format,
        "canonical_format": facts.canonical_format,
        "epsilon": facts.epsilon,
        "training": facts.training,
        "elapsed_s": facts.elapsed_s,
        "core": facts.core,
        "stream": facts.stream,
        "inputs": {name: _describe(array) for name, array in facts.inputs.items()},
        "outputs": {
            name: {**_describe(array), "min": _finite(facts.stats[name].minimum),
                   "max": _finite(facts.stats[name].maximum), "nonfinite": facts.stats[name].nonfinite}
            for name, array in facts.outputs.items()
        },
        "written": facts.written,
    }


def _describe(array: np.ndarray) -> dict:
    return {"shape": list(array.shape), "dtype": dtype_label(array.dtype)}


def document_text(document: dict[str, Any]) -> str:
    """The document as JSON text (files.write writes it: one writer for every output)."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"
