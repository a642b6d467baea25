"""--map THEIRS=OURS for inputs and outputs, the same direction in run --reference, verify and check;
files that hold inputs and outputs together, and extra keys (one note, not an error)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import make_inputs

MAP = ["--map", "dy=diff_dst", "--map", "var=variance", "--map", "dx=diff_src"]


@pytest.fixture
def dump(rng, tmp_path):
    """A kernel engineer's dump: inputs and outputs in one file, in their own names, plus a stray key."""
    inputs = make_inputs(rng, (3, 4, 5, 2))  # NCHW
    grads = bnbwd_cli.backward(*(inputs[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")),
                               epsilon=1e-5, data_format="NCHW")
    arrays = {"src": inputs["src"], "dy": inputs["diff_dst"], "mean": inputs["mean"], "var": inputs["variance"],
              "gamma": inputs["gamma"], "dx": grads["diff_src"], "diff_gamma": grads["diff_gamma"],
              "diff_beta": grads["diff_beta"], "step": np.int64(7)}
    path = tmp_path / "dump.npz"
    np.savez(path, **arrays, epsilon=np.array(1e-5), data_format=np.array("NCHW"))
    return str(path), arrays, grads


def test_run_reads_a_dump_by_its_own_names_and_judges_it_against_itself(cli, dump):
    path, _, _ = dump
    result = cli("run", path, *MAP, "--reference", path)
    assert result.exit_code == 0, result.output
    assert "note: bundle (" in result.stderr and "not used: dx, diff_gamma, diff_beta, step" in result.stderr
    # the inputs stored next to the outputs are neither MISSING nor EXTRA: one note names them
    assert "MISSING" not in result.stdout and "EXTRA" not in result.stdout
    assert "note: not compared: src, dy, mean, var, gamma, epsilon, data_format (the op's inputs); step (only in actual)" \
        in result.stdout
    assert "dx=diff_src" in result.stdout and "PASS: 3 output(s)" in result.stdout


def test_run_without_the_map_a_required_input_is_still_missing(cli, dump):
    path, _, _ = dump
    result = cli("run", path)
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines()[-1] == \
        ("error: missing inputs diff_dst, variance (spec generic): no arrays by these names or a spec's names for "
         "them; --map dy=diff_dst --map var=variance reads them (guessed by shape and name)")  # every missing input
    # at once, by names people give them: suggested, never read unasked


def test_verify_inputs_file_holding_outputs_and_either_side_holding_inputs(cli, dump, tmp_path):
    path, arrays, grads = dump
    kernel = tmp_path / "kernel.npz"
    np.savez(kernel, dx=grads["diff_src"], diff_gamma=grads["diff_gamma"], diff_beta=grads["diff_beta"])
    for actual, reference in ((kernel, path), (path, kernel)):
        result = cli("verify", actual, reference, "--inputs", path, *MAP, "--json", "-")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert [o["status"] for o in document["outputs"]] == ["pass"] * 3
        assert document["problems"] == [] and "the op's inputs" in document["notes"][0]


@pytest.mark.parametrize("command", ["run", "verify", "check"])
def test_the_same_map_reads_the_same_way_in_every_command(cli, dump, tmp_path, command):
    path, arrays, grads = dump
    wrong = dict(arrays, dx=grads["diff_src"] * np.float32(1.01))
    bad = tmp_path / "bad.npz"
    np.savez(bad, **wrong, epsilon=np.array(1e-5), data_format=np.array("NCHW"))
    args = {"run": ["run", path, "-q", "--reference", bad],
            "verify": ["verify", bad, path, "--inputs", path],
            "check": ["check", bad]}[command]
    result = cli(*args, *MAP)
    assert result.exit_code == 1, result.output
    verdict = next(line for line in result.stdout.splitlines() if line.startswith("FAIL"))
    assert "dx" in verdict, verdict  # the failing output, named by the kernel's key
    assert "diff_gamma" in result.stdout  # the other outputs were judged too


def test_a_map_that_matches_nothing_is_a_note_and_two_keys_for_one_input_an_error(cli, dump, tmp_path):
    path, arrays, _ = dump
    result = cli("check", path, *MAP, "--map", "nothing=diff_beta")
    assert result.exit_code == 0, result.output
    clash = tmp_path / "clash.npz"
    np.savez(clash, **arrays, diff_dst=arrays["dy"], epsilon=np.array(1e-5))
    result = cli("run", str(clash), *MAP, "--format", "NCHW")
    assert result.exit_code == 3 and "both 'dy' and 'diff_dst' give diff_dst; keep one" in result.stderr


# --------------------------------------------------------------------------- a key that holds "="


@pytest.fixture
def equals_key(dump, tmp_path):
    """A kernel that named its diff_src `dx=0` (a framework's "name=index" key): bnbwd suggests --map dx=0=diff_src."""
    path, arrays, grads = dump
    kernel = tmp_path / "kernel.npz"
    np.savez(kernel, **{"dx=0": grads["diff_src"], "diff_gamma": grads["diff_gamma"], "diff_beta": grads["diff_beta"]})
    return path, str(kernel)


def test_the_suggested_map_for_a_key_holding_equals_is_the_command_that_works(cli, equals_key):
    """The missing output's message suggests `--map dx=0=diff_src`; that very flag reads dx=0 as diff_src (it was
    split at the first "=", as dx -> 0=diff_src, and matched no key)."""
    bundle, kernel = equals_key
    missing = cli("run", bundle, *MAP[:4], "--reference", kernel, "-q")
    assert missing.exit_code == 3, missing.output
    suggested = re.search(r"--map (\S+) reads dx=0 as it", missing.stderr)
    assert suggested and suggested.group(1) == "dx=0=diff_src", missing.stderr
    fixed = cli("run", bundle, *MAP[:4], "--reference", kernel, "-q", "--map", suggested.group(1))
    assert fixed.exit_code == 0, fixed.output
    assert "PASS: 3 output(s)" in fixed.stdout and "matched no key" not in fixed.stdout


def test_a_key_holding_equals_maps_the_same_in_verify_and_check(cli, equals_key, tmp_path):
    bundle, kernel = equals_key
    verified = cli("verify", kernel, bundle, "--inputs", bundle, *MAP[:4], "--map", "dx=0=diff_src", "--map", "dx=diff_src")
    assert verified.exit_code == 0, verified.output
    case = tmp_path / "case.npz"
    np.savez(case, **dict(np.load(bundle)), **{"dx=0": np.load(kernel)["dx=0"]})
    checked = cli("check", str(case), *MAP[:4], "--map", "dx=0=diff_src", "--ignore", "dx", "--json", "-")
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.stdout)["exit_code"] == 0


@pytest.mark.parametrize("value", ["=diff_src", "dx=", "dx"])
def test_a_map_without_both_names_is_a_usage_error(cli, dump, value):
    path, _, _ = dump
    result = cli("run", path, "--reference", path, "--map", value)
    assert result.exit_code == 2, result.output
    assert "expected THEIRS=OURS" in result.stderr
