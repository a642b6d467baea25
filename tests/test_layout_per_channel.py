"""layout.per_channel: a block's per-channel coefficients applied one channel at a time (long runs) or broadcast
(short runs, one channel) give the bits of the plain broadcast, for float64 and float32 blocks (a float32 block
is computed in float64, as against a float64 array), in place and into a new array."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli import layout


@pytest.mark.parametrize("shape", [(3, 5, 70), (3, 5, 64), (3, 5, 63), (4, 1, 200), (6, 7, 1)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("ufunc", [np.subtract, np.multiply])
def test_per_channel_gives_the_broadcast_bits(shape, dtype, ufunc) -> None:
    rng = np.random.default_rng(41)
    values = (rng.standard_normal(shape) * 1e3).astype(dtype)
    coefficients = rng.standard_normal(shape[1]) / 3  # not float32-representable: a float32 step would show
    expected = ufunc(values.astype(np.float64), coefficients[:, None])
    got = layout.per_channel(ufunc, values, coefficients)
    assert got.dtype == np.float64 and np.array_equal(got.view(np.int64), expected.view(np.int64))
    in_place = values.astype(np.float64)
    assert layout.per_channel(ufunc, in_place, coefficients, out=in_place) is in_place
    assert np.array_equal(in_place.view(np.int64), expected.view(np.int64))


def test_long_runs_of_several_channels_go_channel_by_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop is taken where it pays (several channels, runs of PER_CHANNEL_RUN or more), not elsewhere."""
    calls = []
    values = np.ones((2, 4, layout.PER_CHANNEL_RUN))

    def counting(*args, **kwargs):
        calls.append(np.shape(args[1]))
        return np.add(*args, **kwargs)

    layout.per_channel(counting, values, np.arange(4.0), out=values)
    assert calls == [()] * 4
    calls.clear()
    layout.per_channel(counting, np.ones((2, 4, layout.PER_CHANNEL_RUN - 1)), np.arange(4.0))
    assert calls == [(4, 1)]
