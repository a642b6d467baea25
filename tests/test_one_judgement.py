"""One judgement of a kernel for every face (issue 33): `run --reference`, `verify --inputs`, `check` and the API
take the same kernel outputs to the same verdict, exit code and JSON document (less who made it), and a kernel
that did not give an output fails (exit 3) in every one of them, naming it and how to judge fewer.

The verdict is decided before anything is printed: a stdout that cannot be written (/dev/full, a reader gone)
never changes run --reference's exit code (issue 35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.dtypes import BFLOAT16
from tests.conftest import make_inputs, save_bundle

ROOT = Path(__file__).resolve().parents[1]
FACE_FIELDS = ("tool", "actual", "reference")  # who made the document and what they call its two sides


def _problem(rng: np.random.Generator, dtype) -> tuple[dict, dict]:
    inputs = make_inputs(rng, (3, 4, 5, 2), data_format="NCX")
    inputs["src"], inputs["diff_dst"] = inputs["src"].astype(dtype), inputs["diff_dst"].astype(dtype)
    grads = bnbwd_cli.backward(**inputs, epsilon=1e-3, data_format="NCHW")
    return inputs, grads


def _kernels(rng: np.random.Generator) -> dict[str, tuple[dict, dict, dict, tuple[str, ...]]]:
    """name -> (inputs, the kernel's outputs as saved, as the API takes them, --bf16 keys)."""
    inputs, grads = _problem(rng, np.float32)
    wrong = dict(grads, diff_beta=grads["diff_beta"] * 1.5)  # a mismatch: diff_beta off by half
    bf16_inputs, bf16_grads = _problem(rng, BFLOAT16)
    as_bits = dict(bf16_grads, diff_src=bf16_grads["diff_src"].view(np.uint16))
    kernels = {
        "complete": (inputs, grads, grads, ()),
        "mismatch": (inputs, wrong, wrong, ()),
        "one-missing": (inputs, {k: v for k, v in grads.items() if k != "diff_gamma"},
                        {k: v for k, v in grads.items() if k != "diff_gamma"}, ()),
        "extra-key": (inputs, dict(grads, workspace=np.zeros(7, np.float32)), dict(grads, workspace=np.zeros(7)), ()),
        "bf16-as-uint16": (bf16_inputs, as_bits, bf16_grads, ("diff_src",)),
    }
    return kernels


def _same(document: dict) -> dict:
    return {key: value for key, value in document.items() if key not in FACE_FIELDS}


def _check_view(document: dict) -> dict:
    """What check's compact case entry holds of a comparison document: the verdict, the problems, and per output
    its status, criteria and hints (the comparison of a failing one)."""
    outputs = []
    for o in document["outputs"]:
        c = o["comparison"]
        entry = {"name": o["name"], "actual_key": o["actual_key"], "status": o["status"],
                 "criteria": c["criteria"] if c else [], "hints": c["hints"] if c else []}
        outputs.append(entry | {"comparison": c if c and not c["passed"] else None})
    return {"status": document["status"], "exit_code": document["exit_code"], "problems": document["problems"],
            "outputs": outputs}


EXPECTED = {"complete": ("pass", 0), "mismatch": ("mismatch", 1), "one-missing": ("structural", 3),
            "extra-key": ("pass", 0), "bf16-as-uint16": ("pass", 0)}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_face_gives_one_verdict_exit_code_and_document(cli, tmp_path, name):
    inputs, saved, given, bf16 = _kernels(np.random.default_rng(33))[name]
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=1e-3, data_format="NCHW")
    kernel = save_bundle(tmp_path / "kernel.npz", saved)
    bf16_flags = [flag for key in bf16 for flag in ("--bf16", key)]
    reference = tmp_path / "ref.npz"
    assert cli("run", bundle, "-q", "-o", reference).exit_code == 0

    documents, codes = {}, {}
    for face, args in (("run", ["run", bundle, "-q", "--reference", kernel]),
                       ("verify", ["verify", kernel, reference, "--inputs", bundle])):
        out = tmp_path / f"{face}.json"
        result = cli(*args, *bf16_flags, "--json", out)
        codes[face], documents[face] = result.exit_code, json.loads(out.read_text())
    report = bnbwd_cli.check(given, **inputs, epsilon=1e-3, data_format="NCHW")
    documents["api"] = json.loads(report.to_json())
    codes["api"] = documents["api"]["exit_code"]
    case = save_bundle(tmp_path / "case.npz", {**inputs, **saved}, epsilon=1e-3, data_format="NCHW")
    checked = cli("check", case, "--jobs", "1", *bf16_flags, "--json", tmp_path / "check.json")
    entry = json.loads((tmp_path / "check.json").read_text())["cases"][0]

    status, code = EXPECTED[name]
    assert codes == {"run": code, "verify": code, "api": code} and checked.exit_code == code, (codes, checked.output)
    assert documents["run"]["status"] == status and bool(report) == (status == "pass") and report.status == status
    assert _same(documents["run"]) == _same(documents["verify"]) == _same(documents["api"])
    view = _check_view(documents["api"])
    keys = view["outputs"][0].keys()
    assert {key: entry[key] for key in ("status", "exit_code", "problems")} == {k: view[k] for k in view if k != "outputs"}
    assert [{key: o[key] for key in keys} for o in entry["outputs"]] == view["outputs"]
    if name == "one-missing":  # named, with how to judge fewer, and the others still judged
        assert [p["message"] for p in documents["api"]["problems"]] == [
            "diff_gamma: missing from actual, the kernel's outputs; to judge only the outputs the kernel gave: "
            "--only diff_src,diff_beta"]
        assert [(o["status"], o["problem"]) for o in documents["api"]["outputs"]] == [
            ("pass", None), ("pass", None), ("structural", "missing")]
    if name == "extra-key":
        assert documents["api"]["notes"] == ["not compared: workspace (only in actual)"]


def test_judging_fewer_passes_in_every_face(cli, tmp_path):
    """--only (only= in the API) leaves a missing output out; run's --no-param-grads says it makes diff_src alone."""
    inputs, grads = _problem(np.random.default_rng(7), np.float32)
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=1e-3, data_format="NCHW")
    kernel = save_bundle(tmp_path / "kernel.npz", {"diff_src": grads["diff_src"]})
    reference = tmp_path / "ref.npz"
    assert cli("run", bundle, "-q", "-o", reference).exit_code == 0
    case = save_bundle(tmp_path / "case.npz", {**inputs, "diff_src": grads["diff_src"]}, epsilon=1e-3,
                       data_format="NCHW")
    for args in (["run", bundle, "-q", "--reference", kernel], ["verify", kernel, reference, "--inputs", bundle],
                 ["check", case, "--jobs", "1"]):
        assert cli(*args).exit_code == 3, args
        assert cli(*args, "--only", "diff_src").exit_code == 0, args
    assert cli("run", bundle, "-q", "--no-param-grads", "--reference", kernel).exit_code == 0
    assert bnbwd_cli.check({"diff_src": grads["diff_src"]}, **inputs, epsilon=1e-3, data_format="NCHW",
                           only="diff_src")
    with pytest.raises(AssertionError, match="diff_gamma: missing from actual, the kernel's outputs"):
        bnbwd_cli.assert_backward_close({"diff_src": grads["diff_src"]}, **inputs, epsilon=1e-3, data_format="NCHW")


def test_a_kernel_that_gave_no_output_is_an_input_error_in_every_face(cli, tmp_path):
    inputs, grads = _problem(np.random.default_rng(8), np.float32)
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=1e-3, data_format="NCHW")
    kernel = save_bundle(tmp_path / "kernel.npz", {"result": grads["diff_src"]})
    reference = tmp_path / "ref.npz"
    assert cli("run", bundle, "-q", "-o", reference).exit_code == 0
    message = ("no kernel outputs to judge: expected diff_src, diff_gamma or diff_beta (or a spec's name for them); "
               "--map result=diff_src reads result as it")
    for args in (["run", bundle, "-q", "--reference", kernel], ["verify", kernel, reference, "--inputs", bundle]):
        result = cli(*args)
        assert result.exit_code == 3 and result.stderr == f"error: {message}\n", (args, result.output)
    with pytest.raises(bnbwd_cli.InputError, match=r"^no kernel outputs to judge: expected diff_src"):
        bnbwd_cli.check({"result": grads["diff_src"]}, **inputs, epsilon=1e-3, data_format="NCHW")


# --------------------------------------------------------------------------- the verdict before the report


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", *args], cwd=ROOT, stderr=subprocess.PIPE, timeout=120,
                          **kwargs)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> tuple[str, str, str]:
    """(bundle, a passing kernel, a failing kernel)."""
    folder = tmp_path_factory.mktemp("report_path")
    inputs, grads = _problem(np.random.default_rng(35), np.float32)
    bundle = save_bundle(folder / "in.npz", inputs, epsilon=1e-3, data_format="NCHW")
    good = save_bundle(folder / "good.npz", grads)
    bad = save_bundle(folder / "bad.npz", dict(grads, diff_beta=grads["diff_beta"] * 1.5))
    return bundle, good, bad


@pytest.mark.parametrize("which, code", [("good", 0), ("bad", 1)])
def test_run_reference_exits_with_the_verdict_when_stdout_is_full(kernels, which, code):
    bundle, good, bad = kernels
    with open("/dev/full", "w") as full:
        result = _run(["run", bundle, "--reference", good if which == "good" else bad], stdout=full)
    assert result.returncode == code, result.stderr
    assert f"exit code {code} is the verdict's" in result.stderr.decode()


@pytest.mark.parametrize("which, code", [("good", 0), ("bad", 1)])
def test_run_reference_exits_with_the_verdict_when_the_reader_is_gone(kernels, which, code):
    """`| head -c 1`: the reader takes a byte and goes; the report is cut short, the exit code is the verdict's."""
    bundle, good, bad = kernels
    command = [sys.executable, "-m", "bnbwd_cli", "run", bundle, "--reference", good if which == "good" else bad,
               "--verbose"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert len(process.stdout.read(1)) == 1
        process.stdout.close()
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=120) == code, stderr


@pytest.mark.parametrize("which, code", [("good", 0), ("bad", 1)])
def test_run_reference_exits_with_the_verdict_when_stdout_is_closed(kernels, which, code):
    bundle, good, bad = kernels
    result = _run(["run", bundle, "--reference", good if which == "good" else bad], stdout=subprocess.DEVNULL,
                  preexec_fn=lambda: os.close(1))  # `>&-`
    assert result.returncode == code, result.stderr
