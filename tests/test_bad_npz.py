"""`.npz` archives that are not what they claim, through `bnbwd run`: damaged zips, members that lie about their
size, compression or contents, keys that are missing or ambiguous; members are vetted from their headers before
anything is inflated (tests/catalogue.py)."""

from __future__ import annotations

import re
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from bnbwd_cli.cli import main
from tests.catalogue import (
    Case, EPSILON, SRC_NPY, VALID_BUNDLE_BYTES, WARNINGS_ARE_ERRORS, Workspace, assert_fails_cleanly, each_case,
    encrypted_zip, huge_header, lying_zip, make_inputs, npz_of, object_npy, truncated, zip_with_method,
)
from tests.conftest import error_line, npy_bytes

pytestmark = WARNINGS_ARE_ERRORS

CASES = [
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
]


@each_case(CASES)
def test_bad_input_fails_cleanly(ws: Workspace, case: Case) -> None:
    assert_fails_cleanly(ws, case)


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
                    ["verify", outputs, outputs, "--inputs", bundle, "--format", "NCHW", "--only", "diff_beta"]):
        opened.clear()
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0 and re.search(r"^note: .*not used: junk$", result.stderr, re.M), result.output
        assert "junk.npy" not in opened, opened
    assert [p.name for p in ws.out.iterdir()] == ["grads.npz"]



@pytest.mark.parametrize("where", ["flag", "bundle"])
def test_declared_size_beyond_deflate_ratio_is_refused_before_inflating(ws: Workspace, where: str) -> None:
    """A 1 KB deflated member that declares 4 GB: refused from the headers, before anything is inflated."""
    data = lying_zip("diff_dst.npy", npy_bytes(make_inputs()["diff_dst"]), 0xF0000000, zipfile.ZIP_DEFLATED)
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

