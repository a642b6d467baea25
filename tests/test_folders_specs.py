"""Folders and specs: `check` on a folder of case folders judges each, `run` reads a folder bundle as `check` does,
and `verify --spec` applies a spec's defaults to --inputs as `run --spec` does. Through the real CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.test_missing_names import EPS, _problem, _torch_dump

ROOT = Path(__file__).resolve().parent.parent
TF = ROOT / "fixtures" / "conformance" / "tf_nchw_f32_train"


def test_check_on_a_folder_of_case_folders_judges_each(cli, rng, tmp_path):
    inputs, grads = _problem(rng)
    (tmp_path / "suite").mkdir()
    _torch_dump(tmp_path / "suite" / "b_good", inputs, grads)
    _torch_dump(tmp_path / "suite" / "a_bad", inputs, dict(grads, diff_beta=grads["diff_beta"] + 1))
    (tmp_path / "suite" / ".hidden").mkdir()
    result = cli("check", tmp_path / "suite", "--epsilon", EPS)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"FAIL  {tmp_path / 'suite' / 'a_bad'}: ") and "grad_bias=diff_beta FAIL" in lines[0]
    assert lines[1].startswith(f"PASS  {tmp_path / 'suite' / 'b_good'}: ")
    assert lines[2] == f"FAIL (exit 1): 2 case(s), 1 failed: {tmp_path / 'suite' / 'a_bad'}"
    assert cli("check", *sorted((tmp_path / "suite").glob("[ab]*")), "--epsilon", EPS).stdout == result.stdout


def test_an_empty_folder_is_still_one_case_with_its_error(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    result = cli("check", tmp_path / "empty")
    assert result.exit_code == 3 and result.stdout.startswith(f"ERROR {tmp_path / 'empty'}")


def test_run_reads_a_folder_bundle_as_check_does(cli, rng, tmp_path):
    inputs, grads = _problem(rng)
    _torch_dump(tmp_path / "dump", inputs, grads)
    judged = cli("run", tmp_path / "dump", "-q", "--reference", tmp_path / "dump", "--epsilon", EPS)
    assert judged.exit_code == 0, judged.output
    assert "grad_input=diff_src" in judged.stdout
    written = cli("run", tmp_path / "dump", "-q", "-o", tmp_path / "grads.npz")
    assert written.exit_code == 0, written.output
    with np.load(tmp_path / "grads.npz") as out:
        np.testing.assert_allclose(out["diff_src"], grads["diff_src"], rtol=1e-5, atol=1e-6)  # channels-first (NCHW)


def test_verify_spec_applies_to_the_inputs_bundle(cli):
    args = (f"{TF}.expected.npz", f"{TF}.expected.npz", "--inputs", f"{TF}.inputs.npz")
    assert cli("verify", *args).exit_code == 3  # no epsilon: the generic spec has no default
    passed = cli("verify", *args, "--spec", "tensorflow")
    assert passed.exit_code == 0 and "PASS" in passed.stdout, passed.output
    unused = cli("verify", f"{TF}.expected.npz", f"{TF}.expected.npz", "--spec", "tensorflow")
    assert unused.exit_code == 2 and "describe --inputs" in unused.stderr
