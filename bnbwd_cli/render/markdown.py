"""A suite's verdicts as markdown: a pull request's comment or $GITHUB_STEP_SUMMARY.

Made from check's JSON document (render/cases.py), as render/junit.py is: the verdict as a heading, a table of
the cases that did not pass (case, verdict, hint), at most MAX_ROWS of them so that the text stays within a
comment's size, then the counts.
"""

from __future__ import annotations

from typing import Any

MAX_ROWS = 50  # ~50 rows of ~400 characters: well inside GitHub's 65536-character comment
CELL_LIMIT = 300  # a cell's characters (a hint can be long; the JSON and JUnit reports hold it whole)


def _cell(text: str | None, limit: int | None = CELL_LIMIT) -> str:
    """Text made safe for a table cell: one line, pipes escaped, no HTML, at most `limit` characters."""
    if not text:
        return ""
    one_line = " ".join(text.split())
    if limit is not None and len(one_line) > limit:
        one_line = one_line[:limit - 3] + "..."
    return one_line.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """A case's name as code (backticks in it: a longer fence)."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{_cell(text).replace('&lt;', '<').replace('&gt;', '>')}{fence}"


def markdown_report(document: dict[str, Any]) -> str:
    """The markdown text of a check document (render/cases.check_document or a merge of them)."""
    counts, shard = document["counts"], document["shard"]
    mark = "✅" if document["status"] == "pass" else "❌"
    lines = [f"### {mark} {document.get('tool', 'bnbwd check')}" + (f" (shard {shard['index']}/{shard['count']})" if shard else ""), "",
             _cell(document["summary"], None), ""]
    failing = [case for case in document["cases"] if case["status"] != "pass"]
    if failing:
        lines += ["| case | verdict | hint |", "|---|---|---|"]
        for case in failing[:MAX_ROWS]:
            verdict = f"**{case['status']}**: {_cell(case['verdict'])}"
            lines.append(f"| {_code(case['case'])} | {verdict} | {_cell(case['hint'])} |")
        if len(failing) > MAX_ROWS:
            lines.append(f"| ... | {len(failing) - MAX_ROWS} more cases did not pass | the JSON and JUnit reports "
                         "list them all |")
        lines.append("")
    tally = ", ".join(f"{counts[word]} {word}" for word in counts if word != "cases" and counts[word])
    lines.append(f"{counts['cases']} case(s): {tally or 'none'} · bnbwd {document['bnbwd_version']}")
    return "\n".join(lines) + "\n"
