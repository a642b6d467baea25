"""diff_src's judging pass and its bias regression's sums, compiled (numba, optional): one fused loop over a
block's actual, reference, diff_dst and src gives what judge/diff_src.py's pass without details feeds the
Accumulator (Accumulator.add_scaled, piece by piece), the relative L2's block sums and the regression's block sums
(judge/bias.py BlockSums, as judge/numba_sums.py forms them), the same numbers.

Same bits, because every number is formed as NumPy forms it (no fastmath: LLVM neither reassociates nor contracts):
- the per-element work (d = a - r, the ULP spacing from r's float64 exponent bits, xhat, the error scale
  base + per_xhat*|xhat| + per_dy*|dy| + unit*|r| left to right, K*s + ulp, units, ULP errors) is elementwise;
- a piece's maxima keep their first position (np.argmax), its counts are counts; add_scaled forms the scale only
  past one ULP, where every unit and ULP error that is not 0 lies, so a maximum over the piece is theirs;
- the sums of squares are np.einsum's: the relative L2's of the flat block in buffer-sized parts (8192 elements),
  the regression's d*d and spacing*spacing per (n, c) row, each part NumPy's two-lane SSE dot (_Dot), the parts
  added from 0 in order;
- the regression's scattered sums add each element's products to its two bins in storage order (numba_sums.py).
A block whose a - r is not finite everywhere, or whose channels' scale is not sound, is not judged here (the
caller runs the NumPy pass on it: the kernel returns False having changed nothing the caller reads).
Imported only when the judging runs compiled (runtime.numba_judging).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import njit

from bnbwd_cli.core.numba_bits import _bits_to_f64, _f64_to_bits, load
from bnbwd_cli.core.numba_core import _bits_view, supports
from bnbwd_cli.dtypes import FLOAT_FORMAT, to_float64
from bnbwd_cli.judge import norms
from bnbwd_cli.judge.bias import CLUSTER_BITS, CLUSTERS, ChannelRegression
from bnbwd_cli.judge.model import blocks, flat_offset
from bnbwd_cli.judge.numba_facts import einsum_order_matches

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # bias.cluster_of's multiplier
_EXPONENT = np.int64(0x7FF << 52)
EINSUM_BUFFER = 8192  # NumPy's buffer size: a 1-D einsum's dot runs in parts of this many elements

# piece statistics: (P, 4) float64 and (P, 8) int64 columns
MAX_ABS, MAX_ULP, MAX_UNITS = 0, 1, 2
AT_ABS, AT_ULP, AT_UNITS, ZEROS_A, ZEROS_R, MISMATCHES, FLUSHED, OUTSIDE = range(8)


@njit(inline="always")
def _spacing(value, smallest, mantissa):  # pragma: no cover - compiled
    """dtypes.ulp_spacing of one finite float64 (a dtype coarser than float64): its exponent field, raised to the
    dtype's smallest normal one, less the mantissa bits, read back as a float64."""
    field = _f64_to_bits(value) & _EXPONENT
    return _bits_to_f64(max(field, smallest) - mantissa)


@njit(cache=True, nogil=True, inline="always")
def _dot(values, count):  # pragma: no cover - compiled
    """sum of values[q]**2 over q < count in np.einsum's order for one contiguous float64 run (its SSE dot loop:
    lanes of even and odd positions, 8 a step from the last pair down, the tail a pair at a time, then lane 0 +
    lane 1): numba_facts._row_dot without the shift."""
    even = 0.0
    odd = 0.0
    q = 0
    while count - q >= 8:
        for pair in (6, 4, 2, 0):
            a = values[q + pair]
            b = values[q + pair + 1]
            even = a * a + even
            odd = b * b + odd
        q += 8
    while q < count:
        a = values[q]
        even = a * a + even
        if q + 1 < count:
            b = values[q + 1]
            odd = b * b + odd
        q += 2
    return even + odd


@njit(cache=True, nogil=True, error_model="numpy")
def judge_block(values, first, coefficients, rule, pieces, out):  # pragma: no cover - compiled
    """One (n, c, s) block (channels first..): values = (actual, reference, diff_dst, src) as stored (16-bit floats
    as bits); coefficients (5, C): mean, invstd, base, per_xhat, per_dy; rule: K, unit, the judge's smallest normal
    (ftz; 0: none), the regression's, then the ULP grids' smallest exponent field and mantissa shift (judge,
    regression) as floats; pieces: the pieces' first flat positions in the block and the block's size.
    out: (stats (P, 3) float64, counts (P, 8) int64, norms (2,) float64 = the relative L2's einsum of d and r,
    table (c * CLUSTERS, 18), dd (c,), ulp_squares (c,), parts (2, EINSUM_BUFFER), rows (2, s)): False where
    a - r is not finite (the block's outputs then hold nothing the caller reads)."""
    rows_of_one = values[0].shape[2] == 1  # NXC: every run one element
    for piece in range(pieces.size - 1):
        where = (first, piece, pieces[piece], pieces[piece + 1])
        if not (_judge_rows(values, where, coefficients, rule, out) if rows_of_one else
                _judge_piece(values, where, coefficients, rule, out)):
            return False
    norms, parts, size = out[2], out[6], pieces[-1]
    if size % EINSUM_BUFFER:  # the last part of the relative L2's einsums
        norms[0] = norms[0] + _dot(parts[0], size % EINSUM_BUFFER)
        norms[1] = norms[1] + _dot(parts[1], size % EINSUM_BUFFER)
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _judge_piece(values, where, coefficients, rule, out):  # pragma: no cover - compiled
    """judge_block's piece ``piece``, its flat positions start..stop of the block (where: first, piece, start,
    stop): its statistics into stats[piece] and counts[piece], the rest into the block's sums."""
    a3, r3, dy3, src3 = values
    first, piece, start, stop = where
    stats, counts, norms, table, dd, ulp_squares, parts, rows = out
    _, c, s = a3.shape
    limits, flush = (rule[0], rule[1], rule[2]), rule[3]  # (K, unit, the judge's smallest normal); the regression's
    grids = (np.int64(rule[4]), np.int64(rule[5]), np.int64(rule[6]), np.int64(rule[7]))
    golden, shift, clusters = _GOLDEN, np.uint64(64 - CLUSTER_BITS), table.shape[0] // c
    top_abs = top_ulp = top_units = -1.0
    at_abs = at_ulp = at_units = zeros_a = zeros_r = mismatches = flushed = outside = 0
    i, j, q, p = start // (c * s), start // s % c, start % s, start
    while p < stop:  # run by run (the part of one in the piece): a run's channel constants once
        channel, end = first + j, min(s, q + stop - p)
        mean, invstd, scale_terms = coefficients[0, channel], coefficients[1, channel], (
            coefficients[2, channel], coefficients[3, channel], coefficients[4, channel])
        for at in range(q, end):
            a, r = np.float64(load(a3, (i, j, at))), np.float64(load(r3, (i, j, at)))
            d = a - r
            if not np.isfinite(d):
                return False
            error, spacing = abs(d), _spacing(r, grids[0], grids[1])
            ulps, position = error / spacing, p + at - q
            if error > top_abs:
                top_abs, at_abs = error, position
            if ulps > top_ulp:
                top_ulp, at_ulp = ulps, position
            zeros_a, zeros_r = zeros_a + (a == 0.0), zeros_r + (r == 0.0)
            g = np.float64(load(dy3, (i, j, at)))
            xhat = (np.float64(load(src3, (i, j, at))) - mean) * invstd
            past, fails, units, flush_zero = _rule((a, r, g, xhat), (error, spacing), scale_terms, limits)
            flushed, outside, mismatches = flushed + flush_zero, outside + past, mismatches + fails
            if past and units > top_units:
                top_units, at_units = units, position
            part = position & (EINSUM_BUFFER - 1)  # the relative L2's einsums, by part (a power of two)
            parts[0, part], parts[1, part] = d, r
            if part == EINSUM_BUFFER - 1:
                norms[0], norms[1] = norms[0] + _dot(parts[0], EINSUM_BUFFER), norms[1] + _dot(parts[1], EINSUM_BUFFER)
            # the regression (bias.BlockSums.add): an element left out (xhat not finite, a flushed zero) weighs 0
            if np.isfinite(xhat) and not (a == 0.0 and 0.0 < abs(r) < flush):
                w, x, rr, dd_value, rows[1, at] = 1.0, xhat, r, d, _spacing(a, grids[2], grids[3])
            else:
                w, x, rr, dd_value, rows[1, at] = 0.0, 0.0, 0.0, 0.0, 0.0
            rows[0, at] = dd_value
            by_dy = j * clusters + np.int64((np.uint64(_f64_to_bits(g)) * golden) >> shift)
            by_reference = j * clusters + np.int64((np.uint64(_f64_to_bits(r)) * golden) >> shift)
            _scatter(table, by_dy, by_reference, (w, x, rr, dd_value))
        p, q = p + end - q, end
        if q == s:  # the end of a run: its einsum dots of d and the spacing (of one element, NXC: its squares)
            if s == 1:
                dd[j], ulp_squares[j] = dd[j] + rows[0, 0] * rows[0, 0], ulp_squares[j] + rows[1, 0] * rows[1, 0]
            else:
                dd[j], ulp_squares[j] = dd[j] + _dot(rows[0], s), ulp_squares[j] + _dot(rows[1], s)
            q, j = 0, j + 1
            if j == c:
                j, i = 0, i + 1
    _end_piece(stats[piece], counts[piece], (top_abs, top_ulp, top_units), (at_abs, at_ulp, at_units),
               (zeros_a, zeros_r, mismatches, flushed, outside))
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _judge_rows(values, where, coefficients, rule, out):  # pragma: no cover - compiled
    """_judge_piece for a block whose runs are one element (NXC): element after element in storage order, each
    its channel's constants, its squares straight into dd and ulp_squares (a run's einsum dot); the same numbers
    as _judge_piece forms, without its per-run bookkeeping (here once an element)."""
    a3, r3, dy3, src3 = values
    first, piece, start, stop = where
    stats, counts, norms, table, dd, ulp_squares, parts, _ = out
    c = a3.shape[1]
    limits, flush = (rule[0], rule[1], rule[2]), rule[3]
    grids = (np.int64(rule[4]), np.int64(rule[5]), np.int64(rule[6]), np.int64(rule[7]))
    golden, shift, clusters = _GOLDEN, np.uint64(64 - CLUSTER_BITS), table.shape[0] // c
    top_abs = top_ulp = top_units = -1.0
    at_abs = at_ulp = at_units = zeros_a = zeros_r = mismatches = flushed = outside = 0
    i, j = start // c, start % c
    for p in range(start, stop):
        channel = first + j
        a, r = np.float64(load(a3, (i, j, 0))), np.float64(load(r3, (i, j, 0)))
        d = a - r
        if not np.isfinite(d):
            return False
        error, spacing = abs(d), _spacing(r, grids[0], grids[1])
        ulps = error / spacing
        if error > top_abs:
            top_abs, at_abs = error, p
        if ulps > top_ulp:
            top_ulp, at_ulp = ulps, p
        zeros_a, zeros_r = zeros_a + (a == 0.0), zeros_r + (r == 0.0)
        g = np.float64(load(dy3, (i, j, 0)))
        xhat = (np.float64(load(src3, (i, j, 0))) - coefficients[0, channel]) * coefficients[1, channel]
        scale_terms = (coefficients[2, channel], coefficients[3, channel], coefficients[4, channel])
        past, fails, units, flush_zero = _rule((a, r, g, xhat), (error, spacing), scale_terms, limits)
        flushed, outside, mismatches = flushed + flush_zero, outside + past, mismatches + fails
        if past and units > top_units:
            top_units, at_units = units, p
        part = p & (EINSUM_BUFFER - 1)
        parts[0, part], parts[1, part] = d, r
        if part == EINSUM_BUFFER - 1:
            norms[0], norms[1] = norms[0] + _dot(parts[0], EINSUM_BUFFER), norms[1] + _dot(parts[1], EINSUM_BUFFER)
        if np.isfinite(xhat) and not (a == 0.0 and 0.0 < abs(r) < flush):
            w, x, rr, dd_value, spacing_a = 1.0, xhat, r, d, _spacing(a, grids[2], grids[3])
        else:
            w, x, rr, dd_value, spacing_a = 0.0, 0.0, 0.0, 0.0, 0.0
        dd[j], ulp_squares[j] = dd[j] + dd_value * dd_value, ulp_squares[j] + spacing_a * spacing_a
        by_dy = j * clusters + np.int64((np.uint64(_f64_to_bits(g)) * golden) >> shift)
        by_reference = j * clusters + np.int64((np.uint64(_f64_to_bits(r)) * golden) >> shift)
        _scatter(table, by_dy, by_reference, (w, x, rr, dd_value))
        j += 1
        if j == c:
            j, i = 0, i + 1
    _end_piece(stats[piece], counts[piece], (top_abs, top_ulp, top_units), (at_abs, at_ulp, at_units),
               (zeros_a, zeros_r, mismatches, flushed, outside))
    return True


@njit(inline="always")
def _end_piece(stats, counts, tops, positions, tallies):  # pragma: no cover - compiled
    """A piece's statistics into its row of stats and counts."""
    stats[MAX_ABS], stats[MAX_ULP], stats[MAX_UNITS] = tops
    counts[AT_ABS], counts[AT_ULP], counts[AT_UNITS] = positions
    counts[ZEROS_A], counts[ZEROS_R], counts[MISMATCHES], counts[FLUSHED], counts[OUTSIDE] = tallies


@njit(inline="always")
def _rule(element, errors, coefficients, limits):  # pragma: no cover - compiled
    """rules.ScaledRule as add_scaled judges an element (a, r, diff_dst, xhat) whose |a - r| and ULP spacing are
    ``errors``: (past one ULP, fails, units, a flushed zero let pass). Only past one ULP counts (within it every
    unit is 0 and nothing fails); formed everywhere and kept there, since a branch on it mispredicts on noisy data.
    The scale adds its terms left to right (model._scale)."""
    a, r, g, xhat = element
    error, spacing = errors
    base, per_xhat, per_dy = coefficients
    max_units, unit, flush = limits
    scale = abs(xhat) * per_xhat + base
    scale = scale + abs(g) * per_dy
    scale = scale + unit * abs(r)
    past = error > spacing
    fails = past and error > max_units * scale + spacing
    units = max(error - spacing, 0.0)
    units = (np.inf if units > 0.0 else 0.0) if scale == 0.0 else units / scale  # (rules.safe_ratio)
    if fails and a == 0.0 and 0.0 < abs(r) < flush:  # rules.pass_flushed
        return past, False, 0.0, True
    return past, fails, units, False


@njit(inline="always")
def _scatter(table, by_dy, by_reference, basis):  # pragma: no cover - compiled
    """numba_sums.piece_sums for one element: its products into its bin by diff_dst (columns 0-8) and by the
    reference (9-17), in bias._PAIRS order then d, x*d, r*d."""
    w, x, r, d = basis
    xx, xr, rr = x * x, x * r, r * r
    table[by_dy, 0] += w
    table[by_dy, 1] += x
    table[by_dy, 2] += r
    table[by_dy, 3] += xx
    table[by_dy, 4] += xr
    table[by_dy, 5] += rr
    table[by_reference, 9] += w
    table[by_reference, 10] += x
    table[by_reference, 11] += r
    table[by_reference, 12] += xx
    table[by_reference, 13] += xr
    table[by_reference, 14] += rr
    # (where d is 0, d, x*d and r*d are ±0: added to sums that began at +0 they change no bit, as skipping them in
    # numba_sums does; no branch, which mispredicts on noisy data)
    xd, rd = x * d, r * d
    table[by_dy, 6] += d
    table[by_dy, 7] += xd
    table[by_dy, 8] += rd
    table[by_reference, 15] += d
    table[by_reference, 16] += xd
    table[by_reference, 17] += rd


def judge(judged, regression: ChannelRegression, sizes: tuple[int, int], advance: Callable[[int], None] | None) -> bool:
    """diff_src's judging pass (``judged``: judge/diff_src.py's _Pass, without details) and ``regression``'s sums,
    block by block of ``sizes`` (block, piece) elements; a block the kernel leaves (a - r not finite somewhere, or a
    scale not sound) is judged by ``judged.block`` (NumPy, the regression's sums too). False where it does not apply
    (applies), and as soon as the output fails (more mismatches than allowed): a failing output's report reads its
    details, which the NumPy pass gathers from where it sees the failure (the caller starts it afresh)."""
    if not applies(judged, regression, sizes[0]):
        return False
    state, facts, model = judged.state, judged.case.facts, judged.model
    a3 = judged.views[0]
    coefficients = np.stack([facts.mean, facts.invstd, model.base, model.per_xhat, model.per_dy])
    rule = np.array([state.rule.scaled.max_units, model.unit, state.smallest_normal, regression.flushed_below,
                     *_grid(state.dtype), *_grid(regression.dtype)])
    parts = np.empty((2, EINSUM_BUFFER))
    for where in blocks(a3.shape, sizes[0]):
        shape = a3[where].shape
        if judged.scale_sound[where[1]].all():
            values = tuple(_bits_view(np.ascontiguousarray(view[where])) for view in judged.views)
            pieces = np.array([flat_offset(shape, piece) for piece in blocks(shape, sizes[1])] + [a3[where].size])
            out = (np.empty((pieces.size - 1, 3)), np.empty((pieces.size - 1, 8), np.int64), np.zeros(2),
                   np.zeros((shape[1] * CLUSTERS, 18)), np.zeros(shape[1]), np.zeros(shape[1]), parts,
                   np.empty((2, shape[2])))
            if judge_block(values, where[1].start, coefficients, rule, pieces, out):
                _commit(judged, regression, (where, pieces), out)
                if advance is not None:
                    advance(a3[where].size)
                if state.mismatches > state.allowed:
                    return False
                continue
        judged.block(where, regression)
        if advance is not None:
            advance(a3[where].size)
        if state.mismatches > state.allowed:  # failing: the NumPy pass, which gathers the details as it fails
            return False
    return True


def applies(judged, regression: ChannelRegression, block: int) -> bool:
    """Whether the kernel can give the NumPy pass's numbers: no details (they read every element's ratio), no
    mismatch allowed (one largest unit kept), a dtype coarser than float64 for both ULP grids, compiled loads for
    the four arrays' dtypes, and every block two channels or more (einsum's order differs with one)."""
    state = judged.state
    if state.details is not None or state.need[0].k != 1 or regression.unmoved:
        return False
    if any(FLOAT_FORMAT[dtype][1] - FLOAT_FORMAT[dtype][0] < -1022 for dtype in (state.dtype, regression.dtype)):
        return False
    a3 = judged.views[0]
    if a3.size == 0 or not all(supports(view.dtype) for view in judged.views) or not einsum_order_matches():
        return False
    return all(where[1].stop - where[1].start >= 2 for where in blocks(a3.shape, block))


def _grid(dtype: str) -> tuple[float, float]:
    """dtypes.ulp_spacing's constants for a dtype coarser than float64: its smallest exponent field and its
    mantissa bits, both where they lie in a float64 (exact as floats)."""
    mantissa, emin = FLOAT_FORMAT[dtype]
    return float((emin + 1023) << 52), float(mantissa << 52)


def _commit(judged, regression: ChannelRegression, geometry: tuple, out: tuple) -> None:
    """A judged block into the accumulator (each piece as Accumulator.add_scaled offers it), the relative L2's sums
    (norms.SumOfSquares.add given its einsum) and the regression's block sums (ChannelRegression.finish)."""
    state = judged.state
    where, pieces = geometry
    stats, counts, squares, table, dd, ulp_squares = out[:6]
    offset = flat_offset(judged.views[0].shape, where)
    for k in range(pieces.size - 1):
        first = offset + int(pieces[k])
        state.max_abs.offer(stats[k, MAX_ABS], offset + int(counts[k, AT_ABS]))
        state.zeros.add(int(counts[k, ZEROS_A]), int(counts[k, ZEROS_R]), int(pieces[k + 1] - pieces[k]))
        state.max_ulp.offer(stats[k, MAX_ULP], offset + int(counts[k, AT_ULP]))
        if not counts[k, OUTSIDE]:  # within one ULP everywhere: every unit is 0, the piece's first holds it
            state.max_units.offer(0.0, first)
            continue
        state.mismatches += int(counts[k, MISMATCHES])
        state.flushed += int(counts[k, FLUSHED])
        state.need[0].update(stats[k, MAX_UNITS:MAX_UNITS + 1])
        if stats[k, MAX_UNITS] > 0:
            state.max_units.offer(stats[k, MAX_UNITS], offset + int(counts[k, AT_UNITS]))
        else:
            state.max_units.offer(0.0, first)
    a3, r3 = judged.views[:2]
    reference = lambda: to_float64(r3[where]).reshape(-1)
    if squares[0] != 0 or stats[:, MAX_ABS].max() > 0:  # (a block equal to its reference adds nothing)
        _add_squares(state.l2.diff, squares[0], lambda: to_float64(a3[where]).reshape(-1) - reference())
    _add_squares(state.l2.ref, squares[1], reference)
    sums = table.reshape(-1, 2, 9).transpose(1, 2, 0)  # as BlockSums.sums reads a compiled table
    channels = where[1]
    regression.cross[:, channels] += sums.transpose(0, 2, 1).reshape(2, channels.stop - channels.start, CLUSTERS, 9)
    regression.dd[channels] += dd
    regression.ulp_squares[channels] += ulp_squares


def _add_squares(squares: norms.SumOfSquares, plain: float, values: Callable[[], np.ndarray]) -> None:
    """SumOfSquares.add of values whose einsum is ``plain``: that sum as it is, or where it overflowed or lost
    digits to underflow the values themselves (formed again), scaled as add scales them."""
    if math.isfinite(plain) and plain >= norms._UNDERFLOWING_SQUARES:
        squares._add(plain, 0)
    else:
        squares.add(values())
