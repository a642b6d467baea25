"""Render comparisons as text: the rich report (--brief: render/brief.py), error lines.

The console is built once at the edge (the click layer) and passed in, so tests render into a
``Console(file=StringIO(), width=100, color_system=None)``. Tables are printed at the width they
need (never cropped or folded), so numbers stay whole on an 80-column terminal.

Passing outputs get one row of the summary table; failing ones (all of them with --verbose) get
their details: worst elements with coordinates, the systematic scale that decided against its
threshold (judge/criteria.py decides; nothing here does), the channel table and the diagnosis' hints (judge/diagnosis/: a
hint comes only from there, never from a guess here).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from bnbwd_cli.layout import coordinates
from bnbwd_cli.render.common import Labels, ReportStyle, fmt, fmt_ulp, fmt_value, render_verdict, status_word
from bnbwd_cli.judge.keys import OUTPUT_ALIASES
from bnbwd_cli.judge.tolerance import BIAS_Z, DEFAULT_TOLERANCES, default_max_units, tolerance_text
from bnbwd_cli.literal import literal, literal_line
from bnbwd_cli.status import Status

if TYPE_CHECKING:  # annotations only: rendering a run's summary must not load the comparison modules
    from bnbwd_cli.judge.sets import OutputResult, SetComparison
    from bnbwd_cli.judge.comparison import ChannelStat, Comparison, HistogramBin

_STATUS_STYLE = {Status.PASS: "bold green", Status.MISMATCH: "bold red"}
_BAR_WIDTH = 30
_SUMS = ("diff_gamma", "diff_beta")


# --------------------------------------------------------------------------- formatting


def _status_text(output: OutputResult) -> Text:
    return Text(status_word(output), style=_STATUS_STYLE.get(output.status, "bold yellow"))


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _table(title: str | None = None) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                 collapse_padding=True, show_edge=False)


def _print_table(console: Console, table: Table) -> None:
    """At the width the table needs: a narrow terminal wraps the line, no number is cut."""
    needed = Measurement.get(console, console.options.update(width=10_000), table).maximum
    width = console.width
    console.width = max(width, needed)  # rich clamps print(width=...) to the console's width: widen it for this table
    try:
        console.print(table, crop=False)
    finally:
        console.width = width


# --------------------------------------------------------------------------- the report


def render_report(console: Console, result: SetComparison, labels: Labels, style: ReportStyle = ReportStyle()) -> None:
    """The whole report: what was compared and how, one row per output, details of failures, the verdict.
    With style.brief: render_brief."""
    if style.brief:
        from bnbwd_cli.render.brief import render_brief

        render_brief(console, result, labels, style)
        return
    console.print(Text(f"Comparison: actual {literal(labels.actual)} vs reference {literal(labels.reference)}", style="bold"),
                  soft_wrap=True)
    _render_rules(console, result)
    _render_summary(console, result)
    from bnbwd_cli.render.brief import flush_note, phrase

    for output in result.outputs:  # a passing output shows no details: its flushed subnormals are said here
        note = flush_note(output)
        if note is not None:
            console.print(Text(f"note: {literal(output.name)}: {phrase(note, style.face)}"), soft_wrap=True)
    # The CLI prints structural problems once, as `error:` lines on stderr (cli/show.py), not here.
    said: dict[str, str] = {}  # each hint once: hint -> the output that showed it
    for output in result.outputs:
        if output.comparison is not None and (style.verbose or not output.comparison.passed):
            _render_details(console, output, style, said)
    if style.problems_inline:
        from bnbwd_cli.render.brief import phrase

        for problem in result.all_problems:
            console.print(Text(f"error: {literal_line(phrase(problem.message, style.face))}"), soft_wrap=True)
    render_verdict(console, result, where="listed above" if style.problems_inline else "each named on stderr",
                   face=style.face)


def _units_text(units: list[tuple[str, float]]) -> str:
    """K per output, said once per value: "16 units" or "16 units for diff_src, 5 for diff_gamma and diff_beta"."""
    values = sorted({k for _, k in units}, reverse=True)
    if len(values) == 1:
        return f"{values[0]:g} units"
    parts = [f"{k:g} for {' and '.join(name for name, v in units if v == k)}" for k in values]
    return parts[0].replace(" for ", " units for ", 1) + ", " + ", ".join(parts[1:])


def _render_rules(console: Console, result: SetComparison) -> None:
    """How elements and outputs were judged, said once."""
    comparisons = [o.comparison for o in result.outputs if o.comparison is not None]
    scaled = [(o.name, o.comparison.scaled.max_units) for o in result.outputs
              if o.comparison is not None and o.comparison.scaled is not None]
    if scaled:
        k = _units_text(scaled)
        defaults = [(name, default_max_units(OUTPUT_ALIASES.get(name))) for name, _ in scaled]
        default = "" if scaled == defaults else f" (default {_units_text(defaults)})"
        checked = any(c.scaled.bias_check for c in comparisons if c.scaled is not None)
        bias = (f"A systematic scale of actual vs reference, overall or in one channel, fails beyond its threshold: "
                f"{BIAS_Z:g} standard errors of its estimate, and never less than a correct kernel's roundings shift it."
                if checked else "Systematic scales are reported, not checked (--no-bias-check).")
        console.print(f"scaled by the problem: element passes if |a-r| <= K*s + 1 ulp, s = the error a correct kernel "
                      f"may make there (docs/tolerances.md); K = {k}{default}. {bias}", highlight=False, soft_wrap=True)
    fixed = {(c.dtype, c.tolerance) for c in comparisons if c.tolerance is not None}
    if fixed:
        console.print("fixed tolerances: element passes if |a-r| <= atol + rtol*|r| or ULP <= ulp; "
                      "output passes if ||a-r||2/||r||2 <= rel_l2", highlight=False, soft_wrap=True)
        for dtype, tol in sorted(fixed, key=lambda item: (item[0], tolerance_text(item[1]))):
            note = "" if tol == DEFAULT_TOLERANCES[dtype] else " (overridden)"
            console.print(f"  {dtype:>4}  {tolerance_text(tol)}{note}", highlight=False)
    unjudged = [o.name for o in result.outputs if o.comparison is not None and o.comparison.tolerance is not None
                and o.name in _SUMS]
    if unjudged and not result.inputs_known:
        verb = "is a sum" if len(unjudged) == 1 else "are sums"
        console.print(f"note: {', '.join(unjudged)} {verb} over M elements; their correct error grows with the "
                      "size of the terms, not of the result. Give --inputs (or use run --reference) for a fair judgement.",
                      highlight=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {literal_line(note)}", highlight=False, soft_wrap=True)
    console.print()


def decisive_number(c: Comparison) -> str:
    """The number that decided an output's elements: its largest error in units (scaled rule), or its mismatch count."""
    return f"{fmt_ulp(c.max_units.value)} units" if c.scaled is not None else f"{c.mismatches}/{c.elements} mismatched"


def _render_summary(console: Console, result: SetComparison) -> None:
    table = _table()
    scaled = any(o.comparison is not None and o.comparison.scaled is not None for o in result.outputs)
    fixed = any(o.comparison is not None and o.comparison.tolerance is not None for o in result.outputs)
    headers = ["output", "shape", "dtype", "status", "mismatched", "max abs", "max ULP"]
    headers += ["max units", "systematic scale"] if scaled else []
    headers += ["rel L2", "min atol"] if fixed else []
    for header in headers:
        table.add_column(header, justify="left" if header in ("output", "shape", "dtype", "status") else "right", no_wrap=True)
    for output in result.outputs:
        c = output.comparison
        if c is None:
            table.add_row(literal(output.name), "-", "-", _status_text(output), *["-"] * (len(headers) - 4))
            continue
        dtype = c.dtype if c.actual_dtype == c.reference_dtype else f"{c.actual_dtype}/{c.reference_dtype}"
        cells = [literal(output.name), _shape_text(c.shape), dtype, _status_text(output), f"{c.mismatches} ({100 * c.mismatch_fraction:.3g}%)",
                 fmt(c.max_abs.value), fmt_ulp(c.max_ulp.value)]
        if scaled:
            cells += [fmt_ulp(c.max_units.value) if c.max_units else "-", _bias_cell(c)]
        if fixed:
            cells += ["-", "-"] if c.tolerance is None else [fmt(c.rel_l2), fmt(c.min_atol)]
        table.add_row(*cells)
    _print_table(console, table)
    console.print()


def _bias_cell(c: Comparison) -> str:
    """The deciding systematic scale against its threshold, e.g. "+2.1e-03 > 9.5e-07 c=5"."""
    from bnbwd_cli.render.brief import op_text
    test = next((t for t in c.criteria if t.statistic == "systematic_scale"), None)
    if test is None:
        return "-"
    where = f" c={test.channel}" if test.channel is not None else ""
    return f"{test.value:+.1e} {op_text(test)} {test.threshold:.1e}{where}"


def _render_details(console: Console, output: OutputResult, style: ReportStyle, said: dict[str, str]) -> None:
    from bnbwd_cli.render.brief import hints_once, nonfinite_text, phrase, units_advice, where_text
    from bnbwd_cli.render.picture import render_output_picture

    c = output.comparison
    verbose = style.verbose
    console.rule(Text(f"{literal(output.name)}: {status_word(output)}", style=_STATUS_STYLE[output.status]), align="left")
    nonfinite = nonfinite_text(c)
    if nonfinite is not None:  # before any units: no K or tolerance passes a NaN
        console.print(Text(f"NaN/Inf: {nonfinite}", style="bold red"), soft_wrap=True)
    console.print(f"Mismatched elements: {c.mismatches} / {c.elements} ({100 * c.mismatch_fraction:.3g}%), "
                  f"allowed {c.allowed_mismatches}", highlight=False)
    where = c.axis_names
    finite = "on the finite elements: " if nonfinite is not None else ""
    if c.scaled is not None:
        console.print(f"{finite}max {fmt_ulp(c.max_units.value)} units at {coordinates(c.max_units.index, where)} "
                      f"(K {c.scaled.max_units:g}){units_advice(c, style.face)}", highlight=False, soft_wrap=True)
    console.print(f"{finite}max abs {fmt(c.max_abs.value)} at {coordinates(c.max_abs.index, where)}; "
                  f"max ULP {fmt_ulp(c.max_ulp.value)} at {coordinates(c.max_ulp.index, where)}", highlight=False,
                  soft_wrap=True)
    if c.tolerance is not None:
        _render_fixed_details(console, c)
    if c.bias is not None:
        _render_bias(console, c)
    _render_nonfinite(console, c)
    if c.worst:
        _render_worst(console, c)
    if c.channels is not None and (verbose or c.mismatches):
        _render_channels(console, c, len(c.worst) or 10)
    for hint in hints_once(output, said):
        console.print(Text(f"hint: {literal_line(phrase(hint, style.face))}", style="yellow"), soft_wrap=True)
    located = where_text(c)
    if located is not None:
        console.print(Text(f"where: {located}", style="yellow"), soft_wrap=True)
    if not c.passed and c.details.picture is not None:
        render_output_picture(console, c)
    if verbose and c.elements:
        _render_histogram(console, c.histogram)
    console.print()


def _render_fixed_details(console: Console, c: Comparison) -> None:
    gate = "ok" if c.rel_l2_passed else "FAIL"
    console.print(f"rel L2 {fmt(c.rel_l2)} (bound {c.tolerance.rel_l2:.2g}): {gate}", highlight=False)
    if math.isinf(c.min_atol) and math.isinf(c.min_rtol) and c.nonfinite.nan_mismatches + c.nonfinite.inf_mismatches:
        console.print("no tolerance would pass: NaN/Inf positions differ", highlight=False)
    else:
        console.print(f"would pass (element-wise) with atol >= {fmt(c.min_atol)} (rtol as set) "
                      f"or rtol >= {fmt(c.min_rtol)} (atol as set)", highlight=False)


def _render_bias(console: Console, c: Comparison) -> None:
    from bnbwd_cli.render.brief import criterion_text

    b = c.bias
    test = next(t for t in c.criteria if t.statistic == "systematic_scale")
    verdict = "FAIL" if not test.passed else ("beyond it (not checked)" if test.beyond else "ok")
    console.print(f"{criterion_text(test, c)}: {verdict}", highlight=False, soft_wrap=True)
    if test.channel is not None:
        console.print(f"  overall: actual = (1 {b.scale:+.2e} ± {b.stderr:.1e}) x reference, threshold {b.threshold:.1e}",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"  actual = (1 {b.scale:+.2e} ± {b.stderr:.1e}) x reference", highlight=False, soft_wrap=True)
    if b.channels:
        shown = ", ".join(f"c={ch} {scale:+.1e}" for ch, scale, _ in b.channels[:8])
        more = f" (+{len(b.channels) - 8} more)" if len(b.channels) > 8 else ""
        console.print(f"  channels beyond their own threshold: {shown}{more}", highlight=False, soft_wrap=True)


def _render_nonfinite(console: Console, c: Comparison) -> None:
    n = c.nonfinite
    if n.nan_actual or n.nan_reference or n.inf_actual or n.inf_reference:
        console.print(f"NaN: actual {n.nan_actual}, reference {n.nan_reference}, mismatched {n.nan_mismatches}"
                      f"{' (equal_nan)' if c.equal_nan else ''}; "
                      f"Inf: actual {n.inf_actual}, reference {n.inf_reference}, mismatched {n.inf_mismatches}", highlight=False)
    if c.mostly_zeros:
        console.print(Text(f"warning: actual is {100 * c.zero_fraction_actual:.3g}% exact zeros, reference "
                           f"{100 * c.zero_fraction_reference:.3g}%: was the output written at all?", style="bold yellow"))


def _render_worst(console: Console, c: Comparison) -> None:
    count = len(c.worst)
    finite = " finite" if c.nonfinite.mismatches else ""
    table = _table(f"Worst {count}{finite} element{'s' if count != 1 else ''} by error / allowance")
    headers = ["where", "actual", "expected", "abs err", "ULP"] + (["units"] if c.scaled else ["rel err"]) + ["err/allowed", ""]
    for header in headers:
        table.add_column(header, justify="left" if header == "where" else "right", no_wrap=True)
    for e in c.worst:
        extra = fmt_ulp(e.units) if c.scaled else fmt(e.rel_err)
        table.add_row(coordinates(e.index, c.axis_names), fmt_value(e.actual), fmt_value(e.expected), fmt(e.abs_err),
                      fmt_ulp(e.ulp_err), extra, fmt(e.ratio) if math.isinf(e.ratio) else f"{e.ratio:.3g}",
                      "" if e.passed else Text("x", style="red"))
    _print_table(console, table)


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
    for header in ("c", "mismatched", "max abs", "max err/allowed"):
        table.add_column(header, justify="right", no_wrap=True)
    for ch in shown:
        table.add_row(str(ch.channel), _channel_mismatch(ch), fmt(ch.max_abs), fmt(ch.max_ratio) if math.isinf(ch.max_ratio) else f"{ch.max_ratio:.3g}")
    _print_table(console, table)


def _channel_mismatch(ch: ChannelStat) -> str:
    return f"{ch.mismatches} / {ch.elements}"


def _render_histogram(console: Console, bins: Sequence[HistogramBin]) -> None:
    table = _table("|a-r| histogram (finite elements)")
    table.add_column("|a-r|", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    peak = max(b.count for b in bins) or 1
    for b in bins:
        if b.low == b.high == 0:
            label = "0 (exact)"
        elif b.low == 0:
            label = f"< {b.high:.0e}"
        else:
            label = f"[{b.low:.0e}, {b.high:.0e})"
        table.add_row(label, str(b.count), "#" * math.ceil(_BAR_WIDTH * b.count / peak))
    _print_table(console, table)


def print_problems(result: SetComparison, file: TextIO | None = None) -> None:
    """One ``error: ...`` line per structural problem, for stderr (scripts grep it)."""
    for problem in result.all_problems:
        print(f"error: {literal_line(problem.message)}", file=file or sys.stderr)


MAX_WIDTH = 200  # columns: wider reports are padding, whatever COLUMNS or the terminal says


def make_console(file: TextIO | None = None, *, stderr: bool = False) -> Console:
    """A console at the edge: colour only on a terminal; 120 columns when piped (unless COLUMNS).

    A closed stdout (`bnbwd verify ... | head`) raises BrokenPipeError for the CLI to turn into
    exit 3: rich's own handling would exit 1, which means "mismatch".
    """
    # markup=False: names are the user's data, printed as they are ("[/]" in a name is no closing tag).
    console = Console(file=file, stderr=stderr, highlight=False, markup=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(file=file, stderr=stderr, highlight=False, markup=False, width=120)
    console.width = min(console.width, MAX_WIDTH)  # COLUMNS=1000000 padded every rule and panel to it (9 MB of -v)
    console.on_broken_pipe = _raise_broken_pipe
    return console


def _raise_broken_pipe() -> None:
    raise BrokenPipeError(32, "Broken pipe")
