"""Many cases, many cores, many machines: `check --jobs N` (worker processes) and `--shard K/N` give the unsharded,
single-process run's facts; and the pytest route (assert_backward_close under pytest-xdist) runs as docs/usage.md says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.app.check import find_cases, shard
from tests.conftest import make_inputs, save_bundle

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("src", "diff_dst", "mean", "variance", "gamma")


@pytest.fixture
def suite(rng, tmp_path) -> Path:
    """Seven cases: passing ones, one that fails, one that cannot be judged."""
    directory = tmp_path / "suite"
    directory.mkdir()
    for i in range(6):
        inputs = {k: v for k, v in make_inputs(rng, (2, 3, 4, 2 + i)).items() if k in NAMES}
        grads = bnbwd_cli.backward(**inputs, epsilon=1e-3, data_format="NCHW")
        if i == 2:
            grads["diff_gamma"] = grads["diff_gamma"] * np.float32(1.01)
        save_bundle(directory / f"case{i}.npz", inputs, epsilon=1e-3, data_format="NCHW")
        save_bundle(directory / f"case{i}.out.npz", grads)
    save_bundle(directory / "case9.npz", {"src": np.ones((2, 3), np.float32)})
    return directory


def untimed(document: dict) -> dict:
    """A check document less each case's seconds (the one fact that differs from run to run)."""
    assert all(case["seconds"] >= 0 for case in document["cases"])
    return {**document, "cases": [{k: v for k, v in case.items() if k != "seconds"} for case in document["cases"]]}


def test_jobs_give_the_same_lines_and_json(cli, suite, tmp_path):
    results = {}
    for jobs in (1, 3):
        target = tmp_path / f"jobs{jobs}.json"
        result = cli("check", suite, "--jobs", jobs, "-v", "--json", target)
        assert result.exit_code == 3, result.output
        results[jobs] = (result.stdout, untimed(json.loads(target.read_text())))
    assert results[1] == results[3]
    assert "FAIL  " in results[1][0] and "ERROR " in results[1][0] and results[1][0].count("Comparison: actual") == 6


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
def test_shards_are_disjoint_and_concatenated_are_the_unsharded_run(cli, suite, n):
    cases = find_cases([str(suite)])
    shards = [shard(cases, k, n) for k in range(1, n + 1)]
    assert sum(shards, ()) == cases and max(map(len, shards)) - min(map(len, shards)) <= 1
    whole = cli("check", suite, "--json", "-")
    lines, documents = [], []
    for k in range(1, n + 1):
        part = cli("check", suite, "--shard", f"{k}/{n}", "--jobs", 2, "--json", "-")
        documents.append(json.loads(part.stdout))
        lines += part.stderr.splitlines()[:-1]  # the case lines (--json -: on stderr), less the shard's summary
    assert lines == whole.stderr.splitlines()[:-1]
    assert [c for d in documents for c in untimed(d)["cases"]] == untimed(json.loads(whole.stdout))["cases"]
    assert max(d["exit_code"] for d in documents) == json.loads(whole.stdout)["exit_code"] == 3


@pytest.mark.parametrize("value", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_bad_shard_is_a_usage_error(cli, suite, value):
    result = cli("check", suite, "--shard", value)
    assert result.exit_code == 2 and "expected K/N with 1 <= K <= N" in result.stderr


def test_jobs_must_be_positive(cli, suite):
    assert cli("check", suite, "--jobs", 0).exit_code == 2


def test_parametrized_pytest_under_xdist_runs_as_the_usage_page_says():
    pytest.importorskip("xdist")
    usage = (ROOT / "docs" / "usage.md").read_text()
    command = re.search(r"python -m pytest -n auto (\S+)", usage)
    assert command, "docs/usage.md shows the pytest-xdist route"
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", command.group(1)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert re.search(r"\b8 passed\b", done.stdout), done.stdout[-500:]
