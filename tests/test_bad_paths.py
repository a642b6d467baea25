"""Paths and options of `bnbwd run` that cannot work: inputs missing or directories, outputs that would clobber an
input or land nowhere, options given together or out of range (tests/catalogue.py)."""

from __future__ import annotations


import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main
from bnbwd_cli.core import Op
from bnbwd_cli.core.reference import reference_backward
from tests.catalogue import (
    Case, EPSILON, WARNINGS_ARE_ERRORS, Workspace, assert_fails_cleanly, each_case, json_is_input, make_inputs,
    out_dir_overwrites_input, output_is_input, output_is_input_via_symlink,
)

pytestmark = WARNINGS_ARE_ERRORS

CASES = [
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
    Case("stream-out-dir-under-a-file", lambda ws: [*ws.flags(), "--stream", "--out-dir", ws.bundle() + "/grads"], 3,
         r"output directory .*bundle\.npz/grads: cannot create it"),
]


@each_case(CASES)
def test_bad_input_fails_cleanly(ws: Workspace, case: Case) -> None:
    assert_fails_cleanly(ws, case)


@pytest.mark.parametrize("size", ["1", "100"])
def test_tiny_block_size_is_raised_to_the_minimum(ws: Workspace, size: str) -> None:
    """`--block-size 1` would make one tile per element (minutes for a 2 MB problem), so it is raised to 64K."""
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

