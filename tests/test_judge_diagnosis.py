"""The diagnosis names planted bugs by tested hypotheses (judge/diagnosis/), and never a wrong cause.

Each bug family of tools/bugs.py is planted in float32 and in a 16-bit dtype, in both layouts, at a
random shape (seeded per case): the hint's cause must be the planted one and no other cause may be
named. Correct kernels get no hint. tools/diagnosis_check.py draws many more at random.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from tools import bugs, zoo
from tests.oracle import backward_arrays

SIXTEEN = {name: ("f16" if k % 2 else "bf16") for k, name in enumerate(sorted(bugs.FAMILIES))}
GRID = [(family, dtype, fmt) for family in sorted(bugs.FAMILIES) for dtype in ("f32", SIXTEEN[family])
        for fmt in ("NCX", "NXC") if not (family == "truncation" and dtype == "f32")]


def _truth(problem: dict) -> dict:
    result = backward_arrays(problem["src"], problem["diff_dst"], problem["mean"], problem["variance"], problem["gamma"],
                             epsilon=problem["epsilon"], data_format=problem["data_format"], core="numpy")
    return {"diff_src": result.diff_src, "diff_gamma": result.diff_gamma, "diff_beta": result.diff_beta}


def _judge(problem: dict, outputs: dict):
    return compare_sets(outputs, _truth(problem), Judging(), inputs=zoo.inputs_of(problem))


def _causes(result) -> set[str]:
    return {h.cause for o in result.outputs for h in o.comparison.diagnosis}


def _planted(family: str, dtype: str, fmt: str) -> bugs.Planted:
    rng = np.random.default_rng(zlib.crc32(f"{family}/{dtype}/{fmt}".encode()))
    for _ in range(20):  # a shape where the family has an instance (e.g. M not a multiple of the block)
        planted = bugs.plant(family, rng, fmt, dtype)
        if planted is not None:
            return planted
    raise AssertionError(f"no instance of {family}")


@pytest.mark.parametrize("family, dtype, fmt", GRID, ids=["-".join(g) for g in GRID])
def test_planted_bug_is_named(family, dtype, fmt):
    planted = _planted(family, dtype, fmt)
    result = _judge(planted.problem, planted.outputs)
    assert result.status == "mismatch"
    causes = _causes(result)
    hints = [o.comparison.hints for o in result.outputs]
    assert causes == {planted.bug.cause}, (planted.bug, planted.problem["src"].shape, hints)
    hint = next(h for o in result.outputs for h in o.comparison.diagnosis)
    assert hint.text and "%" in hint.text or "ulp" in hint.text or "grid" in hint.text or "within" in hint.text, hint


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_correct_kernels_get_no_hint(dtype, fmt):
    rng = np.random.default_rng(zlib.crc32(f"correct/{dtype}/{fmt}".encode()))
    for _ in range(3):
        problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, bugs.DTYPES[dtype], np.float32)
        result = _judge(problem, bugs.correct(problem))
        assert result.status == "pass" and not _causes(result) and all(not o.comparison.hints for o in result.outputs)


def test_channels_hit_are_named():
    """A partial sum lost in two channels: the hint names those channels and the block size."""
    problem = zoo.make_problem(np.random.default_rng(7), (6, 8, 16, 20), "NCX", np.float32, np.float32)
    outputs = bugs.kernel(problem, {"block": 128, "lost": {2: 3, 5: 7}})
    result = _judge(problem, outputs)
    hint = next(o.comparison.diagnosis[0] for o in result.outputs if o.comparison.diagnosis)
    assert hint.cause == "lost-partial-sum" and hint.channels == (2, 5), hint
    assert "partial sum of 128 elements" in hint.text and "c=2, 5" in hint.text, hint.text


def test_missing_tail_finds_the_block():
    problem = zoo.make_problem(np.random.default_rng(8), (5, 15, 20, 8), "NXC", np.float32, np.float32)  # M = 1500
    result = _judge(problem, bugs.kernel(problem, {"skip_tail": 1500 % 256, "block": 256}))
    hint = next(o.comparison.diagnosis[0] for o in result.outputs if o.comparison.diagnosis)
    assert hint.cause == "missing-tail" and "last 220 elements" in hint.text and "256" in hint.text, hint.text


def test_mean_dy_names_its_channels():
    problem = zoo.make_problem(np.random.default_rng(9), (4, 6, 12, 10), "NCX", np.float32, np.float32)
    result = _judge(problem, bugs.kernel(problem, {"no_mean_dy": (1, 4)}))
    hint = next(o.comparison.diagnosis[0] for o in result.outputs if o.comparison.diagnosis)
    assert hint.cause == "mean-dy-not-subtracted" and hint.channels == (1, 4), hint


def test_variance_holding_invstd_suggests_the_flag():
    """PyTorch's save_invstd passed as `variance`: bnbwd checks it against src and the mean."""
    problem = zoo.make_problem(np.random.default_rng(10), (4, 5, 9, 11), "NXC", np.float32, np.float32)
    invstd = (1 / np.sqrt(problem["variance"].astype(np.float64) + problem["epsilon"])).astype(np.float32)
    problem = dict(problem, variance=invstd)
    result = _judge(problem, bugs.kernel(problem, {"invstd_given": True}))
    hints = [h for o in result.outputs for h in o.comparison.diagnosis]
    assert {h.cause for h in hints} == {"variance-holds-invstd"} and "--variance-is-invstd" in hints[0].text


def test_unexplained_deviation_says_so_and_points_at_channels():
    """Noise added to one channel: no hypothesis explains it, and the hint says so and names the channel."""
    problem = zoo.make_problem(np.random.default_rng(11), (4, 6, 10, 12), "NCX", np.float32, np.float32)
    outputs = bugs.correct(problem)
    outputs["diff_src"] = outputs["diff_src"].copy()
    outputs["diff_src"][:, 3] += np.random.default_rng(0).normal(0, 0.01, outputs["diff_src"][:, 3].shape).astype(np.float32)
    result = _judge(problem, outputs)
    hint = next(o.comparison.diagnosis[-1] for o in result.outputs if o.name == "diff_src")
    assert hint.cause == "unexplained" and hint.channels == (3,) and "no tested hypothesis" in hint.text, hint


def test_no_diagnosis_for_a_passing_run(monkeypatch):
    """A passing run pays nothing: the engine is not entered."""
    from bnbwd_cli.judge import diagnosis

    problem = zoo.make_problem(np.random.default_rng(12), (4, 6, 10, 12), "NCX", np.float32, np.float32)
    monkeypatch.setattr(diagnosis, "build_case", lambda *a: pytest.fail("diagnosis ran on a passing run"))
    assert _judge(problem, bugs.correct(problem)).status == "pass"


# --- the policies (docs/tolerances.md, "Hints") ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_truncating_conversion_fails_with_its_hint(dtype):
    problem = zoo.make_problem(np.random.default_rng(13), (8, 6, 12, 14), "NXC", bugs.DTYPES[dtype], np.float32)
    result = _judge(problem, bugs.kernel(problem, {"truncate": True}))
    assert result.status == "mismatch" and _causes(result) == {"truncating-conversion"}


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_double_rounding_passes(fmt):
    """f64 -> f32 -> bf16: no bias, what every float32-accumulating bf16 kernel does."""
    problem = zoo.make_problem(np.random.default_rng(14), zoo.shape_for(20_000, 6, fmt), fmt, bugs.BF16, np.float32)
    exact = {k: np.asarray(v, np.float64) for k, v in zoo.exact_outputs(problem).items()}
    for key in ("diff_src", "diff_gamma", "diff_beta"):
        exact[key] = backward_arrays(problem["src"].astype(np.float64), problem["diff_dst"].astype(np.float64),
                                     problem["mean"].astype(np.float64), problem["variance"].astype(np.float64),
                                     problem["gamma"].astype(np.float64), epsilon=problem["epsilon"],
                                     data_format=fmt, core="numpy").__getattribute__(key)
    outputs = {"diff_src": exact["diff_src"].astype(np.float32).astype(ml_dtypes.bfloat16),
               "diff_gamma": exact["diff_gamma"].astype(np.float32), "diff_beta": exact["diff_beta"].astype(np.float32)}
    result = _judge(problem, outputs)
    assert result.status == "pass" and not _causes(result)


def test_single_pass_formula_passes_on_centred_data():
    problem = zoo.make_problem(np.random.default_rng(15), zoo.shape_for(20_000, 6, "NCX"), "NCX", np.float32, np.float32)
    assert _judge(problem, bugs.kernel(problem, {"single_pass": True})).status == "pass"


def test_single_pass_formula_fails_with_the_cancellation_hint_when_it_loses_digits():
    """|mean|/sd ~ 500: sum(x*dy) - mean*sum(dy) cancels about 9 bits in float32."""
    problem = zoo.make_problem(np.random.default_rng(16), zoo.shape_for(20_000, 6, "NCX"), "NCX", np.float32, np.float32,
                               center=1e3)
    result = _judge(problem, bugs.kernel(problem, {"single_pass": True}))
    assert result.status == "mismatch" and _causes(result) == {"single-pass-cancellation"}


def test_every_cause_is_documented():
    """docs/tolerances.md lists every cause id the diagnosis can name, with its test."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    source = "".join(p.read_text() for p in (root / "bnbwd_cli" / "judge" / "diagnosis").glob("*.py"))
    causes = set(re.findall(r'(?:Candidate|Hint)\(\s*"([a-z0-9/-]+)"', source))
    assert len(causes) >= 20, causes
    docs = (root / "docs" / "tolerances.md").read_text()
    assert not [c for c in causes if f"`{c}`" not in docs]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_diff_src_written_in_the_other_layout_s_order_is_named(dtype, fmt):
    """diff_src computed right and written in the other layout's order (an NHWC buffer filled in NCHW order), at
    random shapes: the right values at the wrong places, said so (not "no relation to these inputs")."""
    rng = np.random.default_rng(zlib.crc32(f"written-layout/{dtype}/{fmt}".encode()))
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, bugs.DTYPES[dtype], np.float32)
    result = _judge(problem, bugs.kernel(problem, {"write_other_layout": True}))
    hints = [h for o in result.outputs for h in o.comparison.diagnosis]
    names = ("NCHW", "NHWC") if fmt == "NXC" else ("NHWC", "NCHW")
    assert result.status == "mismatch" and _causes(result) == {"layout-mixup"}, [h.text for h in hints]
    assert hints[0].text.startswith(f"diff_src was written in {names[0]} order into the {names[1]} buffer: the right "
                                    "values at the wrong places"), hints[0].text


@pytest.mark.parametrize("seed", [0, 3])
def test_sums_accumulated_in_16_bits_get_no_second_note_saying_so(seed):
    """float16 data, the sums accumulated in float16 (tools/zoo's accumulate16) and written as float32: the cause is
    named, and the computed-narrower note (their values are float16 values) would only say it again."""
    rng = np.random.default_rng(seed)
    fmt = ("NCX", "NXC")[seed % 2]
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt, (400, 4000)), fmt, np.dtype(np.float16), np.float32)
    result = _judge(problem, bugs.kernel(problem, {"accumulate16": np.float16}))
    assert result.status == "mismatch" and _causes(result) == {"16-bit-accumulation"}


@pytest.mark.parametrize("sixteen", ["bf16", "f16"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_diff_dst_read_in_16_bits_is_named(sixteen, fmt):
    """A float32 kernel that rounds diff_dst to bfloat16 or float16 before use (autocast), at a random shape: named
    with the type (screened on the sample: the deviation less k*(dy16 - dy) leaves only the sums' change)."""
    rng = np.random.default_rng(zlib.crc32(f"dy16/{sixteen}/{fmt}".encode()))
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, np.dtype(np.float32), np.float32)
    result = _judge(problem, bugs.kernel(problem, {"dy16": bugs.DTYPES[sixteen]}))
    hints = [h for o in result.outputs for h in o.comparison.diagnosis]
    name = {"bf16": "bfloat16", "f16": "float16"}[sixteen]
    assert result.status == "mismatch" and _causes(result) == {"16-bit-inputs"}, [h.text for h in hints]
    assert hints[0].text.startswith(f"the kernel read diff_dst rounded to {name} "), hints[0].text


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_samples_reduced_in_groups_are_named(dtype, fmt):
    """diff_src from the sums of each of G groups of samples alone (a data-parallel batch norm without its
    all-reduce), the weight gradients whole; G = N: per-sample statistics. Random shapes and group counts."""
    rng = np.random.default_rng(zlib.crc32(f"groups/{dtype}/{fmt}".encode()))
    n = int(rng.choice([4, 6, 8]))
    shape = bugs.random_shape(rng, fmt, (200, 800))
    shape = (n, *shape[1:])
    problem = zoo.make_problem(rng, shape, fmt, bugs.DTYPES[dtype], np.float32)
    for groups in (int(rng.choice([g for g in (2, 3, 4) if n % g == 0])), n):
        result = _judge(problem, bugs.kernel(problem, {"sample_groups": groups}))
        hints = [h for o in result.outputs for h in o.comparison.diagnosis]
        assert result.status == "mismatch" and _causes(result) == {"sample-group-sums"}, [h.text for h in hints]
        size = n // groups
        words = (f"diff_src used the sums of each group of {size} samples alone ({groups} groups" if size > 1 else
                 "diff_src used each sample's own sums")
        assert hints[0].text.startswith(words), hints[0].text


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_diff_src_written_with_the_samples_reversed_is_named(dtype, fmt):
    """diff_src computed right and written with its samples in reverse order: the right values at the wrong places
    (not "no relation to these inputs")."""
    rng = np.random.default_rng(zlib.crc32(f"reversed/{dtype}/{fmt}".encode()))
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, bugs.DTYPES[dtype], np.float32)
    outputs = bugs.correct(problem)
    outputs["diff_src"] = np.ascontiguousarray(outputs["diff_src"][::-1])
    result = _judge(problem, outputs)
    hints = [h for o in result.outputs for h in o.comparison.diagnosis]
    n = problem["src"].shape[0]
    assert result.status == "mismatch" and _causes(result) == {"samples-reversed"}, [h.text for h in hints]
    assert hints[0].text.startswith(f"diff_src was written with its {n} samples in reverse order"), hints[0].text


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_failures_that_are_all_zeros_are_said_so(fmt):
    """A kernel that writes 0 wherever |diff_src| < 1e-8 (normal numbers, no FTZ) in a channel of small values: no
    cause is named, and the hint says what the failures are: zeros where the reference is not, up to its size."""
    rng = np.random.default_rng(zlib.crc32(f"zeros/{fmt}".encode()))
    problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt), fmt, np.dtype(np.float32), np.float32)
    problem["gamma"][1] = np.float32(3e-8)  # channel 1's diff_src values ~1e-8: some below the threshold
    outputs = bugs.correct(problem)
    truth = _truth(problem)
    small = np.abs(truth["diff_src"].astype(np.float64)) < 1e-8
    outputs["diff_src"] = np.where(small, np.float32(0), outputs["diff_src"])
    result = _judge(problem, outputs)
    hints = [h for o in result.outputs for h in o.comparison.diagnosis]
    assert result.status == "mismatch" and _causes(result) == {"unexplained"}, [h.text for h in hints]
    assert "every failing element is 0 where the reference is not (|reference| up to 1e-08 there)" in hints[0].text, \
        hints[0].text
