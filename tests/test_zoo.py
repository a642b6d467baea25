"""The judge against a zoo of kernels: every correct kernel passes, every planted bug fails.

Correct kernels are NumPy emulations of float32 kernels with the accumulation orders real ones use
(tools/zoo.py), for f32, f16 and bf16 data, f32 and bf16 parameters, both layouts, M from 1 to 1e5;
the truth side is bnbwd's own output (what `run --reference` compares with). Framework kernels
(PyTorch, TensorFlow) are the conformance fixtures, judged through the real CLI. The calibration
that sets K is tools/calibrate_tolerances.py (docs/tolerances.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main
from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.judge import diagnosis as judge_diagnosis
from tests.oracle import backward_arrays
from tools import zoo

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
TYPES = {"f32": (F32, F32), "f16": (F16, F32), "bf16": (zoo.BF16, F32), "bf16-params": (zoo.BF16, zoo.BF16)}
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"


def _problem(m: int, fmt: str, types: str, seed: int = 0, **kwargs) -> dict:
    t1, t2 = TYPES[types]
    return zoo.make_problem(np.random.default_rng(seed), zoo.shape_for(m, 8, fmt), fmt, t1, t2, **kwargs)


def _truth(problem: dict) -> dict:
    result = backward_arrays(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
                                epsilon=problem["epsilon"], data_format=problem["data_format"], core="numpy")
    return {"diff_src": result.diff_src, "diff_gamma": result.diff_gamma, "diff_beta": result.diff_beta}


def _judge(problem: dict, outputs: dict, truth: dict | None = None):
    return compare_sets(outputs, truth or _truth(problem), Judging(), inputs=zoo.inputs_of(problem))


def _verdict(problem: dict, outputs: dict, truth: dict | None = None):
    """_judge without the diagnosis: the verdict is the comparisons' alone (SetComparison.status), and the
    diagnosis, which only names a cause, costs several times the judging on a failing 1e5-element output. The
    causes are tested where they are named (test_hints_* here, tests/test_judge_diagnosis.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(judge_diagnosis, "diagnose", lambda *args: {})
        return _judge(problem, outputs, truth)


GRID = [(m, fmt, types) for m in (1, 7, 1000, 100_000) for fmt in ("NCX", "NXC") for types in TYPES]


@pytest.mark.parametrize("m, fmt, types", GRID, ids=[f"M{m}-{f}-{t}" for m, f, t in GRID])
def test_correct_kernels_pass(m, fmt, types):
    problem = _problem(m, fmt, types)
    truth = _truth(problem)
    for order in zoo.ORDERS:
        result = _judge(problem, zoo.kernel(problem, order), truth)
        assert result.status == "pass", f"{order}: " + "; ".join(
            f"{o.name} {o.comparison.max_units.value:.3g} units, bias {o.comparison.bias}" for o in result.outputs)
        worst = max(o.comparison.max_units.value for o in result.outputs)
        assert worst < 2.0, f"{order}: {worst:.3g} units: the calibration margin (docs/tolerances.md) has shrunk"


def test_correct_kernel_on_hard_data_passes():
    """|mean|/sd ~ 1e3 and diff_dst with a large common offset: sums that cancel, partial sums that drift."""
    for kwargs in ({"center": 1e3}, {"dy_offset": 100.0}):
        for fmt in ("NCX", "NXC"):
            problem = _problem(20_000, fmt, "f32", **kwargs)
            result = _judge(problem, zoo.kernel(problem, "sequential"))
            assert result.status == "pass", (kwargs, fmt, [(o.name, o.comparison.max_units.value) for o in result.outputs])


# Coarse data: diff_dst = offset + N(0, 1) in f16/bf16 takes a few distinct values, so a correct
# kernel's constant sum error flips the rounding of whole bands of elements together (the bias
# check's standard error must be cluster-robust). These failed on the bias check before it was.
COARSE = [("f16", "NXC", "sequential"), ("bf16", "NCX", "blocked"), ("bf16", "NXC", "sequential"),
          ("bf16-params", "NXC", "sequential"), ("bf16-params", "NXC", "float64-combine")]


@pytest.mark.parametrize("types, fmt, order", COARSE, ids=["-".join(c) for c in COARSE])
def test_correct_kernels_on_coarse_offset_data_pass(types, fmt, order):
    problem = _problem(100_000, fmt, types, seed=4, dy_offset=100.0)
    result = _judge(problem, zoo.kernel(problem, order))
    assert result.status == "pass", [(o.name, o.comparison.max_units.value, o.comparison.bias) for o in result.outputs]


@pytest.fixture(scope="module")
def correlated_problems():
    """diff_dst = offset + N(0, 1) at M ~ 2e5: a float32 accumulator's roundings all go one way.
    (bf16 at offset 1000: diff_dst takes ~5 values per channel; a larger offset makes it constant.)"""
    return {"f32": _problem(200_000, "NXC", "f32", seed=5, dy_offset=3000.0),
            "bf16": _problem(200_000, "NXC", "bf16", seed=5, dy_offset=1000.0)}


@pytest.mark.parametrize("types", ["f32", "bf16"])
def test_correct_kernels_with_correlated_rounding_pass(types, correlated_problems):
    """A sequential float32 sum is off by ~50-100 units of the independent-rounding model here
    (what PyTorch's channels_last CPU kernel does); the model runs that order itself."""
    problem = correlated_problems[types]
    truth = _truth(problem)
    for order in zoo.ORDERS:
        result = _judge(problem, zoo.kernel(problem, order), truth)
        assert result.status == "pass", (order, [(o.name, o.comparison.max_units.value, o.comparison.bias)
                                                 for o in result.outputs])


@pytest.mark.parametrize("bug", ["bf16-accumulation", "missing-1/M", "sign-flip-one-channel", "inference-in-training"])
def test_bugs_with_correlated_rounding_still_fail(bug, correlated_problems):
    """(Not epsilon-1e-3 here: on this data it moves bf16 outputs by ~0.03 ulp, and with ~5 distinct
    diff_dst values per channel no test can tell that from a correct kernel's band roundings.)"""
    problem = correlated_problems["bf16"]
    result = _verdict(problem, zoo.kernel(problem, bug=bug))
    assert result.status == "mismatch", [(o.name, o.comparison.max_units.value, o.comparison.bias) for o in result.outputs]


# (bug, the smallest M at which it changes the result beyond a correct kernel's noise)
BUGS = [("missing-1/M", 7), ("sign-flip-one-channel", 7), ("per-sample-stats", 7), ("inference-in-training", 1),
        ("epsilon-1e-3", 1000), ("unbiased-variance", 1000), ("bf16-accumulation", 7)]
BUG_GRID = [(bug, m, fmt, types) for bug, m_min in BUGS for m in (7, 1000, 100_000) if m >= m_min
            for fmt in ("NCX", "NXC") for types in TYPES if not (bug == "bf16-accumulation" and m == 100_000 and types != "f32")]


@pytest.mark.parametrize("bug, m, fmt, types", BUG_GRID, ids=[f"{b}-M{m}-{f}-{t}" for b, m, f, t in BUG_GRID])
def test_planted_bugs_fail(bug, m, fmt, types):
    problem = _problem(m, fmt, types, seed=1)
    result = _verdict(problem, zoo.kernel(problem, "sequential", bug=bug))
    assert result.status == "mismatch", [(o.name, o.comparison.max_units.value, o.comparison.bias) for o in result.outputs]


@pytest.mark.parametrize("types", ["f32", "bf16", "bf16-params"])
def test_nhwc_processed_as_nchw_fails(types):
    t1, t2 = TYPES[types]
    problem = zoo.make_problem(np.random.default_rng(2), (4, 8, 8, 8), "NXC", t1, t2)  # C == H
    assert _verdict(problem, zoo.kernel(problem, bug="nhwc-as-nchw")).status == "mismatch"


@pytest.mark.parametrize("types", ["bf16", "bf16-params"])
@pytest.mark.parametrize("bug", ["epsilon-1e-3", "unbiased-variance"])
def test_bf16_small_deviations_fail_as_systematic_at_resnet_size(types, bug):
    """Each element within an ulp or so; the channel as a whole is scaled: the bias check catches it."""
    problem = _problem(100_000, "NXC", types, seed=3)
    result = _verdict(problem, zoo.kernel(problem, bug=bug))
    diff_src = next(o.comparison for o in result.outputs if o.name == "diff_src")
    assert diff_src.bias_failed and diff_src.bias.scale < 0, diff_src.bias


def test_truth_can_be_the_exact_float64_result():
    """verify --inputs against the float64 oracle's outputs: still passes a correct bf16 kernel."""
    problem = _problem(1000, "NCX", "bf16")
    assert _judge(problem, zoo.kernel(problem), zoo.exact_outputs(problem)).status == "pass"


MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]


@pytest.mark.parametrize("entry", MANIFEST, ids=[c["name"] for c in MANIFEST])
def test_framework_kernels_pass_run_reference(entry, tmp_path):
    """PyTorch's and TensorFlow's own outputs, judged by `bnbwd run INPUTS --reference THEIRS`."""
    result = CliRunner().invoke(main, ["run", str(FIXTURES / entry["bundle"]), *entry["bnbwd_args"], "-q",
                                       "--reference", str(FIXTURES / entry["expected"]), "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {o["comparison"]["rule"] for o in document["outputs"]} == {"scaled"}


HINTS = [("missing-1/M", "missing-1/M", "missing 1/M"), ("inference-in-training", "inference-backward", "inference-style"),
         ("epsilon-1e-3", "epsilon", "an epsilon of 0.001 (you passed 1e-05)"),
         ("unbiased-variance", "unbiased-variance", "an unbiased variance"),
         ("sign-flip-one-channel", "sign-flip", "sign flipped in channel(s) c=0:")]


@pytest.mark.parametrize("bug, cause, text", HINTS, ids=[h[0] for h in HINTS])
def test_hints_name_the_planted_bug(bug, cause, text):
    """(tests/test_judge_diagnosis.py plants every bug family; these are the zoo's own bugs.)"""
    problem = _problem(1000, "NXC", "f32", seed=1)
    result = _judge(problem, zoo.kernel(problem, bug=bug))
    hints = [h for o in result.outputs for h in o.comparison.diagnosis]
    assert {h.cause for h in hints} == {cause} and all(text in h.text for h in hints), hints


def test_no_hints_for_a_correct_kernel():
    problem = _problem(1000, "NCX", "bf16", seed=1)
    result = _judge(problem, zoo.kernel(problem, "blocked"))
    assert all(not o.comparison.hints for o in result.outputs)


def test_nhwc_as_nchw_hint():
    problem = zoo.make_problem(np.random.default_rng(2), (4, 8, 8, 8), "NXC", F32, F32)
    result = _judge(problem, zoo.kernel(problem, bug="nhwc-as-nchw"))
    hints = next(o.comparison.diagnosis for o in result.outputs if o.name == "diff_src")
    assert [h.cause for h in hints] == ["layout-mixup"] and "read the NHWC tensors as NCHW" in hints[0].text, hints
