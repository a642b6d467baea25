"""Fuzzing the readers and the CLI with mutated .npy/.npz bytes (hypothesis, bounded time).

The only acceptable outcomes: the array NumPy itself would read (bit for bit), or a BnbwdError;
through the CLI, exit 0 with the right answer or a clean exit 3, and never a stray file.
"""

from __future__ import annotations

import io
import re
import struct
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bnbwd_cli.cli import main
from bnbwd_cli.errors import BnbwdError
from tests.conftest import INPUT_NAMES, make_inputs, npy_bytes
from tests.oracle import backward_arrays
from bnbwd_cli.files.read import read_array, read_bundle

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # mutated floats overflow in the comparisons

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def npz_bytes(arrays: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


RNG = np.random.default_rng(11)
SEEDS_NPY = [
    npy_bytes(RNG.normal(size=(2, 3, 4)).astype(np.float32)),
    npy_bytes(np.asfortranarray(RNG.normal(size=(3, 5)))),
    npy_bytes(RNG.normal(size=(4, 3)).astype(">f4")),
    npy_bytes(RNG.normal(size=(2, 6)).astype(ml_dtypes.bfloat16)),  # stored as |V2
    npy_bytes(RNG.normal(size=(5,)).astype(np.float16)),
]
SHAPE = (2, 3, 2, 2)
BUNDLE_ARRAYS = {k: v for k, v in make_inputs(RNG, SHAPE).items() if k in INPUT_NAMES}
BUNDLE_ARRAYS |= {"epsilon": np.array(1e-3), "data_format": np.array("NCHW")}
SEEDS_NPZ = [npz_bytes(BUNDLE_ARRAYS), npz_bytes(BUNDLE_ARRAYS, compressed=True)]


@st.composite
def mutated(draw, seeds: list[bytes]) -> bytes:
    """A seed with 1-4 edits; positions favour the first 160 bytes, where the headers are."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        position = draw(st.one_of(st.integers(0, min(159, len(data) - 1)), st.integers(0, len(data) - 1)))
        edit = draw(st.sampled_from(["flip", "byte", "text", "truncate", "insert", "delete"]))
        if edit == "flip":
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif edit == "byte":
            data[position] = draw(st.integers(0, 255))
        elif edit == "text":  # header-like tokens: digits, quotes, brackets, dtype letters
            token = draw(st.text("0123456789-,()'<>|fiuVOcbUSMm:{} ", min_size=1, max_size=6)).encode()
            data[position : position + len(token)] = token
        elif edit == "truncate":
            del data[position:]
        elif edit == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[position : position + draw(st.integers(1, 8))]
    return bytes(data)


def numpy_reads(data: bytes, keys=None):
    """What NumPy's own loader makes of the bytes (None if it refuses); for an .npz, the members `keys`.

    bnbwd reads only the `*.npy` members of an archive (a member with a mangled name is simply
    absent), so an .npz is compared on the keys bnbwd returned.
    """
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return {key: loaded[key] for key in (loaded.files if keys is None else keys)}
        return loaded
    except Exception:  # any refusal by NumPy is fine here
        return None


def same_bits(ours: np.ndarray, theirs: np.ndarray) -> bool:
    if theirs.dtype.kind == "V" and theirs.dtype.itemsize == 2 and theirs.dtype.names is None:
        theirs = theirs.view(ml_dtypes.bfloat16)
    theirs = theirs.astype(theirs.dtype.newbyteorder("="))
    return ours.shape == theirs.shape and ours.dtype == theirs.dtype and ours.tobytes() == np.ascontiguousarray(theirs).tobytes()


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


@FUZZ
@given(data=mutated(SEEDS_NPY))
def test_mutated_npy_reads_like_numpy_or_fails_cleanly(scratch: Path, data: bytes) -> None:
    path = scratch / "x.npy"
    path.write_bytes(data)
    try:
        ours = read_array(str(path), "src")
    except BnbwdError as error:
        assert "\n" not in error.format_message()
        return
    theirs = numpy_reads(data)
    assert isinstance(theirs, np.ndarray), "bnbwd read bytes that NumPy refuses"
    assert same_bits(ours, theirs)


@FUZZ
@given(data=mutated(SEEDS_NPZ))
def test_mutated_npz_reads_like_numpy_or_fails_cleanly(scratch: Path, data: bytes) -> None:
    path = scratch / "x.npz"
    path.write_bytes(data)
    try:
        ours = read_bundle(str(path))
    except BnbwdError as error:
        assert "\n" not in error.format_message()
        return
    theirs = numpy_reads(data, keys=list(ours))
    assert isinstance(theirs, dict), "bnbwd read an archive NumPy refuses"
    for key, array in ours.items():
        assert same_bits(array, theirs[key]), key


DESCRS = ["<f4", ">f8", "<f2", "|V2", "|V0", "<i4", "|b1", "<c8", "|O", "<U3", "|S0", "<M8[s]", "|u1", "<f16", "[('a', '<f4')]"]


@FUZZ
@given(
    descr=st.sampled_from(DESCRS),
    shape=st.lists(st.one_of(st.integers(-2, 6), st.integers(2**31, 2**64)), max_size=4).map(tuple),
    fortran=st.booleans(),
    extra=st.integers(-40, 40),
    version=st.sampled_from([(1, 0), (2, 0), (3, 0)]),
)
def test_generated_headers_never_crash(scratch: Path, descr, shape, fortran, extra, version) -> None:
    """Any header NumPy's parser accepts: a correct array or a clean error, never a huge allocation."""
    header = f"{{'descr': {descr if descr.startswith('[') else repr(descr)}, 'fortran_order': {fortran}, 'shape': {shape!r}, }}"
    text = header.encode("latin1")
    prefix_len = 10 if version == (1, 0) else 12
    text += b" " * (-(len(text) + 1 + prefix_len) % 64) + b"\n"
    length = struct.pack("<H", len(text)) if version == (1, 0) else struct.pack("<I", len(text))
    data = b"\x93NUMPY" + bytes(version) + length + text + bytes(RNG.integers(0, 256, size=max(48 + extra, 0), dtype=np.uint8))
    path = scratch / "h.npy"
    path.write_bytes(data)
    try:
        ours = read_array(str(path), "src")
    except BnbwdError:
        return
    theirs = numpy_reads(data)
    assert isinstance(theirs, np.ndarray) and same_bits(ours, theirs)


def expected_outputs(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The answer for the arrays NumPy reads from a mutated bundle that still makes a valid run."""
    try:
        result = backward_arrays(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"], arrays["gamma"],
                                    epsilon=float(arrays["epsilon"]), data_format="NCX")
    except Exception:
        return None
    return {"diff_src": result.diff_src, "diff_gamma": result.diff_gamma, "diff_beta": result.diff_beta}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(data=mutated(SEEDS_NPZ))
def test_cli_on_mutated_bundles_gives_right_answer_or_exit_3(scratch: Path, data: bytes) -> None:
    bundle, out = scratch / "bundle.npz", scratch / "out"
    bundle.write_bytes(data)
    out.mkdir(exist_ok=True)
    for stale in out.iterdir():
        stale.unlink()
    result = CliRunner().invoke(main, ["run", "-q", str(bundle), "-o", str(out / "g.npz")], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output + result.stderr
    assert result.exit_code in (0, 3), result.stderr  # a mangled name can drop the bundle's epsilon: exit 3 too
    if result.exit_code == 3:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and re.match(r"error: \S", lines[0]), result.stderr
        assert list(out.iterdir()) == []
        return
    assert [p.name for p in out.iterdir()] == ["g.npz"]
    theirs = numpy_reads(data, keys=[key for key in BUNDLE_ARRAYS if key != "epsilon"] + ["epsilon"])
    assert isinstance(theirs, dict), "bnbwd ran on an archive NumPy refuses"
    expected = expected_outputs({k: v.astype(v.dtype.newbyteorder("=")) for k, v in theirs.items()})
    assert expected is not None
    with np.load(out / "g.npz") as written:
        for name, array in expected.items():
            assert written[name].tobytes() == array.tobytes(), name
