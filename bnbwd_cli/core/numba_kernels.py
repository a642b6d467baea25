"""The numba core's compiled kernels (16-bit float loads and stores: core/numba_bits.py).

numba checks its on-disk cache against the file a function is defined in, not the files it calls
into; core.numba_cache_dir puts the bytes of every file the kernels are compiled from (here, numba_bits.py
and plan.py's shared arithmetic: core.NUMBA_SOURCES) in the cache directory's name, so an edit to any of
them recompiles it all.
The numerics, the work split and the drivers: core/numba_core.py.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from bnbwd_cli.core import plan
from bnbwd_cli.core.numba_bits import KEY_LIMITS, load, store, track

MIN_PLANE_RUN_BYTES = 512  # as the NumPy core: shorter contiguous runs are walked by rows
WRITE_COLUMNS = 4096  # columns of one row-write task
WRITE_ROWS = 64  # rows of one row-write task

# The small helpers are plain @njit, not inline="always": numba compiles each once per type signature and
# every kernel links that one copy (LLVM still inlines it, so loops vectorise as before), where an inline
# helper is typed and lowered again at every call site of every kernel, which lengthens the cold JIT for
# no faster kernel.
_pair_sum = njit(plan.pair_sum)
_fold_result = njit(plan.fold_result)
_coefficients = njit(plan.coefficients)


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
    for inference (the training body is over its size limit), so training writes ran scalar."""
    gv = np.float64(load(g, j))
    if training:
        result = ((gv - mean_dy) - (np.float64(load(x, j)) - m) * k) * sc
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
    if r0 == 1:  # every row adds to the same lanes: two rows a pass over them, each lane adding row i, then row i + 1
        a0 = acc0[:width]
        a1 = acc1[:width]
        for i in range(r_lo, r_hi - 1, 2):
            x, x2 = src3[i, ch, s_lo:s_hi], src3[i + 1, ch, s_lo:s_hi]
            g, g2 = dy3[i, ch, s_lo:s_hi], dy3[i + 1, ch, s_lo:s_hi]
            for j in range(width):
                gv = np.float64(load(g, j))
                gv2 = np.float64(load(g2, j))
                a0[j] = (a0[j] + gv) + gv2
                a1[j] = (a1[j] + gv * (np.float64(load(x, j)) - m)) + gv2 * (np.float64(load(x2, j)) - m)
        if (r_hi - r_lo) % 2:
            x = src3[r_hi - 1, ch, s_lo:s_hi]
            g = dy3[r_hi - 1, ch, s_lo:s_hi]
            for j in range(width):
                gv = np.float64(load(g, j))
                a0[j] += gv
                a1[j] += gv * (np.float64(load(x, j)) - m)
        return _tree(acc0, length), _tree(acc1, length)
    for i in range(r_lo, r_hi):
        t = (i - r_lo) % r0
        a0 = acc0[t * width : (t + 1) * width]
        a1 = acc1[t * width : (t + 1) * width]
        x = src3[i, ch, s_lo:s_hi]
        g = dy3[i, ch, s_lo:s_hi]
        for j in range(width):
            gv = np.float64(load(g, j))
            a0[j] += gv
            a1[j] += gv * (np.float64(load(x, j)) - m)
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
                store(o, j, value)
                lo, hi = track(lo, hi, value)
        elif exponent == 0:
            for j in range(g.shape[0]):
                value = _value(g, x, j, m, mean_dy, k, sc, 0, False)
                store(o, j, value)
                lo, hi = track(lo, hi, value)
        else:
            for j in range(g.shape[0]):
                value = _value(g, x, j, m, mean_dy, k, sc, exponent, training)
                store(o, j, value)
                lo, hi = track(lo, hi, value)
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
                gv = np.float64(load(g, w))
                a0[w] += gv
                a1[w] += gv * (np.float64(load(x, w)) - mean_col[w])
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
                    store(o, j, value)
                    lo, hi = track(lo, hi, value)
            elif scaled:
                for j in range(k1 - k0):
                    value = _value(g, x, j, m[j], mdy[j], kk[j], sc[j], e[j], training)
                    store(o, j, value)
                    lo, hi = track(lo, hi, value)
            else:
                for j in range(k1 - k0):
                    value = _value(g, x, j, m[j], mdy[j], kk[j], sc[j], 0, False)
                    store(o, j, value)
                    lo, hi = track(lo, hi, value)
        keys[task, 0] = lo
        keys[task, 1] = hi
