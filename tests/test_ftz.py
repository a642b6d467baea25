"""Subnormal results flushed to zero (a kernel built with FTZ: CUDA -ftz, --use_fast_math): a zero where the reference
is subnormal in the output's dtype passes, counted in a note; --no-ftz (the API's ftz=False) fails it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import make_inputs, save_bundle

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
TINY = np.finfo(np.float32).tiny  # the smallest normal float32


def bnbwd(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnbwd_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=ENV)


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Channel 0's gamma is 1e-30: its diff_src values (~1e-30 x diff_dst) are float32 subnormals. The FTZ kernel is
    bnbwd's own outputs with those written as 0; the broken one also zeroes one normal element of channel 1."""
    tmp = tmp_path_factory.mktemp("ftz")
    inputs = make_inputs(np.random.default_rng(3), (4, 3, 5, 5))
    inputs["gamma"][0] = np.float32(1e-30)
    inputs["diff_dst"] *= np.float32(1e-9)
    inputs["diff_dst"][:, 1:] *= np.float32(1e9)  # channels 1, 2: ordinary values
    bundle = save_bundle(tmp / "in.npz", inputs, epsilon=1e-5, data_format="NCHW")
    good = tmp / "good.npz"
    assert bnbwd("run", "-q", bundle, "-o", good).returncode == 0
    outputs = dict(np.load(good))
    src = outputs["diff_src"]
    subnormal = (src != 0) & (np.abs(src) < TINY)
    assert subnormal[:, 0].all() and not subnormal[:, 1:].any()
    flushed = dict(outputs, diff_src=np.where(subnormal, np.float32(0), src))
    broken = dict(flushed)
    broken["diff_src"] = flushed["diff_src"].copy()
    broken["diff_src"][0, 1, 2, 2] = 0  # a normal reference value written as 0
    np.savez(tmp / "ftz.npz", **flushed)
    np.savez(tmp / "broken.npz", **broken)
    return {"bundle": bundle, "good": good, "ftz": tmp / "ftz.npz", "broken": tmp / "broken.npz",
            "count": int(subnormal.sum()), "inputs": inputs, "flushed": flushed, "outputs": outputs}


def test_flushed_subnormals_pass_with_a_note_and_their_count(case):
    n = case["count"]
    note = f"{n} subnormal results flushed to zero: allowed; --no-ftz to fail them"
    text = bnbwd("run", "-q", case["bundle"], "--reference", case["ftz"])
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"note: diff_src: {note}" in text.stdout
    brief = bnbwd("run", "-q", case["bundle"], "--reference", case["ftz"], "--brief")
    assert brief.returncode == 0 and f"  note: {note}" in brief.stdout
    document = bnbwd("verify", case["ftz"], case["good"], "--inputs", case["bundle"], "--json", "-")
    assert document.returncode == 0, document.stdout + document.stderr
    counts = {o["name"]: o["comparison"]["flushed_to_zero"] for o in json.loads(document.stdout)["outputs"]}
    assert counts == {"diff_src": n, "diff_gamma": 0, "diff_beta": 0}


@pytest.mark.parametrize("command", ["run", "verify"])
def test_no_ftz_fails_them(case, command):
    if command == "run":
        args = ["run", "-q", case["bundle"], "--reference", case["ftz"]]
    else:
        args = ["verify", case["ftz"], case["good"], "--inputs", case["bundle"]]
    failed = bnbwd(*args, "--no-ftz", "--brief")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "diff_src: FAIL" in failed.stdout and "flushed" not in failed.stdout


def test_check_takes_the_flag():
    shown = bnbwd("check", "--help")
    assert shown.returncode == 0 and "--ftz / --no-ftz" in shown.stdout


def test_a_zero_where_the_reference_is_normal_still_fails(case):
    broken = bnbwd("run", "-q", case["bundle"], "--reference", case["broken"], "--brief")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "diff_src: FAIL" in broken.stdout


def test_a_correct_kernel_gets_no_note(case):
    good = bnbwd("run", "-q", case["bundle"], "--reference", case["good"])
    assert good.returncode == 0 and "flushed" not in good.stdout


def test_the_api(case):
    inputs = dict(case["inputs"], epsilon=1e-5, data_format="NCHW")
    report = bnbwd_cli.check(case["flushed"], **inputs)
    assert report.status == "pass" and f"{case['count']} subnormal results flushed to zero" in report.text
    assert "ftz=False to fail them" in report.text
    assert bnbwd_cli.check(case["flushed"], ftz=False, **inputs).status == "mismatch"
    assert "flushed" not in bnbwd_cli.check(case["outputs"], **inputs).text
    with pytest.raises(bnbwd_cli.InputError, match="ftz is"):
        bnbwd_cli.check(case["flushed"], ftz="no", **inputs)


@pytest.mark.parametrize("bug", ["scaled", "unbiased"])
def test_the_diagnosis_leaves_flushed_elements_out(case, bug):
    """A buggy kernel built with FTZ: its flushed subnormals (channel 0) pass and must not stop the diagnosis from
    naming the bug in the other channels (before, a flushed element read as a miss of every hypothesis:
    "no tested hypothesis ... fails in every channel")."""
    inputs = dict(case["inputs"], epsilon=1e-5, data_format="NCHW")
    if bug == "scaled":
        outputs = {k: (v.astype(np.float64) * (1 + 1e-4)).astype(np.float32) for k, v in case["outputs"].items()}
        words = "every output is scaled by 1+0.0001"
    else:
        m = case["outputs"]["diff_src"].size // 3
        variance = (case["inputs"]["variance"].astype(np.float64) * m / (m - 1)).astype(np.float32)
        outputs = {k: np.array(v) for k, v in bnbwd_cli.backward(**dict(inputs, variance=variance)).items()}
        words = f"an unbiased variance (divided by M-1 = {m - 1}, not M)"
    src = outputs["diff_src"]
    outputs["diff_src"] = np.where(case["flushed"]["diff_src"] == 0, np.float32(0), src)
    report = bnbwd_cli.check(outputs, **inputs)
    diff_src = next(o for o in report.result.outputs if o.name == "diff_src").comparison
    assert report.status == "mismatch" and diff_src.flushed == case["count"]
    assert [h.text for h in diff_src.diagnosis if words in h.text], diff_src.diagnosis


def test_the_sums_bias_fit_leaves_flushed_elements_out():
    """vector_bias: channels whose reference is subnormal, written as 0 (a -100% error, weighed by a subnormal's
    tiny ulp) are no bias once left out; a 0 where the reference is normal still is."""
    from bnbwd_cli.judge.bias import vector_bias

    rng = np.random.default_rng(7)
    reference = rng.uniform(0.5, 2.0, 64) * rng.choice([-1.0, 1.0], 64)
    reference[:8] *= float(TINY) / 4  # subnormal float32 values
    actual = reference.copy()
    actual[:8] = 0.0
    noise = np.maximum(np.abs(reference) * 2.0**-24, 2.0**-150)
    unit = 2.0**-24
    assert vector_bias(actual, reference, noise, unit).significant
    assert not vector_bias(actual, reference, noise, unit, flushed_below=float(TINY)).significant
    actual[8] = 0.0  # a normal reference written as 0
    assert vector_bias(actual, reference, noise, unit, flushed_below=float(TINY)).significant


# --- subnormal inputs read as zero (DAZ): judge/daz.py --------------------------------------------------------------


def _daz_problem(dtype: str, layout: str, seed: int = 11):
    """Inputs whose channel 1 diff_dst is float32-subnormal (~1e-39: its sum ~1e-37 is normal) and a few src
    values subnormal; the kernel is bnbwd's backward of the inputs with every subnormal read as zero, its subnormal
    results written as zero (a correct float32 kernel built with x86 fast math)."""
    from bnbwd_cli.dtypes import dtype_from_name

    kind = dtype_from_name(dtype)
    fmt = "NCX" if layout == "NCHW" else "NXC"
    shape = (4, 3, 6, 5) if fmt == "NCX" else (4, 6, 5, 3)
    inputs = make_inputs(np.random.default_rng(seed), shape, fmt, dtype=np.float32)
    channel = (slice(None), 1) if fmt == "NCX" else (Ellipsis, 1)
    inputs["diff_dst"][channel] = np.abs(inputs["diff_dst"][channel]) * np.float32(1e-39)  # one sign: normal sums
    inputs["src"].reshape(-1)[:3] = np.float32(3e-39)
    inputs = {k: (v.astype(kind) if k in ("src", "diff_dst") else v) for k, v in inputs.items()}
    settings = dict(epsilon=1e-5, data_format=layout)
    tiny = float(np.finfo(np.float32).tiny)
    read = {k: (np.where(np.abs(v.astype(np.float32)) < tiny, 0, v).astype(v.dtype) if k != "beta" else v)
            for k, v in inputs.items()}
    outputs = {k: np.array(v) for k, v in bnbwd_cli.backward(**read, **settings).items()}
    subnormal = {"f32": tiny, "bf16": tiny, "f16": 2.0**-14}[dtype]
    outputs = {k: np.where(np.abs(v.astype(np.float32)) < subnormal, 0, v).astype(v.dtype) for k, v in outputs.items()}
    return inputs, outputs, settings


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_kernel_reading_subnormal_inputs_as_zero_passes_with_a_note(dtype, layout):
    inputs, outputs, settings = _daz_problem(dtype, layout)
    ieee = bnbwd_cli.check(outputs, **inputs, **settings, ftz=False)
    assert ieee.status == "mismatch"  # against the inputs as given: diff_gamma and diff_beta of c=1 are 0, not ~1e-37
    report = bnbwd_cli.check(outputs, **inputs, **settings)
    assert report.status == "pass", report.text
    counts = {o.name: o.comparison.read_as_zero for o in report.result.outputs}
    failed = {o.name: o.comparison.mismatches for o in ieee.result.outputs}  # (those include the flushed results)
    assert counts["diff_beta"] == failed["diff_beta"] == 1 and all(counts[k] <= failed[k] for k in counts), counts
    assert "of subnormal inputs read as zero (DAZ; judged against the inputs so flushed): allowed" in report.text
    assert "ftz=False to fail them" in report.text


def test_daz_through_the_cli_and_a_buggy_daz_kernel_still_fails(tmp_path):
    inputs, outputs, settings = _daz_problem("f32", "NCHW")
    bundle = save_bundle(tmp_path / "in.npz", inputs, epsilon=1e-5, data_format="NCHW")
    np.savez(tmp_path / "daz.npz", **outputs)
    brief = bnbwd("run", "-q", bundle, "--reference", tmp_path / "daz.npz", "--brief")
    assert brief.returncode == 0, brief.stdout + brief.stderr
    assert "of subnormal inputs read as zero (DAZ; judged against the inputs so flushed): allowed; --no-ftz to fail" \
        in brief.stdout
    document = json.loads(bnbwd("run", "-q", bundle, "--reference", tmp_path / "daz.npz", "--json", "-").stdout)
    assert {o["name"]: o["comparison"]["read_as_zero"] > 0 for o in document["outputs"]}["diff_beta"]
    assert bnbwd("run", "-q", bundle, "--reference", tmp_path / "daz.npz", "--no-ftz", "--brief").returncode == 1
    buggy = dict(outputs, diff_src=outputs["diff_src"] * np.float32(1.01))
    np.savez(tmp_path / "buggy.npz", **buggy)
    failed = bnbwd("run", "-q", bundle, "--reference", tmp_path / "buggy.npz", "--brief")
    assert failed.returncode == 1 and "DAZ" not in failed.stdout, failed.stdout


@pytest.mark.parametrize("dtype", ["f64", "f32", "bf16", "f16"])
def test_the_inputs_bit_test_finds_what_the_magnitude_test_finds(dtype):
    """judge/daz.py reads the bits of each input a chunk at a time (fast: asked of every failing run's inputs): it
    flags the same arrays as the plain test by magnitude, at every edge (either sign of the smallest and largest
    subnormal, zeros, the smallest normal, NaN, Inf), in the first, a middle and the last (short) chunk, and on
    strided views (read by magnitude)."""
    from bnbwd_cli.dtypes import SMALLEST_NORMAL, dtype_from_name
    from bnbwd_cli.judge import daz

    kind = dtype_from_name(dtype)
    tiny = SMALLEST_NORMAL[dtype]  # the dtype's own smallest normal, and its smallest subnormal:
    smallest = {"f64": 2.0**-1074, "f32": 2.0**-149, "bf16": 2.0**-133, "f16": 2.0**-24}[dtype]
    plain = np.array([0.0, -0.0, tiny, -tiny, 1.0, -2.5, np.inf, -np.inf, np.nan], dtype=np.float64).astype(kind)
    edges = [smallest, -smallest, tiny - smallest, smallest - tiny]
    size = 3 * daz._CHUNK + 17
    background = np.resize(plain, size)
    assert not daz._holds_subnormal(background) and daz._flushed(background) is None
    for value in edges:
        value = np.array(value).astype(kind)
        expected = bool(daz._subnormal_mask(value[None]).any())  # float16: none is (a normal float32 once loaded)
        assert expected == (dtype != "f16")
        for position in (0, daz._CHUNK + 5, size - 1):
            array = background.copy()
            array[position] = value
            assert daz._holds_subnormal(array) == expected, (value, position)
            assert daz._holds_subnormal(array[::-1]) == expected  # strided: the magnitude test
            flushed = daz._flushed(array)
            assert (flushed is None) != expected
            if expected:
                assert flushed[position] == 0 and np.array_equal(np.delete(flushed, position), np.delete(array, position),
                                                                 equal_nan=True)
