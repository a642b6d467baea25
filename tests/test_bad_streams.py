"""stdin, stdout and stderr as `bnbwd run` meets them: stdin empty, cut short, garbage, closed or endless; pipe
paths (<(...)); stdout closed early or full; Ctrl-C while starting up. In-process cases (tests/catalogue.py) and
real processes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main
from tests.catalogue import (
    Case, SRC_NPY, VALID_BUNDLE_BYTES, WARNINGS_ARE_ERRORS, Workspace, assert_fails_cleanly, each_case, huge_header,
    make_inputs, truncated,
)
from tests.conftest import error_line

pytestmark = WARNINGS_ARE_ERRORS

EXAMPLE = Path(__file__).resolve().parent.parent / "fixtures" / "example.npz"

CASES = [
    Case("stdin-empty", lambda ws: [ws.bundle(), "--diff-dst", "-"], 3, r"diff_dst: stdin is empty", stdin=b""),
    Case("stdin-truncated", lambda ws: [ws.bundle(), "--diff-dst", "-"], 3, r"diff_dst \(stdin\): header declares",
         stdin=SRC_NPY[:300]),
    Case("stdin-garbage", lambda ws: [ws.bundle(), "--src", "-"], 3, r"src \(stdin\): not a valid \.npy", stdin=b"\x00" * 99),
    Case("stdin-shape-overflow", lambda ws: [ws.bundle(), "--src", "-"], 3, r"src \(stdin\): header declares shape",
         stdin=huge_header((2**40, 2**40, 2**40))),
    Case("stdin-negative-shape", lambda ws: [ws.bundle(), "--src", "-"], 3, r"src \(stdin\): .*negative dimension",
         stdin=huge_header((2, -3, 4, 5), data=b"")),
    Case("stdin-bundle-truncated", lambda ws: ["-"], 3, r"bundle \(stdin\): not a valid \.npz",
         stdin=truncated(VALID_BUNDLE_BYTES, 0.7)),
    Case("stdin-bundle-not-zip", lambda ws: ["-"], 3, r"bundle \(stdin\): not a valid \.npz", stdin=SRC_NPY),
]


@each_case(CASES)
def test_bad_input_fails_cleanly(ws: Workspace, case: Case) -> None:
    assert_fails_cleanly(ws, case)


# ---------------------------------------------------------------- real processes and pipes


def bnbwd(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", *args], capture_output=True, timeout=60, **kwargs)


def test_stdin_closed(ws: Workspace) -> None:
    """`bnbwd run ... --diff-dst - <&-`: Python sees no stdin at all."""
    completed = subprocess.run(["sh", "-c", 'exec "$0" -m bnbwd_cli run "$1" --diff-dst - -o "$2" <&-', sys.executable,
                                ws.bundle(), str(ws.out / "grads.npz")], capture_output=True, timeout=60)
    assert completed.returncode == 3
    error_line(completed.stderr, r"stdin.*is closed")
    assert list(ws.out.iterdir()) == []


def test_stdin_writer_dies_early(ws: Workspace) -> None:
    """The process feeding stdin stops after part of the array."""
    completed = bnbwd(ws.bundle(), "--diff-dst", "-", "-o", str(ws.out / "grads.npz"), input=SRC_NPY[: len(SRC_NPY) // 2])
    assert completed.returncode == 3
    error_line(completed.stderr, r"diff_dst \(stdin\): header declares shape \(2, 3, 4, 5\)")
    assert list(ws.out.iterdir()) == []


def test_stdin_pipe_works(ws: Workspace) -> None:
    completed = bnbwd(ws.bundle(), "--diff-dst", "-", "-q", "-o", str(ws.out / "grads.npz"), input=SRC_NPY)
    assert completed.returncode == 0, completed.stderr
    assert [p.name for p in ws.out.iterdir()] == ["grads.npz"]


@pytest.mark.parametrize("to_stdout", [True, False], ids=["npz-to-stdout", "summary-to-stdout"])
def test_stdout_closed_early(ws: Workspace, to_stdout: bool) -> None:
    """`bnbwd run ... -o - | head -c 10`: the reader goes away; one line and exit 3, not a traceback or exit 1."""
    arrays = make_inputs(shape=(4, 8, 32, 32))  # 128 KiB of diff_src: more than a pipe buffer holds
    target = "-" if to_stdout else str(ws.out / "grads.npz")
    process = subprocess.Popen([sys.executable, "-m", "bnbwd_cli", "run", ws.bundle(arrays), "-o", target],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 3
    error_line(stderr, r"stdout was closed .*broken pipe")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut-short"])
def test_process_substitution_inputs(ws: Workspace, cut: bool) -> None:
    """`--src <(cat x.npy)` and `bnbwd run <(cat b.npz)`: a pipe path can be read only once."""
    src = ws.npy("src.npy", make_inputs()["src"])
    feed = f'head -c 300 "{src}"' if cut else f'cat "{src}"'
    script = f'"$0" -m bnbwd_cli run -q <(cat "$1") --src <({feed}) -o "$2"'
    completed = subprocess.run(["bash", "-c", script, sys.executable, ws.bundle(), str(ws.out / "grads.npz")],
                               capture_output=True, timeout=60)
    if cut:
        assert completed.returncode == 3
        error_line(completed.stderr, r"src \(/dev/fd/\d+\): header declares shape \(2, 3, 4, 5\)")
        assert list(ws.out.iterdir()) == []
    else:
        assert completed.returncode == 0, completed.stderr
        assert [p.name for p in ws.out.iterdir()] == ["grads.npz"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("feed,code", [("yes", 3), ('cat "$2"; yes', 0)], ids=["endless-garbage", "npy-then-endless"])
def test_stdin_is_checked_at_the_magic_and_read_only_as_far_as_declared(ws: Workspace, feed: str, code: int) -> None:
    """An endless stream on stdin: garbage fails at its first bytes; a .npy is read to its declared size, no further."""
    dy = ws.npy("dy.npy", make_inputs()["diff_dst"])
    script = f'({feed}) | "$0" -m bnbwd_cli run -q "$1" --diff-dst - -o "$3"'
    completed = subprocess.run(["bash", "-c", script, sys.executable, ws.bundle(), dy, str(ws.out / "grads.npz")],
                               capture_output=True, timeout=30)
    assert completed.returncode == code, completed.stderr
    if code:
        error_line(completed.stderr, r"diff_dst \(stdin\): not a valid \.npy or \.npz \(starts with b'y\\ny\\n")
        assert list(ws.out.iterdir()) == []
    else:
        assert [p.name for p in ws.out.iterdir()] == ["grads.npz"]


def _memory_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))  # guards the host


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("route", ["stdin", "pipe-path"])
def test_a_huge_declared_header_length_is_refused_before_it_is_read(ws: Workspace, version: int, route: str) -> None:
    """A 2.0/3.0 .npy header may declare up to 4 GiB: NumPy read all of it into memory before its own check (500 MB
    of stream peaked at 1 GB). The length is bounded first, from any source; the endless tail is never read."""
    header = ws.out.parent / "header.bin"
    header.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + (0xFFFFFFF0).to_bytes(4, "little"))
    feed = '(cat "$2"; yes "")'
    script = (f'{feed} | "$0" -m bnbwd_cli run -q "$1" --src - -o "$3"' if route == "stdin" else
              f'"$0" -m bnbwd_cli run -q "$1" --src <({feed}) -o "$3"')
    completed = subprocess.run(["bash", "-c", script, sys.executable, ws.bundle(), str(header),
                                str(ws.out / "grads.npz")], capture_output=True, timeout=60, preexec_fn=_memory_limit)
    assert completed.returncode == 3, completed.stderr
    error_line(completed.stderr, r"src \((stdin|/dev/fd/\d+)\): .*not a valid \.npy file \(its header declares "
                                 r"4294967280 bytes; a \.npy header holds at most 10000\)")
    assert list(ws.out.iterdir()) == []


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
@pytest.mark.parametrize("command", ["verify", "reference"])
def test_pipe_paths_work_in_verify_and_reference(ws: Workspace, command: str) -> None:
    bundle = ws.bundle()
    reference = ws.out / "ref.npz"
    assert CliRunner().invoke(main, ["run", "-q", bundle, "-o", str(reference)]).exit_code == 0
    if command == "verify":
        script = '"$0" -m bnbwd_cli verify --brief <(cat "$1") <(cat "$1") --inputs <(cat "$2")'
    else:
        script = '"$0" -m bnbwd_cli run -q "$2" --reference <(cat "$1") --brief'
    completed = subprocess.run(["bash", "-c", script, sys.executable, str(reference), bundle], capture_output=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert [p.name for p in ws.out.iterdir()] == ["ref.npz"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args,stream", [(["-o", "-"], "stdout"), ([], "stdout"), (["--json", "-"], "stdout"),
                                         (["--src", "missing.npy"], "stderr")],
                         ids=["npz-to-full-stdout", "report-to-full-stdout", "json-to-full-stdout", "error-to-full-stderr"])
def test_failing_output_streams_exit_3(ws: Workspace, args: list[str], stream: str) -> None:
    """stdout on a full device gave exit 4; a failing stderr turned an input error into exit 1."""
    if "-o" not in args:
        args = [*args, "-o", str(ws.out / "grads.npz")] if stream == "stdout" else args
    with open("/dev/full", "wb") as full:
        redirect = {"stdout": full} if stream == "stdout" else {"stderr": full, "stdout": subprocess.PIPE}
        completed = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", ws.bundle(), *args],
                                   **({"stderr": subprocess.PIPE} if stream == "stdout" else {}), **redirect, timeout=60)
    assert completed.returncode == 3, completed.stderr
    if stream == "stdout":
        error_line(completed.stderr, r"cannot write to stdout|stdout: write failed")
    assert [p.name for p in ws.out.iterdir()] in ([], ["grads.npz"])


STARTUP_INTERRUPT = textwrap.dedent(
    """
    import builtins, runpy, sys
    real_import = builtins.__import__
    target = sys.argv[1]

    def ctrl_c_while_importing(name, *args, **kwargs):
        if name == target:
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    builtins.__import__ = ctrl_c_while_importing
    sys.argv = ["bnbwd", *sys.argv[2:]]
    runpy.run_module("bnbwd_cli", run_name="__main__")
    """
)


# numpy and click load at start-up; rich.console only when the summary is rendered (a lazy import inside the command).
@pytest.mark.parametrize(("module", "args"), [("numpy", ["run", "--help"]), ("click", ["run", "--help"]),
                                              ("rich.console", ["run", str(EXAMPLE)])])
def test_ctrl_c_during_start_up_prints_no_traceback(module: str, args: list[str]) -> None:
    completed = subprocess.run([sys.executable, "-c", STARTUP_INTERRUPT, module, *args], capture_output=True, timeout=60)
    assert completed.returncode == 130
    assert completed.stderr.decode().strip().splitlines() == ["error: interrupted; no partial output file is left"]
