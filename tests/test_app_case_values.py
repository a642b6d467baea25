"""app/case_values.py: a case's values are the same bits everywhere (a counter-based splitmix64, no numpy.random,
no libm), and each recipe draws what it says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bnbwd_cli.app.case_values import Recipe, bell, draw, exact_statistics, stream_key, uniform

MASK = (1 << 64) - 1


def _splitmix64(key: int, count: int) -> list[float]:
    """The generator in Python integers (an independent oracle): splitmix64 of key + i * golden, top 53 bits."""
    values = []
    for i in range(1, count + 1):
        z = (key + i * 0x9E3779B97F4A7C15) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        values.append((z >> 11) * 2.0**-53)
    return values


def test_uniform_is_splitmix64_of_a_counter():
    key = stream_key("resnet-layer1", "src")
    assert uniform(key, 1000).tolist() == _splitmix64(int(key), 1000)
    assert stream_key("a", "b") != stream_key("a", "c") and stream_key("a/b") == stream_key("a", "b")


def test_bell_values_have_mean_zero_variance_one_and_stay_within_three():
    values = bell(stream_key("bell"), 200_000)
    assert abs(values.mean()) < 0.01 and abs(values.var() - 1.0) < 0.01 and np.abs(values).max() <= 3.0


def test_exact_statistics_are_correctly_rounded_where_pairwise_sums_are_not():
    row = np.array([1e16, 1.0, -1e16, 1.0] * 25)
    mean, variance = exact_statistics(row[None, :])
    assert mean[0] == 0.5 and row.sum() / row.size != 0.5  # NumPy's float64 sum loses the ones
    assert variance[0] == math.fsum((row - 0.5) ** 2) / row.size


def test_a_case_draws_the_same_bits_twice_and_another_case_others():
    shape = (4, 3, 10)
    first, again, other = (draw(name, Recipe(), shape, np.dtype(np.float32)) for name in ("c1", "c1", "c2"))
    for field in ("src", "diff_dst", "mean", "variance", "gamma"):
        assert getattr(first, field).tobytes() == getattr(again, field).tobytes()
    assert first.src.tobytes() != other.src.tobytes()


def test_batch_statistics_are_the_drawn_srcs_own():
    values = draw("stats", Recipe(), (3, 4, 25), np.dtype(np.float16))
    x = values.src.astype(np.float64).reshape(3, -1)
    assert values.src.dtype == np.float16 and values.mean.dtype == np.float32
    np.testing.assert_array_equal(values.mean, x.mean(axis=1).astype(np.float32))
    np.testing.assert_allclose(values.variance, x.var(axis=1), rtol=1e-6)


def _one_value_per_sample_and_channel(diff_dst: np.ndarray) -> bool:
    """A pool's gradient: constant over the positions of each (channel, sample), where the ReLU lets it through."""
    return all(len(set(row[row != 0].tolist())) <= 1 for row in diff_dst.reshape(-1, diff_dst.shape[-1]))


@pytest.mark.parametrize("recipe, check", [
    (Recipe(centre="tiny", epsilon=1e-4), lambda v: np.all(v.variance < 2e-3)),
    (Recipe(centre="offset"), lambda v: np.all(np.abs(v.mean) > 100 * np.sqrt(v.variance))),
    (Recipe(gamma="some_zero"), lambda v: np.all(v.gamma[::3] == 0) and np.all(v.gamma[1::3] != 0)),
    (Recipe(gamma="ones"), lambda v: np.all(v.gamma == 1)),
    (Recipe(diff_dst="relu"), lambda v: 0 < np.count_nonzero(v.diff_dst == 0) < v.diff_dst.size),
    (Recipe(diff_dst="pool"), lambda v: _one_value_per_sample_and_channel(v.diff_dst)),
    (Recipe(coarse=True), lambda v: np.all(v.src * 4 == np.round(v.src * 4)) and np.all(v.diff_dst == np.round(v.diff_dst))),
    (Recipe(stats="shifted"), lambda v: np.all(v.mean != v.src.astype(np.float64).reshape(8, -1).mean(axis=1).astype(np.float32))),
], ids=["tiny", "offset", "some_zero", "ones", "relu", "pool", "coarse", "shifted"])
def test_each_recipe_draws_what_it_says(recipe, check):
    assert check(draw("recipe", recipe, (8, 4, 12), np.dtype(np.float32)))
