"""The |a-r| histogram at its boundaries: a power of ten opens its own decade, max_bins decades fit without a
catch-all bin and one more decade makes the lowest bin collect everything below, and chunks add up to the whole."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.judge.histogram import Decades, log_histogram


def _bins(values, max_bins: int = 12) -> list[tuple[float, float, int]]:
    return [(b.low, b.high, b.count) for b in log_histogram(np.array(values, dtype=np.float64), max_bins)]


def test_a_power_of_ten_opens_its_decade():
    """10**k is in [10**k, 10**(k+1)), never in the decade below (a floor of log10, not a round or a ceiling)."""
    assert _bins([1e-3, 0.5e-2, 1.0, 10.0]) == [
        (0.0, 0.0, 0), (1e-3, pytest.approx(1e-2), 2), (pytest.approx(1e-2), pytest.approx(0.1), 0),
        (pytest.approx(0.1), 1.0, 0), (1.0, 10.0, 1), (10.0, 100.0, 1)]


def test_max_bins_decades_fit_and_one_more_folds_the_lowest_into_a_bin_from_zero():
    twelve = [10.0**k * 1.5 for k in range(-12, 0)]  # decades -12 .. -1
    fits = _bins(twelve, max_bins=12)
    assert len(fits) == 13 and fits[1][0] == pytest.approx(1e-12) and all(count == 1 for *_, count in fits[1:])
    folded = _bins([1.5e-13, *twelve], max_bins=12)  # decade -13 too: one past the limit
    assert len(folded) == 13
    assert folded[1] == (0.0, pytest.approx(1e-11), 2)  # [0, 1e-11): decades -13 and -12 together
    assert [count for *_, count in folded[2:]] == [1] * 11


def test_the_lowest_bin_counts_every_decade_below_it_and_exact_zeros_apart():
    bins = _bins([0.0, 1e-30, 2e-20, 3e-3, 4e-3], max_bins=1)
    assert bins == [(0.0, 0.0, 1), (0.0, pytest.approx(1e-2), 4)]


def test_an_error_past_the_largest_float_is_counted_in_the_top_decade():
    with np.errstate(over="ignore"):
        overflowed = abs(np.float64(1e308) - np.float64(-1e308))  # two finite values, |a - r| = inf
    bins = _bins([1e308, overflowed], max_bins=2)
    assert bins[-1] == (1e308, np.finfo(np.float64).max, 2)


def test_decades_fed_in_chunks_equal_the_whole():
    rng = np.random.default_rng(5)
    errors = np.where(rng.random(4000) < 0.1, 0.0, 10.0 ** rng.uniform(-20, 2, 4000))
    decades = Decades()
    for chunk in np.array_split(errors, 7):
        decades.update(chunk)
    assert decades.finish() == log_histogram(errors)
