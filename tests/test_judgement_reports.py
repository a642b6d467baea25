"""--junit and --markdown on `run --reference` and `verify`: the judgement of one kernel as CI's reports, a suite
of one case (the kernel's file) rendered as check's are, named after the command; vetted by the rule every
output follows (cli/destinations.vet_outputs)."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_one_error

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """bn1's inputs (PyTorch's names), its kernel's outputs, the same with rows h >= 4 of diff_src off, without
    grad_bias, and bnbwd's own outputs (verify's REFERENCE)."""
    shutil.copyfile(CASES / "bn1.npz", tmp_path / "bundle.npz")
    with np.load(CASES / "bn1.out.npz") as archive:
        good = dict(archive)
    bad = dict(good, grad_input=good["grad_input"].copy())
    bad["grad_input"][:, :, 4:, :] *= 1.01
    np.savez(tmp_path / "good.npz", **good)
    np.savez(tmp_path / "bad.npz", **bad)
    np.savez(tmp_path / "partial.npz", **{k: v for k, v in good.items() if k != "grad_bias"})
    return {name: tmp_path / f"{name}.npz" for name in ("bundle", "good", "bad", "partial")}


def _suite(xml_text: str) -> ElementTree.Element:
    root = ElementTree.fromstring(xml_text)
    assert root.tag == "testsuites" and len(root) == 1
    return root[0]


def test_run_reference_writes_junit_and_markdown_of_its_verdict(cli, files, tmp_path):
    result = cli("run", files["bundle"], "-q", "--reference", files["bad"], "--junit", tmp_path / "r.xml",
                 "--markdown", tmp_path / "r.md")
    assert result.exit_code == 1, result.output
    suite = _suite((tmp_path / "r.xml").read_text())
    assert suite.get("name") == "bnbwd run" and (suite.get("tests"), suite.get("failures"), suite.get("errors")) == (
        "1", "1", "0")
    [case] = suite.findall("testcase")
    assert case.get("name") == str(files["bad"]) and case.get("classname") == "bnbwd.run"
    failure = case.find("failure")
    assert failure.get("message").startswith(f"FAIL  {files['bad']}: ") and "diff_src FAIL" in failure.get("message")
    assert "where: h=4..5" in failure.text  # the brief report, where included
    markdown = (tmp_path / "r.md").read_text().splitlines()
    assert markdown[0] == "### ❌ bnbwd run" and markdown[2] == f"FAIL (exit 1): 1 case(s), 1 failed: {files['bad']}"
    assert markdown[-1].startswith("1 case(s): 1 mismatch")


def test_run_reference_junit_on_stdout_sends_the_report_to_stderr(cli, files):
    result = cli("run", files["bundle"], "--reference", files["good"], "--junit", "-")
    assert result.exit_code == 0, result.output
    suite = _suite(result.stdout)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("1", "0", "0")
    assert "PASS: 3 output(s) within tolerance" in result.stderr


def test_a_structural_problem_is_a_junit_error(cli, files, tmp_path):
    result = cli("run", files["bundle"], "-q", "--reference", files["partial"], "--junit", tmp_path / "r.xml")
    assert result.exit_code == 3
    [case] = _suite((tmp_path / "r.xml").read_text()).findall("testcase")
    assert case.find("error") is not None and "diff_beta" in case.find("error").get("message")


def test_verify_writes_junit_and_markdown_with_and_without_inputs(cli, files, tmp_path):
    reference = tmp_path / "ours.npz"
    assert cli("run", files["bundle"], "-q", "-o", reference).exit_code == 0
    judged = cli("verify", files["bad"], reference, "--inputs", files["bundle"], "--map", "grad_input=diff_src",
                 "--map", "grad_weight=diff_gamma", "--map", "grad_bias=diff_beta", "--markdown", "-")
    assert judged.exit_code == 1, judged.output
    assert judged.stdout.startswith("### ❌ bnbwd verify\n") and f"`{files['bad']}`" in judged.stdout
    assert "Comparison: actual" in judged.stderr  # the text report moved to stderr
    plain = cli("verify", files["good"], files["good"], "--junit", tmp_path / "v.xml", "--brief")
    assert plain.exit_code == 0, plain.output
    suite = _suite((tmp_path / "v.xml").read_text())
    assert suite.get("name") == "bnbwd verify" and suite.get("failures") == "0"


@pytest.mark.parametrize("args, pattern, code", [
    (["--junit", "{tmp}/r.xml"], r"--junit reports a judgement: give --reference KERNEL_OUT", 2),
    (["--reference", "{good}", "--markdown", "-", "-o", "-"], r"-o - and --markdown - both want stdout", 2),
    (["--reference", "{good}", "--junit", "{tmp}/r", "--json", "{tmp}/r"],
     r"--junit .*/r is also another output of this command \(--json\)", 2),
    (["--reference", "{good}", "--junit", "{good}"], r"--junit .*good\.npz: is also an input", 3),
], ids=["no-reference", "two-on-stdout", "same-file", "over-the-kernel"])
def test_run_report_destinations_are_vetted_first(cli, files, tmp_path, args, pattern, code):
    args = [a.format(tmp=tmp_path, good=files["good"]) for a in args]
    assert_one_error(cli("run", files["bundle"], "-q", *args), pattern, code)
    assert not (tmp_path / "r.xml").exists() and not (tmp_path / "r").exists()
