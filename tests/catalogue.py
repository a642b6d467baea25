"""The catalogue of bad inputs: malformed, hostile and odd-but-valid inputs, each fed through the real CLI.

tests/test_bad_*.py hold the cases, one file per concern (.npy files, .npz archives, values that do not fit,
paths and options, stdin and stdout); this module holds what they share. Every case builds its files in tmp_path,
runs `bnbwd run`, and checks: the exit code (3 input error, 2 usage error, 0 for inputs that are odd but valid),
one `error: ...` line on stderr that names the problem, no traceback, and nothing left in the output directory
(no output, no `.*.tmp`) unless the run succeeded. Valid cases are checked against the float64 oracle.
"""

from __future__ import annotations

import io
import re
import struct
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

# NumPy warnings must not leak to the user: each test_bad_* module sets pytestmark = WARNINGS_ARE_ERRORS.
WARNINGS_ARE_ERRORS = [pytest.mark.filterwarnings("error::RuntimeWarning"), pytest.mark.filterwarnings("error::UserWarning")]

EPSILON = 1e-3
SHAPE = (2, 3, 4, 5)  # NCHW: C = 3


def make_inputs(shape=SHAPE, dtype=np.float32, stats_dtype=np.float32) -> dict[str, np.ndarray]:
    """The shared factory with the catalogue's fixed seed and default shape (the cases are built at import)."""
    return shared_inputs(np.random.default_rng(7), shape, dtype=dtype, stats_dtype=stats_dtype)


def npy_with_header(header: dict, data: bytes = b"", version=(1, 0)) -> bytes:
    """A .npy whose header says whatever the test wants, followed by `data`."""
    text = repr(header).encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    prefix = npy_format.magic(*version) + (struct.pack("<H", len(text)) if version == (1, 0) else struct.pack("<I", len(text)))
    return prefix + text + data


def npz_of(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    """A zip of the given members' bytes (any names: .npy members or not)."""
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


def lying_zip(member: str, data: bytes, claimed_size: int, compression=zipfile.ZIP_STORED) -> bytes:
    """A one-member zip whose local and central headers claim an uncompressed size it does not have."""
    raw = bytearray(npz_of({member: data}, compression))
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = raw.find(signature)
        raw[start + offset : start + offset + 4] = struct.pack("<I", claimed_size)
    return bytes(raw)


def object_npy() -> bytes:
    """A .npy of Python objects: reading it would unpickle."""
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


NONFINITE_WARNING = r"^warning: non-finite outputs .*NaN/Inf"


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


def assert_fails_cleanly(ws: Workspace, case: Case) -> None:
    """The case's exit code and error line, no traceback, nothing left in the output directory, inputs untouched."""
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


def assert_works(ws: Workspace, case: Case) -> None:
    """Exit 0, the case's one warning (or a silent stderr), and outputs that agree with the float64 oracle."""
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


def each_case(cases: list[Case]):
    """Parametrize a test by the cases, each under its own id."""
    return pytest.mark.parametrize("case", cases, ids=[case.id for case in cases])
