"""A catalogue of malformed, hostile and odd-but-valid inputs, each fed through the real CLI.

Every case builds its files in tmp_path, runs `bnbwd run`, and checks: the exit code
(3 input error, 2 usage error, 0 for inputs that are odd but valid), one `error: ...`
line on stderr that names the problem, no traceback, and nothing left in the output
directory (no output, no `.*.tmp`) unless the run succeeded. Valid cases are checked
against the float64 oracle.
"""

from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from numpy.lib import format as npy_format

from bnbwd_cli.cli import main
from bnbwd_cli.core import Op
from bnbwd_cli.core.reference import reference_backward
from tests.conftest import error_line, npy_bytes, save_npy_flags
from tests.conftest import make_inputs as shared_inputs

pytestmark = [pytest.mark.filterwarnings("error::RuntimeWarning"),  # NumPy warnings must not leak to the user
              pytest.mark.filterwarnings("error::UserWarning")]

EPSILON = 1e-3
EXAMPLE = Path(__file__).resolve().parent.parent / "fixtures" / "example.npz"
SHAPE = (2, 3, 4, 5)  # NCHW: C = 3


def make_inputs(shape=SHAPE, dtype=np.float32, stats_dtype=np.float32) -> dict[str, np.ndarray]:
    """The shared factory with this module's fixed seed and default shape (the cases are built at import)."""
    return shared_inputs(np.random.default_rng(7), shape, dtype=dtype, stats_dtype=stats_dtype)


def npy_with_header(header: dict, data: bytes = b"", version=(1, 0)) -> bytes:
    """A .npy whose header says whatever the test wants, followed by `data`."""
    text = repr(header).encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    prefix = npy_format.magic(*version) + (struct.pack("<H", len(text)) if version == (1, 0) else struct.pack("<I", len(text)))
    return prefix + text + data


def npz_of(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


class Workspace:
    """Input files under tmp/in, outputs under tmp/out (created empty)."""

    def __init__(self, root: Path) -> None:
        self.inputs = root / "in"
        self.out = root / "out"
        self.inputs.mkdir()
        self.out.mkdir()
        self.arrays: dict[str, np.ndarray] = {}
        self.epsilon = EPSILON
        self.data_format = "NCHW"

    def path(self, name: str) -> Path:
        return self.inputs / name

    def write(self, name: str, data: bytes) -> str:
        self.path(name).write_bytes(data)
        return str(self.path(name))

    def npy(self, name: str, array: np.ndarray) -> str:
        np.save(self.path(name), array, allow_pickle=False)
        return str(self.path(name))

    def bundle(self, arrays: dict | None = None, name: str = "bundle.npz", **extra) -> str:
        """Save a bundle (default: valid inputs plus epsilon and data_format), remembering the inputs."""
        arrays = make_inputs() if arrays is None else arrays
        self.arrays = {k: v for k, v in arrays.items() if isinstance(v, np.ndarray) and v.ndim > 0}
        extra.setdefault("epsilon", np.array(self.epsilon))
        extra.setdefault("data_format", np.array(self.data_format))
        extra = {k: v for k, v in extra.items() if v is not None}
        np.savez(self.path(name), **arrays, **extra)
        return str(self.path(name))

    def flags(self, arrays: dict | None = None) -> list[str]:
        """Every input as its own .npy and --flag, plus --epsilon and --format."""
        self.arrays = dict(make_inputs() if arrays is None else arrays)
        return save_npy_flags(self.inputs, self.arrays, names=tuple(self.arrays)) + [
            "--epsilon", repr(self.epsilon), "--format", self.data_format]


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Workspace], list[str]]  # argv after "run"; "-o out/grads.npz" is added unless given
    code: int
    pattern: str  # regex the error line must match; for code 0, one the stderr must match ("" = empty stderr)
    stdin: bytes | None = None


def bundle_with(**changes) -> Callable[[Workspace], list[str]]:
    """A bundle of valid inputs with some arrays replaced (None removes one)."""

    def build(ws: Workspace) -> list[str]:
        arrays = make_inputs()
        for key, value in changes.items():
            if value is None:
                arrays.pop(key)
            else:
                arrays[key] = value(arrays) if callable(value) else value
        return [ws.bundle(arrays)]

    return build


def flag_with(name: str, data: Callable[[Workspace], bytes]) -> Callable[[Workspace], list[str]]:
    """A valid bundle with input `name` overridden by a hostile file."""

    def build(ws: Workspace) -> list[str]:
        return [ws.bundle(), "--" + name.replace("_", "-"), ws.write(f"{name}.npy", data(ws))]

    return build


def truncated(data: bytes, keep: float) -> bytes:
    return data[: int(len(data) * keep)]


SRC_NPY = npy_bytes(make_inputs()["src"])
VALID_BUNDLE_BYTES = npz_of({f"{k}.npy": npy_bytes(v) for k, v in make_inputs().items()}
                            | {"epsilon.npy": npy_bytes(np.array(EPSILON)), "data_format.npy": npy_bytes(np.array("NCHW"))})


def encrypted_zip(data: bytes) -> bytes:
    """A zip whose member claims to be encrypted (general-purpose flag bit 0)."""
    raw = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (start := raw.find(signature, start)) != -1:
            raw[start + offset] |= 0x01
            start += 4
    return bytes(raw)


def zip_with_method(data: bytes, method: int) -> bytes:
    """A zip whose members claim an unsupported compression method."""
    raw = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        start = 0
        while (start := raw.find(signature, start)) != -1:
            raw[start + offset : start + offset + 2] = struct.pack("<H", method)
            start += 4
    return bytes(raw)


def lying_zip(member: str, data: bytes, claimed_size: int) -> bytes:
    """A stored zip member whose headers claim an uncompressed size it does not have."""
    raw = bytearray(npz_of({member: data}))
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = raw.find(signature)
        raw[start + offset : start + offset + 4] = struct.pack("<I", claimed_size)
    return bytes(raw)


def object_npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}, None, 3], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def huge_header(shape, descr="<f4", data=b"\0" * 64) -> bytes:
    return npy_with_header({"descr": descr, "fortran_order": False, "shape": shape}, data)


def reorder(arrays, transform):
    return {k: transform(v) if v.ndim == 4 else v for k, v in arrays.items()}


def with_value(name: str, index, value):
    def change(arrays):
        array = arrays[name].copy()
        array[index] = value
        return array

    return change


def out_dir_overwrites_input(ws: Workspace) -> list[str]:
    arrays = make_inputs()
    args = ["--src", ws.npy("diff_src.npy", arrays["src"])]
    return [ws.bundle(arrays), *args, "--out-dir", str(ws.inputs)]


def output_is_input(ws: Workspace) -> list[str]:
    bundle = ws.bundle()
    return [bundle, "-o", bundle]


def output_is_input_via_symlink(ws: Workspace) -> list[str]:
    bundle = ws.bundle()
    link = ws.out / "grads.npz"
    link.symlink_to(bundle)
    ws.preexisting = {"grads.npz"}
    return [bundle, "-o", str(link)]


def json_is_input(ws: Workspace) -> list[str]:
    bundle = ws.bundle()
    return [bundle, "--json", bundle]


CASES = [
    # ---- .npy files that are not what they claim
    Case("npy-truncated-data", flag_with("src", lambda ws: truncated(SRC_NPY, 0.6)), 3,
         r"src .*(truncated|header declares shape \(2, 3, 4, 5\))"),
    Case("npy-truncated-header", flag_with("src", lambda ws: SRC_NPY[:20]), 3, r"src .*not a valid \.npy"),
    Case("npy-empty-file", flag_with("src", lambda ws: b""), 3, r"src .*not a valid \.npy"),
    Case("npy-is-text", flag_with("mean", lambda ws: b"mean = [1, 2, 3]\n"), 3, r"mean .*not a valid \.npy"),
    Case("npy-bad-magic-version", flag_with("src", lambda ws: b"\x93NUMPY\x09\x09" + SRC_NPY[8:]), 3,
         r"src .*not a valid \.npy"),
    Case("npy-header-not-a-dict", flag_with("src", lambda ws: b"\x93NUMPY\x01\x00\x10\x00" + b"__import__('os')\n"), 3,
         r"src .*not a valid \.npy"),
    Case("npy-huge-shape-tiny-file", flag_with("src", lambda ws: huge_header((100000, 100000, 3, 3))), 3,
         r"src .*declares shape \(100000, 100000, 3, 3\).* but the file holds 64 bytes"),
    Case("npy-shape-overflows-int64", flag_with("src", lambda ws: huge_header((2**32, 2**32, 3, 3))), 3,
         r"src .*declares shape \(4294967296, 4294967296, 3, 3\)"),
    Case("npy-negative-dimension", flag_with("mean", lambda ws: huge_header((-3,), data=b"")), 3,
         r"mean .*negative dimension"),
    Case("npy-python2-header", flag_with("mean", lambda ws: npy_with_header({"descr": "<f4", "fortran_order": False, "shape": (4,)})
                                         .replace(b"(4,)", b"(4L,)") + b"\0" * 16), 3, r"mean has shape \(4,\), expected \(3,\)"),
    Case("npy-object-pickle", flag_with("gamma", lambda ws: object_npy()), 3, r"gamma .*Python objects.*unpickle"),
    Case("npy-structured-dtype", flag_with("src", lambda ws: npy_bytes(np.zeros(SHAPE, dtype=[("a", "<f4"), ("b", "<i4")]))),
         3, r"src .*structured dtype"),
    Case("npy-int32-src", bundle_with(src=lambda a: a["src"].astype(np.int32)), 3, r"src has dtype int32, expected a float"),
    Case("npy-complex-src", bundle_with(src=lambda a: a["src"].astype(np.complex64), diff_dst=lambda a: a["diff_dst"].astype(np.complex64)),
         3, r"src has dtype complex64, expected a float"),
    Case("npy-bool-diff-dst", bundle_with(diff_dst=lambda a: a["diff_dst"] > 0), 3, r"diff_dst has dtype bool, expected a float"),
    Case("npy-int-variance", bundle_with(variance=np.array([1, 2, 3], dtype=np.int64)), 3, r"variance has dtype int64"),
    Case("npy-unicode-mean", bundle_with(mean=np.array(["a", "b", "c"])), 3, r"mean has dtype <U1, expected a float"),
    Case("npy-datetime-src", bundle_with(src=lambda a: np.zeros(SHAPE, dtype="datetime64[s]")), 3, r"src has dtype datetime64"),
    Case("npy-void4-src", bundle_with(src=lambda a: np.zeros(SHAPE, dtype="V4")), 3, r"src has dtype \|?V4, expected a float"),
    Case("src-0d", bundle_with(src=np.array(1.0, dtype=np.float32), diff_dst=np.array(1.0, dtype=np.float32)), 3,
         r"src has rank 0"),
    Case("src-1d", bundle_with(src=np.ones(3, np.float32), diff_dst=np.ones(3, np.float32)), 3, r"src has rank 1"),
    # ---- .npz archives
    Case("npz-truncated", lambda ws: [ws.write("bundle.npz", truncated(VALID_BUNDLE_BYTES, 0.5))], 3,
         r"bundle .*not a valid \.npz"),
    Case("npz-truncated-member", lambda ws: [ws.write("bundle.npz", npz_of({"src.npy": truncated(SRC_NPY, 0.5)}))], 3,
         r"bundle .*src.*(truncated|declares shape)"),
    Case("npz-not-a-zip", lambda ws: [ws.write("bundle.npz", b"this is not a zip archive\n" * 10)], 3,
         r"bundle .*not an \.npz archive"),
    Case("npz-zip-magic-then-garbage", lambda ws: [ws.write("bundle.npz", b"PK\x03\x04" + b"\xff" * 200)], 3,
         r"bundle .*not a valid \.npz"),
    Case("npz-huge-shape-tiny-member", lambda ws: [ws.write("bundle.npz", npz_of({"src.npy": huge_header((10**6, 10**6, 10, 10))},
                                                                               zipfile.ZIP_DEFLATED))], 3,
         r"bundle .*src.*declares shape \(1000000, 1000000, 10, 10\)"),
    Case("npz-lying-member-size", lambda ws: [ws.write("bundle.npz", lying_zip("src.npy", huge_header((10**5, 10**5)), 2**31))], 3,
         r"bundle .*src.*(truncated|cannot read|declares shape)"),
    Case("npz-member-not-npy", lambda ws: [ws.write("bundle.npz", npz_of({"src.npy": b"#!/bin/sh\nrm -rf /\n"}))], 3,
         r"bundle .*src.*not a valid \.npy"),
    Case("npz-pickled-member", lambda ws: [ws.write("bundle.npz", npz_of({"src.npy": object_npy()}))], 3,
         r"bundle .*src.*Python objects"),
    Case("npz-encrypted-member", lambda ws: [ws.write("bundle.npz", encrypted_zip(VALID_BUNDLE_BYTES))], 3,
         r"bundle .*(encrypted|cannot read)"),
    Case("npz-unsupported-compression", lambda ws: [ws.write("bundle.npz", zip_with_method(VALID_BUNDLE_BYTES, 98))], 3,
         r"bundle .*(compression|cannot read)"),
    Case("npz-missing-key", lambda ws: [ws.bundle(), "--mean", f"{ws.bundle(name='other.npz')}:nothere"], 3,
         r"mean .*no array 'nothere' in the archive \(it has: .*src"),
    Case("npz-two-arrays-as-one-input", lambda ws: [ws.bundle(), "--mean", ws.bundle(name="other.npz")], 3,
         r"mean .*holds \d+ arrays .*FILE\.npz:key"),
    Case("npz-key-on-non-zip", lambda ws: [ws.bundle(), "--mean", ws.write("m.npz", b"nope") + ":mean"], 3,
         r"mean .*not a valid \.npz"),
    Case("bundle-is-npy", lambda ws: [ws.npy("bundle.npy", make_inputs()["src"])], 3, r"bundle .*not an \.npz archive"),
    Case("bundle-duplicate-alias", lambda ws: [ws.bundle(make_inputs() | {"x": make_inputs()["src"]})], 3,
         r"both 'src' and 'x' give src"),
    Case("bundle-missing-variance", bundle_with(variance=None), 3, r"missing input variance"),
    Case("bundle-epsilon-not-0d", lambda ws: [ws.bundle(epsilon=np.array([1e-3, 1e-3]))], 3, r"'epsilon' must be a 0-d"),
    Case("bundle-epsilon-string", lambda ws: [ws.bundle(epsilon=np.array("1e-3"))], 3, r"'epsilon' must be a real number"),
    Case("bundle-epsilon-nan", lambda ws: [ws.bundle(epsilon=np.array(np.nan))], 3, r"epsilon is nan, expected a finite number > 0"),
    Case("bundle-epsilon-negative", lambda ws: [ws.bundle(epsilon=np.array(-1e-5))], 3, r"epsilon is -1e-05"),
    Case("bundle-data-format-bogus", lambda ws: [ws.bundle(data_format=np.array("NQHW"))], 3, r"data_format.*NQHW"),
    Case("bundle-data-format-number", lambda ws: [ws.bundle(data_format=np.array(4))], 3, r"'data_format' must be a string"),
    # ---- shapes, dtypes and values that do not fit together
    Case("diff-dst-shape-mismatch", bundle_with(diff_dst=lambda a: a["diff_dst"][:1]), 3,
         r"diff_dst has shape \(1, 3, 4, 5\), expected \(2, 3, 4, 5\)"),
    Case("mean-wrong-length", bundle_with(mean=lambda a: a["mean"][:2]), 3, r"mean has shape \(2,\), expected \(3,\)"),
    Case("diff-dst-dtype-mismatch", bundle_with(diff_dst=lambda a: a["diff_dst"].astype(np.float64)), 3,
         r"diff_dst has dtype f64, expected f32"),
    Case("variance-negative", bundle_with(variance=with_value("variance", 1, -0.5)), 3, r"variance at c=1 is -0\.5, expected >= 0"),
    Case("variance-nan", bundle_with(variance=with_value("variance", 2, np.nan)), 3, r"variance at c=2 is nan"),
    Case("invstd-zero", lambda ws: [*bundle_with(variance=with_value("variance", 0, 0.0))(ws), "--variance-is-invstd"], 3,
         r"variance \(as invstd\) at c=0"),
    Case("format-rank-mismatch", lambda ws: [ws.bundle(), "--format", "NCW"], 3, r"NCW needs a rank-3 src, found rank 4"),
    Case("spec-format-not-allowed", lambda ws: [ws.bundle(), "--spec", "ngraph", "--format", "NHWC"], 3,
         r"data_format NHWC is not allowed by spec ngraph"),
    Case("spec-dtype-pair-not-allowed", lambda ws: [ws.bundle(make_inputs(dtype=np.float16, stats_dtype=np.float16)), "--spec", "openvino"],
         3, r"spec openvino does not allow src f16 with mean/variance f16"),
    Case("bf16-flag-on-float32", lambda ws: [ws.bundle(), "--bf16", "mean"], 3, r"--bf16 mean: mean has dtype float32"),
    # ---- epsilon from the command line
    Case("epsilon-zero", lambda ws: [ws.bundle(), "--epsilon", "0"], 3, r"epsilon is 0\.0, expected a finite number > 0"),
    Case("epsilon-negative", lambda ws: [ws.bundle(), "--epsilon", "-1e-5"], 3, r"epsilon is -1e-05"),
    Case("epsilon-nan", lambda ws: [ws.bundle(), "--epsilon", "nan"], 3, r"epsilon is nan"),
    Case("epsilon-inf", lambda ws: [ws.bundle(), "--epsilon", "inf"], 3, r"epsilon is inf"),
    Case("epsilon-overflows-f32", lambda ws: [ws.bundle(), "--spec", "openvino", "--epsilon", "1e39"], 3,
         r"epsilon 1e\+39 .*float32"),
    Case("epsilon-underflows-f32", lambda ws: [ws.bundle(), "--spec", "onednn", "--epsilon", "1e-50"], 3,
         r"epsilon 1e-50 .*float32"),
    Case("epsilon-not-a-number", lambda ws: [ws.bundle(), "--epsilon", "small"], 2, r"'small' is not a valid float"),
    # ---- paths: missing, directories, outputs that would clobber something
    Case("input-missing", lambda ws: [ws.bundle(), "--src", str(ws.path("nope.npy"))], 3, r"src .*nope\.npy\): no such file"),
    Case("input-is-directory", lambda ws: [ws.bundle(), "--src", str(ws.inputs)], 3, r"src .*is a directory"),
    Case("bundle-missing", lambda ws: [str(ws.path("nope.npz"))], 3, r"bundle .*no such file"),
    Case("output-in-missing-directory", lambda ws: [ws.bundle(), "-o", str(ws.out / "no" / "such" / "grads.npz")], 3,
         r"output .*directory .*no/such does not exist"),
    Case("output-is-directory", lambda ws: [ws.bundle(), "-o", str(ws.out)], 3, r"output .*is a directory"),
    Case("output-is-input", output_is_input, 3, r"output .*bundle\.npz: is also an input .*refusing to overwrite"),
    Case("output-is-input-via-symlink", output_is_input_via_symlink, 3, r"output .*grads\.npz: is also an input"),
    Case("out-dir-would-overwrite-input", out_dir_overwrites_input, 3, r"output .*diff_src\.npy: is also an input"),
    Case("out-dir-is-a-file", lambda ws: [ws.bundle(), "--out-dir", ws.bundle()], 2, r"--out-dir.* is a file"),
    Case("out-dir-under-a-file", lambda ws: [ws.bundle(), "--out-dir", ws.bundle() + "/grads"], 3,
         r"output directory .*bundle\.npz/grads: cannot create it"),
    Case("json-is-input", json_is_input, 3, r"(json|output) .*bundle\.npz.*is also an input"),
    Case("json-in-missing-directory", lambda ws: [ws.bundle(), "--json", str(ws.out / "no" / "run.json")], 3,
         r"(json|output) .*does not exist"),
    Case("output-and-out-dir", lambda ws: [ws.bundle(), "-o", str(ws.out / "a.npz"), "--out-dir", str(ws.out)], 2,
         r"give -o/--output or --out-dir, not both"),
    Case("two-stdin-inputs", lambda ws: [ws.bundle(), "--src", "-", "--mean", "-"], 2, r"only one input can come from stdin"),
    Case("threads-zero", lambda ws: [ws.bundle(), "--threads", "0"], 2, r"--threads"),
    Case("block-size-garbage", lambda ws: [ws.bundle(), "--block-size", "lots"], 2, r"not a size"),
    Case("format-unknown", lambda ws: [ws.bundle(), "--format", "HWCN"], 2, r"--format"),
    # ---- the out-of-core path maps .npy inputs: the same vetting applies
    Case("stream-truncated-src", lambda ws: [*flag_with("src", lambda w: truncated(SRC_NPY, 0.6))(ws), "--stream"], 3,
         r"src .*(truncated|header declares shape)"),
    Case("stream-huge-shape", lambda ws: [*flag_with("diff_dst", lambda w: huge_header((10**6, 10**6, 3, 3)))(ws), "--stream"], 3,
         r"diff_dst .*declares shape \(1000000, 1000000, 3, 3\)"),
    Case("stream-pickled-src", lambda ws: [*flag_with("src", lambda w: object_npy())(ws), "--stream"], 3, r"src .*Python objects"),
    Case("stream-out-dir-under-a-file", lambda ws: [*ws.flags(), "--stream", "--out-dir", ws.bundle() + "/grads"], 3,
         r"output directory .*bundle\.npz/grads: cannot create it"),
    # ---- stdin ('-'): empty, cut short, garbage (closed stdin and real pipes: see the subprocess tests below)
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

# Odd but valid: they must work, and agree with the float64 oracle.
NONFINITE_WARNING = r"^warning: non-finite outputs .*NaN/Inf"
VALID_CASES = [
    Case("fortran-ordered", lambda ws: ws.flags(reorder(make_inputs(), np.asfortranarray)), 0, ""),
    Case("fortran-ordered-in-bundle", lambda ws: [ws.bundle(reorder(make_inputs(), np.asfortranarray))], 0, ""),
    Case("big-endian", lambda ws: ws.flags({k: v.astype(v.dtype.newbyteorder(">")) for k, v in make_inputs().items()}), 0, ""),
    Case("big-endian-f64-bundle", lambda ws: [ws.bundle({k: v.astype(">f8") for k, v in make_inputs().items()})], 0, ""),
    Case("bfloat16-as-void", lambda ws: [ws.bundle(make_inputs(dtype=ml_dtypes.bfloat16, stats_dtype=np.float32))], 0, ""),
    Case("float16", lambda ws: [ws.bundle(make_inputs(dtype=np.float16, stats_dtype=np.float32))], 0, ""),
    Case("channels-zero", lambda ws: [ws.bundle(make_inputs(shape=(2, 0, 4, 5)))], 0, ""),
    Case("batch-zero", lambda ws: [ws.bundle(make_inputs(shape=(0, 3, 4, 5)))], 0, ""),
    Case("spatial-zero", lambda ws: [ws.bundle(make_inputs(shape=(2, 3, 0, 5)))], 0, ""),
    Case("batch-one-spatial-one", lambda ws: [ws.bundle(make_inputs(shape=(1, 3, 1, 1)))], 0, ""),
    Case("nan-in-src", bundle_with(src=with_value("src", (0, 1, 2, 3), np.nan)), 0, NONFINITE_WARNING),
    Case("inf-in-diff-dst", bundle_with(diff_dst=with_value("diff_dst", (1, 2, 0, 0), np.inf)), 0, NONFINITE_WARNING),
    Case("nan-in-gamma", bundle_with(gamma=with_value("gamma", 0, np.nan)), 0, NONFINITE_WARNING),
    Case("inf-variance", bundle_with(variance=with_value("variance", 1, np.inf)), 0, ""),
    Case("stream-fortran-ordered", lambda ws: [*ws.flags(reorder(make_inputs(), np.asfortranarray)), "--stream"], 0, ""),
    Case("stream-big-endian", lambda ws: [*ws.flags({k: v.astype(">f4") for k, v in make_inputs().items()}), "--stream"], 0, ""),
    Case("stream-nan-in-diff-dst", lambda ws: [*ws.flags(make_inputs() | {"diff_dst": with_value("diff_dst", (0, 0, 0, 0), np.nan)(make_inputs())}),
                                               "--stream"], 0, NONFINITE_WARNING),
    Case("epsilon-huge", lambda ws: [ws.bundle(), "--epsilon", "1e30"], 0, ""),
    Case("epsilon-tiny", lambda ws: [ws.bundle(), "--epsilon", "1e-300"], 0, ""),
]


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def invoke(ws: Workspace, case: Case):
    args = case.build(ws)
    if not {"-o", "--out-dir"} & set(args):
        args += ["-o", str(ws.out / "grads.npz")]
    return CliRunner().invoke(main, ["run", *args], input=case.stdin, catch_exceptions=True), args


def assert_clean(result, ws: Workspace) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output + result.stderr
    leftovers = [p for p in (*ws.inputs.iterdir(), *ws.out.iterdir()) if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_cleanly(ws: Workspace, case: Case) -> None:
    inputs_before = {p.name: p.read_bytes() for p in ws.inputs.iterdir()}
    result, _ = invoke(ws, case)
    assert_clean(result, ws)
    assert result.exit_code == case.code, result.output + result.stderr
    if case.code == 3:
        assert re.search(case.pattern, error_line(result.stderr)), result.stderr
    else:
        assert re.search(case.pattern, result.stderr), result.stderr
    assert sorted(p.name for p in ws.out.iterdir()) == sorted(getattr(ws, "preexisting", ())), "output left behind"
    for path in ws.inputs.iterdir():  # inputs are never modified
        if path.name in inputs_before:
            assert path.read_bytes() == inputs_before[path.name], path


@pytest.mark.parametrize("case", VALID_CASES, ids=[c.id for c in VALID_CASES])
def test_odd_but_valid_input_works(ws: Workspace, case: Case) -> None:
    result, args = invoke(ws, case)
    assert_clean(result, ws)
    assert result.exit_code == 0, result.output + result.stderr
    if case.pattern:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and re.search(case.pattern, lines[0]), result.stderr  # warned once, on stderr
    else:
        assert result.stderr.strip() == ""
    assert [p.name for p in ws.out.iterdir()] == ["grads.npz"]
    with np.load(ws.out / "grads.npz", allow_pickle=False) as written:
        actual = {key: written[key] for key in written.files}
    epsilon = float(args[args.index("--epsilon") + 1]) if "--epsilon" in args else ws.epsilon
    arrays = {k: np.asarray(v) for k, v in ws.arrays.items()}
    actual = {k: v.view(ml_dtypes.bfloat16) if v.dtype == "V2" else v for k, v in actual.items()}  # np.save's bf16
    with np.errstate(all="ignore"):
        expected = reference_backward(Op(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"],
                                      arrays["gamma"], epsilon=epsilon, data_format="NCX"))
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        assert actual[name].shape == expected[name].shape, name
        assert actual[name].dtype == (arrays["src"] if name == "diff_src" else arrays["mean"]).dtype.newbyteorder("="), name
        got = actual[name].astype(np.float32 if actual[name].dtype.itemsize == 2 else actual[name].dtype).astype(np.float64)
        tolerance = 5e-2 if arrays["src"].dtype.itemsize == 2 else 1e-4
        np.testing.assert_allclose(got, expected[name], rtol=tolerance, atol=tolerance, equal_nan=True, err_msg=name)
        assert np.array_equal(np.isnan(got), np.isnan(expected[name])), f"{name}: NaN positions differ"


def test_zero_batch_gives_empty_diff_src_and_zero_param_grads(ws: Workspace) -> None:
    result, _ = invoke(ws, Case("n0", lambda w: [w.bundle(make_inputs(shape=(0, 3, 4, 5)))], 0, ""))
    assert result.exit_code == 0, result.stderr
    with np.load(ws.out / "grads.npz") as written:
        assert written["diff_src"].shape == (0, 3, 4, 5)
        assert np.array_equal(written["diff_gamma"], np.zeros(3)) and np.array_equal(written["diff_beta"], np.zeros(3))


def test_nan_propagates_through_its_channel_only(ws: Workspace) -> None:
    case = Case("nan", bundle_with(src=with_value("src", (0, 1, 2, 3), np.nan)), 0, NONFINITE_WARNING)
    result, _ = invoke(ws, case)
    assert result.exit_code == 0, result.stderr
    with np.load(ws.out / "grads.npz") as written:
        assert np.isnan(written["diff_src"][:, 1]).all() and np.isfinite(written["diff_src"][:, [0, 2]]).all()
        assert np.isnan(written["diff_gamma"][1]) and np.isfinite(written["diff_gamma"][[0, 2]]).all()
        assert np.isfinite(written["diff_beta"]).all()  # Σdy does not see src


def test_catalogue_is_large_enough() -> None:
    assert len(CASES) + len(VALID_CASES) >= 40
    assert len({c.id for c in CASES + VALID_CASES}) == len(CASES) + len(VALID_CASES)


# ---------------------------------------------------------------- real processes and pipes (a few: ~0.3 s each)


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


# ---------------------------------------------------------------- bounds before work, odd paths, streams, signals


def bnbwd_cmd(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Any bnbwd command (verify too) in a real process."""
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", *args], capture_output=True, timeout=60, **kwargs)


def test_unknown_npz_members_are_never_inflated(ws: Workspace, monkeypatch) -> None:
    """A key that names no input is noted from its name alone: the member is never opened, let alone inflated."""
    arrays = make_inputs()
    bundle = ws.write("bundle.npz", npz_of({**{f"{k}.npy": npy_bytes(v) for k, v in arrays.items()},
                                            "epsilon.npy": npy_bytes(np.array(EPSILON)),
                                            "junk.npy": npy_bytes(np.zeros(4096, np.float32))}, zipfile.ZIP_DEFLATED))
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, name, *a, **k: opened.append(getattr(name, "filename", name))
                        or real_open(self, name, *a, **k))
    outputs = ws.write("outputs.npz", npz_of({"diff_beta.npy": npy_bytes(np.zeros(3, np.float32))}))
    for command in (["run", bundle, "--format", "NCHW", "-o", str(ws.out / "grads.npz")],
                    ["verify", outputs, outputs, "--inputs", bundle, "--format", "NCHW"]):
        opened.clear()
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0 and re.search(r"^note: .*not used: junk$", result.stderr, re.M), result.output
        assert "junk.npy" not in opened, opened
    assert [p.name for p in ws.out.iterdir()] == ["grads.npz"]


def lying_member(data: bytes, declared: int) -> bytes:
    """A one-member deflated .npz whose local and central headers declare `declared` uncompressed bytes."""
    archive = bytearray(npz_of({"diff_dst.npy": data}, zipfile.ZIP_DEFLATED))
    local = archive.index(b"PK\x03\x04")
    central = archive.index(b"PK\x01\x02")
    archive[local + 22 : local + 26] = struct.pack("<I", declared)
    archive[central + 24 : central + 28] = struct.pack("<I", declared)
    return bytes(archive)


@pytest.mark.parametrize("where", ["flag", "bundle"])
def test_declared_size_beyond_deflate_ratio_is_refused_before_inflating(ws: Workspace, where: str) -> None:
    """A 1 KB deflated member that declares 4 GB: refused from the headers (today it is read as if nothing were wrong)."""
    data = lying_member(npy_bytes(make_inputs()["diff_dst"]), 0xF0000000)
    if where == "flag":
        args = [ws.bundle(), "--diff-dst", ws.write("dy.npz", data) + ":diff_dst"]
    else:
        args = [ws.write("b2.npz", data)]
    result = CliRunner().invoke(main, ["run", *args, "-o", str(ws.out / "grads.npz")])
    assert result.exit_code == 3 and re.search(r"declares 4026531840 bytes .*more than deflate can produce", error_line(result.stderr))
    assert list(ws.out.iterdir()) == []


@pytest.mark.parametrize("mode", ["bundle", "stdin"])
def test_declared_sizes_over_available_memory_fail_before_reading(ws: Workspace, monkeypatch, mode: str) -> None:
    from bnbwd_cli.files import common as files_read  # every reader asks common.memory_cap

    monkeypatch.setattr(files_read, "memory_cap", lambda: 1000 if mode == "bundle" else 5000)  # bundle: 1032 bytes
    if mode == "bundle":
        result = CliRunner().invoke(main, ["run", ws.bundle(), "-o", str(ws.out / "grads.npz")])
        pattern = r"bundle .*arrays declare \d+ bytes, more than the memory available"
    else:
        big = npy_bytes(np.zeros(2000, np.float32))
        result = CliRunner().invoke(main, ["run", ws.bundle(), "--mean", "-", "-o", str(ws.out / "grads.npz")], input=big)
        pattern = r"mean \(stdin\): header declares shape \(2000,\) float32 \(8000 bytes\), more than the memory available"
    assert result.exit_code == 3 and re.search(pattern, error_line(result.stderr)), result.stderr
    assert list(ws.out.iterdir()) == []


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


BOOL_SHAPE_NPY = npy_with_header({"descr": "<f4", "fortran_order": False, "shape": (True,)}, b"\0" * 4)


@pytest.mark.parametrize("where", ["npy", "npz-member"])
def test_non_integer_in_shape_tuple_is_an_input_error(ws: Workspace, where: str) -> None:
    """A bool in the shape tuple reached NumPy's reshape and gave exit 4 (internal error)."""
    if where == "npy":
        args = [ws.bundle(), "--mean", ws.write("mean.npy", BOOL_SHAPE_NPY)]
    else:
        args = [ws.bundle(), "--mean", ws.write("m.npz", npz_of({"mean.npy": BOOL_SHAPE_NPY})) + ":mean"]
    result = CliRunner().invoke(main, ["run", *args, "-o", str(ws.out / "grads.npz")])
    assert result.exit_code == 3, result.stderr
    assert re.search(r"mean .*not a valid \.npy file \(shape \(True,\) is not a tuple of integers\)", error_line(result.stderr))
    assert list(ws.out.iterdir()) == []


@pytest.mark.parametrize("value", ["", "   "], ids=["empty", "blank"])
@pytest.mark.parametrize("command", ["run", "verify"])
def test_empty_data_format_entry_is_an_error_not_absent(ws: Workspace, value: str, command: str) -> None:
    bundle = ws.bundle(data_format=np.array(value))
    if command == "run":
        result = CliRunner().invoke(main, ["run", bundle, "-o", str(ws.out / "grads.npz")])
    else:
        result = CliRunner().invoke(main, ["verify", bundle, bundle, "--inputs", bundle])
    assert result.exit_code == 3, result.stderr
    assert re.search(r"'data_format' is empty", error_line(result.stderr))
    assert list(ws.out.iterdir()) == []


@pytest.mark.parametrize("size", ["1", "100"])
def test_tiny_block_size_is_raised_to_the_minimum(ws: Workspace, size: str) -> None:
    """`--block-size 1` made one tile per element (minutes for a 2 MB problem); now it is raised to 64K."""
    import time

    arrays = make_inputs(shape=(4, 8, 32, 32))
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["run", "-q", ws.bundle(arrays), "--block-size", size, "-o", str(ws.out / "grads.npz")])
    assert result.exit_code == 0, result.stderr
    assert time.perf_counter() - started < 3
    with np.load(ws.out / "grads.npz") as written:
        expected = reference_backward(Op(*(arrays[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")),
                                      epsilon=EPSILON, data_format="NCX"))
        np.testing.assert_allclose(written["diff_beta"], expected["diff_beta"], rtol=1e-5)


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
