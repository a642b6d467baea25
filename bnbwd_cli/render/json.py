"""Every JSON document bnbwd writes, their schema versions, and the one writer (document_text).

`run --json`: the run's facts (RUN_SCHEMA_VERSION). `verify --json`, `run --reference --json`, the API's
Report.to_json(): the comparison, the same facts as the text report (SCHEMA_VERSION). `check --json`
(render/cases.py builds it): per case its verdict, worst units, tests and hints, and the comparison of its
failing outputs only (the same SCHEMA_VERSION).

Numbers are numbers or null, never strings: JSON has no NaN or infinity, and a value that is undefined (NaN)
or unbounded (a relative error against a zero reference, an element's value that is Inf) is null; the
counts under "nan" and "inf" say how many elements are non-finite. An error in units is unbounded where a
correct kernel's error scale is 0 (gamma = 0): then "units_unbounded" is true. min_atol, min_rtol and
min_units are null when no tolerance would pass or that rule was not used.

Version 4 carries, added since (no key removed or changed): per output "nonfinite" (the NaN/Inf that fail: their
count, first positions, the channels entirely NaN and where they sit), "where" (where a failing output's finite
failures sit: judge/where.py), "heat_map" (the failing share over channels x positions), and a "nonfinite"
criterion (first, when NaN/Inf fail).
check's version 4 (from 3): per output "status" and "problem" as in the comparison report's version 4; "bnbwd_version", "counts" (cases and each verdict), "shard" ({index, count} or null),
per case "line" (check's line), "brief" (a failure's brief report, an error's message), "problem" ({shape, dtype,
layout, epsilon, M, is_training} or null) and "seconds"; the summary names at most 3 cases of a kind.
Version 4 (from 3): an output's "status" is the verdict's word, as the document's ("pass", "mismatch",
"structural"; no "fail" beside "mismatch"), and "problem" the kind of what kept it from being compared
("missing", "extra", "shape", "dtype"; null when compared). A kernel's missing output is "missing" in every
face (run --reference, verify --inputs, check, the API).
Version 3 (from 2; check's from 1): "tool" names the command that ran; per output "criteria" (each statistic
against its threshold, decided in judge/criteria.py) and "hints" as {cause, evidence,
channels}; "units_unbounded"; "default_max_units" per output; no "inf" strings; check's document compact.
Version 2 (from 1): the scaled rule (rule, scaled, max_units, min_units), bias, hints, passed;
tolerance is null under the scaled rule; max_mismatch and equal_nan moved out of tolerance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bnbwd_cli.dtypes import dtype_label
from bnbwd_cli.judge.tolerance import DEFAULT_TOLERANCES, default_max_units
from bnbwd_cli.layout import coordinates
from bnbwd_cli.spec import OUTPUT_NAMES

if TYPE_CHECKING:  # annotations only: `run --json` writes its document without loading the comparison
    from bnbwd_cli.judge import SetComparison
    from bnbwd_cli.judge.comparison import Bias, Comparison, Located
    from bnbwd_cli.judge.heat_map import HeatMap
    from bnbwd_cli.judge.where import Where
    from bnbwd_cli.render.run import RunFacts

SCHEMA_VERSION = 4  # the comparison report (verify, run --reference, the API) and check's document
RUN_SCHEMA_VERSION = 1  # run --json
CHECK_SCHEMA_VERSION = 4  # check --json and bnbwd report's merge: its outputs are the comparison report's


@dataclass(frozen=True)
class Source:
    """Who made a comparison document: the command (or API function) that ran, and its two sides' names."""

    tool: str
    actual: str
    reference: str


def finite(value: float | None) -> float | None:
    """A finite number, else null (undefined or unbounded)."""
    return float(value) if value is not None and math.isfinite(value) else None




def _located(located: Located | None, axis_names) -> dict[str, Any] | None:
    if located is None:
        return None
    index = located.index
    return {"value": finite(located.value), "index": list(index) if index is not None else None,
            "where": coordinates(index, axis_names) if index is not None else None}


def _bias(bias: Bias | None, failed: bool) -> dict[str, Any] | None:
    if bias is None:
        return None
    return {"scale": finite(bias.scale), "stderr": finite(bias.stderr), "z": finite(bias.z),
            "threshold": finite(bias.threshold),
            "significant": bias.significant, "failed": failed,
            "channels": [{"channel": c, "scale": finite(s), "stderr": finite(e)} for c, s, e in bias.channels]}


def criteria_json(c: Comparison) -> list[dict[str, Any]]:
    """Each test the output was held to: its statistic, value (null: unbounded), threshold and verdict."""
    return [{"statistic": t.statistic, "value": finite(t.value), "threshold": finite(t.threshold),
             "passed": t.passed, "channel": t.channel, "checked": t.checked} for t in c.criteria]


def hints_json(c: Comparison) -> list[dict[str, Any]]:
    """The output's hints: a cause id, its evidence (one line, with its number) and the channels it names."""
    return [{"cause": h.cause, "evidence": h.text, "channels": list(h.channels)} for h in c.diagnosis]


def units_unbounded(c: Comparison) -> bool:
    """An element's error is infinitely many units: a correct kernel's error scale there is 0 (gamma = 0)."""
    return c.max_units is not None and c.max_units.value is not None and math.isinf(c.max_units.value)


def where_json(where: Where | None) -> dict[str, Any] | None:
    """A localization (judge/where.py): its kind and words, how many failing elements it covers of how many, how
    many elements it names, and its parts (axes' inclusive ranges; a flat or reduction-order range [start, stop);
    a period and its lanes' inclusive ranges), and of the failing elements how many lie above and below the
    reference and how many are larger and smaller in magnitude (None for the non-finite ones)."""
    if where is None:
        return None
    return {"kind": where.kind, "text": where.text, "failing": where.failing, "covered": where.covered,
            "region": where.region, "axes": {name: [list(r) for r in ranges] for name, ranges in where.axes},
            "start": where.start, "stop": where.stop, "period": where.period, "lanes": [list(r) for r in where.lanes],
            "above": where.above, "below": None if where.above is None else where.failing - where.above,
            "larger": where.larger, "smaller": None if where.larger is None else where.failing - where.larger}


def heat_map_json(picture: HeatMap | None) -> dict[str, Any] | None:
    """The picture's data: per row its channels, per column its positions (inclusive ranges of each channel's other
    axes flattened in storage order), and per cell the failing and all elements."""
    if picture is None:
        return None
    return {"channels": [list(r) for r in picture.channels], "positions": [list(r) for r in picture.positions],
            "failing": [list(row) for row in picture.failing], "elements": [list(row) for row in picture.elements]}


def nonfinite_json(c: Comparison) -> dict[str, Any]:
    """The NaN/Inf that fail: how many, the first positions, the channels entirely NaN, where they sit."""
    n = c.nonfinite
    return {"mismatches": n.mismatches,
            "first": [{"index": list(i), "where": coordinates(i, c.axis_names)} for i in n.first],
            "nan_channels": list(n.nan_channels),
            "where": where_json(c.details.nonfinite_where) if n.mismatches else None}


def comparison_json(c: Comparison) -> dict[str, Any]:
    n = c.nonfinite
    tol = c.tolerance
    details = c.details
    return {
        "shape": list(c.shape),
        "dtype": c.dtype,
        "actual_dtype": c.actual_dtype,
        "reference_dtype": c.reference_dtype,
        "rule": "scaled" if c.scaled is not None else "fixed",
        "passed": c.passed,
        "tolerance": None if tol is None else _tolerance(tol),
        "scaled": None if c.scaled is None else {"max_units": finite(c.scaled.max_units), "unit": c.scaled.unit,
                                                   "bias_check": c.scaled.bias_check},
        "max_mismatch": str(c.max_mismatch),
        "equal_nan": c.equal_nan,
        "elements": c.elements,
        "mismatches": c.mismatches,
        "mismatch_fraction": finite(c.mismatch_fraction),
        "allowed_mismatches": c.allowed_mismatches,
        "flushed_to_zero": c.flushed,  # subnormal results written as 0 that passed (--no-ftz fails them)
        "read_as_zero": c.read_as_zero,  # elements that pass only with the subnormal inputs read as 0 (DAZ)
        "max_abs": _located(c.max_abs, c.axis_names),
        "max_rel": _located(c.max_rel, c.axis_names),
        "max_ulp": _located(c.max_ulp, c.axis_names),
        "max_units": _located(c.max_units, c.axis_names),
        "units_unbounded": units_unbounded(c),
        "criteria": criteria_json(c),
        "rel_l2": finite(c.rel_l2),
        "rel_l2_passed": c.rel_l2_passed,
        "min_atol": finite(c.min_atol),
        "min_rtol": finite(c.min_rtol),
        "min_units": finite(c.min_units),
        "bias": _bias(c.bias, c.bias_failed),
        "hints": hints_json(c),
        "nan": {"actual": n.nan_actual, "reference": n.nan_reference, "mismatches": n.nan_mismatches},
        "inf": {"actual": n.inf_actual, "reference": n.inf_reference, "mismatches": n.inf_mismatches},
        "nonfinite": nonfinite_json(c),
        "where": where_json(details.where) if not c.passed and c.finite_mismatches else None,
        "heat_map": heat_map_json(details.picture) if not c.passed else None,
        "axis_names": list(c.axis_names) if c.axis_names is not None else None,
        "channel_axis": c.channel_axis,
        "worst": [
            {"index": list(e.index), "where": coordinates(e.index, c.axis_names), "actual": finite(e.actual),
             "expected": finite(e.expected), "abs_err": finite(e.abs_err), "rel_err": finite(e.rel_err),
             "ulp_err": finite(e.ulp_err), "units": finite(e.units), "ratio": finite(e.ratio), "passed": e.passed}
            for e in c.worst
        ],
        "channels": None if c.channels is None else [
            {"channel": ch.channel, "elements": ch.elements, "mismatches": ch.mismatches, "max_abs": finite(ch.max_abs),
             "max_ratio": finite(ch.max_ratio)}
            for ch in c.channels
        ],
        "histogram": [{"low": finite(b.low), "high": finite(b.high), "count": b.count} for b in c.histogram],
        "zero_fraction_actual": finite(c.zero_fraction_actual),
        "zero_fraction_reference": finite(c.zero_fraction_reference),
        "mostly_zeros": c.mostly_zeros,
    }


def _tolerance(tol) -> dict[str, Any]:  # a judge.tolerance.Tolerance
    return {"atol": finite(tol.atol), "rtol": finite(tol.rtol), "ulp": finite(tol.ulp), "rel_l2": finite(tol.rel_l2)}


def defaults() -> dict[str, Any]:
    """The defaults a document's rules fall back to: fixed tolerances per dtype, K per output."""
    return {"default_tolerances": {name: _tolerance(t) for name, t in DEFAULT_TOLERANCES.items()},
            "default_max_units": {name: default_max_units(name) for name in OUTPUT_NAMES}}


def report_document(result: SetComparison, source: Source) -> dict[str, Any]:
    """The JSON document: the same facts as the rich report."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": source.tool,
        "actual": source.actual,
        "reference": source.reference,
        "status": result.status,
        "exit_code": int(result.exit_code),
        "inputs_known": result.inputs_known,
        **defaults(),
        "notes": list(result.notes),
        "problems": [{"kind": p.kind, "name": p.name, "message": p.message} for p in result.all_problems],
        "outputs": [
            {"name": o.name, "actual_key": o.actual_key, "reference_key": o.reference_key, "status": o.status,
             "problem": o.problem.kind if o.problem is not None else None,
             "comparison": comparison_json(o.comparison) if o.comparison is not None else None}
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
        "epsilon": finite(facts.epsilon),
        "training": facts.training,
        "elapsed_s": finite(facts.elapsed_s),
        "core": facts.core,
        "stream": facts.stream,
        "inputs": {name: _describe(array) for name, array in facts.inputs.items()},
        "outputs": {
            name: {**_describe(array), "min": finite(facts.stats[name].minimum),
                   "max": finite(facts.stats[name].maximum), "nonfinite": facts.stats[name].nonfinite}
            for name, array in facts.outputs.items()
        },
        "written": facts.written,
    }


def _describe(array: np.ndarray) -> dict:
    return {"shape": list(array.shape), "dtype": dtype_label(array.dtype)}


def document_text(document: dict[str, Any]) -> str:
    """The document as JSON text (files.write writes it: one writer for every output)."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"
