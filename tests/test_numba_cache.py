"""The numba core's on-disk cache: in a user cache directory, valid across a reinstall of the same version."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from bnbwd_cli import runtime

ROOT = Path(__file__).resolve().parent.parent
# One small NCX problem with >= 2 channels a thread: only the fused plane kernel compiles (float64: one signature).
SCRIPT = """
import numpy as np
from bnbwd_cli.core import Op, Settings, backward
src = np.arange(2 * 4 * 64, dtype=np.float64).reshape(2, 4, 64)
op = Op(src, src[::-1].copy(), np.zeros(4), np.ones(4), epsilon=1e-5, data_format="NCX")
result = backward(op, Settings(core="numba", threads=1))
assert result.core == "numba"
from bnbwd_cli.core import numba_kernels  # imported by backward, which set the cache directory first
helpers = (numba_kernels._channel_partials, numba_kernels._plane_partial, numba_kernels._write_plane)
print(sum(numba_kernels.planes_fused.stats.cache_hits.values()), *(len(h.signatures) for h in helpers))
"""


def _install(site: Path) -> None:
    """A fresh copy of the package, as a reinstall leaves it: same bytes, new files, new mtimes."""
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(ROOT / "bnbwd_cli", site / "bnbwd_cli", ignore=shutil.ignore_patterns("__pycache__"))


def _run(site: Path, cache_home: Path, before: str = "") -> tuple[int, ...]:
    """(cache hits of the fused kernel, compiled versions of each helper it calls); `before` runs first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(XDG_CACHE_HOME=str(cache_home), PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", before + SCRIPT], env=env, cwd=site, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return tuple(int(word) for word in done.stdout.split())


def test_cache_dir_is_keyed_by_versions_and_respects_the_user(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = runtime.numba_cache_dir()
    assert path.parent == tmp_path / "bnbwd" and "numba-" in path.name
    from bnbwd_cli import __version__

    assert __version__ in path.name


def test_compiled_kernels_survive_a_reinstall(tmp_path):
    """Compiled once into the user cache, loaded from there after a reinstall. The first process imports numba
    before bnbwd (as a user's own numba code, or a test module, would): numba reads NUMBA_CACHE_DIR when it is
    imported, and without runtime.load_numba_core's reload the kernels went beside the installed source, lost at
    every reinstall."""
    site, cache_home = tmp_path / "site", tmp_path / "cache"
    _install(site)
    # Compiled, and written to the user cache; each helper once: its callers pass it the same types (a prange
    # index as int64, no literal ints in tuples), else numba compiles a version per type tuple.
    assert _run(site, cache_home, before="import numba\n") == (0, 1, 1, 1)
    assert list((cache_home / "bnbwd").rglob("*.nbi")), "no index in the user cache directory"
    assert not list((site / "bnbwd_cli").rglob("*.nbi")), "cached beside the source"
    _install(site)  # reinstall: the package's own __pycache__ is gone
    hits, *helpers = _run(site, cache_home)
    assert hits > 0 and helpers == [0, 0, 0]  # loaded from the cache, helpers included: nothing compiled again


def test_an_edit_to_plan_starts_a_fresh_cache(monkeypatch, tmp_path):
    """numba checks only numba_kernels.py's own stamp; plan.py's arithmetic is compiled in too, so its bytes
    are part of the directory's name: an edit there must not load kernels compiled from the old plan.py."""
    package = tmp_path / "core"
    package.mkdir()
    for name in runtime.NUMBA_SOURCES:
        (package / name).write_bytes((Path(runtime.__file__).parent / "core" / name).read_bytes())
    monkeypatch.setattr(runtime, "__file__", str(tmp_path / "runtime.py"))
    before = runtime.numba_cache_dir()
    with open(package / "plan.py", "a") as plan_file:
        plan_file.write("\n# an edit\n")
    assert runtime.numba_cache_dir() != before
