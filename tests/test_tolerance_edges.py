"""K pinned from both sides, per output and per dtype combination the judge supports, through the public API.

The allowance |a - r| <= K*s + ulp_D(r) is recomputed here from docs/tolerances.md's formulas, in plain float64
on (C, M) rows, independently of judge/model.py: an element moved to the last value of its dtype within the
allowance passes, the first value beyond it fails. A correct kernel (tools/zoo.py's float32 kernel, or a float64
one for all-float64 problems) passes, and a float32 kernel fails on an all-float64 problem (its unit is 2**-53).
"""

from __future__ import annotations

import numpy as np
import pytest

import bnbwd_cli
from tools import zoo

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = {"f16": F16, "bf16": zoo.BF16, "f32": F32, "f64": F64}
# (mantissa bits, smallest normal exponent) of each output dtype
FORMATS = {F16: (10, -14), zoo.BF16: (7, -126), F32: (23, -126), F64: (52, -1022)}
U32, U64 = 2.0**-24, 2.0**-53
K = {"diff_src": 16.0, "diff_gamma": 5.0, "diff_beta": 5.0}  # docs/tolerances.md
REALISED_FLOOR = 2.5
OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")
# (data, statistics): the pairs frameworks produce, and float64 data with float32 statistics (a float32 kernel's unit).
COMBOS = [("f32", "f32"), ("f32", "f64"), ("f16", "f32"), ("bf16", "f32"), ("f64", "f64"), ("f64", "f32"),
          ("f16", "f16"), ("bf16", "bf16")]
# C1: one channel (its sums take another path in the judge), drawn where a sequential float32 sum's realised error,
# not the estimate, sets the sums' scale.
CASES = [(*combo, "NCX") for combo in COMBOS] + [("f32", "f32", "NXC"), ("bf16", "bf16", "NXC"), ("f32", "f32", "C1")]


def _problem(data: str, stats: str, fmt: str) -> dict:
    # M = 64 per channel: the sums' terms in diff_src's scale (divided by M) still move its allowance by ulps.
    shape, seed = ((16, 1, 2, 2), 6) if fmt == "C1" else ((4, 4, 4, 4), 3)
    return zoo.make_problem(np.random.default_rng(seed), shape, "NCX" if fmt == "C1" else fmt, DTYPES[data], DTYPES[stats])


def _inputs(problem: dict) -> dict:
    fmt = "NCHW" if problem["data_format"] == "NCX" else "NHWC"
    return {"src": problem["src"], "diff_dst": problem["diff_dst"], "mean": problem["mean"],
            "variance": problem["variance"], "gamma": problem["gamma"], "epsilon": problem["epsilon"],
            "data_format": fmt}


def _three(array: np.ndarray, fmt: str) -> np.ndarray:
    """(N, C, S) for NCX, (M, C, 1) for NXC."""
    return array.reshape(array.shape[0], array.shape[1], -1) if fmt == "NCX" else array.reshape(-1, array.shape[-1], 1)


def _rows(array: np.ndarray, fmt: str, dtype=np.float64) -> np.ndarray:
    """(C, M): each channel's elements in storage order."""
    three = _three(array, fmt)
    return np.ascontiguousarray(three.transpose(1, 0, 2).reshape(three.shape[1], -1)).astype(dtype)


def _from_rows(rows: np.ndarray, like: np.ndarray, fmt: str) -> np.ndarray:
    """_rows undone: (C, M) back to the shape and layout of `like`."""
    n, c, s = _three(like, fmt).shape
    return rows.reshape(c, n, s).transpose(1, 0, 2).reshape(like.shape)


def _sequential32(terms: np.ndarray) -> np.ndarray:
    """Per-row sums with one float32 accumulator, element by element."""
    return np.cumsum(terms.astype(np.float32), axis=1, dtype=np.float32)[:, -1].astype(np.float64)


def _sum_scale(terms: np.ndarray, unit: float, sequential_error: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """u*sqrt(max(sum_k S_k**2, M*(S**2/3 + ||x||**2/6))) + extra, raised to 2.5x a sequential float32 sum's
    realised error under float32 accumulation."""
    m = terms.shape[1]
    prefix = np.cumsum(terms, axis=1)
    total, norm2 = prefix[:, -1], np.einsum("cm,cm->c", terms, terms)
    estimate = unit * np.sqrt(np.maximum(np.einsum("cm,cm->c", prefix, prefix), m * (total**2 / 3 + norm2 / 6)))
    estimate = estimate + extra
    return np.maximum(estimate, REALISED_FLOOR * sequential_error) if unit == U32 else estimate


def _scales(problem: dict, reference_src: np.ndarray) -> dict[str, np.ndarray]:
    """Every element's error scale s (diff_src as (C, M) rows), from docs/tolerances.md."""
    fmt = problem["data_format"]
    x, dy = _rows(problem["src"], fmt), _rows(problem["diff_dst"], fmt)
    mean, variance, gamma = (problem[k].astype(np.float64) for k in ("mean", "variance", "gamma"))
    all64 = {problem[k].dtype for k in ("src", "mean", "variance")} == {F64}
    unit = U64 if all64 else U32
    invstd = 1 / np.sqrt(variance + problem["epsilon"])
    xhat = (x - mean[:, None]) * invstd[:, None]
    terms = dy * xhat
    beta, gam, m = dy.sum(axis=1), terms.sum(axis=1), x.shape[1]
    centred = ((x.astype(np.float32) - mean.astype(np.float32)[:, None]) * dy.astype(np.float32))
    seq_beta = np.abs(_sequential32(dy) - beta)
    seq_gamma = np.maximum(np.abs(_sequential32(terms) - gam), np.abs(_sequential32(centred) * invstd - gam))
    s_beta = _sum_scale(dy, unit, seq_beta, 0.0)
    extra = unit * (2 * np.sqrt(np.einsum("cm,cm->c", terms, terms)) + np.abs(mean) * invstd * np.abs(beta) + np.abs(gam))
    s_gamma = _sum_scale(terms, unit, seq_gamma, extra)
    k = np.abs(gamma) * invstd
    r = _rows(reference_src, fmt)
    s_src = k[:, None] * (unit * np.abs(dy)
                          + ((unit * np.abs(beta) + s_beta + unit * np.abs(mean) * invstd * np.abs(gam)) / m)[:, None]
                          + np.abs(xhat) * ((unit * np.abs(gam) + s_gamma) / m)[:, None]) + unit * np.abs(r)
    return {"diff_src": s_src, "diff_gamma": s_gamma, "diff_beta": s_beta}


def _ulp(value: float, dtype: np.dtype) -> float:
    """One ulp of `dtype` at |value|: 2**(floor(log2|value|) - mantissa bits)."""
    mantissa, minimum = FORMATS[np.dtype(dtype)]
    exponent = np.frexp(abs(value))[1] - 1 if value else minimum
    return float(np.ldexp(1.0, max(exponent, minimum) - mantissa))


def _moved(r: float, allowance: float, dtype: np.dtype, beyond: bool, slack: float = 1e-9) -> float:
    """r moved (toward zero when r > 0, else up) to the last value of `dtype` within `allowance` of it, or to the
    first one beyond. The allowance is this file's own float64 arithmetic and the judge's differs in the last bits,
    so a value within `slack` (relative) of the edge is stepped past; 0 where the allowance is exact (ulps)."""
    direction = -1.0 if r > 0 else 1.0
    edge = r + direction * allowance
    toward = np.array([direction * np.inf], dtype=dtype)
    value = np.array([edge], dtype=np.float64).astype(dtype)
    slack = slack * allowance
    while abs(float(value[0]) - r) > allowance - slack:  # inside
        value = np.nextafter(value, -toward)
    if beyond:
        while abs(float(value[0]) - r) <= allowance + slack:
            value = np.nextafter(value, toward)
    return float(value[0])


def _status(problem: dict, outputs: dict) -> dict[str, str]:
    report = bnbwd_cli.check(outputs, **_inputs(problem))
    return {row.name: row.status for row in report.result.outputs}


def _units(problem: dict, outputs: dict) -> dict[str, float]:
    report = bnbwd_cli.check(outputs, **_inputs(problem))
    return {row.name: row.comparison.max_units.value for row in report.result.outputs}


def _float64_kernel(problem: dict) -> dict:
    """A correct float64 kernel in its own order: pairwise float64 sums over (C, M) rows."""
    fmt = problem["data_format"]
    x, dy = _rows(problem["src"], fmt), _rows(problem["diff_dst"], fmt)
    mean, variance, gamma = (problem[k] for k in ("mean", "variance", "gamma"))
    invstd = 1 / np.sqrt(variance + problem["epsilon"])
    xhat = (x - mean[:, None]) * invstd[:, None]
    beta, gam = dy.sum(axis=1), (dy * xhat).sum(axis=1)
    rows = (gamma * invstd)[:, None] * (dy - beta[:, None] / x.shape[1] - xhat * gam[:, None] / x.shape[1])
    return {"diff_src": _from_rows(rows, problem["src"], fmt), "diff_gamma": gam, "diff_beta": beta}


def _correct_kernel(problem: dict) -> dict:
    all64 = problem["src"].dtype == F64 and problem["mean"].dtype == F64
    return _float64_kernel(problem) if all64 else zoo.kernel(problem, "blocked")


@pytest.mark.parametrize("data, stats, fmt", CASES, ids=["-".join(c) for c in CASES])
def test_a_correct_kernel_passes(data, stats, fmt):
    problem = _problem(data, stats, fmt)
    assert _status(problem, _correct_kernel(problem)) == dict.fromkeys(OUTPUTS, "pass")


def test_a_float32_kernel_fails_an_all_float64_problem():
    """All-float64 inputs: the unit is 2**-53, and a float32 kernel's roundings are far beyond K of them."""
    problem = _problem("f64", "f64", "NCX")
    outputs = {k: v.astype(F64) for k, v in zoo.kernel(problem, "blocked").items()}
    assert set(_status(problem, outputs).values()) == {"mismatch"}


def _pick(scale: np.ndarray, output: str) -> list[tuple[int, ...]]:
    """Elements to move one at a time: every channel of a sum; in diff_src the element with the largest scale in one
    channel, the smallest in another (the terms weigh differently there) and a fixed one in a third."""
    if output != "diff_src":
        return [(c,) for c in range(scale.shape[0])]
    channels = scale.shape[0]
    return [(0, int(np.argmax(scale[0]))), (1 % channels, int(np.argmin(scale[1 % channels]))), (2 % channels, 5)]


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("data, stats, fmt", CASES, ids=["-".join(c) for c in CASES])
def test_k_is_pinned_from_both_sides(data, stats, fmt, output):
    problem = _problem(data, stats, fmt)
    fmt = problem["data_format"]
    truth = bnbwd_cli.backward(**_inputs(problem))
    scale = _scales(problem, truth["diff_src"])[output]
    reference = truth[output]
    rows = _rows(reference, fmt, reference.dtype) if output == "diff_src" else reference
    for where in _pick(scale, output):
        r = float(rows[where])
        allowance = K[output] * float(scale[where]) + _ulp(r, reference.dtype)
        for beyond, status in ((False, "pass"), (True, "mismatch")):
            moved = rows.copy()
            moved[where] = _moved(r, allowance, reference.dtype, beyond)
            if output == "diff_src":
                moved = _from_rows(moved, reference, fmt)
            outcome = _status(problem, {**truth, output: moved})
            assert outcome == {**dict.fromkeys(OUTPUTS, "pass"), output: status}, \
                (where, beyond, _units(problem, {**truth, output: moved}))


def test_float32_outputs_of_an_all_float64_problem_are_judged_in_float32_units():
    """A kernel that writes float32 outputs accumulated in float32: the unit is 2**-24 (the coarser output decides),
    so a correct float32 kernel passes; the same outputs written as float64 claim float64 accuracy and fail."""
    problem = _problem("f64", "f64", "NCX")
    float32 = {k: v.astype(F32) for k, v in zoo.kernel(problem, "blocked").items()}
    assert _status(problem, float32) == dict.fromkeys(OUTPUTS, "pass")


# ---------------------------------------------------------------- the fixed rule (no inputs): per dtype, both sides

# dtype -> (atol, rtol): `bnbwd verify --help`'s defaults; an element also passes within one ulp of the dtype.
FIXED = {"f64": (1e-12, 1e-9), "f32": (1e-5, 1e-5), "f16": (1e-3, 1e-3), "bf16": (1e-2, 1.6e-2)}


@pytest.mark.parametrize("name", FIXED)
def test_fixed_tolerances_are_pinned_from_both_sides(cli, tmp_path, name):
    dtype = DTYPES[name]
    reference = np.random.default_rng(2).normal(size=512).astype(dtype)
    for directory in ("k", "r"):
        (tmp_path / directory).mkdir()
    np.save(tmp_path / "r" / "diff_src.npy", reference)
    atol, rtol = FIXED[name]
    for index in (0, 1, 2):
        r = float(reference[index])
        allowance = max(atol + rtol * abs(r), _ulp(r, dtype))
        for beyond, code in ((False, 0), (True, 1)):
            moved = reference.copy()
            moved[index] = _moved(r, allowance, dtype, beyond)
            np.save(tmp_path / "k" / "diff_src.npy", moved)
            result = cli("verify", tmp_path / "k", tmp_path / "r")
            assert result.exit_code == code, (index, beyond, result.output)


@pytest.mark.parametrize("name", ["f32", "bf16"])
@pytest.mark.parametrize("ulps", [1, 3])
def test_the_ulp_allowance_alone_is_pinned_from_both_sides(cli, tmp_path, name, ulps):
    """--atol 0 --rtol 0: an element passes within `ulps` ulps of the dtype (1 by default), not one more."""
    dtype = DTYPES[name]
    reference = np.random.default_rng(4).normal(size=64).astype(dtype)
    for directory in ("k", "r"):
        (tmp_path / directory).mkdir()
    np.save(tmp_path / "r" / "diff_src.npy", reference)
    flags = ["--atol", "0", "--rtol", "0", *(["--ulp", str(ulps)] if ulps != 1 else [])]
    r = float(reference[0])
    for beyond, code in ((False, 0), (True, 1)):
        moved = reference.copy()
        moved[0] = _moved(r, ulps * _ulp(r, dtype), dtype, beyond, slack=0.0)  # exactly `ulps` ulps passes
        np.save(tmp_path / "k" / "diff_src.npy", moved)
        result = cli("verify", tmp_path / "k", tmp_path / "r", *flags)
        assert result.exit_code == code, (beyond, result.output)


@pytest.mark.parametrize("allowance, allowed", [("2", 2), ("0.5%", 1), ("1%", 3)])  # 1.92 and 3.84 of 384 round down
def test_max_mismatch_is_pinned_from_both_sides(cli, tmp_path, allowance, allowed):
    """--max-mismatch N or P%: that many failing elements pass (P% of the size rounded down), one more fails."""
    reference = np.random.default_rng(6).normal(size=384).astype(np.float32)
    for directory in ("k", "r"):
        (tmp_path / directory).mkdir()
    np.save(tmp_path / "r" / "diff_src.npy", reference)
    for failing, code in ((allowed, 0), (allowed + 1, 1)):
        moved = reference.copy()
        moved[:failing] += 1.0
        np.save(tmp_path / "k" / "diff_src.npy", moved)
        result = cli("verify", tmp_path / "k", tmp_path / "r", "--max-mismatch", allowance, "--rel-l2", "1")
        assert result.exit_code == code, (failing, result.output)


# dtype -> the default bound on ||a - r||_2 / ||r||_2: 2**6 float32 epsilons, 2 of float16 / bfloat16
REL_L2 = {"f32": 2.0**6 * 2.0**-23, "f16": 2.0 * 2.0**-10, "bf16": 2.0 * 2.0**-7}


@pytest.mark.parametrize("name", REL_L2)
def test_the_relative_l2_bound_is_pinned_from_both_sides(cli, tmp_path, name):
    """Every element within its own tolerance, the whole output moved by just under, then just over, the default
    relative-L2 bound: the first passes, the second fails."""
    dtype, bound = DTYPES[name], REL_L2[name]
    atol, rtol = FIXED[name]
    low = 0.25 if name == "f16" else 0.5  # float16's atol dominates below 1: where moving every element still passes
    reference = np.random.default_rng(7).uniform(low, 2 * low, size=4096).astype(dtype)
    r = reference.astype(np.float64)
    candidates = [(r * (1 + bound * f)).astype(dtype) for f in np.linspace(0.9, 1.1, 401)]
    realised = [float(np.linalg.norm(a.astype(np.float64) - r) / np.linalg.norm(r)) for a in candidates]
    under = max((e, i) for i, e in enumerate(realised) if e <= bound * (1 - 1e-6))[1]
    over = min((e, i) for i, e in enumerate(realised) if e > bound * (1 + 1e-6))[1]
    for directory in ("k", "r"):
        (tmp_path / directory).mkdir()
    np.save(tmp_path / "r" / "diff_src.npy", reference)
    for index, code in ((under, 0), (over, 1)):
        moved = candidates[index]
        error = np.abs(moved.astype(np.float64) - r)
        assert np.all(error <= atol + rtol * np.abs(r)), "every element must pass on its own"
        np.save(tmp_path / "k" / "diff_src.npy", moved)
        result = cli("verify", tmp_path / "k", tmp_path / "r")
        assert result.exit_code == code, (realised[index] / bound, result.output)


@pytest.mark.parametrize("data, stats", [("f32", "f32"), ("bf16", "f32"), ("f16", "f16")])
def test_inference_modes_diff_src_scale_is_pinned_from_both_sides(data, stats):
    """Inference (TF's is_training=False): s_src = k*u*|dy| + u*|diff_src| (docs/tolerances.md), with no sums in
    it; an element at K of it passes, the next value fails (a looser or tighter scale fails one side)."""
    problem = _problem(data, stats, "NCX")
    inputs = {**_inputs(problem), "training": False}
    truth = bnbwd_cli.backward(**inputs)
    dy = _rows(problem["diff_dst"], "NCX")
    invstd = 1 / np.sqrt(problem["variance"].astype(np.float64) + problem["epsilon"])
    k = np.abs(problem["gamma"].astype(np.float64)) * invstd
    reference = truth["diff_src"]
    rows = _rows(reference, "NCX", reference.dtype)
    unit = U32
    scale = k[:, None] * unit * np.abs(dy) + unit * np.abs(rows.astype(np.float64))
    for where in _pick(scale, "diff_src"):
        r = float(rows[where])
        allowance = K["diff_src"] * float(scale[where]) + _ulp(r, reference.dtype)
        for beyond, status in ((False, "pass"), (True, "mismatch")):
            moved = rows.copy()
            moved[where] = _moved(r, allowance, reference.dtype, beyond)
            report = bnbwd_cli.check({**truth, "diff_src": _from_rows(moved, reference, "NCX")}, **inputs)
            assert {row.name: row.status for row in report.result.outputs}["diff_src"] == status, (where, beyond)
