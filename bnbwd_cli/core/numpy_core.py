"""The blocked NumPy core: batch-norm training backward over cache-sized tiles.

Pure: arrays in, arrays out; no files, no terminal.

The (N, C, S) view is cut into tiles of whole chunks (core/plan.py), so the result does not depend
on the budget or the thread count. A *group* is a range of channels; its *tiles* cover (n, s) ranges
of those channels. When a group fits the cache budget it is one tile and both passes run while the
tile is still in cache (~3 tensor passes of memory traffic); a group too big for the budget is reduced
tile by tile and then written tile by tile (~5 passes). NumPy releases the GIL inside its ufuncs, so
a thread pool over tiles uses every core.

Per tile, in float64: g = dy and d = src - mean (widened exactly), the lane sums of g and g·d per
chunk (plan.py's order), then diff_src = ((g - mean(dy)) - d·k)·scale rounded once to T1 (f16 by NumPy's
own cast, which rounds once; bf16 through float32 rounded to odd, which makes the second rounding exact). Only ufuncs: NumPy's
BLAS-backed calls (matmul, vecdot) were measured not to run concurrently from two threads.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.core import plan, summary
from bnbwd_cli.files import mapped
from bnbwd_cli.layout import per_channel
from bnbwd_cli.core.plan import Group, Tile
from bnbwd_cli.core.rounding import store
from bnbwd_cli.scratch import FLOAT64, Scratch

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from bnbwd_cli.core.views import Views
# Contiguous runs shorter than this make plane-wise tiles inefficient; tile by rows instead.
MIN_PLANE_RUN_BYTES = 512
# Memory-mapped inputs/outputs: drop their resident pages once the tiles since the last drop span this
# many bytes of src rows, so RSS stays bounded in out-of-core runs (a fault maps a whole page-cache
# folio, so a tile of a few channels of a row maps about the whole row).
RELEASE_BYTES = 4 << 20
# Split groups fold their partials (J, 2, channels) in blocks of channels of about this many bytes, shared by the
# pool: a block that stays in cache folds faster than the whole at once, and the pool can share the blocks.
FOLD_BLOCK_BYTES = 1 << 20


# ---------------------------------------------------------------- the per-tile passes


class _Kernel:
    """One backward computation over an (N, C, S) view; its methods are the per-tile passes."""

    def __init__(self, views: Views) -> None:
        self.views = views
        self.shape = views.geometry
        self.scratch = Scratch()
        # mean(dy) and k per channel, filled in by channel range once the range's sums are known
        self.mean_dy = np.zeros(views.geometry.c)
        self.k = np.zeros(views.geometry.c)
        self.extremes: list[tuple[float, float]] = []  # (min, max) of each written tile (rounding.store's values)

    @staticmethod
    def _widen(wide: np.ndarray, values: np.ndarray) -> np.ndarray:
        """wide (float64) = values, exactly: every f16/bf16/f32 value is a float64. NumPy's and ml_dtypes' own
        casts are the fastest way (faster than building the float64 bits from uint32 ones)."""
        np.copyto(wide, values)
        return wide

    def _load(self, group: Group, tile: Tile, need_d: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """gp (2, rows, channels, lanes) float64 with gp[0] = dy, and d = src - mean (or None)."""
        index = np.s_[tile.n0 : tile.n1, group.c0 : group.c1, tile.s0 : tile.s1]
        dy = self.views.dy3[index]
        gp = self.scratch.get("gp", (2, *dy.shape), FLOAT64)
        self._widen(gp[0], dy)
        if not need_d:
            return gp, None
        d = self._widen(self.scratch.get("d", dy.shape, FLOAT64), self.views.src3[index])
        per_channel(np.subtract, d, self.views.mean[group.c0 : group.c1], out=d)
        return gp, d

    def set_coefficients(self, c0: int, sums: np.ndarray) -> None:
        """mean(dy) and k of channels c0.. from their folded sums (2, channels)."""
        c1 = c0 + sums.shape[1]
        views = self.views
        if c1 == c0 + 1:  # one channel (an NCX plane): the same IEEE operations on Python floats, cheaper
            self.mean_dy[c0], self.k[c0], _ = plan.coefficients(float(sums[0, 0]), float(sums[1, 0]),
                                                                 float(views.invstd[c0]), views.count)
            return
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self.mean_dy[c0:c1], self.k[c0:c1], _ = plan.coefficients(sums[0], sums[1], views.invstd[c0:c1],
                                                                       views.count)

    def _partials(self, gp: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The tile's partials (J, 2, channels) of [Σdy, Σdy·d], in (chunk, block) order."""
        np.multiply(gp[0], d, out=gp[1])
        return self._trees(self._lanes(gp))

    def _lanes(self, values: np.ndarray) -> np.ndarray:
        """Per chunk and lane, the sum of its row groups in order from 0.0: (2, chunks, r0, channels, lanes)."""
        shape = self.shape
        r0, groups, step = shape.rows_per_lane, shape.groups_per_chunk, shape.chunk_rows
        rows, rest = values.shape[1], values.shape[2:]
        full = rows // step
        acc = self.scratch.get("acc", (2, -(-rows // step), r0, *rest), FLOAT64)
        if full:
            grouped = values[:, : full * step].reshape(2, full, groups, r0, *rest)
            head = acc[:, :full]
            if r0 * math.prod(rest) > 1:
                # One call, and the same order: summing over an axis that is not the innermost, NumPy adds whole
                # rows in turn (acc = ((0.0 + v0) + v1) + ...), elementwise; pairwise summation is used only
                # along the innermost axis, which is what a single lane (r0·channels·lanes == 1) would become.
                np.add.reduce(grouped, axis=2, out=head, initial=0.0)
            else:
                head.fill(0.0)
                for k in range(groups):
                    head += grouped[:, :, k]
        if rows > full * step:  # the last chunk of the tensor, short
            last = acc[:, full]
            tail = rows - full * step
            if tail % r0 == 0 and r0 * math.prod(rest) > 1:  # whole row groups: one call, the same order as above
                np.add.reduce(values[:, full * step :].reshape(2, tail // r0, r0, *rest), axis=1, out=last, initial=0.0)
                return acc
            last.fill(0.0)
            for q0 in range(full * step, rows, r0):
                part = values[:, q0 : q0 + r0]
                last[:, : part.shape[1]] += part
        return acc

    def _trees(self, acc: np.ndarray) -> np.ndarray:
        """Each (chunk, block)'s lanes by the halving tree: (chunks·blocks, 2, channels)."""
        _, chunks, r0, channels, lanes = acc.shape
        if r0 > 1:  # one block: lanes (t, s) in that order
            grouped = np.ascontiguousarray(acc.transpose(0, 1, 3, 2, 4)).reshape(2, chunks, channels, r0 * lanes)
            sums = plan.lane_tree(grouped)[..., None]
        else:
            flat = acc[:, :, 0]
            width = self.shape.block_lanes
            whole = lanes // width
            parts = []
            if whole:
                blocks = flat[..., : whole * width].reshape(2, chunks, channels, whole, width)
                parts.append(plan.lane_tree(blocks))
            if lanes % width:
                parts.append(plan.lane_tree(flat[..., whole * width :])[..., None])
            sums = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)
        return np.array(sums.transpose(1, 3, 0, 2).reshape(-1, 2, channels))  # a copy: sums may view the scratch

    def reduce(self, group: Group, tile: Tile) -> np.ndarray:
        gp, d = self._load(group, tile, need_d=True)
        return self._partials(gp, d)

    def _write(self, group: Group, tile: Tile, gp: np.ndarray, d: np.ndarray | None) -> None:
        """diff_src = ((dy - mean(dy)) - d·k)·scale of one tile, in float64, rounded once."""
        views = self.views
        channels = slice(group.c0, group.c1)
        out = views.out3[tile.n0 : tile.n1, channels, tile.s0 : tile.s1]
        result = gp[0]
        with np.errstate(over="ignore", invalid="ignore"):
            if views.training:
                per_channel(np.multiply, d, self.k[channels], out=d)
                per_channel(np.subtract, result, self.mean_dy[channels], out=result)
                result -= d
            per_channel(np.multiply, result, views.scale[channels], out=result)
            if views.scale_exp is None and out.dtype.itemsize >= 4:
                # f32/f64: the float64 product rounded once more on the way out (a cast as fast as a copy); f16/bf16
                # go through store()
                np.copyto(out, result, casting="unsafe")
                rounded = out
            else:
                if views.scale_exp is not None:
                    np.ldexp(result, views.scale_exp[None, channels, None], out=result)
                rounded = store(result, out, self.scratch)
        # the summary's extremes while the tile is in cache (core/summary.py; NaN propagates), from the float32
        # (or float64) values just written: half the bytes of the float64 results, and rounding is monotone
        self.extremes.append(summary.extremes(rounded))

    def fused(self, group: Group, want_diff_src: bool) -> np.ndarray | None:
        """Both passes of a group that is one tile; returns the folded sums (2, channels) or None."""
        views = self.views
        tile = group.tiles[0]
        gp, d = self._load(group, tile, need_d=views.need_sums)
        sums = None
        if views.need_sums:
            sums = plan.fold(self._partials(gp, d))
        if want_diff_src:
            if views.training:
                self.set_coefficients(group.c0, sums)
            self._write(group, tile, gp, d)
        return sums

    def write(self, group: Group, tile: Tile) -> None:
        gp, d = self._load(group, tile, need_d=self.views.training)
        self._write(group, tile, gp, d)
def bytes_per_element(dtype: np.dtype) -> int:
    """Working set of one tile element: src, diff_dst and diff_src, and the float64 scratch (g, g·d, d) and more."""
    extra = 20 if dtype.itemsize == 2 else 0  # float32 and uint32 conversion scratch (and the rounded-to-odd copy)
    return dtype.itemsize * 3 + 24 + extra


class _Progress:
    """Counts elements done for the progress callback and drops mapped pages every RELEASE_BYTES of rows."""

    def __init__(self, views: Views, total: int, progress, mappings: list) -> None:
        self.views, self.total, self.progress, self.mappings = views, total, progress, mappings
        self.done = 0
        self.spanned = 0  # bytes of the files the tiles since the last release lie in (whole rows)
        self.lock = threading.Lock()

    def tick(self, group: Group, tile: Tile) -> None:
        n, c, s = self.views.src3.shape
        with self.lock:
            self.done += (tile.n1 - tile.n0) * (group.c1 - group.c0) * (tile.s1 - tile.s0)
            if self.progress is not None:
                self.progress(self.done, self.total)
            self.spanned += (tile.n1 - tile.n0) * c * s * self.views.src3.itemsize
            if self.mappings and self.spanned >= RELEASE_BYTES:
                mapped.release(self.mappings)
                self.spanned = 0


class _Inline:
    """A pool of one: tiles run in the calling thread. For small problems (plan.worth_threads) a thread pool's
    hand-offs cost more than the work (a small problem in a pool mostly waits on locks).
    The bits are the same: the reduction order comes from the shape, never from who runs a tile."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def map(function, items):  # Executor.map's shape
        return map(function, items)


def _fold_jobs(split: list[Group], partials: list[np.ndarray]) -> list[tuple[list[np.ndarray], int, slice]]:
    """The split groups' folds cut into blocks of channels for the pool: (the group's tile partials in (chunk, block)
    order, its first channel, the block's columns). Each channel folds by its own tree: the cut changes no bit."""
    jobs, start = [], 0
    for group in split:
        parts = partials[start : start + len(group.tiles)]
        start += len(group.tiles)
        width = max(FOLD_BLOCK_BYTES // (16 * sum(len(p) for p in parts)), 1)
        channels = group.c1 - group.c0
        jobs += [(parts, group.c0, slice(c, min(c + width, channels))) for c in range(0, channels, width)]
    return jobs


def _fold_block(sums: np.ndarray, job: tuple[list[np.ndarray], int, slice]) -> None:
    """sums[:, block] = the block's channels folded (plan.fold)."""
    parts, c0, columns = job
    sums[:, c0 + columns.start : c0 + columns.stop] = plan.fold(np.concatenate([p[:, :, columns] for p in parts]))


def _pool(threads: int, shared: bool) -> ThreadPoolExecutor | _Inline:
    if threads > 1 and shared:
        # Imported here: concurrent.futures (and the logging it loads) costs start-up, paid only when work is spread.
        from concurrent.futures import ThreadPoolExecutor

        return ThreadPoolExecutor(max_workers=threads)
    return _Inline()


def run(views: Views, budget: int, threads: int, progress) -> tuple[np.ndarray, tuple[float, float] | None]:
    """The sums [Σdy, Σdy·(src - mean)] per channel (2, C) float64, and when views.out3 is given (then
    written) the min and max of its values as rounded (through float32 for f16/bf16; core/summary.py).

    budget: bytes of working set a tile; threads: worker threads; progress: None or f(done, total) elements.
    """
    src3 = views.src3
    n, c, s = src3.shape
    kernel = _Kernel(views)
    want_diff_src = views.out3 is not None
    mappings = mapped.file_mappings(src3, views.dy3, views.out3)
    # Memory-mapped data: tiles of whole rows, contiguous in the file, so a tile maps only its
    # own pages (a strided channel plane would map the page-cache folios of its neighbours too).
    row_mode = s * src3.itemsize < MIN_PLANE_RUN_BYTES or bool(mappings)
    groups = plan.plan_groups(views.geometry, bytes_per_element(src3.dtype), budget, row_mode)
    fused = [g for g in groups if len(g.tiles) == 1]
    split = [g for g in groups if len(g.tiles) > 1]
    passes = 2 if views.need_sums and want_diff_src else 1
    ticks = _Progress(views, src3.size + (passes - 1) * sum(g.c1 - g.c0 for g in split) * n * s, progress, mappings)

    def run_fused(group: Group) -> np.ndarray | None:
        result = kernel.fused(group, want_diff_src)
        ticks.tick(group, group.tiles[0])
        return result

    def run_reduce(item: tuple[Group, Tile]) -> np.ndarray:
        result = kernel.reduce(*item)
        ticks.tick(*item)
        return result

    def run_write(item: tuple[Group, Tile]) -> None:
        kernel.write(*item)
        ticks.tick(*item)

    sums = np.zeros((2, c))
    with _pool(threads, plan.worth_threads(views.geometry, bytes_per_element(src3.dtype))) as pool:
        for group, group_sums in zip(fused, pool.map(run_fused, fused)):
            if group_sums is not None:
                sums[:, group.c0 : group.c1] = group_sums
        if split and views.need_sums:
            partials = list(pool.map(run_reduce, [(g, t) for g in split for t in g.tiles]))  # (chunk, block) order
            list(pool.map(lambda job: _fold_block(sums, job), _fold_jobs(split, partials)))
            for group in split:
                if views.training:
                    kernel.set_coefficients(group.c0, sums[:, group.c0 : group.c1])
        if split and want_diff_src:
            list(pool.map(run_write, [(g, t) for g in split for t in g.tiles]))
    extremes = np.array(kernel.extremes).reshape(-1, 2)
    return sums, (summary.combine(extremes[:, 0], extremes[:, 1]) if want_diff_src else None)
