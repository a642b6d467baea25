"""Nothing is lost in silence (issue 35's round): a broken case entry is an ERROR, `cases -o` into an empty folder
keeps the folder, two runs into one --out-dir leave one run's set, the report's width is capped, and the API
leaves the process's warning filters as it found them, whatever its threads do."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np

import bnbwd_cli
from tests.conftest import make_inputs, save_npy_flags

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "fixtures" / "cases"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_broken_and_looping_case_links_are_errors_not_skipped(cli, tmp_path: Path) -> None:
    """`check DIR` skipped *.npz entries that were dangling or looping links: a broken suite passed green."""
    for suffix in (".npz", ".out.npz"):
        shutil.copyfile(CASES / f"bn1{suffix}", tmp_path / f"good{suffix}")
    (tmp_path / "broken.npz").symlink_to(tmp_path / "gone.npz")
    (tmp_path / "loop.npz").symlink_to(tmp_path / "loop.npz")
    result = cli("check", tmp_path)
    assert result.exit_code == 3, result.output
    lines = result.stdout.splitlines()  # in name order: broken, good, loop
    assert lines[0].startswith(f"ERROR {tmp_path / 'broken.npz'}: ") and lines[1].startswith("PASS  ")
    assert lines[2].startswith(f"ERROR {tmp_path / 'loop.npz'}: ") and "3 case(s), 2 could not be judged" in lines[3]


def test_cases_into_an_empty_directory_writes_in_place(cli, tmp_path: Path) -> None:
    """The empty directory was replaced by a new one: its mode was lost, and a shell standing in it saw nothing."""
    suite = tmp_path / "suite"
    suite.mkdir()
    suite.chmod(0o750)
    inode = suite.stat().st_ino
    result = cli("cases", "-o", suite, "--preset", "tiny", "--max-bytes", "64K")
    assert result.exit_code == 0, result.output
    assert suite.stat().st_ino == inode and stat.S_IMODE(suite.stat().st_mode) == 0o750
    names = sorted(p.name for p in suite.iterdir())
    assert "manifest.txt" in names and any(name.endswith(".npz") for name in names)
    assert not [name for name in names if name.startswith(".")]  # no temp folder left


# The first run says when its first output is in place and then takes its time; the second renames its own set
# right after that: without a lock the folder ends with the second run's first output and the first run's others.
INTERLEAVED_RENAMES = """
import contextlib, sys, time
from pathlib import Path
from bnbwd_cli.files import commit, swap
role, marker = sys.argv[1], Path(sys.argv[2])
real_replace, real_deferred = swap.replace, commit.signals_deferred
def replace(*args, **kwargs):
    real_replace(*args, **kwargs)
    if role == "first":
        marker.touch()
        time.sleep(0.5)
@contextlib.contextmanager
def deferred(*args, **kwargs):  # the set's renames: the second run's start once the first run's have begun
    while role == "second" and not marker.exists():
        time.sleep(0.01)
    with real_deferred(*args, **kwargs):
        yield
swap.replace, commit.signals_deferred = replace, deferred
from bnbwd_cli.cli import main
main(sys.argv[3:], prog_name="bnbwd")
"""


def test_two_runs_into_one_out_dir_leave_one_runs_set(tmp_path: Path, rng) -> None:
    marker, runs, expected = tmp_path / "first-renamed", {}, {}
    for role in ("first", "second"):
        (tmp_path / role).mkdir()
        flags = save_npy_flags(tmp_path / role, make_inputs(rng, (2, 3, 4, 4)))
        runs[role] = ["run", *flags, "--epsilon", "1e-3", "--format", "NCHW", "-q", "--out-dir"]
        own = tmp_path / f"own_{role}"
        assert subprocess.run([sys.executable, "-m", "bnbwd_cli", *runs[role], str(own)], env=ENV,
                              timeout=60).returncode == 0
        expected[role] = {p.name: p.read_bytes() for p in own.iterdir()}
    processes = [subprocess.Popen([sys.executable, "-c", INTERLEAVED_RENAMES, role, str(marker), *runs[role],
                                   str(tmp_path / "out")], env=ENV) for role in ("first", "second")]
    assert [p.wait(timeout=60) for p in processes] == [0, 0]
    written = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert written in (expected["first"], expected["second"]), "a mix of two runs' outputs"


def test_a_huge_columns_caps_the_report_width(tmp_path: Path) -> None:
    """COLUMNS=1000000 made -v output 9 MB (every rule padded to it); 1e8 did not finish."""
    names = ["--map", "dy=diff_dst", "--map", "var=variance", "--map", "dx=diff_src", "--map", "dgamma=diff_gamma",
             "--map", "dbeta=diff_beta"]
    widths = {}
    for columns in ("200", "100000000"):
        result = subprocess.run([sys.executable, "-m", "bnbwd_cli", "check", str(ROOT / "fixtures" /
                                 "example_case_bad.npz"), "-v", *names], capture_output=True, text=True, timeout=60,
                                env={**ENV, "COLUMNS": columns})
        assert result.returncode == 1, result.stderr
        widths[columns] = (len(result.stdout), max(len(line) for line in result.stdout.splitlines() if "─" in line))
    assert widths["100000000"] == widths["200"] and widths["200"][1] <= 200  # the rules: 200 columns at most


def test_two_threads_calling_the_api_leave_the_warning_filters_as_they_were(monkeypatch) -> None:
    """A's call starts, B's starts, A's ends, B's ends: with warnings.catch_warnings B restored the filters A had
    installed, and the process kept ignoring RuntimeWarning."""
    from bnbwd_cli import api

    inputs = make_inputs(np.random.default_rng(1), (2, 3, 4))
    real = api.app_judge.reference_outputs
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def interleaved(*args, **kwargs):
        if threading.current_thread().name == "A":
            a_in.set()
            assert b_in.wait(30)
        else:
            b_in.set()
            assert a_out.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(api.app_judge, "reference_outputs", interleaved)
    results = {}

    def call(name: str) -> None:
        results[name] = bnbwd_cli.backward(**{k: inputs[k] for k in ("src", "diff_dst", "mean", "variance")},
                                           epsilon=1e-3, data_format="NCX")
        if name == "A":
            a_out.set()

    with warnings.catch_warnings():  # this test's own view of the filters, restored after it
        before = list(warnings.filters)
        threads = [threading.Thread(target=call, args=(name,), name=name) for name in ("A", "B")]
        threads[0].start()
        assert a_in.wait(30)
        threads[1].start()
        for thread in threads:
            thread.join(60)
        assert list(warnings.filters) == before
    assert np.array_equal(results["A"]["diff_src"], results["B"]["diff_src"])
