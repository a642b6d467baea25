"""`bnbwd verify` through the real CLI: one test per exit code, JSON, directories, --map."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import INPUT_NAMES, save_bundle


@pytest.fixture
def outputs(rng) -> dict[str, np.ndarray]:
    return {
        "diff_src": rng.standard_normal((2, 4, 3, 3)).astype(np.float32),
        "diff_gamma": rng.standard_normal(4).astype(np.float32),
        "diff_beta": rng.standard_normal(4).astype(np.float32),
    }


def test_exit_0_identical_outputs(cli, tmp_path, outputs):
    path = save_bundle(tmp_path / "out.npz", outputs)
    result = cli("verify", path, path)
    assert result.exit_code == 0, result.output
    assert "PASS: 3 output(s) within tolerance" in result.stdout
    assert "f32  atol=1e-05 rtol=1e-05 ulp=1 rel_l2=7.6e-06" in result.stdout  # defaults in the header
    assert result.stderr == ""


def test_exit_1_one_channel_off_points_at_channel(cli, tmp_path, outputs):
    actual = save_bundle(tmp_path / "out.npz", outputs)
    perturbed = {k: v.copy() for k, v in outputs.items()}
    perturbed["diff_src"][:, 2] += 1e-3
    perturbed["diff_src"][1, 2, 0, 2] += 0.5
    reference = save_bundle(tmp_path / "ref.npz", perturbed)
    result = cli("verify", actual, reference, "--format", "NCHW")
    assert result.exit_code == 1, result.output
    assert "FAIL (exit 1): numerical mismatch in diff_src" in result.stdout
    assert "Mismatched elements: 18 / 72 (25%), allowed 0" in result.stdout
    assert re.search(r"Channels with mismatches: 1 of \d+", result.stdout)  # the table points at c=2; no guess about why
    assert "a bad per-channel reduction" not in result.stdout and "hint:" not in result.stdout
    worst_row = result.stdout.split("Worst 10 elements")[1].splitlines()[3]
    assert worst_row.startswith("n=1 c=2 h=0 w=2")


def test_exit_1_becomes_0_with_tolerance_overrides(cli, tmp_path, outputs):
    actual = save_bundle(tmp_path / "out.npz", outputs)
    perturbed = {k: v.copy() for k, v in outputs.items()}
    perturbed["diff_gamma"][1] += 1e-3
    reference = save_bundle(tmp_path / "ref.npz", perturbed)
    assert cli("verify", actual, reference).exit_code == 1
    result = cli("verify", actual, reference, "--atol", "diff_gamma=2e-3", "--rel-l2", "diff_gamma=1e-2")
    assert result.exit_code == 0, result.output
    assert "f32  atol=0.002 rtol=1e-05 ulp=1 rel_l2=0.01 (overridden)" in result.stdout
    assert cli("verify", actual, reference, "--max-mismatch", "1", "--rel-l2", "1").exit_code == 0
    assert cli("verify", actual, reference, "--max-mismatch", "diff_gamma=25%", "--rel-l2", "1").exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--atol", "diff_gamma=abc"], "'diff_gamma=abc': 'abc' is not a number"),
        (["--rtol", "-1"], "must be a finite number >= 0"),
        (["--max-mismatch", "5x"], "expected a count (e.g. 5) or a percentage"),
        (["--map", "x_backprop"], "expected THEIRS=OURS"),
        (["--format", "NHCW"], "Invalid value for '--format'"),
        (["--atol", "diff_gama=1e-4"], "--atol names diff_gama, which is not an output"),
    ],
    ids=["atol-nan", "rtol-negative", "max-mismatch", "map", "format", "unknown-output"],
)
def test_exit_2_usage(cli, tmp_path, outputs, args, message):
    path = save_bundle(tmp_path / "out.npz", outputs)
    result = cli("verify", path, path, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_exit_3_missing_and_extra_keys(cli, tmp_path, outputs):
    reference = save_bundle(tmp_path / "ref.npz", outputs)
    actual = save_bundle(tmp_path / "out.npz", {"diff_src": outputs["diff_src"], "diff_gamma": outputs["diff_gamma"], "junk": outputs["diff_beta"]})
    result = cli("verify", actual, reference)
    assert result.exit_code == 3, result.output
    # the key of diff_beta's shape is suggested; as an extra key it is listed in one note, not an error
    assert "error: diff_beta: in reference, missing from actual; --map junk=diff_beta reads junk as it" in result.stderr
    assert "error: junk" not in result.stderr
    assert "note: not compared: junk (only in actual)" in result.stdout
    assert "MISSING" in result.stdout and "EXTRA" not in result.stdout


def test_brief_says_when_the_norm_test_decided(cli, tmp_path, outputs):
    """No element beyond atol, yet the output fails on ||a-r||/||r||: the one line must say why."""
    reference = save_bundle(tmp_path / "ref.npz", outputs)
    shifted = {**outputs, "diff_src": outputs["diff_src"] + np.float32(1e-3)}
    actual = save_bundle(tmp_path / "out.npz", shifted)
    result = cli("verify", actual, reference, "--atol", "diff_src=1e-2", "--brief")
    assert result.exit_code == 1, result.output
    line = next(line for line in result.stdout.splitlines() if line.startswith("diff_src:"))
    assert line.startswith("diff_src: FAIL 0/") and "; rel L2 " in line and "> 7.6e-06" in line, line


def test_brief_names_each_structural_problem_once_per_line(cli, tmp_path, outputs):
    reference = save_bundle(tmp_path / "ref.npz", outputs)
    actual = save_bundle(tmp_path / "out.npz", {"diff_src": outputs["diff_src"], "diff_gamma": outputs["diff_gamma"]})
    result = cli("verify", actual, reference, "--brief")
    assert result.exit_code == 3, result.output
    assert "diff_beta: MISSING (in reference, missing from actual)" in result.stdout.splitlines()


def test_exit_3_shape_mismatch_names_the_transpose(cli, tmp_path, outputs):
    reference = save_bundle(tmp_path / "ref.npz", outputs)
    actual = save_bundle(tmp_path / "out.npz", {**outputs, "diff_src": np.moveaxis(outputs["diff_src"], 1, -1)})
    result = cli("verify", actual, reference)
    assert result.exit_code == 3
    assert (
        "error: diff_src: actual has shape (2, 3, 3, 4), reference (2, 4, 3, 3); "
        "actual looks like the NHWC transpose of reference (NCHW)" in result.stderr
    )


def test_exit_3_unreadable_file_and_uncomparable_dtype(cli, tmp_path, outputs):
    good = save_bundle(tmp_path / "out.npz", outputs)
    result = cli("verify", str(tmp_path / "nope.npz"), good)
    assert result.exit_code == 3 and "nope.npz" in result.stderr and result.stderr.startswith("error: ")
    ints = tmp_path / "diff_src.npy"
    np.save(ints, outputs["diff_src"].astype(np.int32))
    result = cli("verify", str(ints), good, "--only", "diff_src")
    assert result.exit_code == 3
    assert "diff_src: actual has dtype int32, which cannot be compared" in result.stderr


def test_json_to_stdout_parses_and_keeps_exit_code(cli, tmp_path, outputs):
    actual = save_bundle(tmp_path / "out.npz", outputs)
    perturbed = {**outputs, "diff_beta": outputs["diff_beta"] + np.float32(1.0)}
    reference = save_bundle(tmp_path / "ref.npz", perturbed)
    result = cli("verify", actual, reference, "--json", "-")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["schema_version"] == 4 and document["status"] == "mismatch"
    assert [o["status"] for o in document["outputs"]] == ["pass", "pass", "mismatch"]  # one vocabulary, no "fail"


def test_json_to_file_alongside_report(cli, tmp_path, outputs):
    path = save_bundle(tmp_path / "out.npz", outputs)
    target = tmp_path / "report.json"
    result = cli("verify", path, path, "--json", str(target))
    assert result.exit_code == 0 and "PASS" in result.stdout
    assert json.loads(target.read_text())["exit_code"] == 0


def test_directory_of_npy_against_npz_and_bf16_from_v2(cli, tmp_path, outputs):
    directory = tmp_path / "kernel_out"
    directory.mkdir()
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in outputs.items()}
    for key, value in bf16.items():
        np.save(directory / f"{key}.npy", value)  # stored as |V2
    reference = save_bundle(tmp_path / "ref.npz", outputs)
    result = cli("verify", str(directory), reference, "-v")
    assert result.exit_code == 0, result.output
    assert "bf16/f32" in result.stdout
    assert re.search(r"bf16\s+atol=0\.01 rtol=0\.016 ulp=1", result.stdout)  # the coarser dtype's tolerances


def test_map_only_ignore(cli, tmp_path, outputs):
    tf_names = {"x_backprop": outputs["diff_src"], "scale_backprop": outputs["diff_gamma"], "offset_backprop": outputs["diff_beta"]}
    actual = save_bundle(tmp_path / "tf.npz", tf_names)
    reference = save_bundle(tmp_path / "ref.npz", outputs)
    aliases = cli("verify", actual, reference)  # TensorFlow's output names are matched without a map
    assert aliases.exit_code == 0 and "x_backprop=diff_src" in aliases.stdout, aliases.output
    renamed = save_bundle(tmp_path / "mine.npz", {"dx": outputs["diff_src"], "diff_gamma": outputs["diff_gamma"]})
    assert cli("verify", renamed, reference, "--ignore", "diff_beta").exit_code == 3  # dx is not diff_src without a map
    assert cli("verify", renamed, reference, "--ignore", "diff_beta", "--map", "dx=diff_src").exit_code == 0
    assert cli("verify", reference, renamed, "--map", "dx=diff_src").exit_code == 0  # the same direction either side
    mapped = cli(
        "verify", actual, reference, "--map", "x_backprop=diff_src", "--map", "scale_backprop=diff_gamma", "--map", "offset_backprop=diff_beta"
    )
    assert mapped.exit_code == 0, mapped.output
    assert "x_backprop=diff_src" in mapped.stdout
    partial = cli("verify", actual, reference, "--map", "x_backprop=diff_src", "--only", "diff_src")
    assert partial.exit_code == 0, partial.output
    ignored = cli("verify", actual, reference, "--map", "x_backprop=diff_src", "--ignore", "scale_backprop,offset_backprop,diff_gamma,diff_beta")
    assert ignored.exit_code == 0, ignored.output


def test_no_colour_when_not_a_terminal(cli, tmp_path, outputs):
    path = save_bundle(tmp_path / "out.npz", outputs)
    assert "\x1b[" not in cli("verify", path, path).stdout


def test_help_states_defaults_and_bf16(cli):
    result = cli("verify", "--help")
    assert result.exit_code == 0
    for text in ("bf16  atol=0.01 rtol=0.016 ulp=1 rel_l2=0.016", "|V2", "bfloat16", "Examples:", "--map"):
        assert text in result.stdout


def _inputs_case(tmp_path, bug=None):
    """A bundle of inputs, bnbwd's outputs, and a zoo kernel's outputs (correct, or with a planted bug)."""
    from tests.oracle import backward_arrays
    from tools import zoo

    problem = zoo.make_problem(np.random.default_rng(5), (4, 8, 16, 16), "NCX", np.float32, np.float32)
    bundle = save_bundle(tmp_path / "inputs.npz", {k: problem[k] for k in INPUT_NAMES}, epsilon=problem["epsilon"],
                         data_format="NCHW")
    ours = backward_arrays(*(problem[k] for k in INPUT_NAMES), epsilon=problem["epsilon"], data_format="NCX")
    reference = save_bundle(tmp_path / "ref.npz", {k: getattr(ours, k) for k in ("diff_src", "diff_gamma", "diff_beta")})
    return bundle, save_bundle(tmp_path / "kernel.npz", zoo.kernel(problem, bug=bug)), reference


def test_verify_inputs_passes_a_correct_kernel_and_says_how(cli, tmp_path):
    bundle, kernel, ref = _inputs_case(tmp_path)
    result = cli("verify", kernel, ref, "--inputs", bundle)
    assert result.exit_code == 0, result.output
    assert "scaled by the problem" in result.stdout and "K = 16 units" in result.stdout
    assert "diff_src: FAIL" not in result.stdout  # passing: no details


def test_verify_inputs_fails_a_wrong_epsilon_and_names_it(cli, tmp_path):
    bundle, kernel, ref = _inputs_case(tmp_path, bug="epsilon-1e-3")
    result = cli("verify", kernel, ref, "--inputs", bundle, "--json", "-")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    gamma = next(o for o in document["outputs"] if o["name"] == "diff_gamma")["comparison"]
    assert gamma["rule"] == "scaled" and any("epsilon of 0.001" in h["evidence"] for h in gamma["hints"])
    run = cli("run", bundle, "-q", "--reference", kernel)  # the same judgement from run
    assert run.exit_code == 1 and "an epsilon of 0.001 (you passed 1e-05)" in run.stdout


def test_max_units_and_no_bias_check_change_the_verdict(cli, tmp_path):
    bundle, kernel, ref = _inputs_case(tmp_path, bug="unbiased-variance")
    assert cli("verify", kernel, ref, "--inputs", bundle).exit_code == 1
    relaxed = cli("verify", kernel, ref, "--inputs", bundle, "--max-units", "1e9", "--no-bias-check", "--brief")
    assert relaxed.exit_code == 0, relaxed.output
    assert "diff_src: PASS max" in relaxed.stdout and "(not checked)" in relaxed.stdout


def test_explicit_atol_wins_over_the_scaled_rule(cli, tmp_path):
    bundle, kernel, ref = _inputs_case(tmp_path)
    result = cli("verify", kernel, ref, "--inputs", bundle, "--atol", "diff_gamma=1", "--json", "-")
    rules = {o["name"]: o["comparison"]["rule"] for o in json.loads(result.stdout)["outputs"]}
    assert rules == {"diff_src": "scaled", "diff_gamma": "fixed", "diff_beta": "scaled"}


def test_without_inputs_the_report_says_sums_need_them(cli, tmp_path):
    _, kernel, ref = _inputs_case(tmp_path)
    result = cli("verify", kernel, ref)
    assert "note: diff_gamma, diff_beta are sums over M elements" in result.stdout


def test_inputs_options_need_inputs_and_a_bad_bundle_is_exit_3(cli, tmp_path):
    bundle, kernel, ref = _inputs_case(tmp_path)
    usage = cli("verify", kernel, ref, "--epsilon", "1e-3")
    assert usage.exit_code == 2 and "give --inputs BUNDLE" in usage.stderr
    bad = tmp_path / "bad.npz"
    np.savez(bad, src=np.zeros((2, 3), np.float32))
    result = cli("verify", kernel, ref, "--inputs", str(bad), "--epsilon", "1e-5")
    assert result.exit_code == 3 and result.stderr.startswith("error: missing inputs diff_dst, mean, variance"), \
        result.stderr
    no_eps = tmp_path / "noeps.npz"
    with np.load(bundle) as z:
        np.savez(no_eps, **{k: z[k] for k in z.files if k != "epsilon"})
    missing = cli("verify", kernel, ref, "--inputs", str(no_eps))
    assert missing.exit_code == 3 and "give --epsilon" in missing.stderr


def test_numbers_are_not_cut_at_80_columns(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    bundle, kernel, ref = _inputs_case(tmp_path, bug="sign-flip-one-channel")
    result = cli("verify", kernel, ref, "--inputs", bundle)
    assert result.exit_code == 1
    assert "…" not in result.stdout and "sign flipped in channel(s) c=0" in result.stdout
