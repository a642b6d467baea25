"""Writes are atomic: a temp file beside the target, fsync, rename; on any failure the temp file goes.

Disk full, a read-only directory and Ctrl-C are simulated by monkeypatching the calls the writer
makes (tests run as root, where chmod does not stop writes); one test delivers a real SIGINT to a
real process in the middle of a write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.files import write as files_write
from bnbwd_cli.cli import main
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.write import OutputSet, write_npy_dir, write_npz

OLD_CONTENT = b"previous run's output: must survive a failed write"


@contextlib.contextmanager
def atomic_file(path: Path):
    """One file as an output set of its own."""
    with OutputSet() as outputs:
        yield outputs.new_file(path)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    shape = (2, 4, 8, 8)
    arrays = {
        "src": rng.normal(size=shape).astype(np.float32),
        "diff_dst": rng.normal(size=shape).astype(np.float32),
        "mean": rng.normal(size=4).astype(np.float32),
        "variance": rng.uniform(1, 2, size=4).astype(np.float32),
        "gamma": rng.uniform(1, 2, size=4).astype(np.float32),
    }
    path = tmp_path / "bundle.npz"
    np.savez(path, **arrays, epsilon=np.array(1e-5), data_format=np.array("NCHW"))
    return path


@pytest.fixture
def out(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


class FailingFile:
    """Wraps a real file; write() raises `error` once `limit` bytes have gone through."""

    def __init__(self, real, limit: int, error: BaseException) -> None:
        self.real, self.limit, self.error, self.written = real, limit, error, 0

    def write(self, data) -> int:
        if self.written + len(data) > self.limit:
            raise self.error
        self.written += len(data)
        return self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.real.close()


def fail_writes_after(monkeypatch, limit: int, error: BaseException) -> None:
    real_fdopen = os.fdopen
    monkeypatch.setattr(files_write.os, "fdopen", lambda fd, *a, **k: FailingFile(real_fdopen(fd, *a, **k), limit, error))


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def run_cli(*args) -> object:
    result = CliRunner().invoke(main, ["run", "-q", *map(str, args)], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output + result.stderr
    return result


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ---------------------------------------------------------------- the writer itself


def test_atomic_file_writes_renames_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    with atomic_file(target) as stream:
        stream.write(b"data")
        assert listing(tmp_path) != ["x.bin"]  # not there until the rename
    assert target.read_bytes() == b"data" and listing(tmp_path) == ["x.bin"]


def test_outputs_get_a_umask_mode_not_mkstemps_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_npz(tmp_path / "g.npz", {"a": np.ones(2)})
    finally:
        os.umask(old)
    assert (tmp_path / "g.npz").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("error", [enospc(), KeyboardInterrupt(), ValueError("bug")], ids=["enospc", "ctrl-c", "bug"])
def test_atomic_file_removes_temp_on_any_failure(tmp_path: Path, error: BaseException) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(OLD_CONTENT)
    expected = BnbwdError if isinstance(error, OSError) else type(error)
    with pytest.raises(expected):
        with atomic_file(target) as stream:
            stream.write(b"half")
            raise error
    assert listing(tmp_path) == ["x.bin"] and target.read_bytes() == OLD_CONTENT


def test_fsync_failure_is_one_line_and_keeps_the_old_file(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "g.npz"
    target.write_bytes(OLD_CONTENT)
    monkeypatch.setattr(files_write.os, "fsync", lambda fd: (_ for _ in ()).throw(enospc()))
    with pytest.raises(BnbwdError, match=r"g\.npz: write failed \(No space left on device\)"):
        write_npz(target, {"a": np.ones(3)}, fsync=True)
    assert listing(tmp_path) == ["g.npz"] and target.read_bytes() == OLD_CONTENT


def test_out_dir_is_all_or_nothing_when_a_later_file_fails(tmp_path: Path, monkeypatch) -> None:
    arrays = {"diff_src": np.ones((64, 64)), "diff_gamma": np.ones(64), "diff_beta": np.ones(64)}
    real_save = np.save
    calls = []

    def save(stream, array, **kwargs):
        calls.append(array.shape)
        if len(calls) == 3:
            raise enospc()
        real_save(stream, array, **kwargs)

    monkeypatch.setattr(files_write.np, "save", save)
    with pytest.raises(BnbwdError, match="No space left"):
        write_npy_dir(tmp_path, arrays)
    assert listing(tmp_path) == []  # diff_src.npy and diff_gamma.npy were complete, yet neither appears


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a file descriptor")
def test_out_dir_fsync_failure_on_one_file_leaves_none(tmp_path: Path, monkeypatch) -> None:
    """Renames happen only after every file is fsynced: no set of new and old files mixed."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if "diff_src" in os.readlink(f"/proc/self/fd/{fd}"):
            raise enospc()
        real_fsync(fd)

    monkeypatch.setattr(files_write.os, "fsync", fsync)
    with pytest.raises(BnbwdError, match="No space left"):
        write_npy_dir(tmp_path, {"diff_src": np.ones(8), "diff_gamma": np.ones(2), "diff_beta": np.ones(2)}, fsync=True)
    assert listing(tmp_path) == []


def test_out_dir_ctrl_c_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    fail_writes_after(monkeypatch, 10_000, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        write_npy_dir(tmp_path, {"diff_src": np.ones((64, 64)), "diff_gamma": np.ones(64)})
    assert listing(tmp_path) == []


# ---------------------------------------------------------------- through the CLI


@pytest.mark.parametrize("limit", [0, 100, 1_500], ids=["at-open", "in-header", "mid-data"])
def test_disk_full_mid_write(bundle: Path, out: Path, monkeypatch, limit: int) -> None:
    (out / "grads.npz").write_bytes(OLD_CONTENT)
    fail_writes_after(monkeypatch, limit, enospc())
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 3
    assert "No space left on device" in one_error_line(result)
    assert listing(out) == ["grads.npz"] and (out / "grads.npz").read_bytes() == OLD_CONTENT


def test_disk_full_at_fsync(bundle: Path, out: Path, monkeypatch) -> None:
    monkeypatch.setattr(files_write.os, "fsync", lambda fd: (_ for _ in ()).throw(enospc()))
    result = run_cli(bundle, "--out-dir", out, "--fsync")
    assert result.exit_code == 3 and "No space left on device" in one_error_line(result)
    assert listing(out) == []


def test_ctrl_c_mid_write_exits_130_and_leaves_nothing(bundle: Path, out: Path, monkeypatch) -> None:
    fail_writes_after(monkeypatch, 2_000, KeyboardInterrupt())
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 130
    assert "interrupted" in one_error_line(result)
    assert listing(out) == []


def test_rename_failure_removes_temp(bundle: Path, out: Path, monkeypatch) -> None:
    monkeypatch.setattr(files_write.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 3 and "cross-device" in one_error_line(result)
    assert listing(out) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions; see the monkeypatched tests")
def test_read_only_output_directory(bundle: Path, out: Path) -> None:
    out.chmod(0o555)
    try:
        result = run_cli(bundle, "-o", out / "grads.npz")
    finally:
        out.chmod(0o755)
    assert result.exit_code == 3 and re.search(r"not writable", one_error_line(result))
    assert listing(out) == []


def test_read_only_output_directory_detected_up_front(bundle: Path, out: Path, monkeypatch) -> None:
    real_access = os.access
    monkeypatch.setattr(files_write.os, "access", lambda p, mode: False if Path(p) == out else real_access(p, mode))
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 3
    assert re.search(r"output .*grads\.npz: directory .*out is not writable", one_error_line(result))
    assert listing(out) == []


def test_read_only_file_system_at_create(bundle: Path, out: Path, monkeypatch) -> None:
    """The up-front check passes but creating the temp file fails (e.g. a read-only mount)."""
    real_open = os.open

    def read_only_open(path, flags, mode=0o777, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(files_write.os, "open", read_only_open)
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 3
    assert re.search(r"output .*grads\.npz: cannot create a file in .*Read-only file system", one_error_line(result))
    assert listing(out) == []


SIGINT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from bnbwd_cli.files import write as files_write
    from bnbwd_cli.cli import main

    real_savez = np.savez

    def savez_then_ctrl_c(stream, **arrays):
        stream.write(b"PK\\x03\\x04 half an archive")
        stream.flush()
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered mid-write
        real_savez(stream, **arrays)

    files_write.np.savez = savez_then_ctrl_c
    main(sys.argv[1:], prog_name="bnbwd")
    """
)


def test_real_sigint_mid_write(bundle: Path, out: Path) -> None:
    completed = subprocess.run([sys.executable, "-c", SIGINT_SCRIPT, "run", "-q", str(bundle), "-o", str(out / "grads.npz")],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 130, completed.stderr
    assert completed.stderr.strip().splitlines() == ["error: interrupted; no partial output file is left"]
    assert listing(out) == []



def npy_inputs(bundle: Path, directory: Path) -> list[str]:
    """The bundle's tensors as .npy flags, as --stream wants them."""
    args = []
    with np.load(bundle) as arrays:
        for key in ("src", "diff_dst", "mean", "variance", "gamma"):
            np.save(directory / f"{key}.npy", arrays[key])
            args += ["--" + key.replace("_", "-"), str(directory / f"{key}.npy")]
    return args + ["--epsilon", "1e-5", "--format", "NCHW"]


@pytest.mark.parametrize("error", [enospc(), KeyboardInterrupt()], ids=["disk-full", "ctrl-c"])
@pytest.mark.parametrize("target", ["-o", "--out-dir"])
def test_stream_mode_failure_leaves_nothing(bundle: Path, out: Path, tmp_path: Path, monkeypatch, error, target) -> None:
    args = npy_inputs(bundle, tmp_path)
    monkeypatch.setattr(files_write.os, "fsync", lambda fd: (_ for _ in ()).throw(error))
    result = run_cli(*args, "--stream", "--fsync", target, out / "grads.npz" if target == "-o" else out)
    assert result.exit_code == (3 if isinstance(error, OSError) else 130), result.stderr
    assert re.search("No space left|interrupted", one_error_line(result))
    assert listing(out) == []
