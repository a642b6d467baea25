"""The repository stands alone: no file of the project cites a file outside it (the design notes and specs the
project was started from are not shipped; what a maintainer needs of them is in docs/choices.md and
docs/architecture.md), and every relative link in its Markdown leads to a file inside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".rst", ".yml", ".yaml"}
# Spelled in pieces so that this file does not cite them itself (nor trip a search for them).
NOTES_FILE = "DESI" + "GN.md"
SHARED = "../sha" + "red"
OUTSIDE = [re.escape(name) for name in (NOTES_FILE, "STY" + "LE.md", SHARED, "/work/sha" + "red")]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def project_files() -> list[Path]:
    """The project's text files: everything but hidden directories (.git, caches) and build leftovers."""
    return sorted(path for path in ROOT.rglob("*") if path.is_file() and path.suffix in TEXT_SUFFIXES
                  and not any(part.startswith(".") or part in ("__pycache__", "build", "dist") or part.endswith(".egg-info")
                              for part in path.relative_to(ROOT).parts[:-1]))


def citations_outside(text: str) -> list[str]:
    return [match.group(0) for pattern in OUTSIDE for match in re.finditer(pattern, text)]


def test_no_file_cites_a_file_outside_the_repository():
    files = project_files()
    assert len(files) > 100 and ROOT / "docs" / "choices.md" in files  # the walk sees the project
    cited = {str(path.relative_to(ROOT)): found for path in files
             if (found := citations_outside(path.read_text(encoding="utf-8", errors="replace")))}
    assert not cited, cited


def test_the_check_sees_a_citation():
    assert citations_outside(f"the formula in {NOTES_FILE} section 3") == [NOTES_FILE]
    assert citations_outside(f"see {SHARED}/specs/x.rst") == [SHARED]
    assert citations_outside("see docs/choices.md") == []


def test_every_relative_markdown_link_leads_into_the_repository():
    broken = []
    for path in project_files():
        if path.suffix != ".md":
            continue
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, broken
