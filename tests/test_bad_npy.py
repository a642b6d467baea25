"""`.npy` files that are not what they claim, through `bnbwd run` (whole reads and --stream's mapped reads), and
.npy files that are odd but valid (Fortran order, big-endian, bfloat16 stored as raw V2): see tests/catalogue.py."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main
from tests.catalogue import (
    Case, SHAPE, SRC_NPY, WARNINGS_ARE_ERRORS, Workspace, assert_fails_cleanly, assert_works, each_case, flag_with,
    huge_header, make_inputs, npy_with_header, npz_of, object_npy, reorder, truncated,
)
from tests.conftest import error_line, npy_bytes

pytestmark = WARNINGS_ARE_ERRORS

CASES = [
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
    Case("stream-truncated-src", lambda ws: [*flag_with("src", lambda w: truncated(SRC_NPY, 0.6))(ws), "--stream"], 3,
         r"src .*(truncated|header declares shape)"),
    Case("stream-huge-shape", lambda ws: [*flag_with("diff_dst", lambda w: huge_header((10**6, 10**6, 3, 3)))(ws), "--stream"], 3,
         r"diff_dst .*declares shape \(1000000, 1000000, 3, 3\)"),
    Case("stream-pickled-src", lambda ws: [*flag_with("src", lambda w: object_npy())(ws), "--stream"], 3, r"src .*Python objects"),
]

VALID_CASES = [
    Case("fortran-ordered", lambda ws: ws.flags(reorder(make_inputs(), np.asfortranarray)), 0, ""),
    Case("fortran-ordered-in-bundle", lambda ws: [ws.bundle(reorder(make_inputs(), np.asfortranarray))], 0, ""),
    Case("big-endian", lambda ws: ws.flags({k: v.astype(v.dtype.newbyteorder(">")) for k, v in make_inputs().items()}), 0, ""),
    Case("big-endian-f64-bundle", lambda ws: [ws.bundle({k: v.astype(">f8") for k, v in make_inputs().items()})], 0, ""),
    Case("bfloat16-as-void", lambda ws: [ws.bundle(make_inputs(dtype=ml_dtypes.bfloat16, stats_dtype=np.float32))], 0, ""),
    Case("stream-fortran-ordered", lambda ws: [*ws.flags(reorder(make_inputs(), np.asfortranarray)), "--stream"], 0, ""),
    Case("stream-big-endian", lambda ws: [*ws.flags({k: v.astype(">f4") for k, v in make_inputs().items()}), "--stream"], 0, ""),
]


@each_case(CASES)
def test_bad_input_fails_cleanly(ws: Workspace, case: Case) -> None:
    assert_fails_cleanly(ws, case)


@each_case(VALID_CASES)
def test_odd_but_valid_input_works(ws: Workspace, case: Case) -> None:
    assert_works(ws, case)


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

