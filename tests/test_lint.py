"""Lint is part of the suite: `python -m pytest` runs ruff with the rules in pyproject.toml ([tool.ruff])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["bnbwd_cli", "tests", "tools", "bench"]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *CHECKED],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reads_the_project_rules():
    """The check above means something: an undefined name is a finding under the project's config."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", "bnbwd_cli/probe.py",
                           "-"], cwd=ROOT, input="def f():\n    return undefined_name\n", capture_output=True, text=True)
    assert done.returncode == 1 and "F821" in done.stdout, done.stdout + done.stderr
