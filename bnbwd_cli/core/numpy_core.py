"""The blocked NumPy core: batch-norm training backward over cache-sized tiles.

Pure: arrays in, arrays out; no files, no terminal.

The (N, C, S) view is cut into tiles of whole chunks (core/plan.py), so the result does not depend
on the budget or the thread count. A *group* is a range of channels; its *tiles* cover (n, s) ranges
of those channels. When a group fits the cache budget it is one tile and both passes run while the
tile is still in cache (~3 tensor passes of memory traffic); a group too big for the budget is reduced
tile by tile and then written tile by tile (~5 passes). NumPy releases the GIL inside its ufuncs, so
a thread pool over tiles uses every core.

Per tile, in float64: g = dy and d = src - mean (widened exactly), the lane sums of g and g·d per
chunk (plan.py's order), then diff_src = ((g - mean(dy)) - d·k)·scale rounded once to T1 (for f16 and
bf16 through float32 rounded to odd, which makes the second rounding exact). Only ufuncs: NumPy's
BLAS-backed calls (matmul, vecdot) were measured not to run concurrently from two threads.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.core import plan
from bnbwd_cli.core.plan import Group, Tile
from bnbwd_cli.dtypes import is_bfloat16

if TYPE_CHECKING:
    from bnbwd_cli.core import Problem, Settings

DEFAULT_CACHE_BYTES = 1 << 20  # 1 MiB: a typical per-core L2 when the OS will not say
# Contiguous runs shorter than this make plane-wise tiles inefficient; tile by rows instead.
MIN_PLANE_RUN_BYTES = 512
# Memory-mapped inputs/outputs: drop their resident pages once the tiles since the last drop span this
# many bytes of src rows, so RSS stays bounded in out-of-core runs (a fault maps a whole page-cache
# folio, so a tile of a few channels of a row maps about the whole row).
RELEASE_BYTES = 4 << 20
FLOAT64 = np.dtype(np.float64)


def cache_sizes() -> dict[int, int]:
    """Data/unified cache size in bytes by level, from sysfs (Linux); empty elsewhere."""
    cache_dir = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = {}
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            sizes[level] = int(text.rstrip("KMG")) * scale
    return sizes


def default_block_bytes(threads: int) -> int:
    """Working-set budget of one tile (src, diff_dst, diff_src and scratch all count).

    Every thread's tile must stay in cache between the reduce and the write pass, so a
    thread gets half its share of the last-level cache (the other half absorbs the
    streaming inputs and outputs), at least 1 MiB and at most 16 MiB. Measured on a
    2-core EPYC (512 KiB L2 a core, 32 MiB L3), f32 (64,128,56,56): budgets of 4-8 MiB
    (one 0.8 MB channel plane a tile) beat 16 MiB; under ~1 MiB, per-call overhead wins.
    """
    sizes = cache_sizes()
    last_level = sizes[max(sizes)] if sizes else DEFAULT_CACHE_BYTES * 8
    shared = max(sizes, default=0) >= 3  # an L3 is shared by the cores; L1/L2 are per core
    share = last_level // (2 * max(threads, 1)) if shared else last_level // 2
    return int(min(max(share, DEFAULT_CACHE_BYTES), 16 << 20))


def usable_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


class _Scratch(threading.local):
    """Per-thread scratch buffers, grown on demand and reused across tiles (no per-tile page faults)."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = np.empty(max(size, 1), dtype=dtype)
            self.buffers[name] = buffer
        return buffer[:size].reshape(shape)


# ---------------------------------------------------------------- float16 <-> float32
# NumPy's own float16 casts run a scalar loop (~3 ns an element here, slower than memory);
# these bit manipulations give the same bits (round to nearest even, subnormals, inf, NaN)
# in a few vectorised integer passes.

_U32 = np.uint32
_F16_TO_F32_SCALE = np.float32(2.0**112)  # rebias exponent 15 -> 127, and normalises f16 subnormals
_F32_DENORM_MAGIC = np.array(((127 - 15) + (23 - 10) + 1) << 23, _U32)


def half_to_float(half: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """out (float32) = half (float16), exactly; scratch is uint32 of the same shape."""
    bits = half.view(np.uint16)
    out_bits = out.view(_U32)
    np.bitwise_and(bits, np.uint16(0x7FFF), out=out_bits, dtype=_U32, casting="unsafe")
    out_bits <<= _U32(13)
    out *= _F16_TO_F32_SCALE
    overflow = out_bits >= _U32(0x47800000)  # f16 exponent 31: inf or NaN
    if overflow.any():
        out_bits[overflow] |= _U32(0x7F800000)
    np.right_shift(bits, np.uint16(15), out=scratch, dtype=_U32, casting="unsafe")
    scratch <<= _U32(31)
    out_bits |= scratch


def float_to_half(values: np.ndarray, out: np.ndarray, magnitude: np.ndarray, result: np.ndarray) -> None:
    """out (float16) = values (float32) rounded to nearest even; magnitude, result: uint32 scratch."""
    bits = values.view(_U32)
    np.bitwise_and(bits, _U32(0x7FFFFFFF), out=magnitude)
    np.right_shift(magnitude, _U32(13), out=result)  # normal numbers: round half to even on bit 13
    result &= _U32(1)
    result += magnitude
    result += _U32((((15 - 127) << 23) + 0xFFF) & 0xFFFFFFFF)
    result >>= _U32(13)
    small = magnitude < _U32(113 << 23)  # below the f16 normal range
    if small.any():
        rounded = (magnitude[small].view(np.float32) + _F32_DENORM_MAGIC.view(np.float32)).view(_U32)
        result[small] = rounded - _F32_DENORM_MAGIC
    large = magnitude >= _U32((127 + 16) << 23)  # overflow to inf, or NaN
    if large.any():
        result[large] = np.where(magnitude[large] > _U32(0xFF << 23), _U32(0x7E00), _U32(0x7C00))
    np.right_shift(bits, _U32(16), out=magnitude)
    magnitude &= _U32(0x8000)
    result |= magnitude
    np.copyto(out.view(np.uint16), result, casting="unsafe")


# ---------------------------------------------------------------- rounding float64 once


def round_to_odd_float32(values: np.ndarray, out: np.ndarray) -> None:
    """out (float32) = values (float64) rounded to odd: truncated, the last bit set when inexact.

    Rounding that to 8 or 11 significant bits (bf16, f16) rounds values once, as if directly: the odd
    bit keeps a value that was not a tie from looking like one (a plain float32 rounding would not).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(out, values, casting="same_kind")
        back = out.astype(FLOAT64)
        inexact = back != values
        np.abs(back, out=back)
        away = back > np.abs(values)  # rounded away from zero: step back one
    bits = out.view(np.uint32)
    np.subtract(bits, away, out=bits, casting="unsafe")
    np.bitwise_or(bits, inexact, out=bits, casting="unsafe")


def store(values: np.ndarray, out: np.ndarray, scratch: _Scratch | None = None) -> None:
    """out (T1) = values (float64), rounded once (NaN stays NaN)."""
    if out.dtype == np.float16 or is_bfloat16(out.dtype):
        scratch = scratch or _Scratch()
        odd = scratch.get("odd32", values.shape, np.dtype(np.float32))
        round_to_odd_float32(values, odd)
        if is_bfloat16(out.dtype):
            np.copyto(out, odd, casting="unsafe")
        else:
            float_to_half(odd, out, scratch.get("u32a", values.shape, np.dtype(np.uint32)),
                          scratch.get("u32b", values.shape, np.dtype(np.uint32)))
        return
    with np.errstate(over="ignore"):
        np.copyto(out, values, casting="unsafe")


def round_to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 array rounded once to dtype (f64, f32, f16 or bf16)."""
    out = np.empty(values.shape, dtype)
    store(np.ascontiguousarray(values, dtype=FLOAT64), out)
    return out


# ---------------------------------------------------------------- the per-tile passes


class _Kernel:
    """One backward computation over an (N, C, S) view; its methods are the per-tile passes."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.shape = problem.geometry
        self.mean_c = problem.mean[None, :, None]
        self.scratch = _Scratch()
        # mean(dy) and k per channel, filled in by channel range once the range's sums are known
        self.mean_dy = np.zeros(problem.geometry.c)
        self.k = np.zeros(problem.geometry.c)

    def _widen(self, wide: np.ndarray, values: np.ndarray) -> np.ndarray:
        """wide (float64) = values, exactly."""
        if values.dtype == np.float16:
            narrow = self.scratch.get("f32", values.shape, np.dtype(np.float32))
            half_to_float(values, narrow, self.scratch.get("u32a", values.shape, np.dtype(np.uint32)))
            np.copyto(wide, narrow)
        elif is_bfloat16(values.dtype):
            bits = self.scratch.get("u32a", values.shape, np.dtype(np.uint32))
            np.left_shift(values.view(np.uint16), np.uint32(16), out=bits, dtype=np.uint32, casting="unsafe")
            np.copyto(wide, bits.view(np.float32))
        else:
            np.copyto(wide, values)
        return wide

    def _load(self, group: Group, tile: Tile, need_d: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """gp (2, rows, channels, lanes) float64 with gp[0] = dy, and d = src - mean (or None)."""
        index = np.s_[tile.n0 : tile.n1, group.c0 : group.c1, tile.s0 : tile.s1]
        dy = self.problem.dy3[index]
        gp = self.scratch.get("gp", (2, *dy.shape), FLOAT64)
        self._widen(gp[0], dy)
        if not need_d:
            return gp, None
        d = self._widen(self.scratch.get("d", dy.shape, FLOAT64), self.problem.src3[index])
        d -= self.mean_c[:, group.c0 : group.c1]
        return gp, d

    def set_coefficients(self, c0: int, sums: np.ndarray) -> None:
        """mean(dy) and k of channels c0.. from their folded sums (2, channels)."""
        c1 = c0 + sums.shape[1]
        problem = self.problem
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self.mean_dy[c0:c1], self.k[c0:c1], _ = plan.coefficients(sums[0], sums[1], problem.invstd[c0:c1],
                                                                       problem.count)

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
        acc.fill(0.0)
        if full:
            grouped = values[:, : full * step].reshape(2, full, groups, r0, *rest)
            head = acc[:, :full]
            for k in range(groups):
                head += grouped[:, :, k]
        if rows > full * step:  # the last chunk of the tensor, short
            last = acc[:, full]
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
        problem = self.problem
        channels = np.s_[:, group.c0 : group.c1, :]
        out = problem.out3[tile.n0 : tile.n1, group.c0 : group.c1, tile.s0 : tile.s1]
        result = gp[0]
        with np.errstate(over="ignore", invalid="ignore"):
            if problem.training:
                d *= self.k[None, :, None][channels]
                result -= self.mean_dy[None, :, None][channels]
                result -= d
            result *= problem.scale[None, :, None][channels]
            if problem.scale_exp is not None:
                np.ldexp(result, problem.scale_exp[None, :, None][channels], out=result)
        store(result, out, self.scratch)

    def fused(self, group: Group, want_diff_src: bool) -> np.ndarray | None:
        """Both passes of a group that is one tile; returns the folded sums (2, channels) or None."""
        problem = self.problem
        tile = group.tiles[0]
        gp, d = self._load(group, tile, need_d=problem.need_sums)
        sums = None
        if problem.need_sums:
            sums = plan.fold(self._partials(gp, d))
        if want_diff_src:
            if problem.training:
                self.set_coefficients(group.c0, sums)
            self._write(group, tile, gp, d)
        return sums

    def write(self, group: Group, tile: Tile) -> None:
        gp, d = self._load(group, tile, need_d=self.problem.training)
        self._write(group, tile, gp, d)
def _file_mappings(*arrays: np.ndarray | None) -> list[mmap.mmap]:
    """The mmap objects behind memory-mapped arrays (np.load(mmap_mode=...), np.memmap)."""
    found = []
    for array in arrays:
        while array is not None:
            mapping = getattr(array, "_mmap", None)
            if isinstance(mapping, mmap.mmap):
                found.append(mapping)
                break
            array = array.base if isinstance(array, np.ndarray) else None
    return found


def _release(mappings: list[mmap.mmap]) -> None:
    """Unmap the resident pages of file mappings: they stay in the page cache, out of our RSS.

    Dirty pages of a shared (output) mapping are kept by the page cache and written back;
    a tile still in flight just faults its pages in again.
    """
    for mapping in mappings:
        try:
            mapping.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):
            pass


def release_mapped_pages(*arrays: np.ndarray | None) -> None:
    """Drop the resident pages of memory-mapped arrays (no-op for in-memory ones): bounded RSS for long scans."""
    _release(_file_mappings(*arrays))


def bytes_per_element(dtype: np.dtype) -> int:
    """Working set of one tile element: src, diff_dst and diff_src, and the float64 scratch (g, g·d, d) and more."""
    extra = 20 if dtype.itemsize == 2 else 0  # float32 and uint32 conversion scratch (and the rounded-to-odd copy)
    return dtype.itemsize * 3 + 24 + extra


def run(problem: Problem, budget: int, threads: int, progress) -> np.ndarray:
    """The sums [Σdy, Σdy·(src - mean)] per channel (2, C) float64; writes problem.out3 when given.

    budget: bytes of working set a tile; threads: worker threads; progress: None or f(done, total) elements.
    """
    src3 = problem.src3
    shape = problem.geometry
    n, c, s = src3.shape
    kernel = _Kernel(problem)
    want_diff_src = problem.out3 is not None
    mappings = _file_mappings(src3, problem.dy3, problem.out3)
    # Memory-mapped data: tiles of whole rows, contiguous in the file, so a tile maps only its
    # own pages (a strided channel plane would map the page-cache folios of its neighbours too).
    row_mode = s * src3.itemsize < MIN_PLANE_RUN_BYTES or bool(mappings)
    groups = plan.plan_groups(shape, bytes_per_element(src3.dtype), budget, row_mode)
    fused = [g for g in groups if len(g.tiles) == 1]
    split = [g for g in groups if len(g.tiles) > 1]
    passes = 2 if problem.need_sums and want_diff_src else 1
    total = src3.size + (passes - 1) * sum(g.c1 - g.c0 for g in split) * n * s
    done = [0]
    spanned = [0]  # bytes of the files the tiles since the last release lie in (whole rows)
    lock = threading.Lock()

    def tick(group: Group, tile: Tile) -> None:
        with lock:
            done[0] += (tile.n1 - tile.n0) * (group.c1 - group.c0) * (tile.s1 - tile.s0)
            if progress is not None:
                progress(done[0], total)
            spanned[0] += (tile.n1 - tile.n0) * c * s * src3.itemsize
            if mappings and spanned[0] >= RELEASE_BYTES:
                _release(mappings)
                spanned[0] = 0

    def run_fused(group: Group) -> np.ndarray | None:
        result = kernel.fused(group, want_diff_src)
        tick(group, group.tiles[0])
        return result

    def run_reduce(item: tuple[Group, Tile]) -> np.ndarray:
        group, tile = item
        result = kernel.reduce(group, tile)
        tick(group, tile)
        return result

    def run_write(item: tuple[Group, Tile]) -> None:
        kernel.write(*item)
        tick(*item)

    sums = np.zeros((2, c))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for group, group_sums in zip(fused, pool.map(run_fused, fused)):
            if group_sums is not None:
                sums[:, group.c0 : group.c1] = group_sums
        if split and problem.need_sums:
            items = [(g, t) for g in split for t in g.tiles]
            partials = iter(pool.map(run_reduce, items))  # in tile order: (chunk, block) order per channel
            for group in split:
                group_sums = plan.fold(np.concatenate([next(partials) for _ in group.tiles]))
                sums[:, group.c0 : group.c1] = group_sums
                if problem.training:
                    kernel.set_coefficients(group.c0, group_sums)
        if split and want_diff_src:
            list(pool.map(run_write, [(g, t) for g in split for t in g.tiles]))
    return sums
