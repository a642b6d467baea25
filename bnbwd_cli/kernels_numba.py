"""The optional compiled core (numba): the same two passes as the NumPy core, fused per block.

Imported lazily by kernels.batchnorm_backward (numba's import and JIT cost is paid only when
it is used; compiled code is cached on disk). Supports float32, float64 and bfloat16 T1;
float16 stays on the NumPy core.

Numerics follow the NumPy core: Σdy and Σdy·(src - mean) accumulated in float64, src - mean
formed in float64 (exact for float32 operands; bfloat16 is widened exactly by bits); for the
write pass d = src - mean in the compute dtype (float64 for float64 src, else float32);
mean(dy) and invstd·mean(dy·xhat) rounded once to the
compute dtype, diff_src = scale·((dy - mean(dy)) - d·k), rounded once to T1 (bfloat16: round
to nearest even, NaN kept). fastmath is off, so nothing is reassociated or contracted.

Blocking: an (N, C, S) view. Channel planes with long contiguous runs (NCX): one parallel
task per channel, both passes back to back while the channel's plane is in cache (3 tensor
passes of memory traffic). Short runs (NXC is (M, C, 1)): fixed-size row blocks, per-block, per-column
float64 partial sums combined in block order (deterministic, independent of the thread
count), then a parallel write pass over the row blocks.
"""

from __future__ import annotations

import os

# Idle OpenMP workers sleep instead of spinning: on a small, shared machine a spinning worker steals the
# core the next kernel launch waits on (measured: 0.15 ms launches became 4-8 ms, a scheduler tick or two).
# Read when numba first starts its OpenMP pool; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import intrinsic, overload  # noqa: E402

ROW_BLOCK_ELEMENTS = 1 << 16  # elements of one row block (short-run layouts); fixed, so sums do not depend on threads
MIN_PLANE_RUN_BYTES = 512  # as the NumPy core: shorter contiguous runs are walked by rows


@intrinsic
def _bits_to_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _f32_to_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def _load(array, index):  # pragma: no cover - replaced by the overload inside compiled code
    raise NotImplementedError


def _store(array, index, value):  # pragma: no cover
    raise NotImplementedError


@overload(_load, inline="always")
def _load_impl(array, index):
    if array.dtype == types.uint16:  # bfloat16 bits: the high half of a float32
        return lambda array, index: _bits_to_f32(np.uint32(array[index]) << np.uint32(16))
    return lambda array, index: array[index]


@overload(_store, inline="always")
def _store_impl(array, index, value):
    if array.dtype == types.uint16:
        def store_bf16(array, index, value):
            bits = _f32_to_bits(np.float32(value))
            # round to nearest even on bit 16 (overflow carries into inf, as it should) ...
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            # ... but a NaN stays a (quiet) NaN; branch-free, so the loop vectorises
            nan_mask = np.uint32(0) - np.uint32((bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000))
            quiet = (bits >> np.uint32(16)) | np.uint32(0x40)
            array[index] = np.uint16((rounded & ~nan_mask) | (quiet & nan_mask))
        return store_bf16

    def store(array, index, value):
        array[index] = value
    return store


@njit(parallel=True, fastmath=False, cache=True)
def _planes(src, dy, out, n, c, s, mean_c, mean64, scale_c, invstd, count, training, need_sums, want_out, sums, coef):
    """One task per channel: pass 1 (sums) then pass 2 (write) over its (N, S) plane."""
    for ch in prange(c):
        m = mean_c[ch]
        m64 = mean64[ch]
        s0 = 0.0
        s1 = 0.0
        if need_sums:
            # Column partials over the N rows (an elementwise float64 update that vectorises), then
            # one sum along s: a fixed order, independent of threads.
            col_g = np.zeros(s)
            col_p = np.zeros(s)
            for i in range(n):
                base = (i * c + ch) * s
                for j in range(s):
                    g = np.float64(_load(dy, base + j))
                    col_g[j] += g
                    col_p[j] += g * (np.float64(_load(src, base + j)) - m64)
            for j in range(s):
                s0 += col_g[j]
                s1 += col_p[j]
        sums[0, ch] = s0
        sums[1, ch] = s1
        if want_out:
            sc = scale_c[ch]
            if training:
                coef[0, ch] = s0 / count  # rounded once to the compute dtype
                coef[1, ch] = invstd[ch] * (s1 * invstd[ch] / count)
                mean_dy = coef[0, ch]
                k = coef[1, ch]
                for i in range(n):
                    base = (i * c + ch) * s
                    for j in range(s):
                        d = _load(src, base + j) - m
                        _store(out, base + j, ((_load(dy, base + j) - mean_dy) - d * k) * sc)
            else:
                for i in range(n):
                    base = (i * c + ch) * s
                    for j in range(s):
                        _store(out, base + j, _load(dy, base + j) * sc)


@njit(parallel=True, fastmath=False, cache=True)
def _row_sums(src, dy, n, width, mean_row, rows_per_block, partial):
    """partial[b] = [Σdy, Σdy·(src - mean)] per column of a row (width = C·S) over row block b, in float64.

    The column loop is innermost and contiguous, so it vectorises; the caller folds the S columns of
    a channel together afterwards (mean_row is the mean repeated S times).
    """
    blocks = partial.shape[0]
    for b in prange(blocks):
        n0 = b * rows_per_block
        n1 = min(n0 + rows_per_block, n)
        p0 = partial[b, 0]
        p1 = partial[b, 1]
        for i in range(n0, n1):
            base = i * width
            for k in range(width):
                g = np.float64(_load(dy, base + k))
                p0[k] += g
                p1[k] += g * (np.float64(_load(src, base + k)) - mean_row[k])


@njit(parallel=True, fastmath=False, cache=True)
def _row_write(src, dy, out, n, c, s, mean_c, scale_c, coef, training, rows_per_block, blocks):
    for b in prange(blocks):
        n0 = b * rows_per_block
        n1 = min(n0 + rows_per_block, n)
        for i in range(n0, n1):
            for ch in range(c):
                base = (i * c + ch) * s
                sc = scale_c[ch]
                if training:
                    m = mean_c[ch]
                    mean_dy = coef[0, ch]
                    k = coef[1, ch]
                    for j in range(s):
                        d = _load(src, base + j) - m
                        _store(out, base + j, ((_load(dy, base + j) - mean_dy) - d * k) * sc)
                else:
                    for j in range(s):
                        _store(out, base + j, _load(dy, base + j) * sc)


def _is_bf16(dtype: np.dtype) -> bool:
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


def supports(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype in (np.dtype(np.float32), np.dtype(np.float64)) or _is_bf16(dtype)


def _flat(array: np.ndarray) -> np.ndarray:
    """A flat, plain-ndarray view (memmaps included), bfloat16 as its uint16 bits."""
    flat = np.asarray(array).reshape(-1)
    return flat.view(np.uint16) if _is_bf16(flat.dtype) else flat


def run(src3: np.ndarray, dy3: np.ndarray, out3: np.ndarray | None, mean64: np.ndarray, invstd: np.ndarray,
        scale: np.ndarray, compute_dtype: np.dtype, count: int, training: bool, need_sums: bool,
        threads: int) -> np.ndarray:
    """Σdy and Σdy·(src - mean) per channel (float64, shape (2, C)); writes out3 when given.

    src3, dy3, out3: C-contiguous (N, C, S) views of the same dtype (float32, float64 or bfloat16).
    """
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    n, c, s = src3.shape
    src, dy = _flat(src3), _flat(dy3)
    want_out = out3 is not None
    out = _flat(out3) if want_out else np.empty(0, dtype=src.dtype)
    mean_c = mean64.astype(compute_dtype)
    scale_c = scale.astype(compute_dtype)
    coef = np.zeros((2, c), dtype=compute_dtype)
    sums = np.zeros((2, c))
    if s * src3.dtype.itemsize >= MIN_PLANE_RUN_BYTES:
        _planes(src, dy, out, n, c, s, mean_c, mean64, scale_c, invstd, count, training, need_sums, want_out, sums, coef)
        return sums
    rows_per_block = max(1, ROW_BLOCK_ELEMENTS // max(c * s, 1))
    blocks = -(-n // rows_per_block)
    if need_sums:
        partial = np.zeros((blocks, 2, c * s))
        _row_sums(src, dy, n, c * s, np.repeat(mean64, s), rows_per_block, partial)
        columns = np.zeros((2, c * s))
        for b in range(blocks):  # in block order: deterministic
            columns += partial[b]
        sums = columns.reshape(2, c, s).sum(axis=2)
    if want_out:
        if training:
            coef[0] = sums[0] / count
            coef[1] = invstd * (sums[1] * invstd / count)
        _row_write(src, dy, out, n, c, s, mean_c, scale_c, coef, training, rows_per_block, blocks)
    return sums
