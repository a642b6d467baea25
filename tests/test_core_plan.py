"""The NumPy core's shortcuts against the order they stand for (core/plan.py): same bits, special values included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bnbwd_cli.core import numpy_core, plan, summary

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e308, 5e-324])


def folded_by_hand(column: list[float]) -> float:
    """plan's fold of one column written out with Python floats: the halving tree of plan.pair_sum."""
    hi, lo = list(column), [0.0] * len(column)
    length = len(hi)
    while length > 1:
        half = length // 2
        keep = length - half
        for i in range(half):
            hi[i], lo[i] = plan.pair_sum(hi[i], lo[i], hi[keep + i], lo[keep + i])
        length = keep
    return plan.fold_result(hi[0], lo[0]) if math.isfinite(hi[0]) else hi[0]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, any NaN matching any NaN (NumPy does not promise NaN payloads)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return bool((nan == np.isnan(b)).all() and (a.view(np.uint64)[~nan] == b.view(np.uint64)[~nan]).all())


@pytest.mark.parametrize("count", [1, 2, 3, 11, 32, 33, 100])
@pytest.mark.parametrize("columns", [1, 2, 7])
def test_fold_gives_the_trees_bits(rng, count, columns):
    partials = rng.normal(size=(count, 2, columns)) * 10.0 ** rng.integers(-5, 5, size=(count, 2, columns))
    partials[rng.random(partials.shape) < 0.15] = -0.0  # a column of -0.0 folds to +0.0 (0.0 + -0.0)
    if count > 1:
        partials[0, 0, 0] = np.inf
        partials[-1, 1, -1] = np.nan
    expected = np.array([[folded_by_hand(partials[:, q, c].tolist()) for c in range(columns)] for q in range(2)])
    assert same_bits(plan.fold(partials), expected)


def test_fold_of_one_partial_is_the_tree_of_one(rng):
    partials = np.concatenate([SPECIALS, rng.normal(size=8)])[None, :]
    expected = np.array([folded_by_hand([value]) for value in partials[0]])
    folded = plan.fold(partials)
    assert same_bits(folded, expected)
    assert not np.signbit(folded[1])  # -0.0 + 0.0: the tree's fold_result gives +0.0


@pytest.mark.parametrize("tiles", [[5, 7, 3], [400] * 30])
def test_folds_cut_by_channel_blocks_give_the_whole_folds_bits(rng, tiles):
    channels = 45
    partials = [rng.normal(size=(rows, 2, channels)) * 1e3 for rows in tiles]
    group = plan.Group(3, 3 + channels, tuple(plan.Tile(0, 1, 0, 1) for _ in tiles))
    jobs = numpy_core._fold_jobs([group], partials)
    assert len(jobs) == (1 if sum(tiles) < 1000 else 9)  # 12000 partials a channel: 1 MB blocks of 5 channels
    sums = np.full((2, 3 + channels), np.nan)
    for job in jobs:
        numpy_core._fold_block(sums, job)
    assert same_bits(sums[:, 3:], plan.fold(np.concatenate(partials)))


@pytest.mark.parametrize("shape", [(64, 1, 3136), (3, 2, 300), (5, 4, 3), (7, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_extremes_of_strided_and_contiguous_blocks(rng, shape, dtype):
    whole = rng.normal(size=(shape[0], shape[1] + 2, shape[2])).astype(dtype)
    for block in (whole[:, 1 : 1 + shape[1]], np.ascontiguousarray(whole[:, 1 : 1 + shape[1]])):
        assert summary.extremes(block) == (block.min(), block.max())
    whole[-1, 1, -1] = np.nan
    low, high = summary.extremes(whole[:, 1 : 1 + shape[1]])
    assert np.isnan(low) and np.isnan(high)
