"""The diagnosis' acceptance rules at their edges (judge/diagnosis/__init__.py and assess.py): a hypothesis that
explains only part of a failing output's deviation is not named (MIN_SHARE), two that explain it about equally
well are "ambiguous" (AMBIGUOUS), and the unexplained hint says "every channel" or "N of C channels".

The hypotheses here are planted through the one seam the diagnosis has for them (its list of candidates): each
predicts the reference moved a chosen share of the way to the actual output, so the share it explains is known.
All-float64 problems: a prediction is not rounded to a coarser grid, so the shares are exact."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli import judge as judge_package
from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge import diagnosis
from bnbwd_cli.judge.diagnosis.candidate import Candidate
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from tools import zoo

K_SRC = 16.0
MIN_SHARE = 0.9  # docs/tolerances.md: a cause must explain 90% of a failing output's deviation (written, not imported)


def _problem(shape=(4, 6, 8, 10)) -> dict:
    return zoo.make_problem(np.random.default_rng(21), shape, "NCX", np.float64, np.float64)


def _judge(problem: dict, outputs: dict):
    return compare_sets(outputs, zoo.bnbwd_outputs(problem), Judging(), inputs=zoo.inputs_of(problem))


def _noisy(problem: dict, channels=None, peak_units: float = 1.4 * K_SRC) -> dict:
    """Correct outputs with noise on diff_src (in `channels`, all by default) scaled so that its worst element is
    `peak_units` of the error model's units: beyond K, and within K of a prediction that explains most of it."""
    truth = zoo.bnbwd_outputs(problem)
    noise = np.random.default_rng(5).normal(size=truth["diff_src"].shape)
    if channels is not None:
        keep = np.zeros(truth["diff_src"].shape[1], bool)
        keep[list(channels)] = True
        noise[:, ~keep] = 0.0
    trial = {**truth, "diff_src": truth["diff_src"] + 1e-9 * noise}
    units = next(o.comparison.max_units.value for o in _judge(problem, trial).outputs if o.name == "diff_src")
    return {**truth, "diff_src": truth["diff_src"] + 1e-9 * noise * (peak_units / units)}


def _plant(monkeypatch, *shares: float) -> None:
    """The diagnosis tests only these hypotheses: hypothesis i predicts r + shares[i] * (a - r) for diff_src."""

    def candidates(case):
        out = case.outputs["diff_src"]
        for i, share in enumerate(shares):
            yield Candidate(f"planted-{i}", Prediction(diff_src=out.reference + share * (out.actual - out.reference)),
                            lambda assessment, i=i: f"planted {i} explains {assessment.share:.3f}")

    monkeypatch.setattr(diagnosis, "_candidates", candidates)


def _diff_src_causes(result) -> list[str]:
    return [h.cause for o in result.outputs if o.name == "diff_src" for h in o.comparison.diagnosis]


def test_the_planted_seam_is_the_one_the_diagnosis_uses():
    assert judge_package.diagnosis is diagnosis and callable(diagnosis._candidates)


@pytest.mark.parametrize("share, cause", [(MIN_SHARE - 0.05, "unexplained"), (MIN_SHARE + 0.05, "planted-0")])
def test_a_cause_that_explains_only_part_of_the_deviation_is_not_named(monkeypatch, share, cause):
    """What is left after the prediction is within K units either way: only the share explained decides."""
    problem = _problem()
    outputs = _noisy(problem)
    _plant(monkeypatch, share)
    result = _judge(problem, outputs)
    assert result.status == "mismatch"
    assert _diff_src_causes(result) == [cause]


@pytest.mark.parametrize("rival, cause", [(1 - 1.8 * 0.03, "ambiguous"), (1 - 2.3 * 0.03, "planted-0")])
def test_a_rival_explaining_nearly_as_well_makes_the_hint_ambiguous(monkeypatch, rival, cause):
    """The best leaves 3% unexplained; a rival leaving 1.8x that is as good as it (neither is named), one leaving
    2.3x is not a rival (AMBIGUOUS = 2)."""
    problem = _problem()
    outputs = _noisy(problem)
    _plant(monkeypatch, 0.97, rival)
    hints = [h for o in _judge(problem, outputs).outputs if o.name == "diff_src" for h in o.comparison.diagnosis]
    assert [h.cause for h in hints] == [cause]
    if cause == "ambiguous":
        assert "planted-0, planted-1" in hints[0].text and "cannot tell them apart" in hints[0].text


def test_the_same_cause_twice_is_no_rival(monkeypatch):
    """Two hypotheses of one cause (e.g. two fitted epsilons) that explain equally: the cause is still named."""
    problem = _problem()
    outputs = _noisy(problem)

    def candidates(case):
        out = case.outputs["diff_src"]
        for share in (0.97, 0.97):
            yield Candidate("planted", Prediction(diff_src=out.reference + share * (out.actual - out.reference)),
                            lambda assessment: "planted")

    monkeypatch.setattr(diagnosis, "_candidates", candidates)
    assert _diff_src_causes(_judge(problem, outputs)) == ["planted"]


def test_an_unexplained_deviation_in_every_channel_says_every_channel():
    problem = _problem()
    hint = _judge(problem, _noisy(problem, peak_units=400.0)).outputs[0].comparison.diagnosis[-1]
    assert hint.cause == "unexplained" and hint.channels == tuple(range(6))
    assert "it fails in every channel" in hint.text and "6 of 6" not in hint.text


def test_an_unexplained_deviation_in_some_channels_counts_and_names_them():
    problem = _problem()
    hint = _judge(problem, _noisy(problem, channels=(1, 4), peak_units=400.0)).outputs[0].comparison.diagnosis[-1]
    assert hint.cause == "unexplained" and hint.channels == (1, 4)
    assert "it fails in 2 of 6 channels: c=1, 4" in hint.text and "every channel" not in hint.text


@pytest.mark.parametrize("channels, where", [((0, 1, 2, 3, 4, 5), "in every channel"), ((2, 3), "in 2 of 6 channels: c=2..3")])  # channels as ranges
def test_a_named_cause_says_every_channel_only_when_it_is_every_channel(channels, where):
    from tools import bugs

    problem = zoo.make_problem(np.random.default_rng(9), (4, 6, 12, 10), "NCX", np.float32, np.float32)
    outputs = bugs.kernel(problem, {"no_mean_dy": channels})
    result = compare_sets(outputs, zoo.bnbwd_outputs(problem), Judging(), inputs=zoo.inputs_of(problem))
    hint = next(o.comparison.diagnosis[0] for o in result.outputs if o.comparison.diagnosis)
    assert hint.cause == "mean-dy-not-subtracted" and hint.channels == channels
    assert where in hint.text and "6 of 6" not in hint.text, hint.text
