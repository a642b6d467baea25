"""`bnbwd cases`: the suite a kernel engineer tests against.

The loop closes as a user's would: each NAME.npz is read back (np.load, allow_pickle=False), a NumPy
"kernel" computes its outputs, and bnbwd judges them (the Python API here; `bnbwd check DIR`, reading
NAME.npz beside NAME.out.npz, in the end-to-end tests). Correct kernels pass every case; each bug family
of tools/bugs.py fails on a case the manifest says targets its class (bugs.CLASSES), runs only on those
cases, to keep this fast, and there gets its cause named or "unexplained", never a wrong cause.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import zlib
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.app import inputs as app_inputs
from bnbwd_cli.app import cases as app_cases
from bnbwd_cli.files import suite as suite_files
from tools import bugs, zoo
from tests.conftest import assert_one_error

INPUTS = ("src", "diff_dst", "mean", "variance", "gamma", "epsilon", "data_format")
# sha256 of one small case's file, as `bnbwd cases` writes it: a change here changes every suite's bytes
# (a new generator, recipe or archive layout), which needs a new bnbwd version.
PINNED = {("f32", "NCX", "no_spatial"): "14e0c5401561447d4deb87b86c883f9a3bbc21e37f9519854683b951c8c67168", ("bf16", "NXC", "m7"): "1f76005e2dece888e716cfaa6101a781d2036abc62e5dc496881e8b9a01c9527"}


@pytest.fixture(scope="module")
def suites(tmp_path_factory) -> dict:
    """The default suite, written once per (dtype, format) the tests ask for: {(dtype, fmt): (dir, manifest)}."""
    written = {}

    def get(dtype: str, fmt: str):
        if (dtype, fmt) not in written:
            directory = tmp_path_factory.mktemp("suites") / f"{dtype}_{fmt}"
            app_cases.write_suite(app_cases.SuiteSettings(dtype=dtype, data_format=fmt), directory)
            written[dtype, fmt] = directory, json.loads((directory / app_cases.MANIFEST_JSON).read_text())
        return written[dtype, fmt]

    return get


def problem_from_bundle(arrays: dict) -> dict:
    """An .npz of `bnbwd cases` as zoo's problem dict (bfloat16 back from raw |V2, 0-d entries as scalars)."""
    problem = dict(arrays)
    for key in ("src", "diff_dst"):
        if problem[key].dtype == np.dtype("V2"):
            problem[key] = problem[key].view(zoo.BF16)
    problem["epsilon"] = float(problem["epsilon"])
    problem["data_format"] = str(problem["data_format"])
    return problem


def _problem(directory: Path, entry: dict) -> dict:
    with np.load(directory / entry["file"], allow_pickle=False) as archive:
        return problem_from_bundle({key: archive[key] for key in archive.files})


def _judge(problem: dict, outputs: dict):
    return bnbwd_cli.check(outputs, **{key: problem[key] for key in INPUTS})


def _causes(report) -> set[str]:
    return {hint.cause for output in report.result.outputs for hint in output.comparison.diagnosis}


def _summary(report) -> str:
    return ", ".join(f"{o.name} {o.comparison.max_units.value:.3g} units" for o in report.result.outputs)


# --------------------------------------------------------------------------- correct kernels pass everywhere

SUITES = [("f32", "NCX"), ("f32", "NXC"), ("bf16", "NXC"), ("f16", "NCX")]


@pytest.mark.parametrize("dtype, fmt", SUITES, ids=[f"{d}-{f}" for d, f in SUITES])
def test_correct_kernels_pass_every_case(suites, dtype, fmt):
    directory, manifest = suites(dtype, fmt)
    orders = zoo.ORDERS if (dtype, fmt) == ("f32", "NCX") else ("sequential", "blocked")
    failed = []
    for entry in manifest["cases"]:
        problem = _problem(directory, entry)
        for order in orders:
            report = _judge(problem, zoo.kernel(problem, order))
            if not report or _causes(report):
                failed.append(f"{entry['name']} ({order}): {_summary(report)} {sorted(_causes(report))}")
    assert not failed, failed


# --------------------------------------------------------------------------- every bug family fails on its targets

def _family_runs() -> list:
    """Each family on a float32 suite and a 16-bit one, layouts alternating between families."""
    runs = []
    for k, family in enumerate(sorted(bugs.CASE_FAMILIES)):
        for dtype, fmt in (("f32", "NCX"), ("bf16", "NXC")) if k % 2 == 0 else (("f32", "NXC"), ("f16", "NCX")):
            # classes a suite of that dtype does not claim (app/cases.py: SIXTEEN_BIT_ONLY, FLOAT32_ONLY)
            if (family, dtype == "f32") in (("truncation", True), ("single_pass", False)):
                continue
            runs.append(pytest.param(family, dtype, fmt, id=f"{family}-{dtype}-{fmt}"))
    return runs


@pytest.mark.parametrize("family, dtype, fmt", _family_runs())
def test_bug_family_fails_on_a_case_that_targets_it_with_its_cause_named(suites, family, dtype, fmt):
    directory, manifest = suites(dtype, fmt)
    outcomes = {}
    for entry in manifest["cases"]:
        rng = np.random.default_rng(zlib.crc32(f"{family}/{entry['name']}/{dtype}/{fmt}".encode()))
        planted = bugs.plant_on_case(family, _problem(directory, entry), tuple(entry["targets"]), rng)
        if planted is not None:
            report = _judge(planted.problem, planted.outputs)
            outcomes[entry["name"]] = planted.bug, report, _causes(report)
    assert outcomes, f"no case of the {dtype} {fmt} suite targets {family}'s classes"
    failing = {name for name, (_, report, _) in outcomes.items() if not report}
    named = {name for name, (bug, _, causes) in outcomes.items() if bug.cause in causes}
    wrong = {name: (bug.cause, sorted(causes)) for name, (bug, _, causes) in outcomes.items()
             if causes - {bug.cause, "unexplained"}}
    said = {name: (bug.family, _summary(report), sorted(causes)) for name, (bug, report, causes) in outcomes.items()}
    assert failing and named & failing, said
    assert not wrong, wrong
    assert all(outcomes[name][2] for name in failing), said  # every failure says something: a cause or unexplained


def test_every_bug_class_is_targeted_and_has_a_family(suites):
    targeted = set()
    for dtype, fmt in (("f32", "NCX"), ("bf16", "NXC")):
        _, manifest = suites(dtype, fmt)
        targeted |= {target for entry in manifest["cases"] for target in entry["targets"]}
        assert set(manifest["bug_classes"]) == set(app_cases.BUG_CLASSES)
    assert targeted == set(app_cases.BUG_CLASSES)
    assert set(bugs.CLASSES.values()) == set(app_cases.BUG_CLASSES)  # each class has a cause a family plants
    documented = (Path(__file__).resolve().parent.parent / "docs" / "tolerances.md").read_text()
    assert not [cause for cause in bugs.CLASSES if f"`{cause}`" not in documented]  # the diagnosis's cause ids


def test_a_float32_suite_does_not_claim_truncation_nor_a_16_bit_one_cancellation(suites):
    """The float32 limit (docs/tolerances.md, "Truncation fails"): a float32 output truncated from exact values
    leans half an ulp, within a correct float32 kernel's own rounding; the judge does not see it, so no float32
    case claims it. Likewise a 16-bit suite's data cannot show a single-pass formula's cancellation."""
    for (dtype, fmt), absent in {("f32", "NCX"): "truncation", ("bf16", "NXC"): "cancellation"}.items():
        _, manifest = suites(dtype, fmt)
        assert not [entry["name"] for entry in manifest["cases"] if absent in entry["targets"]], (dtype, absent)


# --------------------------------------------------------------------------- the loop through the real CLI

def _write_outputs(directory: Path, kernels: dict[str, dict]) -> None:
    """A NumPy kernel's NAME.out.npz beside each NAME.npz: zoo's blocked one, or the hooks given for a case."""
    manifest = json.loads((directory / app_cases.MANIFEST_JSON).read_text())
    for entry in manifest["cases"]:
        problem = _problem(directory, entry)
        outputs = bugs.kernel(problem, kernels.get(entry["name"], {}))
        np.savez(directory / f"{entry['name']}.out.npz", **outputs)


def test_cases_kernel_check_loop_passes_a_correct_kernel(tmp_path, cli):
    assert cli("cases", "--format", "NXC", "-o", tmp_path / "suite").exit_code == 0
    _write_outputs(tmp_path / "suite", {})
    result = cli("check", tmp_path / "suite")
    assert result.exit_code == 0, result.output
    cases = len(json.loads((tmp_path / "suite" / app_cases.MANIFEST_JSON).read_text())["cases"])
    assert result.output.count("PASS ") == cases and "FAIL" not in result.output


def test_cases_kernel_check_loop_fails_a_planted_bug_and_names_its_cause(tmp_path, cli):
    """Two cases with a bug each: `bnbwd check` exits 1, and each one's line carries the hint that names it."""
    planted = {"gamma_near_one": ({"gamma": "twice"}, "gamma-applied-twice"),
               "block256_plus1": ({"block": 32, "lost": {0: 5, 7: 20}}, "lost-partial-sum")}
    assert cli("cases", "-o", tmp_path / "suite").exit_code == 0
    _write_outputs(tmp_path / "suite", {name: hooks for name, (hooks, _) in planted.items()})
    result = cli("check", tmp_path / "suite")
    assert result.exit_code == 1, result.output
    failing = [line for line in result.output.splitlines() if line.startswith("FAIL ") and ".npz: " in line]
    assert len(failing) == 2 and result.output.count("PASS ") == 29, result.output
    for name, (hooks, cause) in planted.items():
        problem = _problem(tmp_path / "suite", {"file": f"{name}.npz"})
        report = _judge(problem, bugs.kernel(problem, hooks))
        hint = next(h for o in report.result.outputs for h in o.comparison.diagnosis)
        line = next(line for line in failing if f"/{name}.npz:" in line)
        assert hint.cause == cause and f"hint: {hint.text}" in line, (hint, line)


def test_the_suite_has_the_shapes_and_data_it_promises(suites):
    directory, manifest = suites("f32", "NCX")
    cases = {entry["name"]: entry for entry in manifest["cases"]}
    ms = [entry["m"] for entry in cases.values()]
    for block in (32, 64, 128, 256, 1024):
        assert any(m % block == 1 and m > block for m in ms) and any(m % block == block - 1 for m in ms), block
    assert max(ms) >= 90_000  # 16-bit accumulation shows at M ~ 1e5
    assert any(c["channels"] % 8 and c["channels"] > 32 for c in cases.values())
    assert {len(c["shape"]) for c in cases.values()} >= {2, 3, 4, 5}
    assert any(c["shape"][0] == 1 for c in cases.values()) and any(c["shape"][2:] == [1, 1] for c in cases.values())
    offset = _problem(directory, cases["offset_mean"])
    assert np.min(np.abs(offset["mean"]) / np.sqrt(offset["variance"])) > 1e3
    tiny = _problem(directory, cases["tiny_variance"])
    assert np.min(tiny["variance"]) < tiny["epsilon"] < np.max(tiny["variance"])
    relu = _problem(directory, cases["relu_masked"])
    assert 0.3 < np.mean(relu["diff_dst"] == 0) < 0.7
    pool = _problem(directory, cases["global_avg_pool"])["diff_dst"]
    low = np.where(pool == 0, np.inf, pool).min(axis=(2, 3))  # one value per (n, c) where ReLU let it through
    high = np.where(pool == 0, -np.inf, pool).max(axis=(2, 3))
    assert np.all((low == high) | np.isinf(low)) and np.mean(pool == 0) > 0.2
    zero = _problem(directory, cases["gamma_some_zero"])
    assert np.all(zero["gamma"][::3] == 0) and np.all(zero["gamma"][1::3] != 0)
    for name in ("baseline", "large_m"):  # diff_dst has a per-channel mean, so a missing diff_beta/M shows
        problem = _problem(directory, cases[name])
        per_channel = zoo._per_channel(problem["diff_dst"], "NCX").mean(axis=1)
        assert np.min(np.abs(per_channel)) > 0.05, name


# --------------------------------------------------------------------------- the files

def test_cases_read_back_through_bnbwd_as_run_inputs(suites):
    directory, manifest = suites("bf16", "NXC")
    for entry in manifest["cases"]:
        split = app_inputs.read_inputs(str(directory / entry["file"]),
                                       app_inputs.SplitRequest(app_inputs.Naming(), app_inputs.OpSettings()))
        assert (split.settings.epsilon, split.settings.data_format) == (entry["epsilon"], "NXC")
        assert sorted(split.inputs) == ["diff_dst", "gamma", "mean", "src", "variance"] and not split.unused
        assert split.inputs["src"].dtype == zoo.BF16 and list(split.inputs["src"].shape) == entry["shape"]
        app_inputs.build_op(split.inputs, app_inputs.OpSettings(epsilon=entry["epsilon"], data_format="NXC"))


def test_npz_bytes_match_numpys_own_members():
    """Our .npy members are byte for byte what np.save writes (so any reader of .npy reads them)."""
    import io

    for array in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array(1e-5), np.array("NXC"),
                  np.arange(5, dtype=np.float16), np.ones((2, 3, 4), zoo.BF16)):
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        assert suite_files.npy_bytes(array) == buffer.getvalue(), array.dtype


@pytest.mark.parametrize("dtype, fmt, name", list(PINNED))
def test_a_small_case_has_its_committed_hash(tmp_path, cli, dtype, fmt, name):
    result = cli("cases", "--dtype", dtype, "--format", fmt, "-o", tmp_path / "suite")
    assert result.exit_code == 0, result.output
    digest = hashlib.sha256((tmp_path / "suite" / f"{name}.npz").read_bytes()).hexdigest()
    assert digest == PINNED[dtype, fmt, name]


def test_the_same_command_writes_the_same_bytes(tmp_path, cli):
    for out in ("a", "b"):
        assert cli("cases", "--preset", "tiny", "--dtype", "f16", "-o", tmp_path / out).exit_code == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    settings = app_cases.SuiteSettings(dtype="f16", preset="tiny")
    specs = {spec.name: spec for spec in app_cases.catalogue("tiny")}
    for entry in manifest["cases"]:
        data = (tmp_path / "a" / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data) == entry["bytes"] == suite_files.npz_size(app_cases.case_members(specs[entry["name"]], settings))


def test_manifest_text_has_one_line_per_case(suites):
    directory, manifest = suites("f32", "NCX")
    lines = [line for line in (directory / "manifest.txt").read_text().splitlines() if not line.startswith("#")]
    assert [line.split(" | ")[0].strip() for line in lines] == [entry["name"] for entry in manifest["cases"]]
    for line, entry in zip(lines, manifest["cases"]):
        assert ", ".join(entry["targets"]) in line and entry["why"] in line


# --------------------------------------------------------------------------- the command

def test_help_examples_run_as_printed(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    help_text = cli("cases", "--help").output
    examples = re.findall(r"^\s+(bnbwd cases .*)$", help_text, flags=re.M)
    assert len(examples) >= 3
    for example in examples:
        result = cli(*shlex.split(example)[1:])
        assert result.exit_code == 0, (example, result.output)
        out = Path(shlex.split(example)[-1])
        assert (out / "manifest.json").is_file() and list(out.glob("*.npz")), example


def test_a_non_empty_directory_is_refused_and_left_alone(tmp_path, cli):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "mine.txt").write_text("keep me")
    assert_one_error(cli("cases", "-o", tmp_path / "suite"), r"suite: exists and is not empty")
    assert [p.name for p in (tmp_path / "suite").iterdir()] == ["mine.txt"]
    (tmp_path / "file").write_text("")
    assert_one_error(cli("cases", "-o", tmp_path / "file"), r"exists and is not a directory")
    assert_one_error(cli("cases", "-o", tmp_path / "no" / "suite"), r"parent .* does not exist")
    assert_one_error(cli("cases", "--dtype", "f64", "-o", tmp_path / "x"), r"--dtype", code=2)


def test_an_empty_directory_is_filled(tmp_path, cli):
    (tmp_path / "suite").mkdir()
    result = cli("cases", "--preset", "tiny", "-o", tmp_path / "suite")
    assert result.exit_code == 0 and "wrote" in result.output
    assert (tmp_path / "suite" / "manifest.txt").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["suite"]  # no temporary sibling left


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_a_failure_midway_leaves_nothing(tmp_path, cli, monkeypatch, error):
    calls = []

    def failing(arrays):
        calls.append(1)
        if len(calls) == 3:
            raise error
        return real(arrays)

    real = suite_files.npz_bytes
    monkeypatch.setattr(suite_files, "npz_bytes", failing)
    result = cli("cases", "-o", tmp_path / "suite")
    if isinstance(error, KeyboardInterrupt):
        assert result.exit_code == 130
    else:
        assert_one_error(result, r"output directory .*suite: write failed \(No space left on device\)")
    assert list(tmp_path.iterdir()) == []


def test_format_with_a_rank_keeps_those_cases_and_max_bytes_caps(tmp_path, cli):
    result = cli("cases", "--format", "nhwc", "--dtype", "F16", "--max-bytes", "200K", "-o", tmp_path / "s")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["settings"]["data_format"] == "NXC" and manifest["cases"]
    assert all(len(entry["shape"]) == 4 and entry["shape"][-1] == entry["channels"] for entry in manifest["cases"])
    assert sum(entry["bytes"] for entry in manifest["cases"]) <= 200 << 10
    reasons = {entry["name"]: entry["why"] for entry in manifest["left_out"]}
    assert "rank 3" in reasons["prime_m"] and "over --max-bytes" in reasons["large_m"]
    assert "left out" in result.output and "# left out: large_m" in (tmp_path / "s" / "manifest.txt").read_text()
    problem = _problem(tmp_path / "s", manifest["cases"][0])
    assert problem["src"].dtype == np.float16 and problem["data_format"] == "NXC"


def test_resnet50_preset_under_a_cap(tmp_path):
    """ResNet-50's shapes (only the small ones fit the cap here: the whole preset is ~100 MB)."""
    progress = []
    suite = app_cases.write_suite(app_cases.SuiteSettings(preset="resnet50", max_bytes=3 << 20), tmp_path / "r",
                                  lambda name, done, total: progress.append((name, done, total)))
    assert [c.spec.name for c in suite.cases] == [name for name, _, _ in progress]
    assert {c.spec.name for c in suite.cases} >= {"resnet50_c256_14x14", "resnet50_c512_7x7"}
    assert len(suite.cases) + len(suite.left_out) == len(app_cases.RESNET50_LAYERS) and progress[-1][2] == 12
    for written in suite.cases:
        problem = _problem(tmp_path / "r", {"file": written.file})
        assert _judge(problem, zoo.kernel(problem, "blocked")), written.spec.name


def test_no_case_fits_is_an_input_error(tmp_path, cli):
    assert_one_error(cli("cases", "--max-bytes", "100", "-o", tmp_path / "s"), r"no case fits")
    assert list(tmp_path.iterdir()) == []


def test_readme_loop_runs_as_printed_and_every_case_passes(tmp_path, cli, monkeypatch):
    """README's "Test suites for your kernel": its three commands, with docs/usage.md's kernel.py, in order (a `shell`
    block: tests/test_docs.py runs each `bnbwd` line of the bash blocks alone, and `check` needs kernel.py's
    outputs)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Test suites for your kernel"):readme.index("## Exit codes")]
    block = re.search(r"```shell\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert [command[:2] for command in commands] == [["bnbwd", "cases"], ["python", "kernel.py"], ["bnbwd", "check"]]
    usage = (Path(__file__).resolve().parent.parent / "docs" / "usage.md").read_text()
    kernel_section = usage[usage.index("## `bnbwd cases`"):usage.index("## Agreement with PyTorch")]
    (tmp_path / "kernel.py").write_text(re.search(r"```python\n(.*?)```", kernel_section, re.S).group(1))
    monkeypatch.chdir(tmp_path)
    assert cli(*commands[0][1:]).exit_code == 0
    monkeypatch.setattr("sys.argv", commands[1][1:])
    exec(compile((tmp_path / "kernel.py").read_text(), "kernel.py", "exec"), {"__name__": "__main__"})
    result = cli(*commands[2][1:])
    manifest = json.loads((tmp_path / "suite" / "manifest.json").read_text())
    assert result.exit_code == 0 and result.output.count("PASS ") == len(manifest["cases"]), result.output
    size = sum(case["bytes"] for case in manifest["cases"]) / 2**20
    assert f"{len(manifest['cases'])} small input bundles ({size:.1f} MiB in f32" in section  # README's numbers
