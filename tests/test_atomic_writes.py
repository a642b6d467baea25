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
from tests.conftest import default_sigint, error_line, make_inputs, save_bundle, save_npy_flags

OLD_CONTENT = b"previous run's output: must survive a failed write"


@contextlib.contextmanager
def atomic_file(path: Path):
    """One file as an output set of its own."""
    with OutputSet() as outputs:
        yield outputs.new_file(path)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    arrays = make_inputs(np.random.default_rng(3), (2, 4, 8, 8))
    del arrays["beta"]
    return Path(save_bundle(tmp_path / "bundle.npz", arrays, epsilon=1e-5, data_format="NCHW"))


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
    real_write = files_write.write_npy
    calls = []

    def write(stream, array):
        calls.append(array.shape)
        if len(calls) == 3:
            raise enospc()
        real_write(stream, array)

    monkeypatch.setattr(files_write, "write_npy", write)
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
    assert "No space left on device" in error_line(result.stderr)
    assert listing(out) == ["grads.npz"] and (out / "grads.npz").read_bytes() == OLD_CONTENT


def test_disk_full_at_fsync(bundle: Path, out: Path, monkeypatch) -> None:
    monkeypatch.setattr(files_write.os, "fsync", lambda fd: (_ for _ in ()).throw(enospc()))
    result = run_cli(bundle, "--out-dir", out, "--fsync")
    assert result.exit_code == 3 and "No space left on device" in error_line(result.stderr)
    assert listing(out) == []


def test_ctrl_c_mid_write_exits_130_and_leaves_nothing(bundle: Path, out: Path, monkeypatch) -> None:
    fail_writes_after(monkeypatch, 2_000, KeyboardInterrupt())
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 130
    assert "interrupted" in error_line(result.stderr)
    assert listing(out) == []


def test_rename_failure_removes_temp(bundle: Path, out: Path, monkeypatch) -> None:
    monkeypatch.setattr(files_write.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 3 and "cross-device" in error_line(result.stderr)
    assert listing(out) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions; see the monkeypatched tests")
def test_read_only_output_directory(bundle: Path, out: Path) -> None:
    out.chmod(0o555)
    try:
        result = run_cli(bundle, "-o", out / "grads.npz")
    finally:
        out.chmod(0o755)
    assert result.exit_code == 3 and re.search(r"not writable", error_line(result.stderr))
    assert listing(out) == []


def test_read_only_output_directory_detected_up_front(bundle: Path, out: Path, monkeypatch) -> None:
    real_access = os.access
    monkeypatch.setattr(files_write.os, "access", lambda p, mode: False if Path(p) == out else real_access(p, mode))
    result = run_cli(bundle, "-o", out / "grads.npz")
    assert result.exit_code == 3
    assert re.search(r"output .*grads\.npz: directory .*out is not writable", error_line(result.stderr))
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
    assert re.search(r"output .*grads\.npz: cannot create a file in .*Read-only file system", error_line(result.stderr))
    assert listing(out) == []


SIGINT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from bnbwd_cli.files import write as files_write
    from bnbwd_cli.cli import main

    real_save_npz = files_write.save_npz

    def savez_then_ctrl_c(stream, arrays):
        stream.write(b"PK\\x03\\x04 half an archive")
        stream.flush()
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered mid-write
        real_save_npz(stream, arrays)

    files_write.save_npz = savez_then_ctrl_c
    main(sys.argv[1:], prog_name="bnbwd")
    """
)


def test_real_sigint_mid_write(bundle: Path, out: Path) -> None:
    completed = subprocess.run([sys.executable, "-c", SIGINT_SCRIPT, "run", "-q", str(bundle), "-o", str(out / "grads.npz")],
                               capture_output=True, text=True, timeout=60, preexec_fn=default_sigint)
    assert completed.returncode == 130, completed.stderr
    assert completed.stderr.strip().splitlines() == ["error: interrupted; no partial output file is left"]
    assert listing(out) == []



def npy_inputs(bundle: Path, directory: Path) -> list[str]:
    """The bundle's tensors as .npy flags, as --stream wants them."""
    with np.load(bundle) as arrays:
        return save_npy_flags(directory, arrays) + ["--epsilon", "1e-5", "--format", "NCHW"]


@pytest.mark.parametrize("error", [enospc(), KeyboardInterrupt()], ids=["disk-full", "ctrl-c"])
@pytest.mark.parametrize("target", ["-o", "--out-dir"])
def test_stream_mode_failure_leaves_nothing(bundle: Path, out: Path, tmp_path: Path, monkeypatch, error, target) -> None:
    args = npy_inputs(bundle, tmp_path)
    monkeypatch.setattr(files_write.os, "fsync", lambda fd: (_ for _ in ()).throw(error))
    result = run_cli(*args, "--stream", "--fsync", target, out / "grads.npz" if target == "-o" else out)
    assert result.exit_code == (3 if isinstance(error, OSError) else 130), result.stderr
    assert re.search("No space left|interrupted", error_line(result.stderr))
    assert listing(out) == []


# ---------------------------------------------------------------- destinations, odd paths, streamed outputs, faults


@pytest.mark.parametrize("target", ["actual", "reference"])
def test_verify_json_never_replaces_an_input(bundle: Path, out: Path, target: str) -> None:
    """`bnbwd verify A.npz R.npz --json A.npz` replaced A.npz with JSON and exited 0."""
    actual, reference = out / "a.npz", out / "r.npz"
    assert run_cli(bundle, "-o", actual).exit_code == 0 and run_cli(bundle, "-o", reference).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    victim = actual if target == "actual" else reference
    result = CliRunner().invoke(main, ["verify", str(actual), str(reference), "--json", str(victim)])
    assert result.exit_code == 3
    assert re.search(r"--json .*: is also an input .*refusing to overwrite it", error_line(result.stderr))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("flag,value", [("-o", ""), ("-o", "missing/"), ("-o", "sub/"), ("--json", "")],
                         ids=["o-empty", "o-missing-dir-slash", "o-existing-dir-slash", "json-empty"])
def test_empty_and_directory_output_names_are_refused(bundle: Path, out: Path, monkeypatch, flag: str, value: str) -> None:
    """`-o ''` exited 0 writing nothing; `-o dir/` created a file named `dir`."""
    monkeypatch.chdir(out)
    (out / "sub").mkdir()
    extra = ["-o", "grads.npz"] if flag == "--json" else []
    result = run_cli(bundle, flag, value, *extra)
    assert result.exit_code == 3
    assert re.search(r"empty file name|is a directory, expected a file name", error_line(result.stderr))
    assert listing(out) == ["sub"] and listing(out / "sub") == []


@pytest.mark.parametrize("flag", ["-o", "--json"])
def test_fifo_is_written_through_not_replaced(bundle: Path, out: Path, flag: str) -> None:
    """`-o FIFO` replaced the named pipe by a regular file."""
    fifo = out / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there: the writer's open does not block
    try:
        args = [flag, fifo] + (["-o", out / "grads.npz"] if flag == "--json" else [])
        result = run_cli(bundle, *args)
        assert result.exit_code == 0, result.stderr
        data = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert stat_is_fifo(fifo)
    if flag == "-o":
        with np.load(__import__("io").BytesIO(data)) as written:
            assert sorted(written.files) == ["diff_beta", "diff_gamma", "diff_src"]
    else:
        assert b'"command": "run"' in data
    assert [name for name in listing(out) if name.endswith(".tmp")] == []


def stat_is_fifo(path: Path) -> bool:
    import stat

    return stat.S_ISFIFO(path.stat().st_mode)


@pytest.mark.parametrize("flag", ["-o", "--json", "--out-dir-json"])
def test_long_valid_output_names_work(bundle: Path, out: Path, flag: str) -> None:
    """A valid 245-character name failed: the temp name beside it was longer than NAME_MAX."""
    name = "g" * 241 + ".npz"  # 245 characters
    if flag == "-o":
        args = ["-o", out / name]
    else:
        args = ["-o", out / "grads.npz", "--json", out / (name[:-4] + ".json" + "x" * 5)]
    result = run_cli(bundle, *args)
    assert result.exit_code == 0, result.stderr
    assert all(len(n) <= 255 for n in listing(out)) and not [n for n in listing(out) if n.endswith(".tmp")]
    assert len(listing(out)) == (1 if flag == "-o" else 2)


@pytest.mark.parametrize("target", ["--out-dir", "--json"])
def test_streamed_and_json_outputs_get_the_umask_mode(bundle: Path, out: Path, tmp_path: Path, target: str) -> None:
    """The streamed diff_src got mkstemp's 0600; the JSON file too is created with the umask's mode."""
    args = npy_inputs(bundle, tmp_path)
    old = os.umask(0o027)
    try:
        extra = ["--out-dir", out] if target == "--out-dir" else ["-o", out / "g.npz", "--json", out / "facts.json"]
        result = run_cli(*args, "--stream", *extra)
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.stderr
    checked = out / ("diff_src.npy" if target == "--out-dir" else "facts.json")
    assert checked.stat().st_mode & 0o777 == 0o640


def test_stream_out_dir_is_all_or_nothing(bundle: Path, out: Path, tmp_path: Path, monkeypatch) -> None:
    """`--stream --out-dir` renamed diff_src.npy before diff_gamma/diff_beta were written."""
    args = npy_inputs(bundle, tmp_path)
    real_write = files_write.write_npy

    def write(stream, array):
        if array.ndim == 1:
            raise enospc()
        real_write(stream, array)

    monkeypatch.setattr(files_write, "write_npy", write)
    result = run_cli(*args, "--stream", "--out-dir", out)
    assert result.exit_code == 3 and "No space left on device" in error_line(result.stderr)
    assert listing(out) == []


def test_stream_npz_stages_under_a_unique_name(bundle: Path, out: Path, tmp_path: Path) -> None:
    """`--stream -o OUT.npz` staged at .OUT.npz.diff_src.npy, overwriting then deleting whatever was there."""
    args = npy_inputs(bundle, tmp_path)
    bystander = out / ".grads.npz.diff_src.npy"
    bystander.write_bytes(OLD_CONTENT)
    result = run_cli(*args, "--stream", "-o", out / "grads.npz")
    assert result.exit_code == 0, result.stderr
    assert listing(out) == [".grads.npz.diff_src.npy", "grads.npz"] and bystander.read_bytes() == OLD_CONTENT


@pytest.mark.parametrize("target", ["-o", "--out-dir"])
def test_stream_disk_full_at_preallocation(bundle: Path, out: Path, tmp_path: Path, monkeypatch, target: str) -> None:
    """A full disk under the streamed output: exit 3 at the preallocation, nothing left (was SIGBUS, exit 135)."""
    args = npy_inputs(bundle, tmp_path)
    monkeypatch.setattr(files_write.os, "posix_fallocate", lambda fd, offset, size: (_ for _ in ()).throw(enospc()))
    result = run_cli(*args, "--stream", target, out / "grads.npz" if target == "-o" else out)
    assert result.exit_code == 3 and "No space left on device" in error_line(result.stderr)
    assert listing(out) == []


def big_npy_inputs(directory: Path, shape=(2, 4, 64, 64)) -> list[str]:
    rng = np.random.default_rng(5)
    arrays = {key: rng.normal(size=shape).astype(np.float32) for key in ("src", "diff_dst")}
    arrays |= {key: np.full(shape[1], 1.0, np.float32) for key in ("mean", "variance")}
    return save_npy_flags(directory, arrays, names=tuple(arrays)) + ["--epsilon", "1e-5", "--format", "NCHW"]


@pytest.mark.parametrize("target", ["-o", "--out-dir"])
def test_file_size_limit_is_a_clean_error(out: Path, tmp_path: Path, target: str) -> None:
    """RLIMIT_FSIZE (`ulimit -f`) below the output's size: EFBIG, exit 3, nothing left behind."""
    import resource

    args = big_npy_inputs(tmp_path)  # diff_src: 128 KiB
    destination = str(out / "grads.npz") if target == "-o" else str(out)
    completed = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", "-q", *args, "--stream", target, destination],
                               capture_output=True, text=True, timeout=60,
                               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10)))
    assert completed.returncode == 3, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"error: output .*: write failed \(File too large\)", lines[0]), completed.stderr
    assert listing(out) == []


TRUNCATE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from bnbwd_cli import core
    from bnbwd_cli.app import streaming
    from bnbwd_cli.cli import main

    victim, real = sys.argv.pop(1), core.backward
    streaming.STREAM_BLOCK_BYTES = 1  # one channel a block: the file is read again after the first block
    calls = []

    def truncate_then_compute(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            os.truncate(victim, 200)  # another process cuts the input short while bnbwd reads it
        return real(*args, **kwargs)

    core.backward = truncate_then_compute  # streaming calls it as compute_core.backward
    main(sys.argv[1:], prog_name="bnbwd")
    """
)


@pytest.mark.parametrize("victim,target", [("src", "--out-dir"), ("diff_dst", "-o")])
def test_input_truncated_while_streamed(out: Path, tmp_path: Path, victim: str, target: str) -> None:
    """An input cut short during a --stream run: exit 3 and one line (was SIGBUS: exit 135, a temp file left)."""
    args = big_npy_inputs(tmp_path)
    destination = str(out / "grads.npz") if target == "-o" else str(out)
    completed = subprocess.run([sys.executable, "-c", TRUNCATE_SCRIPT, str(tmp_path / f"{victim}.npy"), "run", "-q", *args,
                                "--stream", target, destination], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 3, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(rf"error: {victim} .*changed size while it was read", lines[0]), completed.stderr
    assert listing(out) == []


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from bnbwd_cli.app import streaming
    from bnbwd_cli.files import write as files_write
    from bnbwd_cli.cli import main

    real_save_npz, real_write_npy = files_write.save_npz, files_write.write_npy

    def savez_then_term(stream, arrays):
        stream.write(b"PK\\x03\\x04 half an archive")
        os.kill(os.getpid(), signal.SIGTERM)  # `kill PID` (a CI timeout) mid-write
        real_save_npz(stream, arrays)

    def write_then_term(stream, array):
        real_write_npy(stream, array)
        os.kill(os.getpid(), signal.SIGTERM)

    files_write.save_npz = savez_then_term
    files_write.write_npy = write_then_term
    main(sys.argv[1:], prog_name="bnbwd")
    """
)


@pytest.mark.parametrize("target", ["-o", "--stream-out-dir"])
def test_sigterm_is_handled_like_ctrl_c(bundle: Path, out: Path, tmp_path: Path, target: str) -> None:
    """SIGTERM mid-write: exit 143, one line, no temp file left (it left `.*.tmp` files behind)."""
    if target == "-o":
        args = [str(bundle), "-o", str(out / "grads.npz")]
    else:
        args = [*npy_inputs(bundle, tmp_path), "--stream", "--out-dir", str(out)]
    completed = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT, "run", "-q", *args], capture_output=True, text=True,
                               timeout=60)
    assert completed.returncode == 143, completed.stderr
    assert completed.stderr.strip().splitlines() == ["error: terminated (SIGTERM); no partial output file is left"]
    assert listing(out) == []


@pytest.mark.parametrize("flags,expected", [([], 0), (["--fsync"], 1)], ids=["default", "fsync"])
@pytest.mark.parametrize("target", ["-o", "--out-dir"])
def test_fsync_is_opt_in(bundle: Path, out: Path, monkeypatch, flags: list[str], expected: int, target: str) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(files_write.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    result = run_cli(bundle, *flags, target, out / "grads.npz" if target == "-o" else out)
    assert result.exit_code == 0
    assert bool(synced) == bool(expected)
