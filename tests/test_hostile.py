"""Hostile inputs and paths, class by class, through the real CLI: exit 3 and one `error:` line, never exit 4,
never a hang, never more memory or time than a rejection needs, and nothing the user had is overwritten.

Classes: a report written over an input; special paths written through; malformed headers and shapes that
used to escape as exit 4; special files (FIFOs, files truncated while read); memory before validation;
the judge's numerics near the float64 limits; interrupts while the outputs commit.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, assert_one_error, error_line, make_inputs, save_bundle

SHAPE = (4, 8, 6, 6)
EPSILON = "1e-3"


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bnbwd(*args, cwd: Path | None = None, stdin=None, timeout: float = 60, preexec_fn=None,
          input: bytes | None = None) -> subprocess.CompletedProcess:
    """The CLI in a process of its own (bytes out), for what an in-process runner cannot show: real stdout, FIFOs,
    resource limits, signals."""
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", *map(str, args)], cwd=cwd, stdin=stdin, input=input,
                          capture_output=stdin is None or input is not None, timeout=timeout, preexec_fn=preexec_fn,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    return make_inputs(np.random.default_rng(26), SHAPE)


@pytest.fixture
def case_dir(tmp_path: Path, arrays) -> Path:
    """A `check` case as a directory of .npy files (inputs and the kernel's outputs)."""
    from bnbwd_cli.core import Op
    from bnbwd_cli.core.reference import reference_backward

    directory = tmp_path / "case"
    directory.mkdir()
    for name, array in arrays.items():
        np.save(directory / f"{name}.npy", array)
    op = Op(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"], arrays["gamma"], epsilon=1e-3,
            data_format="NCX")
    for name, array in reference_backward(op).items():
        np.save(directory / f"{name}.npy", array.astype(np.float32))
    return directory


# ---------------------------------------------------------------- a report written over an input


def test_check_json_over_a_case_file_in_a_listed_directory(cli, case_dir: Path) -> None:
    before = digest(case_dir / "src.npy")
    assert_one_error(cli("check", case_dir, "--epsilon", EPSILON, "--json", case_dir / "src.npy"),
                     r"--json .*src\.npy: is also an input")
    assert digest(case_dir / "src.npy") == before


def test_check_json_over_a_case_reached_by_symlink_or_hard_link(cli, case_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "soft.npy").symlink_to(case_dir / "mean.npy")
    os.link(case_dir / "gamma.npy", tmp_path / "hard.npy")
    before = {name: digest(case_dir / name) for name in ("mean.npy", "gamma.npy")}
    for target in ("soft.npy", "hard.npy"):
        assert_one_error(cli("check", case_dir, "--epsilon", EPSILON, "--json", tmp_path / target), "is also an input")
    assert {name: digest(case_dir / name) for name in before} == before


def test_check_json_over_a_case_file_or_its_out_npz(cli, tmp_path: Path, arrays) -> None:
    case_file = Path(save_bundle(tmp_path / "c.npz", arrays))
    outputs = tmp_path / "c.out.npz"
    outputs.write_bytes(b"kernel outputs")
    for target in (case_file, outputs):
        before = digest(target)
        assert_one_error(cli("check", case_file, "--json", target), "is also an input")
        assert digest(target) == before


def test_check_json_over_a_case_of_a_directory_of_npz_cases(cli, tmp_path: Path, arrays) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    save_bundle(cases / "one.npz", arrays)
    before = digest(cases / "one.npz")
    assert_one_error(cli("check", cases, "--json", cases / "one.npz"), "is also an input")
    assert digest(cases / "one.npz") == before


@pytest.mark.parametrize("target", ["d.bin", "hard.bin", "soft.bin"])
def test_verify_json_over_a_raw_input(cli, tmp_path: Path, arrays, target: str) -> None:
    data = tmp_path / "d.bin"
    arrays["src"].tofile(data)
    os.link(data, tmp_path / "hard.bin")
    (tmp_path / "soft.bin").symlink_to(data)
    np.savez(tmp_path / "ref.npz", x=arrays["src"])
    spec = f"raw:f32:{'x'.join(map(str, SHAPE))}:{data}"
    before = digest(data)
    assert_one_error(cli("verify", spec, tmp_path / "ref.npz", "--json", tmp_path / target), "is also an input")
    assert digest(data) == before


def test_verify_json_over_a_keyed_reference_or_directory_member(cli, tmp_path: Path, case_dir: Path, arrays) -> None:
    np.savez(tmp_path / "ref.npz", src=arrays["src"])
    before = digest(tmp_path / "ref.npz")
    assert_one_error(cli("verify", case_dir / "src.npy", f"{tmp_path / 'ref.npz'}:src", "--json", tmp_path / "ref.npz"),
                     "is also an input")
    assert digest(tmp_path / "ref.npz") == before
    assert_one_error(cli("verify", case_dir, tmp_path / "ref.npz", "--json", case_dir / "diff_src.npy"),
                     "is also an input")


def test_run_outputs_over_raw_or_linked_inputs(cli, tmp_path: Path, arrays) -> None:
    arrays["src"].tofile(tmp_path / "src.bin")
    (tmp_path / "alias.npz").symlink_to(tmp_path / "src.bin")
    flags = []
    for name in ("diff_dst", "mean", "variance", "gamma"):
        np.save(tmp_path / f"{name}.npy", arrays[name])
        flags += [f"--{name.replace('_', '-')}", tmp_path / f"{name}.npy"]
    src = f"raw:f32:{'x'.join(map(str, SHAPE))}:{tmp_path / 'src.bin'}"
    before = digest(tmp_path / "src.bin")
    base = ["run", "--src", src, *flags, "--epsilon", EPSILON, "--format", "NCHW"]
    assert_one_error(cli(*base, "-o", tmp_path / "alias.npz"), "is also an input")
    assert_one_error(cli(*base, "-o", tmp_path / "o.npz", "--json", tmp_path / "src.bin"), "is also an input")
    os.link(tmp_path / "gamma.npy", tmp_path / "diff_gamma.npy")  # --out-dir's diff_gamma.npy is the gamma input
    assert_one_error(cli(*base, "--out-dir", tmp_path), "diff_gamma.npy: is also an input")
    assert digest(tmp_path / "src.bin") == before
    assert np.array_equal(np.load(tmp_path / "gamma.npy"), arrays["gamma"])
