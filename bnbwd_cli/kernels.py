"""The blocked NumPy core: batch-norm training backward over cache-sized tiles.

Pure: arrays in, arrays out; no files, no terminal.

The tensor is viewed as (N, C, S): S = prod(spatial) for NCX, and (M, C, 1) for NXC,
so one tiling scheme serves both layouts. A *group* is a range of channels; its
*tiles* cover (n, s) ranges of those channels. When a group fits the cache budget it
is one tile and both passes run while the tile is still in cache (reduce Σdy and
Σdy·xhat, then write diff_src: ~3 tensor passes of memory traffic). A group too big
for the budget is reduced tile by tile, its partial sums combined in float64, and
then written tile by tile (~5 passes). NumPy releases the GIL inside its ufuncs, so
a thread pool over tiles uses every core.

Per tile: d = src - mean in the compute dtype (float64 for float64 src, else float32;
f16/bf16 are converted tile by tile, f16 with exact bit manipulation because NumPy's own
f16 cast is a slow scalar loop); Σdy and Σdy·d are accumulated in float64 (a float32
product is exact in float64, so the sums survive cancellation); Σdy·xhat = invstd·Σdy·d;
then diff_src = scale·((dy - mean(dy)) - d·invstd·mean(dy·xhat)), 4 in-cache ufunc
passes, rounded once to the output dtype. Only ufuncs: NumPy's BLAS-backed calls
(matmul, vecdot) were measured not to run concurrently from two threads.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from bnbwd_cli.layout import canonical_format, channel_axis, view3

DEFAULT_CACHE_BYTES = 1 << 20  # 1 MiB: a typical per-core L2 when the OS will not say
# Contiguous runs shorter than this make plane-wise tiles inefficient; tile by rows instead.
MIN_PLANE_RUN_BYTES = 512
# Memory-mapped inputs/outputs: drop their resident pages once the tiles since the last drop span this
# many bytes of src rows, so RSS stays bounded in out-of-core runs (a fault maps a whole page-cache
# folio, so a tile of a few channels of a row maps about the whole row).
RELEASE_BYTES = 4 << 20

ProgressCallback = Callable[[int, int], None]  # (elements done, elements in all)


@dataclass(frozen=True)
class BackwardResult:
    """diff_src has src's shape and dtype; diff_gamma/diff_beta are (C,) in the stats dtype. None = not asked for.

    core: the core that ran ("numpy" or "numba").
    """

    diff_src: np.ndarray | None
    diff_gamma: np.ndarray | None
    diff_beta: np.ndarray | None
    core: str = "numpy"


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


def plan_groups(n: int, c: int, s: int, bytes_per_element: int, budget: int, row_mode: bool, threads: int) -> list[Group]:
    """Cover the (N, C, S) view with tiles of about `budget` bytes of working set."""
    per_budget = max(budget // bytes_per_element, 1)  # elements one tile may hold
    if row_mode and s <= per_budget:
        # Rows of (channels x S) are contiguous: tile by row ranges over as many channels as fit.
        width = c if c * s <= per_budget else max(per_budget // s, 1)
        rows = max(per_budget // (width * s), 1)
        tiles = tuple(Tile(n0, min(n0 + rows, n), 0, s) for n0 in range(0, n, rows))
        return [Group(c0, min(c0 + width, c), tiles) for c0 in range(0, c, width)]
    plane = n * s
    if plane <= per_budget:
        width = max(min(per_budget // plane, -(-c // (2 * threads))), 1)  # keep enough groups to share
        return [Group(c0, min(c0 + width, c), (Tile(0, n, 0, s),)) for c0 in range(0, c, width)]
    if s <= per_budget:
        rows = per_budget // s
        tiles = tuple(Tile(n0, min(n0 + rows, n), 0, s) for n0 in range(0, n, rows))
    else:
        tiles = tuple(Tile(i, i + 1, s0, min(s0 + per_budget, s)) for i in range(n) for s0 in range(0, s, per_budget))
    return [Group(ch, ch + 1, tiles) for ch in range(c)]


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


# ---------------------------------------------------------------- the per-tile passes



class _Kernel:
    """One backward computation over an (N, C, S) view; its methods are the per-tile passes.

    Per tile: Σdy and Σdy·(src - mean) in float64 (ufunc reductions), d = src - mean in
    the compute dtype, then diff_src = scale·((dy - mean(dy)) - d·invstd·mean(dy·xhat)).
    Σdy·xhat = invstd·Σdy·(src - mean) is formed in float64 from the sums.
    """

    def __init__(self, src3, dy3, out3, mean, invstd, scale, compute_dtype, count, training):
        self.src3, self.dy3, self.out3 = src3, dy3, out3
        self.compute_dtype = compute_dtype
        self.invstd, self.scale = invstd, scale  # float64 (C,)
        self.mean_c = mean.astype(compute_dtype)[None, :, None]  # per-channel operands, shaped to broadcast
        self.mean64_c = mean.astype(np.float64)[None, :, None]
        self.scale_c = scale.astype(compute_dtype)[None, :, None]
        self.count, self.training = count, training
        self.input_dtype = src3.dtype
        self.half = src3.dtype == np.float16
        self.scratch = _Scratch()

    def _convert(self, name: str, values: np.ndarray) -> np.ndarray:
        """values in the compute dtype: the view itself, or a converted copy in scratch."""
        if values.dtype == self.compute_dtype:
            return values
        converted = self.scratch.get(name, values.shape, self.compute_dtype)
        if self.half:
            half_to_float(values, converted, self.scratch.get("u32a", values.shape, _U32))
        else:
            np.copyto(converted, values)
        return converted

    def _load(self, group: Group, tile: Tile, need_d: bool, need_sums: bool = False):
        """dy and d = src - mean of one tile in the compute dtype (d lives in scratch), and the tile's sums.

        Returns (dy, d or None, [Σdy, Σdy·(src - mean)] or None).
        """
        index = np.s_[tile.n0 : tile.n1, group.c0 : group.c1, tile.s0 : tile.s1]
        dy = self._convert("dy", self.dy3[index])
        if not need_d:
            return dy, None, None
        src = self._convert("d", self.src3[index])  # the view itself, or a converted copy in the "d" scratch
        sums = self._sums(dy, src, group) if need_sums else None
        mean = self.mean_c[:, group.c0 : group.c1]
        if self.input_dtype != self.compute_dtype:
            d = src
            d -= mean
        else:
            d = self.scratch.get("d", src.shape, self.compute_dtype)
            np.subtract(src, mean, out=d)
        return dy, d, sums

    def _sums(self, dy: np.ndarray, src: np.ndarray, group: Group) -> np.ndarray:
        """[Σdy, Σdy·(src - mean)] per channel of the tile, shape (2, channels), in float64.

        src - mean is formed in float64 (exact for float32 operands) and so are the products
        and the sums: when Σdy·xhat nearly cancels, float32 rounding of (src - mean) alone
        would leave relative errors of 1e-5 in diff_gamma (hypothesis found such cases).
        Ufunc reductions only: NumPy's BLAS calls (matmul, vecdot) do not run concurrently
        from two threads here, ufuncs do.
        """
        float64 = np.dtype(np.float64)
        product = self.scratch.get("product64", dy.shape, float64)
        # Widen with plain casts, then compute in float64: a mixed float32/float64 ufunc casts through small
        # buffers and ran 2x slower (per 0.8 MB channel plane: 313 -> 188 us for the sums).
        np.copyto(product, src)
        product -= self.mean64_c[:, group.c0 : group.c1]
        if dy.dtype != float64:
            dy64 = self.scratch.get("dy64", dy.shape, float64)
            np.copyto(dy64, dy)
            dy = dy64
        product *= dy
        axis = 0 if dy.shape[2] == 1 else 2  # NXC: down the rows, else pairwise along s
        sums = np.stack([dy.sum(axis=axis), product.sum(axis=axis)])
        return sums.sum(axis=1) if axis == 2 else sums[:, :, 0]

    def _coefficients(self, group: Group, sums: np.ndarray) -> tuple[np.ndarray, ...]:
        """mean(dy), invstd·mean(dy·xhat) per channel of the group, shaped to broadcast, compute dtype."""
        invstd = self.invstd[group.c0 : group.c1]
        mean_dy = sums[0] / self.count
        mean_dy_xhat = sums[1] * invstd / self.count
        return tuple((v.astype(self.compute_dtype)[None, :, None]) for v in (mean_dy, invstd * mean_dy_xhat))

    def _store(self, result: np.ndarray, out: np.ndarray) -> None:
        """The one rounding to the output dtype."""
        if self.half:
            float_to_half(result, out, self.scratch.get("u32a", result.shape, _U32),
                          self.scratch.get("u32b", result.shape, _U32))
        else:
            np.copyto(out, result)

    def _write(self, group: Group, tile: Tile, dy: np.ndarray, d: np.ndarray | None, sums: np.ndarray | None) -> None:
        """diff_src = scale·((dy - mean(dy)) - d·invstd·mean(dy·xhat)) of one tile.

        dy - mean(dy) comes first: when they nearly cancel (M small, say) it is exact.
        d, and dy when it is a converted copy, are overwritten.
        """
        out = self.out3[tile.n0 : tile.n1, group.c0 : group.c1, tile.s0 : tile.s1]
        scale = self.scale_c[:, group.c0 : group.c1]
        result = out if out.dtype == self.compute_dtype else dy  # else dy is a converted copy in scratch
        if self.training:
            mean_dy, k = self._coefficients(group, sums)
            d *= k
            np.subtract(dy, mean_dy, out=result)
            result -= d
            result *= scale
        else:
            np.multiply(dy, scale, out=result)
        if result is not out:
            self._store(result, out)

    def fused(self, group: Group, want_sums: bool, want_diff_src: bool) -> np.ndarray | None:
        tile = group.tiles[0]
        need_sums = want_sums or self.training
        dy, d, sums = self._load(group, tile, need_d=need_sums, need_sums=need_sums)
        if want_diff_src:
            self._write(group, tile, dy, d, sums)
        return sums

    def reduce(self, group: Group, tile: Tile) -> np.ndarray:
        return self._load(group, tile, need_d=True, need_sums=True)[2]

    def write(self, group: Group, tile: Tile, sums: np.ndarray) -> None:
        dy, d, _ = self._load(group, tile, need_d=self.training)
        self._write(group, tile, dy, d, sums)


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


def batchnorm_backward(
    src: np.ndarray,
    diff_dst: np.ndarray,
    mean: np.ndarray,
    variance: np.ndarray,
    gamma: np.ndarray | None = None,
    *,
    epsilon: float,
    data_format: str,
    training: bool = True,
    variance_is_invstd: bool = False,
    outputs: Sequence[str] = ("diff_src", "diff_gamma", "diff_beta"),
    diff_src_out: np.ndarray | None = None,
    block_bytes: int | None = None,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    core: str = "auto",
) -> BackwardResult:
    """Batch-norm training backward.

    src, diff_dst: (N, C, X...) for NCX or (N, X..., C) for NXC, same dtype T1 (f16/bf16/f32/f64).
    mean, variance, gamma: (C,), dtype T2 (gamma None means 1). With `variance_is_invstd` the
    variance array holds 1/sqrt(var + eps) and epsilon is not used. `training=False` is TF's
    is_training=False: diff_src = gamma * invstd * diff_dst.
    diff_src_out: optional preallocated C-contiguous output (e.g. a memmap) of src's shape/dtype.
    Returns diff_src (T1) and diff_gamma, diff_beta (T2, the dtype of mean) for the names in `outputs`.
    Inputs are assumed validated (see profiles.validate_inputs).
    core: "numpy" (this module), "numba" (kernels_numba) or "auto": numba when it is
    installed, the dtype is supported, the data is in memory (memory-mapped data keeps the NumPy core's bounded
    RSS), $BNBWD_CORE is not "numpy", and either this process has loaded the numba core already or src is at
    least AUTO_NUMBA_MIN_BYTES (numba's start-up cost).
    """
    want_diff_src = "diff_src" in outputs
    want_sums = "diff_gamma" in outputs or "diff_beta" in outputs
    axis = channel_axis(data_format, src.ndim)
    channels = src.shape[axis]
    count = src.size // channels if channels else 0
    param_dtype = mean.dtype
    compute_dtype = np.dtype(np.float64 if src.dtype == np.float64 else np.float32)

    if want_diff_src:
        diff_src = diff_src_out if diff_src_out is not None else np.empty(src.shape, dtype=src.dtype)
    else:
        diff_src = None
    sums = np.zeros((2, channels))
    ran = "numba" if src.size and _use_numba(core, src, diff_dst, diff_src) else "numpy"
    if ran == "numba":
        sums = _run_numba(src, diff_dst, diff_src, mean, variance, gamma, epsilon, data_format, training,
                          variance_is_invstd, want_sums or training, compute_dtype, count, threads or usable_cores())
        if progress is not None:
            progress(src.size, src.size)
    elif src.size:
        sums = _run_tiles(
            src, diff_dst, diff_src, mean, variance, gamma, epsilon, data_format, training, variance_is_invstd,
            want_sums, want_diff_src, compute_dtype, count,
            block_bytes or default_block_bytes(threads or usable_cores()), threads or usable_cores(), progress,
        )
    diff_beta = sums[0].astype(param_dtype) if "diff_beta" in outputs else None
    diff_gamma = sums[1].astype(param_dtype) if "diff_gamma" in outputs else None
    return BackwardResult(diff_src=diff_src, diff_gamma=diff_gamma, diff_beta=diff_beta, core=ran)


CORES = ("auto", "numpy", "numba")
# core="auto" picks numba only once the process has loaded it (a long-lived caller pays the start-up once) or
# for inputs this big: importing numba and loading its cached kernels takes ~0.45 s (measured, 2-core EPYC),
# and the kernel saves ~0.45 ms a MB of src (f32 (64,128,56,56), output allocated by the call: 29 vs 76 ms
# for 103 MB), so a single `bnbwd run` breaks even at ~1 GB. Below that, --core numba (or core="numba") opts in.
AUTO_NUMBA_MIN_BYTES = 1 << 30


def numba_available() -> bool:
    """Whether the optional compiled core can be used (numba installed); does not import numba."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def _use_numba(core: str, src: np.ndarray, diff_dst: np.ndarray, diff_src: np.ndarray | None) -> bool:
    if core not in CORES:
        raise ValueError(f"core must be one of {CORES}, got {core!r}")
    if core == "numpy" or (core == "auto" and os.environ.get("BNBWD_CORE", "").lower() == "numpy"):
        return False
    if src.dtype.itemsize not in (2, 4, 8) or src.dtype.kind not in "fV":
        return False
    if core == "auto" and (_file_mappings(src, diff_dst, diff_src) or not numba_available()):
        return False
    if core == "auto" and src.nbytes < AUTO_NUMBA_MIN_BYTES and "bnbwd_cli.kernels_numba" not in sys.modules:
        return False  # a one-off call: numba's start-up would cost more than its kernel saves
    if core == "numba" and not numba_available():
        raise ImportError("core='numba' needs numba: pip install 'bnbwd[fast]'")
    from bnbwd_cli import kernels_numba

    return kernels_numba.supports(src.dtype)


def _run_numba(src, diff_dst, diff_src, mean, variance, gamma, epsilon, data_format, training, variance_is_invstd,
               need_sums, compute_dtype, count, threads) -> np.ndarray:
    """The compiled core over the same (N, C, S) view; returns [Σdy, Σdy·xhat] per channel in float64."""
    from bnbwd_cli import kernels_numba

    src3 = view3(np.ascontiguousarray(src), data_format)
    dy3 = view3(np.ascontiguousarray(diff_dst), data_format)
    out3 = view3(diff_src, data_format) if diff_src is not None else None
    invstd = channel_invstd(variance, epsilon, variance_is_invstd)
    scale = invstd * (_as64(gamma) if gamma is not None else 1.0)
    sums = kernels_numba.run(src3, dy3, out3, _as64(mean), invstd, scale, compute_dtype, count, training,
                             need_sums, threads)
    sums[1] *= invstd
    return sums


def channel_invstd(variance: np.ndarray, epsilon: float, variance_is_invstd: bool) -> np.ndarray:
    """1/sqrt(variance + epsilon) per channel, in float64."""
    variance64 = _as64(variance)
    return variance64 if variance_is_invstd else 1.0 / np.sqrt(variance64 + epsilon)


def _as64(values: np.ndarray) -> np.ndarray:
    """float64 copy of a small per-channel array (bf16/f16 go through float32, which holds them exactly)."""
    return values.astype(np.float32 if values.dtype.itemsize == 2 else values.dtype).astype(np.float64)


def _run_tiles(src, diff_dst, diff_src, mean, variance, gamma, epsilon, data_format, training, variance_is_invstd,
               want_sums, want_diff_src, compute_dtype, count, budget, threads, progress) -> np.ndarray:
    src = np.ascontiguousarray(src)  # Fortran-ordered or strided input: one copy, then views
    diff_dst = np.ascontiguousarray(diff_dst)
    src3, dy3 = view3(src, data_format), view3(diff_dst, data_format)
    out3 = view3(diff_src, data_format) if diff_src is not None else None
    n, c, s = src3.shape
    invstd = channel_invstd(variance, epsilon, variance_is_invstd)
    scale = invstd * (_as64(gamma) if gamma is not None else 1.0)
    kernel = _Kernel(src3, dy3, out3, _as64(mean), invstd, scale, compute_dtype, count, training)

    # src, diff_dst and diff_src, plus scratch: d (and a converted dy, and two uint32 for float16)
    scratch_bytes = compute_dtype.itemsize * (1 if src.dtype == compute_dtype else 2) + (8 if src.dtype == np.float16 else 0)
    scratch_bytes += 8 if compute_dtype == np.float64 else 16  # float64 products dy·d (and dy widened to float64)
    bytes_per_element = src.itemsize * 3 + scratch_bytes
    mappings = _file_mappings(src, diff_dst, diff_src)
    # Memory-mapped data: tiles of whole rows, contiguous in the file, so a tile maps only its
    # own pages (a strided channel plane would map the page-cache folios of its neighbours too).
    row_mode = s * src.itemsize < MIN_PLANE_RUN_BYTES or bool(mappings)
    groups = plan_groups(n, c, s, bytes_per_element, budget, row_mode, threads)
    fused = [g for g in groups if len(g.tiles) == 1]
    split = [g for g in groups if len(g.tiles) > 1]
    total = src.size + sum(g.c1 - g.c0 for g in split) * n * s
    done = [0]
    lock = threading.Lock()

    spanned = [0]  # bytes of the files the tiles since the last release lie in (whole rows)

    def tick(group: Group, tile: Tile) -> None:
        with lock:
            done[0] += (tile.n1 - tile.n0) * (group.c1 - group.c0) * (tile.s1 - tile.s0)
            if progress is not None:
                progress(done[0], total)
            spanned[0] += (tile.n1 - tile.n0) * c * s * src.itemsize
            if mappings and spanned[0] >= RELEASE_BYTES:
                _release(mappings)
                spanned[0] = 0

    def run_fused(group: Group) -> np.ndarray:
        result = kernel.fused(group, want_sums, want_diff_src)
        tick(group, group.tiles[0])
        return result

    def run_reduce(item: tuple[Group, Tile]) -> np.ndarray:
        group, tile = item
        result = kernel.reduce(group, tile)
        tick(group, tile)
        return result

    def run_write(item: tuple[Group, Tile, np.ndarray]) -> None:
        group, tile, group_sums = item
        kernel.write(group, tile, group_sums)
        tick(group, tile)

    sums = np.zeros((2, c))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for group, group_sums in zip(fused, pool.map(run_fused, fused)):
            if group_sums is not None:
                sums[:, group.c0 : group.c1] = group_sums
        if split:
            need_sums = want_sums or training
            if need_sums:
                items = [(g, t) for g in split for t in g.tiles]
                partials = list(pool.map(run_reduce, items))  # in tile order: deterministic
                position = 0
                for group in split:
                    stacked = np.stack(partials[position : position + len(group.tiles)])
                    sums[:, group.c0 : group.c1] = stacked.sum(axis=0)
                    position += len(group.tiles)
            if want_diff_src:
                writes = [(g, t, sums[:, g.c0 : g.c1]) for g in split for t in g.tiles]
                list(pool.map(run_write, writes))
    sums[1] *= invstd  # Σdy·xhat = invstd·Σdy·(src - mean), in float64
    return sums
