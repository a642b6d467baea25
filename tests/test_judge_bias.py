"""The systematic-deviation fit (judge/bias.py): its sums are the sums they claim to be, the same bits however a
block is cut into pieces, and the fit recovers a planted scale.

ChannelRegression keeps, per clustering (by diff_dst, by reference), channel and cluster, the entries of X'X and
X'd for the basis X = [1, xhat, r] and d = a - r over the usable (finite) elements. The sums here are stated
directly (a one-hot cluster matrix), not by the production code's bincount route.
"""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.dtypes import ulp_spacing
from bnbwd_cli.judge import bias
from bnbwd_cli.judge.bias import CLUSTERS, ChannelRegression, cluster_of

SHAPE = (3, 6, 40)  # a block: (n, c, s)


def _blocks(rng: np.random.Generator, non_finite: bool):
    xhat = rng.standard_normal(SHAPE)
    reference = rng.standard_normal(SHAPE).astype(np.float32).astype(np.float64)
    actual = (reference + rng.choice([0.0, 1e-7, 1e-3], size=SHAPE)).astype(np.float32).astype(np.float64)
    diff_dst = rng.choice([-1.0, 0.5, 2.0, 3.0], size=SHAPE)
    if non_finite:
        actual[0, 1, 3], reference[2, 4, 5], xhat[1, 0, 7], actual[1, 2, 2] = np.nan, np.inf, np.nan, -np.inf
    return xhat, reference, actual, diff_dst


def _stated_sums(blocks: list[tuple], channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cross, dd, ulp_squares) by definition: per clustering, channel and cluster, the sums over the usable
    elements of 1, x, r, x*x, x*r, r*r (X'X's upper triangle) and d, x*d, r*d (X'd); dd = sum d*d; ulp_squares =
    sum of the actual output's ulp spacing squared."""
    cross = np.zeros((2, channels, CLUSTERS, 9))
    dd, ulp_squares = np.zeros(channels), np.zeros(channels)
    for xhat, reference, actual, diff_dst, where in blocks:
        usable = np.isfinite(actual) & np.isfinite(reference) & np.isfinite(xhat)
        x, r, a = (np.where(usable, v, 0.0) for v in (xhat, reference, actual))
        d = a - r
        w = usable.astype(np.float64)
        products = (w, x, r, x * x, x * r, r * r, d, x * d, r * d)
        for clustering, key in enumerate((diff_dst, reference)):
            one_hot = (cluster_of(key)[..., None] == np.arange(CLUSTERS)).astype(np.float64)  # (n, c, s, G)
            for k, values in enumerate(products):
                cross[clustering, where, :, k] += np.einsum("ncs,ncsg->cg", values, one_hot)
        dd[where] += (d * d).sum(axis=(0, 2))
        spacing = np.where(usable, ulp_spacing(a, "f32"), 0.0)
        ulp_squares[where] += (spacing * spacing).sum(axis=(0, 2))
    return cross, dd, ulp_squares


def test_cluster_of_is_a_function_of_the_value_into_every_cluster() -> None:
    rng = np.random.default_rng(1)
    key = rng.standard_normal((2, 3, 500))
    clusters = cluster_of(key)
    assert clusters.shape == key.shape and clusters.min() >= 0 and clusters.max() < CLUSTERS
    assert np.unique(clusters).size == CLUSTERS  # 3000 distinct values reach every cluster
    repeated = rng.choice([-1.0, 0.5, 2.0], size=(4, 5, 6))  # elements that share a value share a cluster
    for value in (-1.0, 0.5, 2.0):
        assert np.unique(cluster_of(repeated)[repeated == value]).size == 1
    assert np.array_equal(cluster_of(key.astype(np.float32)), cluster_of(key.astype(np.float32).astype(np.float64)))
    out = np.empty(key.shape, np.uint64)
    assert np.array_equal(cluster_of(key, out=out), clusters)


@pytest.mark.parametrize("non_finite", [False, True])
def test_regression_sums_are_the_stated_sums_whatever_the_piece_size(non_finite: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces that cut channels' runs (7), whole rows (64) or none (the block): the same bits, and the sums of the
    definition (to float64 rounding: the order of the additions differs)."""
    rng = np.random.default_rng(7)
    blocks = [(*_blocks(rng, non_finite), where) for where in (slice(0, 6), slice(6, 12), slice(0, 6))]
    regressions = []
    for piece in (7, 64, 1 << 15):
        monkeypatch.setattr(bias, "PIECE", piece)
        regression = ChannelRegression(12, "f32")
        for block in blocks:
            regression.add(*block)
        regressions.append(regression)
    first = regressions[0]
    for other in regressions[1:]:
        assert np.array_equal(other.cross, first.cross)
        assert np.array_equal(other.dd, first.dd) and np.array_equal(other.ulp_squares, first.ulp_squares)
    cross, dd, ulp_squares = _stated_sums(blocks, 12)
    assert np.array_equal(first.cross[..., 0], cross[..., 0])  # the counts: exact
    np.testing.assert_allclose(first.cross, cross, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(first.dd, dd, rtol=1e-12)
    np.testing.assert_allclose(first.ulp_squares, ulp_squares, rtol=1e-12)
    usable = 3 * (np.prod(SHAPE) - (4 if non_finite else 0))  # three blocks, four non-finite elements in each
    assert first.cross[0, :, :, 0].sum() == first.cross[1, :, :, 0].sum() == usable


def test_fit_recovers_a_planted_scale_offset_and_slope() -> None:
    """d = offset + slope*xhat + scale*r plus float32 rounding: the fit returns the three, the scale within a few
    of its standard errors; a channel of fewer than MIN_ELEMENTS elements gets no estimate (NaN)."""
    rng = np.random.default_rng(2)
    shape = (8, 5, 64)
    xhat = rng.standard_normal(shape)
    reference = rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    diff_dst = rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    offset, slope, scale = 1e-5, 2e-5, 1e-4
    actual = (reference * (1 + scale) + offset + slope * xhat).astype(np.float32).astype(np.float64)
    regression = ChannelRegression(6, "f32")
    regression.add(xhat, reference, actual, diff_dst, slice(0, 5))
    few = bias.MIN_ELEMENTS - 1
    regression.add(xhat[:1, :1, :few], reference[:1, :1, :few], actual[:1, :1, :few], diff_dst[:1, :1, :few], slice(5, 6))
    fit = regression.fit()
    assert np.all(np.abs(fit.scale[:5] - scale) <= 6 * fit.stderr[:5])
    assert np.all(fit.stderr[:5] < scale / 10)  # the planted scale is far beyond the noise
    np.testing.assert_allclose(fit.offset[:5], offset, rtol=0.05)
    np.testing.assert_allclose(fit.slope[:5], slope, rtol=0.05)
    assert np.isnan(fit.scale[5]) and np.isnan(fit.stderr[5])


def test_fit_of_a_correctly_rounded_output_finds_no_scale() -> None:
    """a = r rounded to float32 (r itself in float64): the deviation is rounding noise, its scale within the noise."""
    rng = np.random.default_rng(3)
    shape = (8, 4, 64)
    xhat = rng.standard_normal(shape)
    reference = rng.standard_normal(shape)
    actual = reference.astype(np.float32).astype(np.float64)
    regression = ChannelRegression(4, "f32")
    regression.add(xhat, reference, actual, rng.standard_normal(shape), slice(0, 4))
    fit = regression.fit()
    assert np.all(np.isfinite(fit.scale))
    assert np.all(np.abs(fit.scale) <= bias.BIAS_Z * fit.stderr)
