"""The numba core's compiled code: every @njit function, in one file.

numba checks its on-disk cache against the file a function is defined in, not the files it calls
into, so all compiled code lives here (and in plan.py's shared arithmetic, whose bytes core.numba_cache_dir
puts in the cache directory's name): an edit to either recompiles it all.
The numerics, the work split and the drivers: core/numba_core.py.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from bnbwd_cli.core import plan

MIN_PLANE_RUN_BYTES = 512  # as the NumPy core: shorter contiguous runs are walked by rows
WRITE_COLUMNS = 4096  # columns of one row-write task
WRITE_ROWS = 64  # rows of one row-write task
MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)  # the bits below a float64's sign
KEY_LIMITS = (np.iinfo(np.int64).max, np.iinfo(np.int64).min)  # the extremes' start: (lo, hi) of no value

# The small helpers are plain @njit, not inline="always": numba compiles each once per type signature and
# every kernel links that one copy (LLVM still inlines it, so loops vectorise as before), where an inline
# helper is typed and lowered again at every call site of every kernel (cold JIT of the f32 kernels
# 18.6 -> 15.8 CPU-s; f32 NCX write no slower: see git log).
_pair_sum = njit(plan.pair_sum)
_fold_result = njit(plan.fold_result)
_coefficients = njit(plan.coefficients)


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


@overload(_load)
def _load_impl(array, index):
    if array.dtype == types.uint16:  # bfloat16 bits: the high half of a float32
        return lambda array, index: _bits_to_f32(np.uint32(array[index]) << np.uint32(16))
    if array.dtype == types.int16:  # float16 bits
        return lambda array, index: _half_to_f32(array[index])
    return lambda array, index: array[index]


@intrinsic
def _f32_to_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _f64_to_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@njit
def _track(lo, hi, value):
    """Running (min, max) of float64 values as order keys (see order_key): integer min/max vectorise, and a
    NaN lands beyond ±inf's keys, so it shows in the extremes."""
    bits = _f64_to_bits(value)
    key = bits ^ ((bits >> 63) & MAGNITUDE)
    return min(lo, key), max(hi, key)


@njit
def _round_to_odd(value):
    """float32 of a float64 rounded to odd (truncated, last bit set when inexact): see rounding.round_to_odd_float32."""
    narrow = np.float32(value)
    back = np.float64(narrow)
    # Without branches (a branch here kept the write loops scalar): rounded away from zero -> one step back
    # (toward zero: the truncation), then inexact -> last bit set. A NaN is "inexact" and keeps a NaN's bits.
    toward_zero = np.uint32(abs(back) > abs(value))
    inexact = np.uint32(back != value)
    return _bits_to_f32((_f32_to_bits(narrow) - toward_zero) | inexact)


@overload(_store)
def _store_impl(array, index, value):
    """array[index] = value (float64) rounded once to the array's type."""
    if array.dtype == types.uint16:
        def store_bf16(array, index, value):
            array[index] = _f32_to_bf16(_round_to_odd(value))
        return store_bf16
    if array.dtype == types.int16:
        def store_f16(array, index, value):
            array[index] = _f32_to_half(_round_to_odd(value))
        return store_f16
    if array.dtype == types.float32:
        def store_f32(array, index, value):
            array[index] = np.float32(value)
        return store_f32

    def store(array, index, value):
        array[index] = value
    return store


# ---------------------------------------------------------------- shared pieces


@njit
def _tree(lanes, length):
    """plan.lane_tree on lanes[:length], in place."""
    while length > 1:
        half = length // 2
        keep = length - half
        for i in range(half):
            lanes[i] += lanes[keep + i]
        length = keep
    return lanes[0]


@njit
def _fold(values):
    """plan.fold of a 1-D array of partials (overwritten: the tree runs in place)."""
    length = values.shape[0]
    if length == 0:
        return 0.0
    lo = np.zeros(length)
    while length > 1:
        half = length // 2
        keep = length - half
        for i in range(half):
            values[i], lo[i] = _pair_sum(values[i], lo[i], values[keep + i], lo[keep + i])
        length = keep
    hi = values[0]
    return _fold_result(hi, lo[0]) if math.isfinite(hi) else hi


@njit
def _value(g, x, j, m, mean_dy, k, sc, exponent, training):
    """diff_src of one element, float64: ((g - mean(dy)) - d·k)·scale, then ·2**exponent.

    Callers loop over it with constant exponent 0 and training True where they can: LLVM inlines it and drops
    both branches, and the loop vectorises; with the flags as loop-invariant values it unswitched the loop only
    for inference (the training body is over its size limit), so training writes ran scalar (4-8x slower)."""
    gv = np.float64(_load(g, j))
    if training:
        result = ((gv - mean_dy) - (np.float64(_load(x, j)) - m) * k) * sc
    else:
        result = gv * sc
    if exponent != 0:
        result = math.ldexp(result, exponent)
    return result


# ---------------------------------------------------------------- long runs: channel planes
# HELPERS (_plane_partial, _channel_partials, _write_plane) compile once per argument-type tuple, so every
# caller passes the same types: a prange index is int64 while the kernel is typed but uint64 in the parallel
# loop's body (two versions), hence np.int64(task); a tuple (0, n) holds a Literal[int](0), hence np.int64(0).
# No cache=True on them: a cached kernel's entry holds the code of every helper it calls.


@njit
def _plane_partial(src3, dy3, ch, rows, lanes, r0, m, acc0, acc1):
    """The partial [Σdy, Σdy·d] of channel ch over one chunk (rows) and one block (lanes): plan's order."""
    r_lo, r_hi = rows
    s_lo, s_hi = lanes
    width = s_hi - s_lo
    length = r0 * width
    acc0[:length] = 0.0
    acc1[:length] = 0.0
    for i in range(r_lo, r_hi):
        t = (i - r_lo) % r0
        a0 = acc0[t * width : (t + 1) * width]
        a1 = acc1[t * width : (t + 1) * width]
        x = src3[i, ch, s_lo:s_hi]
        g = dy3[i, ch, s_lo:s_hi]
        for j in range(width):
            gv = np.float64(_load(g, j))
            a0[j] += gv
            a1[j] += gv * (np.float64(_load(x, j)) - m)
    return _tree(acc0, length), _tree(acc1, length)


@njit
def _channel_partials(src3, dy3, ch, m, chunk_rows, block, r0, out):
    """out[j] = partials (2,) of channel ch, j = chunk·blocks + block."""
    n, _, s = src3.shape
    blocks = (s + block - 1) // block
    acc0 = np.empty(r0 * block)
    acc1 = np.empty(r0 * block)
    for j in range(out.shape[0]):
        chunk = j // blocks
        b = j % blocks
        rows = (chunk * chunk_rows, min((chunk + 1) * chunk_rows, n))
        out[j, 0], out[j, 1] = _plane_partial(src3, dy3, ch, rows, (b * block, min((b + 1) * block, s)), r0,
                                              m, acc0, acc1)


@njit
def _write_plane(src3, dy3, out3, ch, rows, coef, exponent, training):
    """diff_src of channel ch over rows; coef = (mean, mean(dy), k, scale). Returns the values' key extremes."""
    m, mean_dy, k, sc = coef
    lo, hi = KEY_LIMITS
    for i in range(rows[0], rows[1]):
        g = dy3[i, ch, :]
        x = src3[i, ch, :]
        o = out3[i, ch, :]
        if training and exponent == 0:  # the usual case, in a loop of its own: see _value
            for j in range(g.shape[0]):
                value = _value(g, x, j, m, mean_dy, k, sc, 0, True)
                _store(o, j, value)
                lo, hi = _track(lo, hi, value)
        elif exponent == 0:
            for j in range(g.shape[0]):
                value = _value(g, x, j, m, mean_dy, k, sc, 0, False)
                _store(o, j, value)
                lo, hi = _track(lo, hi, value)
        else:
            for j in range(g.shape[0]):
                value = _value(g, x, j, m, mean_dy, k, sc, exponent, training)
                _store(o, j, value)
                lo, hi = _track(lo, hi, value)
    return lo, hi


@njit(parallel=True, cache=True)
def planes_fused(src3, dy3, out3, per_channel, exponents, shape, flags, sums, keys):
    """One task per channel: its partials, fold, coefficients, then its diff_src while the plane is in cache.

    per_channel: (4, C) mean, invstd, scale, count-as-float; shape: (chunk_rows, block, r0, partials); flags:
    (need_sums, want_out, training); keys (C, 2): the written values' key extremes per channel.
    """
    n, c, s = src3.shape
    chunk_rows, block, r0, count = shape
    need_sums, want_out, training = flags
    for task in prange(c):
        ch = np.int64(task)  # int64, not prange's uint64: see HELPERS
        partials = np.zeros((count, 2))
        if need_sums:
            _channel_partials(src3, dy3, ch, per_channel[0, ch], chunk_rows, block, r0, partials)
        s0 = _fold(partials[:, 0])
        s1 = _fold(partials[:, 1])
        sums[0, ch] = s0
        sums[1, ch] = s1
        if want_out:
            mean_dy, k, _ = _coefficients(s0, s1, per_channel[1, ch], n * s)
            coef = (per_channel[0, ch], mean_dy, k, per_channel[2, ch])
            keys[ch, 0], keys[ch, 1] = _write_plane(src3, dy3, out3, ch, (np.int64(0), n), coef, exponents[ch], training)


@njit(parallel=True, cache=True)
def plane_partials(src3, dy3, mean, shape, partials):
    """partials[ch, j] for all channels: (channel, partial) tasks, all cores busy even with few channels."""
    n, c, s = src3.shape
    chunk_rows, block, r0 = shape
    count = partials.shape[1]
    blocks = (s + block - 1) // block
    for task in prange(c * count):
        ch = np.int64(task) // count  # see HELPERS
        j = np.int64(task) % count
        chunk = j // blocks
        b = j % blocks
        acc0 = np.empty(r0 * block)
        acc1 = np.empty(r0 * block)
        rows = (chunk * chunk_rows, min((chunk + 1) * chunk_rows, n))
        partials[ch, j, 0], partials[ch, j, 1] = _plane_partial(src3, dy3, ch, rows, (b * block, min((b + 1) * block, s)),
                                                                r0, mean[ch], acc0, acc1)


@njit(parallel=True, cache=True)
def plane_write(src3, dy3, out3, coef, exponents, chunk_rows, training, keys):
    """diff_src by (channel, chunk of rows) tasks; coef (4, C): mean, mean(dy), k, scale; keys (tasks, 2)."""
    n, c, s = src3.shape
    chunks = (n + chunk_rows - 1) // chunk_rows
    for task in prange(c * chunks):
        ch = np.int64(task) // chunks  # see HELPERS
        chunk = np.int64(task) % chunks
        rows = (chunk * chunk_rows, min((chunk + 1) * chunk_rows, n))
        keys[task, 0], keys[task, 1] = _write_plane(src3, dy3, out3, ch, rows, (coef[0, ch], coef[1, ch], coef[2, ch], coef[3, ch]), exponents[ch],
                     training)


@njit(parallel=True, cache=True)
def fold_all(partials, sums):
    """sums[:, ch] = the folds of partials[ch, :, :] (C, J, 2)."""
    for ch in prange(partials.shape[0]):
        sums[0, ch] = _fold(partials[ch, :, 0])
        sums[1, ch] = _fold(partials[ch, :, 1])


# ---------------------------------------------------------------- short runs: row chunks


@njit(parallel=True, cache=True)
def row_partials(src2, dy2, mean_col, shape, partials):
    """partials[ch, j] for every channel, one task per chunk of rows of the (N, C·S) view.

    Lanes (t, s) of channel c are acc[t, c·S + s]: the row-group accumulators are filled row by row (the
    column loop contiguous, vectorised), then each channel's lanes are gathered in (t, s) order for the tree.
    """
    n, width = src2.shape
    chunk_rows, r0, s = shape
    c = width // s
    chunks = partials.shape[1]
    for j in prange(chunks):
        acc0 = np.zeros((r0, width))
        acc1 = np.zeros((r0, width))
        r_lo = j * chunk_rows
        for i in range(r_lo, min(r_lo + chunk_rows, n)):
            t = (i - r_lo) % r0
            a0 = acc0[t]
            a1 = acc1[t]
            x = src2[i]
            g = dy2[i]
            for w in range(width):
                gv = np.float64(_load(g, w))
                a0[w] += gv
                a1[w] += gv * (np.float64(_load(x, w)) - mean_col[w])
        lanes0 = np.empty(r0 * s)
        lanes1 = np.empty(r0 * s)
        for ch in range(c):
            for t in range(r0):
                for k in range(s):
                    lanes0[t * s + k] = acc0[t, ch * s + k]
                    lanes1[t * s + k] = acc1[t, ch * s + k]
            partials[ch, j, 0] = _tree(lanes0, r0 * s)
            partials[ch, j, 1] = _tree(lanes1, r0 * s)


@njit(parallel=True, cache=True)
def row_write(src2, dy2, out2, columns, exponents, flags, keys):
    """diff_src over (row block, column range) tasks; columns (4, C·S): mean, mean(dy), k, scale per column.

    flags: (training, scaled); without per-column exponents the loop has no branch and vectorises.
    keys (tasks, 2): the written values' key extremes per task.
    """
    training, scaled = flags
    n, width = src2.shape
    blocks = (n + WRITE_ROWS - 1) // WRITE_ROWS
    ranges = (width + WRITE_COLUMNS - 1) // WRITE_COLUMNS
    for task in prange(blocks * ranges):
        b = task // ranges
        k0 = (task % ranges) * WRITE_COLUMNS
        k1 = min(k0 + WRITE_COLUMNS, width)
        m = columns[0, k0:k1]
        mdy = columns[1, k0:k1]
        kk = columns[2, k0:k1]
        sc = columns[3, k0:k1]
        e = exponents[k0:k1]
        lo, hi = KEY_LIMITS
        for i in range(b * WRITE_ROWS, min((b + 1) * WRITE_ROWS, n)):
            g = dy2[i, k0:k1]
            x = src2[i, k0:k1]
            o = out2[i, k0:k1]
            if training and not scaled:  # the usual case, in a loop of its own: see _value
                for j in range(k1 - k0):
                    value = _value(g, x, j, m[j], mdy[j], kk[j], sc[j], 0, True)
                    _store(o, j, value)
                    lo, hi = _track(lo, hi, value)
            elif scaled:
                for j in range(k1 - k0):
                    value = _value(g, x, j, m[j], mdy[j], kk[j], sc[j], e[j], training)
                    _store(o, j, value)
                    lo, hi = _track(lo, hi, value)
            else:
                for j in range(k1 - k0):
                    value = _value(g, x, j, m[j], mdy[j], kk[j], sc[j], 0, False)
                    _store(o, j, value)
                    lo, hi = _track(lo, hi, value)
        keys[task, 0] = lo
        keys[task, 1] = hi
