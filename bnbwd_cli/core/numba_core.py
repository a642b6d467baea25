"""The optional compiled core (numba): the NumPy core's arithmetic, operation for operation, fused per block.

Imported by core.load_numba_core only when chosen (numba's import and JIT cost is paid only when it is
used; the compiled code, core/numba_kernels.py, is cached on disk). Supports float64, float32, bfloat16 and float16 T1 (float16 where
the CPU converts halves in hardware: see half_is_native).

Numerics are the NumPy core's, in the same order (core/plan.py): g = dy and d = src - mean in float64
(widened exactly), per chunk and lane the sum of g and g·d over its row groups from 0.0, each (chunk,
block) reduced by plan.lane_tree's halving tree, partials folded by plan.fold's tree of plan.pair_sum in (chunk, block)
order, then diff_src = ((g - mean(dy)) - d·k)·scale rounded once to T1 (f16 and bf16 through float32
rounded to odd). No fastmath anywhere: LLVM then neither reassociates nor contracts (no FMA), so every
operation rounds as NumPy's does and the outputs are the NumPy core's bits. Only the split of the work
into tasks differs, and it never touches the order of a sum.

Every inner loop indexes a slice with its own range variable: LLVM then knows the index is in bounds and
non-negative, and vectorises the loop (lanes are independent, so the lane sums vectorise without
reassociation).

Work split (results do not depend on it):
- Long contiguous runs (NCX planes): with at least 2 channels a thread, one task per channel (its sums,
  then its diff_src while the plane is in cache: 3 tensor passes); else (channel, chunk, block) tasks
  for the partials and (channel, chunk) tasks for the write.
- Short runs (NXC is (M, C, 1)): the (N, C·S) row view; one task per chunk of rows for the partials,
  (row block, column range) tasks for the write.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import binding as llvm_binding

from bnbwd_cli.core import numba_kernels as kernels
from bnbwd_cli.core import plan
from bnbwd_cli.core.numba_bits import MAGNITUDE
from bnbwd_cli.core.numba_kernels import MIN_PLANE_RUN_BYTES, WRITE_COLUMNS, WRITE_ROWS


def _is_bf16(dtype: np.dtype) -> bool:
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


def half_is_native() -> bool:
    """Whether the compiled code converts float16 in hardware. Without it (x86 without F16C, or a
    NUMBA_CPU_NAME such as "generic"), LLVM lowers half conversions to compiler-rt calls that numba's
    JIT cannot link, and the process aborts: float16 then stays on the NumPy core."""
    if (numba.config.CPU_NAME or "host") != "host":
        return False
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return bool(llvm_binding.get_host_cpu_features().get("f16c", False))
    return machine in ("aarch64", "arm64")  # half conversions are part of the base ARMv8 instruction set


def supports(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return half_is_native()
    return dtype in (np.dtype(np.float32), np.dtype(np.float64)) or _is_bf16(dtype)


def _bits_view(array: np.ndarray) -> np.ndarray:
    """A plain-ndarray view (memmaps included): bfloat16 as uint16 bits, float16 as int16 bits."""
    array = np.asarray(array)
    if _is_bf16(array.dtype):
        return array.view(np.uint16)
    if array.dtype == np.float16:
        return array.view(np.int16)
    return array


def _input_view(array: np.ndarray) -> np.ndarray:
    """_bits_view, read-only: numba types a read-only array apart from a writable one and compiles a kernel
    version for each (--stream hands the core read-only blocks), so the kernels always get read-only inputs."""
    view = _bits_view(array).view()
    view.flags.writeable = False
    return view


def run(views, threads: int) -> tuple[np.ndarray, tuple[float, float] | None]:
    """Σdy and Σdy·(src - mean) per channel (float64, shape (2, C)); when views.out3 is given, writes it and
    returns the min and max of its float64 values before rounding too (core/summary.py), else None.

    views: core.Views (C-contiguous (N, C, S) views of float16, bfloat16, float32 or float64).
    """
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    src = _input_view(views.src3)
    out = _bits_view(views.out3) if views.out3 is not None else np.empty((0, 0, 0), dtype=src.dtype)
    if views.src3.shape[2] * views.src3.dtype.itemsize >= MIN_PLANE_RUN_BYTES:
        sums, keys = _run_planes(views, src, out, threads)
    else:
        sums, keys = _run_rows(views, src, out)
    return sums, (key_extremes(keys) if views.out3 is not None else None)


def _run_planes(views, src: np.ndarray, out: np.ndarray, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Long contiguous runs: channel tasks (fused), or (channel, chunk) tasks when channels are few."""
    shape = views.geometry
    n, c, s = src.shape
    dy = _input_view(views.dy3)
    want_out = views.out3 is not None
    exponents = views.scale_exp if views.scale_exp is not None else np.zeros(c, np.int64)
    sums = np.zeros((2, c))
    if c >= 2 * max(threads, 1):
        keys = np.empty((c, 2), np.int64)
        per_channel = np.stack([views.mean, views.invstd, views.scale])
        kernels.planes_fused(src, dy, out, per_channel, exponents,
                      (shape.chunk_rows, shape.block_lanes, shape.rows_per_lane, shape.partials),
                      (views.need_sums, want_out, views.training), sums, keys)
        return sums, keys
    if views.need_sums:
        partials = np.zeros((c, shape.partials, 2))
        kernels.plane_partials(src, dy, views.mean, (shape.chunk_rows, shape.block_lanes, shape.rows_per_lane), partials)
        kernels.fold_all(partials, sums)
    keys = np.empty((c * shape.chunks if want_out else 0, 2), np.int64)
    if want_out:
        kernels.plane_write(src, dy, out, _coefficient_rows(views, sums), exponents, shape.chunk_rows, views.training,
                     keys)
    return sums, keys


def _run_rows(views, src: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Short runs (NXC): the (N, C·S) row view."""
    shape = views.geometry
    n, c, s = src.shape
    width = c * s
    src2, dy2 = src.reshape(n, width), _input_view(views.dy3).reshape(n, width)
    sums = np.zeros((2, c))
    if views.need_sums:
        partials = np.zeros((c, shape.chunks, 2))
        kernels.row_partials(src2, dy2, np.repeat(views.mean, s), (shape.chunk_rows, shape.rows_per_lane, s), partials)
        kernels.fold_all(partials, sums)
        del partials
    tasks = -(-n // WRITE_ROWS) * -(-width // WRITE_COLUMNS)
    keys = np.empty((tasks if views.out3 is not None else 0, 2), np.int64)
    if views.out3 is not None:
        exponents = views.scale_exp if views.scale_exp is not None else np.zeros(c, np.int64)
        kernels.row_write(src2, dy2, out.reshape(n, width), np.repeat(_coefficient_rows(views, sums), s, axis=1),
                   np.repeat(exponents, s), (views.training, views.scale_exp is not None), keys)
    return sums, keys


def key_extremes(keys: np.ndarray) -> tuple[float, float]:
    """The float64 (min, max) from per-task key extremes (keys (tasks, 2) of _track); NaN when a NaN was seen."""
    if keys.size == 0:
        return float("nan"), float("nan")
    lo, hi = keys[:, 0].min(), keys[:, 1].max()
    if lo < _key(-np.inf) or hi > _key(np.inf):  # NaNs sort beyond the infinities
        return float("nan"), float("nan")
    bits = np.array([lo, hi], np.int64)
    return tuple(float(v) for v in (bits ^ ((bits >> 63) & MAGNITUDE)).view(np.float64))


def _key(value: float) -> int:
    bits = np.array([value], np.float64).view(np.int64)
    return int((bits ^ ((bits >> 63) & MAGNITUDE))[0])


def _coefficient_rows(views, sums: np.ndarray) -> np.ndarray:
    """(4, C): mean, mean(dy), k, scale per channel (the NumPy core's plan.coefficients, the same bits)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mean_dy, k, _ = plan.coefficients(sums[0], sums[1], views.invstd, max(views.count, 1))
    return np.stack([views.mean, mean_dy, k, views.scale])
