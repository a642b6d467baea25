"""`bnbwd check` as text and JSON: one line per case, a summary line, one JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from bnbwd_cli.render import json as report_json
from bnbwd_cli.literal import literal
from bnbwd_cli.render.text import decisive_number
from bnbwd_cli.status import Status, exit_code, suite_status

if TYPE_CHECKING:
    from bnbwd_cli.judge import OutputResult, SetComparison


class CaseOutcome(Protocol):
    """What a line and the document show of one case (app/check.py's CaseOutcome)."""

    path: str
    result: SetComparison | None
    error: str | None
    notes: tuple[str, ...]

    @property
    def status(self) -> Status: ...


def _output_cell(output: OutputResult) -> str:
    """An output in a few characters: the number that decided it."""
    c = output.comparison
    if c is None:
        return f"{output.name} {output.status.upper()}"
    cell = f"{output.name} {decisive_number(c)}"
    return cell if c.passed else f"{cell} FAIL" + (" (systematic)" if c.bias_failed else "")


def case_line(outcome: CaseOutcome) -> str:
    """PASS/FAIL/ERROR, the case, each output's decisive number; for a failure its first hint or problem;
    the keys the file holds that were not used."""
    if outcome.result is None:
        return f"ERROR {outcome.error}"
    result = outcome.result
    line = f"{'PASS ' if result.status == Status.PASS else 'FAIL '} {literal(outcome.path)}: "
    line += ", ".join(_output_cell(o) for o in result.outputs)
    if result.status == Status.STRUCTURAL:
        line += f"; error: {result.all_problems[0].message}"
    hints = [h for o in result.outputs if o.status == "fail" for h in o.comparison.hints]
    line += f"; hint: {hints[0]}" if hints else ""
    return line + "".join(f"; {note}" for note in outcome.notes)


def summary_line(outcomes: Sequence[CaseOutcome]) -> str:
    """The verdict over all cases, naming those that did not pass."""
    verdict = suite_status(o.status for o in outcomes)
    if verdict == Status.PASS:
        return f"PASS: {len(outcomes)} case(s), every output within tolerance"
    failed = [literal(o.path) for o in outcomes if o.status == Status.MISMATCH]
    broken = [literal(o.path) for o in outcomes if o.status in (Status.STRUCTURAL, Status.ERROR)]
    parts = [f"{len(failed)} failed ({', '.join(failed)})"] if failed else []
    parts += [f"{len(broken)} could not be judged ({', '.join(broken)})"] if broken else []
    return f"FAIL (exit {int(exit_code(verdict))}): {len(outcomes)} case(s), {'; '.join(parts)}"


def cases_document(outcomes: Sequence[CaseOutcome]) -> str:
    """The JSON text: per case its status and error, notes, and the full comparison (verify's schema)."""
    cases: list[dict[str, Any]] = []
    for outcome in outcomes:
        report = None
        if outcome.result is not None:
            report = report_json.report_document(outcome.result, actual_label=outcome.path, reference_label="bnbwd")
        cases.append({"case": outcome.path, "status": outcome.status, "exit_code": int(exit_code(outcome.status)),
                      "error": outcome.error, "notes": list(outcome.notes), "report": report})
    verdict = suite_status(o.status for o in outcomes)
    document = {"schema_version": report_json.CHECK_SCHEMA_VERSION, "tool": "bnbwd check",
                "status": verdict, "exit_code": int(exit_code(verdict)),
                "summary": summary_line(outcomes), "cases": cases}
    return report_json.document_text(document)
