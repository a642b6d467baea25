"""One test per exit code (bnbwd_cli.errors.ExitCode), each through the real CLI (a subprocess, or click's runner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bnbwd_cli.judge import sets as judge_sets
from bnbwd_cli.errors import ExitCode
from tests.conftest import default_sigint, make_inputs, save_bundle

BNBWD = [sys.executable, "-m", "bnbwd_cli"]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def bnbwd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BNBWD, *map(str, args)], capture_output=True, text=True, timeout=120, env=ENV)


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bundle, bnbwd's own outputs for it, and a kernel's outputs with diff_src 1% off (made once)."""
    tmp_path = tmp_path_factory.mktemp("exit_codes")
    bundle = Path(save_bundle(tmp_path / "in.npz", make_inputs(np.random.default_rng(7), (2, 3, 4, 4)), epsilon=1e-5,
                                data_format="NCHW"))
    good = tmp_path / "good.npz"
    assert bnbwd("run", "-q", bundle, "-o", good).returncode == 0
    outputs = dict(np.load(good))
    outputs["diff_src"] = outputs["diff_src"] * np.float32(1.01)
    np.savez(tmp_path / "bad.npz", **outputs)
    return {"bundle": bundle, "good": good, "bad": tmp_path / "bad.npz"}


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


def test_exit_codes_are_the_documented_numbers():
    assert [int(code) for code in ExitCode] == [0, 1, 2, 3, 4, 129, 130, 143]
    assert ExitCode.TERMINATED == 128 + signal.SIGTERM and ExitCode.INTERRUPTED == 128 + signal.SIGINT
    assert ExitCode.HANGUP == 128 + signal.SIGHUP


def test_exit_0_when_the_outputs_match(case):
    completed = bnbwd("verify", case["good"], case["good"], "--brief")
    assert completed.returncode == ExitCode.OK, completed.stderr


@pytest.mark.parametrize("command", ["verify", "run --reference"])
def test_exit_1_on_a_mismatch(case, command):
    if command == "verify":
        bad = bnbwd("verify", case["bad"], case["good"])
    else:  # the same files pass (exit 0), so 1 is the verdict, not the command's habit
        good = bnbwd("run", "-q", case["bundle"], "--reference", case["good"], "--brief")
        assert good.returncode == ExitCode.OK, good.stdout + good.stderr
        bad = bnbwd("run", "-q", case["bundle"], "--reference", case["bad"], "--brief")
    assert bad.returncode == ExitCode.MISMATCH, bad.stdout + bad.stderr
    assert "FAIL" in bad.stdout and "Traceback" not in bad.stderr


# In-process from here (click's CliRunner through the same `main`, exit-code mapping included): faster.


def test_exit_2_on_a_usage_error(cli, case):
    result = cli("verify", case["good"], case["good"], "--no-such-option")
    assert result.exit_code == ExitCode.USAGE and "No such option" in result.stderr


def test_exit_3_on_an_input_error(cli, case, tmp_path):
    result = cli("verify", tmp_path / "missing.npz", case["good"])
    assert result.exit_code == ExitCode.INPUT
    assert "missing.npz" in one_error_line(result.stderr)


@pytest.fixture
def planted_bug(monkeypatch):
    """A bug planted in the judge: what a user sees when bnbwd itself fails."""

    def boom(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.delenv("BNBWD_TRACEBACK", raising=False)
    monkeypatch.setattr(judge_sets, "compare_sets", boom)  # app/judge imports it when it judges


def test_exit_4_on_an_internal_error_with_one_line(cli, case, planted_bug):
    result = cli("verify", case["good"], case["good"])
    assert result.exit_code == ExitCode.INTERNAL
    assert one_error_line(result.stderr) == "error: internal error: ZeroDivisionError: planted (rerun with --traceback)"


def test_traceback_flag_shows_the_traceback_and_still_exits_4(cli, case, planted_bug):
    result = cli("--traceback", "verify", case["good"], case["good"])
    assert result.exit_code == ExitCode.INTERNAL, result.stderr
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert "in boom" in result.stderr and result.stderr.rstrip().endswith("ZeroDivisionError: planted")


# Signals need a real process.


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, ExitCode.INTERRUPTED), (signal.SIGTERM, ExitCode.TERMINATED),
                                           (signal.SIGHUP, ExitCode.HANGUP)], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_signal_while_reading_a_fifo_exits_with_its_code_and_leaves_nothing(case, tmp_path, sig, code):
    """`kill -INT/-TERM/-HUP` from outside while `run` waits for its input (a FIFO half written): no output left."""
    fifo, out = tmp_path / "inputs.npz", tmp_path / "out"
    os.mkfifo(fifo)
    out.mkdir()
    process = subprocess.Popen([*BNBWD, "run", "-q", str(fifo), "-o", str(out / "grads.npz")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                               preexec_fn=default_sigint)
    try:
        writer = _open_when_read(fifo, process)  # bnbwd has opened the FIFO: it is past start-up
        data = case["bundle"].read_bytes()
        os.write(writer, data[: len(data) // 2])  # a few KiB: fits in the pipe
        time.sleep(0.5)  # let it block on the other half
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
        os.close(writer)
    finally:
        process.kill()
    assert process.returncode == code, stderr
    assert "no partial output file is left" in one_error_line(stderr)
    assert sorted(p.name for p in out.iterdir()) == []


def _open_when_read(fifo: Path, process: subprocess.Popen) -> int:
    """The FIFO's write end, once a reader has it open (a plain open would hang if bnbwd never opened it)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"bnbwd never opened {fifo}: {process.communicate()[1]}") from None
            time.sleep(0.05)
