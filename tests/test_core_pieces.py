"""The NumPy core works each tile in pieces of rows (numpy_core.PIECE_ELEMENTS), carrying a chunk's lane sums
from piece to piece: that may change no bit. Every piece size, from one row group a piece to whole tiles, gives
the golden hashes."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.core import Op, Settings, backward, numpy_core
from tests.golden import all_hashes, load_golden


@pytest.mark.parametrize("piece", [1, 700, 5000, 1 << 22])
def test_any_piece_size_gives_the_golden_bits(monkeypatch, piece):
    monkeypatch.setattr(numpy_core, "PIECE_ELEMENTS", piece)
    assert all_hashes("numpy", threads=2) == load_golden()


def test_pieces_that_cut_chunks_give_whole_chunks_bits(monkeypatch, rng):
    """An NXC tensor whose rows end in a part row group, cut into pieces of a few row groups (each carrying its
    chunk's lane sums) over small tiles and two threads: the bits and stats of whole-chunk pieces."""
    src = rng.standard_normal((2 * 1024 + 37, 5)).astype(np.float32)
    dy = rng.standard_normal(src.shape).astype(np.float32)
    mean, variance = rng.normal(size=5).astype(np.float32), rng.uniform(0.5, 2, 5).astype(np.float32)
    gamma = np.array([1.0, 1e-30, -2.0, 3.0, 0.5], np.float32)
    op = Op(src, dy, mean, variance, gamma, epsilon=1e-5, data_format="NXC")
    whole = backward(op, Settings(core="numpy", threads=1))
    monkeypatch.setattr(numpy_core, "PIECE_ELEMENTS", 300)
    pieces = backward(op, Settings(core="numpy", threads=2, block_bytes=1 << 16))
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        assert getattr(pieces, name).tobytes() == getattr(whole, name).tobytes()
    assert pieces.stats == whole.stats
