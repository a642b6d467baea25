"""diff_src judged by the error model: the judging pass over its blocks, in cache-sized pieces, and the bias
regression's sums (judge/bias.py), on a second thread beside the channel facts and the judging pass, or, with one
thread, inside the judging pass on the pieces it has upcast. The same numbers either way."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli import layout, runtime
from bnbwd_cli.dtypes import SMALLEST_NORMAL, is_bfloat16, to_float64
from bnbwd_cli.judge.bias import BlockSums, ChannelRegression, PieceValues, pooled_bias
from bnbwd_cli.judge.compare import CHUNK as STATS_CHUNK, Accumulator
from bnbwd_cli.judge.comparison import Comparison, Once
from bnbwd_cli.judge.job import Job
from bnbwd_cli.judge.model import (
    CHUNK, ChannelFacts, DiffSrcScale, blocks, channel_constants, diff_src_scale, flat_offset, xhat_block,
)
from bnbwd_cli.scratch import Scratch

if TYPE_CHECKING:
    from bnbwd_cli.op import Op

# diff_src elements per block. Not smaller, though blocks that stay in cache would be faster: the bias fit's
# sums (its sse = dd - coef.rhs cancels) depend on the blocking, and on badly wrong outputs its reported scale
# and z move with it (tools/calibrate_tolerances.py, bug rows); one block size keeps the reports' numbers fixed.
BLOCK = CHUNK
# Elements judged at a time within a block: big enough that the calls per piece cost little while the regression's
# thread runs beside (the sizes measured: bench/RESULTS.md). Pieces change no number (no statistic depends on the cut).
PIECE = 2 * STATS_CHUNK


@dataclass(frozen=True)
class _DiffSrc:
    """diff_src's pair and what its error scale is built from (advance: the judging pass's progress)."""

    a: np.ndarray
    r: np.ndarray
    job: Job
    inputs: Op
    facts: ChannelFacts
    advance: Callable[[int], None] | None = None


def _diff_src_pass(case: _DiffSrc, detailed: bool, regression: ChannelRegression | None = None) -> Accumulator:
    """One blocked pass over diff_src: the verdict's statistics, and the details when ``detailed`` (in the judging
    pass when asked for up front, else a second pass on first use) or once the output is seen to fail (_Pass.block:
    its report reads them, so a failing output pays one pass); with ``regression``, its sums too, from the same
    upcast pieces (one thread: _regression_pass's sums without a pass of their own)."""
    judged = _Pass.start(case, detailed)
    a3 = judged.views[0]
    with np.errstate(invalid="ignore", over="ignore"):
        for where in blocks(a3.shape, BLOCK):
            judged.block(where, regression)
            if case.advance is not None:
                case.advance(a3[where].size)
    return judged.state


class _Pass:
    """The judging pass over diff_src, block by block; each block in cache-sized pieces (each a contiguous flat
    range) that are upcast and judged while they are in the CPU's cache. The relative L2's sums stay by block
    (its float sums depend on the blocking; every other statistic does not)."""

    def __init__(self, case: _DiffSrc, state: Accumulator, model: DiffSrcScale, scratch: Scratch) -> None:
        self.case, self.state, self.model, self.scratch = case, state, model, scratch
        self.views = _views(case.a, case.r, case.inputs)
        facts = case.facts
        # Channels whose xhat is finite everywhere (a non-finite one would make its ||dy*xhat|| so) and whose scale
        # is then >= 0 and never NaN: there an element within one ULP passes whatever its scale (Accumulator.add_scaled).
        xhat_finite = np.isfinite(facts.norm_gamma)
        coefficients = (model.base, model.per_xhat, model.per_dy, facts.norm_beta)
        self.scale_sound = xhat_finite & np.logical_and.reduce([np.isfinite(v) for v in coefficients])
        self.scale_sound &= state.rule.scaled.max_units >= 0

    @classmethod
    def start(cls, case: _DiffSrc, detailed: bool) -> _Pass:
        """A pass with a fresh accumulator (details from the start when ``detailed``) and diff_src's error scale."""
        state = case.job.accumulator(case.a, case.r, case.inputs, "diff_src", detailed)
        return cls(case, state, diff_src_scale(case.facts, state.rule.scaled.unit, case.inputs.training), Scratch())

    def block(self, where: tuple[slice, slice, slice], regression: ChannelRegression | None = None) -> None:
        a3 = self.views[0]
        shape = a3[where].shape
        r_block, d_block = self._block_buffers(where)
        sums = regression.start(shape) if regression is not None else None
        offset = flat_offset(a3.shape, where)
        finite = True
        for piece in blocks(shape, PIECE):
            finite &= self._piece(where, piece, (r_block, d_block, sums), offset + flat_offset(shape, piece))
            if self.state.details is None and self.state.mismatches > self.state.allowed:
                # The output fails whatever follows, and a failing output's report reads its details: gather them
                # from here on, after those of the pieces judged so far (a second pass over those alone).
                self.state.continue_details(self._detailed_through((where, piece)))
        if finite:  # d is a - r everywhere, and a and r are finite
            self.state.l2.update(d_block.reshape(-1), r_block.reshape(-1))
        else:
            self.state.add_norms(to_float64(a3[where]).reshape(-1), r_block.reshape(-1))
        if sums is not None:
            regression.finish(sums, where[1])

    def _block_buffers(self, where: tuple[slice, slice, slice]) -> tuple[np.ndarray, np.ndarray]:
        """r and d = a - r of the whole block (the relative L2's sums are by block): a float64 reference is read
        where it is, else upcast into a buffer."""
        r3 = self.views[1]
        shape = r3[where].shape
        return r3[where] if r3.dtype == np.float64 else self.scratch.get("r", shape), self.scratch.get("difference", shape)

    def _detailed_through(self, last: tuple[tuple[slice, ...], tuple[slice, ...]]) -> Accumulator:
        """A detailed judgement of the pieces from the first up to ``last`` (its block and piece) included: the
        same pieces, scales and order as a detailed pass from the start, on buffers of its own (this pass's hold
        its current block)."""
        case = self.case
        state = case.job.accumulator(case.a, case.r, case.inputs, "diff_src", detailed=True)
        catching_up = _Pass(case, state, self.model, Scratch())
        a3 = self.views[0]
        for where in blocks(a3.shape, BLOCK):
            shape = a3[where].shape
            r_block, d_block = catching_up._block_buffers(where)
            offset = flat_offset(a3.shape, where)
            for piece in blocks(shape, PIECE):
                catching_up._piece(where, piece, (r_block, d_block, None), offset + flat_offset(shape, piece))
                if (where, piece) == last:
                    return state
        raise ValueError("the piece to catch up to is not one of this pass's")

    def _piece(self, where: tuple[slice, slice, slice], piece: tuple[slice, slice, slice], block: tuple,
               offset: int) -> bool:
        """Judge one piece (and regress it, with a block's regression sums); whether its a - r is finite everywhere."""
        r_block, d_block, sums = block
        facts = self.case.facts
        constants = (facts.mean, facts.invstd)
        # Without the regression's sums, diff_dst and xhat are formed only where the scale is wanted: nowhere when
        # the piece is within one ULP of the reference, at the elements past it when they are few.
        values = _upcast_piece(self.views, where, piece, constants if sums is not None else None, self.scratch, r_block)
        a, r, d = values.actual, values.reference, d_block[piece]
        np.subtract(a, r, out=d)
        finite = bool(np.isfinite(d).all())
        shape, channels, model = a.shape, values.channels, self.model

        def scale_at(positions: np.ndarray | None) -> np.ndarray:
            if positions is None:
                dy, xhat = (values.diff_dst, values.xhat) if values.xhat is not None else _dy_xhat(
                    self.views, where, piece, constants, self.scratch)
                out = tuple(self.scratch.take(("scale", "term"), shape))
                return model.block(xhat, dy, r, channels, out=out).reshape(-1)
            channel = channels_at(positions, shape, channels.start)
            if values.xhat is not None:
                dy, xhat = (v.reshape(-1)[positions] for v in (values.diff_dst, values.xhat))
            else:
                dy, xhat = _dy_xhat_at(self.views, where, piece, constants, positions, channel)
            return model.at(channel, xhat, dy, r.reshape(-1)[positions])

        def floor_at(positions: np.ndarray) -> np.ndarray:
            return model.floor_at(channels_at(positions, shape, channels.start), r.reshape(-1)[positions])

        flat = (a.reshape(-1), r.reshape(-1))
        if finite and self.scale_sound[channels].all():
            self.state.add_scaled(*flat, d.reshape(-1), offset, scale_at, floor_at)
        else:
            self.state.add(*flat, offset, scale_at(None), norms=False)
        if sums is not None:
            _regress_piece(sums, piece, values)
        return finite


def _compiled_pass(case: _DiffSrc, dtype: str, flushed_below: float) -> tuple[Accumulator, ChannelRegression] | None:
    """The judging pass without details and the regression's sums, compiled (judge/numba_pass.py); None if not."""
    from bnbwd_cli.judge import numba_pass

    judged = _Pass.start(case, detailed=False)
    regression = ChannelRegression(judged.views[0].shape[1], dtype, elements=case.a.size, flushed_below=flushed_below)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if numba_pass.judge(judged, regression, (BLOCK, PIECE), case.advance):
            return judged.state, regression
    return None


# A piece's channels are found run by run (a search per run, not an integer division per element) when a channel's
# run is at least this long (NCX): a division costs ~5 ns an element, a repeat ~1.
CHANNEL_RUN = 16


def channels_at(positions: np.ndarray, shape: tuple[int, int, int], first: int) -> np.ndarray:
    """The channel of each flat position of an (n, c, s) piece whose first channel is ``first``; ``positions``
    ascending (np.flatnonzero's)."""
    n, c, s = shape
    if s < CHANNEL_RUN:
        return first + positions // s % c
    ends = np.searchsorted(positions, np.arange(1, n * c) * s)  # where each run but the last ends
    counts = np.diff(ends, prepend=0, append=positions.size)
    return np.repeat(first + np.arange(n * c) % c, counts)


def _views(a: np.ndarray, r: np.ndarray, inputs: Op) -> tuple[np.ndarray, ...]:
    """diff_src's actual and reference, diff_dst and src as (N, C, S) views."""
    return tuple(layout.view3(x, inputs.data_format) for x in (a, r, inputs.diff_dst, inputs.src))


@dataclass(frozen=True)
class _Upcast(PieceValues):
    channels: slice  # the piece's channels in the whole tensor


def _upcast_piece(views: tuple, where: tuple[slice, slice, slice], piece: tuple[slice, slice, slice],
                  constants: tuple[np.ndarray, np.ndarray] | None, scratch: Scratch,
                  r_block: np.ndarray | None = None) -> _Upcast:
    """One piece of a block as float64: actual, reference (into ``r_block``'s piece when given; a float64 reference
    is the input itself), diff_dst and xhat; ``constants``: the channels' mean and invstd (None: no diff_dst and
    xhat, which _dy_xhat forms on demand)."""
    a_view, r_view = (view[where][piece] for view in views[:2])
    shape = a_view.shape
    a = to_float64(a_view, scratch.get("a", shape))
    r_out = scratch.get("r_piece", shape) if r_block is None else r_block[piece]
    r = r_view if r_view.dtype == np.float64 else to_float64(r_view, r_out)
    channels = slice(where[1].start + piece[1].start, where[1].start + piece[1].stop)
    dy, xhat = _dy_xhat(views, where, piece, constants, scratch) if constants is not None else (None, None)
    return _Upcast(xhat, r, a, dy, channels)


def _dy_xhat(views: tuple, where: tuple[slice, slice, slice], piece: tuple[slice, slice, slice],
             constants: tuple[np.ndarray, np.ndarray], scratch: Scratch) -> tuple[np.ndarray, np.ndarray]:
    """diff_dst and xhat of one piece of a block, float64."""
    dy_view, src_view = (view[where][piece] for view in views[2:])
    shape = dy_view.shape
    dy = to_float64(dy_view, scratch.get("dy", shape))
    # xhat straight from src (a ufunc upcasts float32 and float16 exactly on the way), bfloat16 through float32
    src = to_float64(src_view) if is_bfloat16(src_view.dtype) else src_view
    channels = slice(where[1].start + piece[1].start, where[1].start + piece[1].stop)
    return dy, xhat_block(src, channels, *constants, out=scratch.get("xhat", shape))


def _dy_xhat_at(views: tuple, where: tuple[slice, slice, slice], piece: tuple[slice, slice, slice],
                constants: tuple[np.ndarray, np.ndarray], positions: np.ndarray,
                channel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """diff_dst and xhat at some flat positions of a piece (each element's channel given): the numbers _dy_xhat
    gives them, the same float64 operations on the same values, one element at a time."""
    dy_view, src_view = (view[where][piece].reshape(-1) for view in views[2:])  # (a piece is one flat range)
    dy = to_float64(dy_view[positions])
    src = to_float64(src_view[positions]) if is_bfloat16(src_view.dtype) else src_view[positions]
    mean, invstd = constants
    xhat = np.subtract(src, mean[channel], dtype=np.float64)
    return dy, np.multiply(xhat, invstd[channel], out=xhat)


def _regression_pass(a: np.ndarray, r: np.ndarray, inputs: Op, dtype: str, flushed_below: float = 0.0,
                     stop: threading.Event | None = None) -> ChannelRegression | None:
    """The bias regression's sums over diff_src (judge/bias.py), a pass of its own: it needs no error scale, so with
    two threads it runs beside the channel facts and the judging pass. Its blocks and pieces are the judging pass's,
    and its sums the ones the judging pass forms when it regresses its own pieces (one thread). ``stop`` set: it
    returns None at the next block."""
    views = _views(a, r, inputs)
    a3 = views[0]
    regression = ChannelRegression(a3.shape[1], dtype, elements=a3.size, flushed_below=flushed_below)
    scratch = Scratch()
    constants = channel_constants(inputs)[:2]  # (the facts' mean and invstd, formed the same way)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # (errstate is per thread)
        for where in blocks(a3.shape, BLOCK):
            if stop is not None and stop.is_set():
                return None
            sums = regression.start(a3[where].shape)
            for piece in blocks(sums.difference.shape, PIECE):
                _regress_piece(sums, piece, _upcast_piece(views, where, piece, constants, scratch))
            regression.finish(sums, where[1])
    return regression


def _unmoved_pass(a: np.ndarray, r: np.ndarray, inputs: Op, dtype: str,
                  stop: threading.Event | None = None) -> ChannelRegression | None:
    """_regression_pass for an unmoved diff_src (_unmoved: a equals r bit for bit, every element finite): only the
    sums that decide which channels can be fitted (ChannelRegression.add_unmoved), piece by piece; it stops early
    when a fit cannot be decided so (fit() then gives None). Nothing is flushed to zero where a equals r."""
    views = _views(a, r, inputs)
    a3 = views[0]
    regression = ChannelRegression(a3.shape[1], dtype, unmoved=True)
    scratch = Scratch()
    constants = channel_constants(inputs)[:2]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if runtime.numba_judging(a3.size):  # compiled (judge/numba_unmoved.py: sums that decide the same)
            from bnbwd_cli.judge import numba_unmoved

            compiled = numba_unmoved.add(regression, views, constants, BLOCK, stop)
            if compiled is not False:
                return None if compiled is None else regression
        for where in blocks(a3.shape, BLOCK):
            if stop is not None and stop.is_set():
                return None
            for piece in blocks(a3[where].shape, PIECE):
                values = _upcast_piece(views, where, piece, constants, scratch)
                regression.add_unmoved(values, values.channels)
            if regression.undecided:
                break
    return regression


def _unmoved(a: np.ndarray, r: np.ndarray) -> bool:
    """Whether diff_src equals the reference bit for bit and every element is finite (a kernel that reproduces
    bnbwd's output exactly): its regression needs fewer sums (ChannelRegression.add_unmoved). Compared chunk by chunk
    as integers (no whole-tensor temporary: peak RSS); a non-contiguous pair is not looked at (False)."""
    if a.dtype != r.dtype or a.shape != r.shape or not (a.flags.c_contiguous and r.flags.c_contiguous):
        return False
    kind = np.dtype(f"u{a.dtype.itemsize}")
    r_flat = r.reshape(-1)
    a_bits, r_bits = a.reshape(-1).view(kind), r_flat.view(kind)
    for start in range(0, r_flat.size, CHUNK):
        stop = start + CHUNK
        if not (np.array_equal(a_bits[start:stop], r_bits[start:stop]) and np.isfinite(r_flat[start:stop]).all()):
            return False
    return True


def _regress_piece(sums: BlockSums, piece: tuple[slice, slice, slice], values: _Upcast) -> None:
    """One upcast piece into its block's regression sums: d = a - r in the block's own buffer, then the products."""
    d = np.subtract(values.actual, values.reference, out=sums.difference[piece])
    sums.add(piece, values, finite=bool(np.isfinite(d).all()) and bool(np.isfinite(values.xhat).all()))


class _Beside:
    """A call run on a thread of its own while the caller goes on. Leaving the ``with`` block early (an error,
    Ctrl-C) tells the call to stop and waits for it."""

    def __init__(self, function: Callable, *args) -> None:
        self.stop = threading.Event()
        self.call = lambda: function(*args, stop=self.stop)
        self.outcome: tuple[bool, object] | None = None  # (raised, value)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.outcome = (False, self.call())
        except BaseException as exc:  # handed to the caller's thread by result()
            self.outcome = (True, exc)

    def __enter__(self) -> _Beside:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def result(self):
        self.thread.join()
        raised, value = self.outcome
        if raised:
            raise value
        return value


def judge_diff_src(a: np.ndarray, r: np.ndarray, job: Job, inputs: Op, facts: Callable[[], ChannelFacts],
                    advance: Callable[[int], None] | None = None) -> Comparison:
    """diff_src by the error model. ``facts``: the channel facts, on demand; with job.judging.threads > 1 the bias
    regression's pass runs beside the facts' pass and the judging pass (the same sums on any thread)."""
    dtype = job.setup(a, r).dtype
    detailed = job.judging.details_up_front
    flushed_below = SMALLEST_NORMAL[dtype] if job.judging.ftz else 0.0  # (flushed subnormals pass: Judging.ftz)
    # a kernel that reproduces bnbwd's diff_src bit for bit: the regression's cheaper unmoved sums (the same fit)
    unmoved = _unmoved(a, r)
    compiled = None
    if not (detailed or unmoved) and runtime.numba_judging(a.size):  # one compiled pass (judge/numba_pass.py): the same
        # numbers (an unmoved output's shortcut costs less than the compiled pass's full regression sums)
        case = _DiffSrc(a, r, job, inputs, facts(), advance)
        compiled = _compiled_pass(case, dtype, flushed_below)
    if compiled is not None:
        state, regression = compiled
    elif (job.judging.threads or 1) > 1:  # None (a plain compare_sets): one
        beside_pass = (_unmoved_pass, a, r, inputs, dtype) if unmoved else (_regression_pass, a, r, inputs, dtype,
                                                                            flushed_below)
        with _Beside(*beside_pass) as beside:
            case = _DiffSrc(a, r, job, inputs, facts(), advance)
            state = _diff_src_pass(case, detailed)
            regression = beside.result()
    elif unmoved:  # one thread, a pass of its own: the judging pass upcasts no diff_dst or xhat for it
        case = _DiffSrc(a, r, job, inputs, facts(), advance)
        state = _diff_src_pass(case, detailed)
        regression = _unmoved_pass(a, r, inputs, dtype)
    else:  # one thread: the judging pass regresses the pieces it has upcast
        case = _DiffSrc(a, r, job, inputs, facts(), advance)
        regression = ChannelRegression(layout.view3(a, inputs.data_format).shape[1], dtype, elements=a.size,
                                       flushed_below=flushed_below)
        state = _diff_src_pass(case, detailed, regression)
    fit = regression.fit()
    if fit is None:  # the unmoved sums could not decide some channel: the exact sums decide
        fit = _regression_pass(a, r, inputs, dtype, flushed_below).fit()
    bias = pooled_bias(fit.scale, fit.stderr, state.rule.scaled.unit)
    # The details (worst elements, per-channel table, histogram) cost about as much as the verdict and
    # only a failing output's report or --verbose/--json shows them: unless asked for up front or gathered by
    # the pass from where it saw the output fail, a second pass on first use.
    details_of = None if job.judging.details_up_front else Once(
        lambda: _diff_src_pass(replace(case, advance=None), detailed=True).details.finish(a, r, state.dtype))

    def errors_of():  # every element's judgement: a detail pass that keeps it (--save-error, Report.errors)
        keeping = replace(case, advance=None, job=job.keeping_errors())
        return _diff_src_pass(keeping, detailed=True).details.finish(a, r, state.dtype).errors

    return state.result(bias, details_of, errors_of)
