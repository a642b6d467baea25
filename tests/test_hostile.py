"""Hostile inputs and paths, class by class, through the real CLI: exit 3 and one `error:` line, never exit 4,
never a hang, never more memory or time than a rejection needs, and nothing the user had is overwritten.

Classes: a report written over an input; special paths written through; malformed headers and shapes that
must not escape as exit 4; special files (FIFOs, files truncated while read); memory before validation;
the judge's numerics near the float64 limits; interrupts while the outputs commit.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, assert_one_error, error_line, make_inputs, npy_bytes, npz_archive, save_bundle

SHAPE = (4, 8, 6, 6)
EPSILON = "1e-3"


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bnbwd(*args, cwd: Path | None = None, stdin=None, timeout: float = 60, preexec_fn=None,
          input: bytes | None = None) -> subprocess.CompletedProcess:
    """The CLI in a process of its own (bytes out), for what an in-process runner cannot show: real stdout, FIFOs,
    resource limits, signals."""
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", *map(str, args)], cwd=cwd, stdin=stdin, input=input,
                          capture_output=stdin is None or input is not None, timeout=timeout, preexec_fn=preexec_fn,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@dataclass(frozen=True)
class Measured:
    """A finished CLI process: its exit status, stderr, peak resident memory and wall time."""

    returncode: int
    stderr: bytes
    peak_mib: float
    seconds: float


# The CLI run by runpy, its peak resident memory (VmHWM: this process image's own, since exec) written at exit.
# (wait4's ru_maxrss would count the pytest process the child was forked from.)
_PEAK_WRAPPER = """
import atexit, os, runpy, sys
def report():
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(os.environ["BNBWD_TEST_PEAK"], "w") as out:
        out.write(peak)
atexit.register(report)
sys.argv = ["bnbwd", *sys.argv[1:]]
runpy.run_module("bnbwd_cli", run_name="__main__")
"""


def measured(args, stdin=None) -> Measured:
    """The CLI in a process of its own, with its peak resident memory and wall time."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        peak_file = Path(scratch) / "peak"
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-c", _PEAK_WRAPPER, *map(str, args)], stdin=stdin,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "BNBWD_TEST_PEAK": str(peak_file)})
        seconds = time.monotonic() - started
        peak_kib = int(peak_file.read_text())
    return Measured(result.returncode, result.stderr, peak_kib / 1024, seconds)


_baseline_mib: list[float] = []


def baseline_mib(tmp_path_factory) -> float:
    """The CLI's own peak memory judging two tiny files: the interpreter, NumPy, click, rich."""
    if not _baseline_mib:
        path = tmp_path_factory.mktemp("baseline") / "tiny.npz"
        np.savez(path, x=np.zeros(4, np.float32))
        _baseline_mib.append(measured(["verify", path, path]).peak_mib)
    return _baseline_mib[0]


def assert_rejected_within_budget(args, pattern: str, tmp_path_factory, stdin=None) -> Measured:
    """Exit 3 with one error line, at most 64 MiB over the CLI's own peak; seconds are asserted loosely (a hang
    guard: the suite shares two cores with other jobs), the measured time is in the result."""
    result = measured(args, stdin)
    assert result.returncode == 3, result.stderr
    error_line(result.stderr, pattern)
    assert result.peak_mib <= baseline_mib(tmp_path_factory) + 64, (result.peak_mib, baseline_mib(tmp_path_factory))
    assert result.seconds < 10, result.seconds
    return result


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    return make_inputs(np.random.default_rng(26), SHAPE)


@pytest.fixture
def case_dir(tmp_path: Path, arrays) -> Path:
    """A `check` case as a directory of .npy files (inputs and the kernel's outputs)."""
    from bnbwd_cli.core import Op
    from bnbwd_cli.core.reference import reference_backward

    directory = tmp_path / "case"
    directory.mkdir()
    for name, array in arrays.items():
        np.save(directory / f"{name}.npy", array)
    op = Op(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"], arrays["gamma"], epsilon=1e-3,
            data_format="NCX")
    for name, array in reference_backward(op).items():
        np.save(directory / f"{name}.npy", array.astype(np.float32))
    return directory


# ---------------------------------------------------------------- a report written over an input


def test_check_json_over_a_case_file_in_a_listed_directory(cli, case_dir: Path) -> None:
    before = digest(case_dir / "src.npy")
    assert_one_error(cli("check", case_dir, "--epsilon", EPSILON, "--format", "NCHW", "--json", case_dir / "src.npy"),
                     r"--json .*src\.npy: is also an input")
    assert digest(case_dir / "src.npy") == before


def test_check_json_over_a_case_reached_by_symlink_or_hard_link(cli, case_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "soft.npy").symlink_to(case_dir / "mean.npy")
    os.link(case_dir / "gamma.npy", tmp_path / "hard.npy")
    before = {name: digest(case_dir / name) for name in ("mean.npy", "gamma.npy")}
    for target in ("soft.npy", "hard.npy"):
        assert_one_error(cli("check", case_dir, "--epsilon", EPSILON, "--format", "NCHW", "--json", tmp_path / target), "is also an input")
    assert {name: digest(case_dir / name) for name in before} == before


def test_check_json_over_a_case_file_or_its_out_npz(cli, tmp_path: Path, arrays) -> None:
    case_file = Path(save_bundle(tmp_path / "c.npz", arrays))
    outputs = tmp_path / "c.out.npz"
    outputs.write_bytes(b"kernel outputs")
    for target in (case_file, outputs):
        before = digest(target)
        assert_one_error(cli("check", case_file, "--json", target), "is also an input")
        assert digest(target) == before


def test_check_json_over_a_case_of_a_directory_of_npz_cases(cli, tmp_path: Path, arrays) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    save_bundle(cases / "one.npz", arrays)
    before = digest(cases / "one.npz")
    assert_one_error(cli("check", cases, "--json", cases / "one.npz"), "is also an input")
    assert digest(cases / "one.npz") == before


@pytest.mark.parametrize("target", ["d.bin", "hard.bin", "soft.bin"])
def test_verify_json_over_a_raw_input(cli, tmp_path: Path, arrays, target: str) -> None:
    data = tmp_path / "d.bin"
    arrays["src"].tofile(data)
    os.link(data, tmp_path / "hard.bin")
    (tmp_path / "soft.bin").symlink_to(data)
    np.savez(tmp_path / "ref.npz", x=arrays["src"])
    spec = f"raw:f32:{'x'.join(map(str, SHAPE))}:{data}"
    before = digest(data)
    assert_one_error(cli("verify", spec, tmp_path / "ref.npz", "--json", tmp_path / target), "is also an input")
    assert digest(data) == before


def test_verify_json_over_a_keyed_reference_or_directory_member(cli, tmp_path: Path, case_dir: Path, arrays) -> None:
    np.savez(tmp_path / "ref.npz", src=arrays["src"])
    before = digest(tmp_path / "ref.npz")
    assert_one_error(cli("verify", case_dir / "src.npy", f"{tmp_path / 'ref.npz'}:src", "--json", tmp_path / "ref.npz"),
                     "is also an input")
    assert digest(tmp_path / "ref.npz") == before
    assert_one_error(cli("verify", case_dir, tmp_path / "ref.npz", "--json", case_dir / "diff_src.npy"),
                     "is also an input")


def test_run_outputs_over_raw_or_linked_inputs(cli, tmp_path: Path, arrays) -> None:
    arrays["src"].tofile(tmp_path / "src.bin")
    (tmp_path / "alias.npz").symlink_to(tmp_path / "src.bin")
    flags = []
    for name in ("diff_dst", "mean", "variance", "gamma"):
        np.save(tmp_path / f"{name}.npy", arrays[name])
        flags += [f"--{name.replace('_', '-')}", tmp_path / f"{name}.npy"]
    src = f"raw:f32:{'x'.join(map(str, SHAPE))}:{tmp_path / 'src.bin'}"
    before = digest(tmp_path / "src.bin")
    base = ["run", "--src", src, *flags, "--epsilon", EPSILON, "--format", "NCHW"]
    assert_one_error(cli(*base, "-o", tmp_path / "alias.npz"), "is also an input")
    assert_one_error(cli(*base, "-o", tmp_path / "o.npz", "--json", tmp_path / "src.bin"), "is also an input")
    os.link(tmp_path / "gamma.npy", tmp_path / "diff_gamma.npy")  # --out-dir's diff_gamma.npy is the gamma input
    assert_one_error(cli(*base, "--out-dir", tmp_path), "diff_gamma.npy: is also an input")
    assert digest(tmp_path / "src.bin") == before
    assert np.array_equal(np.load(tmp_path / "gamma.npy"), arrays["gamma"])


# ---------------------------------------------------------------- malformed headers and shapes: exit 3, never 4


def safetensors_bytes(header: dict | bytes, data: bytes = b"") -> bytes:
    import json
    import struct

    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def nested(depth: int, opening: bytes, closing: bytes) -> bytes:
    return opening * depth + b"1" + closing * depth


@pytest.mark.parametrize("header, pattern", [
    ({"src": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, r"dtype \['F32'\], which bnbwd cannot read"),
    ({"src": {"dtype": {"F32": 1}, "shape": [2], "data_offsets": [0, 8]}}, r"dtype \{'F32': 1\}, which"),
    ({"src": {"dtype": 32, "shape": [2], "data_offsets": [0, 8]}}, r"dtype 32, which"),
    ({"src": {"dtype": None, "shape": [2], "data_offsets": [0, 8]}}, r"dtype None, which"),
    ({"src": ["F32"]}, r"dtype \['F32'\], which"),
    (b'{"src":' + nested(5000, b"[", b"]") + b"}", r"nested too deeply"),
    (b'{"src":' + nested(5000, b'{"a":', b"}") + b"}", r"nested too deeply"),
    (b'{"src":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,8]}}', r"not a valid \.safetensors"),
    ({"src": {"dtype": "F32", "shape": [1] * 70, "data_offsets": [0, 4]}}, r"shape \[1, 1, .*at most 32 integers"),
    ({"src": {"dtype": "F32", "shape": [0, 2**61, 2**61], "data_offsets": [0, 0]}}, r"at most 32 integers"),
    ({"src": {"dtype": "F32", "shape": [2**64], "data_offsets": [0, 0]}}, r"at most 32 integers"),
    ({"src": {"dtype": "F32", "shape": [2], "data_offsets": [0, 2**70]}}, r"data_offsets .*outside"),
    ({"src": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, r"shape \[2\.0\]"),
], ids=["dtype-list", "dtype-dict", "dtype-int", "dtype-null", "entry-list", "nested-lists", "nested-objects",
        "5000-digit-dim", "70-dims", "zero-times-huge", "dim-2**64", "offset-2**70", "float-dim"])
def test_malformed_safetensors_headers_exit_3(cli, tmp_path: Path, header, pattern: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(safetensors_bytes(header, b"\0" * 8))
    assert_one_error(cli("verify", path, path), r"bad\.safetensors.*" + pattern)
    assert_one_error(cli("run", "--src", f"{path}:src", "--diff-dst", f"{path}:src", "--mean", f"{path}:src",
                         "--variance", f"{path}:src", "--epsilon", EPSILON), pattern)


@pytest.mark.parametrize("shape, pattern", [
    ("x".join(["1"] * 70), r"shape has 70 dimensions, at most 32"),
    ("9" * 5000, r"describes more bytes than any file holds"),
    ("99999999999x99999999999", r"describes more bytes"),
    ("0x2305843009213693951x2305843009213693951", r"describes more bytes"),
    ("18446744073709551616", r"describes more bytes"),
    ("4x-2", r"is not dimensions joined by 'x'"),
    ("4x" + "0" * 5000 + "6", r"needs 96 bytes, the file holds 8"),  # leading zeros: a small number, read as such
], ids=["70-dims", "5000-digit-dim", "product-overflow", "zero-times-huge", "dim-2**64", "negative", "zero-padded"])
def test_malformed_raw_shapes_exit_3(cli, tmp_path: Path, shape: str, pattern: str) -> None:
    data = tmp_path / "d.bin"
    data.write_bytes(b"\0" * 8)
    result = cli("verify", f"raw:f32:{shape}:{data}", f"raw:f32:2:{data}")
    assert_one_error(result, pattern)
    assert len(result.stderr) < 600  # a 5000-digit shape is quoted, not echoed whole


def test_huge_safetensors_header_is_refused_before_parsing(tmp_path: Path, tmp_path_factory) -> None:
    """A header of hundreds of thousands of empty tensors (tens of MB of JSON, gigabytes once parsed): refused from
    its size or from its count of JSON values, in a process that never grows past the budget."""
    entries = b",".join(b'"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(40000))
    small = tmp_path / "many.safetensors"  # under 8 MiB, over the value count
    small.write_bytes(safetensors_bytes(b"{" + entries + b"}"))
    metadata = b",".join(b'"%d":""' % i for i in range(300000))
    flat = tmp_path / "flat.safetensors"  # one object of 300k members: few brackets, many commas
    flat.write_bytes(safetensors_bytes(b'{"__metadata__":{' + metadata + b"}}"))
    big = tmp_path / "big.safetensors"
    with big.open("wb") as stream:
        stream.write(safetensors_bytes(b"{" + b" " * (20 << 20) + b"}"))
    for path, pattern in [(small, "more than 262144 JSON values"), (flat, "more than 262144 JSON values"),
                          (big, r"header is \d+ bytes, more than the 8388608")]:
        assert_rejected_within_budget(["verify", path, path], pattern, tmp_path_factory)


# ---------------------------------------------------------------- special files: no hang, no SIGBUS


@pytest.mark.parametrize("command", ["check", "verify"])
def test_a_fifo_named_npy_in_a_directory_is_refused_not_waited_on(tmp_path: Path, case_dir: Path, command: str) -> None:
    os.mkfifo(case_dir / "zz.npy")  # no writer ever opens it: reading it would block forever
    args = ["check", case_dir, "--epsilon", EPSILON, "--format", "NCHW"] if command == "check" else ["verify", case_dir, case_dir]
    result = bnbwd(*args, timeout=30)
    assert result.returncode == 3, result.stderr
    lines = (result.stderr + result.stdout).decode()
    assert "zz.npy: not a regular file" in lines and "Traceback" not in lines


def test_a_fifo_as_a_raw_dump_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.bin")
    result = bnbwd("verify", f"raw:f32:4:{tmp_path / 'pipe.bin'}", f"raw:f32:4:{tmp_path / 'pipe.bin'}", timeout=30)
    assert result.returncode == 3
    error_line(result.stderr, r"pipe\.bin.*not a regular file")


def test_a_fifo_member_of_a_reference_directory_on_run_is_refused(cli, tmp_path: Path, case_dir: Path, arrays) -> None:
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    os.mkfifo(kernel / "diff_src.npy")
    flags = [item for name in ("src", "diff_dst", "mean", "variance", "gamma")
             for item in (f"--{name.replace('_', '-')}", case_dir / f"{name}.npy")]
    result = bnbwd("run", *flags, "--epsilon", EPSILON, "--format", "NCHW", "-o", tmp_path / "o.npz",
                   "--reference", kernel, "-q", timeout=30)
    assert result.returncode == 3
    error_line(result.stderr, r"diff_src\.npy: not a regular file")


def test_safetensors_truncated_while_read_is_an_error_not_sigbus(cli, tmp_path: Path, arrays, monkeypatch) -> None:
    """The file shrinks between the header check and the data read: a clean exit 3 (a mapped file would SIGBUS)."""
    from bnbwd_cli.files import safetensors_file

    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "b.safetensors"
    safetensors_numpy.save_file({name: arrays[name] for name in ("src", "diff_dst", "mean", "variance", "gamma")},
                                str(path))
    vetted = safetensors_file.read_header

    def truncate_after_vetting(*args, **kwargs):
        entries = vetted(*args, **kwargs)
        os.truncate(path, path.stat().st_size // 2)
        return entries

    monkeypatch.setattr(safetensors_file, "read_header", truncate_after_vetting)
    assert_one_error(cli("run", path, "--epsilon", EPSILON, "-q", "-o", tmp_path / "o.npz"),
                     r"b\.safetensors.*(changed size while it was read|outside the \d+ bytes of data the file holds)")
    assert not (tmp_path / "o.npz").exists()


def test_no_reader_maps_a_file(cli, tmp_path: Path, arrays, monkeypatch) -> None:
    """Every input format read with mmap forbidden: nothing maps an input (a truncated mapping is SIGBUS)."""
    import mmap

    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    names = ("src", "diff_dst", "mean", "variance", "gamma")
    safetensors_numpy.save_file({name: arrays[name] for name in names}, str(tmp_path / "b.safetensors"))
    save_bundle(tmp_path / "b.npz", {name: arrays[name] for name in names})
    arrays["src"].tofile(tmp_path / "src.bin")

    class RefusedMap(mmap.mmap):  # still a type: isinstance checks elsewhere keep working
        def __new__(cls, *args, **kwargs):
            raise AssertionError("an input was memory-mapped")

    class RefusedMemmap(np.memmap):
        def __new__(cls, *args, **kwargs):
            raise AssertionError("an input was memory-mapped")

    monkeypatch.setattr(mmap, "mmap", RefusedMap)
    monkeypatch.setattr(np, "memmap", RefusedMemmap)
    for bundle in ("b.safetensors", "b.npz"):
        result = cli("run", tmp_path / bundle, "--epsilon", EPSILON, "--format", "NCHW", "-q", "-o", tmp_path / "o.npz",
                     "--src", f"raw:f32:{'x'.join(map(str, SHAPE))}:{tmp_path / 'src.bin'}")
        assert result.exit_code == 0, result.output


# ---------------------------------------------------------------- special paths written through


@pytest.fixture
def bundle(tmp_path: Path, arrays) -> Path:
    return Path(save_bundle(tmp_path / "b.npz", arrays, epsilon=1e-3, data_format="NCHW"))


def npz_keys(data: bytes) -> list[str]:
    import io

    with np.load(io.BytesIO(data)) as archive:
        return sorted(archive.files)


OUTPUT_KEYS = ["diff_beta", "diff_gamma", "diff_src"]


@pytest.mark.parametrize("alias", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_output_to_a_descriptor_alias_redirected_to_a_file_is_written_through(tmp_path: Path, bundle: Path,
                                                                             alias: str) -> None:
    link_before = os.readlink("/dev/stdout")
    target = tmp_path / "grads.npz"
    with target.open("wb") as stdout:
        result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", bundle, "-q", "-o", alias], stdout=stdout,
                                stderr=subprocess.PIPE, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert os.path.islink("/dev/stdout") and os.readlink("/dev/stdout") == link_before
    assert npz_keys(target.read_bytes()) == OUTPUT_KEYS
    assert not list(Path("/dev").glob(".stdout.*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("flags", [["-o", "/dev/null"], ["--json", "/dev/null", "-o", "{tmp}/o.npz"],
                                   ["-o", "/dev/stdout", "--json", "/dev/null"]])
def test_output_to_dev_null_exits_0(tmp_path: Path, bundle: Path, flags: list[str]) -> None:
    result = bnbwd("run", bundle, "-q", *[flag.format(tmp=tmp_path) for flag in flags])
    assert result.returncode == 0, result.stderr
    assert Path("/dev/null").is_char_device()
    if "/dev/stdout" in flags:
        assert npz_keys(result.stdout) == OUTPUT_KEYS


def test_reports_to_dev_null_and_a_pipe_from_verify_and_check(tmp_path: Path, case_dir: Path) -> None:
    assert bnbwd("verify", case_dir, case_dir, "--json", "/dev/null").returncode == 0
    assert bnbwd("check", case_dir, "--epsilon", EPSILON, "--format", "NCHW", "--json", "/dev/null").returncode == 0
    result = bnbwd("verify", case_dir, case_dir, "--json", "/dev/stdout", "--brief")
    assert result.returncode == 0 and b'"schema_version"' in result.stdout


def test_output_to_a_fifo_is_written_through_as_a_forward_only_archive(tmp_path: Path, bundle: Path) -> None:
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    result = bnbwd("run", bundle, "-q", "-o", fifo)
    data, _ = reader.communicate(timeout=60)
    assert result.returncode == 0, result.stderr
    assert fifo.is_fifo() and npz_keys(data) == OUTPUT_KEYS


def test_output_to_a_terminal_alias_is_refused(tmp_path: Path, bundle: Path) -> None:
    """-o /dev/stdout on a terminal is refused as `-o -` is: binary data would go to the screen."""
    import pty

    parent, child = pty.openpty()
    try:
        result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", bundle, "-q", "-o", "/dev/stdout"],
                                stdout=child, stderr=subprocess.PIPE, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(child)
        os.close(parent)
    assert result.returncode == 3
    error_line(result.stderr, r"output /dev/stdout: is a terminal")


@pytest.mark.parametrize("name", [b"grads\xff.npz", b"\xfe\xfd.npz", b"caf\xe9.npz"])
def test_non_utf8_output_names_are_written_and_shown_escaped(tmp_path: Path, bundle: Path, name: bytes) -> None:
    target = os.fsencode(tmp_path) + b"/" + name
    report = os.fsencode(tmp_path) + b"/r" + name + b".json"
    result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", bundle, "-o", target, "--json", report],
                            capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert os.path.exists(target) and os.path.exists(report)
    assert npz_keys(Path(os.fsdecode(target)).read_bytes()) == OUTPUT_KEYS
    assert not [entry for entry in os.listdir(os.fsencode(tmp_path)) if entry.startswith(b".")]
    missing_dir = os.fsencode(tmp_path) + b"/" + name + b"/x.npz"
    failed = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", bundle, "-o", missing_dir],
                            capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert failed.returncode == 3
    shown = name.decode("utf-8", "backslashreplace")
    assert error_line(failed.stderr, "does not exist").count(shown) == 2


# ---------------------------------------------------------------- the judge's numerics near the float64 limits

F64_MAX = float(np.finfo(np.float64).max)


def verify_json(cli, tmp_path: Path, actual: np.ndarray, reference: np.ndarray, *flags: str) -> tuple[int, dict]:
    import json

    for side, values in (("a", actual), ("r", reference)):
        (tmp_path / side).mkdir(exist_ok=True)
        np.save(tmp_path / side / "x.npy", values)
    result = cli("verify", tmp_path / "a", tmp_path / "r", "--json", "-", *flags)
    assert result.exit_code in (0, 1), result.output
    document = json.loads(result.stdout)  # strict JSON: no NaN or Infinity anywhere
    return result.exit_code, document["outputs"][0]["comparison"]


@pytest.mark.parametrize("actual, reference", [
    (np.full(16, 1.7e308), np.zeros(16)),
    (np.zeros(16), np.full(16, 1.7e308)),
    (np.full(16, F64_MAX), np.full(16, -F64_MAX)),  # |a - r| overflows although both are finite
    (np.array([F64_MAX, -F64_MAX] * 8), np.full(16, 1e308)),
    (np.full(16, 1e308), np.full(16, 9e307)),
], ids=["max-vs-zero", "zero-vs-max", "max-vs-minus-max", "mixed-signs", "top-decade"])
def test_values_near_the_float64_limit_are_a_mismatch_not_a_crash(cli, tmp_path: Path, actual, reference) -> None:
    code, comparison = verify_json(cli, tmp_path, actual, reference)
    assert code == 1 and not comparison["passed"]
    assert sum(b["count"] for b in comparison["histogram"]) <= 16
    assert all(isinstance(b["high"], float) for b in comparison["histogram"])
    text = cli("verify", tmp_path / "a", tmp_path / "r", "--verbose")  # the rich report's histogram too
    assert text.exit_code == 1, text.output


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e-160, 1e160, 1e200, 1e300])
def test_relative_l2_is_the_same_at_any_scale(cli, tmp_path: Path, scale: float) -> None:
    """||a - r|| / ||r|| does not depend on the scale: squares of 1e200 overflow, of 1e-200 underflow."""
    rng = np.random.default_rng(5)
    reference = rng.uniform(0.5, 1.0, 64)
    actual = reference * (1 + rng.normal(0, 1e-6, 64))
    (tmp_path / "unit").mkdir()
    _, unit = verify_json(cli, tmp_path / "unit", actual, reference)
    _, scaled = verify_json(cli, tmp_path, actual * scale, reference * scale)
    assert unit["rel_l2"] == pytest.approx(scaled["rel_l2"], rel=1e-9)
    assert 1e-8 < scaled["rel_l2"] < 1e-5 and scaled["rel_l2_passed"] is False


def test_one_ulp_apart_at_1e200_passes(cli, tmp_path: Path) -> None:
    reference = np.full(16, 1e200)
    code, comparison = verify_json(cli, tmp_path, np.nextafter(reference, np.inf), reference)
    assert code == 0 and comparison["rel_l2_passed"] and comparison["rel_l2"] < 1e-15


def test_sum_of_squares_keeps_ordinary_sums_bit_for_bit() -> None:
    """Chunks of ordinary values are summed exactly as before (the scaling is only for chunks that over/underflow)."""
    from bnbwd_cli.judge.norms import SumOfSquares

    rng = np.random.default_rng(9)
    chunks = [rng.normal(size=1000) for _ in range(5)]
    total = SumOfSquares()
    for chunk in chunks:
        total.add(chunk)
    plain = 0.0
    for chunk in chunks:
        plain += float(np.einsum("i,i->", chunk, chunk))
    assert total.exponent == 0 and total.total == plain
    mixed = SumOfSquares()
    for chunk in (np.full(4, 1e300), np.full(4, 1e-300), np.full(4, 1e300)):
        mixed.add(chunk)
    assert mixed.norm() == pytest.approx(np.sqrt(8) * 1e300, rel=1e-12)


# ---------------------------------------------------------------- memory before validation


def endless(prefix: bytes, filler: bytes = b"y\n") -> subprocess.Popen:
    """A process writing `prefix`, then `filler` forever (until its reader goes): a pipe that never ends."""
    code = f"import sys\nsys.stdout.buffer.write({prefix!r})\nblock = {filler!r} * 65536\nwhile True: sys.stdout.buffer.write(block)"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def first_member_header(arrays) -> bytes:
    """The first local header and the first bytes of a stored member, then nothing: a valid-looking start."""
    return npz_archive(arrays)[:200]


@pytest.mark.parametrize("prefix, pattern", [
    (b"PK\x03\x04", r"member compressed with method \d+, which zipfile does not read"),
    (b"PK\x03\x04" + b"\0" * 26, r"b'y\\ny\\n' where a member header was expected"),  # an empty member, then junk
    (b"PK\x03\x04\x14\0\x01\0" + b"\0" * 22, "an encrypted member"),
    ("first-member", "a stored .npy member that does not start with the .npy magic"),
], ids=["yes", "junk-after-empty-member", "encrypted", "junk-member-data"])
def test_an_endless_pipe_posing_as_an_npz_is_refused_at_once(tmp_path_factory, arrays, prefix, pattern: str) -> None:
    if prefix == "first-member":  # a real local header for a 1 MiB stored member, then no .npy inside
        import struct

        prefix = b"PK\x03\x04" + struct.pack("<HHHHHIIIHH", 20, 0, 0, 0, 0, 0, 1 << 20, 1 << 20, 7, 0) + b"src.npy"
    writer = endless(prefix)
    try:
        assert_rejected_within_budget(["run", "-", "-o", tmp_path_factory.mktemp("o") / "o.npz"], pattern,
                                      tmp_path_factory, stdin=writer.stdout)
    finally:
        writer.kill()
        writer.wait()


def test_an_endless_tail_after_a_valid_archive_is_refused(tmp_path_factory, arrays) -> None:
    writer = endless(npz_archive(arrays), b"\0")
    try:
        assert_rejected_within_budget(["run", "-", "-o", tmp_path_factory.mktemp("o") / "o.npz"],
                                      r"more than 16777216 bytes after its last member", tmp_path_factory,
                                      stdin=writer.stdout)
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("form", ["stored", "deflate", "bzip2", "lzma", "streamed", "streamed-deflate", "zip64"])
def test_valid_archives_on_stdin_still_read(cli, tmp_path: Path, arrays, bundle: Path, form: str) -> None:
    import zipfile

    bundle_arrays = {**arrays, "epsilon": np.array(1e-3), "data_format": np.array("NCHW")}
    method = {"deflate": zipfile.ZIP_DEFLATED, "bzip2": zipfile.ZIP_BZIP2, "lzma": zipfile.ZIP_LZMA,
              "streamed-deflate": zipfile.ZIP_DEFLATED}.get(form)
    data = npz_archive(bundle_arrays, method, stream=form.startswith("streamed"), zip64=form == "zip64")
    expected = cli("run", bundle, "-q", "-o", tmp_path / "expected.npz")
    assert expected.exit_code == 0, expected.output
    result = cli("run", "-", "-q", "-o", tmp_path / "got.npz", input=data)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "got.npz").read_bytes() == (tmp_path / "expected.npz").read_bytes()


def test_stdin_npz_under_a_virtual_memory_limit(tmp_path: Path, bundle: Path) -> None:
    """No allocation is sized by MemAvailable: under `ulimit -v` a small archive on stdin is read in chunks."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2_000_000 * 1024, 2_000_000 * 1024))

    with bundle.open("rb") as stdin:
        result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", "-", "-q", "-o", tmp_path / "o.npz"],
                                stdin=stdin, capture_output=True, timeout=60, preexec_fn=limit,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"})
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert npz_keys((tmp_path / "o.npz").read_bytes()) == OUTPUT_KEYS
    lying = tmp_path / "lie.npy"  # declares 4 GiB (under MemAvailable here, over what ulimit -v leaves)
    with lying.open("wb") as stream:
        from numpy.lib import format as npy_format

        npy_format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False, "shape": (1 << 30,)})
        stream.write(bytes(1000))
    with lying.open("rb") as stdin:
        result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", bundle, "--src", "-", "-q", "-o",
                                 tmp_path / "o2.npz"], stdin=stdin, capture_output=True, timeout=60, preexec_fn=limit,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"})
    assert result.returncode == 3
    error_line(result.stderr, r"src \(stdin\): header declares shape \(1073741824,\).*more than the memory available")


def bomb_members(arrays, method, big_shape=(64, 1024, 1024)) -> bytes:
    """A small archive whose `extra` member inflates to a valid .npy of zeros (256 MiB by default), written in
    chunks (the test never holds it)."""
    import io
    import zipfile

    from numpy.lib import format as npy_format

    from tests.conftest import npy_bytes

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for key, array in arrays.items():
            archive.writestr(f"{key}.npy", npy_bytes(array))
        with archive.open("extra.npy", "w", force_zip64=True) as member:
            npy_format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": big_shape})
            zeros = bytes(16 << 20)
            for _ in range(int(np.prod(big_shape)) * 4 // len(zeros)):
                member.write(zeros)
    return buffer.getvalue()


@pytest.mark.parametrize("command", ["verify", "check"])
def test_members_nothing_compares_are_never_inflated(tmp_path_factory, tmp_path: Path, arrays, case_dir: Path,
                                                     command: str) -> None:
    """A 2 MB archive with a 2 GB member that no rule uses: judged within the budget, the member never inflated."""
    import zipfile

    outputs = {name: np.load(case_dir / f"{name}.npy") for name in OUTPUT_KEYS}
    members = {**outputs, **(arrays if command == "check" else {})}
    path = tmp_path / "case.npz"
    path.write_bytes(bomb_members(members, zipfile.ZIP_DEFLATED, big_shape=(32, 1024, 1024)))  # 128 MiB
    assert path.stat().st_size < 1 << 20
    reference = tmp_path / "ref.npz"
    np.savez(reference, **outputs)
    args = (["verify", path, reference] if command == "verify"
            else ["check", path, "--epsilon", EPSILON, "--format", "NCHW"])
    result = measured(args)
    assert result.returncode == 0, result.stderr
    assert result.peak_mib <= baseline_mib(tmp_path_factory) + 64, result.peak_mib


@pytest.mark.parametrize("method", ["bzip2", "lzma"])
def test_every_compression_method_is_held_to_the_ratio_bound(tmp_path_factory, tmp_path: Path, arrays,
                                                             method: str) -> None:
    import zipfile

    method_id = {"bzip2": zipfile.ZIP_BZIP2, "lzma": zipfile.ZIP_LZMA}[method]
    bundle = tmp_path / "bomb.npz"
    bundle.write_bytes(bomb_members({**arrays, "epsilon": np.array(1e-3)}, method_id, big_shape=(4, 1024, 1024)))
    assert_rejected_within_budget(["run", bundle, "-q", "--format", "NCHW", "-o", tmp_path / "o.npz", "--src",
                                   f"{bundle}:extra"], rf"{method} member declares \d+ bytes from \d+ compressed, "
                                  "more than deflate can produce", tmp_path_factory)


def lying_member_archive(method: str, payload_bytes: int, declared: int) -> bytes:
    """An archive whose one member, extra.npy, is a valid .npy of `payload_bytes` of zeros compressed with `method`,
    while its headers declare `declared` bytes: a liar no ratio check sees."""
    import bz2
    import io
    import lzma
    import struct
    import zipfile
    import zlib

    from numpy.lib import format as npy_format

    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (payload_bytes,)})
    plain = header.getvalue() + bytes(payload_bytes)
    if method == "bzip2":
        data, method_id = bz2.compress(plain), zipfile.ZIP_BZIP2
    else:
        lzma1 = {"id": lzma.FILTER_LZMA1, "preset": 0}
        compressor = lzma.LZMACompressor(lzma.FORMAT_RAW, filters=[lzma1])
        properties = lzma._encode_filter_properties(lzma1)
        data = b"\x09\x04" + struct.pack("<H", len(properties)) + properties + compressor.compress(plain) + compressor.flush()
        method_id = zipfile.ZIP_LZMA
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("extra.npy", data)
    archive_bytes = bytearray(buffer.getvalue())
    crc = zlib.crc32(plain[:declared])
    struct.pack_into("<HHHI", archive_bytes, 8, method_id, 0, 0, crc)  # local header: method, time, date, CRC
    struct.pack_into("<I", archive_bytes, 22, declared)  # local header: uncompressed size
    central = archive_bytes.rindex(b"PK\x01\x02")
    struct.pack_into("<HHHI", archive_bytes, central + 10, method_id, 0, 0, crc)
    struct.pack_into("<I", archive_bytes, central + 24, declared)
    return bytes(archive_bytes)


@pytest.mark.parametrize("method", ["bzip2", "lzma"])
def test_a_member_inflating_past_its_declared_size_stops_there(tmp_path_factory, tmp_path: Path, method: str) -> None:
    """The directory says 4 KiB, the data inflate to 128 MiB: refused at its .npy header, in bounded memory (zipfile's
    own bzip2 and lzma readers inflate a whole read's worth before truncating to the declared size)."""
    path = tmp_path / "liar.npz"
    path.write_bytes(lying_member_archive(method, 128 << 20, 4096))
    assert path.stat().st_size < 1 << 20
    assert_rejected_within_budget(["verify", path, path], r"liar\.npz:extra: header declares shape \(134217728,\)",
                                  tmp_path_factory)


def test_bounded_inflate_reads_no_more_than_asked_and_checks_the_crc(tmp_path: Path) -> None:
    import zipfile

    from bnbwd_cli.files.npz import open_member

    for method in ("bzip2", "lzma"):
        path = tmp_path / f"{method}.npz"
        path.write_bytes(lying_member_archive(method, 1 << 20, 4096))
        with zipfile.ZipFile(path) as archive, open_member(archive, archive.getinfo("extra.npy")) as stream:
            sizes = [len(stream.read(1000)) for _ in range(6)]
        assert sizes == [1000, 1000, 1000, 1000, 96, 0]


def sparse_npy(path: Path, shape: tuple[int, ...]) -> Path:
    """A valid float32 .npy of `shape` whose data is a hole (no disk, no time): large inputs in a test."""
    from numpy.lib import format as npy_format

    with path.open("wb") as stream:
        npy_format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False, "shape": shape})
        stream.truncate(stream.tell() + int(np.prod(shape)) * 4)
    return path


BIG = (16, 16, 512, 512)  # 256 MiB of float32


@pytest.mark.parametrize("form", ["npy", "raw", "npz-key"])
def test_run_reports_a_shape_mismatch_from_the_headers_before_reading_a_large_src(
        tmp_path_factory, tmp_path: Path, form: str) -> None:
    import zipfile

    src = sparse_npy(tmp_path / "src.npy", BIG)
    if form == "raw":
        raw_file = tmp_path / "src.bin"
        with raw_file.open("wb") as stream:
            stream.truncate(int(np.prod(BIG)) * 4)
        source = f"raw:f32:{'x'.join(map(str, BIG))}:{raw_file}"
    elif form == "npz-key":
        archive = tmp_path / "big.npz"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
            out.write(src, "src.npy")  # stored: a quarter GiB the test writes once
        source = f"{archive}:src"
    else:
        source = str(src)
    np.save(tmp_path / "stats.npy", np.ones(7, np.float32))  # C is 16
    stats = tmp_path / "stats.npy"
    assert_rejected_within_budget(["run", "--src", source, "--diff-dst", source, "--mean", stats, "--variance", stats,
                                   "--epsilon", EPSILON, "--format", "NCHW", "-o", tmp_path / "o.npz"],
                                  r"mean has shape \(7,\), expected \(16,\)", tmp_path_factory)


def test_run_reports_a_bundle_shape_mismatch_before_inflating_its_src(tmp_path_factory, tmp_path: Path) -> None:
    import zipfile

    src = sparse_npy(tmp_path / "src.npy", (8, 16, 512, 512))  # 128 MiB
    bundle = tmp_path / "bundle.npz"
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as out:
        out.write(src, "src.npy")
        out.write(src, "diff_dst.npy")
        for name in ("mean", "variance"):
            out.writestr(f"{name}.npy", npy_bytes(np.ones(7, np.float32)))
    assert_rejected_within_budget(["run", bundle, "--epsilon", EPSILON, "--format", "NCHW", "-o", tmp_path / "o.npz"],
                                  r"mean has shape \(7,\), expected \(16,\)", tmp_path_factory)


def test_declared_inputs_are_read_after_the_checks_and_give_the_same_outputs(cli, tmp_path: Path) -> None:
    """Inputs over DECLARED_MIN_BYTES go through the Declared path; the outputs are those of plain in-memory inputs."""
    from bnbwd_cli.files.npy import DECLARED_MIN_BYTES

    arrays = make_inputs(np.random.default_rng(3), (4, 16, 64, 64))
    assert arrays["src"].nbytes >= DECLARED_MIN_BYTES
    bundle = save_bundle(tmp_path / "b.npz", arrays, epsilon=1e-3, data_format="NCHW")
    for name in ("src", "diff_dst"):
        np.save(tmp_path / f"{name}.npy", arrays[name])
    a = cli("run", bundle, "-q", "-o", tmp_path / "a.npz")
    b = cli("run", bundle, "--src", tmp_path / "src.npy", "--diff-dst", tmp_path / "diff_dst.npy", "-q",
            "-o", tmp_path / "flags.npz")
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "flags.npz").read_bytes()


# ---------------------------------------------------------------- interrupts while the outputs commit


def test_signals_are_held_while_a_set_is_renamed_then_delivered() -> None:
    import signal

    from bnbwd_cli.files.write import signals_deferred

    reached = []
    # Python's own Ctrl-C handler for the test: a runner that starts pytest in the background of a shell without job
    # control hands it SIGINT ignored (then Python keeps SIG_IGN, and an ignored signal is rightly not delivered)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                reached.append("after the signal")  # the block goes on: the signal waits for its end
        assert reached == ["after the signal"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_one_commit_renames_every_set_at_its_end_or_none(tmp_path: Path) -> None:
    from bnbwd_cli.files.write import OutputSet, one_commit

    first, second = tmp_path / "grads.npz", tmp_path / "report.json"
    for path in (first, second):
        path.write_bytes(b"old")
    with one_commit():
        with OutputSet() as outputs:
            outputs.new_file(first).write(b"new grads")
        assert first.read_bytes() == b"old"  # staged, not yet renamed
        with OutputSet() as outputs:
            outputs.new_file(second).write(b"new report")
    assert first.read_bytes() == b"new grads" and second.read_bytes() == b"new report"
    with pytest.raises(KeyboardInterrupt):
        with one_commit():
            with OutputSet() as outputs:
                outputs.new_file(first).write(b"newer grads")
            raise KeyboardInterrupt  # Ctrl-C (or SIGTERM) between the outputs and the report
    assert first.read_bytes() == b"new grads" and second.read_bytes() == b"new report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grads.npz", "report.json"]


@pytest.mark.parametrize("interrupt, code", [(KeyboardInterrupt, 130), ("terminated", 143)])
def test_run_interrupted_between_outputs_and_report_keeps_the_old_set(cli, tmp_path: Path, bundle: Path, monkeypatch,
                                                                      interrupt, code: int) -> None:
    """Ctrl-C or SIGTERM after the outputs are complete but before the --json report: neither is replaced."""
    from bnbwd_cli.cli.main import Terminated
    from bnbwd_cli.files import write as files_write

    out, report = tmp_path / "grads.npz", tmp_path / "report.json"
    out.write_bytes(b"old grads")
    report.write_bytes(b"old report")
    error = Terminated() if interrupt == "terminated" else interrupt()

    def interrupted(*args, **kwargs):
        raise error

    monkeypatch.setattr(files_write, "write_text", interrupted)
    result = cli("run", bundle, "-q", "-o", out, "--json", report)
    assert result.exit_code == code, result.output
    assert out.read_bytes() == b"old grads" and report.read_bytes() == b"old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.npz", "grads.npz", "report.json"]


@pytest.mark.parametrize("signal_name, code", [("SIGTERM", 143), ("SIGINT", 130), ("SIGHUP", 129)])
def test_a_signal_during_the_renames_waits_until_the_set_is_complete(tmp_path: Path, bundle: Path, signal_name: str,
                                                                     code: int) -> None:
    """The signal arrives after the first of the set's renames: every file of the set is renamed, then it acts."""
    out, report = tmp_path / "grads.npz", tmp_path / "report.json"
    out.write_bytes(b"old grads")
    report.write_bytes(b"old report")
    script = f"""
import os, signal, sys
from bnbwd_cli.files import swap
real_replace = swap.replace
def replace_then_signal(*args, **kwargs):
    real_replace(*args, **kwargs)
    swap.replace = real_replace
    os.kill(os.getpid(), signal.{signal_name})
swap.replace = replace_then_signal
sys.argv = ["bnbwd", "run", {str(bundle)!r}, "-q", "-o", {str(out)!r}, "--json", {str(report)!r}]
import runpy
runpy.run_module("bnbwd_cli", run_name="__main__")
"""
    from tests.conftest import default_sigint

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, preexec_fn=default_sigint,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == code, result.stderr
    assert npz_keys(out.read_bytes()) == OUTPUT_KEYS
    assert b'"schema_version"' in report.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.npz", "grads.npz", "report.json"]


@pytest.mark.parametrize("encoding", ["utf-8:strict", "ascii"])
def test_non_utf8_names_under_a_strict_stdout_are_printed_escaped(tmp_path: Path, bundle: Path, encoding: str) -> None:
    """Most locales make stdout strict: a name with a byte that is not UTF-8 was a UnicodeEncodeError (exit 4)."""
    target = os.fsencode(tmp_path) + b"/grads\xff.npz"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": encoding}
    result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", bundle, "-o", target], capture_output=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert b"wrote " + os.fsencode(tmp_path) + b"/grads\\xff.npz" in result.stdout
    result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "verify", target, target, "--brief"],
                            capture_output=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert b"grads\\xff.npz" in result.stdout  # the byte, as run names it (literal.py)


def test_run_reports_a_safetensors_bundle_shape_mismatch_before_reading_its_src(tmp_path_factory, tmp_path: Path) -> None:
    """A .safetensors bundle with a 256 MiB src (a hole on disk) and a (7,) mean for C = 16."""
    import json
    import struct

    src_bytes = int(np.prod(BIG)) * 4
    header = {"src": {"dtype": "F32", "shape": list(BIG), "data_offsets": [0, src_bytes]},
              "diff_dst": {"dtype": "F32", "shape": list(BIG), "data_offsets": [0, src_bytes]},
              "mean": {"dtype": "F32", "shape": [7], "data_offsets": [src_bytes, src_bytes + 28]},
              "variance": {"dtype": "F32", "shape": [7], "data_offsets": [src_bytes, src_bytes + 28]}}
    text = json.dumps(header).encode()
    bundle = tmp_path / "bundle.safetensors"
    with bundle.open("wb") as stream:
        stream.write(struct.pack("<Q", len(text)) + text)
        stream.truncate(8 + len(text) + src_bytes)
        stream.seek(0, 2)
        stream.write(np.ones(7, np.float32).tobytes())
    assert_rejected_within_budget(["run", bundle, "--epsilon", EPSILON, "--format", "NCHW", "-o", tmp_path / "o.npz"],
                                  r"mean has shape \(7,\), expected \(16,\)", tmp_path_factory)
