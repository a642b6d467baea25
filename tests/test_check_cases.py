"""`bnbwd check`'s case rule: a file with inputs and outputs, or NAME.npz beside NAME.out.npz; DIR = its *.npz
cases; a case's own is_training/epsilon/data_format over the flags; `check --help`'s examples run as printed."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
from click.testing import CliRunner

import bnbwd_cli
from bnbwd_cli.app.check import Case, find_cases
from bnbwd_cli.cli import main
from tests.conftest import make_inputs, save_bundle

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("src", "diff_dst", "mean", "variance", "gamma")


def case_arrays(rng, training=True, shape=(2, 3, 4, 4)) -> tuple[dict, dict]:
    inputs = {k: v for k, v in make_inputs(rng, shape).items() if k in NAMES}
    grads = bnbwd_cli.backward(*(inputs[k] for k in NAMES), epsilon=1e-3, data_format="NCHW", training=training)
    return inputs, grads


def test_a_directory_means_its_npz_cases_and_out_files_are_outputs(cli, rng, tmp_path):
    inputs, grads = case_arrays(rng)
    suite = tmp_path / "suite"
    (suite / "nested").mkdir(parents=True)
    save_bundle(suite / "a.npz", inputs, epsilon=1e-3, data_format="NCHW")
    save_bundle(suite / "a.out.npz", grads)
    save_bundle(suite / "b.npz", {**inputs, **grads}, epsilon=1e-3, data_format="NCHW")
    save_bundle(suite / "c.npz", inputs, epsilon=1e-3, data_format="NCHW")
    save_bundle(suite / "c.out.npz", dict(grads, diff_beta=grads["diff_beta"] * 2))
    save_bundle(suite / "nested" / "d.npz", inputs)  # not recursive: never read
    np.save(suite / "stray.npy", inputs["mean"])  # a directory with .npz cases: its .npy files are no case
    assert find_cases([str(suite)]) == (Case(str(suite / "a.npz"), str(suite / "a.out.npz")), Case(str(suite / "b.npz")),
                                        Case(str(suite / "c.npz"), str(suite / "c.out.npz")))
    # a shell glob names the .out.npz files too: they are outputs, once, in either order
    globbed = sorted(str(p) for p in suite.glob("*.npz"))
    assert find_cases(globbed) == find_cases([str(suite)])
    assert find_cases([str(suite / "c.out.npz"), str(suite)]) == (find_cases([str(suite)])[2], *find_cases([str(suite)])[:2])
    result = cli("check", suite)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == [f"PASS  {suite / 'a.npz'}", f"PASS  {suite / 'b.npz'}",
                                                          f"FAIL  {suite / 'c.npz'}"]
    assert lines[3] == f"FAIL (exit 1): 3 case(s), 1 failed: {suite / 'c.npz'}"
    assert cli("check", *globbed).stdout == result.stdout


def test_an_out_file_alone_names_its_case_and_a_key_in_both_files_is_an_error(cli, rng, tmp_path):
    inputs, grads = case_arrays(rng)
    save_bundle(tmp_path / "a.npz", {**inputs, "diff_src": grads["diff_src"]}, epsilon=1e-3, data_format="NCHW")
    save_bundle(tmp_path / "a.out.npz", grads)
    assert find_cases([str(tmp_path / "a.out.npz")]) == (Case(str(tmp_path / "a.npz"), str(tmp_path / "a.out.npz")),)
    result = cli("check", tmp_path / "a.npz")
    assert result.exit_code == 3
    assert f"'diff_src' is in both {tmp_path / 'a.npz'} and {tmp_path / 'a.out.npz'}; keep one" in result.stdout
    lone = save_bundle(tmp_path / "lone.out.npz", {**inputs, **grads}, epsilon=1e-3, data_format="NCHW")
    assert find_cases([lone]) == (Case(lone),)  # no lone.npz beside it: a case of its own
    assert cli("check", lone).exit_code == 0


def test_a_directory_of_npy_files_and_no_npz_is_one_case(cli, rng, tmp_path):
    inputs, grads = case_arrays(rng)
    folder = tmp_path / "dump"
    folder.mkdir()
    for key, array in {**inputs, **grads}.items():
        np.save(folder / f"{key}.npy", array)
    assert find_cases([str(folder)]) == (Case(str(folder)),)
    assert cli("check", folder, "--epsilon", 1e-3, "--format", "NCHW").exit_code == 0


def test_a_cases_own_entries_win_over_the_flags(cli, rng, tmp_path):
    inputs, inference = case_arrays(rng, training=False)
    own = save_bundle(tmp_path / "own.npz", {**inputs, **inference}, epsilon=1e-3, data_format="NCHW",
                      is_training=False)
    assert cli("check", own).exit_code == 0
    # flags are defaults: a case that says is_training=False, epsilon and NCHW is judged so whatever they say
    assert cli("check", own, "--epsilon", 0.5, "--format", "NHWC", "--spec", "pytorch").exit_code == 0
    bare = save_bundle(tmp_path / "bare.npz", {**inputs, **inference})
    assert cli("check", bare, "--epsilon", 1e-3, "--format", "NCHW").exit_code == 1  # training by default
    assert cli("check", bare, "--epsilon", 1e-3, "--format", "NCHW", "--inference").exit_code == 0
    training = save_bundle(tmp_path / "training.npz", {**inputs, **inference}, epsilon=1e-3, data_format="NCHW",
                           is_training=True)
    assert cli("check", training, "--inference").exit_code == 1  # the file says training
    bad = save_bundle(tmp_path / "bad.npz", {**inputs, **inference}, is_training=np.float32(0.5))
    assert "'is_training' must be a boolean" in cli("check", bad).stdout


def test_run_reads_is_training_from_a_bundle_and_the_flag_wins(cli, rng, tmp_path):
    inputs, inference = case_arrays(rng, training=False)
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=1e-3, data_format="NCHW", is_training=False)
    kernel = save_bundle(tmp_path / "k.npz", inference)
    assert cli("run", bundle, "-q", "--reference", kernel).exit_code == 0
    training = save_bundle(tmp_path / "train.npz", inputs, epsilon=1e-3, data_format="NCHW", is_training=True)
    assert cli("run", training, "-q", "--reference", kernel).exit_code == 1
    assert cli("run", training, "-q", "--reference", kernel, "--inference").exit_code == 0  # a flag wins in run


def _help_examples() -> list[tuple[str, int]]:
    epilog = main.get_command(None, "check").epilog
    text = epilog.split("Examples:", 1)[1].replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("bnbwd check"):
            documented = re.search(r"#\s*exit (\d+)", line)
            commands.append((re.sub(r"\s+#.*$", "", line), int(documented.group(1)) if documented else 0))
    return commands


def test_check_help_examples_run_as_printed(tmp_path, monkeypatch):
    examples = _help_examples()
    assert len(examples) >= 3
    shutil.copytree(ROOT / "fixtures", tmp_path / "fixtures")
    monkeypatch.chdir(tmp_path)
    for command, expected in examples:
        result = CliRunner().invoke(main, shlex.split(command)[1:])
        assert result.exit_code == expected, f"{command}\n{result.output}"
    assert (tmp_path / "check.json").is_file()
