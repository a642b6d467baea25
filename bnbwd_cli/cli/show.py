"""A judged comparison shown: the rich report (or JSON) of `verify` and `run --reference`. Renders only.

Not a command: run and verify both call it, so neither imports the other. The verdict is app/judge.py's and is
recorded (cli/main.record_verdict) before anything is printed: a report that cannot be written (a full disk, a
reader gone) cuts the report short and never changes the exit code. The report is render/'s; the JSON
document goes to a file through files/write.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bnbwd_cli.cli.output import ReportWriter
from bnbwd_cli.cli.params import ComparisonOptions
from bnbwd_cli.files import write as files_write

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import SetComparison
    from bnbwd_cli.judge.tolerance import Judging


@dataclass(frozen=True)
class Judged:
    """What CI's reports of one judgement name besides its verdict: the kernel's file (the one case), the op it was
    judged on (None: verify without --inputs) and the seconds the command took to reach the verdict."""

    kernel: str
    op: Any = None
    seconds: float = 0.0


@dataclass(frozen=True)
class ReportTarget:
    """Where a report goes: the text report's console, and --json (None, a path, or "-": then JSON replaces the
    text report on stdout), written with fsync or not; reports: the vetted destinations by flag (--junit and
    --markdown are written here, as one case, with `judged`)."""

    console: Any
    json_target: str | None = None
    fsync: bool = False
    reports: dict = field(default_factory=dict)
    judged: Judged | None = None


def check_override_names(options: ComparisonOptions, keys: Iterable[str]) -> None:
    """A per-output option (--atol NAME=...) naming no key of the files is a usage error, before any judging."""
    known = set(keys)
    for option, names in options.judging.output_names().items():
        unknown = sorted(names - known)
        if unknown:
            flag = "--" + option.replace("_", "-")
            raise click.UsageError(f"{flag} names {', '.join(unknown)}, which is not an output (outputs: {', '.join(sorted(known))})")


def judging_for(options: ComparisonOptions, json_target: str | None) -> Judging:
    """The judging the report wants: every output's details gathered in the judging pass when all will be shown, with
    every element's judgement kept for --save-error."""
    judging = options.judging
    if options.save_error is not None:
        judging = replace(judging, keep_errors=True)
    if json_target is not None or options.verbose or options.save_error is not None:
        return replace(judging, details_up_front=True)
    return judging


def save_errors(result: SetComparison, target: str, fsync: bool) -> None:
    """--save-error: every compared output's element judgements, keyed OUTPUT.failing, OUTPUT.nonfinite, OUTPUT.ratio
    (and OUTPUT.units), each in the output's own shape; one .npz written all or nothing (files/write.py)."""
    from bnbwd_cli.judge.comparison import errors_arrays

    arrays = {f"{output.name}.{key}": array for output in result.outputs if output.comparison is not None
              for key, array in errors_arrays(output.comparison.errors).items()}
    files_write.write_npz(Path(target), arrays, fsync=fsync)


def show_comparison(result: SetComparison, labels: tuple[str, str], options: ComparisonOptions, target: ReportTarget,
                    writer: ReportWriter) -> None:
    """Print the report of a judged comparison (and write its JSON). labels: the actual and reference sides' names.
    Writes go through ``writer`` (the caller calls finish() once everything is shown). Structural problems go to
    stderr as ``error: ...`` lines, once (the report on stdout only counts them)."""
    from bnbwd_cli.render import text as report

    if options.save_error is not None:  # first: the user's own plots need it whatever becomes of stdout
        writer.write(save_errors, result, options.save_error, target.fsync)
    if target.json_target != "-":
        writer.write(report.render_report, target.console, result, report.Labels(*labels),
                     report.ReportStyle(verbose=options.verbose, brief=options.brief))
    if target.json_target is not None:
        from bnbwd_cli.render import json as report_json  # only --json writes JSON

        tool = f"bnbwd {click.get_current_context().info_name}"  # the command that ran: run or verify
        document = report_json.report_document(result, report_json.Source(tool, *labels))
        text = report_json.document_text(document)
        writer.write(lambda: files_write.write_text(target.json_target, text, fsync=target.fsync))
    _write_ci_reports(result, target, writer)
    report.print_problems(result)


def _write_ci_reports(result: SetComparison, target: ReportTarget, writer: ReportWriter) -> None:
    """--junit and --markdown of run --reference and verify: the judgement as a suite of one case (the kernel's
    file), rendered as check's are (render/junit.py, render/markdown.py) from check's document of it."""
    from bnbwd_cli.cli.params import ReportTargets

    reports = ReportTargets(junit=target.reports.get("--junit"), markdown=target.reports.get("--markdown"))
    if not reports.wanted or target.judged is None:
        return
    from bnbwd_cli.app.check import CaseOutcome, problem_of
    from bnbwd_cli.cli.suite_reports import write_reports
    from bnbwd_cli.render.cases import check_document

    judged = target.judged
    outcome = CaseOutcome(judged.kernel, result, problem=None if judged.op is None else problem_of(judged.op),
                          seconds=judged.seconds)
    tool = f"bnbwd {click.get_current_context().info_name}"  # run or verify
    write_reports(writer, reports, check_document([outcome], tool=tool), target.fsync)
