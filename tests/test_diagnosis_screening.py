"""The diagnosis screens every hypothesis on a fixed sample of diff_src before computing it in full
(judge/diagnosis/sample.py, assess.screened): the screen may only reject what the whole-run test rejects, the
cause it names stays the one the whole run confirms, and few hypotheses are computed in full."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge import diagnosis
from bnbwd_cli.judge.diagnosis import sample as sample_module
from bnbwd_cli.judge.diagnosis.assess import screened, within
from bnbwd_cli.judge.diagnosis.build import build_case
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from bnbwd_cli.judge.diagnosis.sample import screening_sample
from bnbwd_cli.judge.model import channel_facts
from tools import bugs, zoo

assess_module = importlib.import_module("bnbwd_cli.judge.diagnosis.assess")  # (the package's `assess` is the function)

# (hooks, the cause) on (8, 5, 16, 18) NCX / its NXC twin: 2304 positions per channel, more than a sample holds
PLANTED = [({"block": 64, "lost": {1: 3}}, "lost-partial-sum"), ({"epsilon": 1e-2}, "epsilon"),
           ({"gamma": "next"}, "gamma-off-by-one"), ({"no_mean_dy": (0, 3)}, "mean-dy-not-subtracted"),
           ({"skip_tail": 19}, "missing-tail")]


def _problem(fmt: str, seed: int) -> dict:
    shape = (8, 5, 16, 18) if fmt == "NCX" else (8, 16, 18, 5)
    return zoo.make_problem(np.random.default_rng(seed), shape, fmt, np.float32, np.float32)


def _judged(problem: dict, outputs: dict) -> dict:
    reference = zoo.bnbwd_outputs(problem)
    result = compare_sets(outputs, reference, Judging(), inputs=zoo.inputs_of(problem))
    return {o.name: (outputs[o.name], reference[o.name], o.comparison) for o in result.outputs}


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("hooks, cause", PLANTED, ids=[c for _, c in PLANTED])
def test_the_screen_rejects_only_what_the_whole_rejects(hooks, cause, fmt):
    problem = _problem(fmt, 3)
    judged = _judged(problem, bugs.kernel(problem, hooks))
    inputs = zoo.inputs_of(problem)
    case = build_case(inputs, channel_facts(inputs), judged)
    sample = screening_sample(case)
    n, c, s = case.outputs["diff_src"].actual.shape
    assert sample.actual.shape[:2] == (1, c) and sample.size < n * c * s  # every channel, part of the positions
    rejected = named = 0
    for candidate in diagnosis._candidates(case):
        if candidate.prediction.diff_src is None:
            continue
        fresh = Prediction(candidate.prediction.diff_src)
        if not screened(case, fresh):
            rejected += 1
            whole = Prediction(candidate.prediction.diff_src)
            assert not within(case, "diff_src", whole.of("diff_src"), whole.noise("diff_src")), candidate.cause
        named += candidate.cause == cause and screened(case, fresh)
    assert rejected >= 3 and named >= 1


@pytest.mark.parametrize("hooks, cause", PLANTED[:3], ids=[c for _, c in PLANTED[:3]])
def test_few_hypotheses_are_computed_in_full(hooks, cause, monkeypatch):
    """The named cause is unchanged, at most two hypotheses' diff_src is computed on the whole run (chunk by
    chunk: whole_run.confirmed), and none is held whole."""
    problem = _problem("NCX", 4)
    outputs = bugs.kernel(problem, hooks)
    confirmed, whole = [], []
    original = assess_module.confirmed

    def counting(case, at, share, lean=None):
        confirmed.append(at)
        return original(case, at, share, lean)

    monkeypatch.setattr(assess_module, "confirmed", counting)
    monkeypatch.setattr(Prediction, "resolve_in_chunks", lambda self, shape: whole.append(shape))
    reference = zoo.bnbwd_outputs(problem)
    result = compare_sets(outputs, reference, Judging(), inputs=zoo.inputs_of(problem))
    assert {h.cause for o in result.outputs for h in o.comparison.diagnosis} == {cause}
    assert 1 <= len(confirmed) <= 2 and not whole, (confirmed, whole)


def test_the_sample_holds_failing_positions_and_spread_ones():
    """Half the positions where the judge found failures (evenly over them), half spread over all positions."""
    failing = np.zeros(4000, bool)
    failing[3000:3100] = True
    flat = sample_module._sample_positions(40, 100, 4, failing)
    assert flat.size > 300 and np.all(np.diff(flat) > 0)
    inside = np.count_nonzero((flat >= 3000) & (flat < 3100))
    assert inside == 100  # all 100 failing positions (fewer than half the sample)
    assert np.count_nonzero(flat < 3000) > 100  # and the rest spread over the whole
    assert sample_module._sample_positions(2, 10, 4, None).tolist() == list(range(20))  # small: all positions
