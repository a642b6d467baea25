"""The error model: how far a correct kernel's output may be from the exact one, per element.

A kernel computes in its own precision and order, so "how far from bnbwd" only means something
in units of what a *correct* kernel of that precision could be off by on *this* problem.
With unit roundoff u (2**-24 for any kernel that touches float32, 2**-53 for an all-float64 one):

- A sum S = sum(x_k) over the M elements of a channel, accumulated in any realistic order
  (sequential, blocked, pairwise, tree, atomics in any order), is off by about u*sqrt(sum_k S_k**2)
  where S_k are its partial sums (each addition rounds relative to the partial sum it makes). The
  worst of those orders adds one element at a time, in storage order or in an arbitrary one
  (atomics), so we take the larger of the storage order's root-sum-square and the one a random
  order has on average, M*(S**2/3 + ||x||_2**2/6):
        s_sum = u * sqrt(max(sum_k S_k**2, M*(S**2/3 + ||x||_2**2/6)))
  (a sequential float32 sum's error then has an RMS of ~0.4 units: 0.37-0.45 measured).
  That assumes the roundings are independent. When the terms are all about the same (diff_dst
  = 1000 + N(0, 1), say) and M*|mean|/sd approaches 1/u, every addition to a large partial sum
  rounds the same way and the error grows like u*M*|S| instead. No closed form tracks that well,
  so for float32 accumulation the model also runs the worst realistic order itself: a sequential
  float32 sum in storage order, one accumulator per channel (what PyTorch's channels_last CPU
  kernel does), and takes s_sum = max(the above, 2.5*|its error|): that error is one draw, another
  order's can be a few of them.
- diff_beta = sum dy:        s_beta  = s_sum(dy)
- diff_gamma = sum dy*xhat:  s_gamma = s_sum(dy*xhat) + u*(2*||dy*xhat||_2 + |mean|*invstd*|diff_beta| + |diff_gamma|)
  (the terms' own roundings, then: a kernel may use a mean or variance one rounding away from the ones passed).
- diff_src = k*(dy - diff_beta/M - xhat*diff_gamma/M), k = |gamma|*invstd, inherits the sums'
  errors divided by M and rounds its own terms:
        s_src = k*(u*|dy| + (u*|diff_beta| + s_beta + u*|mean|*invstd*|diff_gamma|)/M
                   + |xhat|*(u*|diff_gamma| + s_gamma)/M) + u*|diff_src|
  (inference: s_src = k*u*|dy| + u*|diff_src|).

An element passes when |a - r| <= K*s + ulp_D(r) (judge/tolerance.py: K = 16 for diff_src, 4 for the
sums, whose scale tracks their error more closely); docs/tolerances.md has the derivation and the
calibration of K (tools/calibrate_sums.py for the sums). Everything here is float64 and works in blocks of at most
CHUNK elements, so memory stays bounded whatever the tensor size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli import runtime
from bnbwd_cli.dtypes import dtype_name, to_float64
from bnbwd_cli.layout import per_channel, view3
from bnbwd_cli.scratch import Scratch

if TYPE_CHECKING:
    from bnbwd_cli.core import Op

U32, U64 = 2.0**-24, 2.0**-53
FLOAT32 = np.dtype(np.float32)
CHUNK = 1 << 20  # elements per block: float64 temporaries stay ~8 MB each
# The realised sequential error is one draw, and where correlated roundings dominate another order's error can
# be several of them (PyTorch's bf16 diff_gamma used up to 4.6 with diff_dst = 100 + N(0, 1)). With K = 5 for
# the sums this keeps 12.5 of them allowed (K = 16 allowed 16); on independent roundings it rarely decides
# (a sequential error above 2 standard deviations: ~5% of channels; docs/tolerances.md, calibrate_sums.py).
REALISED_FLOOR = 2.5


def unit_roundoff(inputs: Op, output_dtype: str) -> float:
    """The accumulation's unit roundoff for an output of this dtype, given the op's inputs (core.Op, exactly as
    the kernel under test received them)."""
    names = {dtype_name(a.dtype) for a in (inputs.src, inputs.mean, inputs.variance)}
    return U64 if names == {"f64"} and output_dtype == "f64" else U32


@dataclass(frozen=True)
class ChannelFacts:
    """Per-channel (C,) float64 facts of the problem, from one pass over src and diff_dst."""

    count: int  # M, elements per channel
    mean: np.ndarray
    invstd: np.ndarray
    scale: np.ndarray  # gamma * invstd
    diff_beta: np.ndarray  # sum dy
    diff_gamma: np.ndarray  # sum dy*xhat
    partial_beta: np.ndarray  # sum_k S_k**2, S_k the prefix sums of dy in storage order
    partial_gamma: np.ndarray  # the same for dy*xhat
    norm_beta: np.ndarray  # ||dy||_2
    norm_gamma: np.ndarray  # ||dy*xhat||_2
    sequential_beta: np.ndarray  # |error| of a sequential float32 sum of dy
    sequential_gamma: np.ndarray  # the same for diff_gamma, the larger of two forms of its terms

    def sum_scales(self, unit: float) -> tuple[np.ndarray, np.ndarray]:
        """(s_beta, s_gamma): the error scale of diff_beta and diff_gamma, (C,) each."""
        s_beta = sum_scale(unit * running_sum_scale(self.partial_beta, self.diff_beta, self.norm_beta, self.count),
                           self.sequential_beta, unit)
        extra = unit * (2 * self.norm_gamma + np.abs(self.mean) * self.invstd * np.abs(self.diff_beta) + np.abs(self.diff_gamma))
        s_gamma = sum_scale(unit * running_sum_scale(self.partial_gamma, self.diff_gamma, self.norm_gamma, self.count) + extra,
                            self.sequential_gamma, unit)
        return s_beta, s_gamma

    def systematic(self, unit: float) -> tuple[np.ndarray, np.ndarray]:
        """The correlated part of (s_beta, s_gamma): errors that every channel may share."""
        if unit < U32:
            zero = np.zeros_like(self.sequential_beta)
            return zero, zero
        return self.sequential_beta, self.sequential_gamma


def running_sum_scale(partial_squares: np.ndarray, total: np.ndarray, norm: np.ndarray, count: int) -> np.ndarray:
    """sqrt of the larger of sum_k S_k**2 (storage order) and its mean over random orders, M*(S**2/3 + ||x||**2/6):
    what a running sum's error is proportional to (module docstring), per channel."""
    shuffled = count * (total * total / 3 + norm * norm / 6)
    return np.sqrt(np.maximum(partial_squares, shuffled))


def sum_scale(estimate: np.ndarray, sequential_error: np.ndarray, unit: float) -> np.ndarray:
    """The independent-rounding estimate, raised to REALISED_FLOOR times a sequential float32 sum's realised
    |error| under float32 accumulation (correlated roundings, module docstring)."""
    return np.maximum(estimate, REALISED_FLOOR * sequential_error) if unit >= U32 else estimate


def terms_sum_scale(terms: np.ndarray, unit: float = U32) -> np.ndarray:
    """s_sum of the per-row sums of a (C, M) array of float32-representable terms in storage order: the scale
    ChannelFacts gives diff_beta when these are diff_dst's channels (for calibrating on synthetic sums)."""
    channels, count = terms.shape
    partial, sequential = _PartialSums(channels), _Sequential32(channels)
    whole = slice(0, channels)
    for start in range(0, count, CHUNK):
        block = np.asarray(terms[None, :, start:start + CHUNK], dtype=np.float64)
        partial.add(block, whole)
        sequential.add(block, whole)
    norm = np.sqrt(partial.squares)
    estimate = unit * running_sum_scale(partial.partial_squares, partial.total, norm, count)
    return sum_scale(estimate, np.abs(sequential.total - partial.total), unit)


def blocks(shape3: tuple[int, int, int], chunk: int = CHUNK) -> Iterator[tuple[slice, slice, slice]]:
    """Slices of an (N, C, S) view, in storage order, each a contiguous flat range of <= chunk elements
    (a single element's run when S alone exceeds chunk)."""
    n, c, s = shape3
    if n * c * s == 0:
        return
    if c * s <= chunk:
        rows = max(1, chunk // (c * s))
        for n0 in range(0, n, rows):
            yield slice(n0, min(n0 + rows, n)), slice(0, c), slice(0, s)
    elif s <= chunk:
        per = max(1, chunk // s)
        for n0 in range(n):
            for c0 in range(0, c, per):
                yield slice(n0, n0 + 1), slice(c0, min(c0 + per, c)), slice(0, s)
    else:
        for n0 in range(n):
            for c0 in range(c):
                for s0 in range(0, s, chunk):
                    yield slice(n0, n0 + 1), slice(c0, c0 + 1), slice(s0, min(s0 + chunk, s))


def flat_offset(shape3: tuple[int, int, int], where: tuple[slice, slice, slice]) -> int:
    """Flat index of a block's first element."""
    _, c, s = shape3
    return (where[0].start * c + where[1].start) * s + where[2].start


def channel_constants(inputs: Op) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, invstd, gamma*invstd) as float64 (C,) arrays."""
    mean, variance = to_float64(inputs.mean), to_float64(inputs.variance)
    if inputs.variance_is_invstd:
        invstd = variance
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            invstd = 1.0 / np.sqrt(variance + inputs.epsilon)
    gamma = np.ones_like(mean) if inputs.gamma is None else to_float64(inputs.gamma)
    return mean, invstd, gamma * invstd


def xhat_block(src: np.ndarray, channels: slice, mean: np.ndarray, invstd: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
    """(src - mean) * invstd of one float64 block of src whose channels are `channels` (into ``out``, which may be src)."""
    out = per_channel(np.subtract, src, mean[channels], out=out)
    return per_channel(np.multiply, out, invstd[channels], out=out)


ROWS_BYTES = 1 << 18  # rows of a (rows, c) cumsum handled at a time: they stay in the CPU's cache


def cumsum_rows(plane: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.cumsum(plane, axis=0) of a 2-D float64 array, the same bits, band of rows by band: numpy runs a
    large array's axis-0 cumsum column by column across all its rows (out of cache). Each band
    starts from the last prefix sum folded into its first row, so every column still adds row after row.
    ``out``: a float64 array of plane's shape for the result (not plane itself)."""
    rows, columns = plane.shape
    out = np.empty((rows, columns)) if out is None else out
    band = max(1, ROWS_BYTES // (8 * max(columns, 1)))
    for start in range(0, rows, band):
        part = out[start:start + band]
        if start:
            part[...] = plane[start:start + band]
            part[0] += out[start - 1]
            np.cumsum(part, axis=0, out=part)
        else:
            np.cumsum(plane[:band], axis=0, out=part)
    return out


class _PartialSums:
    """Running sum, sum of squared prefix sums and sum of squares per channel, over blocks in storage order."""

    def __init__(self, channels: int, scratch: Scratch | None = None) -> None:
        self.total = np.zeros(channels)
        self.partial_squares = np.zeros(channels)
        self.squares = np.zeros(channels)
        self.scratch = Scratch() if scratch is None else scratch  # the prefix sums' buffers

    def add(self, values: np.ndarray, channels: slice) -> None:
        """values: (n, c, s) float64 block of channels `channels`, rows in storage order."""
        # NXC rows hold one element: the prefix sums are the running total, no cumsum along a length-1 axis
        # (numpy's per-row loops over those are slow on a large tensor).
        single = values.shape[2] == 1
        within = values if single else np.cumsum(values, axis=2, out=self.scratch.get("within", values.shape))
        plane = within[:, :, -1] if single else within[:, :, -1].copy()  # (within is overwritten below)
        before = cumsum_rows(plane, self.scratch.get("before", plane.shape))  # then the prefix sum before each row, in place (NXC: full-size)
        before = np.subtract(np.add(self.total[channels], before, out=before), plane, out=before)
        if single:
            prefix = np.add(before, plane, out=before)
            self.partial_squares[channels] += np.einsum("nc,nc->c", prefix, prefix)
        else:
            within += before[:, :, None]
            self.partial_squares[channels] += np.einsum("ncs,ncs->c", within, within)
        self.total[channels] += plane.sum(axis=0)
        self.squares[channels] += np.einsum("ncs,ncs->c", values, values)


class _Sequential32:
    """One float32 accumulator per channel, element by element in storage order, over blocks."""

    def __init__(self, channels: int, scratch: Scratch | None = None) -> None:
        self.total = np.zeros(channels, np.float32)
        self.scratch = Scratch() if scratch is None else scratch

    def add(self, terms: np.ndarray, channels: slice) -> None:
        """terms: (n, c, s) block, rounded to float32 here, one row per element in storage order after a row
        holding the carried total. Reducing axis 0 of that C-ordered (rows, c) array adds row after row, in
        float32: a kernel's sequential sums, where np.sum along a channel's own run would be pairwise (and a
        cumsum along it slower; tests/test_judge_passes.py holds numpy to this order)."""
        n, c, s = terms.shape
        rows = self.scratch.get("rows", (n * s + 1, c), np.dtype(np.float32))
        rows[0] = self.total[channels]
        rows[1:].reshape(n, s, c)[...] = terms.transpose(0, 2, 1)
        if c == 1:  # a (rows, 1) array is contiguous along axis 0: numpy would sum it pairwise; cumsum is sequential
            self.total[channels] = np.cumsum(rows[:, 0], dtype=np.float32)[-1]
        else:
            self.total[channels] = np.add.reduce(rows, axis=0, dtype=np.float32)


def channel_facts(inputs: Op, advance: Callable[[int], None] | None = None) -> ChannelFacts:
    """One blocked float64 pass over src and diff_dst: the sums and their error-scale ingredients.
    ``advance``: told each block's element count once it is done (a progress bar)."""
    dy3 = view3(inputs.diff_dst, inputs.data_format)
    channels = dy3.shape[1]
    mean, invstd, scale = channel_constants(inputs)
    if runtime.numba_judging(dy3.size):  # compiled: the same sums (judge/numba_facts.py)
        from bnbwd_cli.judge import numba_facts

        compiled = numba_facts.facts_sums(inputs, list(blocks(dy3.shape)), (mean, invstd), advance)
        if compiled is not None:
            sums, sequential = compiled
            return _facts(dy3.shape, (mean, invstd, scale), sums, sequential)
    # One set of block buffers for the whole pass (the accumulators use theirs one after another): fresh
    # temporaries would cost page faults on every block.
    scratch = Scratch()
    beta, gamma = _PartialSums(channels, scratch), _PartialSums(channels, scratch)
    # The sequential float32 sums: of dy, of dy*xhat, and of dy*(x - mean) as PyTorch's CPU kernel
    # forms it (float32 difference and product; times invstd at the end). Two forms of diff_gamma's
    # terms because correlated roundings depend on the exact terms: two realisations, not one.
    seq_beta, seq_gamma, seq_centred = (_Sequential32(channels, scratch) for _ in range(3))
    mean32 = mean.astype(np.float32)[:, None]
    src3 = view3(inputs.src, inputs.data_format)
    single = src3.dtype == dy3.dtype == FLOAT32
    with np.errstate(invalid="ignore", over="ignore"):
        for where in blocks(dy3.shape):
            shape = dy3[where].shape
            dy = to_float64(dy3[where], scratch.get("dy", shape))
            # (float64 src: the input itself, read only; float32: only xhat reads it, upcast by the ufunc)
            src = src3[where] if single else to_float64(src3[where], scratch.get("src", shape))
            # src.astype(float32), minus mean, times dy.astype(float32): float32 inputs are those values already
            centred = scratch.get("centred", shape, FLOAT32)
            if single:
                x32, dy32 = src3[where], dy3[where]
            else:
                x32, dy32 = centred, scratch.get("dy32", shape, FLOAT32)
                np.copyto(x32, src)
                np.copyto(dy32, dy)
            np.multiply(np.subtract(x32, mean32[where[1]], out=centred), dy32, out=centred)
            seq_centred.add(centred, where[1])
            terms = xhat_block(src, where[1], mean, invstd, out=scratch.get("terms", shape))
            terms = np.multiply(dy, terms, out=terms)
            beta.add(dy, where[1])
            gamma.add(terms, where[1])
            seq_beta.add(dy32, where[1])  # (rounded to float32 there: the same values)
            seq_gamma.add(terms, where[1])
            if advance is not None:
                advance(dy.size)
    sums = np.stack([beta.total, beta.partial_squares, beta.squares, gamma.total, gamma.partial_squares, gamma.squares])
    sequential = np.stack([seq_beta.total, seq_gamma.total, seq_centred.total])
    return _facts(dy3.shape, (mean, invstd, scale), sums, sequential)


def _facts(shape3: tuple[int, int, int], constants: tuple[np.ndarray, ...], sums: np.ndarray,
           sequential: np.ndarray) -> ChannelFacts:
    """The facts from the pass's sums: (6, C) float64, the total, the sum of squared prefix sums and the sum of
    squares of dy, then of dy*xhat; (3, C) float32, the sequential sums of dy, dy*xhat and dy*(x - mean)."""
    mean, invstd, scale = constants
    total_beta, partial_beta, squares_beta, total_gamma, partial_gamma, squares_gamma = sums
    with np.errstate(invalid="ignore", over="ignore"):
        centred_error = np.abs(sequential[2] * invstd - total_gamma)
    return ChannelFacts(
        count=shape3[0] * shape3[2], mean=mean, invstd=invstd, scale=scale,
        diff_beta=total_beta, diff_gamma=total_gamma,
        partial_beta=partial_beta, partial_gamma=partial_gamma,
        norm_beta=np.sqrt(squares_beta), norm_gamma=np.sqrt(squares_gamma),
        sequential_beta=np.abs(sequential[0] - total_beta),
        sequential_gamma=np.maximum(np.abs(sequential[1] - total_gamma), centred_error),
    )


@dataclass(frozen=True)
class DiffSrcScale:
    """s_src = base + per_xhat*|xhat| + per_dy*|dy| + unit*|diff_src|, with (C,) coefficients."""

    base: np.ndarray
    per_xhat: np.ndarray
    per_dy: np.ndarray
    unit: float

    def block(self, xhat: np.ndarray, dy: np.ndarray, reference: np.ndarray, channels: slice,
              out: tuple[np.ndarray, np.ndarray] | tuple[None, None] = (None, None)) -> np.ndarray:
        """s_src of one (n, c, s) block; ``out``: two float64 arrays of its shape for the result and a term."""
        coefficients = (self.base[channels], self.per_xhat[channels], self.per_dy[channels], self.unit)
        return _scale(coefficients, (xhat, dy, reference), out, per_channel)

    def at(self, channel: np.ndarray, xhat: np.ndarray, dy: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """s_src of scattered elements: flat arrays of each one's channel, xhat, dy and reference (the numbers
        block() gives them)."""
        coefficients = (self.base[channel], self.per_xhat[channel], self.per_dy[channel], self.unit)
        return _scale(coefficients, (xhat, dy, reference), (None, None), _elementwise)


    def floor_at(self, channel: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """A lower bound of at()'s s_src at scattered elements, from their channel and reference alone: base +
        unit*|reference|, each term as _scale forms it. _scale adds the same terms and two more >= 0 (of |xhat| and
        |dy|, coefficients >= 0), and a rounded sum never falls when a term >= 0 is added: at() >= this, even where
        it rounds."""
        return np.add(self.base[channel], np.multiply(self.unit, np.abs(reference)))


def _elementwise(ufunc: np.ufunc, values: np.ndarray, coefficients: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """ufunc(values, coefficients), one coefficient an element (layout.per_channel's signature)."""
    return ufunc(values, coefficients, out=out)


def _scale(coefficients: tuple, values: tuple, out: tuple, apply: Callable) -> np.ndarray:
    """base + per_xhat*|xhat| + per_dy*|dy| + unit*|reference|, the terms added left to right (one formula for
    blocks and scattered elements, so both give the same numbers; IEEE sums and products do not depend on the
    operands' order); ``out``: (result, term) buffers or None; ``apply``: how a coefficient meets its values
    (per_channel for a block's (C,) coefficients, elementwise for scattered elements' own)."""
    base, per_xhat, per_dy, unit = coefficients
    xhat, dy, reference = values
    scale, term = out
    scale = apply(np.add, apply(np.multiply, np.abs(xhat, out=term), per_xhat, term), base, scale)
    scale += apply(np.multiply, np.abs(dy, out=term), per_dy, term)
    scale += np.multiply(unit, np.abs(reference, out=term), out=term)
    return scale


def diff_src_scale(facts: ChannelFacts, unit: float, training: bool) -> DiffSrcScale:
    """The coefficients of diff_src's error scale (see the module docstring)."""
    k = np.abs(facts.scale)
    per_dy = k * unit
    if not training or facts.count == 0:
        zero = np.zeros_like(k)
        return DiffSrcScale(zero, zero, per_dy, unit)
    s_beta, s_gamma = facts.sum_scales(unit)
    m = facts.count
    mean_shift = unit * np.abs(facts.mean) * facts.invstd  # xhat moved by a one-rounding change of mean
    base = k * (unit * np.abs(facts.diff_beta) + s_beta + mean_shift * np.abs(facts.diff_gamma)) / m
    per_xhat = k * (unit * np.abs(facts.diff_gamma) + s_gamma) / m
    return DiffSrcScale(base, per_xhat, per_dy, unit)
