"""Render comparisons: the rich report and the JSON document. The only module that prints.

The console is built once at the edge (verify_cli) and passed in, so tests render into a
``Console(file=StringIO(), width=100, color_system=None)``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bnbwd_cli.compare import (
    DEFAULT_TOLERANCES,
    ChannelStat,
    Comparison,
    HistogramBin,
    OutputResult,
    SetComparison,
    Tolerance,
)

SCHEMA_VERSION = 1
_STATUS_STYLE = {"pass": "bold green", "fail": "bold red"}
_BAR_WIDTH = 30


# --------------------------------------------------------------------------- formatting


def fmt(value: float) -> str:
    """A statistic in 3 significant digits; "-" when undefined (NaN)."""
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    return f"{value:.1e}"


def fmt_value(value: float) -> str:
    """A tensor element: enough digits to tell float32 neighbours apart."""
    return f"{value:.9g}"


def fmt_ulp(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.3g}" if value < 1e4 else f"{value:.0e}"


def coordinates(index: Sequence[int] | None, axis_names: Sequence[str] | None) -> str:
    """``n=3 c=17 h=5 w=9`` in the tensor's own layout, or ``(3, 17, 5, 9)`` without one."""
    if index is None:
        return "-"
    if axis_names is not None and len(axis_names) == len(index):
        return " ".join(f"{name}={i}" for name, i in zip(axis_names, index))
    return "(" + ", ".join(str(i) for i in index) + ")"


def tolerance_text(tol: Tolerance) -> str:
    return f"atol={tol.atol:g} rtol={tol.rtol:g} ulp={tol.ulp:g} rel_l2={tol.rel_l2:.2g}"


def defaults_text() -> str:
    """The per-dtype defaults, one line each (also used by --help)."""
    return "\n".join(f"{name:>4}: {tolerance_text(tol)}" for name, tol in DEFAULT_TOLERANCES.items())


def _status_text(status: str) -> Text:
    return Text(status.upper(), style=_STATUS_STYLE.get(status, "bold yellow"))


def _mismatch_text(c: Comparison) -> str:
    return f"{c.mismatches} ({100 * c.mismatch_fraction:.3g}%)"


def _table(title: str | None = None) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
        show_edge=False,
    )


# --------------------------------------------------------------------------- rich report


def render_report(
    console: Console,
    result: SetComparison,
    *,
    actual_label: str,
    reference_label: str,
    verbose: bool = False,
) -> None:
    """Print the whole report: header, tolerances, summary, details, verdict."""
    console.print(Text(f"Comparison: actual {actual_label} vs reference {reference_label}", style="bold"), soft_wrap=True)
    console.print("element passes: |a-r| <= atol + rtol*|r| or ULP <= ulp", highlight=False)
    console.print("output passes: mismatched <= max mismatch and ||a-r||2/||r||2 <= rel_l2", highlight=False)
    _render_tolerances(console, result)
    _render_summary(console, result)
    for problem in result.all_problems:
        console.print(Text(f"error: {problem.message}", style="bold red"), soft_wrap=True)
    for output in result.outputs:
        if output.comparison is not None and (verbose or not output.comparison.passed):
            _render_details(console, output)
    _render_verdict(console, result)


def _render_tolerances(console: Console, result: SetComparison) -> None:
    table = _table("Tolerances in force (* = overridden; defaults by dtype below)")
    for header in ("output", "dtype", "atol", "rtol", "ulp", "rel L2 bound", "max mismatch", "NaN == NaN"):
        table.add_column(header, justify="left" if header in ("output", "dtype") else "right")
    for output in result.outputs:
        c = output.comparison
        if c is None:
            continue
        default = DEFAULT_TOLERANCES[c.dtype]
        cells = [
            f"{getattr(c.tolerance, attr):{spec}}" + ("*" if getattr(c.tolerance, attr) != getattr(default, attr) else "")
            for attr, spec in (("atol", "g"), ("rtol", "g"), ("ulp", "g"), ("rel_l2", ".2g"))
        ]
        table.add_row(output.name, c.dtype, *cells, f"{c.allowed_mismatches} ({c.max_mismatch})", "yes" if c.equal_nan else "no")
    if table.row_count:
        console.print(table)
    console.print("defaults by dtype:", highlight=False)
    for name, tol in DEFAULT_TOLERANCES.items():
        console.print(f"  {name:>4}  {tolerance_text(tol)}", highlight=False)
    console.print()


def _render_summary(console: Console, result: SetComparison) -> None:
    table = _table("Summary")
    headers = ("output", "shape", "dtype", "status", "mismatched", "max abs", "max rel", "max ULP", "rel L2", "min atol")
    for header in headers:
        table.add_column(header, justify="left" if header in ("output", "shape", "dtype", "status") else "right")
    for output in result.outputs:
        c = output.comparison
        if c is None:
            table.add_row(output.name, "-", "-", _status_text(output.status), *["-"] * 6)
            continue
        dtype = c.dtype if c.actual_dtype == c.reference_dtype else f"{c.actual_dtype}/{c.reference_dtype}"
        table.add_row(
            output.name,
            "(" + ",".join(str(s) for s in c.shape) + ("," if len(c.shape) == 1 else "") + ")",
            dtype,
            _status_text(output.status),
            _mismatch_text(c),
            fmt(c.max_abs.value),
            fmt(c.max_rel.value),
            fmt_ulp(c.max_ulp.value),
            fmt(c.rel_l2),
            fmt(c.min_atol),
        )
    console.print(table)
    console.print()


def _render_details(console: Console, output: OutputResult) -> None:
    c = output.comparison
    console.rule(Text(f"{output.name}: {output.status.upper()}", style=_STATUS_STYLE[output.status]), align="left")
    console.print(
        f"Mismatched elements: {c.mismatches} / {c.elements} ({100 * c.mismatch_fraction:.3g}%), "
        f"allowed {c.allowed_mismatches}",
        highlight=False,
    )
    where = c.axis_names
    for label, located, text in (
        ("max abs", c.max_abs, fmt(c.max_abs.value)),
        ("max rel", c.max_rel, fmt(c.max_rel.value)),
        ("max ULP", c.max_ulp, fmt_ulp(c.max_ulp.value)),
    ):
        console.print(f"{label} {text} at {coordinates(located.index, where)}", highlight=False)
    gate = "ok" if c.rel_l2_passed else "FAIL"
    console.print(f"rel L2 {fmt(c.rel_l2)} (bound {c.tolerance.rel_l2:.2g}): {gate}", highlight=False)
    if math.isinf(c.min_atol) and math.isinf(c.min_rtol) and c.nonfinite.nan_mismatches + c.nonfinite.inf_mismatches:
        console.print("no tolerance would pass: NaN/Inf positions differ", highlight=False)
    else:
        console.print(
            f"would pass (element-wise) with atol >= {fmt(c.min_atol)} (rtol as set) "
            f"or rtol >= {fmt(c.min_rtol)} (atol as set)",
            highlight=False,
        )
    n = c.nonfinite
    if n.nan_actual or n.nan_reference or n.inf_actual or n.inf_reference:
        console.print(
            f"NaN: actual {n.nan_actual}, reference {n.nan_reference}, mismatched {n.nan_mismatches}"
            f"{' (equal_nan)' if c.equal_nan else ''}; "
            f"Inf: actual {n.inf_actual}, reference {n.inf_reference}, mismatched {n.inf_mismatches}",
            highlight=False,
        )
    if c.mostly_zeros:
        console.print(
            Text(
                f"warning: actual is {100 * c.zero_fraction_actual:.3g}% exact zeros, reference "
                f"{100 * c.zero_fraction_reference:.3g}%: was the output written at all?",
                style="bold yellow",
            )
        )
    if c.worst:
        _render_worst(console, c)
    if c.channels is not None:
        _render_channels(console, c, len(c.worst) or 10)
    if c.elements:
        _render_histogram(console, c.histogram)
    console.print()


def _render_worst(console: Console, c: Comparison) -> None:
    count = len(c.worst)
    table = _table(f"Worst {count} element{'s' if count != 1 else ''} by error / tolerance")
    for header in ("where", "actual", "expected", "abs err", "rel err", "ULP", "err/tol", ""):
        table.add_column(header, justify="left" if header == "where" else "right")
    for e in c.worst:
        table.add_row(
            coordinates(e.index, c.axis_names),
            fmt_value(e.actual),
            fmt_value(e.expected),
            fmt(e.abs_err),
            fmt(e.rel_err),
            fmt_ulp(e.ulp_err),
            fmt(e.ratio) if math.isinf(e.ratio) else f"{e.ratio:.3g}",
            "" if e.passed else Text("x", style="red"),
        )
    console.print(table)


def _render_channels(console: Console, c: Comparison, limit: int) -> None:
    bad = [ch for ch in c.channels if ch.mismatches]
    if bad:
        shown = sorted(bad, key=lambda ch: (-ch.mismatches, -ch.max_ratio, ch.channel))[:limit]
        title = f"Channels with mismatches: {len(bad)} of {len(c.channels)}"
    else:
        shown = sorted(c.channels, key=lambda ch: (-ch.max_ratio, ch.channel))[: min(limit, 3)]
        title = f"No channel has mismatches; closest of {len(c.channels)}"
    if len(shown) < len(bad):
        title += f" (worst {len(shown)} shown)"
    table = _table(title)
    for header in ("c", "mismatched", "max abs", "max err/tol"):
        table.add_column(header, justify="right")
    for ch in shown:
        table.add_row(str(ch.channel), _channel_mismatch(ch), fmt(ch.max_abs), fmt(ch.max_ratio) if math.isinf(ch.max_ratio) else f"{ch.max_ratio:.3g}")
    console.print(table)
    if len(bad) == 1 and len(c.channels) > 1:
        console.print(f"all mismatches are in channel c={bad[0].channel}: a bad per-channel reduction or parameter?", highlight=False)


def _channel_mismatch(ch: ChannelStat) -> str:
    return f"{ch.mismatches} / {ch.elements}"


def _render_histogram(console: Console, bins: Sequence[HistogramBin]) -> None:
    table = _table("|a-r| histogram (finite elements)")
    table.add_column("|a-r|")
    table.add_column("count", justify="right")
    table.add_column("", no_wrap=True)
    peak = max(b.count for b in bins) or 1
    for b in bins:
        if b.low == b.high == 0:
            label = "0 (exact)"
        elif b.low == 0:
            label = f"< {b.high:.0e}"
        else:
            label = f"[{b.low:.0e}, {b.high:.0e})"
        bar = "#" * math.ceil(_BAR_WIDTH * b.count / peak)
        table.add_row(label, str(b.count), bar)
    console.print(table)


def _render_verdict(console: Console, result: SetComparison) -> None:
    status = result.status
    if status == "pass":
        console.print(Text(f"PASS: {len(result.outputs)} output(s) within tolerance", style="bold green"))
    elif status == "mismatch":
        failed = ", ".join(o.name for o in result.outputs if o.status == "fail")
        console.print(Text(f"FAIL (exit 1): numerical mismatch in {failed}", style="bold red"))
    else:
        console.print(Text(f"FAIL (exit 3): {len(result.all_problems)} structural problem(s)", style="bold red"))


def print_problems(result: SetComparison, file: TextIO | None = None) -> None:
    """One ``error: ...`` line per structural problem, for stderr (scripts grep it)."""
    for problem in result.all_problems:
        print(f"error: {problem.message}", file=file or sys.stderr)


def make_console(file: TextIO | None = None, *, stderr: bool = False) -> Console:
    """A console at the edge: colour only on a terminal; 120 columns when piped (unless COLUMNS).

    A closed stdout (`bnbwd verify ... | head`) raises BrokenPipeError for the CLI to turn into
    exit 3: rich's own handling would exit 1, which means "mismatch".
    """
    console = Console(file=file, stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(file=file, stderr=stderr, highlight=False, width=120)
    console.on_broken_pipe = _raise_broken_pipe
    return console


def _raise_broken_pipe() -> None:
    raise BrokenPipeError(32, "Broken pipe")


# --------------------------------------------------------------------------- JSON


def _number(value: float) -> float | str | None:
    """JSON has no NaN/Inf: NaN (undefined) -> null, infinities -> "inf"/"-inf"."""
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _located(value: float, index, axis_names) -> dict[str, Any]:
    return {"value": _number(value), "index": list(index) if index is not None else None, "where": coordinates(index, axis_names) if index is not None else None}


def _comparison_json(c: Comparison) -> dict[str, Any]:
    n = c.nonfinite
    return {
        "shape": list(c.shape),
        "dtype": c.dtype,
        "actual_dtype": c.actual_dtype,
        "reference_dtype": c.reference_dtype,
        "tolerance": {
            "atol": c.tolerance.atol,
            "rtol": c.tolerance.rtol,
            "ulp": c.tolerance.ulp,
            "rel_l2": c.tolerance.rel_l2,
            "max_mismatch": str(c.max_mismatch),
            "equal_nan": c.equal_nan,
        },
        "elements": c.elements,
        "mismatches": c.mismatches,
        "mismatch_fraction": c.mismatch_fraction,
        "allowed_mismatches": c.allowed_mismatches,
        "max_abs": _located(c.max_abs.value, c.max_abs.index, c.axis_names),
        "max_rel": _located(c.max_rel.value, c.max_rel.index, c.axis_names),
        "max_ulp": _located(c.max_ulp.value, c.max_ulp.index, c.axis_names),
        "rel_l2": _number(c.rel_l2),
        "rel_l2_passed": c.rel_l2_passed,
        "min_atol": _number(c.min_atol),
        "min_rtol": _number(c.min_rtol),
        "nan": {"actual": n.nan_actual, "reference": n.nan_reference, "mismatches": n.nan_mismatches},
        "inf": {"actual": n.inf_actual, "reference": n.inf_reference, "mismatches": n.inf_mismatches},
        "axis_names": list(c.axis_names) if c.axis_names is not None else None,
        "channel_axis": c.channel_axis,
        "worst": [
            {
                "index": list(e.index),
                "where": coordinates(e.index, c.axis_names),
                "actual": _number(e.actual),
                "expected": _number(e.expected),
                "abs_err": _number(e.abs_err),
                "rel_err": _number(e.rel_err),
                "ulp_err": _number(e.ulp_err),
                "ratio": _number(e.ratio),
                "passed": e.passed,
            }
            for e in c.worst
        ],
        "channels": None
        if c.channels is None
        else [
            {"channel": ch.channel, "elements": ch.elements, "mismatches": ch.mismatches, "max_abs": _number(ch.max_abs), "max_ratio": _number(ch.max_ratio)}
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
        "default_tolerances": {
            name: {"atol": t.atol, "rtol": t.rtol, "ulp": t.ulp, "rel_l2": t.rel_l2} for name, t in DEFAULT_TOLERANCES.items()
        },
        "problems": [{"kind": p.kind, "name": p.name, "message": p.message} for p in result.all_problems],
        "outputs": [
            {
                "name": o.name,
                "actual_key": o.actual_key,
                "reference_key": o.reference_key,
                "status": o.status,
                "comparison": _comparison_json(o.comparison) if o.comparison is not None else None,
            }
            for o in result.outputs
        ],
    }


def write_json(document: dict[str, Any], target: str, stdout: TextIO | None = None) -> None:
    """Write the document to a path, or to stdout for "-"."""
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if target == "-":
        (stdout or sys.stdout).write(text)
        return
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text)
