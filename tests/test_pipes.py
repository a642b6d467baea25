"""Exit codes that survive pipes: a verdict (0, 1, 3) is the exit code even when stdout's reader goes away, stdout
is full or closed; one stderr line says the report was cut short. `-o x.npy` is a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BAD = ["fixtures/example_case_bad.npz", "--map", "dy=diff_dst", "--map", "var=variance", "--map", "dx=diff_src",
       "--map", "dgamma=diff_gamma", "--map", "dbeta=diff_beta"]
PERTURBED = "docs/examples/tf_nchw_f32_train.perturbed.npz"
COMMANDS = {  # (arguments, the verdict's exit code)
    "run-reference-mismatch": (["run", "fixtures/conformance/tf_nchw_f32_train.inputs.npz", "--spec", "tensorflow",
                                "-q", "--reference", PERTURBED], 1),
    "verify-pass": (["verify", PERTURBED, PERTURBED, "-v"], 0),
    "check-mismatch": (["check", *BAD, "-v"], 1),
    "check-json-mismatch": (["check", *BAD, "--json", "-"], 1),
    "check-error": (["check", "fixtures/absent.npz", "fixtures/cases"], 3),
}


def bnbwd(args: list[str], stdout) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bnbwd_cli", *args], cwd=ROOT, stdout=stdout,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_reader_that_goes_away_keeps_the_verdicts_exit_code(name):
    args, verdict = COMMANDS[name]
    process = bnbwd(args, subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the report is written: every write is EPIPE
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == verdict, stderr
    assert stderr.splitlines()[-1] == (f"note: the report on stdout was cut short (its reader closed it); "
                                       f"exit code {verdict} is the verdict's"), stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr


def test_head_keeps_a_mismatch_at_exit_1():
    args, _ = COMMANDS["check-mismatch"]
    done = subprocess.run(["bash", "-c", f'"{sys.executable}" -m bnbwd_cli "$@" | head -1; exit ${{PIPESTATUS[0]}}',
                           "bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("FAIL  fixtures/example_case_bad.npz") and done.stdout.count("\n") == 1


def test_a_full_or_closed_stdout_keeps_the_verdict_with_one_line():
    args, verdict = COMMANDS["run-reference-mismatch"]
    with open("/dev/full", "w") as full:
        process = bnbwd(args, full)
        stderr = process.stderr.read()
    assert process.wait(timeout=60) == verdict
    assert stderr.splitlines()[-1].startswith("note: the report on stdout was cut short (")
    closed = subprocess.run(["bash", "-c", f'"{sys.executable}" -m bnbwd_cli "$@" >&-', "bash", *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert closed.returncode == verdict
    assert closed.stderr.splitlines()[-1] == "note: no report: stdout is closed; exit code 1 is the verdict's"


def test_outputs_on_stdout_that_cannot_be_written_are_still_exit_3():
    """-o - is the run's product, not a report: a reader that goes away before it is written is an error."""
    process = bnbwd(["run", "fixtures/example.npz", "-q", "-o", "-"], subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 3 and "broken pipe" in stderr


def test_o_npy_is_refused_with_out_dir_suggested(cli, tmp_path):
    result = cli("run", ROOT / "fixtures" / "example.npz", "-o", tmp_path / "g.npy")
    assert result.exit_code == 2 and not (tmp_path / "g.npy").exists()
    assert f"give -o {tmp_path / 'g'}.npz, or --out-dir DIR for one .npy per output" in result.stderr
