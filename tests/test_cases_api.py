"""`bnbwd_cli.cases()`: the suite of `bnbwd cases` in Python, and the generated cases of --seed/--count.

The cases in memory are the files' arrays (compared with what the real CLI writes), a correct NumPy kernel
(tools/zoo.py) passes the generated ones in every dtype, a planted bug fails through case.check and
case.assert_close, and bad arguments are one InputError (API) or a usage error (CLI).
"""

from __future__ import annotations

import json
import shlex
import traceback

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.app import cases as app_cases
from tests.conftest import assert_one_error
from tests.test_cases import problem_from_bundle
from tools import bugs, zoo


def _problem(case: bnbwd_cli.Case) -> dict:
    return problem_from_bundle({**case.inputs, "epsilon": np.array(case.epsilon),
                                "data_format": np.array(case.data_format)})


@pytest.mark.parametrize("dtype, fmt", [("f32", "NCX"), ("bf16", "NXC")])
def test_the_cases_hold_the_arrays_the_files_hold(tmp_path, cli, dtype, fmt):
    """The same settings through the CLI and the API: the same cases, in order, with equal arrays and settings."""
    args = ("--preset", "tiny", "--dtype", dtype, "--format", fmt, "--seed", "5", "--count", "4")
    assert cli("cases", *args, "-o", tmp_path / "suite").exit_code == 0
    manifest = json.loads((tmp_path / "suite" / app_cases.MANIFEST_JSON).read_text())
    suite = bnbwd_cli.cases("tiny", dtype, data_format=fmt, seed=5, count=4)
    assert [str(case) for case in suite] == [entry["name"] for entry in manifest["cases"]]
    assert [str(case) for case in suite][-4:] == [f"seed5_{i:04d}" for i in range(4)]
    for case, entry in zip(suite, manifest["cases"]):
        with np.load(tmp_path / "suite" / entry["file"]) as archive:
            stored = {key: archive[key] for key in archive.files}
        assert sorted(case.inputs) == ["diff_dst", "gamma", "mean", "src", "variance"]
        for name, array in case.inputs.items():
            expected = stored[name].view(array.dtype) if stored[name].dtype.kind == "V" else stored[name]
            assert array.dtype == expected.dtype and array.tobytes() == expected.tobytes(), (str(case), name)
        assert (case.epsilon, case.data_format, case.is_training) == (float(stored["epsilon"]),
                                                                       str(stored["data_format"]), True)
        assert list(case.shape[:1]) == entry["shape"][:1] and list(case.targets) == entry["targets"]


def test_generated_cases_are_deterministic_and_grow_by_count():
    ten = bnbwd_cli.cases("tiny", seed=3, count=10)
    thirty = bnbwd_cli.cases("tiny", seed=3, count=30)
    assert [str(c) for c in ten] == [str(c) for c in thirty[:len(ten)]]
    for a, b in zip(ten[-10:], thirty[-30:-20]):
        assert a.shape == b.shape and a.inputs["src"].tobytes() == b.inputs["src"].tobytes()
    other = bnbwd_cli.cases("tiny", seed=4, count=10)[-10:]
    assert [c.shape for c in other] != [c.shape for c in ten[-10:]]
    shapes = [c.shape for c in bnbwd_cli.cases("tiny", seed=9, count=60, max_elements=500)[-60:]]
    assert all(np.prod(s) <= 500 and np.prod(s) // s[1] >= 2 for s in shapes)  # the cap, and M >= 2
    assert {len(s) for s in shapes} == {2, 3, 4, 5}
    assert {len(c.shape) for c in bnbwd_cli.cases("tiny", data_format="NHWC", count=12)} == {4}


@pytest.mark.parametrize("dtype, fmt", [("f32", "NXC"), ("bf16", "NCX"), ("f16", "NXC")])
def test_a_correct_kernel_passes_the_generated_cases(dtype, fmt):
    suite = bnbwd_cli.cases("tiny", dtype, data_format=fmt, seed=11, count=25, max_elements=3000)[-25:]
    for case in suite:
        report = case.assert_close(zoo.kernel(_problem(case), "blocked"))
        assert report.status == "pass"


def test_a_planted_bug_fails_through_check_and_assert_close():
    case = next(c for c in bnbwd_cli.cases() if str(c) == "gamma_near_one")
    outputs = bugs.kernel(_problem(case), {"gamma": "twice"})
    report = case.check(outputs)
    assert report.status == "mismatch" and "gamma" in report.summary
    with pytest.raises(AssertionError, match=r"^FAIL: numerical mismatch"):
        case.assert_close(outputs)
    assert case.check({"dx": outputs["diff_src"]}, key_map={"dx": "diff_src"}).status == "structural"  # two missing
    assert case.check({"dx": outputs["diff_src"]}, key_map={"dx": "diff_src"}, only="dx").status == "mismatch"


def test_the_inputs_cannot_be_changed_by_a_kernel():
    case = bnbwd_cli.cases("tiny")[0]
    with pytest.raises(ValueError, match="read-only"):
        case.inputs["src"][0] = 0


def test_assert_helpers_hide_their_frames_from_pytest():
    case = bnbwd_cli.cases("tiny")[0]
    try:
        case.assert_close({"diff_beta": np.zeros(case.shape[1], np.float32)})
    except AssertionError as exc:
        frames = traceback.walk_tb(exc.__traceback__)
        ours = {frame.f_code.co_name: frame.f_locals.get("__tracebackhide__") for frame, _ in frames
                if frame.f_code.co_filename.endswith("bnbwd_cli/api.py")}
    assert ours == {"assert_close": True, "assert_backward_close": True}


@pytest.mark.parametrize("arguments, message", [
    ({"dtype": "f64"}, r"dtype is 'f64', expected one of f32, bf16, f16"),
    ({"preset": "huge"}, r"preset is 'huge', expected one of default, tiny, resnet50"),
    ({"count": -1}, r"count is -1, expected an integer >= 0"),
    ({"seed": 1.5}, r"seed is 1.5, expected an integer >= 0"),
    ({"data_format": "NCWH"}, r"NCWH"),
    ({"count": 2, "max_elements": 10}, r"max_elements 10: expected at least 64"),
])
def test_bad_arguments_are_one_input_error(arguments, message):
    with pytest.raises(bnbwd_cli.InputError, match=message):
        bnbwd_cli.cases(**arguments)


@pytest.mark.parametrize("flags", [("--count", "-1"), ("--seed", "x"), ("--max-elements", "10")])
def test_bad_cli_counts_are_usage_errors(cli, tmp_path, flags):
    result = cli("cases", *flags, "-o", tmp_path / "s")
    assert result.exit_code == 2 and flags[0] in result.output, result.output
    assert not (tmp_path / "s").exists()


def test_cases_ends_with_the_check_command_that_judges_the_suite(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("cases", "--preset", "tiny", "--count", "3", "--max-elements", "512", "-o", "my suite")
    assert result.exit_code == 0, result.output
    command = shlex.split(result.output.splitlines()[-1])
    assert command == ["bnbwd", "check", "my suite"]
    for case in bnbwd_cli.cases("tiny", count=3, max_elements=512):
        np.savez(tmp_path / "my suite" / f"{case}.out.npz", **zoo.kernel(_problem(case), "blocked"))
    judged = cli(*command[1:])
    assert judged.exit_code == 0 and judged.output.count("PASS ") == len(bnbwd_cli.cases("tiny", count=3)), judged.output


def test_a_bad_layout_name_is_one_error_line(cli, tmp_path):
    assert cli("cases", "--format", "NCWH", "-o", tmp_path / "s").exit_code == 2
    assert_one_error(cli("cases", "--count", "1", "--max-bytes", "10", "-o", tmp_path / "s"), r"no case fits")


def test_readme_pytest_example_runs_with_a_stand_in_for_torch(monkeypatch):
    """README's parametrized test, run on a few cases with a stand-in `torch` (NumPy arrays, zoo's correct kernel
    for aten's backward): the names it uses exist and its three lines judge a kernel's tuple of outputs."""
    import re
    import sys
    import types
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Test suites for your kernel"):readme.index("## Exit codes")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    calls = []

    def native_batch_norm_backward(dy, x, gamma, running_mean, running_var, mean, invstd, train, eps, mask):
        calls.append(eps)
        variance = 1 / np.asarray(invstd, np.float64) ** 2 - eps
        problem = {"src": np.asarray(x), "diff_dst": np.asarray(dy), "mean": np.asarray(mean),
                   "variance": variance.astype(np.float32), "gamma": np.asarray(gamma), "epsilon": eps,
                   "data_format": "NCX"}
        out = zoo.kernel(problem, "blocked")
        return out["diff_src"], out["diff_gamma"], out["diff_beta"]

    class Tensor(np.ndarray):
        def rsqrt(self):
            return (1 / np.sqrt(self)).view(Tensor)

    torch = types.ModuleType("torch")
    torch.tensor = lambda array, device=None: np.array(array).view(Tensor)
    torch.ops = types.SimpleNamespace(aten=types.SimpleNamespace(native_batch_norm_backward=native_batch_norm_backward))
    monkeypatch.setitem(sys.modules, "torch", torch)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    test = namespace["test_batch_norm_backward"]
    parameters = test.pytestmark[0].args
    assert parameters[0] == "case" and [str(c) for c in parameters[1]] == [str(c) for c in bnbwd_cli.cases()]
    for case in parameters[1][:4]:
        test(case)
    assert len(calls) == 4

