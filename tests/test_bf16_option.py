"""--bf16 through the real CLI: float32/uint16 arrays read as the bfloat16 values their bits hold, in run and
verify, and the hint for a float32 output that holds only bfloat16 values."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli import dtypes
from bnbwd_cli.dtypes import BFLOAT16, exact_narrower
from bnbwd_cli.files.reinterpret import reinterpret_bf16
from tests.conftest import assert_one_error, assert_same, make_inputs, run_outputs, save_bundle
SHAPE = (2, 3, 4, 5)  # NCHW: C = 3
NCHW = ("--epsilon", "1e-3", "--format", "NCHW")


@pytest.fixture
def arrays(rng):
    return make_inputs(rng, SHAPE)


def test_bf16_reinterprets_the_bits():
    bits = np.array([0x3F80, 0xC000, 0x3FC0, 0x7F80, 0x0000], dtype=np.uint16)  # 1, -2, 1.5, inf, 0
    sets = {"a": {"x": bits, "y": bits.astype(np.int16)}}
    assert reinterpret_bf16(["x", "y", "z"], sets) == {"x", "y"}
    for key in ("x", "y"):
        assert sets["a"][key].dtype == BFLOAT16
        assert sets["a"][key].astype(np.float32).tolist() == [1.0, -2.0, 1.5, np.inf, 0.0]


def test_verify_bf16_compares_the_values_the_bits_hold(cli, tmp_path, rng):
    reference = rng.normal(size=(4, 8)).astype(np.float32)
    kernel = reference.astype(ml_dtypes.bfloat16)
    np.savez(tmp_path / "actual.npz", diff_src=kernel.view(np.int16))
    np.savez(tmp_path / "ref.npz", diff_src=reference)
    result = cli("verify", tmp_path / "actual.npz", tmp_path / "ref.npz", "--bf16", "diff_src", "--json", "-")
    assert result.exit_code == 0, result.output  # judged as bf16 against f32: rounding only
    row = json.loads(result.stdout)["outputs"][0]
    error = np.abs(kernel.astype(np.float64) - reference.astype(np.float64))
    assert row["comparison"]["actual_dtype"] == "bf16"
    assert row["comparison"]["max_abs"]["value"] == pytest.approx(error.max(), rel=1e-12)
    without = cli("verify", tmp_path / "actual.npz", tmp_path / "ref.npz")
    assert without.exit_code == 3  # int16 bits against f32: not comparable


def test_verify_bf16_inputs_and_errors(cli, tmp_path, arrays):
    bf16 = {k: v.astype(ml_dtypes.bfloat16) if k in ("src", "diff_dst") else v for k, v in arrays.items()}
    save_bundle(tmp_path / "b.npz", bf16)
    out = tmp_path / "ref.npz"
    assert cli("run", tmp_path / "b.npz", *NCHW, "-q", "-o", out).exit_code == 0
    bits = {k: v.view(np.int16) if v.dtype == BFLOAT16 else v for k, v in bf16.items()}
    inputs = save_bundle(tmp_path / "bits.npz", bits, epsilon=1e-3)
    ok = cli("verify", out, out, "--inputs", inputs, "--format", "NCHW", "--bf16", "src", "--bf16", "diff_dst")
    assert ok.exit_code == 0, ok.output
    assert_one_error(cli("verify", out, out, "--inputs", inputs, "--format", "NCHW", "--bf16", "mean"),
              r"--bf16 mean: mean has dtype float32 \(in --inputs .*\), expected 2-byte raw data")
    assert_one_error(cli("verify", out, out, "--bf16", "dx"), r"--bf16 dx: no array named 'dx' in ACTUAL, REFERENCE")
    assert_one_error(cli("verify", out, out, "--bf16", "dx", "--bf16", "dw"),  # every unknown key at once
                     r"--bf16 dx --bf16 dw: no arrays named 'dx', 'dw' in ACTUAL, REFERENCE$")


def test_run_bf16_input_and_reference_output(cli, tmp_path, arrays):
    bf16 = {k: v.astype(ml_dtypes.bfloat16) if k in ("src", "diff_dst") else v for k, v in arrays.items()}
    expected = run_outputs(cli, tmp_path, save_bundle(tmp_path / "b.npz", bf16), name="ref.npz")
    bits = {k: v.view(np.uint16) if v.dtype == BFLOAT16 else v for k, v in bf16.items()}
    got = run_outputs(cli, tmp_path, save_bundle(tmp_path / "bits.npz", bits), "--bf16", "src", "--bf16", "diff_dst")
    assert_same(got, expected)
    np.savez(tmp_path / "kernel.npz", dx=expected["diff_src"].view(np.int16), diff_gamma=expected["diff_gamma"],
             diff_beta=expected["diff_beta"])
    args = ["run", tmp_path / "bits.npz", "--bf16", "src", "--bf16", "diff_dst", *NCHW, "--reference",
            tmp_path / "kernel.npz", "--map", "dx=diff_src"]
    result = cli(*args, "--bf16", "dx")
    assert result.exit_code == 0, result.output
    assert_one_error(cli("run", tmp_path / "bits.npz", "--bf16", "dx", *NCHW), r"--bf16 dx: not an input .*--reference", 2)
    assert_one_error(cli("run", tmp_path / "b.npz", "--bf16", "mean", *NCHW), r"--bf16 mean: mean has dtype float32 \(in the inputs\)")


def test_exact_narrower():
    rng = np.random.default_rng(3)
    values = rng.normal(size=1000).astype(np.float32)
    assert exact_narrower(values) is None
    assert exact_narrower(values.astype(ml_dtypes.bfloat16).astype(np.float32)) == "bf16"
    assert exact_narrower(values.astype(np.float16).astype(np.float64)) == "f16"
    assert exact_narrower(np.zeros(100, np.float32)) is None
    assert exact_narrower(values.astype(np.float16)) is None  # already narrow: nothing to say
    with_nan = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    with_nan[3] = np.nan
    assert exact_narrower(with_nan) == "bf16"


def test_exact_narrower_on_large_arrays_looks_at_the_first_elements_then_the_whole():
    """Past FIRST_LOOK elements the first ones are tried first: the same answers as the whole array's, for a value off
    the grid among the first elements, only past them, and a NaN or Inf among the first (a 16-bit value there)."""
    rng = np.random.default_rng(4)
    narrow = rng.normal(size=3 * dtypes.FIRST_LOOK).astype(ml_dtypes.bfloat16).astype(np.float32)
    assert exact_narrower(narrow) == "bf16"
    for position in (5, dtypes.FIRST_LOOK + 5, narrow.size - 1):
        off = narrow.copy()
        off[position] = np.float32(0.1)  # not a bf16 nor an f16 value
        assert exact_narrower(off) is None, position
    special = narrow.copy()
    special[:3] = (np.nan, np.inf, -np.inf)
    assert exact_narrower(special) == "bf16"
    half = rng.normal(size=3 * dtypes.FIRST_LOOK).astype(np.float16).astype(np.float64)
    half[-1] = 70000.0  # finite, beyond float16's range: off its grid
    assert exact_narrower(half) is None


def test_bf16_quantized_f32_output_gets_a_hint(cli, tmp_path, rng):
    reference = rng.normal(size=(16, 8)).astype(np.float32)
    np.savez(tmp_path / "actual.npz", out=reference.astype(ml_dtypes.bfloat16).astype(np.float32))
    np.savez(tmp_path / "ref.npz", out=reference)
    result = cli("verify", tmp_path / "actual.npz", tmp_path / "ref.npz")
    assert result.exit_code == 1
    assert "hint: every element of actual is exactly a bfloat16 value although it is stored as f32" in result.stdout
    clean = cli("verify", tmp_path / "ref.npz", tmp_path / "ref.npz")
    assert clean.exit_code == 0 and "bfloat16 value" not in clean.stdout


