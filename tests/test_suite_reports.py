"""A suite's reports for CI: `check --junit/--markdown/-q`, check's JSON (counts, shard, version, problem, seconds)
and `bnbwd report`, which merges shard documents into the unsharded run's.

The suite: generated cases (bnbwd_cli.cases) answered by a correct NumPy kernel (tools/zoo.py), two with a planted
error in diff_beta (mismatch, exit 1), one whose diff_src has the wrong shape (structural) and one with no
outputs (error): every verdict a report must carry.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.render import markdown as render_markdown
from tests.conftest import assert_one_error
from tests.test_cases import problem_from_bundle
from tools import zoo

SUITE = bnbwd_cli.cases("tiny", count=8, seed=3, max_elements=400)[-8:]
MISMATCH, STRUCTURAL, ERROR = {"seed3_0001", "seed3_0005"}, "seed3_0003", "seed3_0006"


def _write_suite(directory: Path) -> None:
    directory.mkdir()
    for case in SUITE:
        bundle = {**case.inputs, "epsilon": np.array(case.epsilon), "data_format": np.array(case.data_format)}
        np.savez(directory / f"{case}.npz", **bundle)
        if str(case) == ERROR:
            continue  # the kernel crashed before it wrote its outputs
        outputs = zoo.kernel(problem_from_bundle(bundle), "blocked")
        if str(case) in MISMATCH:
            outputs["diff_beta"] = outputs["diff_beta"] * np.float32(1.01) + np.float32(0.5)
        if str(case) == STRUCTURAL:
            outputs["diff_src"] = outputs["diff_src"].reshape(-1)
        np.savez(directory / f"{case}.out.npz", **outputs)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("reports") / "suite"
    _write_suite(directory)
    return directory


@pytest.fixture(scope="module")
def whole(suite):
    """The unsharded run: (result, JSON document, JUnit text, markdown text)."""
    from click.testing import CliRunner

    from bnbwd_cli.cli import main

    out = suite.parent
    result = CliRunner().invoke(main, ["check", str(suite), "--json", str(out / "whole.json"), "--junit",
                                       str(out / "whole.xml"), "--markdown", str(out / "whole.md")])
    return (result, json.loads((out / "whole.json").read_text()), (out / "whole.xml").read_text(),
            (out / "whole.md").read_text())


def _untimed(document: dict) -> dict:
    return {**document, "cases": [{k: v for k, v in case.items() if k != "seconds"} for case in document["cases"]]}


def test_check_json_has_counts_shard_version_problem_and_seconds(whole):
    result, document, _, _ = whole
    assert result.exit_code == 3, result.output
    assert document["schema_version"] == 4 and document["bnbwd_version"] == bnbwd_cli.__version__
    assert document["counts"] == {"cases": 8, "pass": 4, "mismatch": 2, "structural": 1, "error": 1}
    assert document["shard"] is None
    by_name = {Path(case["case"]).stem: case for case in document["cases"]}
    for case in SUITE:
        problem = by_name[str(case)]["problem"]
        if str(case) == ERROR:
            assert problem is None or problem["shape"] == list(case.inputs["src"].shape)
            continue
        m = case.inputs["src"].size // case.shape[1]
        assert problem == {"shape": list(case.inputs["src"].shape), "dtype": "f32", "layout": "NCX",
                           "epsilon": case.epsilon, "M": m, "is_training": True}
    assert all(0 <= case["seconds"] < 60 for case in document["cases"])
    assert all(case["line"] in result.stdout for case in document["cases"])


def test_junit_has_the_structure_reporters_read(whole):
    """The common JUnit schema's structure: testsuites > testsuite > testcase (> failure | error), the counts on
    both levels equal to the elements, name/classname/time on each testcase, message and type on each verdict."""
    _, document, xml, _ = whole
    root = ElementTree.fromstring(xml)
    assert root.tag == "testsuites" and [child.tag for child in root] == ["testsuite"]
    suite = root[0]
    testcases = suite.findall("testcase")
    failures = [tc for tc in testcases if tc.find("failure") is not None]
    errors = [tc for tc in testcases if tc.find("error") is not None]
    for element in (root, suite):
        assert {k: element.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
            "tests": str(len(testcases)), "failures": str(len(failures)), "errors": str(len(errors)), "skipped": "0"}
        assert float(element.get("time")) >= 0
    assert [child.tag for child in suite] == ["properties"] + ["testcase"] * 8
    assert (len(failures), len(errors)) == (2, 2)
    for testcase, case in zip(testcases, document["cases"]):
        assert testcase.get("name") == case["case"] and testcase.get("classname") and float(testcase.get("time")) >= 0
        assert len(testcase) <= 1 and all(verdict.tag in ("failure", "error") for verdict in testcase)
        for verdict in testcase:
            assert verdict.get("message") and verdict.get("type") == case["status"] and verdict.text
    failure = failures[0].find("failure")
    assert failure.get("message").startswith("FAIL  ") and "diff_beta FAIL" in failure.get("message")
    assert "numerical mismatch in diff_beta" in failure.text  # the brief report: verdict, tests, worst element
    error = next(tc for tc in errors if ERROR in tc.get("name")).find("error")
    assert "no kernel outputs" in error.get("message") or "not found" in error.get("message")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["bnbwd_version"] == bnbwd_cli.__version__ and properties["summary"] == document["summary"]


def test_junit_text_never_holds_characters_xml_cannot(tmp_path):
    from bnbwd_cli.render.junit import junit_xml

    case = {"case": "a\x1bb\x00.npz", "status": "error", "exit_code": 3, "error": "bad \x07 name", "line": "ERROR x",
            "brief": None, "seconds": 0.5}
    document = {"cases": [case], "shard": {"index": 2, "count": 4}, "bnbwd_version": "0", "summary": "FAIL \x1b"}
    root = ElementTree.fromstring(junit_xml(document))
    assert root[0].find("testcase").get("name") == "a\\x1bb\\x00.npz"
    assert root[0].find("testcase/error").get("message") == "bad \\x07 name"
    assert {p.get("name"): p.get("value") for p in root[0].find("properties")}["shard"] == "2/4"


def test_markdown_lists_the_cases_that_did_not_pass_then_the_counts(whole):
    _, document, _, markdown = whole
    lines = markdown.splitlines()
    assert lines[0] == "### ❌ bnbwd check" and lines[2] == document["summary"]
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == 4 and all(line.count(" | ") == 2 for line in rows)
    mismatch = next(row for row in rows if "seed3_0001" in row)
    assert "**mismatch**: diff_beta FAIL max" in mismatch and "&gt; K 5" in mismatch
    assert lines[-1] == f"8 case(s): 4 pass, 2 mismatch, 1 structural, 1 error · bnbwd {bnbwd_cli.__version__}"


def test_markdown_stays_comment_sized():
    case = {"case": "c|x.npz", "status": "mismatch", "verdict": "v" * 1000, "hint": "a | b <script>"}
    document = {"cases": [dict(case, case=f"c{i}|x.npz") for i in range(500)], "status": "mismatch",
                "summary": "FAIL", "shard": None, "bnbwd_version": "0", "counts": {"cases": 500, "mismatch": 500}}
    text = render_markdown.markdown_report(document)
    assert len(text) < 65536 and text.count("\n| `") == render_markdown.MAX_ROWS
    assert "| ... | 450 more cases did not pass |" in text
    assert "`c0\\|x.npz`" in text and "a \\| b &lt;script&gt;" in text and "<script>" not in text


def test_quiet_prints_only_failures_and_the_summary_and_dash_writes_stdout(cli, suite, whole):
    result = cli("check", suite, "-q", "--markdown", "-")
    assert result.exit_code == 3
    lines = result.stderr.splitlines()  # a report on stdout: the lines on stderr
    assert len(lines) == 5 and not any(line.startswith("PASS") for line in lines)
    assert lines[-1].startswith("FAIL (exit 3): 8 case(s), 2 failed: ")
    assert result.stdout.startswith("### ❌ bnbwd check") and result.stdout.count("\n| `") == 4


def test_the_summary_names_three_cases_then_how_many_more(tmp_path):
    from bnbwd_cli.render.cases import summary_of
    from bnbwd_cli.status import Status

    for failed, named in ((4, "a0, a1, a2, a3"), (29, "a0, a1, a2 and 26 more")):
        cases = [(f"a{i}", Status.MISMATCH) for i in range(failed)] + [("p", Status.PASS)]
        assert summary_of(cases) == f"FAIL (exit 1): {failed + 1} case(s), {failed} failed: {named}"


@pytest.mark.parametrize("args", [("--json", "-", "--junit", "-"), ("--junit", "-", "--markdown", "-")])
def test_two_reports_on_stdout_are_a_usage_error(cli, suite, args):
    """The one rule of every command's outputs (cli/destinations.vet_outputs), in its one message."""
    result = cli("check", suite, *args)
    assert result.exit_code == 2
    assert f"error: {args[0]} - and {args[2]} - both want stdout; send one to a file" in result.stderr


def test_two_reports_in_one_file_are_a_usage_error(cli, suite, tmp_path):
    assert_one_error(cli("check", suite, "--json", tmp_path / "r", "--markdown", tmp_path / "r"),
                     r"--markdown .*/r is also another output of this command \(--json\); give each output its own "
                     r"file", 2)


def test_a_report_over_a_case_file_is_refused(cli, suite):
    assert_one_error(cli("check", suite, "--junit", suite / "seed3_0000.npz"), r"--junit .*is also an input")


# --------------------------------------------------------------------------- bnbwd report: shards merged


def test_four_shards_merged_are_the_unsharded_report(cli, suite, whole, tmp_path):
    result, document, xml, markdown = whole
    shards = []
    for k in range(1, 5):
        part = cli("check", suite, "--shard", f"{k}/4", "--jobs", "1", "--json", tmp_path / f"s{k}.json")
        assert part.exit_code in (0, 1, 3)
        assert json.loads((tmp_path / f"s{k}.json").read_text())["shard"] == {"index": k, "count": 4}
        shards.append(tmp_path / f"s{k}.json")
    merged = cli("report", *shards, "--json", tmp_path / "m.json", "--junit", tmp_path / "m.xml",
                 "--markdown", tmp_path / "m.md")
    assert merged.exit_code == result.exit_code == 3
    assert merged.stdout == result.stdout  # the same lines and summary
    assert _untimed(json.loads((tmp_path / "m.json").read_text())) == _untimed(document)
    assert (tmp_path / "m.md").read_text() == markdown

    def untimed_xml(text: str) -> str:
        root = ElementTree.fromstring(text)
        for element in root.iter():
            element.attrib.pop("time", None)
        return ElementTree.tostring(root, encoding="unicode")

    assert untimed_xml((tmp_path / "m.xml").read_text()) == untimed_xml(xml)
    quiet = cli("report", *shards, "-q")
    assert quiet.exit_code == 3 and len(quiet.stdout.splitlines()) == 5


def test_report_refuses_what_would_hide_cases(cli, whole, suite, tmp_path):
    for k in (1, 2, 2):
        cli("check", suite, "--shard", f"{k}/3", "--jobs", "1", "--json", tmp_path / f"s{k}.json")
    assert_one_error(cli("report", tmp_path / "s1.json"), r"^error: shard 2/3, 3/3 missing: merge every shard's")
    assert_one_error(cli("report", tmp_path / "s1.json", tmp_path / "s1.json", tmp_path / "s2.json"),
                     r"shard 1/3 given twice")
    (tmp_path / "whole.json").write_text(json.dumps(whole[1]))
    assert_one_error(cli("report", tmp_path / "whole.json", tmp_path / "whole.json"), r"case .*seed3_0000.npz is in both")


@pytest.mark.parametrize("content, message", [
    (b"PK\x03\x04", r"not JSON"),
    (b'{"tool": "bnbwd verify", "cases": []}', r"not a `bnbwd check --json` document"),
    (b'{"tool": "bnbwd check", "schema_version": 3, "cases": []}', r"schema_version 3, expected 4"),
    (b'{"tool": "bnbwd check", "schema_version": 4, "cases": [{"status": "pass"}]}', r"a case without its name"),
    (b"[NaN]", r"not JSON"),
])
def test_report_on_what_is_not_a_check_document_is_one_error(cli, tmp_path, content, message):
    (tmp_path / "d.json").write_bytes(content)
    assert_one_error(cli("report", tmp_path / "d.json"), message)


def test_report_usage_and_missing_files(cli, tmp_path):
    assert cli("report").exit_code == 2
    assert_one_error(cli("report", tmp_path / "absent.json"), r"absent\.json: no such file")
    assert cli("report", "-", "-").exit_code == 2
