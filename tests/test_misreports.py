"""Failures said for what they are: a deleted working directory or a file's failure is not blamed on stdout or
stderr; check's case errors reach stderr; a report that cannot reach a closed or full stdout keeps the verdict's
exit code with one line on stderr (README.md, "Exit codes"; docs/guarantees.md), --json - included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PERTURBED = str(ROOT / "docs" / "examples" / "tf_nchw_f32_train.perturbed.npz")
CASE_MAP = ["--map", "dy=diff_dst", "--map", "var=variance", "--map", "dx=diff_src", "--map", "dgamma=diff_gamma",
            "--map", "dbeta=diff_beta"]
GOOD, BAD = str(ROOT / "fixtures" / "example_case.npz"), str(ROOT / "fixtures" / "example_case_bad.npz")


def bnbwd_in_shell(args: list[str], redirect: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """bnbwd ARGS with stdout redirected by the shell (`>&-`, `>/dev/full`)."""
    return subprocess.run(["bash", "-c", f'"{sys.executable}" -m bnbwd_cli "$@" {redirect}', "bash", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_deleted_working_directory_is_named_not_blamed_on_stdout(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f'cd "{gone}" && rmdir "{gone}" && "{sys.executable}" -m bnbwd_cli run "{ROOT}/fixtures/example.npz" -o g.npz'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: the working directory no longer exists") and "stdout" not in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_file_name_too_long_is_named_not_blamed_on_stdout(cli, tmp_path):
    for args in (["verify", "a" * 5000 + ".npz", PERTURBED], ["run", PERTURBED, "-o", tmp_path / ("o" * 5000 + ".npz")]):
        result = cli(*args)
        assert result.exit_code == 3, result.output
        assert "stdout" not in result.stderr and "File name too long" in result.stderr, result.stderr
        assert len(result.stderr) < 400 and result.stderr.count("\n") == 1


def test_check_prints_each_case_error_once_as_its_line_on_stdout(cli, tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not an archive")
    result = cli("check", GOOD, str(tmp_path / "junk.npz"), str(tmp_path / "absent.npz"), *CASE_MAP, "--jobs", "1")
    assert result.exit_code == 3
    stdout = result.stdout.splitlines()
    assert stdout[0].startswith("PASS ") and stdout[1].startswith(f"ERROR {tmp_path}/junk.npz: ")
    assert stdout[2] == f"ERROR {tmp_path}/absent.npz: no such file or directory" and stdout[3].startswith("FAIL (exit 3)")
    assert result.stderr == ""  # once: a log merging stdout and stderr shows each error one time


COMMANDS = {  # (arguments, the verdict's exit code)
    "verify-pass": (["verify", PERTURBED, PERTURBED], 0),
    "verify-json-pass": (["verify", PERTURBED, PERTURBED, "--json", "-"], 0),
    "verify-json-structural": (["verify", str(ROOT / "fixtures" / "example.npz"), PERTURBED, "--json", "-"], 3),
    "check-pass": (["check", GOOD, *CASE_MAP], 0),
    "check-mismatch": (["check", BAD, *CASE_MAP, "-v"], 1),
    "check-json-mismatch": (["check", BAD, *CASE_MAP, "--json", "-"], 1),
    "check-json-error": (["check", str(ROOT / "fixtures" / "absent.npz"), "--json", "-"], 3),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_closed_stdout_keeps_the_verdicts_exit_code_and_says_so(name):
    args, verdict = COMMANDS[name]
    closed = bnbwd_in_shell(args, ">&-")
    assert closed.returncode == verdict, closed.stderr
    assert closed.stderr.splitlines()[-1] == f"note: no report: stdout is closed; exit code {verdict} is the verdict's"
    assert "internal error" not in closed.stderr and "Traceback" not in closed.stderr


@pytest.mark.parametrize("name", ["verify-json-pass", "check-json-mismatch"])
def test_a_full_stdout_under_json_keeps_the_verdicts_exit_code(name):
    args, verdict = COMMANDS[name]
    full = bnbwd_in_shell(args, ">/dev/full")
    assert full.returncode == verdict, full.stderr
    assert full.stderr.splitlines()[-1] == (f"note: the report on stdout was cut short (No space left on device); "
                                            f"exit code {verdict} is the verdict's")


def test_outputs_to_a_closed_stdout_are_refused_before_the_work():
    closed = bnbwd_in_shell(["run", str(ROOT / "fixtures" / "example.npz"), "-o", "-"], ">&-")
    assert closed.returncode == 3 and closed.stderr == "error: -o -: stdout is closed; give -o FILE\n"
