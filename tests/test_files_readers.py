"""Each reader of bnbwd_cli/files/, called directly: a table of good and bad files per format (.npy, .npz stored,
deflated, bzip2 and lzma, .safetensors, raw dumps), each row the arrays read (values, dtype and shape, bit for bit)
or the one-line InputError it raises; then read_array's choice of reader by name and content.

The CLI's handling of the same errors (exit 3, one line, nothing written) is tests/test_bad_npy.py and
tests/test_bad_npz.py; a few guards are tried at their limit here, one step inside and one past it.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from numpy.lib import format as npy_format

from bnbwd_cli.errors import InputError
from bnbwd_cli.files.npy import read_npy_stream
from bnbwd_cli.files.npz import MAX_DEFLATE_RATIO, read_npz, read_npz_key
from bnbwd_cli.files.raw import parse_raw, read_raw
from bnbwd_cli.files.read import read_array, read_bundle
from bnbwd_cli.files.safetensors_file import read_safetensors, read_safetensors_key
from tests.catalogue import encrypted_zip, lying_zip, npy_with_header, npz_of, object_npy, zip_with_method
from tests.conftest import npy_bytes, npz_archive

A = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 5) / 7  # fractional values: every bit of each element counts
B = np.linspace(-2, 2, 3)  # float64
BF16 = np.array([1.5, -0.1, 3e38], dtype=ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Row:
    id: str
    data: bytes  # the file's bytes
    expected: dict[str, np.ndarray] | np.ndarray | str  # the arrays read, or the error message's regex
    key: str | None = None  # read one member by key (FILE:key)
    sized: bool = True  # the reader knows the file's size (a stream from a pipe: it does not)


def assert_read(read, expected) -> None:
    """`read()` gives `expected` bit for bit (dtype, shape, values), or raises one InputError line matching it."""
    if isinstance(expected, str):
        with pytest.raises(InputError) as raised:
            read()
        message = str(raised.value)
        assert "\n" not in message and re.search(expected, message), message
        return
    got = read()
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    else:
        assert_same(got, expected)


def assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype and got.dtype.isnative and got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()


def assert_file_row(row: Row, path: Path, read_all, read_key) -> None:
    """The row's bytes written to `path`, read whole or by the row's key (labelled by the file's stem)."""
    path.write_bytes(row.data)
    if row.key is None:
        assert_read(lambda: read_all(path, path.stem), row.expected)
    else:
        assert_read(lambda: read_key(path, row.key, path.stem), row.expected)


def ids(rows: list[Row]) -> list[str]:
    return [row.id for row in rows]


# ---------------------------------------------------------------- .npy (files/npy.read_npy_stream)


def npy_version(array: np.ndarray, version) -> bytes:
    buffer = io.BytesIO()
    npy_format.write_array(buffer, array, version=version, allow_pickle=False)
    return buffer.getvalue()


A_NPY = npy_bytes(A)
NPY_ROWS = [
    Row("float32", A_NPY, A),
    Row("float64", npy_bytes(B), B),
    Row("float16", npy_bytes(A.astype(np.float16)), A.astype(np.float16)),
    Row("bfloat16-stored-as-V2", npy_bytes(BF16), BF16),
    Row("big-endian-to-native", npy_bytes(A.astype(">f4")), A),
    Row("fortran-order", npy_bytes(np.asfortranarray(A)), A),
    Row("int32-read-as-is", npy_bytes(np.arange(6, dtype=np.int32)), np.arange(6, dtype=np.int32)),
    Row("0-d", npy_bytes(np.array(2.5)), np.array(2.5)),
    Row("empty", npy_bytes(np.zeros((0, 3), np.float32)), np.zeros((0, 3), np.float32)),
    Row("version-2", npy_version(A, (2, 0)), A),
    Row("version-3", npy_version(A, (3, 0)), A),
    Row("trailing-bytes-not-read", A_NPY + b"more", A),
    Row("stream-of-unknown-size", A_NPY, A, sized=False),
    Row("empty-file", b"", r"^x: not a valid \.npy file \("),
    Row("text", b"mean = [1, 2, 3]\n", r"^x: not a valid \.npy file \("),
    Row("header-cut-short", A_NPY[:20], r"^x: not a valid \.npy file \("),
    Row("unknown-version", b"\x93NUMPY\x09\x09" + A_NPY[8:], r"^x: not a valid \.npy file \("),
    Row("header-not-a-dict", b"\x93NUMPY\x01\x00\x10\x00" + b"__import__('os')\n", r"^x: not a valid \.npy file \("),
    Row("data-cut-short", A_NPY[:-48],
        r"^x: header declares shape \(2, 3, 4\) float32 \(96 bytes\) but the file holds 48 bytes of data$"),
    Row("stream-cut-short", A_NPY[:-48],
        r"^x: header declares shape \(2, 3, 4\) float32 \(96 bytes\) but the data ends after 48 bytes \(truncated\)$",
        sized=False),
    Row("huge-shape-tiny-file", npy_with_header({"descr": "<f4", "fortran_order": False, "shape": (10**5, 10**5)}, b"\0" * 8),
        r"^x: header declares shape \(100000, 100000\) float32 \(40000000000 bytes\) but the file holds 8 bytes"),
    Row("negative-dimension", npy_with_header({"descr": "<f4", "fortran_order": False, "shape": (2, -3)}),
        r"^x: header declares shape \(2, -3\) with a negative dimension$"),
    Row("minus-one-dimension", npy_with_header({"descr": "<f4", "fortran_order": False, "shape": (-1, 3)}, b"\0" * 12),
        r"^x: header declares shape \(-1, 3\) with a negative dimension$"),
    Row("bool-in-shape", npy_with_header({"descr": "<f4", "fortran_order": False, "shape": (True,)}, b"\0" * 4),
        r"^x: not a valid \.npy file \(shape \(True,\) is not a tuple of integers\)$"),
    Row("python-objects", object_npy(), r"^x: holds Python objects \(dtype object\); refusing to unpickle$"),
    Row("structured", npy_bytes(np.zeros(3, [("a", "<f4"), ("b", "<i4")])), r"^x: has a structured dtype "),
    Row("zero-size-dtype", npy_with_header({"descr": "|V0", "fortran_order": False, "shape": (3,)}),
        r"^x: has a zero-size dtype \|?V0"),
]


@pytest.mark.parametrize("row", NPY_ROWS, ids=ids(NPY_ROWS))
def test_npy_reader(row: Row) -> None:
    size = len(row.data) if row.sized else None
    assert_read(lambda: read_npy_stream(io.BytesIO(row.data), size, "x"), row.expected)


# ---------------------------------------------------------------- .npz (files/npz.read_npz, read_npz_key)


def beyond_deflate(extra: int) -> bytes:
    """A deflated member declaring `extra` bytes more than deflate's bound for its compressed size allows."""
    honest = npz_of({"a.npy": A_NPY}, zipfile.ZIP_DEFLATED)
    compressed = zipfile.ZipFile(io.BytesIO(honest)).getinfo("a.npy").compress_size
    return lying_zip("a.npy", A_NPY, MAX_DEFLATE_RATIO * compressed + 4096 + extra, zipfile.ZIP_DEFLATED)


def flipped_byte(data: bytes, index: int) -> bytes:
    raw = bytearray(data)
    raw[index] ^= 0xFF
    return bytes(raw)


TWO = {"a": A, "b": B}
STORED = npz_archive(TWO)
DEFLATED = npz_archive(TWO, zipfile.ZIP_DEFLATED)
NPZ_ROWS = [
    Row("stored", STORED, TWO),
    Row("deflated", DEFLATED, TWO),
    Row("bzip2", npz_archive(TWO, zipfile.ZIP_BZIP2), TWO),
    Row("lzma", npz_archive(TWO, zipfile.ZIP_LZMA), TWO),
    Row("zip64-members", npz_archive(TWO, zip64=True), TWO),
    Row("sizes-after-the-data", npz_archive(TWO, zipfile.ZIP_DEFLATED, stream=True), TWO),
    Row("np-savez", (lambda buffer: np.savez(buffer, a=A, b=B) or buffer.getvalue())(io.BytesIO()), TWO),
    Row("bfloat16-member", npz_archive({"g": BF16}), {"g": BF16}),
    Row("other-members-ignored", npz_of({"a.npy": A_NPY, "README.txt": b"hello"}), {"a": A}),
    Row("no-members", npz_of({}), {}),
    Row("by-key-stored", STORED, B, key="b"),
    Row("by-key-deflated", DEFLATED, A, key="a"),
    Row("not-a-zip", b"this is not a zip archive\n" * 10, r"^b: not a valid \.npz archive \(File is not a zip file\)$"),
    Row("cut-short", STORED[: len(STORED) // 2], r"^b: not a valid \.npz archive \("),
    Row("key-missing", STORED, r"^b: no array 'c' in the archive \(it has: a, b\)$", key="c"),
    Row("stored-member-cut-short", npz_of({"a.npy": A_NPY[:-48]}),
        r"^b:a: header declares shape \(2, 3, 4\) float32 \(96 bytes\) but the file holds 48 bytes of data$"),
    Row("stored-member-size-lie", lying_zip("a.npy", A_NPY, 2**31),
        r"^b:a: stored member declares 2147483648 bytes but holds \d+ \(truncated, or its size is a lie\)$"),
    Row("deflated-beyond-deflates-ratio", lying_zip("a.npy", A_NPY, 0xF0000000, zipfile.ZIP_DEFLATED),
        r"^b:a: deflate member declares 4026531840 bytes from \d+ compressed, more than deflate can produce"),
    # At the bound, a member is read as far as its .npy header declares; one byte past it, it is refused unread.
    Row("deflated-at-deflates-bound", beyond_deflate(0), {"a": A}),
    Row("deflated-one-byte-past-deflates-bound", beyond_deflate(1), r"^b:a: deflate member declares \d+ bytes from \d+ "
        r"compressed, more than deflate can produce"),
    Row("bzip2-beyond-deflates-ratio", lying_zip("a.npy", A_NPY, 0xF0000000, zipfile.ZIP_BZIP2),
        r"^b:a: bzip2 member declares 4026531840 bytes from \d+ compressed, more than deflate can produce"),
    Row("member-not-npy", npz_of({"a.npy": b"#!/bin/sh\nrm -rf /\n"}), r"^b:a: not a valid \.npy file \("),
    Row("member-python-objects", npz_of({"a.npy": object_npy()}), r"^b:a: holds Python objects"),
    Row("stored-member-bad-crc", flipped_byte(npz_of({"a.npy": A_NPY}), 30 + len("a.npy") + len(A_NPY) - 1),
        r"^b:a: cannot read a\.npy \(Bad CRC-32 for file 'a\.npy'\)$"),
    Row("deflated-member-corrupt", flipped_byte(npz_of({"a.npy": A_NPY}, zipfile.ZIP_DEFLATED), 30 + len("a.npy") + 5),
        r"^b:a: cannot read a\.npy \("),
    Row("encrypted-member", encrypted_zip(STORED),
        r"^b:a: cannot read a\.npy \(.* is encrypted"),
    Row("unknown-method", zip_with_method(STORED, 98),
        r"^b:a: cannot read a\.npy \(That compression method is not supported\)$"),
]


@pytest.mark.parametrize("row", NPZ_ROWS, ids=ids(NPZ_ROWS))
def test_npz_reader(row: Row, tmp_path: Path) -> None:
    assert_file_row(row, tmp_path / "b.npz", read_npz, read_npz_key)
    if row.key is None:
        assert_read(lambda: read_npz(io.BytesIO(row.data), "b"), row.expected)  # a stream reads alike


def test_npz_reads_only_the_members_asked_for(tmp_path: Path) -> None:
    """`only` and `check_keys`: a member nobody wants is never read, so its damage goes unnoticed."""
    path = tmp_path / "b.npz"
    path.write_bytes(npz_of({"a.npy": A_NPY, "bad.npy": b"garbage"}))
    assert_read(lambda: read_npz(path, "b", only=["a"]), {"a": A})
    seen = []
    assert_read(lambda: read_npz(path, "b", check_keys=seen.append, only=["a"]), {"a": A})
    assert seen == [["a", "bad"]]


# ---------------------------------------------------------------- .safetensors (files/safetensors_file)


def safetensors(tensors: dict[str, tuple[str, tuple[int, ...], bytes]], header: dict | None = None,
                metadata: dict | None = None) -> bytes:
    """A .safetensors file: tensors by key as (dtype name, shape, data); `header` entries override the computed ones."""
    entries, data = {}, b""
    for key, (dtype, shape, raw) in tensors.items():
        entries[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        entries["__metadata__"] = metadata
    text = json.dumps({**entries, **(header or {})}).encode()
    return struct.pack("<Q", len(text)) + text + data


def tensor(array: np.ndarray, name: str) -> tuple[str, tuple[int, ...], bytes]:
    return name, array.shape, np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


A_ST = safetensors({"a": tensor(A, "F32")})
SAFETENSORS_ROWS = [
    Row("float32", A_ST, {"a": A}),
    Row("two-tensors-and-metadata", safetensors({"a": tensor(A, "F32"), "b": tensor(B, "F64")}, metadata={"k": "v"}),
        {"a": A, "b": B}),
    Row("float16", safetensors({"h": tensor(A.astype(np.float16), "F16")}), {"h": A.astype(np.float16)}),
    Row("bfloat16", safetensors({"g": tensor(BF16, "BF16")}), {"g": BF16}),
    Row("int32-read-as-is", safetensors({"i": tensor(np.arange(4, dtype=np.int32), "I32")}),
        {"i": np.arange(4, dtype=np.int32)}),
    Row("bool", safetensors({"m": tensor(np.array([True, False]), "BOOL")}), {"m": np.array([True, False])}),
    Row("empty-tensor", safetensors({"e": ("F32", (0, 3), b"")}), {"e": np.zeros((0, 3), np.float32)}),
    Row("by-key", safetensors({"a": tensor(A, "F32"), "b": tensor(B, "F64")}), B, key="b"),
    Row("key-missing", A_ST, r"^t: no tensor 'c' in the file \(it has: 'a'\)$", key="c"),
    Row("empty-file", b"", r"^t: not a valid \.safetensors file \(header length -1 in a 0-byte file\)$"),
    Row("header-longer-than-the-file", struct.pack("<Q", 1000) + b"{}",
        r"^t: not a valid \.safetensors file \(header length 1000 in a 10-byte file\)$"),
    Row("header-not-json", struct.pack("<Q", 5) + b"{nope", r"^t: not a valid \.safetensors file \("),
    Row("header-a-list", struct.pack("<Q", 2) + b"[]", r"^t: not a valid \.safetensors file \(the header is not a JSON object\)$"),
    Row("dtype-unknown", safetensors({"a": ("F8_E4M3", (1,), b"\0")}),
        r"^t: tensor 'a' has dtype 'F8_E4M3', which bnbwd cannot read \(readable: F64, F32, "),
    Row("shape-not-a-list", safetensors({"a": tensor(A, "F32")}, header={"a": {"dtype": "F32", "shape": "2x3",
                                                                                   "data_offsets": [0, 96]}}),
        r"^t: tensor 'a' has shape '2x3', expected a list of at most 32 integers >= 0$"),
    Row("shape-negative", safetensors({"a": ("F32", (-1, 4), b"")}),
        r"^t: tensor 'a' has shape \[-1, 4\], expected a list of at most 32 integers >= 0$"),
    Row("offsets-outside-the-data", safetensors({"a": tensor(A, "F32")}, header={"a": {"dtype": "F32", "shape": [2, 3, 4],
                                                                                      "data_offsets": [0, 200]}}),
        r"^t: tensor 'a' has data_offsets \[0, 200\], outside the 96 bytes of data the file holds$"),
    Row("offsets-short-of-the-shapes-size", safetensors({"a": ("F32", (2, 3, 4), b"\0" * 92)}),
        r"^t: tensor 'a' declares shape \(2, 3, 4\) F32 \(96 bytes\) but 92 bytes of data$"),
    Row("offsets-past-the-shapes-size", safetensors({"a": ("F32", (2, 3, 4), b"\0" * 100)}),
        r"^t: tensor 'a' declares shape \(2, 3, 4\) F32 \(96 bytes\) but 100 bytes of data$"),
]


@pytest.mark.parametrize("row", SAFETENSORS_ROWS, ids=ids(SAFETENSORS_ROWS))
def test_safetensors_reader(row: Row, tmp_path: Path) -> None:
    assert_file_row(row, tmp_path / "t.safetensors", read_safetensors, read_safetensors_key)


# ---------------------------------------------------------------- raw dumps (files/raw)

RAW_ROWS = [  # id, the source's DTYPE:SHAPE, the file's bytes, the array or the message
    ("f32", "f32:2x3x4", A.tobytes(), A),
    ("shape-with-commas", "f32:2,3,4", A.tobytes(), A),
    ("f64", "f64:3", B.tobytes(), B),
    ("f16", "F16:2x3x4", A.astype(np.float16).tobytes(), A.astype(np.float16)),
    ("bf16", "bf16:3", BF16.tobytes(), BF16),
    ("int16", "i16:2", np.array([1, -2], np.int16).tobytes(), np.array([1, -2], np.int16)),
    ("uint16", "u16:2", np.array([1, 65535], np.uint16).tobytes(), np.array([1, 65535], np.uint16)),
    ("big-endian-to-native", ">f4:2x3x4", A.astype(">f4").tobytes(), A),
    ("numpy-name", "float32:24", A.tobytes(), A.reshape(-1)),
    ("empty", "f32:0x3", b"", np.zeros((0, 3), np.float32)),
    ("one-byte-short", "f32:2x3x4", A.tobytes()[:-1], r"needs 96 bytes, the file holds 95$"),
    ("one-byte-over", "f32:2x3x4", A.tobytes() + b"\0", r"needs 96 bytes, the file holds 97$"),
    ("dtype-not-a-number", "complex64:2", b"\0" * 16, r"dtype 'complex64' is not a number type; expected f16, bf16"),
    ("dtype-unknown", "float33:2", b"\0" * 8, r"dtype 'float33' is not a number type"),
    ("shape-not-dimensions", "f32:2xax3", b"", r"shape '2xax3' is not dimensions joined by 'x'"),
    ("shape-negative", "f32:-2x3", b"", r"shape '-2x3' is not dimensions joined by 'x'"),
    ("32-dimensions", "f32:" + "x".join(["1"] * 32), A.tobytes()[:4], A.reshape(-1)[:1].reshape((1,) * 32)),
    ("33-dimensions", "f32:" + "x".join(["1"] * 33), A.tobytes()[:4], r"shape has 33 dimensions, at most 32 are read$"),
    ("more-bytes-than-any-file", "f64:" + "x".join(["4294967296"] * 2), b"", r"describes more bytes than any file holds$"),
    ("parts-missing", "f32", b"", r"expected raw:DTYPE:SHAPE:PATH, e\.g\. raw:f32:8x64x56x56:x\.bin$"),
]


@pytest.mark.parametrize("spec, data, expected", [row[1:] for row in RAW_ROWS], ids=[row[0] for row in RAW_ROWS])
def test_raw_reader(spec: str, data: bytes, expected, tmp_path: Path) -> None:
    path = tmp_path / "x:y.bin"  # the path comes last: it may hold ':'
    path.write_bytes(data)
    source = f"raw:{spec}:{path}" if spec.count(":") == 1 else f"raw:{spec}"
    if not isinstance(expected, str):
        assert parse_raw(source).path == path
    assert_read(lambda: read_raw(source, "x"), expected)


def test_raw_file_missing_is_one_line(tmp_path: Path) -> None:
    source = f"raw:f32:3:{tmp_path / 'nope.bin'}"
    assert_read(lambda: read_raw(source, "x"), r"^x \(raw:f32:3:.*nope\.bin\): cannot read \(No such file")  # the path once


# ---------------------------------------------------------------- read_array and read_bundle: the reader by name and content


class Tripwire:
    """Unpickling this runs code: a pickle read by mistake would raise here."""

    def __reduce__(self):
        return (pytest.fail, ("a pickle was loaded",))


SOURCES = [  # id, file name, its bytes, key, the array read_array gives or the message
    ("npy", "x.npy", A_NPY, None, A),
    ("npy-by-content-any-suffix", "x.bin", A_NPY, None, A),
    ("npz-one-array", "x.npz", npz_archive({"a": A}), None, A),
    ("npz-key", "x.npz", STORED, "b", B),
    ("npz-several-arrays", "x.npz", STORED, None, r"^x \(.*x\.npz\): the file holds 2 arrays \(a, b\); name one with FILE\.npz:key"),
    ("safetensors-by-suffix", "x.safetensors", A_ST, None, A),
    ("safetensors-by-content", "x.dat", A_ST, None, A),
    ("safetensors-key", "x.safetensors", safetensors({"a": tensor(A, "F32"), "b": tensor(B, "F64")}), "b", B),
    ("torch-by-suffix", "x.pt", A_NPY, None, r"is a PyTorch checkpoint \(a Python pickle\), which bnbwd never loads"),
    ("pickle-by-content", "x.npy", pickle.dumps(Tripwire(), protocol=4), None, r"is a PyTorch checkpoint"),
    ("torch-zip-by-content", "x.npz", npz_of({"archive/data.pkl": pickle.dumps(Tripwire())}), None,
     r"is a PyTorch checkpoint"),
    ("key-only-after-npz-or-safetensors", "x.npy", A_NPY, "a", r"^x \(.*x\.npy:a\): no such file$"),
]


@pytest.mark.parametrize("name, data, key, expected", [row[1:] for row in SOURCES], ids=[row[0] for row in SOURCES])
def test_read_array_picks_the_reader(name: str, data: bytes, key: str | None, expected, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    source = f"{path}:{key}" if key else str(path)
    assert_read(lambda: read_array(source, "x"), expected)


@pytest.mark.parametrize("name, data, expected", [
    ("b.npz", STORED, TWO),
    ("b.safetensors", safetensors({"a": tensor(A, "F32"), "b": tensor(B, "F64")}), TWO),
    ("b.npy", A_NPY, r"^bundle \(.*b\.npy\): not an \.npz archive or a \.safetensors file$"),
    ("missing.npz", None, r"^bundle \(.*missing\.npz\): no such file$"),
], ids=["npz", "safetensors", "npy", "missing"])
def test_read_bundle_takes_archives_only(name: str, data: bytes | None, expected, tmp_path: Path) -> None:
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    assert_read(lambda: read_bundle(str(path)), expected)
