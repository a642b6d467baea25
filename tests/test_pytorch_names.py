"""PyTorch's names (input, grad_output, weight, bias, save_mean, save_invstd, running_mean, running_var;
grad_input, grad_weight, grad_bias) through run, verify and check: recognised without flags, the statistics
by mode, save_invstd read as an invstd; a missing input's suggested --map; an unused gamma-like key an error."""

from __future__ import annotations

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import make_inputs, save_bundle

EPS = 1e-5


def torch_dump(rng, shape=(3, 4, 5, 2), training=True) -> tuple[dict, dict]:
    """A PyTorch-named dump of one BatchNorm2d backward: (inputs, outputs), NCHW."""
    x = make_inputs(rng, shape)
    invstd = (1 / np.sqrt(x["variance"].astype(np.float64) + EPS)).astype(np.float32)
    running_mean, running_var = (x["mean"] * 0.9).astype(np.float32), (x["variance"] * 1.1).astype(np.float32)
    inputs = {"input": x["src"], "grad_output": x["diff_dst"], "weight": x["gamma"], "bias": x["beta"],
              "save_mean": x["mean"], "save_invstd": invstd, "running_mean": running_mean, "running_var": running_var}
    if training:
        grads = bnbwd_cli.backward(x["src"], x["diff_dst"], x["mean"], invstd, x["gamma"], epsilon=EPS,
                                   data_format="NCHW", variance_is_invstd=True)
    else:
        grads = bnbwd_cli.backward(x["src"], x["diff_dst"], running_mean, running_var, x["gamma"], epsilon=EPS,
                                   data_format="NCHW", training=False)
    outputs = {"grad_input": grads["diff_src"], "grad_weight": grads["diff_gamma"], "grad_bias": grads["diff_beta"]}
    return inputs, outputs


def npy_folder(directory, arrays: dict) -> str:
    directory.mkdir()
    for key, array in arrays.items():
        np.save(directory / f"{key}.npy", array)
    return str(directory)


def test_a_folder_of_pytorch_npy_dumps_passes_with_format_alone(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng)
    folder = npy_folder(tmp_path / "dump", {**inputs, **outputs})
    result = cli("check", folder, "--format", "NCHW")
    assert result.exit_code == 0, result.output
    line = result.stdout.splitlines()[0]
    assert line.startswith(f"PASS  {folder}: grad_input=diff_src 0 units, grad_weight=diff_gamma 0 units, grad_bias=diff_beta")
    assert "not used: running_mean, running_var" in line  # the statistics of the other mode, named
    wrong = npy_folder(tmp_path / "wrong", {**inputs, **outputs, "grad_input": outputs["grad_input"] * np.float32(1.01)})
    assert cli("check", wrong, "--format", "NCHW").exit_code == 1


def test_run_reference_and_verify_read_pytorch_names(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng)
    bundle = save_bundle(tmp_path / "in.npz", inputs)
    kernel = save_bundle(tmp_path / "kernel.npz", outputs)
    result = cli("run", bundle, "--spec", "pytorch", "-q", "--reference", kernel)  # NCHW: the profile's default
    assert result.exit_code == 0, result.output
    assert "grad_input=diff_src" in result.stdout and "PASS: 3 output(s)" in result.stdout
    ref = tmp_path / "ref.npz"
    assert cli("run", bundle, "--format", "NCHW", "-q", "-o", ref).exit_code == 0
    verified = cli("verify", kernel, ref, "--inputs", bundle, "--format", "NCHW")
    assert verified.exit_code == 0, verified.output
    bad = save_bundle(tmp_path / "bad.npz", {**outputs, "grad_weight": outputs["grad_weight"] * 2})
    assert cli("verify", bad, ref, "--inputs", bundle, "--format", "NCHW").exit_code == 1
    assert cli("run", bundle, "--format", "NCHW", "-q", "--reference", bad).exit_code == 1


def test_save_invstd_implies_variance_is_invstd_and_epsilon_is_not_needed(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng)
    case = save_bundle(tmp_path / "case.npz", {**inputs, **outputs})
    assert cli("check", case, "--format", "NCHW").exit_code == 0
    as_variance = {k: v for k, v in inputs.items() if k != "save_invstd"} | {"variance": inputs["save_invstd"]}
    wrong = save_bundle(tmp_path / "var.npz", {**as_variance, **outputs})
    assert cli("check", wrong, "--format", "NCHW", "--epsilon", EPS).exit_code == 1  # the same array as a variance


def test_statistics_by_mode_inference_reads_running_ones(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng, training=False)
    case = save_bundle(tmp_path / "case.npz", {**inputs, **outputs}, epsilon=EPS)
    assert cli("check", case, "--format", "NCHW", "--inference").exit_code == 0
    marked = save_bundle(tmp_path / "marked.npz", {**inputs, **outputs}, epsilon=EPS, is_training=False)
    result = cli("check", marked, "--format", "NCHW")  # the file's own is_training, no flag
    assert result.exit_code == 0, result.output
    assert "not used: save_mean, save_invstd" in result.stdout
    assert cli("check", case, "--format", "NCHW").exit_code == 1  # judged as training: the batch's stats


def test_only_the_other_modes_statistics_say_which_mode_reads_them(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng, training=False)
    running_only = {k: v for k, v in inputs.items() if not k.startswith("save_")}
    bundle = save_bundle(tmp_path / "in.npz", running_only, epsilon=EPS)
    result = cli("run", bundle, "--format", "NCHW", "-q")
    assert result.exit_code == 3
    assert result.stderr.strip() == ("error: missing inputs mean, variance (spec generic): no arrays by these names or a "
                                     "spec's names for them; running_mean, running_var are PyTorch's statistics for "
                                     "inference; --inference if the kernel ran in inference, or --map running_mean=mean "
                                     "--map running_var=variance to use them")
    assert cli("run", bundle, "--format", "NCHW", "-q", "--inference").exit_code == 0


@pytest.mark.parametrize("command", ["run", "verify", "check"])
def test_an_unused_gamma_like_key_is_an_error_unless_ignored(cli, rng, tmp_path, command):
    inputs, outputs = torch_dump(rng)
    inputs["bn1.weight"] = inputs.pop("weight")
    case = save_bundle(tmp_path / "case.npz", {**inputs, **outputs})
    args = {"run": ["run", case, "-q", "--reference", case],
            "verify": ["verify", case, case, "--inputs", case],
            "check": ["check", case]}[command]
    result = cli(*args, "--format", "NCHW")
    assert result.exit_code == 3, result.output
    message = ("'bn1.weight' looks like gamma but it is not read; without gamma, gamma = 1 is assumed; "
               "--map bn1.weight=gamma reads it as gamma, --ignore bn1.weight leaves it out")
    assert message in (result.stdout if command == "check" else result.stderr)
    ignored = cli(*args, "--format", "NCHW", "--ignore", "bn1.weight")
    # gamma = 1 then: bnbwd's outputs disagree with the kernel's (verify compares the file with itself)
    assert ignored.exit_code == (0 if command == "verify" else 1), ignored.output
    mapped = cli(*args, "--format", "NCHW", "--map", "bn1.weight=gamma")
    assert mapped.exit_code == 0, mapped.output


def test_a_missing_input_suggests_a_map_by_shape_and_name(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng)
    renamed = {("upstream" if k == "grad_output" else k): v for k, v in inputs.items()}
    case = save_bundle(tmp_path / "case.npz", {**renamed, **outputs, "loss": np.float32(1)})
    result = cli("check", case, "--format", "NCHW")
    assert result.exit_code == 3
    assert result.stdout.startswith(f"ERROR {case}: missing input diff_dst (spec generic): no array named 'diff_dst' "
                                    "or a spec's name for it; --map upstream=diff_dst reads upstream (3, 4, 5, 2) as it")
    assert cli("check", case, "--format", "NCHW", "--map", "upstream=diff_dst").exit_code == 0


def test_a_missing_output_suggests_a_map_by_shape(cli, rng, tmp_path):
    inputs, outputs = torch_dump(rng)
    bundle = save_bundle(tmp_path / "in.npz", inputs)
    kernel = save_bundle(tmp_path / "kernel.npz", {"result": outputs["grad_input"], "grad_weight": outputs["grad_weight"],
                                                   "grad_bias": outputs["grad_bias"]})
    result = cli("run", bundle, "--format", "NCHW", "-q", "--reference", kernel)
    assert result.exit_code == 3
    assert ("error: diff_src: missing from actual, the kernel's outputs; --map result=diff_src reads result as it; "
            "to judge only the outputs the kernel gave: --only diff_gamma,diff_beta") in result.stderr


def test_pytorch_profile_rules(cli, rng, tmp_path):
    from bnbwd_cli.spec import PROFILES, looks_like_gamma

    profile = PROFILES["pytorch"]
    assert profile.default_format == "NCX" and profile.default_epsilon is None
    assert [looks_like_gamma(k) for k in ("weight", "bn1.weight", "gamma_0", "Scale", "layer2_bn_weight")] == [True] * 5
    assert [looks_like_gamma(k) for k in ("weight_decay", "grad", "weights_tmp", "gammaray")] == [False] * 4
    inputs, _ = torch_dump(rng)
    f64 = save_bundle(tmp_path / "f64.npz", {k: v.astype(np.float64) if k in ("input", "grad_output") else v
                                             for k, v in inputs.items()})
    result = cli("run", f64, "--spec", "pytorch", "-q")
    assert result.exit_code == 3 and "spec pytorch does not allow src f64 with mean/variance f32" in result.stderr
