"""The memory caps on what stdin and pipes hold, at their limit and one byte past (the file guards are tested so
in test_guard_edges.py): a stream has no size to check first, so a .npy's declared data and a spooled archive's
bytes are each held to the memory available (files/common.memory_cap)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from bnbwd_cli.files import common
from tests.conftest import assert_one_error, make_inputs, save_bundle, save_npy_flags

FLAGS = ("--epsilon", "1e-5", "--format", "NCHW", "-q")


@pytest.fixture
def inputs(rng, tmp_path: Path) -> dict[str, np.ndarray]:
    return make_inputs(rng, (2, 3, 4, 4), "NCX")


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_a_npy_on_stdin_declaring_the_memory_cap_is_read_one_byte_more_is_refused(cli, inputs, tmp_path, monkeypatch):
    flags = save_npy_flags(tmp_path, inputs, names=("diff_dst", "mean", "variance", "gamma"))
    src = _npy_bytes(inputs["src"])
    monkeypatch.setattr(common, "memory_cap", lambda: inputs["src"].nbytes)
    at_cap = cli("run", "--src", "-", *flags, *FLAGS, "-o", tmp_path / "a.npz", input=src)
    assert at_cap.exit_code == 0, at_cap.output
    monkeypatch.setattr(common, "memory_cap", lambda: inputs["src"].nbytes - 1)
    assert_one_error(cli("run", "--src", "-", *flags, *FLAGS, "-o", tmp_path / "b.npz", input=src),
                     rf"src \(stdin\): header declares shape \(2, 3, 4, 4\) float32 \({inputs['src'].nbytes} bytes\), "
                     "more than the memory available")
    assert not (tmp_path / "b.npz").exists()


def test_an_archive_on_stdin_as_large_as_the_memory_cap_is_read_one_byte_more_is_refused(cli, inputs, tmp_path,
                                                                                         monkeypatch):
    archive = Path(save_bundle(tmp_path / "bundle.npz", inputs)).read_bytes()
    monkeypatch.setattr(common, "memory_cap", lambda: len(archive))
    at_cap = cli("run", "-", *FLAGS, "-o", tmp_path / "a.npz", input=archive)
    assert at_cap.exit_code == 0, at_cap.output
    monkeypatch.setattr(common, "memory_cap", lambda: len(archive) - 1)
    assert_one_error(cli("run", "-", *FLAGS, "-o", tmp_path / "b.npz", input=archive),
                     rf"\(stdin\): more than {len(archive) - 1} bytes \(the memory available\); refusing to read further")
    assert not (tmp_path / "b.npz").exists()
