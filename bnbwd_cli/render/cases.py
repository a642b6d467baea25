"""`bnbwd check` as text and JSON: one line per case, a summary line, one JSON document.

The document holds what every other report of a suite is made from (render/junit.py, render/markdown.py,
`bnbwd report`'s merge of shards): per case its line, its brief report when it fails, its problem and time;
so a report rendered from merged shard documents is the one the unsharded run's document gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from bnbwd_cli.render import json as report_json
from bnbwd_cli.literal import literal
from bnbwd_cli.render.brief import criterion_text, where_text
from bnbwd_cli.render.common import status_word
from bnbwd_cli.render.text import decisive_number
from bnbwd_cli._version import __version__
from bnbwd_cli.status import Status, exit_code, suite_status

if TYPE_CHECKING:
    from bnbwd_cli.judge import OutputResult, SetComparison

SUMMARY_NAMES = 3  # a summary names this many cases of a kind, then "and N more" (29 names are a wall of text)


class Problem(Protocol):
    """What a case's op was (app/check.py's Problem)."""

    shape: tuple[int, ...]
    dtype: str
    layout: str
    epsilon: float | None
    m: int
    is_training: bool


class CaseOutcome(Protocol):
    """What a line and the document show of one case (app/check.py's CaseOutcome)."""

    path: str
    result: SetComparison | None
    error: str | None
    notes: tuple[str, ...]
    problem: Problem | None
    seconds: float

    @property
    def status(self) -> Status: ...


def _output_cell(output: OutputResult) -> str:
    """An output in a few words: its largest error in units; failing, the test that failed against its threshold
    (NaN/Inf first) and where its failures sit."""
    c = output.comparison
    if c is None:
        return f"{output.name} {status_word(output)}"
    if c.passed:
        return f"{output.name} {decisive_number(c)}"
    where = where_text(c)
    placed = where is not None and c.details.where.kind != "all"  # (a line per case: "every element" says little)
    return f"{output.name} FAIL {criterion_text(c.deciding, c)}" + (f" (where: {where})" if placed else "")


def _hints(result: SetComparison) -> list[str]:
    """The distinct hints of the failing outputs, in output order (one diagnosis often names every output)."""
    return list(dict.fromkeys(h for o in result.outputs if o.status == Status.MISMATCH for h in o.comparison.hints))


def case_line(outcome: CaseOutcome) -> str:
    """PASS/FAIL/ERROR and the case; for a failure its first hint (then how many more) or problem; each output's
    largest error in units and, failing, its failed test; the keys the file holds that were not used."""
    if outcome.result is None:
        return f"ERROR {outcome.error}"
    result = outcome.result
    line = f"{'PASS ' if result.status == Status.PASS else 'FAIL '} {literal(outcome.path)}: "
    hints = _hints(result)
    hint = f"hint: {hints[0]}" + (f" (+{len(hints) - 1} more: -v)" if len(hints) > 1 else "") if hints else None
    cells = ", ".join(_output_cell(o) for o in result.outputs)
    # NaN/Inf lead every form: then the cells (which say them first) come before the hint; else the hint leads
    nonfinite = any(o.comparison is not None and o.comparison.nonfinite.mismatches for o in result.outputs)
    line += "; ".join(part for part in ((cells, hint) if nonfinite else (hint, cells)) if part)
    if result.status == Status.STRUCTURAL:
        line += "".join(f"; error: {problem.message}" for problem in result.all_problems)
    return line + "".join(f"; {note}" for note in outcome.notes)


def verdict_text(outcome: CaseOutcome) -> str:
    """What decided the case, without its hint: the failing outputs' tests (each output's units when it passes)
    and the problems that kept outputs from being compared; an unjudged case's error."""
    if outcome.result is None:
        return outcome.error or ""
    outputs = outcome.result.outputs
    shown = [o for o in outputs if o.status != "pass"] if outcome.result.status != Status.PASS else list(outputs)
    return "; ".join([", ".join(_output_cell(o) for o in shown)] + [p.message for p in outcome.result.all_problems])


def summary_line(outcomes: Sequence[CaseOutcome]) -> str:
    return summary_of([(o.path, o.status) for o in outcomes])


def summary_of(cases: Sequence[tuple[str, Status]]) -> str:
    """The verdict over all cases, naming the first few of those that did not pass (SUMMARY_NAMES)."""
    verdict = suite_status(status for _, status in cases)
    if verdict == Status.PASS:
        return f"PASS: {len(cases)} case(s), every output within tolerance"
    failed = [literal(path) for path, status in cases if status == Status.MISMATCH]
    broken = [literal(path) for path, status in cases if exit_code(status) == exit_code(Status.ERROR)]
    parts = [f"{len(failed)} failed: {_some(failed)}"] if failed else []
    parts += [f"{len(broken)} could not be judged: {_some(broken)}"] if broken else []
    return f"FAIL (exit {int(exit_code(verdict))}): {len(cases)} case(s), {'; '.join(parts)}"


def _some(names: list[str]) -> str:
    """a, b, c and 26 more (all of them when one more name would be no longer than "and 1 more")."""
    if len(names) <= SUMMARY_NAMES + 1:
        return ", ".join(names)
    return f"{', '.join(names[:SUMMARY_NAMES])} and {len(names) - SUMMARY_NAMES} more"


def counts_of(statuses: Sequence[str]) -> dict[str, int]:
    """How many cases, and how many of each verdict (every word of status.Status, 0 where none)."""
    return {"cases": len(statuses), **{status.value: sum(s == status for s in statuses) for status in Status}}


def _output_json(output: OutputResult) -> dict[str, Any]:
    """One output of a case, compact: its verdict, worst units, tests and hints; its comparison only when it fails."""
    c = output.comparison
    compact: dict[str, Any] = {"name": output.name, "actual_key": output.actual_key, "status": output.status,
                               "problem": output.problem.kind if output.problem is not None else None}
    if c is None:
        return compact | {"max_units": None, "units_unbounded": False, "criteria": [], "hints": [], "comparison": None}
    return compact | {
        "max_units": None if c.max_units is None else report_json.finite(c.max_units.value),
        "units_unbounded": report_json.units_unbounded(c),
        "criteria": report_json.criteria_json(c),
        "hints": report_json.hints_json(c),
        "comparison": None if c.passed else report_json.comparison_json(c),
    }


def _problem_json(problem: Problem | None) -> dict[str, Any] | None:
    if problem is None:
        return None
    return {"shape": list(problem.shape), "dtype": problem.dtype, "layout": problem.layout,
            "epsilon": problem.epsilon, "M": problem.m, "is_training": problem.is_training}


def brief_text(outcome: CaseOutcome) -> str | None:
    """A failing case's few lines (--brief's: the verdict, each output's tests, hints and worst element); an
    unjudged case's error; None for a pass."""
    if outcome.result is None:
        return outcome.error
    if outcome.result.status == Status.PASS:
        return None
    import io

    from bnbwd_cli.render import text as report_text

    buffer = io.StringIO()
    console = report_text.make_console(buffer)
    report_text.render_report(console, outcome.result, report_text.Labels(outcome.path, "bnbwd"),
                              report_text.ReportStyle(brief=True, problems_inline=True))
    return buffer.getvalue()


def _case_json(outcome: CaseOutcome) -> dict[str, Any]:
    result = outcome.result
    case: dict[str, Any] = {"case": outcome.path, "status": outcome.status, "exit_code": int(exit_code(outcome.status)),
                            "error": outcome.error, "notes": list(outcome.notes), "line": case_line(outcome),
                            "verdict": verdict_text(outcome),
                            "brief": brief_text(outcome), "problem": _problem_json(outcome.problem),
                            "seconds": round(outcome.seconds, 6)}
    if result is None:
        return case | {"hint": None, "problems": [], "outputs": []}
    hints = _hints(result)
    return case | {"hint": hints[0] if hints else None,
                   "problems": [{"kind": p.kind, "name": p.name, "message": p.message} for p in result.all_problems],
                   "outputs": [_output_json(o) for o in result.outputs]}


def suite_document(cases: list[dict[str, Any]], shard: tuple[int, int] | None = None,
                   tool: str = "bnbwd check") -> dict[str, Any]:
    """The document of a suite from its cases' records (a check's, or merged shards'): the verdict, counts and
    summary follow from them."""
    verdict = suite_status(Status(case["status"]) for case in cases)
    return {"schema_version": report_json.CHECK_SCHEMA_VERSION, "tool": tool, "bnbwd_version": __version__,
            "status": verdict, "exit_code": int(exit_code(verdict)),
            "summary": summary_of([(case["case"], Status(case["status"])) for case in cases]),
            "counts": counts_of([case["status"] for case in cases]),
            "shard": None if shard is None else {"index": shard[0], "count": shard[1]},
            **report_json.defaults(), "cases": cases}


def check_document(outcomes: Sequence[CaseOutcome], shard: tuple[int, int] | None = None,
                   tool: str = "bnbwd check") -> dict[str, Any]:
    """Per case its verdict, line, brief report, problem and seconds, its first hint, and per output its worst
    units, tests and hints; the comparison details (worst elements, channels, histogram) only for the outputs
    that fail. tool: the command (run --reference and verify make one case's document for --junit/--markdown)."""
    return suite_document([_case_json(o) for o in outcomes], shard, tool)


def cases_document(outcomes: Sequence[CaseOutcome], shard: tuple[int, int] | None = None) -> str:
    """check_document as JSON text."""
    return report_json.document_text(check_document(outcomes, shard))
