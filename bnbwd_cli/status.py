"""The verdicts a judgement or a suite ends in, and the one map from a verdict to an exit code."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from bnbwd_cli.errors import ExitCode


class Status(enum.StrEnum):
    """A verdict. Its value is the word the JSON documents and the API's Report.status carry."""

    PASS = "pass"  # every output within tolerance
    MISMATCH = "mismatch"  # an output is numerically off
    STRUCTURAL = "structural"  # an output cannot be compared (missing, extra, shape, dtype)
    ERROR = "error"  # the inputs could not be read or judged at all (a check case)


EXIT_CODES = {Status.PASS: ExitCode.OK, Status.MISMATCH: ExitCode.MISMATCH,
              Status.STRUCTURAL: ExitCode.INPUT, Status.ERROR: ExitCode.INPUT}


def exit_code(status: Status) -> ExitCode:
    return EXIT_CODES[status]


def suite_status(statuses: Iterable[Status]) -> Status:
    """A suite's verdict: error if a case could not be judged (unreadable or structural), else mismatch if one
    failed, else pass."""
    codes = {exit_code(status) for status in statuses}
    if ExitCode.INPUT in codes:
        return Status.ERROR
    return Status.MISMATCH if ExitCode.MISMATCH in codes else Status.PASS
