"""Compare two tensor sets key by key: ``compare_sets`` and the rows it returns.

``compare_sets`` matches keys (judge/keys.py) and compares each pair. When the op's inputs are
known (``inputs=``), the outputs diff_src, diff_gamma and diff_beta are judged by the error model
(judge/model.py: K units of what a correct kernel may be off by on this problem), checked for
systematic deviations (judge/bias.py) and, when they fail, explained (judge/hints.py). Other outputs,
and outputs with explicit --atol/--rtol/--ulp, use fixed dtype tolerances (judge/tolerance.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli import layout
from bnbwd_cli.dtypes import SMALLEST_NORMAL, to_float64, ulp_spacing
from bnbwd_cli.errors import ExitCode
from bnbwd_cli.judge import hints as hint_rules
from bnbwd_cli.judge.bias import vector_bias
from bnbwd_cli.judge.comparison import Comparison, Hint
from bnbwd_cli.judge.compare import Coordinates, compare_arrays
from bnbwd_cli.judge.diff_src import judge_diff_src
from bnbwd_cli.judge.job import Job
from bnbwd_cli.judge.keys import OUTPUT_ALIASES, KeyMatch, KeyProblem, match_keys, require_outputs, structural_problem
from bnbwd_cli.judge.model import ChannelFacts, channel_facts
from bnbwd_cli.judge.tolerance import Judging
from bnbwd_cli.spec import ShapesOnDemand
from bnbwd_cli.status import Status, exit_code

if TYPE_CHECKING:
    from bnbwd_cli.op import Op


@dataclass(frozen=True)
class OutputResult:
    """One output's row: a comparison, or the structural problem that prevented it."""

    name: str
    actual_key: str | None
    reference_key: str | None
    comparison: Comparison | None
    problem: KeyProblem | None

    @property
    def status(self) -> Status:
        """PASS, MISMATCH (its comparison failed) or STRUCTURAL (``problem`` says what kept it from being compared:
        its kind is "missing", "extra", "shape" or "dtype")."""
        if self.problem is not None:
            return Status.STRUCTURAL
        return Status.PASS if self.comparison.passed else Status.MISMATCH


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
        return Status.MISMATCH if any(o.status == Status.MISMATCH for o in self.outputs) else Status.PASS

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


def _fixed(a: np.ndarray, r: np.ndarray, job: Job) -> Comparison:
    setup = job.setup(a, r)
    return compare_arrays(a, r, job.judging.tolerance_for(job.names, setup.dtype), setup,
                          lazy_details=not job.judging.details_up_front)


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


def _judge_sum(a: np.ndarray, r: np.ndarray, job: Job, inputs: Op, facts: ChannelFacts, output: str) -> Comparison:
    state = job.accumulator(a, r, inputs, output)
    s_beta, s_gamma = facts.sum_scales(state.rule.scaled.unit)
    scale = s_gamma if output == "diff_gamma" else s_beta
    a64, r64 = to_float64(a.reshape(-1)), to_float64(r.reshape(-1))
    state.add(a64, r64, 0, scale)
    noise = scale + ulp_spacing(r64, state.dtype) / 2
    sys_beta, sys_gamma = facts.systematic(state.rule.scaled.unit)
    systematic = sys_gamma if output == "diff_gamma" else sys_beta
    flushed_below = SMALLEST_NORMAL[state.dtype] if job.judging.ftz else 0.0  # (flushed subnormals pass: Judging.ftz)
    bias = vector_bias(a64, r64, noise, state.rule.scaled.unit, systematic, flushed_below)

    def errors_of():  # every element's judgement: the same pass, keeping it (--save-error, Report.errors)
        keeping = job.keeping_errors().accumulator(a, r, inputs, output)
        keeping.add(a64, r64, 0, scale)
        return keeping.details.finish(a, r, state.dtype).errors

    return state.result(bias, errors_of=errors_of)


def _output_name(names: tuple[str, ...]) -> str | None:
    """The op output (diff_src, diff_gamma, diff_beta) a pair of keys stands for, if any."""
    return next((OUTPUT_ALIASES[n] for n in reversed(names) if n in OUTPUT_ALIASES), None)


def _compare_pair(a: np.ndarray, r: np.ndarray, job: Job, inputs: Op | None, facts, progress: Progress) -> Comparison:
    output = _output_name(job.names)
    if inputs is None or output is None or job.judging.fixed_requested(job.names):
        return _fixed(a, r, job)
    expected = inputs.src.shape if output == "diff_src" else inputs.mean.shape
    if a.shape != tuple(expected):
        return _fixed(a, r, job)  # not the op's output shape: judge it as plain arrays
    if output == "diff_src":
        return judge_diff_src(a, r, job, inputs, facts, progress.advance)
    return _judge_sum(a, r, job, inputs, facts(), output)


def _with_hints(output: OutputResult, hints: tuple[Hint, ...], actual: Mapping[str, np.ndarray],
                reference: Mapping[str, np.ndarray]) -> OutputResult:
    """The output's row with its diagnosis and the hints' texts (then the precision note, judge/hints.py)."""
    c = output.comparison
    if c is None:
        return output
    if not any(h.cause in hint_rules.NARROWER_CAUSES for h in hints):  # (a named 16-bit cause says it already)
        hints = hints + hint_rules.precision_hints(c, actual[output.actual_key], reference[output.reference_key])
    # the precise ones lead: "no tested hypothesis explains" after any cause or note (check's line shows the first)
    hints = tuple(sorted(hints, key=lambda h: h.cause in hint_rules.UNEXPLAINED))
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


def _match(actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], judging: Judging,
           inputs: Op | None) -> KeyMatch:
    """The pairs to compare and the key problems; a kernel's outputs (inputs known) must include judging.required."""
    shapes = ShapesOnDemand((reference, actual), [*reference, *actual])
    match = match_keys(list(actual), list(reference), judging.key_map, judging.only, judging.ignore, shapes)
    if not judging.required or inputs is None:
        return match
    expected = {"diff_src": tuple(inputs.src.shape), "diff_gamma": tuple(inputs.mean.shape),
                "diff_beta": tuple(inputs.mean.shape)}
    return require_outputs(match, judging, ShapesOnDemand((actual,), list(actual)), expected)


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
    match = _match(actual, reference, judging, inputs)
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
            job = Job(pair.names, judging, tensor_layout(data_format, r.ndim))
            comparison = _compare_pair(a, r, job, inputs, facts, tracker)
        name = _output_name(pair.names)
        if comparison is None or comparison.scaled is None or name != "diff_src":
            tracker.advance(size)  # (the judging pass of diff_src reports its own blocks)
        if comparison is not None and comparison.scaled is not None and name is not None and name not in judged:
            judged[name] = (a, r, comparison)
        row_names.append(name)
        outputs.append(OutputResult(pair.name, pair.actual_key, pair.reference_key, comparison, problem))
    found = _explained(inputs, facts, judged)
    outputs = [_with_hints(o, found.get(name, ()), actual, reference) for o, name in zip(outputs, row_names)]
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
