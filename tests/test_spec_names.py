"""Every spec's names for the op's inputs and outputs (docs/usage.md's table) through run, verify and check: read
without flags, each output judged as the output it is (its own K), the spec's defaults applied; and float64
statistics with float32 data through the same commands."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bnbwd_cli
from tools import zoo
from tests.conftest import assert_one_error, make_inputs, save_bundle

CANONICAL = ("src", "diff_dst", "mean", "variance", "gamma", "beta")
OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")
K = {"diff_src": 16.0, "diff_gamma": 5.0, "diff_beta": 5.0}  # docs/tolerances.md


# spec -> (its names for CANONICAL (None: not an input of the spec), its names for OUTPUTS, format, epsilon entry)
SPECS = {
    "ngraph": (("input", "normalized_delta", "mean", "variance", "gamma", "beta"),
               ("input_delta", "gamma_delta", "beta_delta"), "NCHW", 1e-5),
    "openvino": (("input_forward", "output_delta", "mean", "variance", "gamma", None),
                 ("input_delta", "gamma_delta", "beta_delta"), "NHWC", 1e-5),
    "onednn": (("src", "diff_dst", "mean", "variance", "gamma", None), OUTPUTS, "NHWC", 1e-5),
    "tensorflow": (("x", "y_backprop", "reserve_space_1", "reserve_space_2", "scale", None),
                   ("x_backprop", "scale_backprop", "offset_backprop"), "NHWC", None),  # epsilon: its default 1e-4
    "pytorch": (("input", "grad_output", "save_mean", "save_invstd", "weight", "bias"),
                ("grad_input", "grad_weight", "grad_bias"), "NCHW", None),  # save_invstd: no epsilon needed
}
DEFAULT_EPSILON = {"tensorflow": 1e-4}


def _spec_case(rng, spec: str) -> tuple[dict, dict]:
    """(bundle by the spec's input names, kernel outputs by its output names), the outputs bnbwd's own."""
    names, output_names, fmt, epsilon = SPECS[spec]
    shape = (2, 3, 4, 5) if fmt == "NCHW" else (2, 4, 5, 3)
    arrays = make_inputs(rng, shape, "NCX" if fmt == "NCHW" else "NXC")
    if spec == "pytorch":
        arrays["variance"] = (1 / np.sqrt(arrays["variance"].astype(np.float64) + 1e-5)).astype(np.float32)
    grads = bnbwd_cli.backward(*(arrays[k] for k in CANONICAL[:5]), data_format=fmt, variance_is_invstd=spec == "pytorch",
                               epsilon=epsilon or DEFAULT_EPSILON.get(spec, 1e-5))
    bundle = {name: arrays[canonical] for canonical, name in zip(CANONICAL, names) if name is not None}
    if epsilon is not None:
        bundle["epsilon"] = np.array(epsilon)
    return bundle, {name: grads[canonical] for canonical, name in zip(OUTPUTS, output_names)}


def _by_output(result) -> dict[str, tuple[str, float, str]]:
    """Reference key -> (actual key, K, status) from a --json document."""
    document = json.loads(result.stdout)
    return {o["reference_key"]: (o["actual_key"], o["comparison"]["scaled"]["max_units"], o["status"])
            for o in document["outputs"]}


@pytest.mark.parametrize("spec", SPECS)
def test_run_reference_reads_every_specs_names(cli, rng, tmp_path, spec):
    bundle, outputs = _spec_case(rng, spec)
    output_names = SPECS[spec][1]
    path, kernel = save_bundle(tmp_path / "in.npz", bundle), save_bundle(tmp_path / "k.npz", outputs)
    result = cli("run", path, "--spec", spec, "-q", "--reference", kernel, "--json", "-")
    assert result.exit_code == 0, result.output
    assert _by_output(result) == {canonical: (name, K[canonical], "pass") for canonical, name in zip(OUTPUTS, output_names)}
    for canonical, name in zip(OUTPUTS, output_names):  # each name is judged as its own output: 1% off fails it
        wrong = save_bundle(tmp_path / "w.npz", {**outputs, name: outputs[name] * np.float32(1.01)})
        failed = cli("run", path, "--spec", spec, "-q", "--reference", wrong, "--json", "-")
        assert failed.exit_code == 1, failed.output
        assert {k: v[2] for k, v in _by_output(failed).items()} == {o: "mismatch" if o == canonical else "pass" for o in OUTPUTS}


@pytest.mark.parametrize("spec", SPECS)
def test_verify_with_inputs_reads_every_specs_names(cli, rng, tmp_path, spec):
    bundle, outputs = _spec_case(rng, spec)
    path, kernel = save_bundle(tmp_path / "in.npz", bundle), save_bundle(tmp_path / "k.npz", outputs)
    reference = tmp_path / "ref.npz"
    made = cli("run", path, "--spec", spec, "-q", "-o", reference)
    assert made.exit_code == 0, made.output
    with np.load(reference) as written:
        assert sorted(written.files) == sorted(OUTPUTS)  # run writes bnbwd's names whatever the spec's
        for canonical, name in zip(OUTPUTS, SPECS[spec][1]):
            assert np.array_equal(written[canonical], outputs[name])
    # verify has no --spec: the names alone say which input and output each key is
    settings = ["--format", SPECS[spec][2], *(["--epsilon", str(DEFAULT_EPSILON[spec])] if spec in DEFAULT_EPSILON else [])]
    result = cli("verify", kernel, reference, "--inputs", path, *settings, "--json", "-")
    assert result.exit_code == 0, result.output
    assert {k: (v[1], v[2]) for k, v in _by_output(result).items()} == {o: (K[o], "pass") for o in OUTPUTS}


@pytest.mark.parametrize("spec", SPECS)
def test_check_reads_a_case_in_every_specs_names(cli, rng, tmp_path, spec):
    bundle, outputs = _spec_case(rng, spec)
    case = save_bundle(tmp_path / "case.npz", {**bundle, **outputs})
    result = cli("check", case, "--spec", spec, "--format", SPECS[spec][2])
    assert result.exit_code == 0, result.output
    bad = save_bundle(tmp_path / "bad.npz", {**bundle, **outputs, SPECS[spec][1][1]: outputs[SPECS[spec][1][1]] * 2})
    assert cli("check", bad, "--spec", spec, "--format", SPECS[spec][2]).exit_code == 1


@pytest.mark.parametrize("spec", SPECS)
def test_the_api_reads_every_specs_names(rng, spec):
    bundle, outputs = _spec_case(rng, spec)
    inputs = {k: v for k, v in bundle.items() if k != "epsilon"}
    epsilon = bundle.get("epsilon", DEFAULT_EPSILON.get(spec))
    report = bnbwd_cli.check(outputs, **inputs, epsilon=None if epsilon is None else float(epsilon),
                             data_format=SPECS[spec][2], spec=spec)
    assert report.status == "pass", report.text
    assert {row.reference_key: (row.actual_key, row.comparison.scaled.max_units) for row in report.result.outputs} == \
        {canonical: (name, K[canonical]) for canonical, name in zip(OUTPUTS, SPECS[spec][1])}


# ---------------------------------------------------------------- float64 statistics with float32 data


@pytest.fixture
def f64_stats(tmp_path):
    problem = zoo.make_problem(np.random.default_rng(8), (4, 6, 5, 5), "NCX", np.float32, np.float64)
    inputs = {k: problem[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")}
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=problem["epsilon"], data_format="NCHW")
    return problem, bundle


def test_float64_statistics_with_float32_data_through_run(cli, tmp_path, f64_stats):
    problem, bundle = f64_stats
    assert cli("run", bundle, "-q", "-o", tmp_path / "ref.npz").exit_code == 0
    with np.load(tmp_path / "ref.npz") as written:
        assert {k: written[k].dtype for k in written.files} == {"diff_src": np.float32, "diff_gamma": np.float64,
                                                                 "diff_beta": np.float64}
    kernel = save_bundle(tmp_path / "k.npz", zoo.kernel(problem, "sequential"))  # float32 sums written as float64
    result = cli("run", bundle, "-q", "--reference", kernel, "--json", "-")
    assert result.exit_code == 0, result.output
    assert {k: (v[1], v[2]) for k, v in _by_output(result).items()} == {o: (K[o], "pass") for o in OUTPUTS}
    verified = cli("verify", kernel, tmp_path / "ref.npz", "--inputs", bundle)
    assert verified.exit_code == 0, verified.output


def test_float64_statistics_with_float32_data_still_catch_a_bug(cli, tmp_path, f64_stats):
    problem, bundle = f64_stats
    for bug in ("epsilon-1e-3", "missing-1/M", "unbiased-variance"):
        kernel = save_bundle(tmp_path / "k.npz", zoo.kernel(problem, "sequential", bug=bug))
        assert cli("run", bundle, "-q", "--reference", kernel).exit_code == 1, bug


@pytest.mark.parametrize("spec, rounded", [("generic", False), ("ngraph", False), ("openvino", True), ("onednn", True),
                                           ("tensorflow", True), ("pytorch", False)])
def test_the_specs_that_type_epsilon_f32_round_it(cli, rng, tmp_path, spec, rounded):
    bundle = save_bundle(tmp_path / "in.npz", make_inputs(rng, (2, 3, 4, 4)), epsilon=1e-5)
    result = cli("run", bundle, "--spec", spec, "--format", "NCHW", "-q", "-o", tmp_path / "o.npz", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["epsilon"] == (float(np.float32(1e-5)) if rounded else 1e-5)


@pytest.mark.parametrize("spec, smallest, refused, pattern", [
    ("generic", "5e-324", "0", r"epsilon is 0\.0, expected a finite number > 0"),
    ("onednn", "1e-45", "1e-46", r"epsilon 1e-46 is 0 as float32 \(spec onednn types it f32\)"),
])
def test_epsilons_lower_limit_per_spec(cli, rng, tmp_path, spec, smallest, refused, pattern):
    """The smallest positive epsilon (float32's, where the spec types it f32) is taken; zero, or what rounds to it,
    is refused."""
    bundle = save_bundle(tmp_path / "in.npz", make_inputs(rng, (2, 3, 4, 4)))
    run = ["run", bundle, "--spec", spec, "--format", "NCHW", "-q", "-o", tmp_path / "o.npz", "--epsilon"]
    assert_one_error(cli(*run, refused), pattern)
    assert not (tmp_path / "o.npz").exists()
    assert cli(*run, smallest).exit_code == 0


# ---------------------------------------------------------------- each spec's rules, table by table

FLOATS = {"f16": np.float16, "bf16": zoo.BF16, "f32": np.float32, "f64": np.float64}
# spec -> the (data, statistics) pairs it allows (docs/usage.md); generic allows every pair
ALLOWED_TYPES = {
    "ngraph": {(t, t) for t in FLOATS},
    "openvino": {("f32", "f32"), ("f16", "f32"), ("bf16", "f32"), ("bf16", "bf16")},
    "onednn": {("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16"), ("f16", "f32")},
    "tensorflow": {("f32", "f32"), ("f16", "f32"), ("bf16", "f32")},
    "pytorch": {("f64", "f64"), ("f32", "f32"), ("f16", "f32"), ("bf16", "f32"), ("f16", "f16"), ("bf16", "bf16")},
    "generic": {(a, b) for a in FLOATS for b in FLOATS},
}


@pytest.mark.parametrize("spec", ALLOWED_TYPES)
def test_each_spec_allows_exactly_its_dtype_pairs(rng, spec):
    for data in FLOATS:
        for stats in FLOATS:
            arrays = make_inputs(rng, (2, 3, 2, 2), "NCX", dtype=FLOATS[data], stats_dtype=FLOATS[stats])
            call = {k: arrays[k] for k in CANONICAL}
            if (data, stats) in ALLOWED_TYPES[spec]:
                assert set(bnbwd_cli.backward(**call, epsilon=1e-3, data_format="NCHW", spec=spec)) == set(OUTPUTS)
            else:
                with pytest.raises(bnbwd_cli.InputError, match=f"spec {spec} does not allow src {data}"):
                    bnbwd_cli.backward(**call, epsilon=1e-3, data_format="NCHW", spec=spec)


@pytest.mark.parametrize("spec, data_format, left_out, pattern", [
    ("ngraph", "NCHW", "beta", "missing input beta \\(spec ngraph\\)"),
    ("ngraph", "NCHW", "gamma", "missing input gamma \\(spec ngraph\\)"),
    ("tensorflow", "NHWC", "gamma", "missing input gamma \\(spec tensorflow\\)"),
    ("ngraph", "NHWC", None, "data_format NHWC is not allowed by spec ngraph"),
    ("tensorflow", "NCX", None, "data_format NCX is not allowed by spec tensorflow"),
])
def test_each_spec_requires_its_inputs_and_layouts(rng, spec, data_format, left_out, pattern):
    arrays = make_inputs(rng, (2, 3, 2, 2), "NCX" if data_format.startswith("NC") else "NXC")
    call = {k: arrays[k] for k in CANONICAL if k != left_out}
    with pytest.raises(bnbwd_cli.InputError, match=pattern):
        bnbwd_cli.backward(**call, epsilon=1e-3, data_format=data_format, spec=spec)
    if left_out is None:
        return
    assert set(bnbwd_cli.backward(**call, epsilon=1e-3, data_format=data_format)) == set(OUTPUTS)  # generic: optional


def test_onednn_makes_both_parameter_gradients_or_neither(cli, rng, tmp_path):
    bundle = save_bundle(tmp_path / "in.npz", make_inputs(rng, (2, 3, 4, 4)), epsilon=1e-5)
    run = ["run", bundle, "--spec", "onednn", "--format", "NCHW", "-q", "-o", tmp_path / "o.npz", "--outputs"]
    assert_one_error(cli(*run, "diff_src,diff_gamma"), "spec onednn produces diff_gamma and diff_beta both or neither")
    assert cli(*run, "diff_src").exit_code == 0
    assert cli(*run, "diff_gamma,diff_beta").exit_code == 0
