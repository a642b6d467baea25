"""Readers and their errors through the real CLI: .safetensors, raw dumps, PyTorch pickles refused, damaged
.npz members."""

from __future__ import annotations

import json
import pickle
import re
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.dtypes import BFLOAT16
from tests.conftest import assert_one_error, assert_same, make_inputs, run_outputs, save_bundle

safetensors_numpy = pytest.importorskip("safetensors.numpy")  # the [test] extra installs it

SHAPE = (2, 3, 4, 5)  # NCHW: C = 3
NCHW = ("--epsilon", "1e-3", "--format", "NCHW")


@pytest.fixture
def arrays(rng):
    return make_inputs(rng, SHAPE)


def safetensors_file(path: Path, header: dict, data: bytes, length: int | None = None) -> str:
    """A .safetensors file with whatever header the test wants (length: the declared header size)."""
    text = json.dumps(header).encode()
    path.write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text + data)
    return str(path)


# ---------------------------------------------------------------- .safetensors


def test_safetensors_bundle_and_key_give_the_npz_results(cli, tmp_path, arrays):
    expected = run_outputs(cli, tmp_path, save_bundle(tmp_path / "b.npz", arrays), name="npz.npz")
    st = tmp_path / "b.safetensors"
    safetensors_numpy.save_file(arrays, str(st))
    assert_same(run_outputs(cli, tmp_path, str(st), name="st.npz"), expected)
    flags = [arg for name in ("src", "diff_dst", "mean", "variance", "gamma")
             for arg in (f"--{name.replace('_', '-')}", f"{st}:{name}")]
    assert_same(run_outputs(cli, tmp_path, *flags, name="keys.npz"), expected)


def test_safetensors_bf16_is_read_as_bfloat16(cli, tmp_path, arrays):
    bf16 = {k: v.astype(ml_dtypes.bfloat16) if k in ("src", "diff_dst") else v for k, v in arrays.items()}
    safetensors_numpy.save_file(bf16, str(tmp_path / "b.safetensors"))
    got = run_outputs(cli, tmp_path, str(tmp_path / "b.safetensors"), name="st.npz")
    expected = run_outputs(cli, tmp_path, save_bundle(tmp_path / "b.npz", bf16), name="npz.npz")
    assert got["diff_src"].dtype == BFLOAT16
    assert_same(got, expected)
    from bnbwd_cli.files.read import read_array
    src = read_array(f"{tmp_path / 'b.safetensors'}:src", "src")
    assert src.dtype == BFLOAT16 and np.array_equal(src.astype(np.float32), bf16["src"].astype(np.float32))


@pytest.mark.parametrize("header, data, length, pattern", [
    ({"src": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 10**6, r"header length 1000000"),
    ({"src": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None,
     r"data_offsets \[0, 16\], outside the 8 bytes"),
    ({"src": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None,
     r"declares shape \(3,\) F32 \(12 bytes\) but 8 bytes"),
    ({"src": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 8, None, r"dtype 'F8_E4M3'"),
    ({"src": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, r"shape \[-2\]"),
], ids=["header-longer-than-file", "offsets-outside-data", "shape-vs-bytes", "unknown-dtype", "negative-shape"])
def test_hostile_safetensors_headers_fail_before_reading(cli, tmp_path, header, data, length, pattern):
    path = safetensors_file(tmp_path / "bad.safetensors", header, data, length)
    assert_one_error(cli("run", path, *NCHW), r"bundle .*bad\.safetensors.*" + pattern)


def test_safetensors_header_not_json(cli, tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes((5).to_bytes(8, "little") + b"{nope" + b"\0" * 8)
    assert_one_error(cli("run", str(path), *NCHW), r"not a valid \.safetensors file")


def test_safetensors_are_read_without_the_package(cli, tmp_path, arrays, monkeypatch):
    """bnbwd reads the format itself, with explicit reads: the package would map the file (SIGBUS when truncated)."""
    path = tmp_path / "b.safetensors"
    safetensors_numpy.save_file(arrays, str(path))
    expected = run_outputs(cli, tmp_path, str(path), name="with.npz")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # `import safetensors` now raises ImportError
    got = run_outputs(cli, tmp_path, str(path), name="without.npz")
    assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in got)


def test_safetensors_as_verify_sides(cli, tmp_path, arrays):
    out = tmp_path / "ref.npz"
    assert cli("run", save_bundle(tmp_path / "b.npz", arrays), *NCHW, "-q", "-o", out).exit_code == 0
    with np.load(out) as archive:
        safetensors_numpy.save_file(dict(archive), str(tmp_path / "kernel.safetensors"))
    result = cli("verify", tmp_path / "kernel.safetensors", out, "--brief")
    assert result.exit_code == 0 and "diff_src: PASS" in result.stdout, result.output


# ---------------------------------------------------------------- raw dumps


def test_raw_dump_gives_the_npy_results(cli, tmp_path, arrays):
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    expected = run_outputs(cli, tmp_path, bundle, name="npz.npz")
    arrays["src"].tofile(tmp_path / "x.bin")
    arrays["diff_dst"].astype(">f4").tofile(tmp_path / "dy.be")  # big-endian, named as NumPy names it
    got = run_outputs(cli, tmp_path, bundle, "--src", f"raw:f32:2x3x4x5:{tmp_path / 'x.bin'}",
                      "--diff-dst", f"raw:>f4:2,3,4,5:{tmp_path / 'dy.be'}", name="raw.npz")
    assert_same(got, expected)


def test_raw_bf16_dump(cli, tmp_path, arrays):
    bf16 = {k: v.astype(ml_dtypes.bfloat16) if k in ("src", "diff_dst") else v for k, v in arrays.items()}
    bundle = save_bundle(tmp_path / "b.npz", bf16)
    bf16["src"].view(np.int16).tofile(tmp_path / "x.bin")
    got = run_outputs(cli, tmp_path, bundle, "--src", f"raw:bf16:2x3x4x5:{tmp_path / 'x.bin'}", name="raw.npz")
    assert_same(got, run_outputs(cli, tmp_path, bundle, name="npz.npz"))


def test_raw_f16_names_half_whatever_the_byte_order(cli, tmp_path, arrays):
    """NumPy alone reads "f16" as float128 (f + 16 bytes): f16, <f16 and >f16 are half, >f16 big-endian."""
    half = {k: v.astype(np.float16) if k in ("src", "diff_dst") else v for k, v in arrays.items()}
    bundle = save_bundle(tmp_path / "b.npz", half)
    half["src"].tofile(tmp_path / "x.bin")
    half["src"].astype(">f2").tofile(tmp_path / "x.be")
    expected = run_outputs(cli, tmp_path, bundle, name="npz.npz")
    assert expected["diff_src"].dtype == np.float16
    for source in (f"raw:f16:2x3x4x5:{tmp_path / 'x.bin'}", f"raw:<F16:2x3x4x5:{tmp_path / 'x.bin'}",
                   f"raw:>f16:2x3x4x5:{tmp_path / 'x.be'}"):
        assert_same(run_outputs(cli, tmp_path, bundle, "--src", source, name="raw.npz"), expected)


def test_dtype_from_name_reads_the_short_names():
    from bnbwd_cli.dtypes import dtype_from_name

    assert [dtype_from_name(name) for name in ("f16", "f32", "f64", "bf16")] == [
        np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), BFLOAT16]
    assert dtype_from_name(">f16") == np.dtype(">f2") and dtype_from_name("float16") == np.float16
    with pytest.raises(TypeError):
        dtype_from_name(">bf16")  # ml_dtypes has native byte order only


@pytest.mark.parametrize("source, pattern", [
    ("raw:f32:2x3x4x4:{x}", r"shape \(2, 3, 4, 4\) float32 needs 384 bytes, the file holds 480"),
    ("raw:f32:2x3x4x5x2:{x}", r"needs 960 bytes, the file holds 480"),
    ("raw:f32:{x}", r"expected raw:DTYPE:SHAPE:PATH"),
    ("raw:f32:2xfour:{x}", r"shape '2xfour' is not dimensions joined by 'x'"),
    ("raw:complex:2x3x4x5:{x}", r"dtype 'complex' is not a number type"),
    ("raw:g:2x3x4x5:{x}", r"dtype 'g' is float128, which bnbwd does not read; expected f16 \(half\)"),
    ("raw:f32:2x3x4x5:{x}.missing", r"^error: src \(raw:f32:2x3x4x5:[^ ]*x\.bin\.missing\): cannot read \(No such file "
                                    r"or directory\)$"),
], ids=["too-small", "too-large", "no-shape", "bad-shape", "bad-dtype", "float128", "missing-file"])
def test_bad_raw_sources(cli, tmp_path, arrays, source, pattern):
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    arrays["src"].tofile(tmp_path / "x.bin")
    assert_one_error(cli("run", bundle, "--src", source.format(x=tmp_path / "x.bin"), *NCHW), pattern)


# ---------------------------------------------------------------- PyTorch pickles


class Tripwire:
    """Unpickling this creates a file: the tests check that it never appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def torch_zip(path: Path, payload: bytes) -> str:
    """The layout torch.save writes: a zip with ARCHIVE/data.pkl (no torch needed to build it)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("checkpoint/data.pkl", payload)
        archive.writestr("checkpoint/version", "3\n")
    return str(path)


@pytest.mark.parametrize("make", [
    lambda d, p: torch_zip(d / "grads.pt", p),
    lambda d, p: torch_zip(d / "grads.npz", p),  # by content, whatever the name
    lambda d, p: (d / "legacy.bin").write_bytes(p) and str(d / "legacy.bin"),  # legacy torch.save: a bare pickle
    lambda d, p: (d / "x.pth").write_bytes(np.zeros(3).tobytes()) and str(d / "x.pth"),  # by name
], ids=["zip-pt", "zip-named-npz", "bare-pickle", "pth-by-name"])
@pytest.mark.parametrize("where", ["bundle", "flag", "verify"])
def test_pytorch_pickles_are_refused_never_unpickled(cli, tmp_path, arrays, make, where):
    marker = tmp_path / "unpickled"
    path = make(tmp_path, pickle.dumps(Tripwire(marker), protocol=4))
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    args = {"bundle": ["run", path, *NCHW], "flag": ["run", bundle, "--src", path, *NCHW],
            "verify": ["verify", path, bundle]}[where]
    assert_one_error(cli(*args), r"is a PyTorch checkpoint \(a Python pickle\).*safetensors\.torch\.save_file.*np\.savez")
    assert not marker.exists()


def test_pickle_on_stdin_is_refused(cli, tmp_path, arrays):
    marker = tmp_path / "unpickled"
    bundle = save_bundle(tmp_path / "b.npz", arrays)
    result = cli("run", bundle, "--src", "-", *NCHW, input=pickle.dumps(Tripwire(marker), protocol=2))
    assert_one_error(result, r"src \(stdin\): is a PyTorch checkpoint")
    assert not marker.exists()


def test_raw_dump_as_a_verify_side(cli, tmp_path, rng):
    reference = rng.normal(size=(4, 6)).astype(np.float32)
    reference.tofile(tmp_path / "diff_src.bin")  # key = the file's stem
    np.savez(tmp_path / "ref.npz", diff_src=reference)
    result = cli("verify", f"raw:f32:4x6:{tmp_path / 'diff_src.bin'}", tmp_path / "ref.npz", "--brief")
    assert result.exit_code == 0 and "diff_src: PASS 0/24 mismatched" in result.stdout, result.output
    assert_one_error(cli("verify", f"raw:f32:4x5:{tmp_path / 'diff_src.bin'}", tmp_path / "ref.npz"),
              r"needs 80 bytes, the file holds 96")


def test_safetensors_over_available_memory_fails_before_reading(cli, tmp_path, arrays, monkeypatch):
    from bnbwd_cli.files import safetensors_file

    safetensors_numpy.save_file(arrays, str(tmp_path / "b.safetensors"))
    monkeypatch.setattr(safetensors_file, "memory_cap", lambda: 100)
    assert_one_error(cli("run", tmp_path / "b.safetensors", *NCHW), r"tensors declare \d+ bytes, more than the memory available")


def _damaged_member_bundle(tmp_path: Path, arrays: dict, method: int, where: str) -> Path:
    """A bundle whose src member has damaged bytes: at the start of its (deflated) data, or in its stored data."""
    path = tmp_path / "bundle.npz"
    with zipfile.ZipFile(path, "w", method) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", "w") as member:
                np.lib.format.write_array(member, value)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("src.npy")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # the local header's fixed part is 30 bytes
    at = start if where == "header" else start + info.compress_size // 2
    data[at : at + 8] = bytes(byte ^ 0xFF for byte in data[at : at + 8])
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(("method", "where", "pattern"), [
    (zipfile.ZIP_DEFLATED, "header", r"bundle .*src.*cannot read src\.npy"),  # zlib.error while the header is read
    (zipfile.ZIP_DEFLATED, "data", r"bundle .*src.*cannot read src\.npy"),  # zlib.error or a bad CRC in the data
    (zipfile.ZIP_STORED, "data", r"bundle .*src.*cannot read src\.npy \(Bad CRC-32"),
], ids=["deflated-header", "deflated-data", "stored-data"])
def test_damaged_npz_member_is_one_line(cli, tmp_path, arrays, method, where, pattern):
    """Errors of zipfile and zlib (imported only when an archive is read: files/npz.zip_errors) stay one line, exit 3."""
    bundle = _damaged_member_bundle(tmp_path, arrays, method, where)
    assert_one_error(cli("run", str(bundle), *NCHW, "-q", "-o", tmp_path / "out.npz"), pattern)


@pytest.mark.parametrize("command", ["run", "verify", "verify-raw"])
def test_a_bad_file_is_named_once(cli, tmp_path, arrays, command):
    """A read error names the file once: it was `src (x.npy): cannot read x.npy (src (x.npy): not a valid .npy
    file ...)` (three times) and, as a verify side, `x.npy: cannot read x.npy (x.npy: ...)`."""
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01")
    if command == "run":
        bundle = save_bundle(tmp_path / "b.npz", arrays)
        result, shown = cli("run", bundle, "--src", bad, *NCHW), f"src ({bad})"
    elif command == "verify":
        result, shown = cli("verify", bad, bad), str(bad)
    else:
        result, shown = cli("verify", f"raw:f32:5:{bad}", bad), f"raw:f32:5:{bad}"
    assert_one_error(result, "^error: " + re.escape(shown) + ": (not a valid .npy file|shape .* needs 20 bytes)")
    assert result.stderr.count(str(bad)) == 1, result.stderr
