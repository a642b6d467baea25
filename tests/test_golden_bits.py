"""Golden bits: bnbwd's outputs for fixed problems hash to the committed values, under any NumPy version, thread
count, core and vector width (tests/golden.py builds the problems; fixtures/golden_bits.json holds the hashes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bnbwd_cli.core import plan
from tests.golden import DTYPES, PROBLEMS, all_hashes, load_golden

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_problem_and_dtype_has_golden_hashes():
    assert sorted(load_golden()) == sorted(f"{name}/{dtype}" for name in PROBLEMS for dtype in DTYPES)


@pytest.mark.parametrize("threads", [1, 2])
def test_numpy_core_gives_the_golden_bits(threads):
    assert all_hashes("numpy", threads=threads) == load_golden()


def test_another_reduction_order_misses_the_golden_bits(monkeypatch):
    # The hashes pin the order: float64 sums of full-significand values round differently in other chunks.
    monkeypatch.setattr(plan, "CHUNK_GROUPS", plan.CHUNK_GROUPS // 2)
    changed = all_hashes("numpy", dtypes=("f64",), problems=("ncx_planes", "nxc_rows"))
    golden = load_golden()
    assert all(changed[key]["diff_gamma"] != golden[key]["diff_gamma"] for key in changed)


@pytest.mark.numba
def test_numba_core_gives_the_golden_bits(numba_jit):
    assert all_hashes("numba", threads=2) == load_golden()


@pytest.mark.numba
def test_numba_core_for_a_generic_cpu_gives_the_golden_bits(tmp_path):
    """The kernels compiled for a baseline x86-64 (SSE2, no FMA, 2-wide vectors) give the host build's bits.

    A fresh cache directory: the generic build must not load the host's kernels (it compiles the two float64
    paths it runs, planes and rows, ~5-10 s). float64 is where a changed order shows most (tests above)."""
    pytest.importorskip("numba")
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)}
    problems = ("ncx_planes", "nxc_rows")
    answer = subprocess.run([sys.executable, "-m", "tests.golden", "numba", "f64", ",".join(problems)], env=env,
                            cwd=ROOT, capture_output=True, text=True, check=True, timeout=300)
    generic = json.loads(answer.stdout)
    assert generic["cpu_name"] == "generic"
    golden = load_golden()
    assert generic["hashes"] == {f"{name}/f64": golden[f"{name}/f64"] for name in problems}
