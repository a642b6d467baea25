"""Hypotheses found by search (judge/diagnosis/subsets.py, params.py): part of a reduction missing or counted
twice, and per-channel parameters read at the wrong place. Each family of tools/bugs.py is planted at random
(sizes, offsets, channels hit; float32 and a 16-bit dtype; both layouts): the hint names the planted cause and
the subset or the index map that was planted, in words."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bnbwd_cli.judge import Judging, compare_sets
from tools import bugs, zoo

FAMILIES = ("partial_reduction", "param_misread", "param_axis")
GRID = [(family, dtype, fmt, seed) for family in FAMILIES for dtype in ("f32", "bf16" if family != "param_misread" else "f16")
        for fmt in ("NCX", "NXC") for seed in range(3)]


def _judge(problem: dict, outputs: dict):
    return compare_sets(outputs, zoo.bnbwd_outputs(problem), Judging(), inputs=zoo.inputs_of(problem))


def _hints(result) -> list:
    return [h for o in result.outputs for h in o.comparison.diagnosis]


@pytest.mark.parametrize("family, dtype, fmt, seed", GRID, ids=["-".join(map(str, g)) for g in GRID])
def test_the_planted_subset_or_map_is_named(family, dtype, fmt, seed):
    rng = np.random.default_rng(zlib.crc32(f"{family}/{dtype}/{fmt}/{seed}".encode()))
    planted = None
    while planted is None:
        planted = bugs.plant(family, rng, fmt, dtype, m_range=(400, 3000))
    result = _judge(planted.problem, planted.outputs)
    hints = _hints(result)
    assert result.status == "mismatch"
    assert {h.cause for h in hints} == {planted.bug.cause}, (planted.bug.hooks.get("_words"), [h.text for h in hints])
    words = planted.bug.hooks["_words"]
    assert all(words in h.text for h in hints), (words, hints[0].text)
    if "subset" in planted.bug.hooks:  # the subset's size, and the channels it was planted in
        mask, twice, channels = planted.bug.hooks["subset"]
        assert f"({np.count_nonzero(mask)} of {mask.size} elements" in hints[0].text
        assert ("count twice" if twice else "miss") in hints[0].text
        if channels is not None and len(channels) < planted.problem["mean"].shape[0]:
            assert hints[0].channels == tuple(channels)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_the_last_samples_missing_are_said_as_samples(fmt):
    """The last 2 of 8 samples left out of the sums: a tail of the storage order, said in samples."""
    shape = (8, 5, 6, 7) if fmt == "NCX" else (8, 6, 7, 5)
    problem = zoo.make_problem(np.random.default_rng(21), shape, fmt, np.float32, np.float32)
    result = _judge(problem, bugs.kernel(problem, {"skip_tail": 2 * 42}))
    hint = _hints(result)[0]
    assert hint.cause == "missing-tail" and "samples n=6..7 (the last 2 of 8)" in hint.text, hint.text


def test_rows_counted_twice_in_some_channels():
    """Rows h=3..4 of every sample counted twice in channels 1 and 4: the subset and the channels are named."""
    problem = zoo.make_problem(np.random.default_rng(22), (6, 6, 9, 10), "NCX", np.float32, np.float32)
    h = np.indices((6, 9, 10))[1].reshape(-1)
    outputs = bugs.kernel(problem, {"subset": ((h >= 3) & (h <= 4), True, (1, 4))})
    hint = _hints(_judge(problem, outputs))[0]
    assert hint.cause == "partial-reduction-doubled" and hint.channels == (1, 4), hint
    assert "count twice h=3..4 (2 of 9) (120 of 540 elements" in hint.text and "(c=1, 4)" in hint.text, hint.text


def test_gamma_reversed_is_named_with_its_map():
    problem = zoo.make_problem(np.random.default_rng(23), (4, 8, 9, 7), "NXC", np.float32, np.float32)
    outputs = bugs.kernel(problem, {"read_at": ("gamma", np.arange(7)[::-1].copy())})
    hint = _hints(_judge(problem, outputs))[0]
    assert hint.cause == "parameter-misread" and "gamma[C-1-c (the channels reversed)]" in hint.text, hint.text


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_correct_kernels_get_no_hint_from_the_searches(dtype):
    """A correct kernel on shapes where the searches have most to try (an axis as long as C, many lanes)."""
    for seed, shape in enumerate([(6, 8, 5, 8), (16, 4, 4, 4)]):
        problem = zoo.make_problem(np.random.default_rng(30 + seed), shape, "NCX", bugs.DTYPES[dtype], np.float32)
        result = _judge(problem, bugs.correct(problem))
        assert result.status == "pass" and not _hints(result)


PACKED = [(param, dtype, fmt) for param in ("mean invstd", "invstd elementwise", "invstd") for dtype in ("f32", "bf16")
          for fmt in ("NCX", "NXC")]


@pytest.mark.parametrize("param, dtype, fmt", PACKED, ids=["-".join(p).replace(" ", "+") for p in PACKED])
def test_statistics_read_together_or_in_the_elementwise_pass_only_are_named(param, dtype, fmt):
    """The mean and invstd read at one wrong index together (a packed array of statistics), invstd read at c XOR 1
    by the elementwise pass alone (the halves of a float2 load swapped; the sums use the right one), at random
    shapes and index maps: the cause, the map and which statistics, in words."""
    rng = np.random.default_rng(zlib.crc32(f"packed/{param}/{dtype}/{fmt}".encode()))
    shape = bugs.random_shape(rng, fmt, (400, 3000))
    c = 2 * int(rng.integers(3, 9))
    shape = (shape[0], c, *shape[2:]) if fmt == "NCX" else (*shape[:-1], c)
    problem = zoo.make_problem(rng, shape, fmt, bugs.DTYPES[dtype], np.float32)
    if rng.random() < 0.5 or param == "invstd":
        index, words = np.arange(c) ^ 1, "c XOR 1 (neighbouring channels swapped in pairs)"
    else:
        k = int(rng.integers(2, c // 2))
        index, words = (np.arange(c) + k) % c, f"c+{k} (wrapped around)"
    result = _judge(problem, bugs.kernel(problem, {"read_at": (param, index)}))
    hints = _hints(result)
    said = {"mean invstd": "the mean and invstd (both) read at the wrong channel: the kernel used mean and invstd",
            "invstd elementwise": "in the elementwise pass only (the sums use the right one), read at the wrong "
                                  "channel: the kernel used invstd",
            "invstd": "invstd (or the variance it comes from) read at the wrong channel: the kernel used invstd"}[param]
    assert result.status == "mismatch" and {h.cause for h in hints} == {"parameter-misread"}, [h.text for h in hints]
    assert f"{said}[{words}] for channel c" in hints[0].text, hints[0].text


WRITTEN = [(dtype, fmt, seed) for dtype in ("f32", "bf16") for fmt in ("NCX", "NXC") for seed in range(2)]


@pytest.mark.parametrize("dtype, fmt, seed", WRITTEN, ids=["-".join(map(str, g)) for g in WRITTEN])
def test_a_sum_written_from_part_of_its_reduction_is_named(dtype, fmt, seed):
    """diff_gamma (or diff_beta) written from part of each channel's elements (a range of samples, rows, lanes, the
    first t; missing or counted twice) while diff_src used the whole sums: the subset of the written sum alone."""
    rng = np.random.default_rng(zlib.crc32(f"written/{dtype}/{fmt}/{seed}".encode()))
    planted = None
    while planted is None or "subset_written" not in planted.bug.hooks:
        planted = bugs.plant("partial_reduction", rng, fmt, dtype, m_range=(400, 3000))
    name, mask, twice, channels = planted.bug.hooks["subset_written"]
    result = _judge(planted.problem, planted.outputs)
    hints = _hints(result)
    assert result.status == "mismatch" and {h.cause for h in hints} == {planted.bug.cause}, [h.text for h in hints]
    assert planted.bug.hooks["_words"] in hints[0].text, (planted.bug.hooks["_words"], hints[0].text)
    assert f"({np.count_nonzero(mask)} of {mask.size} elements" in hints[0].text
    assert "diff_src used the whole sums" in hints[0].text
    if channels is not None and len(channels) < planted.problem["mean"].shape[0]:
        assert hints[0].channels == tuple(channels)


@pytest.mark.parametrize("dtype, fmt", [(d, f) for d in ("f32", "bf16") for f in ("NCX", "NXC")])
def test_diff_dst_read_at_another_channel_by_the_elementwise_pass_is_named(dtype, fmt):
    """The elementwise pass reads channel c's diff_dst at c+1 (a channel pointer off by one), c-2 or c XOR 1; the sums
    use the right one: the map, in words."""
    rng = np.random.default_rng(zlib.crc32(f"dy-map/{dtype}/{fmt}".encode()))
    shape = bugs.random_shape(rng, fmt, (400, 3000))
    c = 2 * int(rng.integers(3, 8))
    shape = (shape[0], c, *shape[2:]) if fmt == "NCX" else (*shape[:-1], c)
    problem = zoo.make_problem(rng, shape, fmt, bugs.DTYPES[dtype], np.float32)
    index, words = [((np.arange(c) + 1) % c, "c+1 (wrapped around)"), ((np.arange(c) - 2) % c, "c-2 (wrapped around)"),
                    (np.arange(c) ^ 1, "c XOR 1 (neighbouring channels swapped in pairs)")][int(rng.integers(3))]
    result = _judge(problem, bugs.kernel(problem, {"dy_read_at": index}))
    hints = _hints(result)
    assert result.status == "mismatch" and {h.cause for h in hints} == {"parameter-misread"}, [h.text for h in hints]
    assert f"the elementwise pass read diff_dst at the wrong channel: dy[{words}] for channel c" in hints[0].text
