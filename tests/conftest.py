"""Shared fixtures and the one copy of each test factory: inputs, files and flags, the CLI's error line."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import settings

from bnbwd_cli.cli import main

INPUT_NAMES = ("src", "diff_dst", "mean", "variance", "gamma")
ROOT = Path(__file__).resolve().parent.parent

# Hypothesis: the suite draws the same examples on every run and machine (a CI failure reproduces by rerunning
# it), and keeps no example database beside the checkout. HYPOTHESIS_PROFILE=explore draws fresh examples.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------- the numba JIT, compiled once a session

_warm_up_process: subprocess.Popen | None = None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    """Numba tests last (a stable sort): the warm-up then has every other test's time to compile in.

    A test parametrized with core="numba" is a numba test too (marked here): unmarked, it ran among the first
    tests and compiled the kernels in this process while the warm-up compiled the same ones beside it.
    """
    for item in items:
        if getattr(item, "callspec", None) and item.callspec.params.get("core") == "numba":
            item.add_marker(pytest.mark.numba)
    items.sort(key=lambda item: item.get_closest_marker("numba") is not None)


def default_sigint() -> None:
    """preexec_fn for a child that must see Ctrl-C: SIGINT back to its default action.

    A shell's background job (`pytest &` without job control) starts with SIGINT ignored; the child inherits
    that, and Python then never raises KeyboardInterrupt, so the signal tests would time out or exit 0.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pytest_collection_finish(session) -> None:
    """With numba tests among the selected ones, start compiling their kernels now, in a second process.

    On a cold numba cache (CI) the JIT then runs on another core while the other tests run, and writes the
    disk cache the tests load from (fixture numba_jit). With a warm cache the process only loads it (~2 s).
    """
    global _warm_up_process
    if session.config.option.collectonly or not importlib.util.find_spec("numba"):
        return
    if any(item.get_closest_marker("numba") for item in session.items):  # after -m/-k deselection
        _warm_up_process = subprocess.Popen([sys.executable, "-m", "tests.numba_warmup"], cwd=ROOT,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionfinish(session, exitstatus) -> None:
    if _warm_up_process is not None and _warm_up_process.poll() is None:  # e.g. -x stopped the run early
        _warm_up_process.kill()
        _warm_up_process.wait()


@pytest.fixture(scope="session")
def numba_jit():
    """Every numba kernel the tests use, compiled once: from the background warm-up's disk cache, or here."""
    pytest.importorskip("numba")
    from tests.numba_warmup import warm_up

    if _warm_up_process is not None:
        _warm_up_process.wait()  # then its cache entries load instead of compiling (it ran before us)
    warm_up()  # compiles whatever the cache lacks (no cache dir, a failed warm-up): the tests' JIT cost, once


@pytest.fixture(autouse=True)
def _numba_marked(request) -> None:
    """Tests marked `numba` share the session's compiled kernels (their compile time is not theirs)."""
    if request.node.get_closest_marker("numba"):
        request.getfixturevalue("numba_jit")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261123)


@pytest.fixture
def cli():
    """Invoke the real CLI in-process: cli("run", "x.npz", ...) -> click Result (stderr kept apart)."""
    runner = CliRunner()

    def invoke(*args: str, input: bytes | None = None):
        return runner.invoke(main, [str(a) for a in args], input=input, catch_exceptions=True)

    return invoke


@pytest.fixture
def ws(tmp_path: Path):
    """The catalogue of bad inputs' workspace (tests/catalogue.py): input files under in/, outputs under out/."""
    from tests.catalogue import Workspace

    return Workspace(tmp_path)


def make_inputs(rng: np.random.Generator, shape, data_format: str = "NCX", dtype=np.float32, stats_dtype=np.float32):
    """A consistent set of op inputs: src/diff_dst of `shape`, (C,) stats with realistic values.

    A shape of rank < 2 (a malformed input for the error tests) gets stats of 0 channels.
    """
    channels = (shape[1] if data_format == "NCX" else shape[-1]) if len(shape) > 1 else 0
    src = rng.normal(0.5, 2.0, size=shape).astype(dtype)
    return {
        "src": src,
        "diff_dst": rng.normal(size=shape).astype(dtype),
        "mean": rng.normal(0.5, 0.1, size=channels).astype(stats_dtype),
        "variance": rng.uniform(2.0, 6.0, size=channels).astype(stats_dtype),
        "gamma": rng.uniform(0.5, 1.5, size=channels).astype(stats_dtype),
        "beta": rng.normal(size=channels).astype(stats_dtype),
    }


def save_bundle(path, arrays: dict, **attributes) -> str:
    extra = {key: np.array(value) for key, value in attributes.items()}
    np.savez(path, **arrays, **extra)
    return str(path)


def npz_archive(arrays: dict[str, np.ndarray], method=None, stream: bool = False, zip64: bool = False) -> bytes:
    """An .npz's bytes: any zip method; `stream`: written as zipfile writes to a pipe (sizes after each member)."""
    class Unseekable(io.RawIOBase):
        def __init__(self) -> None:
            super().__init__()
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            self.data += data
            return len(data)

    target = Unseekable() if stream else io.BytesIO()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED if method is None else method) as archive:
        for key, array in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=zip64) as member:
                member.write(npy_bytes(array))
    return bytes(target.data) if stream else target.getvalue()


def load_npz(path) -> dict[str, np.ndarray]:
    """Every array of an .npz, read into memory (bfloat16 comes back as raw |V2, as NumPy stores it)."""
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def save_npy_flags(directory: Path, arrays: dict, names=INPUT_NAMES) -> list[str]:
    """Each named array as `directory/NAME.npy` and its flag: ["--src", ".../src.npy", "--diff-dst", ...]."""
    flags = []
    for name in names:
        path = Path(directory) / f"{name}.npy"
        np.save(path, arrays[name], allow_pickle=False)
        flags += ["--" + name.replace("_", "-"), str(path)]
    return flags


def error_line(stderr: str | bytes, pattern: str = "") -> str:
    """The one `error: ...` line a failing command writes (blank lines aside), checked against `pattern`."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def assert_one_error(result, pattern: str, code: int = 3) -> None:
    """A click Result: exit `code`, one error line matching `pattern`, no traceback, no click usage block."""
    assert result.exit_code == code, (result.exit_code, result.output)
    error_line(result.stderr, pattern)
    assert "Traceback" not in result.output and "Usage:" not in result.output


# --------------------------------------------------------------------------- run's outputs, read back


def run_outputs(cli, tmp_path: Path, *args: str, name: str = "grads.npz") -> dict[str, np.ndarray]:
    """`run ARGS --epsilon 1e-3 --format NCHW -o NAME`'s outputs (bfloat16 ones as bfloat16)."""
    from bnbwd_cli.dtypes import BFLOAT16

    out = tmp_path / name
    result = cli("run", *args, "--epsilon", "1e-3", "--format", "NCHW", "-q", "-o", out)
    assert result.exit_code == 0, result.output
    with np.load(out) as archive:  # np.save stores bfloat16 as |V2
        return {key: value.view(BFLOAT16) if value.dtype.kind == "V" else value for key, value in archive.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
