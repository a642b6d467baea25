"""Every name that resolves to stdout counts as stdout ('-', /dev/stdout, /dev/fd/1, /proc/self/fd/1): two outputs
there are refused as `-o - --json -` is, and one there sends the report to stderr (docs/guarantees.md, Writing).
Real processes: the aliases name the child's own descriptor 1."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import error_line

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = str(ROOT / "fixtures" / "example.npz")
CASE = str(ROOT / "fixtures" / "cases" / "bn1.npz")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def bnbwd(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", *args], capture_output=True, timeout=60, env=ENV,
                          **kwargs)


@pytest.mark.parametrize("output, report", [("-", "-"), ("-", "/dev/stdout"), ("/dev/stdout", "-"),
                                            ("/proc/self/fd/1", "/dev/fd/1"), ("/dev/fd/1", "/proc/self/fd/1")])
def test_two_outputs_on_stdout_are_a_usage_error(output: str, report: str) -> None:
    """`-o - --json /dev/stdout` was exit 0 with the arrays mixed into the JSON."""
    result = bnbwd("run", BUNDLE, "-q", "-o", output, "--json", report)
    assert result.returncode == 2, result.stderr
    error_line(result.stderr, rf"^error: -o {output} and --json {report} both want stdout; send one to a file")
    assert result.stdout == b""


def test_a_descriptor_that_is_not_stdout_is_an_ordinary_output(tmp_path: Path) -> None:
    """/dev/fd/N open on a file of its own is not stdout: -o - and --json /dev/fd/N each get theirs."""
    with (tmp_path / "report.json").open("wb") as report:
        fd = report.fileno()
        result = bnbwd("run", BUNDLE, "-q", "-o", "-", "--json", f"/dev/fd/{fd}", pass_fds=(fd,))
    assert result.returncode == 0, result.stderr
    assert sorted(np.load(io.BytesIO(result.stdout)).files) == ["diff_beta", "diff_gamma", "diff_src"]
    assert json.loads((tmp_path / "report.json").read_text())["command"] == "run"


def test_run_to_a_stdout_alias_shows_its_summary_on_stderr() -> None:
    """`run -o /dev/stdout` (not -q) printed its summary table after the archive, on stdout."""
    result = bnbwd("run", BUNDLE, "-o", "/dev/stdout")
    assert result.returncode == 0, result.stderr
    assert sorted(np.load(io.BytesIO(result.stdout)).files) == ["diff_beta", "diff_gamma", "diff_src"]
    assert "diff_src" in result.stderr.decode()


@pytest.mark.parametrize("command", ["verify", "check"])
@pytest.mark.parametrize("alias", ["/dev/stdout", "/proc/self/fd/1"])
def test_a_json_report_to_a_stdout_alias_is_the_only_thing_on_stdout(command: str, alias: str) -> None:
    """`verify/check --json /dev/stdout` wrote the text report and the JSON document into one stream."""
    args = [CASE.replace(".npz", ".out.npz")] * 2 if command == "verify" else [CASE]
    result = bnbwd(command, *args, "--json", alias)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tool"] == f"bnbwd {command}"
