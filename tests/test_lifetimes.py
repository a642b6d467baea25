"""Nothing hangs on a resource limit or a killed parent: `check --jobs` under open-file and process limits, workers
that end with their parent (SIGKILL, SIGHUP), and SIGHUP handled as SIGTERM (docs/guarantees.md, "Processes and
signals"). Every child runs in its own session under a timeout; whatever it leaves is killed with its group."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import error_line

ROOT = Path(__file__).resolve().parent.parent
BNBWD = [sys.executable, "-m", "bnbwd_cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
CASES = 24


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    """CASES copies of a passing case: enough that --jobs asks for more workers than the limits below allow."""
    directory = tmp_path_factory.mktemp("suite")
    for i in range(CASES):
        for suffix in (".npz", ".out.npz"):
            shutil.copyfile(ROOT / "fixtures" / "cases" / f"bn1{suffix}", directory / f"case{i:02d}{suffix}")
    return directory


@contextlib.contextmanager
def session(args: list[str], preexec=None, **kwargs):
    """A child in a session of its own; on the way out its whole group is killed (a worker left alive included)."""
    def start() -> None:
        os.setsid()
        if preexec is not None:
            preexec()

    process = subprocess.Popen(args, cwd=ROOT, env=ENV, preexec_fn=start, **kwargs)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def finish(process: subprocess.Popen, timeout: float = 60) -> tuple[int | None, str, str]:
    """The child's exit code and output, or None if it did not end within the timeout (the hang)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", ""
    return process.returncode, out, err


def _limit(resource_name: str, value: int):
    def apply() -> None:
        import resource

        number = getattr(resource, resource_name)
        resource.setrlimit(number, (value, min(value, resource.getrlimit(number)[1]) if value >= 0 else value))
    return apply


# ---------------------------------------------------------------- limits: start what fits, never hang


@pytest.mark.parametrize("limit", [48, 20])
def test_check_jobs_under_an_open_file_limit_starts_what_fits(suite: Path, limit: int) -> None:
    """`ulimit -n 48` and --jobs 16 (about 2 descriptors a worker): it hung after blaming stdout."""
    with session([*BNBWD, "check", str(suite), "--jobs", "16"], _limit("RLIMIT_NOFILE", limit),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        code, out, err = finish(process)
    assert code == 0, (code, err)
    assert out.count("PASS  ") == CASES and "stdout" not in err
    [note] = err.splitlines()
    assert note.startswith("note: --jobs 16: ") and f"the open-file limit, ulimit -n {limit}" in note
    assert ("--jobs 1" in note) if limit == 20 else ("worker processes started" in note and "fits" in note)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="the default asks for a pool only with two usable cores or more")
def test_the_default_jobs_note_does_not_say_a_jobs_the_user_never_gave(suite: Path) -> None:
    with session([*BNBWD, "check", str(suite)], _limit("RLIMIT_NOFILE", 20),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        code, out, err = finish(process)
    assert code == 0 and out.count("PASS  ") == CASES, (code, err)
    [note] = err.splitlines()
    cores = len(os.sched_getaffinity(0))
    assert note.startswith(f"note: {cores} workers (the default: one a usable core): no worker process could start "
                           "(the open-file limit, ulimit -n 20)"), note


# A process limit cannot be set for root (the kernel exempts it): fork's EAGAIN is planted instead, for every uid.
FORK_LIMIT = """
import errno, os, sys
allowed = int(sys.argv[1])
real_fork = os.fork
def fork():
    with open(f"/proc/self/task/{os.getpid()}/children") as children:
        if len(children.read().split()) >= allowed:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    return real_fork()
os.fork = fork
from bnbwd_cli.cli import main
main(sys.argv[2:], prog_name="bnbwd")
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts children in /proc")
@pytest.mark.parametrize("allowed, started", [(3, "3 worker processes started"), (0, "no worker process")])
def test_check_jobs_under_a_process_limit_starts_what_fits(suite: Path, allowed: int, started: str) -> None:
    with session([sys.executable, "-c", FORK_LIMIT, str(allowed), "check", str(suite), "--jobs", "8"],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        code, out, err = finish(process)
    assert code == 0, (code, err)
    assert out.count("PASS  ") == CASES
    [note] = err.splitlines()
    assert note.startswith("note: --jobs 8: ") and started in note and "the process limit, ulimit -u" in note


@pytest.mark.skipif(os.geteuid() == 0, reason="root is exempt from RLIMIT_NPROC")
def test_check_jobs_under_a_real_process_limit_never_hangs(suite: Path) -> None:
    def fits() -> None:  # this user's processes now, and two more
        import resource

        count = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _uid(p) == os.getuid())
        resource.setrlimit(resource.RLIMIT_NPROC, (count + 2, resource.getrlimit(resource.RLIMIT_NPROC)[1]))

    with session([*BNBWD, "check", str(suite), "--jobs", "8"], fits, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True) as process:
        code, out, err = finish(process)
    assert code == 0 and out.count("PASS  ") == CASES, (code, err)


def _uid(process: Path) -> int | None:
    with contextlib.suppress(OSError):
        return process.stat().st_uid
    return None


# A Python user's own child, then a pool that fails to start its third worker (EAGAIN), then a pool stopped early:
# bnbwd kills its own workers, never the user's child (it reaped multiprocessing.active_children(), theirs too).
USER_CHILD = """
import errno, multiprocessing, os, sys, time
from bnbwd_cli.app import workers
mine = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
mine.start()
real_fork = os.fork
def fork():
    with open(f"/proc/self/task/{os.getpid()}/children") as children:
        if len(children.read().split()) >= 3:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    return real_fork()
os.fork = fork
pool = workers.start_pool(4, "--jobs 4")
print(pool.workers, pool.note, mine.is_alive())
os.fork = real_fork
for _ in workers.results(pool, abs, [1, 2, 3]):
    break  # the caller stops early: the pool's workers are killed
mine.join(0.5)
print(mine.is_alive(), [p.exitcode is not None for p in pool.processes])  # ended (killed, or out on their own first)
mine.kill()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts children in /proc")
def test_a_pool_kills_its_own_workers_only(tmp_path: Path) -> None:
    with session([sys.executable, "-c", USER_CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True) as process:
        code, out, err = finish(process)
    assert code == 0, (code, err)
    started, stopped = out.splitlines()
    assert started.startswith("2 --jobs 4: 2 worker processes started (the process limit") and \
        started.endswith("True"), started  # the user's child survived the failed start
    assert stopped == "True [True, True]", stopped  # ... and the early stop; the pool's two workers are gone


# ---------------------------------------------------------------- workers end with their parent


def _read_until_eof(stream, timeout: float) -> bool:
    """Read the pipe until every writer has closed it; False if one still held it at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready and not os.read(stream.fileno(), 65536):
            return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_workers_end_with_their_parent(suite: Path, sig: int) -> None:
    """The OOM killer's SIGKILL, or SIGHUP, to `check --jobs 2` alone: its workers held the pipe, the reader hung."""
    with session([*BNBWD, "check", str(suite), "--jobs", "2"], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE) as process:
        assert select.select([process.stdout], [], [], 60)[0], "no first line"
        assert process.stdout.readline().startswith(b"PASS  ")  # the workers run
        os.kill(process.pid, sig)
        assert _read_until_eof(process.stdout, 15), "a worker still holds stdout after its parent died"
        code, _, err = finish(process)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 129), err
    if sig == signal.SIGHUP:
        assert error_line(err).startswith("error: hung up (SIGHUP)")


# ---------------------------------------------------------------- SIGHUP is SIGTERM

SIGNAL_MID_WRITE = """
import os, signal, sys
from bnbwd_cli.app import cases
from bnbwd_cli.files import write as files_write
real_write_npy, real_npz_bytes = files_write.write_npy, cases.suite_files.npz_bytes
def write_then_hang_up(stream, array):  # run --stream's diff_src, staged
    real_write_npy(stream, array)
    os.kill(os.getpid(), signal.SIGHUP)
def case_then_hang_up(arrays):  # cases: the first case written, the suite not yet
    data = real_npz_bytes(arrays)
    os.kill(os.getpid(), signal.SIGHUP)
    return data
files_write.write_npy = write_then_hang_up
cases.suite_files.npz_bytes = case_then_hang_up
from bnbwd_cli.cli import main
main(sys.argv[1:], prog_name="bnbwd")
"""


@pytest.mark.parametrize("command", ["run --stream", "cases"])
def test_sighup_cleans_up_as_sigterm_does(tmp_path: Path, command: str) -> None:
    """SIGHUP (a closed terminal) mid-write: exit 129, one line, no temp file and no partial folder left."""
    import numpy as np

    out = tmp_path / "out"
    if command == "cases":
        args = ["cases", "-o", str(out / "suite")]
    else:
        with np.load(ROOT / "fixtures" / "cases" / "bn1.npz") as bundle:
            flags = []
            for ours, theirs in (("src", "input"), ("diff-dst", "grad_output"), ("mean", "save_mean"),
                                 ("variance", "save_invstd"), ("gamma", "weight")):
                np.save(tmp_path / f"{theirs}.npy", bundle[theirs])
                flags += [f"--{ours}", str(tmp_path / f"{theirs}.npy")]
        args = ["run", "-q", *flags, "--variance-is-invstd", "--epsilon", "1e-5", "--format", "NCHW", "--stream",
                "--out-dir", str(out)]
    out.mkdir()
    with session([sys.executable, "-c", SIGNAL_MID_WRITE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True) as process:
        code, _, err = finish(process)
    assert code == 129, err
    assert error_line(err) == "error: hung up (SIGHUP); no partial output file is left"
    assert sorted(p.name for p in out.iterdir()) == []
