"""status.py: the verdicts and the one map from a verdict to an exit code, for one judgement and for a suite."""

from __future__ import annotations

import itertools

import pytest

from bnbwd_cli.errors import ExitCode
from bnbwd_cli.status import EXIT_CODES, Status, exit_code, suite_status


def test_every_status_has_its_exit_code():
    assert {status: exit_code(status) for status in Status} == {
        Status.PASS: ExitCode.OK, Status.MISMATCH: ExitCode.MISMATCH,
        Status.STRUCTURAL: ExitCode.INPUT, Status.ERROR: ExitCode.INPUT}
    assert set(EXIT_CODES) == set(Status)


def test_the_words_are_what_the_json_documents_carry():
    assert [str(status) for status in Status] == ["pass", "mismatch", "structural", "error"]
    assert Status("mismatch") is Status.MISMATCH


@pytest.mark.parametrize("statuses, verdict", [
    ((), Status.PASS),
    ((Status.PASS, Status.PASS), Status.PASS),
    ((Status.PASS, Status.MISMATCH), Status.MISMATCH),
    ((Status.MISMATCH, Status.STRUCTURAL), Status.ERROR),  # a case that could not be judged outranks a mismatch
    ((Status.PASS, Status.ERROR), Status.ERROR),
    ((Status.STRUCTURAL,), Status.ERROR),
])
def test_a_suites_verdict_is_its_worst_case_in_any_order(statuses, verdict):
    for order in itertools.permutations(statuses):
        assert suite_status(order) == verdict
    assert suite_status(iter(statuses)) == verdict  # a generator, read once
