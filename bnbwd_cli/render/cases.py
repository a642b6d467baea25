"""`bnbwd check` as text and JSON: one line per case, a summary line, one JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from bnbwd_cli.render import json as report_json
from bnbwd_cli.literal import literal
from bnbwd_cli.render.decision import deciding
from bnbwd_cli.render.brief import criterion_text, where_text
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
    """An output in a few words: its largest error in units; failing, the test that failed against its threshold
    (NaN/Inf first) and where its failures sit."""
    c = output.comparison
    if c is None:
        return f"{output.name} {output.status.upper()}"
    if c.passed:
        return f"{output.name} {decisive_number(c)}"
    where = where_text(c)
    placed = where is not None and c.details.where.kind != "all"  # (a line per case: "every element" says little)
    return f"{output.name} FAIL {criterion_text(deciding(c), c)}" + (f" (where: {where})" if placed else "")


def _hints(result: SetComparison) -> list[str]:
    """The distinct hints of the failing outputs, in output order (one diagnosis often names every output)."""
    return list(dict.fromkeys(h for o in result.outputs if o.status == "fail" for h in o.comparison.hints))


def case_line(outcome: CaseOutcome) -> str:
    """PASS/FAIL/ERROR and the case; for a failure its first hint (then how many more) or problem; each output's
    largest error in units and, failing, its failed test; the keys the file holds that were not used."""
    if outcome.result is None:
        return f"ERROR {outcome.error}"
    result = outcome.result
    line = f"{'PASS ' if result.status == Status.PASS else 'FAIL '} {literal(outcome.path)}: "
    hints = _hints(result)
    if hints:
        more = f" (+{len(hints) - 1} more: -v)" if len(hints) > 1 else ""
        line += f"hint: {hints[0]}{more}; "
    line += ", ".join(_output_cell(o) for o in result.outputs)
    if result.status == Status.STRUCTURAL:
        line += f"; error: {result.all_problems[0].message}"
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


def _output_json(output: OutputResult) -> dict[str, Any]:
    """One output of a case, compact: its verdict, worst units, tests and hints; its comparison only when it fails."""
    c = output.comparison
    compact: dict[str, Any] = {"name": output.name, "actual_key": output.actual_key, "status": output.status}
    if c is None:
        return compact | {"max_units": None, "units_unbounded": False, "criteria": [], "hints": [], "comparison": None}
    return compact | {
        "max_units": None if c.max_units is None else report_json.finite(c.max_units.value),
        "units_unbounded": report_json.units_unbounded(c),
        "criteria": report_json.criteria_json(c),
        "hints": report_json.hints_json(c),
        "comparison": None if c.passed else report_json.comparison_json(c),
    }


def _case_json(outcome: CaseOutcome) -> dict[str, Any]:
    result = outcome.result
    case: dict[str, Any] = {"case": outcome.path, "status": outcome.status, "exit_code": int(exit_code(outcome.status)),
                            "error": outcome.error, "notes": list(outcome.notes)}
    if result is None:
        return case | {"hint": None, "problems": [], "outputs": []}
    hints = _hints(result)
    return case | {"hint": hints[0] if hints else None,
                   "problems": [{"kind": p.kind, "name": p.name, "message": p.message} for p in result.all_problems],
                   "outputs": [_output_json(o) for o in result.outputs]}


def cases_document(outcomes: Sequence[CaseOutcome]) -> str:
    """The JSON text, compact: per case its verdict, its first hint, and per output its worst units, tests and hints;
    the comparison details (worst elements, channels, histogram) only for the outputs that fail."""
    verdict = suite_status(o.status for o in outcomes)
    document = {"schema_version": report_json.CHECK_SCHEMA_VERSION, "tool": "bnbwd check",
                "status": verdict, "exit_code": int(exit_code(verdict)), "summary": summary_line(outcomes),
                **report_json.defaults(), "cases": [_case_json(o) for o in outcomes]}
    return report_json.document_text(document)
