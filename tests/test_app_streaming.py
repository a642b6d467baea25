"""app/streaming.py: blocks of whole channels within the budget, and a streamed run's sums the same bits as the
in-memory run's (the reduction order is the shape's, not the block's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bnbwd_cli import core
from bnbwd_cli.app import streaming
from bnbwd_cli.app.streaming import channel_ranges, per_channel_bytes, run_streamed
from tests.conftest import make_inputs


@pytest.mark.parametrize("channels, per_channel, budget", [(10, 100, 350), (10, 100, 50), (7, 1, 1 << 20), (0, 8, 64)])
def test_channel_blocks_are_whole_contiguous_and_within_the_budget(channels, per_channel, budget):
    ranges = channel_ranges(channels, per_channel, budget)
    assert [c for c0, c1 in ranges for c in range(c0, c1)] == list(range(channels))
    assert all(c1 > c0 for c0, c1 in ranges)
    width = max(budget // per_channel, 1)  # at least one channel, however large
    assert all(c1 - c0 <= width for c0, c1 in ranges) and all(c1 - c0 == width for c0, c1 in ranges[:-1])


def test_a_channels_working_set_counts_every_element_of_it():
    assert per_channel_bytes((2, 3, 4, 5), 4, 1) == 2 * 4 * 5 * 4 * streaming.BYTES_PER_ELEMENT_FACTOR
    assert per_channel_bytes((2, 4, 5, 3), 2, 3) == 2 * 4 * 5 * 2 * streaming.BYTES_PER_ELEMENT_FACTOR


@pytest.mark.parametrize("fmt, shape", [("NCX", (3, 5, 7, 6)), ("NXC", (3, 7, 6, 5))])
def test_streamed_sums_are_the_in_memory_runs_bits(rng, monkeypatch, fmt, shape):
    arrays = make_inputs(rng, shape, fmt)
    axis = 1 if fmt == "NCX" else 3
    monkeypatch.setattr(streaming, "STREAM_BLOCK_BYTES", 2 * per_channel_bytes(shape, 4, axis))  # blocks of 2
    seen = []
    op = core.Op(arrays["src"], arrays["diff_dst"], arrays["mean"], arrays["variance"], arrays["gamma"], epsilon=1e-5,
                 data_format=fmt)
    settings = core.Settings(outputs=("diff_gamma", "diff_beta"), threads=1, core="numpy")
    streamed = run_streamed(op, replace(settings, progress=lambda done, total: seen.append((done, total))), None)
    whole = core.backward(op, settings)
    assert streamed.diff_gamma.tobytes() == whole.diff_gamma.tobytes()
    assert streamed.diff_beta.tobytes() == whole.diff_beta.tobytes()
    assert seen[-1] == (arrays["src"].size, arrays["src"].size)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
