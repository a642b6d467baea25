"""What a failure says: the statistic that decided against its threshold, the same in every face; the verdict and
the hint first, a few lines per failing output (pytest, --brief, check); advice in the words of the face used."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import save_bundle

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES_PER_FAILING_OUTPUT = 15


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(16, 8, 12, 12)).astype(np.float32)
    dy = rng.normal(size=x.shape).astype(np.float32)
    inputs = dict(src=x, diff_dst=dy, mean=x.mean((0, 2, 3)), variance=x.var((0, 2, 3)), epsilon=1e-5,
                  data_format="NCHW", gamma=rng.normal(size=8).astype(np.float32))
    return inputs, bnbwd_cli.backward(**inputs)


def _one_channel_scaled(grads):
    d = grads["diff_src"].astype(np.float64)
    d[:, 3] *= 1 + 1.6e-6  # each element within K, the channel as a whole beyond its threshold
    return dict(grads, diff_src=d.astype(np.float32))


BUGS = {
    "diff_beta-mean": lambda g: dict(g, diff_beta=g["diff_beta"] / 2304),
    "everything-off": lambda g: {k: v * np.float32(1.01) + np.float32(1e-3) for k, v in g.items()},
    "one-channel-zero": lambda g: dict(g, diff_src=np.where(np.arange(8)[:, None, None] == 5, 0, g["diff_src"]).astype(np.float32)),
    "one-channel-scaled": _one_channel_scaled,
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_pytest_failure_is_a_few_lines_per_failing_output_verdict_first(problem, bug):
    inputs, grads = problem
    wrong = BUGS[bug](grads)
    with pytest.raises(AssertionError) as raised:
        bnbwd_cli.assert_backward_close(wrong, **inputs)
    report = bnbwd_cli.check(wrong, **inputs)
    lines = str(raised.value).splitlines()
    failing = [o.name for o in report.result.outputs if o.status == "mismatch"]
    assert failing and lines[0] == f"FAIL: numerical mismatch in {', '.join(failing)}"  # no exit code: no CLI here
    assert len(lines) <= MAX_LINES_PER_FAILING_OUTPUT * len(failing), "\n".join(lines)
    assert len(report.text.splitlines()) > len(lines)  # the full report is there, on request
    for name in failing:  # each failing output: its line with the failed test, then its hint
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{name}: FAIL "))
        assert re.search(r"(> K \d+|> threshold \S+)", lines[at]), lines[at]
        assert lines[at + 1].startswith("  hint: "), lines[at + 1]
    assert not re.search(r"--[a-z]", str(raised.value))  # the API has arguments, not flags


def test_every_face_shows_the_deciding_statistic_against_its_threshold(problem, tmp_path, cli):
    """A channel's own scale decided (the overall one is small): the text report, --brief, check's line and the
    JSON all name that channel's scale and its threshold."""
    inputs, grads = problem
    report = bnbwd_cli.check(_one_channel_scaled(grads), **inputs)
    diff_src = report.result.outputs[0].comparison
    test = diff_src.deciding
    assert (test.statistic, test.channel, test.passed) == ("systematic_scale", 3, False)
    assert abs(diff_src.bias.scale) < diff_src.bias.threshold  # overall: within; one channel: beyond
    said = f"systematic scale {test.value:+.1e} in c=3 > threshold {test.threshold:.1e}"
    assert said in report.summary and f"{said}: FAIL" in report.text
    case = save_bundle(tmp_path / "case.npz", {**inputs, **_one_channel_scaled(grads)})
    line = cli("check", case).stdout.splitlines()[0]
    assert f"diff_src FAIL {said}" in line, line
    document = __import__("json").loads(report.to_json())
    scale = next(t for t in document["outputs"][0]["comparison"]["criteria"] if t["statistic"] == "systematic_scale")
    assert (scale["channel"], scale["passed"], scale["threshold"]) == (3, False, test.threshold)


def test_tests_decide_exactly_the_verdict(problem):
    inputs, grads = problem
    for wrong in [grads, *(bug(grads) for bug in BUGS.values())]:
        for output in bnbwd_cli.check(wrong, **inputs).result.outputs:
            c = output.comparison  # the criteria (judge/criteria.py) against the statistics' own rule
            assert c.passed == (c.elements_passed and not c.bias_failed), c.criteria


def test_a_correct_kernel_reads_within_every_threshold(cli):
    """TF's own outputs: before, "z = 6.43" under a preamble that said 6 standard errors fail, and a PASS."""
    case = "fixtures/conformance/tf_nchw_f32_train"
    result = cli("run", ROOT / f"{case}.inputs.npz", "--spec", "tensorflow", "-q", "--reference",
                 ROOT / f"{case}.expected.npz", "--brief")
    assert result.exit_code == 0, result.output
    scales = re.findall(r"systematic scale \S+ (\S+) threshold", result.stdout)
    assert scales == ["<="] * 3, result.stdout
    assert result.stdout.startswith("PASS: 3 output(s) within tolerance\n")


def test_advice_in_the_words_of_each_face(problem, tmp_path, cli):
    """invstd under `variance`: the CLI says --variance-is-invstd, the API variance_is_invstd=True."""
    inputs, grads = problem
    invstd = dict(inputs, variance=(1 / np.sqrt(inputs["variance"].astype(np.float64) + 1e-5)).astype(np.float32))
    report = bnbwd_cli.check(grads, **invstd)
    assert "pass variance_is_invstd=True" in report.summary and "--variance" not in report.summary + report.text
    bundle = save_bundle(tmp_path / "in.npz", invstd)  # epsilon and data_format as 0-d entries
    kernel = save_bundle(tmp_path / "k.npz", grads)
    brief = cli("run", bundle, "-q", "--reference", kernel, "--brief")
    assert brief.exit_code == 1 and "pass --variance-is-invstd" in brief.stdout
    lines = brief.stdout.splitlines()
    assert lines[0].startswith("FAIL (exit 1)") and len(lines) <= 2 + 3 * MAX_LINES_PER_FAILING_OUTPUT


def test_no_guess_in_the_report_without_a_diagnosis(cli, tmp_path):
    """Without the inputs nothing is tested: the report points at the channel table and guesses nothing."""
    rng = np.random.default_rng(3)
    ref = {"diff_src": rng.normal(size=(2, 3, 4, 4)).astype(np.float32)}
    out = {"diff_src": ref["diff_src"].copy()}
    out["diff_src"][:, 1] += 1e-2
    result = cli("verify", save_bundle(tmp_path / "a.npz", out), save_bundle(tmp_path / "r.npz", ref), "--format", "NCHW")
    assert result.exit_code == 1 and "Channels with mismatches: 1 of 3" in result.stdout
    assert "hint" not in result.stdout and "?" not in result.stdout


def test_stored_wider_note_names_no_flag_in_the_api(problem):
    """float32 outputs that hold bfloat16 values: the note says how to judge them as bf16 in the face's own words."""
    inputs, grads = problem
    from bnbwd_cli.dtypes import BFLOAT16

    upcast = {k: v.astype(BFLOAT16).astype(np.float32) for k, v in grads.items()}
    report = bnbwd_cli.check(upcast, **inputs)
    causes = {h.cause for o in report.result.outputs for h in o.comparison.diagnosis}
    assert not report and "computed-narrower" in causes
    assert "save the bfloat16 tensor itself to judge it as bf16" in report.summary
    assert "--bf16" not in report.summary + report.text
