"""The few lines a failure is told in: the verdict first, then per output each criterion it was held to (the
statistic against its threshold), its hints and its worst element. `--brief`, `check`'s line per case and the
Python API's AssertionError; the full report is render/text.py's (what both share: render/common.py). Advice is phrased for the face the reader
uses (phrase).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from bnbwd_cli.literal import literal, literal_line
from bnbwd_cli.judge.index_words import indices_text
from bnbwd_cli.layout import coordinates
from bnbwd_cli.render.common import Labels, ReportStyle, fmt, fmt_ulp, fmt_value, render_verdict, status_word

if TYPE_CHECKING:
    from bnbwd_cli.judge.comparison import Comparison
    from bnbwd_cli.judge.criteria import Criterion
    from bnbwd_cli.judge.sets import OutputResult, SetComparison

# The CLI's advice as the Python API says it: longest phrases first (a phrase, then its flag alone).
API_ADVICE = (
    (" (or its int16 bits, read with --bf16 KEY)", ""),
    ("pass --variance-is-invstd", "pass variance_is_invstd=True"),
    ("--variance-is-invstd", "variance_is_invstd=True"),
    ("check --format", "check data_format"),
    ("--format", "data_format"),
    ("--max-units ", "max_units="),
    ("--epsilon", "epsilon"),
    ("--only ", "only="),
    ("--inference", "training=False"),
    ("--no-ftz", "ftz=False"),
)


def op_text(test: Criterion) -> str:
    """How a statistic stands against its threshold, as judge/ decided it: beyond it (">") or within ("<=")."""
    return ">" if test.beyond else "<="


FIRST_SHOWN = 3  # NaN/Inf positions a line names (the JSON document has judge's five)


def nonfinite_text(c: Comparison) -> str | None:
    """The NaN/Inf that fail, said before any units: how many, the first positions, the channels that are all NaN
    and where they sit (judge/where.py); None when none fails."""
    n = c.nonfinite
    if not n.mismatches:
        return None
    kinds = " and ".join(f"{count} {kind}" for count, kind in ((n.nan_mismatches, "NaN"), (n.inf_mismatches, "Inf"))
                         if count)
    side = "where the reference is finite" if not (n.nan_reference or n.inf_reference) else "where the sides differ"
    text = f"{kinds} {side}"
    if n.first:
        shown = n.first[:FIRST_SHOWN]
        more = "; ..." if n.mismatches != len(shown) else ""  # (shown are the first of them)
        text += f" (first at {'; '.join(coordinates(i, c.axis_names) for i in shown)}{more})"
    if n.nan_channels:
        text += f"; c={indices_text(n.nan_channels)} all NaN"
    where = c.details.nonfinite_where
    if where is not None and where.kind not in ("elements", "all"):
        text += f"; where: {where.text}"
    return text


def hints_once(output: OutputResult, said: dict[str, str]) -> list[str]:
    """The output's hints, each said once per report: one an earlier output carries (a cause found for the whole
    run names every output it explains) is "as for NAME". ``said``: hint text -> the first output with it, kept
    across the report's outputs."""
    texts = []
    for hint in output.comparison.hints:
        if hint in said:
            texts.append(f"as for {said[hint]}")
        else:
            said[hint] = output.name
            texts.append(hint)
    return texts


def units_advice(c: Comparison, face: str) -> str:
    """What K would pass the output, when one would: none passes a NaN/Inf, nor an error where a correct kernel's
    error scale is 0 (--max-units takes finite numbers only)."""
    if c.nonfinite.mismatches:
        return "; no K passes the NaN/Inf"
    if math.isinf(c.min_units):
        return "; no K passes it: a correct kernel's error scale is 0 where it fails"
    return "; " + phrase(f"would pass with --max-units {fmt_ulp(c.min_units)}", face)


def where_text(c: Comparison) -> str | None:
    """Where a failing output's finite failures sit (judge/where.py), one line; None for an output that passes."""
    if c.passed or not c.finite_mismatches:
        return None
    where = c.details.where
    return None if where is None else where.text


def criterion_text(test: Criterion, c: Comparison) -> str:
    """One criterion as its statistic against its threshold, e.g. "max 3.2 units <= K 16" or
    "systematic scale +2.1e-03 in c=5 > threshold 9.5e-07"; NaN/Inf that fail come first, and then the units are
    the finite elements'."""
    if test.statistic == "nonfinite":
        return nonfinite_text(c)
    if test.statistic == "max_units":
        text = f"max {fmt_ulp(test.value)} units {op_text(test)} K {test.threshold:g}"
        if c.nonfinite.mismatches:  # (said first by the nonfinite criterion)
            failing = f" ({c.finite_mismatches} fail)" if c.finite_mismatches else ""
            return f"on the finite elements: {text}{failing}"
        return text + (f" ({c.mismatches} of {c.elements} elements fail)" if c.mismatches else "")
    if test.statistic == "mismatches":
        text = f"{int(test.value)}/{c.elements} mismatched {op_text(test)} allowed {c.allowed_mismatches}"
        return text if not c.nonfinite.mismatches else f"on the finite elements: {text}"
    if test.statistic == "rel_l2":
        return f"rel L2 {fmt(test.value)} {op_text(test)} {test.threshold:.2g}"
    where = f" in c={test.channel}" if test.channel is not None else ""
    unchecked = "" if test.checked else " (not checked)"
    return f"systematic scale {test.value:+.1e}{where} {op_text(test)} threshold {test.threshold:.1e}{unchecked}"


def brief_line(output: OutputResult) -> str:
    """One line: name, status and each criterion it was held to, the statistic against its threshold."""
    c = output.comparison
    if c is None:
        # The problem's message starts with the output's name, which the line already gives.
        return f"{output.name}: {status_word(output)} ({output.problem.message.removeprefix(output.name + ': ')})"
    texts = [criterion_text(t, c) + (f", max abs {fmt(c.max_abs.value)}" if t.statistic == "mismatches"
                                     and c.tolerance is not None else "") for t in c.criteria]
    return f"{output.name}: {status_word(output)} " + "; ".join(texts)


def flush_note(output: OutputResult) -> str | None:
    """The note on subnormal results flushed to zero that passed (judge/rules.pass_flushed) and on results of
    subnormal inputs read as zero (judge/daz.py), or None."""
    c = output.comparison
    flushed, read = (0, 0) if c is None else (c.flushed, c.read_as_zero)
    said = []
    if flushed:
        said.append(f"{flushed} subnormal result{'s' if flushed != 1 else ''} flushed to zero")
    if read:
        said.append(f"{read} result{'s' if read != 1 else ''} of subnormal inputs read as zero (DAZ; judged against "
                    "the inputs so flushed)")
    if not said:
        return None
    return " and ".join(said) + ": allowed; --no-ftz to fail them"


def phrase(text: str, face: str) -> str:
    """Advice as the face the reader uses says it: the CLI's flags, or the Python API's arguments."""
    if face != "api":
        return text
    for flag, argument in API_ADVICE:
        text = text.replace(flag, argument)
    return text


def render_brief(console: Console, result: SetComparison, labels: Labels, style: ReportStyle = ReportStyle()) -> None:
    """The verdict first, then per output its criteria and, under it, its hints and worst element: a few lines per
    output (the pytest failure message, --brief)."""
    render_verdict(console, result, where="below" if style.problems_inline else "each named on stderr", face=style.face)
    console.print(Text(f"actual {literal(labels.actual)} vs reference {literal(labels.reference)}"), soft_wrap=True)
    said: dict[str, str] = {}
    for output in result.outputs:
        console.print(Text(literal_line(brief_line(output))), soft_wrap=True)
        c = output.comparison
        if c is None:
            continue
        note = flush_note(output)
        if note is not None:
            console.print(Text(f"  note: {phrase(note, style.face)}"), soft_wrap=True)
        for hint in hints_once(output, said):
            console.print(Text(f"  hint: {literal_line(phrase(hint, style.face))}"), soft_wrap=True)
        where = where_text(c)
        if where is not None:
            console.print(Text(f"  where: {where}"), soft_wrap=True)
        if not c.passed and c.finite_mismatches and c.worst:
            e = c.worst[0]
            units = f" ({fmt_ulp(e.units)} units)" if c.scaled is not None else ""
            finite = " (of the finite elements)" if c.nonfinite.mismatches else ""
            console.print(Text(f"  worst{finite}: {coordinates(e.index, c.axis_names)} actual {fmt_value(e.actual)}, "
                               f"expected {fmt_value(e.expected)}{units}"), soft_wrap=True)
    for note in result.notes:  # keys not compared: a misnamed output shows here first
        console.print(Text(f"note: {literal_line(note)}"), soft_wrap=True)
    if style.problems_inline:
        for problem in result.all_problems:
            console.print(Text(f"error: {literal_line(phrase(problem.message, style.face))}"), soft_wrap=True)
