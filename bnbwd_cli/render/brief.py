"""The few lines a failure is told in: the verdict first, then per output each criterion it was held to (the
statistic against its threshold), its hints and its worst element. `--brief`, `check`'s line per case and the
Python API's AssertionError; the full report is render/text.py's (what both share: render/common.py). Advice is phrased for the face the reader
uses (phrase).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from bnbwd_cli.literal import literal, literal_line
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
)


def op_text(test: Criterion) -> str:
    """How a statistic stands against its threshold, as judge/ decided it: beyond it (">") or within ("<=")."""
    return ">" if test.beyond else "<="


def criterion_text(test: Criterion, c: Comparison) -> str:
    """One criterion as its statistic against its threshold, e.g. "max 3.2 units <= K 16" or
    "systematic scale +2.1e-03 in c=5 > threshold 9.5e-07"."""
    if test.statistic == "max_units":
        text = f"max {fmt_ulp(test.value)} units {op_text(test)} K {test.threshold:g}"
        return text + (f" ({c.mismatches} of {c.elements} elements fail)" if c.mismatches else "")
    if test.statistic == "mismatches":
        return f"{c.mismatches}/{c.elements} mismatched {op_text(test)} allowed {c.allowed_mismatches}"
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
    texts = [criterion_text(t, c) for t in c.criteria]
    if c.tolerance is not None:
        texts[0] += f", max abs {fmt(c.max_abs.value)}"
    return f"{output.name}: {status_word(output)} " + "; ".join(texts)


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
    for output in result.outputs:
        console.print(Text(literal_line(brief_line(output))), soft_wrap=True)
        c = output.comparison
        if c is None:
            continue
        for hint in c.hints:
            console.print(Text(f"  hint: {literal_line(phrase(hint, style.face))}"), soft_wrap=True)
        if not c.passed and c.mismatches and c.worst:
            e = c.worst[0]
            units = f" ({fmt_ulp(e.units)} units)" if c.scaled is not None else ""
            console.print(Text(f"  worst: {coordinates(e.index, c.axis_names)} actual {fmt_value(e.actual)}, expected "
                               f"{fmt_value(e.expected)}{units}"), soft_wrap=True)
    for note in result.notes:  # keys not compared: a misnamed output shows here first
        console.print(Text(f"note: {literal_line(note)}"), soft_wrap=True)
    if style.problems_inline:
        for problem in result.all_problems:
            console.print(Text(f"error: {literal_line(phrase(problem.message, style.face))}"), soft_wrap=True)
