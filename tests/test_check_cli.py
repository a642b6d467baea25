"""`bnbwd check CASE...` through the real CLI: one test per exit path and message, --json, run's options."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.cli import main
from tests.conftest import make_inputs, save_bundle

ROOT = Path(__file__).resolve().parent.parent
OWN_NAMES = ["--map", "dy=diff_dst", "--map", "var=variance", "--map", "dx=diff_src",
             "--map", "dgamma=diff_gamma", "--map", "dbeta=diff_beta"]


def write_case(path: Path, inputs: dict, outputs: dict, **attributes) -> str:
    return save_bundle(path, {**inputs, **outputs}, **attributes)


@pytest.fixture
def case(rng, tmp_path):
    """A passing case in canonical names, NHWC, epsilon inside; returns (path, inputs, outputs)."""
    inputs = make_inputs(rng, (2, 5, 4, 3), data_format="NXC")
    grads = bnbwd_cli.backward(*(inputs[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")),
                               epsilon=1e-3, data_format="NHWC")
    return write_case(tmp_path / "good.npz", inputs, grads, epsilon=1e-3, data_format="NHWC"), inputs, grads


def test_shipped_examples_pass_and_fail_by_their_own_names(cli):
    good, bad = ROOT / "fixtures" / "example_case.npz", ROOT / "fixtures" / "example_case_bad.npz"
    result = cli("check", good, bad, *OWN_NAMES)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert re.match(rf"PASS  {re.escape(str(good))}: dx=diff_src [\d.]+ units, dgamma=diff_gamma", lines[0])
    assert lines[1].startswith(f"FAIL  {bad}: ") and "hint: an unbiased variance" in lines[1]
    assert lines[-1] == f"FAIL (exit 1): 2 case(s), 1 failed: {bad}"
    verbose = cli("check", good, *OWN_NAMES, "-v")
    assert verbose.exit_code == 0 and "matched no key" not in verbose.stdout  # the input maps were used


def test_exit_0_one_line_per_case_and_summary(cli, case, tmp_path):
    path, inputs, grads = case
    tf = {"x": inputs["src"], "y_backprop": inputs["diff_dst"], "reserve_space_1": inputs["mean"],
          "reserve_space_2": inputs["variance"], "scale": inputs["gamma"]}
    other = write_case(tmp_path / "tf.npz", tf, {"x_backprop": grads["diff_src"], "scale_backprop": grads["diff_gamma"],
                                                 "offset_backprop": grads["diff_beta"]}, epsilon=1e-3, data_format="NHWC")
    result = cli("check", path, other)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"PASS  {path}: diff_src 0 units, diff_gamma 0 units, diff_beta 0 units",
        f"PASS  {other}: x_backprop=diff_src 0 units, scale_backprop=diff_gamma 0 units, offset_backprop=diff_beta 0 units",
        "PASS: 2 case(s), every output within tolerance",
    ]


def test_exit_1_names_the_failing_case(cli, case, tmp_path):
    path, inputs, grads = case
    wrong = write_case(tmp_path / "wrong.npz", inputs, dict(grads, diff_beta=grads["diff_beta"] / 40),
                       epsilon=1e-3, data_format="NHWC")
    result = cli("check", path, wrong)
    assert result.exit_code == 1, result.output
    # the verdict and the hint lead; then the failed test, its statistic against its threshold
    assert re.search(rf"^FAIL  {re.escape(wrong)}: hint: diff_beta is 40 = M times too small.*; .*diff_beta FAIL max \S+ "
                     r"units > K 5", result.stdout, re.M)
    assert result.stdout.splitlines()[-1] == f"FAIL (exit 1): 2 case(s), 1 failed: {wrong}"


@pytest.mark.parametrize("make, message", [
    (lambda d, i, g: str(d / "absent.npz"), r"absent\.npz: no such file or directory"),
    (lambda d, i, g: (d / "junk.npz").write_bytes(b"not a zip") and str(d / "junk.npz"), r"junk\.npz"),
    (lambda d, i, g: write_case(d / "nomean.npz", {k: v for k, v in i.items() if k != "mean"}, g, epsilon=1e-3,
                                data_format="NHWC"), r"nomean\.npz: missing input mean"),
    (lambda d, i, g: write_case(d / "noeps.npz", i, g, data_format="NHWC"), r"noeps\.npz: no epsilon: .*give --epsilon"),
    (lambda d, i, g: write_case(d / "nchw.npz", i, g, epsilon=1e-3, data_format="NCHW"),
     r"nchw\.npz: mean has shape \(3,\), expected \(5,\) = C of src \(NCX\)"),
    (lambda d, i, g: write_case(d / "noout.npz", i, {}, epsilon=1e-3),
     r"noout\.npz: \S*noout\.out\.npz not found, and \S*noout\.npz holds no outputs"),
], ids=["missing-file", "not-npz", "missing-input", "no-epsilon", "wrong-layout", "no-outputs"])
def test_exit_3_when_a_case_cannot_be_judged_others_still_are(cli, case, tmp_path, make, message):
    path, inputs, grads = case
    broken = make(tmp_path, inputs, grads)
    result = cli("check", broken, path)
    assert result.exit_code == 3, result.output
    first, second, summary = result.stdout.splitlines()
    assert first.startswith("ERROR ") and re.search(message, first), first
    assert second.startswith(f"PASS  {path}")
    assert summary == f"FAIL (exit 3): 2 case(s), 1 could not be judged: {broken}"
    assert result.stderr == ""  # the ERROR line once, in the report: a merged log shows it once


def test_exit_3_for_an_output_of_the_wrong_shape(cli, case, tmp_path):
    path, inputs, grads = case
    bad = write_case(tmp_path / "t.npz", inputs, {"diff_src": grads["diff_src"].transpose(0, 3, 1, 2)}, epsilon=1e-3,
                     data_format="NHWC")
    result = cli("check", bad, "--only", "diff_src")
    assert result.exit_code == 3
    assert "diff_src SHAPE; error: diff_src: actual has shape (2, 3, 5, 4)" in result.stdout


def test_usage_errors_exit_2(cli):
    assert cli("check").exit_code == 2
    assert cli("check", "x.npz", "--format", "NQC").exit_code == 2
    assert cli("check", "x.npz", "--map", "nonsense").exit_code == 2


def test_run_options_are_runs_own_and_apply_when_the_file_does_not_say(cli, rng, tmp_path):
    by_name = {p.name: p for p in main.get_command(None, "run").params}
    op_names = ("epsilon", "data_format", "spec", "inference", "variance_is_invstd", "bf16_keys")
    shared = [p for p in main.get_command(None, "check").params if p.name in op_names]
    # One definition each (cli/params.py): the same flags, types, defaults and help as run's.
    assert len(shared) == 6 and all(p.to_info_dict() == by_name[p.name].to_info_dict() for p in shared)
    inputs = make_inputs(rng, (2, 3, 4, 4))  # NCHW
    inference = bnbwd_cli.backward(*(inputs[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")),
                                   epsilon=1e-4, data_format="NCHW", training=False)
    path = write_case(tmp_path / "inf.npz", inputs, inference)
    assert cli("check", path, "--format", "NCHW").exit_code == 3  # generic: no epsilon anywhere
    assert cli("check", path, "--format", "NCHW", "--epsilon", "1e-4").exit_code == 1  # training, by default
    assert cli("check", path, "--spec", "tensorflow", "--format", "NCHW", "--inference").exit_code == 0  # eps 1e-4
    inside = write_case(tmp_path / "inside.npz", inputs, inference, epsilon=1e-4, data_format="NCHW")
    assert cli("check", inside, "--inference", "--epsilon", "0.5", "--format", "NHWC").exit_code == 0  # the file wins


def test_json_same_facts_and_exit_code(cli, case, tmp_path):
    path, inputs, grads = case
    wrong = write_case(tmp_path / "wrong.npz", inputs | {"loss": np.float32(1)}, dict(grads, diff_gamma=-grads["diff_gamma"]),
                       epsilon=1e-3, data_format="NHWC")
    result = cli("check", path, wrong, str(tmp_path / "absent.npz"), "--json", "-")
    assert result.exit_code == 3
    document = json.loads(result.stdout)  # only JSON on stdout; the lines went to stderr
    assert (document["tool"], document["status"], document["exit_code"]) == ("bnbwd check", "error", 3)
    assert [(c["case"], c["status"], c["exit_code"]) for c in document["cases"]] == [
        (path, "pass", 0), (wrong, "mismatch", 1), (str(tmp_path / "absent.npz"), "error", 3)]
    assert document["cases"][1]["notes"] == ["not used: loss"]
    assert document["schema_version"] == 4
    passing, failing = document["cases"][0]["outputs"], document["cases"][1]["outputs"]
    assert all(o["comparison"] is None and o["max_units"] is not None for o in passing)  # compact: no details
    gamma = failing[1]
    assert gamma["name"] == "diff_gamma" and gamma["status"] == "mismatch" and gamma["comparison"]["worst"]
    assert any(not t["passed"] for t in gamma["criteria"])
    assert all((o["comparison"] is None) == (o["status"] == "pass") for o in failing)  # details for failures only
    assert document["cases"][1]["hint"] == (gamma["hints"][0]["evidence"] if gamma["hints"] else None)
    assert document["cases"][2]["outputs"] == [] and "no such file" in document["cases"][2]["error"]
    assert f"FAIL  {wrong}" in result.stderr
    target = tmp_path / "check.json"
    again = cli("check", path, "--json", target)
    assert again.exit_code == 0 and json.loads(target.read_text())["status"] == "pass"
    assert cli("check", path, "--json", path).exit_code == 3  # never over a case file


def test_verbose_adds_each_report_and_a_directory_case_works(cli, case, tmp_path):
    path, inputs, grads = case
    directory = tmp_path / "case_dir"
    directory.mkdir()
    for name, array in {**inputs, **grads}.items():
        np.save(directory / f"{name}.npy", array)
    result = cli("check", path, directory, "-v", "--epsilon", "1e-3", "--format", "NHWC")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("Comparison: actual") == 2 and f"PASS  {directory}:" in result.stdout


def test_many_cases_in_one_process(cli, case, tmp_path):
    path = case[0]
    copies = [shutil.copy(path, tmp_path / f"c{i}.npz") for i in range(12)]
    result = cli("check", *copies)
    assert result.exit_code == 0 and result.stdout.count("PASS  ") == 12


def test_bf16_keys_read_as_bfloat16_in_a_case(cli, rng, tmp_path):
    """PyTorch's bf16 dumped as int16 bits: --bf16 takes the file's key (dx) or ours (src); the values are
    the bits' bfloat16 values, so a correct bf16 kernel passes and a wrong reinterpretation would fail."""
    from bnbwd_cli.dtypes import BFLOAT16
    inputs = {k: v.astype(BFLOAT16) if k in ("src", "diff_dst") else v
              for k, v in make_inputs(rng, (2, 5, 4, 3), data_format="NXC").items()}
    grads = bnbwd_cli.backward(*(inputs[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")),
                               epsilon=1e-3, data_format="NHWC")
    bits = {"src": inputs["src"].view(np.int16), "dy": inputs["diff_dst"].view(np.int16),
            **{k: inputs[k] for k in ("mean", "variance", "gamma")}}
    path = write_case(tmp_path / "bits.npz", bits, {"dx": grads["diff_src"].view(np.int16)}, epsilon=1e-3,
                      data_format="NHWC")
    passed = cli("check", path, "--map", "dy=diff_dst", "--map", "dx=diff_src", "--bf16", "dx", "--bf16", "src",
                 "--bf16", "diff_dst", "--only", "dx")
    assert passed.exit_code == 0, passed.output
    assert passed.stdout.splitlines()[0] == f"PASS  {path}: dx=diff_src 0 units"
    unread = cli("check", path, "--map", "dy=diff_dst", "--map", "dx=diff_src", "--bf16", "src", "--bf16", "dy")
    assert unread.exit_code == 3 and "diff_src" in unread.stdout  # dx left as int16: not comparable with bf16
    typo = cli("check", path, "--map", "dy=diff_dst", "--bf16", "dxx")
    assert typo.exit_code == 3 and "--bf16 dxx: no array named 'dxx'" in typo.stdout
