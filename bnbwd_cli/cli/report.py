"""A comparison judged and shown: the rich report (or JSON) of `verify` and `run --reference`, and its exit code.

Not a command: run and verify both call it, so neither imports the other. The comparison is app/judge.py's,
the report render/'s; the JSON document goes to a file through files/write.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import click

from bnbwd_cli.app import judge as app_judge
from bnbwd_cli.cli.output import ReportWriter, record_verdict
from bnbwd_cli.cli.params import ComparisonOptions
from bnbwd_cli.errors import ExitCode
from bnbwd_cli.files import write as files_write
from bnbwd_cli.status import exit_code


def _check_override_names(options: ComparisonOptions, actual: Mapping[str, Any], reference: Mapping[str, Any]) -> None:
    known = set(actual) | set(reference)
    for option, names in options.judging.output_names().items():
        unknown = sorted(names - known)
        if unknown:
            flag = "--" + option.replace("_", "-")
            raise click.UsageError(f"{flag} names {', '.join(unknown)}, which is not an output (outputs: {', '.join(sorted(known))})")


def report_comparison(sets: app_judge.TensorSets, options: ComparisonOptions, stdout_console, json_target: str | None,
                      fsync: bool = False, progress: Callable[[int, int], None] | None = None) -> ExitCode:
    """Compare two tensor sets, print the report (and JSON), return the exit code.

    ``json_target``: None, a path, or "-" (JSON replaces the rich report on stdout).
    Structural problems go to stderr as ``error: ...`` lines, once (the report on stdout only counts them).
    """
    from bnbwd_cli.render import text as report

    _check_override_names(options, sets.actual, sets.reference)
    judging = options.judging
    if json_target is not None or options.verbose:  # every output's details will be shown: gather them at once
        judging = replace(judging, details_up_front=True)
    result = app_judge.compare(sets, judging, options.data_format, progress)
    record_verdict(exit_code(result.status))  # a reader that stops reading the report cannot change it
    writer = ReportWriter()
    if json_target != "-":
        writer.write(report.render_report, stdout_console, result, report.Labels(sets.actual_label, sets.reference_label),
                     report.ReportStyle(verbose=options.verbose, brief=options.brief))
    if json_target is not None:
        from bnbwd_cli.render import json as report_json  # only --json writes JSON

        tool = f"bnbwd {click.get_current_context().info_name}"  # the command that ran: run or verify
        document = report_json.report_document(result, report_json.Source(tool, sets.actual_label, sets.reference_label))
        text = report_json.document_text(document)
        writer.write(lambda: files_write.write_text(json_target, text, fsync=fsync))
    report.print_problems(result)
    writer.finish()
    return exit_code(result.status)
