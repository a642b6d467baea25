"""User data printed literally: names that look like rich markup, hold terminal control bytes, forge a report line
or run to megabytes reach every surface (report, --brief, check lines and summary, run's summary, error lines, the
API's text) as they are, control bytes escaped, each value cut to 200 characters, never exit 4."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.literal import LINE_LIMIT, VALUE_LIMIT, literal, literal_line
from tests.conftest import make_inputs

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "examples" / "tf_nchw_f32_train.perturbed.npz"
CASE = ROOT / "fixtures" / "example_case.npz"
CASE_MAP = ["--map", "dy=diff_dst", "--map", "var=variance", "--map", "dx=diff_src", "--map", "dgamma=diff_gamma",
            "--map", "dbeta=diff_beta"]

# (a hostile name, what must be printed for it)
NAMES = {
    "closing-tag": ("[/]", "[/]"),
    "style": ("[bold red]x", "[bold red]x"),
    "link": ("[link=https://evil.example]y[/link]", "[link=https://evil.example]y[/link]"),
    "osc-title": ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    "csi-clear": ("\x1b[2J\x1b[Hz", "\\x1b[2J\\x1b[Hz"),
    "forged-line": ("a\nPASS b", "a\\nPASS b"),
    "carriage-return": ("c\rPASS", "c\\rPASS"),
    "bidi": ("d\u202egpj.exe", "d\\u202egpj.exe"),
}
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")  # what no output may hold (\n ends lines)


def assert_literal(text: str, shown: str) -> None:
    """`shown` is printed as it is, no raw control byte is, and no line was forged."""
    assert shown in text, text
    assert not CONTROL.search(text), repr(text)
    assert not any(line.startswith(("PASS b", "PASS:")) and "output(s)" not in line for line in text.splitlines())


def reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE) as archive:
        return {key: archive[key] for key in archive.files}


# --------------------------------------------------------------------------- the function


@pytest.mark.parametrize("name", list(NAMES))
def test_literal_escapes_control_characters_only(name):
    value, shown = NAMES[name]
    assert literal(value) == shown


def test_literal_cuts_the_middle_of_long_values_and_lines():
    assert literal("x" * 10_000_000) == "x" * 98 + "..." + "x" * 98
    assert len(literal("\x1b" * 10_000)) <= VALUE_LIMIT  # escapes counted too
    line = literal_line("error: " + "p" * 5000 + ": no such file; " + "word " * 1000)
    assert len(line) <= LINE_LIMIT and max(len(word) for word in line.split()) <= VALUE_LIMIT
    assert literal(b"caf\xe9".decode("utf-8", "surrogateescape")) == "caf\\xe9"  # a byte that is not UTF-8
    assert literal("naïve ✓ 日本") == "naïve ✓ 日本"


# --------------------------------------------------------------------------- verify


@pytest.mark.parametrize("name", list(NAMES))
def test_verify_prints_an_unused_member_name_literally(cli, tmp_path, name):
    value, shown = NAMES[name]
    actual = tmp_path / "actual.npz"
    np.savez(actual, **{value: np.zeros(3, np.float32)}, **reference())
    for flags in ([], ["--brief"], ["-v"]):
        result = cli("verify", actual, REFERENCE, *flags)
        assert result.exit_code == 0, result.output
        assert_literal(result.stdout, f"not compared: {shown}")


@pytest.mark.parametrize("name", list(NAMES))
def test_verify_prints_compared_names_literally_in_table_details_brief_and_verdict(cli, tmp_path, name):
    value, shown = NAMES[name]
    data = reference()["diff_src"]
    np.savez(tmp_path / "r.npz", **{value: data})
    np.savez(tmp_path / "a.npz", **{value: data * 1.5})
    result = cli("verify", tmp_path / "a.npz", tmp_path / "r.npz")
    assert result.exit_code == 1, result.output
    assert_literal(result.stdout, f"numerical mismatch in {shown}")
    assert re.search(rf"^{re.escape(shown)} +\(4,8,6,6\)", result.stdout, re.M)  # the summary table's row
    assert f"{shown}: FAIL" in result.stdout  # the details' rule
    brief = cli("verify", tmp_path / "a.npz", tmp_path / "r.npz", "--brief")
    assert brief.exit_code == 1 and f"\n{shown}: FAIL " in brief.stdout
    assert_literal(brief.stdout, shown)


@pytest.mark.parametrize("name", list(NAMES))
def test_verify_error_lines_print_names_literally(cli, tmp_path, name):
    value, shown = NAMES[name]
    outputs = reference()
    np.savez(tmp_path / "a.npz", **{value: outputs.pop("diff_src")}, **outputs)
    result = cli("verify", tmp_path / "a.npz", REFERENCE)  # diff_src missing: the error suggests --map NAME=...
    assert result.exit_code == 3, result.output
    assert_literal(result.stderr, f"--map {shown}=diff_src")
    assert all(line.startswith("error: ") for line in result.stderr.splitlines())
    missing = cli("verify", tmp_path / f"{value.replace('/', '|')}.npz", REFERENCE)  # a file name in an error line
    assert missing.exit_code == 3
    assert_literal(missing.stderr, shown.replace("/", "|"))


def test_verify_options_and_keys_of_megabytes_are_cut_to_200_characters(cli, tmp_path):
    huge = "k" * 10_000_000
    for args, code in ((["--only", huge], 3), (["--atol", huge], 2), (["--map", f"{huge}=diff_src"], 0),
                       ([f"--inputs={tmp_path / huge}"], 3)):
        result = cli("verify", REFERENCE, REFERENCE, *args)
        assert result.exit_code == code, result.output[:500]
        for line in result.output.splitlines():
            assert len(line) <= LINE_LIMIT and "k" * (VALUE_LIMIT + 1) not in line, line[:300]
    actual = tmp_path / "a.npz"
    np.savez(actual, **{"m" * 60_000: np.zeros(1)}, **reference())  # a zip member name near its 64 KiB limit
    result = cli("verify", actual, REFERENCE)
    assert result.exit_code == 0 and "m" * (VALUE_LIMIT + 1) not in result.output


# --------------------------------------------------------------------------- check


@pytest.fixture
def hostile_cases(tmp_path) -> Path:
    """A passing case, a case missing an input (ERROR) and an unreadable one, each under every hostile name."""
    directory = tmp_path / "cases"
    directory.mkdir()
    with np.load(CASE) as archive:
        arrays = {key: archive[key] for key in archive.files}
    without_dy = {key: value for key, value in arrays.items() if key != "dy"}
    for index, (value, _) in enumerate(NAMES.values()):
        name = value.replace("/", "|")
        shutil.copy(CASE, directory / f"{index}p{name}.npz")
        np.savez(directory / f"{index}e{name}.npz", **without_dy)
        (directory / f"{index}u{name}.npz").write_bytes(b"not an archive")
    (directory / "a[").mkdir()
    shutil.copy(CASE, directory / "a[" / "x].npz")
    return directory


def test_check_lines_summary_and_errors_print_case_paths_literally(cli, hostile_cases):
    nested = hostile_cases / "a[" / "x].npz"
    result = cli("check", hostile_cases, nested, *CASE_MAP, "--jobs", "1")
    assert result.exit_code == 3, result.output
    assert f"PASS  {nested}: " in result.stdout  # `a[/x].npz`, once exit 4 (a closing tag)
    for index, (value, shown) in enumerate(NAMES.values()):
        name = shown.replace("/", "|")
        assert_literal(result.stdout, f"PASS  {hostile_cases}/{index}p{name}.npz: ")
        assert f"ERROR {hostile_cases}/{index}e{name}.npz: missing input" in result.stdout
        assert f"ERROR {hostile_cases}/{index}u{name}.npz: " in result.stdout
    summary = result.stdout.splitlines()[-1]
    assert summary.startswith("FAIL (exit 3): 25 case(s), 16 could not be judged: ") and "\x1b" not in summary
    assert summary.endswith(" and 13 more")  # the first three named, literally
    assert len(result.stdout.splitlines()) == 26  # one line per case and the summary: none forged
    assert result.stderr == ""  # each case's error once: its ERROR line in the report


def test_check_json_to_stdout_prints_errors_once(cli, hostile_cases):
    result = cli("check", hostile_cases, *CASE_MAP, "--json", "-")
    assert result.exit_code == 3
    assert result.stderr.count("ERROR ") == 16 and "error: " not in result.stderr  # the lines are on stderr already


def test_check_a_long_case_path_is_cut_in_its_line_and_summary(cli):
    result = cli("check", "c" * 100_000 + ".npz")
    assert result.exit_code == 3
    assert all(len(line) <= LINE_LIMIT and "c" * (VALUE_LIMIT + 1) not in line for line in result.output.splitlines())


# --------------------------------------------------------------------------- run and the API


@pytest.mark.parametrize("name", list(NAMES))
def test_run_prints_output_and_input_paths_literally(cli, tmp_path, rng, name):
    value, shown = NAMES[name]
    file_name = value.replace("/", "|")
    bundle = tmp_path / "in.npz"
    np.savez(bundle, **make_inputs(rng, (2, 3, 4)), epsilon=np.array(1e-5), data_format=np.array("NCX"))
    result = cli("run", bundle, "-o", tmp_path / f"{file_name}.npz")
    assert result.exit_code == 0, result.output
    assert_literal(result.stdout, f"wrote {tmp_path}/{shown.replace('/', '|')}.npz")
    missing = cli("run", tmp_path / f"{file_name}.npz.absent", "-o", tmp_path / "o.npz")
    assert missing.exit_code == 3
    assert_literal(missing.stderr, f"{shown.replace('/', '|')}.npz.absent")


@pytest.mark.parametrize("name", list(NAMES))
def test_api_report_text_prints_names_literally(rng, name):
    value, shown = NAMES[name]
    inputs = dict(make_inputs(rng, (4, 3, 5)), epsilon=1e-5, data_format="NCX")
    grads = bnbwd_cli.backward(**inputs)
    report = bnbwd_cli.check({value: grads["diff_src"] * 2}, key_map={value: "diff_src"}, only="diff_src", **inputs)
    assert report.status == "mismatch"
    report = bnbwd_cli.check({value: grads["diff_src"], "diff_beta": grads["diff_beta"] * 3}, **inputs)
    assert not report and report.status in ("mismatch", "structural")
    assert_literal(report.text, shown)
