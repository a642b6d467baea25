"""Names fixed in one try: every missing input and output in one error with the whole --map line that reads them
(guessed by shape and name), a kernel that wrote no NAME.out.npz said so, and PyTorch's names read channels-first.

Through the real CLI: a JAX user's file (x, dy, var, dx, dgamma, dbeta), or its two files under run --reference,
gets its verdict in two runs, the second with the --map line the first printed; a PyTorch dump folder in one run
without --format.
"""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import assert_one_error, make_inputs, save_bundle

EPS = 1e-5


def _problem(rng, shape=(4, 6, 5, 6)):
    inputs = {k: v for k, v in make_inputs(rng, shape).items() if k in ("src", "diff_dst", "mean", "variance", "gamma")}
    return inputs, bnbwd_cli.backward(**inputs, epsilon=EPS, data_format="NCHW")


def _jax_names(inputs: dict, grads: dict) -> dict:
    return {"x": inputs["src"], "dy": inputs["diff_dst"], "mean": inputs["mean"], "var": inputs["variance"],
            "gamma": inputs["gamma"], "dx": grads["diff_src"], "dgamma": grads["diff_gamma"], "dbeta": grads["diff_beta"]}


def test_a_jax_users_file_gets_its_verdict_in_two_runs(cli, rng, tmp_path):
    inputs, grads = _problem(rng)
    grads["diff_beta"] = grads["diff_beta"] * np.float32(1.5)  # a verdict to reach: this kernel is wrong
    case = save_bundle(tmp_path / "jax.npz", _jax_names(inputs, grads), epsilon=EPS, data_format="NCHW")
    first = cli("check", case)
    assert first.exit_code == 3
    line = first.stdout.splitlines()[0]
    assert line.startswith(f"ERROR {case}: missing inputs diff_dst, variance and the kernel's outputs (diff_src, "
                           "diff_gamma, diff_beta) (spec generic): no arrays by these names"), line
    maps = re.search(r"; ((?:--map \S+ ?)+) reads them", line).group(1)
    assert maps.split() == shlex.split("--map dy=diff_dst --map var=variance --map dx=diff_src --map dgamma=diff_gamma "
                                       "--map dbeta=diff_beta")
    second = cli("check", case, *maps.split())
    assert second.exit_code == 1 and "dbeta=diff_beta FAIL" in second.stdout, second.output


def test_a_jax_users_two_files_get_their_verdict_in_two_runs(cli, rng, tmp_path):
    """run --reference with the inputs in one file and the kernel's outputs in another, both by JAX's names: the
    first error names the missing inputs and outputs together (it named the inputs, then a run later the outputs,
    then one output a time), and its --map line gives the verdict in the second run."""
    inputs, grads = _problem(rng)
    grads["diff_beta"] = grads["diff_beta"] * np.float32(1.5)
    names = _jax_names(inputs, grads)
    bundle = save_bundle(tmp_path / "in.npz", {k: names[k] for k in ("x", "dy", "mean", "var", "gamma")},
                         epsilon=EPS, data_format="NCHW")
    kernel = save_bundle(tmp_path / "out.npz", {k: names[k] for k in ("dx", "dgamma", "dbeta")})
    first = cli("run", bundle, "-q", "--reference", kernel)
    assert_one_error(first, r"^error: missing inputs diff_dst, variance and the kernel's outputs \(diff_src, "
                     r"diff_gamma, diff_beta\) \(spec generic\): no arrays by these names or a spec's names for them; "
                     r"(--map \S+ )+reads them \(guessed by shape and name\)$")
    maps = re.search(r"; ((?:--map \S+ ?)+) reads them", first.stderr).group(1)
    assert maps.split() == shlex.split("--map dy=diff_dst --map var=variance --map dx=diff_src --map dgamma=diff_gamma "
                                       "--map dbeta=diff_beta")
    second = cli("run", bundle, "-q", "--reference", kernel, *maps.split(), "--brief")
    assert second.exit_code == 1 and "dbeta=diff_beta: FAIL" in second.stdout, second.output
    # the inputs right, the outputs by unknown names: every output's --map in the one error (it gave dx's alone)
    outputs_only = cli("run", bundle, "-q", "--reference", kernel, *maps.split()[:4])
    assert_one_error(outputs_only, r"; --map dx=diff_src --map dgamma=diff_gamma --map dbeta=diff_beta reads them "
                     r"\(guessed by shape and name\)$")


def test_outputs_by_unknown_names_get_their_maps(cli, rng, tmp_path):
    inputs, grads = _problem(rng)
    case = save_bundle(tmp_path / "c.npz", {**inputs, "dx": grads["diff_src"], "dgamma": grads["diff_gamma"],
                                             "dbeta": grads["diff_beta"]}, epsilon=EPS, data_format="NCHW")
    result = cli("check", case)
    assert result.exit_code == 3
    assert result.stdout.splitlines()[0] == (
        f"ERROR {case}: no kernel outputs to judge: expected diff_src, diff_gamma or diff_beta (or a spec's name for "
        "them); --map dx=diff_src --map dgamma=diff_gamma --map dbeta=diff_beta reads them (guessed by shape and name)")


def test_a_kernel_that_wrote_no_out_file_is_said_so(cli, rng, tmp_path):
    inputs, _ = _problem(rng)
    case = save_bundle(tmp_path / "case.npz", inputs, epsilon=EPS, data_format="NCHW")
    result = cli("check", tmp_path)
    assert result.exit_code == 3 and result.stderr == ""
    assert result.stdout.splitlines()[0] == (
        f"ERROR {case}: {tmp_path / 'case.out.npz'} not found, and {case} holds no outputs (diff_src, diff_gamma, "
        "diff_beta or a spec's name for them); did the kernel write its outputs? --map THEIRS=OURS names your own")


def test_run_names_every_missing_input_at_once(cli, rng, tmp_path):
    inputs, _ = _problem(rng)
    bundle = save_bundle(tmp_path / "in.npz", {"x": inputs["src"], "grad": inputs["diff_dst"], "m": inputs["mean"],
                                               "var": inputs["variance"]}, epsilon=EPS, data_format="NCHW")
    assert_one_error(cli("run", bundle, "-q"),
                     r"^error: missing inputs diff_dst, mean, variance \(spec generic\): no arrays by these names or a "
                     r"spec's names for them; --map grad=diff_dst --map var=variance reads them by shape and name; "
                     r"--map THEIRS=mean reads your own name for the rest$")


def test_the_api_names_every_missing_input_at_once(rng):
    inputs, grads = _problem(rng)
    with pytest.raises(bnbwd_cli.InputError, match=r"^missing inputs diff_dst, variance \(spec generic\)"):
        bnbwd_cli.check(grads, src=inputs["src"], mean=inputs["mean"], epsilon=EPS, data_format="NCHW")


def _torch_dump(directory, inputs, grads):
    directory.mkdir()
    invstd = (1 / np.sqrt(inputs["variance"].astype(np.float64) + EPS)).astype(np.float32)
    for name, array in {"input": inputs["src"], "grad_output": inputs["diff_dst"], "weight": inputs["gamma"],
                        "save_mean": inputs["mean"], "save_invstd": invstd, "grad_input": grads["diff_src"],
                        "grad_weight": grads["diff_gamma"], "grad_bias": grads["diff_beta"]}.items():
        np.save(directory / f"{name}.npy", array)


def test_a_pytorch_dump_folder_is_channels_first_without_format(cli, rng, tmp_path):
    """C == W: both layouts fit the shapes, and only PyTorch's names say which one the tensors are in."""
    inputs, grads = _problem(rng, (4, 6, 5, 6))
    _torch_dump(tmp_path / "dump", inputs, grads)
    result = cli("check", tmp_path / "dump", "--epsilon", EPS)
    assert result.exit_code == 0 and result.stdout.startswith(f"PASS  {tmp_path / 'dump'}: grad_input=diff_src"), \
        result.output
    explicit = cli("check", tmp_path / "dump", "--epsilon", EPS, "--format", "NHWC")
    assert explicit.exit_code == 1, explicit.output  # an explicit --format still wins (and is wrong here)


def test_the_layout_hint_names_the_files_as_well_as_the_kernel(rng):
    """A correct kernel's NCHW outputs judged as NHWC (C == W): the hint says the files may be NCHW."""
    inputs, grads = _problem(rng, (4, 6, 5, 6))
    report = bnbwd_cli.check(grads, **inputs, epsilon=EPS, data_format="NHWC")
    assert report.status == "mismatch"
    assert ("the kernel read the NHWC tensors as NCHW, or the files hold NCHW tensors judged as NHWC"
            in report.summary), report.summary
