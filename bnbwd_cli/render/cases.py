"""`bnbwd check` as text and JSON: one line per case, a summary line, one JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bnbwd_cli.case import CaseOutcome
from bnbwd_cli.judge import OutputResult
from bnbwd_cli.render import json as report_json
from bnbwd_cli.render.text import decisive_number


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
    line = f"{'PASS ' if result.status == 'pass' else 'FAIL '} {outcome.path}: "
    line += ", ".join(_output_cell(o) for o in result.outputs)
    if result.status == "structural":
        line += f"; error: {result.all_problems[0].message}"
    hints = [h for o in result.outputs if o.status == "fail" for h in o.comparison.hints]
    line += f"; hint: {hints[0]}" if hints else ""
    return line + "".join(f"; {note}" for note in outcome.notes)


def exit_code(outcomes: Sequence[CaseOutcome]) -> int:
    """3 if a case could not be read or compared, else 1 if one failed, else 0."""
    codes = {outcome.exit_code for outcome in outcomes}
    return 3 if 3 in codes else 1 if 1 in codes else 0


def summary_line(outcomes: Sequence[CaseOutcome]) -> str:
    """The verdict over all cases, naming those that did not pass."""
    code = exit_code(outcomes)
    if code == 0:
        return f"PASS: {len(outcomes)} case(s), every output within tolerance"
    failed = [o.path for o in outcomes if o.exit_code == 1]
    broken = [o.path for o in outcomes if o.exit_code == 3]
    parts = [f"{len(failed)} failed ({', '.join(failed)})"] if failed else []
    parts += [f"{len(broken)} could not be judged ({', '.join(broken)})"] if broken else []
    return f"FAIL (exit {code}): {len(outcomes)} case(s), {'; '.join(parts)}"


def cases_document(outcomes: Sequence[CaseOutcome]) -> str:
    """The JSON text: per case its status and error, notes, and the full comparison (verify's schema)."""
    cases: list[dict[str, Any]] = []
    for outcome in outcomes:
        report = None
        if outcome.result is not None:
            report = report_json.report_document(outcome.result, actual_label=outcome.path, reference_label="bnbwd")
        cases.append({"case": outcome.path, "status": outcome.status, "exit_code": outcome.exit_code,
                      "error": outcome.error, "notes": list(outcome.notes), "report": report})
    code = exit_code(outcomes)
    document = {"schema_version": report_json.CHECK_SCHEMA_VERSION, "tool": "bnbwd check",
                "status": {0: "pass", 1: "mismatch", 3: "error"}[code], "exit_code": code,
                "summary": summary_line(outcomes), "cases": cases}
    return report_json.document_text(document)
