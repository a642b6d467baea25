"""An installed bnbwd holds every subpackage (tests import from the source tree and would not notice)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_every_module(tmp_path):
    tree = tmp_path / "tree"  # a clean copy: setuptools would reuse a stale build/ in the checkout
    # tools/ and bench/ are packages too (run with python -m), but for developers: they must stay out of the wheel
    for package in ("bnbwd_cli", "tools", "bench"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "-q", "-w", str(tmp_path)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("bnbwd-*.whl"))
    packed = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bnbwd_cli").rglob("*.py")}
    assert sources <= packed, f"missing from the wheel: {sorted(sources - packed)}"
    assert {name.split("/")[0] for name in packed if name.endswith(".py")} == {"bnbwd_cli"}
