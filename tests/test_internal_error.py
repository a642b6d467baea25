"""Exit 4: a bug in bnbwd is one `error: internal error` line, and the traceback only on request (issue 16)."""

from __future__ import annotations

import traceback

import pytest

from bnbwd_cli import core
from tests.conftest import assert_one_error, make_inputs, save_bundle


@pytest.fixture
def buggy_run(monkeypatch, rng, tmp_path):
    """`run` argv on a valid bundle, with core.backward replaced by one that fails as a bug would."""

    def broken_backward(*args, **kwargs):
        raise ValueError("a bug in the core")

    monkeypatch.setattr(core, "backward", broken_backward)
    bundle = save_bundle(tmp_path / "in.npz", make_inputs(rng, (2, 3, 4)), epsilon=1e-3, data_format="NCX")
    return ["run", bundle, "-q", "-o", tmp_path / "out.npz"]


def test_a_bug_is_exit_4_and_one_line(cli, buggy_run, tmp_path):
    result = cli(*buggy_run)
    assert_one_error(result, r"^error: internal error: ValueError: a bug in the core \(rerun with --traceback\)$", 4)
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_traceback_on_request_shows_the_bug(cli, buggy_run, monkeypatch, how):
    monkeypatch.delenv("BNBWD_TRACEBACK", raising=False)
    if how == "environment":
        monkeypatch.setenv("BNBWD_TRACEBACK", "1")
    result = cli(*(["--traceback"] if how == "flag" else []), *buggy_run)
    # The exception leaves the CLI (Python prints its traceback and exits 1), with the frame that raised it.
    assert isinstance(result.exception, ValueError) and result.exit_code == 1
    assert "internal error" not in result.stderr
    assert "broken_backward" in "".join(traceback.format_exception(*result.exc_info))
