"""README's captures are what the commands print today, and every `bnbwd` command in README runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bnbwd_cli.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_readme_verify_captures_match_the_script(tmp_path):
    """The report is regenerated in a temporary copy of the paths it names (--into): the checkout is never written,
    even when the run fails half way."""
    committed = (ROOT / "docs" / "verify-report.md").read_text()
    before = {path: path.stat().st_mtime_ns for path in (ROOT / "docs").rglob("*") if path.is_file()}
    subprocess.run([sys.executable, "docs/examples/make_verify_report.py", "--into", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    regenerated = (tmp_path / "docs" / "verify-report.md").read_text()
    assert regenerated == committed, "docs/verify-report.md is stale: rerun docs/examples/make_verify_report.py"
    assert {path: path.stat().st_mtime_ns for path in (ROOT / "docs").rglob("*") if path.is_file()} == before
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Comparing with your kernel"):readme.index("## In pytest")]
    blocks = re.findall(r"```text\n.*?```\n", section, flags=re.S)
    assert len(blocks) >= 1
    for block in blocks:
        assert block in committed, "a README capture differs from docs/verify-report.md"


# --------------------------------------------------------------------------- every README command runs

BLOCK = re.compile(r"^```(?:bash|sh|console)\n(.*?)^```", re.S | re.M)
EXIT = re.compile(r"\s#\s*exit (\d+)\b")


def readme_commands(text: str) -> list[tuple[str, int]]:
    """(command, documented exit code) for each `bnbwd ...` / `$ bnbwd ...` line of a bash/sh/console block,
    continuation lines joined; `# exit N` after a command documents a non-zero exit code."""
    commands = []
    for block in BLOCK.finditer(text):
        for line in block.group(1).replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line.startswith("bnbwd "):
                continue
            documented = EXIT.search(line)
            commands.append((re.sub(r"\s+#.*$", "", line), int(documented.group(1)) if documented else 0))
    return commands


def _files_the_examples_name(work: Path) -> None:
    """The files README's "Using it" examples name besides fixtures/ (its bundle.npz, x.npy, ...), made from
    fixtures/example.npz: those examples stand for the reader's own files."""
    import numpy as np

    import bnbwd_cli

    example = dict(np.load(work / "fixtures" / "example.npz"))
    (work / "bundle.npz").write_bytes((work / "fixtures" / "example.npz").read_bytes())
    for name, key in (("x", "src"), ("dy", "diff_dst"), ("g", "gamma"), ("big_x", "src"), ("big_dy", "diff_dst"),
                      ("m", "mean"), ("v", "variance")):
        np.save(work / f"{name}.npy", example[key])
    np.savez(work / "stats.npz", mean=example["mean"], var=example["variance"])
    nhwc = {key: example[key].transpose(0, 2, 3, 1) for key in ("src", "diff_dst")}
    np.savez(work / "tf_case.npz", x=nhwc["src"], y_backprop=nhwc["diff_dst"], reserve_space_1=example["mean"],
             reserve_space_2=example["variance"], scale=example["gamma"])
    grads = bnbwd_cli.backward(example["src"], example["diff_dst"], example["mean"], example["variance"],
                               example["gamma"], epsilon=float(example["epsilon"]), data_format="NCHW")
    np.savez(work / "my_kernel_out.npz", x_backprop=grads["diff_src"], diff_gamma=grads["diff_gamma"],
             diff_beta=grads["diff_beta"])


def _run(command: str, work: Path) -> tuple[int, str, str]:
    """A README command: in-process when it is one plain command (fast), through bash when it uses the shell
    (pipes, globs, redirections); either way `bnbwd` is this checkout's CLI, not an installed script."""
    if not re.search(r"[|<>;&*?$`]", command):
        result = CliRunner().invoke(main, shlex.split(command)[1:], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr
    script = f'bnbwd() {{ "{sys.executable}" -m bnbwd_cli "$@"; }}\n{command}'
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run(["bash", "-c", script], cwd=work, env=environment, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_every_readme_command_runs_with_its_documented_exit_code(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    commands = readme_commands(readme)
    assert len(commands) >= 6 and any(c.startswith("bnbwd check ") and code == 1 for c, code in commands)
    shutil.copytree(ROOT / "fixtures", tmp_path / "fixtures")
    _files_the_examples_name(tmp_path)
    monkeypatch.chdir(tmp_path)
    outputs = {}
    for command, expected in commands:
        code, stdout, stderr = _run(command, tmp_path)
        assert code == expected, f"{command}\nexit {code}, documented {expected}\n{stderr}"
        outputs[command] = stdout
    section = readme[readme.index("## Many cases at once"):readme.index("## Test suites for your kernel")]
    capture = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    failing = next(c for c, code in commands if c.startswith("bnbwd check ") and code == 1)
    assert outputs[failing] == capture, "README's `bnbwd check` capture differs from what the command prints"
    assert json.loads((tmp_path / "check.json").read_text())["exit_code"] == 1


def test_readme_python_example_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## In pytest"):readme.index("## Many cases at once")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shutil.copytree(ROOT / "fixtures", tmp_path / "fixtures")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # our own README
    namespace["test_my_kernel"]()


def test_readme_command_extraction():
    text = "```bash\n# comment\nbnbwd run a.npz \\\n    -o b.npz  # writes b\npip install x\n```\n" \
           "```console\n$ bnbwd verify a b  # exit 1\n```\n```text\nbnbwd run not-this\n```\n"
    assert readme_commands(text) == [("bnbwd run a.npz      -o b.npz", 0), ("bnbwd verify a b", 1)]


def test_guarantees_catalogue_holds_more_than_100_bad_inputs():
    """docs/guarantees.md: the tests/test_bad_*.py files feed more than 100 bad or odd inputs, each case its own id."""
    import importlib

    cases = []
    for path in sorted((ROOT / "tests").glob("test_bad_*.py")):
        module = importlib.import_module(f"tests.{path.stem}")
        cases += [*module.CASES, *getattr(module, "VALID_CASES", [])]
    assert "more than 100 malformed" in (ROOT / "docs" / "guarantees.md").read_text()
    assert len(cases) > 100
    assert len({case.id for case in cases}) == len(cases)
