"""The optional compiled core (numba): the same two passes as the NumPy core, fused per block.

Imported lazily by kernels.batchnorm_backward (numba's import and JIT cost is paid only when
it is used; compiled code is cached on disk). Supports float64, float32, bfloat16 and float16 T1
(float16 where the CPU converts halves in hardware: see half_is_native).

Numerics follow the NumPy core: Σdy and Σdy·(src - mean) accumulated in float64, src - mean
formed in float64 (exact for float32 operands; bfloat16 and float16 are widened exactly); for the
write pass d = src - mean in the compute dtype (float64 for float64 src, else float32);
mean(dy) and invstd·mean(dy·xhat) rounded once to the compute dtype,
diff_src = scale·((dy - mean(dy)) - d·k), rounded once to T1 (round to nearest even, NaN kept).
fastmath is off except for reassociation in the float64 sums loops (see SUMS_FASTMATH), so the
write pass is neither reassociated nor contracted: its bits match the NumPy core's wherever the
float64 sums round alike.

Every inner loop indexes a slice with its own range variable: LLVM then knows the index is
in bounds and non-negative, and vectorises the loop. (Indexing a flat array with a computed
`base + j` kept numba's negative-index wraparound in the loop, which blocked vectorisation:
the same kernels ran 3x slower, 40 vs 14 ms for f32 (64,128,56,56) on 2 cores.)

Blocking, on the (N, C, S) view:
- Long contiguous runs (NCX): channel planes. With at least 2 channels a thread, one task per
  channel, both passes back to back while the plane is in cache (3 tensor passes of memory
  traffic). With fewer channels, the planes are cut into column chunks: one parallel pass of
  sums, then one parallel write pass (5 passes; more tasks when planes are wider than a chunk).
- Short runs (NXC is (M, C, 1)): the (N, C·S) row view in tiles of row blocks x column chunks;
  per-tile, per-column float64 partial sums combined in tile order, then a parallel write pass.
The number of row blocks and chunks depends only on the shape, and chunk sums are combined in a
fixed order, so the results do not depend on the thread count.
"""

from __future__ import annotations

import os
import platform

# Idle OpenMP workers sleep instead of spinning: on a small, shared machine a spinning worker steals the
# core the next kernel launch waits on (measured: 0.15 ms launches became 4-8 ms, a scheduler tick or two).
# Read when numba first starts its OpenMP pool; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import binding as llvm_binding  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import intrinsic, overload  # noqa: E402

# Columns one task or one sums call covers (16 KiB runs of float32); the row kernels' float64 column partials
# of a chunk (2 x 32 KiB) stay in L1/L2 while the rows stream past.
CHUNK = 4096
MIN_PLANE_RUN_BYTES = 512  # as the NumPy core: shorter contiguous runs are walked by rows
MAX_ROW_BLOCKS = 64  # row blocks of the short-run kernel: enough tasks to share, few partials to keep
MIN_BLOCK_ROWS = 64  # ... and at least this many rows each, so the partials stay <= 1/8 of the input


# ---------------------------------------------------------------- 16-bit floats as integer bits
# numba has no float16 or bfloat16 type, so both travel as 16-bit integers: bfloat16 as uint16,
# float16 as int16 (the signedness only selects the conversion). float16 converts with LLVM's
# half type (one vcvtph2ps/vcvtps2ph on x86 with F16C), bfloat16 by shifting bits.


@intrinsic
def _bits_to_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _f32_to_bf16(typingctx, value):
    """bfloat16 bits of a float32: round to nearest even on bit 16 (overflow carries into inf, as it
    should), but a NaN stays a (quiet) NaN. Written in LLVM IR so the NaN case is a select, which
    vectorises (numba's own conditional expression inside an inlined overload did too, with warnings)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        high = builder.lshr(bits, ir.Constant(i32, 16))
        rounded = builder.lshr(builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)),
                                           builder.and_(high, ir.Constant(i32, 1))), ir.Constant(i32, 16))
        quiet = builder.or_(high, ir.Constant(i32, 0x40))
        is_nan = builder.icmp_unsigned(">", builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF)), ir.Constant(i32, 0x7F800000))
        return builder.trunc(builder.select(is_nan, quiet, rounded), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def _half_to_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.int16), codegen


@intrinsic
def _f32_to_half(typingctx, value):
    """Round to nearest even (LLVM's fptrunc in the default rounding mode); NaN stays NaN."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.int16(types.float32), codegen


def _load(array, index):  # pragma: no cover - replaced by the overload inside compiled code
    raise NotImplementedError


def _store(array, index, value):  # pragma: no cover
    raise NotImplementedError


@overload(_load, inline="always")
def _load_impl(array, index):
    if array.dtype == types.uint16:  # bfloat16 bits: the high half of a float32
        return lambda array, index: _bits_to_f32(np.uint32(array[index]) << np.uint32(16))
    if array.dtype == types.int16:  # float16 bits
        return lambda array, index: _half_to_f32(array[index])
    return lambda array, index: array[index]


@overload(_store, inline="always")
def _store_impl(array, index, value):
    if array.dtype == types.uint16:
        def store_bf16(array, index, value):
            array[index] = _f32_to_bf16(np.float32(value))
        return store_bf16
    if array.dtype == types.int16:
        def store_f16(array, index, value):
            array[index] = _f32_to_half(np.float32(value))
        return store_f16

    def store(array, index, value):
        array[index] = value
    return store


# ---------------------------------------------------------------- long runs: channel planes


# Sums loops may reassociate (fastmath "reassoc" only): LLVM then keeps several vector accumulators, which
# doubles their speed (0.41 -> 0.19 ns an element in cache, single thread). Accuracy does not suffer: every
# product dy·(src - mean) is exact in float64, and more partial sums only shorten the rounding chains. The
# order is fixed by the compiled code, so results still do not depend on the thread count.
SUMS_FASTMATH = {"reassoc"}


@njit(cache=True, fastmath=SUMS_FASTMATH)
def _chunk_sums(src3, dy3, ch, j0, j1, mean64):
    """[Σdy, Σdy·(src - mean)] in float64 over rows 0..N of channel ch, columns j0..j1."""
    s0 = 0.0
    s1 = 0.0
    for i in range(src3.shape[0]):
        x = src3[i, ch, j0:j1]
        g = dy3[i, ch, j0:j1]
        for j in range(j1 - j0):
            gv = np.float64(_load(g, j))
            s0 += gv
            s1 += gv * (np.float64(_load(x, j)) - mean64)
    return s0, s1


@njit(cache=True)
def _write_plane(src3, dy3, out3, ch, j0, j1, m, mean_dy, k, sc, training):
    """diff_src of channel ch, columns j0..j1, all rows."""
    width = j1 - j0
    for i in range(src3.shape[0]):
        g = dy3[i, ch, j0:j1]
        o = out3[i, ch, j0:j1]
        if training:
            x = src3[i, ch, j0:j1]
            for j in range(width):
                _store(o, j, ((_load(g, j) - mean_dy) - (_load(x, j) - m) * k) * sc)
        else:
            for j in range(width):
                _store(o, j, _load(g, j) * sc)


@njit(parallel=True, cache=True)
def _planes_fused(src3, dy3, out3, mean_c, mean64, scale_c, invstd, count, need_sums, want_out, training, sums, coef):
    """One task per channel: its sums, then its diff_src while the plane is still in cache.

    coef (compute dtype) receives mean(dy) and invstd·mean(dy·xhat): storing rounds them once, as _coefficients.
    """
    n, c, s = src3.shape
    chunks = (s + CHUNK - 1) // CHUNK
    for ch in prange(c):
        s0 = 0.0
        s1 = 0.0
        if need_sums:
            for b in range(chunks):  # chunk totals folded in chunk order, as _plane_chunk_sums + fold
                g, p = _chunk_sums(src3, dy3, ch, b * CHUNK, min((b + 1) * CHUNK, s), mean64[ch])
                s0 += g
                s1 += p
        sums[0, ch] = s0
        sums[1, ch] = s1
        if want_out:
            coef[0, ch] = s0 / count
            coef[1, ch] = invstd[ch] * (s1 * invstd[ch] / count)
            _write_plane(src3, dy3, out3, ch, 0, s, mean_c[ch], coef[0, ch], coef[1, ch], scale_c[ch], training)


@njit(parallel=True, cache=True)
def _plane_chunk_sums(src3, dy3, mean64, chunk_sums):
    """chunk_sums[ch, b] = the sums of chunk b of channel ch: (channel, chunk) tasks, all cores busy."""
    n, c, s = src3.shape
    chunks = chunk_sums.shape[1]
    for task in prange(c * chunks):
        ch = task // chunks
        b = task % chunks
        g, p = _chunk_sums(src3, dy3, ch, b * CHUNK, min((b + 1) * CHUNK, s), mean64[ch])
        chunk_sums[ch, b, 0] = g
        chunk_sums[ch, b, 1] = p


@njit(parallel=True, cache=True)
def _plane_chunk_write(src3, dy3, out3, mean_c, scale_c, coef, training):
    n, c, s = src3.shape
    chunks = (s + CHUNK - 1) // CHUNK
    for task in prange(c * chunks):
        ch = task // chunks
        b = task % chunks
        _write_plane(src3, dy3, out3, ch, b * CHUNK, min((b + 1) * CHUNK, s), mean_c[ch], coef[0, ch], coef[1, ch],
                     scale_c[ch], training)


# ---------------------------------------------------------------- short runs: row tiles


@njit(parallel=True, cache=True)
def _row_sums(src2, dy2, mean_col, block_rows, partial):
    """partial[b, :, k] = [Σdy, Σdy·(src - mean)] of column k over row block b, in float64.

    Tiles are (row block, column chunk); the column loop is innermost and contiguous, so it vectorises.
    """
    n, width = src2.shape
    blocks = partial.shape[0]
    chunks = (width + CHUNK - 1) // CHUNK
    for task in prange(blocks * chunks):
        b = task // chunks
        k0 = (task % chunks) * CHUNK
        k1 = min(k0 + CHUNK, width)
        p0 = partial[b, 0, k0:k1]
        p1 = partial[b, 1, k0:k1]
        m = mean_col[k0:k1]
        for i in range(b * block_rows, min((b + 1) * block_rows, n)):
            x = src2[i, k0:k1]
            g = dy2[i, k0:k1]
            for k in range(k1 - k0):
                gv = np.float64(_load(g, k))
                p0[k] += gv
                p1[k] += gv * (np.float64(_load(x, k)) - m[k])


@njit(parallel=True, cache=True)
def _row_write(src2, dy2, out2, mean_col, mean_dy_col, k_col, scale_col, training, block_rows):
    """diff_src over (row block, column chunk) tiles, with per-column coefficients."""
    n, width = src2.shape
    blocks = (n + block_rows - 1) // block_rows
    chunks = (width + CHUNK - 1) // CHUNK
    for task in prange(blocks * chunks):
        b = task // chunks
        k0 = (task % chunks) * CHUNK
        k1 = min(k0 + CHUNK, width)
        m = mean_col[k0:k1]
        mdy = mean_dy_col[k0:k1]
        kk = k_col[k0:k1]
        sc = scale_col[k0:k1]
        for i in range(b * block_rows, min((b + 1) * block_rows, n)):
            g = dy2[i, k0:k1]
            o = out2[i, k0:k1]
            if training:
                x = src2[i, k0:k1]
                for k in range(k1 - k0):
                    _store(o, k, ((_load(g, k) - mdy[k]) - (_load(x, k) - m[k]) * kk[k]) * sc[k])
            else:
                for k in range(k1 - k0):
                    _store(o, k, _load(g, k) * sc[k])


# ---------------------------------------------------------------- driver


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


def _coefficients(sums: np.ndarray, invstd: np.ndarray, count: int, compute_dtype: np.dtype) -> np.ndarray:
    """[mean(dy), invstd·mean(dy·xhat)] per channel, rounded once to the compute dtype (as the NumPy core)."""
    return np.stack([sums[0] / count, invstd * (sums[1] * invstd / count)]).astype(compute_dtype)


def run(src3: np.ndarray, dy3: np.ndarray, out3: np.ndarray | None, mean64: np.ndarray, invstd: np.ndarray,
        scale: np.ndarray, compute_dtype: np.dtype, count: int, training: bool, need_sums: bool,
        threads: int) -> np.ndarray:
    """Σdy and Σdy·(src - mean) per channel (float64, shape (2, C)); writes out3 when given.

    src3, dy3, out3: C-contiguous (N, C, S) views of the same dtype (float16, bfloat16, float32 or float64).
    """
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    n, c, s = src3.shape
    src, dy = _bits_view(src3), _bits_view(dy3)
    want_out = out3 is not None
    out = _bits_view(out3) if want_out else np.empty((0, 0, 0), dtype=src.dtype)
    need_sums = need_sums or (training and want_out)
    mean_c = mean64.astype(compute_dtype)
    scale_c = scale.astype(compute_dtype)
    sums = np.zeros((2, c))
    if s * src3.dtype.itemsize >= MIN_PLANE_RUN_BYTES:
        if c >= 2 * max(threads, 1):
            coef = np.zeros((2, c), dtype=compute_dtype)
            _planes_fused(src, dy, out, mean_c, mean64, scale_c, invstd, count, need_sums, want_out, training, sums, coef)
            return sums
        if need_sums:
            chunk_sums = np.zeros((c, -(-s // CHUNK), 2))
            _plane_chunk_sums(src, dy, mean64, chunk_sums)
            for b in range(chunk_sums.shape[1]):  # chunk order, as _planes_fused folds them: the same bits
                sums += chunk_sums[:, b].T
        if want_out:
            _plane_chunk_write(src, dy, out, mean_c, scale_c, _coefficients(sums, invstd, count, compute_dtype), training)
        return sums

    width = c * s
    src2, dy2 = src.reshape(n, width), dy.reshape(n, width)
    block_rows = -(-n // max(1, min(MAX_ROW_BLOCKS, n // MIN_BLOCK_ROWS)))
    if need_sums:
        partial = np.zeros((-(-n // block_rows), 2, width))
        _row_sums(src2, dy2, np.repeat(mean64, s), block_rows, partial)
        columns = np.zeros((2, width))
        for block in partial:  # in block order: deterministic
            columns += block
        sums = columns.reshape(2, c, s).sum(axis=2)
        del partial, columns  # free before the write pass: with few rows they are as large as the input
    if want_out:
        mean_dy, k = _coefficients(sums, invstd, count, compute_dtype)
        _row_write(src2, dy2, out.reshape(n, width), np.repeat(mean_c, s), np.repeat(mean_dy, s), np.repeat(k, s),
                   np.repeat(scale_c, s), training, block_rows)
    return sums
