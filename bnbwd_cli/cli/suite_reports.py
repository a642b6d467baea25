"""A suite's reports written where the options say (`check` and `report`): --json, --junit, --markdown.

Click only: the destinations vetted before any work, then each report rendered from the suite's JSON document
(render/cases.py, render/junit.py, render/markdown.py) and written all or nothing (files/write.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bnbwd_cli.cli.output import ReportWriter
from bnbwd_cli.cli.params import ReportTargets
from bnbwd_cli.files import write as files_write


def vet_report_targets(targets: ReportTargets, inputs: list[str]) -> None:
    """At most one report on stdout; no report over a file the command reads, into a directory, or twice."""
    to_stdout = [option for option, target in targets.named.items() if target == "-"]
    if len(to_stdout) > 1:
        raise click.UsageError(f"{' and '.join(to_stdout)} both write to stdout ('-'); give one of them a file")
    files = {option: target for option, target in targets.named.items() if target != "-"}
    if not files:
        return
    from bnbwd_cli.files.read import source_files

    read = [path for source in inputs for path in source_files(str(source))]
    for option, target in files.items():
        files_write.vet_destination(target, read, option)
    named = [Path(target).resolve() for target in files.values()]
    if len(set(named)) < len(named):
        raise click.UsageError(f"{' and '.join(files)} name the same file; give each report its own")


def write_reports(writer: ReportWriter, targets: ReportTargets, document: dict[str, Any], fsync: bool) -> None:
    """Each report asked for, rendered from the document; one on stdout goes through the writer (a closed stdout
    ends the report, never the verdict)."""
    for option, target in targets.named.items():
        text = _render(option, document)
        if target == "-":
            writer.write(files_write.write_text, target, text)
        else:
            files_write.write_text(target, text, fsync=fsync, what=option)


def _render(option: str, document: dict[str, Any]) -> str:
    if option == "--junit":
        from bnbwd_cli.render.junit import junit_xml

        return junit_xml(document)
    if option == "--markdown":
        from bnbwd_cli.render.markdown import markdown_report

        return markdown_report(document)
    from bnbwd_cli.render.json import document_text

    return document_text(document)
