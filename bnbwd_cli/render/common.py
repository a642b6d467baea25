"""What the full report (render/text.py) and its brief form (render/brief.py) share: how numbers are written,
what the two sides are called, how much the report says, and the verdict line both start or end with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from bnbwd_cli.literal import literal
from bnbwd_cli.status import Status

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import OutputResult, SetComparison


def fmt(value: float | None) -> str:
    """A statistic in 2 significant digits; "-" when undefined (None, NaN)."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    return f"{value:.1e}"


def fmt_value(value: float) -> str:
    """A tensor element: enough digits to tell float32 neighbours apart."""
    return f"{value:.9g}"


def fmt_ulp(value: float | None) -> str:
    """ULPs and units: plain below 1e4, scientific above."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" if value < 1e4 else f"{value:.0e}"


@dataclass(frozen=True)
class Labels:
    """What the report calls the two sides (file names, or the API's names)."""

    actual: str
    reference: str


@dataclass(frozen=True)
class ReportStyle:
    """How much the report says. verbose: every output's details; brief: one line per output;
    problems_inline: the structural problems are printed in the report (the Python API's text has no stderr);
    face: "cli" or "api", whose words advice uses (--variance-is-invstd or variance_is_invstd=True)."""

    verbose: bool = False
    brief: bool = False
    problems_inline: bool = False
    face: str = "cli"


def status_word(output: OutputResult) -> str:
    """How an output's verdict reads: PASS, FAIL, or what kept it from being compared (MISSING, EXTRA, SHAPE, DTYPE)."""
    if output.problem is not None:
        return output.problem.kind.upper()
    return "PASS" if output.status == Status.PASS else "FAIL"


def render_verdict(console: Console, result: SetComparison, where: str, face: str = "cli") -> None:
    """The verdict's line; the CLI's says its exit code ("FAIL (exit 1): ..."), the Python API's does not."""
    status = result.status
    code = f" (exit {int(result.exit_code)})" if face == "cli" else ""
    if status == Status.PASS:
        console.print(Text(f"PASS: {len(result.outputs)} output(s) within tolerance", style="bold green"))
    elif status == Status.MISMATCH:
        failed = ", ".join(literal(o.name) for o in result.outputs if o.status == Status.MISMATCH)
        console.print(Text(f"FAIL{code}: numerical mismatch in {failed}", style="bold red"))
    else:
        console.print(Text(f"FAIL{code}: {len(result.all_problems)} structural problem(s), {where}", style="bold red"))
