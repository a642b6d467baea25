"""The developer tools (tools/) run where neither torch nor TensorFlow is installed, each in a few seconds:
the fixture check against the manifest's hashes, the calibrations on small grids, the diagnosis self-check,
and the example cases, whose regeneration must give the committed bytes."""

from __future__ import annotations

import json
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tools
from tools import calibrate_sums, calibrate_tolerances, diagnosis_check, make_example_cases, make_fixtures

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT / "fixtures" / "conformance"


def test_every_tool_imports_with_torch_and_tensorflow_unimportable():
    """torch and TensorFlow are imported inside the functions that need them, never at import time."""
    modules = [f"tools.{m.name}" for m in pkgutil.iter_modules(tools.__path__)]
    modules += [f"bench.{m.name}" for m in pkgutil.iter_modules([str(ROOT / "bench")])]
    code = ("import sys\nsys.modules['torch'] = sys.modules['tensorflow'] = None  # any import of them raises\n"
            f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {"tools.make_fixtures", "tools.torch_bridge", "bench.run_bench"} <= set(modules)


def test_tools_and_bench_need_no_path_hacks_and_nothing_from_tests():
    for path in [*(ROOT / "tools").glob("*.py"), *(ROOT / "bench").glob("*.py")]:
        text = path.read_text()
        assert "sys.path" not in text, f"{path.name}: run it from the repo root with python -m instead"
        if path.parent.name == "tools":
            assert not re.search(r"^\s*(from|import) tests\b", text, re.M), f"{path.name} imports from tests/"


# --------------------------------------------------------------------------- make_fixtures --check


def test_make_fixtures_check_passes_on_the_committed_fixtures():
    done = subprocess.run([sys.executable, "-m", "tools.make_fixtures", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    cases = len(make_fixtures.load_manifest(CONFORMANCE / "manifest.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"every array of {cases} cases matches" in done.stdout


def _one_value_changed(path: Path) -> None:
    with np.load(path) as z:
        arrays = {key: z[key] for key in z.files}
    key = next(k for k, a in arrays.items() if a.ndim and a.dtype.itemsize == 4)
    flat = arrays[key].reshape(-1).copy()
    flat.view(np.uint32)[0] ^= 1  # one bit of one element: still a valid file with the same keys
    arrays[key] = flat.reshape(arrays[key].shape)
    make_fixtures.save_npz(path, arrays)


def _one_array_dropped(path: Path) -> None:
    with np.load(path) as z:
        arrays = {key: z[key] for key in z.files[1:]}
    make_fixtures.save_npz(path, arrays)


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _stray_file(path: Path) -> None:
    shutil.copy(path, path.parent / "stray.expected.npz")


@pytest.mark.parametrize("tamper, message", [
    (_one_value_changed, r"torch_nc_f32_train\.expected\.npz: \w+ changed"),
    (_one_array_dropped, r"torch_nc_f32_train\.expected\.npz: \w+ is missing"),
    (_truncated, r"torch_nc_f32_train\.expected\.npz: unreadable"),
    (_stray_file, r"stray\.expected\.npz: not in the manifest"),
])
def test_make_fixtures_check_fails_on_a_tampered_copy(tmp_path, capsys, tamper, message):
    copy = tmp_path / "conformance"
    shutil.copytree(CONFORMANCE, copy)
    assert make_fixtures.main(["--check", "--out", str(copy)]) == 0
    capsys.readouterr()
    tamper(copy / "torch_nc_f32_train.expected.npz")
    assert make_fixtures.main(["--check", "--out", str(copy)]) == 1
    out = capsys.readouterr().out
    assert re.search(message, out), out
    assert "1 difference(s)" in out, out


# --------------------------------------------------------------------------- the calibrations


def test_make_fixtures_report_leaves_docs_conformance_as_committed(tmp_path, monkeypatch, capsys):
    """`make_fixtures --report` runs bnbwd on every committed case and rewrites docs/conformance.md's tables: on
    the committed fixtures it rewrites them as they are (the doc is current); a stale table is rewritten."""
    committed = (make_fixtures.DOC).read_text()
    doc = tmp_path / "conformance.md"
    doc.write_text(committed)
    monkeypatch.setattr(make_fixtures, "DOC", doc)
    assert make_fixtures.main(["--report"]) == 0
    assert doc.read_text() == committed, "docs/conformance.md is stale: rerun python -m tools.make_fixtures --report"
    begin = committed.index(make_fixtures.TABLE_BEGIN) + len(make_fixtures.TABLE_BEGIN)
    doc.write_text(committed[:begin] + "\n| stale |\n" + committed[committed.index(make_fixtures.TABLE_END):])
    assert make_fixtures.main(["--report"]) == 0
    assert doc.read_text() == committed


def test_calibrate_tolerances_on_a_small_numpy_zoo(tmp_path, capsys):
    table = tmp_path / "table.md"
    assert calibrate_tolerances.main(["--quick", "--no-torch", "--m", "300", "--write", "--out", str(table)]) == 0
    text = table.read_text()
    assert text == capsys.readouterr().out
    assert text.startswith("# Error-model calibration table")
    assert "`python -m tools.calibrate_tolerances --quick --m 300 --no-torch`" in text
    summary = re.search(r"Correct kernels on the grid: worst ([\d.]+) units, all (\d+) PASS\. "
                        r"Planted bugs: mildest element-wise failure ([\d.]+) units, (\d+) of (\d+) PASS", text)
    assert summary, text[:2000]
    worst, correct, _, bugs_passed, bugs = (float(g) for g in summary.groups())
    # every correct order passes inside K; the planted bugs fail, all but the few a rounding hides
    assert correct == 4 * 2 * 3 * len(calibrate_tolerances.zoo.ORDERS) and worst < calibrate_tolerances.default_max_units("diff_src")
    assert bugs > 100 and bugs_passed < 0.1 * bugs


def _table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| kernel")]


def _marks_against_k(text: str) -> list[str]:
    """Rows whose `E` marks disagree with the judge's K of today: a units cell above K (1% slack for the printed
    digits) without E, or below K with it."""
    wrong = []
    for cells in _table_rows(text):
        for name, cell in zip(calibrate_tolerances.OUTPUTS, cells[4:7]):
            number = re.match(r"\**([0-9.]+(?:e[+-]?\d+)?)", cell)
            if number is None:  # n/a, inf
                continue
            units, k, marked = float(number.group(1)), calibrate_tolerances.default_max_units(name), "E" in cell.split()
            if (units > 1.01 * k and not marked) or (units < 0.99 * k and marked):
                wrong.append(f"{cells[0]} {cells[1]} {cells[2]} M={cells[3]}: {name} {cell} against K {k:g}")
    return wrong


def test_docs_tolerances_table_is_current():
    """docs/tolerances_table.md is generated (a full run takes minutes, and PyTorch): it states the judge's rules as
    the generator writes them today, and every row's verdict marks agree with today's K. A change of K, of the bias
    thresholds or a hand edit of the rules fails here: rerun python -m tools.calibrate_tolerances --write."""
    text = (ROOT / "docs" / "tolerances_table.md").read_text()
    assert calibrate_tolerances.rules_paragraph() in text, "the rules are stale: rerun the calibration with --write"
    assert f"**Summary** (the NumPy zoo; PyTorch's rows below): {calibrate_tolerances.k_text()}." in text
    assert text.count(calibrate_tolerances.TORCH_BEGIN) == text.count(calibrate_tolerances.TORCH_END) == 1
    assert len(_table_rows(text)) > 600  # the check sees the tables
    assert _marks_against_k(text) == []


def test_the_marks_check_finds_a_row_judged_with_another_k():
    row = "| bug/x | f32/f32 | NCX | 900 | 2.17e+03 E B | 6.86 B | 0.165 | src: 1, 2* | FAIL (elements) |"
    assert _marks_against_k(row) == ["bug/x f32/f32 NCX M=900: diff_gamma 6.86 B against K 5"]
    assert _marks_against_k(row.replace("6.86 B", "**6.86** E B")) == []


def test_calibrate_sums_correct_orders_pass_and_large_lost_partials_fail(capsys):
    assert calibrate_sums.main(["--m", "65536", "--seeds", "20", "--dists", "normal"]) == 0
    out = capsys.readouterr().out
    for order in calibrate_sums.ORDERS:
        assert re.search(rf"^\| {order} \| 20 \| 0 \|", out, re.M), out
    kernels, failed = map(int, re.search(r"^\| 30-40x \| (\d+) \| (\d+) \|", out, re.M).groups())
    assert kernels > 0 and failed == kernels, out


def test_calibrate_sums_exits_1_when_a_correct_order_fails(capsys):
    """K = 0.01 units is far below a float32 sum's own rounding: the correct orders fail, and the exit says so."""
    assert calibrate_sums.main(["--m", "4096", "--seeds", "3", "--dists", "normal", "--max-units", "0.01"]) == 1
    assert "run(s) of a correct order failed at K = 0.01" in capsys.readouterr().out


def test_diagnosis_check_names_the_planted_causes(capsys):
    assert diagnosis_check.main(["--draws", "8", "--m-range", "600", "1200"]) == 0
    out = capsys.readouterr().out
    drawn, failing = map(int, re.search(r"^(\d+) planted bugs, (\d+) failed the judge", out, re.M).groups())
    named = int(re.search(r"^\s+named\s+(\d+)", out, re.M).group(1))
    assert drawn == 8 and failing > 0 and named > failing / 2, out
    assert "correct kernels failing or hinted: 0" in out


# --------------------------------------------------------------------------- make_example_cases


def test_make_example_cases_rewrites_the_committed_bytes(tmp_path):
    assert make_example_cases.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(written) == 16
    for relative in written:
        assert (tmp_path / relative).read_bytes() == (ROOT / "fixtures" / relative).read_bytes(), relative


# --------------------------------------------------------------------------- bench/failing_phases.py


def test_failing_phases_split_a_failing_runs_cpu_into_phases_that_add_up(tmp_path):
    """bench/failing_phases.py runs bnbwd as `python -m bnbwd_cli` does (same exit code and report) and splits the
    process's CPU into phases that add up to it, each function it names found and timed."""
    from bench import failing_phases
    from tests.conftest import make_inputs, save_bundle

    inputs = make_inputs(np.random.default_rng(4), (3, 4, 5, 6))
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=1e-5, data_format="NCHW")
    good = tmp_path / "good.npz"
    assert subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", "-q", bundle, "-o", good], cwd=ROOT).returncode == 0
    with np.load(good) as z:
        outputs = {key: z[key] for key in z.files}
    outputs["diff_src"] = outputs["diff_src"] * np.float32(1.01)  # a scaling bug: fails, diagnosed
    np.savez(tmp_path / "bad.npz", **outputs)
    args = ["run", "-q", bundle, "--reference", str(tmp_path / "bad.npz"), "--json", str(tmp_path / "r.json")]
    done = subprocess.run([sys.executable, "-m", "bench.failing_phases", str(tmp_path / "p.json"), *args], cwd=ROOT,
                          capture_output=True, text=True)
    plain = subprocess.run([sys.executable, "-m", "bnbwd_cli", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == plain.returncode == 1, done.stderr
    assert done.stdout == plain.stdout
    phases = json.loads((tmp_path / "p.json").read_text())
    assert phases["exit"] == 1 and set(failing_phases.SHOWN) <= set(phases)
    assert abs(sum(phases[name] for name in failing_phases.SHOWN) - phases["total"]) < 1e-6
    for name in ("imports", "read inputs", "reading files", "core", "channel facts", "judging", "diagnosis", "DAZ scan", "text report",
                 "JSON"):
        assert phases[name] > 0, name
    assert all(phases[name] >= -0.01 for name in failing_phases.SHOWN), phases
