"""A suite's reports written where the options say (`check` and `report`): --json, --junit, --markdown.

Click only: the destinations vetted before any work (cli/destinations.vet_outputs, by the commands), then each report rendered from the suite's JSON document
(render/cases.py, render/junit.py, render/markdown.py) and written all or nothing (files/write.py).
"""

from __future__ import annotations

from typing import Any


from bnbwd_cli.cli.output import ReportWriter
from bnbwd_cli.cli.params import ReportTargets
from bnbwd_cli.files import write as files_write


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
