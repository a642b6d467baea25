"""The fixed reduction order, and the tiles that respect it: chosen from the shape alone.

Every sum over a channel's M = N·S elements of the (N, C, S) view runs in one order, fixed
by (N, C, S) and never by the thread count, the cache budget, --block-size or --stream, so
that both cores, in any configuration, produce the same float64 sums bit for bit:

- *lanes*: rows are taken `rows_per_lane` at a time (r0, so that a row group spans at least
  LANES elements of one channel: NXC rows hold one per channel; counting one channel's elements,
  not the row's, keeps the order independent of C, so a run split into channel blocks (--stream)
  gives the same bits); a channel's lanes in such a group are (t, s), t < r0.
  With r0 = 1 and S > LANE_BLOCK, the lanes are cut into blocks of LANE_BLOCK.
- *chunks*: `chunk_rows` consecutive rows (K = CHUNK_GROUPS row groups). In a chunk every lane sums
  its K values in row order, starting from 0.0 (vectorisable in both cores: lanes are independent).
- each (chunk, block) reduces its lanes by a fixed halving tree (`lane_tree`): a *partial*.
- a channel's partials, in (chunk, block) order, are folded by the same halving tree, but of
  double-doubles (`fold`, `pair_sum`): error ~log2(J)·2⁻¹⁰⁶ of the partials' size on top of
  each partial's own (K + log2 lanes)·2⁻⁵³ of its values' size. A tree, not a running sum:
  NumPy does it in log2(J) vector steps (NXC has thousands of partials a channel).

Tiles (the NumPy core's units of work) hold whole chunks and blocks, and a tile that holds
only some of a channel's blocks holds one chunk, so partials come out in (chunk, block) order.
The arithmetic below (pair_sum, fold_result, coefficients) is written once with plain operators
and serves both cores: NumPy runs it on per-channel arrays, numba compiles it for scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# A row group spans at least this many elements of one channel. NXC rows hold one per channel, so 16 lanes make
# 1024-row chunks: fewer partials to fold than 1 lane's 64-row chunks (bench/RESULTS.md, "The core's constants").
LANES = 16
LANE_BLOCK = 4096  # at most this many lanes of one channel go into one tree (>= 2·LANES: r0 > 1 means one block)
# Row groups in a chunk: every lane sums this many values in a row (the bound on the lane sums' error). Always
# this many, whatever the lanes: a cap on a chunk's elements instead cut large planes into short chunks, and so
# into more trees and folds a channel, for no gain in accuracy.
CHUNK_GROUPS = 64
TREE_COPY_ROWS = 16  # lane_tree: this many rows (quantities x chunks x channels x blocks) or more go lanes-first
SCALAR_FOLD_MAX = 64  # partials (all columns) at most this many: plan.fold runs on Python floats
# Working sets smaller than this are not split for threads: they run in one thread (numpy_core), in one group.
# Below it (f32 tensors under ~0.47 M elements) a pool's start and hand-offs cost more than the threads save
# (bench/RESULTS.md, "The core's constants").
SPREAD_MIN_BYTES = 16 << 20
MIN_GROUPS = 16  # channel groups of the whole-plane tiles: enough to share between threads, whatever their count


@dataclass(frozen=True)
class Geometry:
    """The reduction order of an (N, C, S) problem (see the module docstring)."""

    n: int
    c: int
    s: int
    rows_per_lane: int  # r0: rows in one row group
    groups_per_chunk: int  # K: row groups in one chunk

    @property
    def chunk_rows(self) -> int:
        return self.rows_per_lane * self.groups_per_chunk

    @property
    def chunks(self) -> int:
        return -(-self.n // self.chunk_rows)

    @property
    def block_lanes(self) -> int:
        """s positions in one lane block (the whole of S when rows are grouped)."""
        return self.s if self.rows_per_lane > 1 else min(self.s, LANE_BLOCK)

    @property
    def blocks(self) -> int:
        return -(-self.s // self.block_lanes) if self.s else 1

    @property
    def partials(self) -> int:
        """Partials per channel: (chunk, block) pairs, in that order."""
        return self.chunks * self.blocks


def geometry(n: int, c: int, s: int) -> Geometry:
    """The reduction order for an (N, C, S) view: a function of the shape alone."""
    row = max(s, 1)  # one channel's share of a row: the order must not depend on C (--stream splits channels)
    rows_per_lane = 1 if row >= LANES else -(-LANES // row)
    return Geometry(n, c, s, rows_per_lane, CHUNK_GROUPS)


# ---------------------------------------------------------------- arithmetic shared by both cores


def lane_tree(lanes: np.ndarray) -> np.ndarray:
    """Reduce the last axis by the fixed halving tree: lanes[i] += lanes[keep + i], length -> keep.

    Runs in place, or when there are TREE_COPY_ROWS rows or more on a lanes-first copy, where each step is one
    contiguous block instead of a short run a row (cheaper once there are enough rows to pay for the copy).
    The additions are the same either way.
    """
    work = np.moveaxis(lanes, -1, 0)
    if 1 < lanes.shape[-1] and lanes.size >= TREE_COPY_ROWS * lanes.shape[-1]:  # one lane: nothing to add
        work = np.ascontiguousarray(work)
    length = work.shape[0]
    while length > 1:
        half = length // 2
        keep = length - half
        work[:half] += work[keep:length]
        length = keep
    return work[0]


def pair_sum(hi_a, lo_a, hi_b, lo_b):
    """(hi_a, lo_a) + (hi_b, lo_b) as a double-double: hi the rounded sum of the his (TwoSum), lo the errors."""
    total = hi_a + hi_b
    back = total - hi_a
    error = (hi_a - (total - back)) + (hi_b - back)
    return total, (lo_a + lo_b) + error


def fold_result(hi, lo):
    """hi + lo rounded once; an Inf or NaN sum stays as IEEE order gives it (lo is NaN there)."""
    return hi + lo


def coefficients(sum_dy, sum_dy_d, invstd, count):
    """(mean(dy), invstd·mean(dy·xhat), Σdy·xhat) from Σdy and Σdy·(src - mean), float64.

    diff_src = scale·((dy - mean(dy)) - (src - mean)·k): k = invstd·mean(dy·xhat) is invstd²·Σdy·(src - mean)/M,
    formed as invstd·((Σ·invstd)/M) so that neither invstd² nor Σ/M alone needs to be representable.
    """
    dy_xhat = sum_dy_d * invstd
    return sum_dy / count, invstd * (dy_xhat / count), dy_xhat


def fold(partials: np.ndarray) -> np.ndarray:
    """Fold partials (J, ...) along axis 0 by the fixed halving tree of double-doubles; float64 (...).

    Pairs as lane_tree does (i with keep + i), so the whole fold is log2(J) vector steps, not J scalar ones;
    pair_sum's operations, written with out= into two scratch arrays (no temporaries of J/2 rows a step).
    """
    if partials.shape[0] == 0:
        return np.zeros(partials.shape[1:])
    if partials.shape[0] == 1:  # nothing to pair: hi + 0.0, as the tree's fold_result gives it
        hi = np.asarray(partials[0], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            return np.where(np.isfinite(hi), fold_result(hi, 0.0), hi)
    if partials.size <= SCALAR_FOLD_MAX:
        columns = np.asarray(partials, dtype=np.float64).reshape(partials.shape[0], -1).T.tolist()
        return np.array([_fold_scalars(column) for column in columns]).reshape(partials.shape[1:])
    hi = np.array(partials, dtype=np.float64)
    lo = np.zeros_like(hi)
    total, back = np.empty_like(hi[: len(hi) // 2]), np.empty_like(hi[: len(hi) // 2])
    length = hi.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        while length > 1:
            half = length // 2
            keep = length - half
            a, b, t, r = hi[:half], hi[keep:length], total[:half], back[:half]
            np.add(a, b, out=t)  # pair_sum, step by step: t = a + b; r = t - a; error = (a - (t - r)) + (b - r)
            np.subtract(t, a, out=r)
            np.subtract(b, r, out=b)  # b's slot is free after this step: b - r goes there
            np.subtract(t, r, out=r)
            np.subtract(a, r, out=a)
            a += b  # the error
            lo[:half] += lo[keep:length]
            lo[:half] += a
            hi[:half] = t
            length = keep
        return np.where(np.isfinite(hi[0]), fold_result(hi[0], lo[0]), hi[0])


def _fold_scalars(hi: list[float]) -> float:
    """fold of one column of partials with Python floats (IEEE doubles, the same bits): for a few partials
    the ~40 NumPy calls of the vector fold cost more than this loop (NCX planes: one channel, ~11 partials)."""
    lo = [0.0] * len(hi)
    length = len(hi)
    while length > 1:
        half = length // 2
        keep = length - half
        for i in range(half):
            hi[i], lo[i] = pair_sum(hi[i], lo[i], hi[keep + i], lo[keep + i])
        length = keep
    return fold_result(hi[0], lo[0]) if math.isfinite(hi[0]) else hi[0]


def split_scale(gamma: np.ndarray, invstd: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """scale = gamma·invstd as (mantissa, power of two) where the plain product would overflow or underflow.

    Returns (scale, None) when every channel's product is a normal float64 (or gamma/invstd is not finite);
    otherwise (m, e) with gamma·invstd = m·2**e, applied to a result as ldexp(result·m, e): one rounding
    more only where the result is subnormal.
    """
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        scale = gamma * invstd
    finite = np.isfinite(gamma) & np.isfinite(invstd) & (gamma != 0) & (invstd != 0)
    unsafe = finite & ((np.abs(scale) < np.finfo(np.float64).tiny) | ~np.isfinite(scale))
    if not unsafe.any():
        return scale, None
    gm, ge = np.frexp(gamma)
    im, ie = np.frexp(invstd)
    mantissa = np.where(unsafe, gm * im, scale)
    exponent = np.where(unsafe, ge + ie, 0).astype(np.int64)
    return mantissa, exponent


# ---------------------------------------------------------------- tiles of the NumPy core


@dataclass(frozen=True)
class Tile:
    n0: int
    n1: int
    s0: int
    s1: int


@dataclass(frozen=True)
class Group:
    """A channel range and the tiles that cover it; one tile means both passes fuse."""

    c0: int
    c1: int
    tiles: tuple[Tile, ...]


def worth_threads(shape: Geometry, bytes_per_element: int) -> bool:
    """Whether the problem's working set is big enough to share between threads (never changes the bits)."""
    return shape.n * shape.c * shape.s * bytes_per_element >= SPREAD_MIN_BYTES


def plan_groups(shape: Geometry, bytes_per_element: int, budget: int, row_mode: bool) -> list[Group]:
    """Cover the (N, C, S) view with tiles of about `budget` bytes of working set, whole chunks and blocks each.

    The budget changes only how the work is cut, never the result: tiles hold whole chunks (and whole lane
    blocks), and the sums are formed per chunk.
    """
    n, c, s = shape.n, shape.c, shape.s
    per_budget = max(budget // bytes_per_element, 1)  # elements one tile may hold
    step = shape.chunk_rows

    def row_tiles(rows: int) -> tuple[Tile, ...]:
        rows = max(rows // step, 1) * step
        return tuple(Tile(n0, min(n0 + rows, n), 0, s) for n0 in range(0, n, rows))

    if row_mode and s * step <= per_budget:
        # Rows of (channels x S) are contiguous: tile by row ranges over as many channels as fit.
        width = c if c * s * step <= per_budget else max(per_budget // (s * step), 1)
        tiles = row_tiles(per_budget // (width * s))
        return [Group(c0, min(c0 + width, c), tiles) for c0 in range(0, c, width)]
    plane = n * s
    if plane <= per_budget:
        # Spread the channels over MIN_GROUPS groups for the threads, unless the problem is too small to share:
        # then one group saves the per-tile call overhead of the other groups, which dominates a small problem.
        width = max(min(per_budget // plane, -(-c // MIN_GROUPS) if worth_threads(shape, bytes_per_element) else c), 1)
        return [Group(c0, min(c0 + width, c), (Tile(0, n, 0, s),)) for c0 in range(0, c, width)]
    if s * step <= per_budget or shape.blocks == 1:
        tiles = row_tiles(per_budget // s)
    else:  # one chunk of rows a tile, a range of lane blocks
        lanes = max(per_budget // (step * shape.block_lanes), 1) * shape.block_lanes
        tiles = tuple(Tile(n0, min(n0 + step, n), s0, min(s0 + lanes, s))
                      for n0 in range(0, n, step) for s0 in range(0, s, lanes))
    return [Group(ch, ch + 1, tiles) for ch in range(c)]


def tile_partials(tile: Tile, shape: Geometry) -> tuple[int, int]:
    """(first partial index, count) of a tile's partials, per channel, in (chunk, block) order."""
    chunk0 = tile.n0 // shape.chunk_rows
    chunks = -(-(tile.n1 - tile.n0) // shape.chunk_rows)
    block0 = tile.s0 // shape.block_lanes
    blocks = -(-(tile.s1 - tile.s0) // shape.block_lanes)
    return chunk0 * shape.blocks + block0, chunks * blocks


def rows_of_chunk(shape: Geometry, chunk: int) -> tuple[int, int]:
    return chunk * shape.chunk_rows, min((chunk + 1) * shape.chunk_rows, shape.n)

