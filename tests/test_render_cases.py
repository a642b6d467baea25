"""render/cases.py: `bnbwd check`'s line per case and its summary line (the verdict over all cases, naming those
that did not pass, with the exit code the suite ends in)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.render.cases import case_line, summary_line
from bnbwd_cli.status import Status
from tools import zoo


@dataclass
class Outcome:
    """What render/cases reads of a case (app/check.CaseOutcome's fields)."""

    path: str
    status: Status
    result: object = None
    error: str | None = None
    notes: tuple[str, ...] = ()


def test_every_case_passing_says_how_many():
    assert summary_line([Outcome("a.npz", Status.PASS), Outcome("b.npz", Status.PASS)]) == \
        "PASS: 2 case(s), every output within tolerance"


def test_failed_cases_are_named_with_the_suites_exit_code():
    outcomes = [Outcome("a.npz", Status.PASS), Outcome("b.npz", Status.MISMATCH), Outcome("c.npz", Status.MISMATCH)]
    assert summary_line(outcomes) == "FAIL (exit 1): 3 case(s), 2 failed: b.npz, c.npz"


def test_a_case_that_could_not_be_judged_makes_it_exit_3_and_is_listed_apart():
    outcomes = [Outcome("a.npz", Status.MISMATCH), Outcome("b.npz", Status.ERROR), Outcome("c.npz", Status.STRUCTURAL)]
    assert summary_line(outcomes) == "FAIL (exit 3): 3 case(s), 1 failed: a.npz; 2 could not be judged: b.npz, c.npz"


def test_a_case_name_is_printed_literally():
    line = summary_line([Outcome("evil\n\x1b[2J.npz", Status.MISMATCH)])
    assert "\n" not in line and "\x1b" not in line and "evil" in line


def test_a_case_line_says_the_verdict_and_each_outputs_largest_error():
    problem = zoo.make_problem(np.random.default_rng(4), (2, 3, 4, 4), "NCX", np.float32, np.float32)
    truth = zoo.bnbwd_outputs(problem)
    result = compare_sets(truth, truth, Judging(), inputs=zoo.inputs_of(problem))
    line = case_line(Outcome("ok.npz", Status.PASS, result, notes=("not used: step",)))
    assert line.startswith("PASS  ok.npz: diff_src 0 units, diff_gamma 0 units, diff_beta 0 units")
    assert line.endswith("; not used: step")
    assert case_line(Outcome("bad.npz", Status.ERROR, error="bad.npz: not a valid .npz archive")) == \
        "ERROR bad.npz: not a valid .npz archive"
