"""README's verify captures are the ones docs/examples/make_verify_report.py produces today."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_verify_captures_match_the_script(tmp_path):
    committed = (ROOT / "docs" / "verify-report.md").read_text()
    subprocess.run([sys.executable, "docs/examples/make_verify_report.py"], cwd=ROOT, check=True, capture_output=True)
    regenerated = (ROOT / "docs" / "verify-report.md").read_text()
    (ROOT / "docs" / "verify-report.md").write_text(committed)  # leave the tree as it was
    assert regenerated == committed, "docs/verify-report.md is stale: rerun docs/examples/make_verify_report.py"
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Comparing with your kernel"):readme.index("## Agreement with PyTorch")]
    blocks = re.findall(r"```text\n.*?```\n", section, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        assert block in committed, "a README capture differs from docs/verify-report.md"
