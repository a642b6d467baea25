"""`bnbwd report DOC.json...`: check's JSON documents (shards) merged, shown as check shows a suite, and
written as JSON, JUnit XML or markdown.

Click only: parse, merge through app/report.py, print the cases' lines (check's own, from the documents) and
the summary, write the reports asked for (cli/suite_reports.py), exit with the merged verdict's code.
"""

from __future__ import annotations

from pathlib import Path

import click

from bnbwd_cli.app import report as app_report
from bnbwd_cli.cli.output import ReportWriter, record_verdict
from bnbwd_cli.cli.params import ReportTargets, fsync_option, report_options
from bnbwd_cli.cli.destinations import vet_outputs
from bnbwd_cli.cli.suite_reports import write_reports
from bnbwd_cli.literal import literal_line

_HELP = """Merge `bnbwd check --json` documents into one report: the shards of a suite
(--shard K/N on N machines), or any suites.

Prints each case's line as check printed it (-q: only FAIL and ERROR) and the
summary over all cases, and exits as check would have on the whole suite: 0 every
case passes, 1 a case fails, 3 a case could not be judged. --json, --junit and
--markdown write the merged report ('-': stdout; the lines then go to stderr).
The shards 1/N..N/N of one run merge into the document the unsharded run writes
(but each case's seconds). Exit 3 if a document is not check's, a case is in two
documents, or shards of one run are missing.
"""

_EPILOG = """\b
Examples:
  bnbwd check suite --shard 1/4 --json shard1.json     # on each of 4 machines
  bnbwd report shard*.json --junit check.xml --markdown "$GITHUB_STEP_SUMMARY"
"""


@click.command("report", help=_HELP, epilog=_EPILOG)
@click.argument("documents", nargs=-1, required=True, metavar="DOC.json...")
@click.option("--json", "json_target", metavar="PATH|-", default=None,
              help="Write the merged JSON document to PATH; '-' writes it to stdout.")
@report_options
@fsync_option
def report(documents: tuple[str, ...], json_target: str | None, junit_target: str | None,
           markdown_target: str | None, quiet: bool, fsync: bool) -> None:
    if documents.count("-") > 1:
        raise click.UsageError("'-' (stdin) named twice; stdin holds one document")
    targets = ReportTargets(json_target, junit_target, markdown_target, quiet)
    vet_outputs(list(targets.named.items()), [Path(source) for source in documents if source != "-"])
    merged = app_report.merge(documents)
    record_verdict(merged["exit_code"])
    writer = ReportWriter()
    echo = click.echo if not targets.stdout_taken else (lambda text: click.echo(text, err=True))
    for case in merged["cases"]:
        if not (quiet and case["status"] == "pass"):
            writer.write(echo, literal_line(str(case["line"])))
    writer.write(echo, literal_line(merged["summary"]))
    write_reports(writer, targets, merged, fsync)
    writer.finish()
    click.get_current_context().exit(merged["exit_code"])
