"""The heat map's data: failing elements counted over channel groups x blocks of each channel's positions (storage
order), so that a stride, a tail or a tile shows at a glance (render/picture.py draws it, render/json.py writes it).
Pure, like judge/where.py, whose view of the failing elements it shares."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge.failures import Failures, counts_dtype
from bnbwd_cli.judge.index_words import distinct

MAP_ROWS, MAP_COLUMNS = 16, 60  # at most: channel groups x blocks of each channel's positions


@dataclass(frozen=True)
class HeatMap:
    """Failing elements over channel groups (rows) x blocks of each channel's positions (columns: its other axes
    flattened in storage order, the channel's reduction order). ``channels``/``positions``: each row's and column's
    inclusive index range; ``failing`` and ``elements`` per cell."""

    channels: tuple[tuple[int, int], ...]
    positions: tuple[tuple[int, int], ...]
    failing: tuple[tuple[int, ...], ...]
    elements: tuple[tuple[int, ...], ...]

    def share(self, row: int, column: int) -> float:
        return self.failing[row][column] / self.elements[row][column]


def _edges(count: int, parts: int) -> np.ndarray:
    """Starts of at most ``parts`` nearly equal blocks of ``count`` items, and the end."""
    return distinct(np.linspace(0, count, min(parts, count) + 1).round().astype(np.int64))


def heat_map(mask: np.ndarray, channel_axis: int | None, rows: int = MAP_ROWS, columns: int = MAP_COLUMNS,
             failures: Failures | None = None) -> HeatMap | None:
    """The failing share per channel group x position block; None without a channel axis (or for a 1-D output)."""
    if channel_axis is None or mask.ndim < 2 or not mask.size:
        return None
    failures = failures or Failures(mask)
    shape = mask.shape
    count, inner = shape[channel_axis], math.prod(shape[channel_axis + 1:])
    span = mask.size // count
    group = next((g for g in range(max(1, -(-count // rows)), count + 1) if count % g == 0), count)
    equal = count // group >= min(rows, count) // 2  # channel groups of one size (else, for a prime C, unequal ones)
    row_edges = np.arange(0, count + 1, group) if equal else _edges(count, rows)
    column_edges = _edges(span, columns)
    elements = np.outer(np.diff(row_edges), np.diff(column_edges))
    if failures.count == mask.size:
        failing = elements
    elif failures.positions is not None:
        channel = failures.coordinate(channel_axis)  # (computed once: `where` reads it too)
        row = np.searchsorted(row_edges, channel, side="right") - 1
        column = np.searchsorted(column_edges, failures.per_position_of(channel_axis), side="right") - 1
        cells = np.bincount(row * (column_edges.size - 1) + column,
                            minlength=(row_edges.size - 1) * (column_edges.size - 1))
        failing = cells.reshape(row_edges.size - 1, column_edges.size - 1)
    elif inner == 1:  # channels last: each block of positions is a block of rows, added row by row
        rows_of = mask.reshape(span, count).view(np.uint8)
        widest = counts_dtype(int(np.diff(column_edges).max()))
        blocks = np.stack([rows_of[a:b].sum(axis=0, dtype=widest) for a, b in zip(column_edges[:-1], column_edges[1:])])
        failing = np.add.reduceat(blocks.astype(np.int64), row_edges[:-1], axis=1).T
    else:
        # channel groups first (one pass adding rows of bytes), then blocks of the far smaller (groups, positions)
        by_channel = mask.reshape(-1, count, inner).view(np.uint8)
        # (block by block, not np.add.reduceat(..., dtype=): reduceat casts element by element, ~10x slower)
        if equal:
            grouped = by_channel.reshape(-1, count // group, group, inner).sum(axis=2, dtype=counts_dtype(group))
        else:
            grouped = np.stack([by_channel[:, a:b].sum(axis=1, dtype=np.int32)
                                for a, b in zip(row_edges[:-1], row_edges[1:])], axis=1)
        by_group = np.moveaxis(grouped, 1, 0).reshape(row_edges.size - 1, span)
        failing = np.stack([by_group[:, a:b].sum(axis=1, dtype=np.int64)
                            for a, b in zip(column_edges[:-1], column_edges[1:])], axis=1)
    return HeatMap(tuple((int(a), int(b) - 1) for a, b in zip(row_edges[:-1], row_edges[1:])),
                   tuple((int(a), int(b) - 1) for a, b in zip(column_edges[:-1], column_edges[1:])),
                   tuple(tuple(int(v) for v in line) for line in failing),
                   tuple(tuple(int(v) for v in line) for line in elements))
