"""app/check.py: which files a command line's cases are, the shards of a suite, and a case that cannot be read
(an outcome with one error naming it, never an exception)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bnbwd_cli.app.check import Case, CaseRequest, find_cases, judge_file, shard
from bnbwd_cli.app.inputs import OpSettings
from bnbwd_cli.judge.tolerance import Judging
from bnbwd_cli.status import Status


@pytest.mark.parametrize("count", [0, 1, 7, 10])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_shards_are_contiguous_disjoint_and_together_the_whole_list(count, n):
    cases = tuple(Case(f"c{i}.npz") for i in range(count))
    shards = [shard(cases, k, n) for k in range(1, n + 1)]
    assert sum(shards, ()) == cases
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_a_directory_means_its_archives_and_name_out_npz_is_names_outputs(tmp_path: Path):
    for name in ("b.npz", "a.npz", "a.out.npz", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    found = find_cases([str(tmp_path)])
    assert found == (Case(str(tmp_path / "a.npz"), str(tmp_path / "a.out.npz")), Case(str(tmp_path / "b.npz")))


def test_a_shell_glob_naming_both_files_of_a_case_gives_it_once(tmp_path: Path):
    (tmp_path / "a.npz").write_bytes(b"")
    (tmp_path / "a.out.npz").write_bytes(b"")
    found = find_cases([str(tmp_path / "a.npz"), str(tmp_path / "a.out.npz"), str(tmp_path / "missing.npz")])
    assert found == (Case(str(tmp_path / "a.npz"), str(tmp_path / "a.out.npz")), Case(str(tmp_path / "missing.npz")))


def test_a_case_that_cannot_be_read_is_an_error_outcome_that_starts_with_its_name(tmp_path: Path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an archive")
    outcome = judge_file(str(bad), CaseRequest(OpSettings(), Judging()))
    assert outcome.status == Status.ERROR and outcome.result is None
    assert outcome.error.startswith(f"{bad}: ") and not outcome.error.startswith(f"{bad}: {bad}")
    assert "not a valid .npy file" in outcome.error


def test_a_case_holding_a_key_in_both_of_its_files_is_an_error(tmp_path: Path, rng):
    np.savez(tmp_path / "a.npz", src=np.zeros(3), diff_src=np.zeros(3))
    np.savez(tmp_path / "a.out.npz", diff_src=np.zeros(3))
    outcome = judge_file(find_cases([str(tmp_path / "a.npz")])[0], CaseRequest(OpSettings(), Judging()))
    assert outcome.status == Status.ERROR and "'diff_src' is in both" in outcome.error
