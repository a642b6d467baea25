"""Compare two tensor sets key by key: ``compare_sets`` and the rows it returns.

``compare_sets`` matches keys (judge/keys.py) and compares each pair. When the op's inputs are
known (``inputs=``), the outputs diff_src, diff_gamma and diff_beta are judged by the error model
(judge/model.py: K units of what a correct kernel may be off by on this problem), checked for
systematic deviations (judge/bias.py) and, when they fail, explained (judge/hints.py). Other outputs,
and outputs with explicit --atol/--rtol/--ulp, use fixed dtype tolerances (judge/tolerance.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli import layout
from bnbwd_cli.dtypes import is_bfloat16, to_float64, ulp_spacing
from bnbwd_cli.errors import ExitCode
from bnbwd_cli.judge import hints as hint_rules
from bnbwd_cli.judge.bias import BlockSums, ChannelRegression, PieceValues, pooled_bias, vector_bias
from bnbwd_cli.spec import ShapesOnDemand
from bnbwd_cli.judge.keys import OUTPUT_ALIASES, KeyProblem, match_keys, structural_problem
from bnbwd_cli.judge.model import (
    CHUNK, ChannelFacts, DiffSrcScale, blocks, channel_constants, channel_facts, diff_src_scale, flat_offset, unit_roundoff, xhat_block,
)
from bnbwd_cli.judge.rules import ScaledRule
from bnbwd_cli.judge.comparison import Comparison, Hint, Once
from bnbwd_cli.judge.compare import CHUNK as STATS_CHUNK, Accumulator, Coordinates, Setup, compare_arrays
from bnbwd_cli.judge.tolerance import Judging, comparison_dtype
from bnbwd_cli.scratch import Scratch
from bnbwd_cli.status import Status, exit_code

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
class OutputResult:
    """One output's row: a comparison, or the structural problem that prevented it."""

    name: str
    actual_key: str | None
    reference_key: str | None
    comparison: Comparison | None
    problem: KeyProblem | None

    @property
    def status(self) -> str:
        """"pass", "fail", or the problem's kind ("missing", "extra", "shape", "dtype")."""
        if self.problem is not None:
            return self.problem.kind
        return "pass" if self.comparison.passed else "fail"


@dataclass(frozen=True)
class SetComparison:
    """All outputs of two tensor sets, plus key-level problems (e.g. an empty selection)."""

    outputs: tuple[OutputResult, ...]
    problems: tuple[KeyProblem, ...]
    judging: Judging
    inputs_known: bool = False
    notes: tuple[str, ...] = ()  # keys left out of the comparison (inputs, extras), said once

    @property
    def all_problems(self) -> tuple[KeyProblem, ...]:
        return self.problems + tuple(o.problem for o in self.outputs if o.problem is not None)

    @property
    def status(self) -> Status:
        """Structural beats mismatch beats pass."""
        if self.all_problems:
            return Status.STRUCTURAL
        return Status.MISMATCH if any(o.status == "fail" for o in self.outputs) else Status.PASS

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.status)


def tensor_layout(data_format: str | None, ndim: int) -> Coordinates:
    """Axis names and channel axis of an output in ``data_format``; 1-D outputs are (C,)."""
    if data_format is None or ndim < 1:
        return Coordinates()
    if ndim == 1:
        return Coordinates(("c",), None)
    return Coordinates(layout.axis_letters(data_format, ndim), layout.channel_axis(data_format, ndim))


@dataclass(frozen=True)
class _Job:
    """What one pair's comparison needs besides the arrays."""

    names: tuple[str, str]
    judging: Judging
    layout: Coordinates


def _setup(a: np.ndarray, r: np.ndarray, job: _Job) -> Setup:
    dtype = comparison_dtype(a.dtype, r.dtype)
    return Setup(dtype, job.judging.max_mismatch_for(job.names), job.judging.equal_nan, job.layout, job.judging.top)


def _fixed(a: np.ndarray, r: np.ndarray, job: _Job) -> Comparison:
    setup = _setup(a, r, job)
    return compare_arrays(a, r, job.judging.tolerance_for(job.names, setup.dtype), setup,
                          lazy_details=not job.judging.details_up_front)


def _accumulator(a: np.ndarray, r: np.ndarray, job: _Job, inputs: Op, output: str, detailed: bool = True) -> Accumulator:
    setup = replace(_setup(a, r, job), detailed=detailed)
    rule = ScaledRule(job.judging.scaled_for(job.names, unit_roundoff(inputs, setup.dtype), output))
    return Accumulator(a, r, rule, setup)


class Progress:
    """Elements judged so far of a known total, told to a callback (done, total) as they grow."""

    def __init__(self, callback: Callable[[int, int], None] | None, total: int) -> None:
        self.callback, self.total, self.done = callback, total, 0

    def advance(self, elements: int) -> None:
        if self.callback is not None:
            self.done = min(self.done + elements, self.total)
            self.callback(self.done, self.total)

    def finish(self) -> None:
        self.advance(self.total)


@dataclass(frozen=True)
class _DiffSrc:
    """diff_src's pair and what its error scale is built from (advance: the judging pass's progress)."""

    a: np.ndarray
    r: np.ndarray
    job: _Job
    inputs: Op
    facts: ChannelFacts
    advance: Callable[[int], None] | None = None


def _diff_src_pass(case: _DiffSrc, detailed: bool, regression: ChannelRegression | None = None) -> Accumulator:
    """One blocked pass over diff_src: the verdict's statistics, and the details when ``detailed`` (in the judging
    pass when asked for up front, else a second pass on first use); with ``regression``, its sums too, from the
    same upcast pieces (one thread: _regression_pass's sums without a pass of their own)."""
    inputs = case.inputs
    state = _accumulator(case.a, case.r, case.job, inputs, "diff_src", detailed)
    judged = _Pass(case, state, diff_src_scale(case.facts, state.rule.scaled.unit, inputs.training), Scratch())
    a3 = judged.views[0]
    with np.errstate(invalid="ignore", over="ignore"):
        for where in blocks(a3.shape, BLOCK):
            judged.block(where, regression)
            if case.advance is not None:
                case.advance(a3[where].size)
    return state


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

    def block(self, where: tuple[slice, slice, slice], regression: ChannelRegression | None = None) -> None:
        a3, r3 = self.views[:2]
        shape = a3[where].shape
        # r and d = a - r of the whole block: the relative L2's sums are by block
        r_block = r3[where] if r3.dtype == np.float64 else self.scratch.get("r", shape)
        d_block = self.scratch.get("difference", shape)
        sums = regression.start(shape) if regression is not None else None
        offset = flat_offset(a3.shape, where)
        finite = True
        for piece in blocks(shape, PIECE):
            finite &= self._piece(where, piece, (r_block, d_block, sums), offset + flat_offset(shape, piece))
        if finite:  # d is a - r everywhere, and a and r are finite
            self.state.l2.update(d_block.reshape(-1), r_block.reshape(-1))
        else:
            self.state.add_norms(to_float64(a3[where]).reshape(-1), r_block.reshape(-1))
        if sums is not None:
            regression.finish(sums, where[1])

    def _piece(self, where: tuple[slice, slice, slice], piece: tuple[slice, slice, slice], block: tuple,
               offset: int) -> bool:
        """Judge one piece (and regress it, with a block's regression sums); whether its a - r is finite everywhere."""
        r_block, d_block, sums = block
        facts = self.case.facts
        values = _upcast_piece(self.views, where, piece, (facts.mean, facts.invstd), self.scratch, r_block)
        a, r, d, dy, xhat = values.actual, values.reference, d_block[piece], values.diff_dst, values.xhat
        np.subtract(a, r, out=d)
        finite = bool(np.isfinite(d).all())
        shape, channels, model = a.shape, values.channels, self.model

        def scale_at(positions: np.ndarray | None) -> np.ndarray:
            if positions is None:
                out = tuple(self.scratch.take(("scale", "term"), shape))
                return model.block(xhat, dy, r, channels, out=out).reshape(-1)
            channel = channels.start + positions // shape[2] % shape[1]
            return model.at(channel, *(v.reshape(-1)[positions] for v in (xhat, dy, r)))

        flat = (a.reshape(-1), r.reshape(-1))
        if finite and self.scale_sound[channels].all():
            self.state.add_scaled(*flat, d.reshape(-1), offset, scale_at)
        else:
            self.state.add(*flat, offset, scale_at(None), norms=False)
        if sums is not None:
            _regress_piece(sums, piece, values)
        return finite


def _views(a: np.ndarray, r: np.ndarray, inputs: Op) -> tuple[np.ndarray, ...]:
    """diff_src's actual and reference, diff_dst and src as (N, C, S) views."""
    return tuple(layout.view3(x, inputs.data_format) for x in (a, r, inputs.diff_dst, inputs.src))


@dataclass(frozen=True)
class _Upcast(PieceValues):
    channels: slice  # the piece's channels in the whole tensor


def _upcast_piece(views: tuple, where: tuple[slice, slice, slice], piece: tuple[slice, slice, slice],
                  constants: tuple[np.ndarray, np.ndarray], scratch: Scratch, r_block: np.ndarray | None = None) -> _Upcast:
    """One piece of a block as float64: actual, reference (into ``r_block``'s piece when given; a float64 reference
    is the input itself), diff_dst and xhat; ``constants``: the channels' mean and invstd."""
    a_view, r_view, dy_view, src_view = (view[where][piece] for view in views)
    shape = a_view.shape
    a = to_float64(a_view, scratch.get("a", shape))
    r_out = scratch.get("r_piece", shape) if r_block is None else r_block[piece]
    r = r_view if r_view.dtype == np.float64 else to_float64(r_view, r_out)
    dy = to_float64(dy_view, scratch.get("dy", shape))
    # xhat straight from src (a ufunc upcasts float32 and float16 exactly on the way), bfloat16 through float32
    src = to_float64(src_view) if is_bfloat16(src_view.dtype) else src_view
    channels = slice(where[1].start + piece[1].start, where[1].start + piece[1].stop)
    xhat = xhat_block(src, channels, *constants, out=scratch.get("xhat", shape))
    return _Upcast(xhat, r, a, dy, channels)


def _regression_pass(a: np.ndarray, r: np.ndarray, inputs: Op, dtype: str,
                     stop: threading.Event | None = None) -> ChannelRegression | None:
    """The bias regression's sums over diff_src (judge/bias.py), a pass of its own: it needs no error scale, so with
    two threads it runs beside the channel facts and the judging pass. Its blocks and pieces are the judging pass's,
    and its sums the ones the judging pass forms when it regresses its own pieces (one thread). ``stop`` set: it
    returns None at the next block."""
    views = _views(a, r, inputs)
    a3 = views[0]
    regression = ChannelRegression(a3.shape[1], dtype)
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


def _judge_diff_src(a: np.ndarray, r: np.ndarray, job: _Job, inputs: Op, facts: Callable[[], ChannelFacts],
                    advance: Callable[[int], None] | None = None) -> Comparison:
    """diff_src by the error model. ``facts``: the channel facts, on demand; with job.judging.threads > 1 the bias
    regression's pass runs beside the facts' pass and the judging pass (the same sums on any thread)."""
    dtype = _setup(a, r, job).dtype
    detailed = job.judging.details_up_front
    if job.judging.threads > 1:
        with _Beside(_regression_pass, a, r, inputs, dtype) as beside:
            case = _DiffSrc(a, r, job, inputs, facts(), advance)
            state = _diff_src_pass(case, detailed)
            regression = beside.result()
    else:  # one thread: the judging pass regresses the pieces it has upcast
        case = _DiffSrc(a, r, job, inputs, facts(), advance)
        regression = ChannelRegression(layout.view3(a, inputs.data_format).shape[1], dtype)
        state = _diff_src_pass(case, detailed, regression)
    fit = regression.fit()
    bias = pooled_bias(fit.scale, fit.stderr, state.rule.scaled.unit)
    # The details (worst elements, per-channel table, histogram) cost about as much as the verdict and
    # only a failing output's report or --verbose/--json shows them: unless asked for up front, a second
    # pass on first use.
    details_of = None if job.judging.details_up_front else Once(
        lambda: _diff_src_pass(replace(case, advance=None), detailed=True).details.finish(a, r, state.dtype))
    return state.result(bias, details_of)


def _judge_sum(a: np.ndarray, r: np.ndarray, job: _Job, inputs: Op, facts: ChannelFacts, output: str) -> Comparison:
    state = _accumulator(a, r, job, inputs, output)
    s_beta, s_gamma = facts.sum_scales(state.rule.scaled.unit)
    scale = s_gamma if output == "diff_gamma" else s_beta
    a64, r64 = to_float64(a.reshape(-1)), to_float64(r.reshape(-1))
    state.add(a64, r64, 0, scale)
    noise = scale + ulp_spacing(r64, state.dtype) / 2
    sys_beta, sys_gamma = facts.systematic(state.rule.scaled.unit)
    systematic = sys_gamma if output == "diff_gamma" else sys_beta
    bias = vector_bias(a64, r64, noise, state.rule.scaled.unit, systematic)
    return state.result(bias)


def _output_name(names: tuple[str, ...]) -> str | None:
    """The op output (diff_src, diff_gamma, diff_beta) a pair of keys stands for, if any."""
    return next((OUTPUT_ALIASES[n] for n in reversed(names) if n in OUTPUT_ALIASES), None)


def _compare_pair(a: np.ndarray, r: np.ndarray, job: _Job, inputs: Op | None, facts, progress: Progress) -> Comparison:
    output = _output_name(job.names)
    if inputs is None or output is None or job.judging.fixed_requested(job.names):
        return _fixed(a, r, job)
    expected = inputs.src.shape if output == "diff_src" else inputs.mean.shape
    if a.shape != tuple(expected):
        return _fixed(a, r, job)  # not the op's output shape: judge it as plain arrays
    if output == "diff_src":
        return _judge_diff_src(a, r, job, inputs, facts, progress.advance)
    return _judge_sum(a, r, job, inputs, facts(), output)


def _with_hints(output: OutputResult, hints: tuple[Hint, ...], actual: Mapping[str, np.ndarray]) -> OutputResult:
    """The output's row with its diagnosis and the hints' texts (then the precision note, judge/hints.py)."""
    c = output.comparison
    if c is None:
        return output
    hints = hints + hint_rules.precision_hints(c, actual[output.actual_key])
    return replace(output, comparison=replace(c, hints=tuple(h.text for h in hints), diagnosis=hints))


def _size(arrays: Mapping[str, np.ndarray], key: str, progress: Callable[[int, int], None] | None) -> int:
    """An array's size for a progress callback; 0 without one (reading it inflates a lazy .npz member early)."""
    return int(np.size(arrays[key])) if progress is not None else 0


def _explained(inputs: Op | None, facts: Callable[[], ChannelFacts],
               judged: Mapping[str, tuple[np.ndarray, np.ndarray, Comparison]]) -> dict[str, tuple[Hint, ...]]:
    """The diagnosis' hints per output (judge/diagnosis), when an output failed or deviated: the diagnosis is only
    imported then."""
    if not any(c.suspicious for _, _, c in judged.values()):
        return {}
    from bnbwd_cli.judge.diagnosis import diagnose

    return diagnose(inputs, facts(), judged)


def compare_sets(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    judging: Judging,
    *,
    data_format: str | None = None,
    inputs: Op | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SetComparison:
    """Match keys, then compare each pair; structural failures become rows, never skips.

    ``judging``: the settings, the key selection (--map, --only, --ignore) and how many worst elements to keep.
    ``data_format``: the outputs' layout, for coordinates and per-channel tables (default: the inputs').
    With ``inputs`` (the op's inputs the kernel saw), the op's outputs are judged by the error model.
    ``progress``: told (done, total) as elements are judged (the pass over the inputs counted too).
    """
    if inputs is not None and data_format is None:
        data_format = inputs.data_format
    cache: dict[str, ChannelFacts] = {}
    shapes = ShapesOnDemand((reference, actual), [*reference, *actual])
    match = match_keys(list(actual), list(reference), judging.key_map, judging.only, judging.ignore, shapes)
    pair_sizes = [_size(actual, pair.actual_key, progress) for pair in match.pairs]
    tracker = Progress(progress, sum(pair_sizes) + (int(inputs.src.size) if inputs is not None else 0))

    def facts() -> ChannelFacts:  # one pass over src and diff_dst, only when an output needs it
        if "facts" not in cache:
            cache["facts"] = channel_facts(inputs, tracker.advance)
        return cache["facts"]

    outputs: list[OutputResult] = []
    judged: dict[str, tuple[np.ndarray, np.ndarray, Comparison]] = {}  # the op's outputs, for the diagnosis
    row_names: list[str | None] = []
    for pair, size in zip(match.pairs, pair_sizes):
        a, r = actual[pair.actual_key], reference[pair.reference_key]
        problem = structural_problem(pair.name, a, r)
        comparison = None
        if problem is None:
            job = _Job(pair.names, judging, tensor_layout(data_format, r.ndim))
            comparison = _compare_pair(a, r, job, inputs, facts, tracker)
        name = _output_name(pair.names)
        if comparison is None or comparison.scaled is None or name != "diff_src":
            tracker.advance(size)  # (the judging pass of diff_src reports its own blocks)
        if comparison is not None and comparison.scaled is not None and name is not None and name not in judged:
            judged[name] = (a, r, comparison)
        row_names.append(name)
        outputs.append(OutputResult(pair.name, pair.actual_key, pair.reference_key, comparison, problem))
    found = _explained(inputs, facts, judged)
    outputs = [_with_hints(o, found.get(name, ()), actual) for o, name in zip(outputs, row_names)]
    tracker.finish()
    key_problems = []
    for problem in match.problems:
        if problem.kind in ("missing", "extra") and not problem.message.startswith("--"):
            in_actual = problem.kind == "extra"
            outputs.append(
                OutputResult(problem.name, problem.name if in_actual else None, None if in_actual else problem.name, None, problem)
            )
        else:
            key_problems.append(problem)
    return SetComparison(tuple(outputs), tuple(key_problems), judging, inputs is not None, match.notes)
