"""The command line's own errors through the real CLI: --out-dir made and removed, the layout suggestion,
one-line usage errors (exit 2), structural verify errors printed once, the bare command's help."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import assert_one_error, assert_same, make_inputs, run_outputs, save_bundle
SHAPE = (2, 3, 4, 5)  # NCHW: C = 3
NCHW = ("--epsilon", "1e-3", "--format", "NCHW")


@pytest.fixture
def arrays(rng):
    return make_inputs(rng, SHAPE)


# ---------------------------------------------------------------- --out-dir


def test_out_dir_is_created(cli, tmp_path, arrays):
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    expected = run_outputs(cli, tmp_path, bundle)
    target = tmp_path / "new" / "grads"
    result = cli("run", bundle, *NCHW, "-q", "--out-dir", target)
    assert result.exit_code == 0, result.output
    assert_same({p.stem: np.load(p) for p in target.glob("*.npy")}, expected)


def test_failed_run_removes_the_out_dir_it_made(cli, tmp_path, arrays):
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    assert_one_error(cli("run", bundle, "--epsilon", "1e-3", "--out-dir", tmp_path / "new" / "grads"), r"mean has shape")
    assert not (tmp_path / "new").exists()
    result = cli("run", bundle, "--out-dir", bundle)
    assert_one_error(result, r"--out-dir.* is a file", 2)


# ---------------------------------------------------------------- layout suggestion


@pytest.mark.parametrize("data_format, given, suggested", [("NCX", [], "NCHW"), ("NXC", ["--format", "NCHW"], "NHWC")])
def test_layout_mismatch_suggests_the_other_format(cli, tmp_path, rng, data_format, given, suggested):
    shape = (2, 3, 4, 5) if data_format == "NCX" else (2, 4, 5, 3)
    bundle = save_bundle(tmp_path / "b.npz", make_inputs(rng, shape, data_format))
    pattern = rf"mean has shape \(3,\), expected \(\d,\) = C of src .*; with --format {suggested} it fits"
    assert_one_error(cli("run", bundle, "--epsilon", "1e-3", *given), pattern)
    out = tmp_path / "ref.npz"
    np.savez(out, diff_src=np.zeros(shape, np.float32))
    assert_one_error(cli("verify", out, out, "--inputs", bundle, "--epsilon", "1e-3", *given), pattern)


def test_no_suggestion_when_neither_layout_fits(cli, tmp_path, rng):
    arrays = make_inputs(rng, SHAPE)
    arrays["mean"] = arrays["mean"][:2]
    result = cli("run", save_bundle(tmp_path / "b.npz", arrays), *NCHW)
    assert_one_error(result, r"mean has shape \(2,\), expected \(3,\)")
    assert "--format" not in result.stderr


# ---------------------------------------------------------------- usage errors: one line


@pytest.mark.parametrize("args, pattern", [
    (["run", "--bogus"], r"No such option '--bogus'.*\(see '\S+ run --help'\)"),
    (["run", "--format", "XYZ"], r"Invalid value for '--format'"),
    (["verify", "a.npz"], r"Missing argument 'REFERENCE'.*\(see '\S+ verify --help'\)"),
    (["nosuch"], r"No such command 'nosuch'"),
    (["run", "x.npz", "-o", "a.npz", "--out-dir", "d"], r"give -o/--output or --out-dir, not both"),
])
def test_usage_errors_are_one_line(cli, args, pattern):
    assert_one_error(cli(*args), pattern, 2)


def test_usage_error_from_the_installed_entry_point_is_one_line():
    completed = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", "--bogus"], capture_output=True, text=True)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith("error: No such option '--bogus'") and completed.stderr.count("\n") == 1


def test_verify_structural_errors_are_printed_once(cli, tmp_path):
    np.savez(tmp_path / "a.npz", diff_src=np.zeros((2, 3), np.float32))
    np.savez(tmp_path / "r.npz", diff_src=np.zeros((2, 3), np.float32), diff_beta=np.zeros(3, np.float32))
    result = cli("verify", tmp_path / "a.npz", tmp_path / "r.npz")
    assert_one_error(result, r"diff_beta: in reference, missing from actual")
    assert "missing from actual" not in result.stdout and "structural problem(s), each named on stderr" in result.stdout


def test_bare_command_still_prints_the_help(cli):
    result = cli()
    assert result.exit_code == 2 and "Commands:" in result.output and "error:" not in result.output
