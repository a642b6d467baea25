"""The Python API (bnbwd_cli.backward/check/assert_backward_close): verdicts, errors, and agreement with the CLI."""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli import api
from tests.conftest import make_inputs, save_bundle

EPS = 1e-5
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def problem(rng):
    """NCHW f32 inputs with gamma (as the API takes them) and bnbwd's outputs for them."""
    inputs = make_inputs(rng, (4, 6, 5, 7))
    inputs.pop("beta")
    kwargs = dict(inputs, epsilon=EPS, data_format="NCHW")
    return kwargs, bnbwd_cli.backward(**kwargs)


def test_doctests_run():
    result = doctest.testmod(api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 20 and result.failed == 0


def test_import_is_light():
    code = "import sys, bnbwd_cli; print(sorted(m for m in ('numpy', 'click', 'rich', 'bnbwd_cli.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert callable(bnbwd_cli.check) and "backward" in dir(bnbwd_cli)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bnbwd_cli.nope


def test_backward_equals_the_cli_bit_for_bit(cli, tmp_path, problem):
    kwargs, grads = problem
    bundle = save_bundle(tmp_path / "in.npz", {k: kwargs[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")})
    result = cli("run", bundle, "--epsilon", EPS, "--format", "NCHW", "-q", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "out.npz") as written:
        for name in ("diff_src", "diff_gamma", "diff_beta"):
            assert grads[name].dtype == written[name].dtype and np.array_equal(grads[name], written[name]), name


def test_backward_nxc_without_gamma_and_bf16(rng):
    inputs = make_inputs(rng, (3, 4, 5), data_format="NXC")
    src = inputs["src"].astype(ml_dtypes.bfloat16)
    dy = inputs["diff_dst"].astype(ml_dtypes.bfloat16)
    grads = bnbwd_cli.backward(src, dy, inputs["mean"], inputs["variance"], epsilon=EPS, data_format="NXC")
    assert grads["diff_src"].dtype == ml_dtypes.bfloat16 and grads["diff_src"].shape == (3, 4, 5)
    assert grads["diff_gamma"].dtype == np.float32 and grads["diff_beta"].shape == (5,)
    reference = bnbwd_cli.backward(src.astype(np.float64), dy.astype(np.float64), inputs["mean"].astype(np.float64),
                                   inputs["variance"].astype(np.float64), epsilon=EPS, data_format="NXC")
    np.testing.assert_allclose(grads["diff_beta"], reference["diff_beta"], rtol=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"mean": np.zeros(5, np.float32)}, r"mean has shape \(5,\), expected \(6,\) = C of src \(NCX\)"),
    ({"diff_dst": np.zeros((4, 6, 5, 6), np.float32)}, r"diff_dst has shape \(4, 6, 5, 6\), expected \(4, 6, 5, 7\)"),
    ({"src": np.zeros((4, 6, 5), np.float32)}, r"data_format NCHW needs rank 4|rank"),
    ({"variance": -np.ones(6, np.float32)}, r"variance at c=0 is -1.0, expected >= 0"),
    ({"epsilon": 0.0}, r"epsilon is 0.0, expected a finite number > 0"),
], ids=["mean-C", "diff_dst-shape", "rank", "negative-variance", "epsilon"])
def test_bad_inputs_raise_value_error(problem, change, message):
    kwargs, grads = problem
    bad = {**kwargs, **change}
    with pytest.raises(ValueError, match=message):
        bnbwd_cli.backward(**bad)
    with pytest.raises(ValueError, match=message):
        bnbwd_cli.check(grads, **bad)


def test_check_passes_a_correct_float32_kernel(problem):
    kwargs, grads = problem
    x, dy = kwargs["src"], kwargs["diff_dst"]
    shape, m = (1, -1, 1, 1), x.size // x.shape[1]
    invstd = (1 / np.sqrt(kwargs["variance"] + np.float32(EPS))).astype(np.float32)
    xhat = (x - kwargs["mean"].reshape(shape)) * invstd.reshape(shape)
    dbeta, dgamma = dy.sum(axis=(0, 2, 3)), (dy * xhat).sum(axis=(0, 2, 3))
    dx = (kwargs["gamma"] * invstd).reshape(shape) * (dy - dbeta.reshape(shape) / m - xhat * dgamma.reshape(shape) / m)
    kernel = {"diff_src": dx.astype(np.float32), "diff_gamma": dgamma, "diff_beta": dbeta}
    assert not all(np.array_equal(kernel[k], grads[k]) for k in kernel)  # a real kernel, not bnbwd's own bits
    report = bnbwd_cli.check(kernel, **kwargs)
    assert report and report.status == "pass" and "PASS: 3 output(s) within tolerance" in report.text
    assert bnbwd_cli.assert_backward_close(kernel, **kwargs).status == "pass"
    document = json.loads(report.to_json())
    assert document["status"] == "pass" and document["inputs_known"] is True


def test_check_fails_a_wrong_kernel_with_the_report_text(problem):
    kwargs, grads = problem
    wrong = dict(grads, diff_src=grads["diff_src"] * np.float32(1.001))
    report = bnbwd_cli.check(wrong, **kwargs)
    assert not report and report.status == "mismatch"
    assert "FAIL: numerical mismatch in diff_src" in report.text and "(exit" not in report.text  # the CLI's words
    with pytest.raises(AssertionError) as raised:
        bnbwd_cli.assert_backward_close(wrong, **kwargs)
    message = str(raised.value)
    assert message.startswith("FAIL: numerical mismatch in diff_src\n") and report.summary in message
    assert message.splitlines()[-1] == "full report: bnbwd_cli.check(...).text"
    assert json.loads(report.to_json())["exit_code"] == 1


def test_check_aliases_map_extra_keys_and_wrong_output_shape(problem):
    kwargs, grads = problem
    tf_names = {"x_backprop": grads["diff_src"], "scale_backprop": grads["diff_gamma"], "dbeta": grads["diff_beta"],
                "loss": np.float32(0.5)}
    report = bnbwd_cli.check(tf_names, key_map={"dbeta": "diff_beta"}, **kwargs)
    assert report, report.text
    assert [o.name for o in report.result.outputs] == ["x_backprop=diff_src", "scale_backprop=diff_gamma", "dbeta=diff_beta"]
    assert "note: not compared: loss (only in actual)" in report.text
    transposed = bnbwd_cli.check({"diff_src": grads["diff_src"].transpose(0, 2, 3, 1)}, **kwargs)
    assert not transposed and transposed.status == "structural"
    assert "actual looks like the NHWC transpose of reference (NCHW)" in transposed.text
    with pytest.raises(ValueError, match="no kernel outputs to judge"):
        bnbwd_cli.check({"dx": grads["diff_src"]}, **kwargs)


@pytest.mark.parametrize("change", ["none", "scale", "one-element", "diff_beta-over-M"])
def test_api_verdict_equals_the_cli(cli, tmp_path, problem, change):
    kwargs, grads = problem
    outputs = dict(grads)
    if change == "scale":
        outputs["diff_src"] = (outputs["diff_src"] * np.float32(1 + 3e-6)).astype(np.float32)
    elif change == "one-element":
        outputs["diff_src"] = outputs["diff_src"].copy()
        outputs["diff_src"][1, 2, 3, 4] += np.float32(1e-3)
    elif change == "diff_beta-over-M":
        outputs["diff_beta"] = outputs["diff_beta"] / np.float32(140)
    bundle = save_bundle(tmp_path / "in.npz", {k: kwargs[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")})
    kernel = save_bundle(tmp_path / "kernel.npz", outputs)
    result = cli("run", bundle, "--epsilon", EPS, "--format", "NCHW", "-q", "--reference", kernel, "--json", "-")
    from_cli = json.loads(result.stdout)
    from_api = json.loads(bnbwd_cli.check(outputs, **kwargs).to_json())
    assert result.exit_code == from_api["exit_code"]
    assert from_api["status"] == ("pass" if change == "none" else "mismatch")
    for document in (from_cli, from_api):
        for row in document["outputs"]:
            row["comparison"].pop("worst", None)  # identical too, but labelled by file; the verdict is what matters
    assert [(o["name"], o["status"], o["comparison"]["max_units"]) for o in from_cli["outputs"]] == \
           [(o["name"], o["status"], o["comparison"]["max_units"]) for o in from_api["outputs"]]


# numba's own settings keep it from starting (NUMBA_NUM_THREADS=0 fails its import); AUTO_NUMBA_MIN_ELEMENTS = 0
# sends a small problem where a large one goes. The CLI prints a note; the API was silent.
NUMBA_FALLBACK_SCRIPT = """
import json, warnings
import numpy as np
import bnbwd_cli
from bnbwd_cli import runtime
runtime.AUTO_NUMBA_MIN_ELEMENTS = 0
rng = np.random.default_rng(3)
x = rng.normal(size=(4, 3, 5, 5)).astype(np.float32)
dy = rng.normal(size=x.shape).astype(np.float32)
inputs = dict(src=x, diff_dst=dy, mean=x.mean((0, 2, 3)), variance=x.var((0, 2, 3)), epsilon=1e-5, data_format="NCHW")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    grads = bnbwd_cli.backward(**inputs)
    report = bnbwd_cli.check(grads, **inputs)
    bnbwd_cli.backward(**inputs)
print(json.dumps([[w.category.__name__, str(w.message), w.filename] for w in caught]))
print(bool(report), grads["diff_src"].tobytes() == bnbwd_cli.backward(**inputs).get("diff_src").tobytes())
"""


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")
def test_the_api_warns_once_when_numba_cannot_start(tmp_path):
    env = {**os.environ, "NUMBA_NUM_THREADS": "0", "BNBWD_CORE": "", "PYTHONPATH": str(ROOT)}
    script = tmp_path / "user_test.py"
    script.write_text(NUMBA_FALLBACK_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    caught, verdict = result.stdout.splitlines()
    [(category, message, filename)] = json.loads(caught)  # once, for three calls
    assert category == "NumbaFallbackWarning" and issubclass(bnbwd_cli.NumbaFallbackWarning, UserWarning)
    assert message.startswith("bnbwd: numba cannot start here (") and message.endswith(
        "the NumPy core ran instead (the same bits, slower)")
    assert filename == str(script)  # the warning points at the caller's line, not bnbwd's
    assert verdict == "True True"
