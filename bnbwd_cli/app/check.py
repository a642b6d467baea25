"""A suite of cases: each a file holding the op's inputs and a kernel's outputs, read and judged one by one.

A case that cannot be read or judged is an outcome with its one-line error, never an exception: the
others are still judged. Each case's inputs go through app/inputs.py and its outputs through
app/judge.py, as `run --reference` and the API judge them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bnbwd_cli.app.inputs import Naming, OpSettings, SplitRequest, split_arrays
from bnbwd_cli.app.judge import judge_kernel
from bnbwd_cli.dtypes import dtype_label
from bnbwd_cli.errors import InputError
from bnbwd_cli.files.read import read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.status import Status, suite_status

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import SetComparison
    from bnbwd_cli.op import Op
    from bnbwd_cli.judge.tolerance import Judging


@dataclass(frozen=True)
class Problem:
    """What a case's op was, for reports: src's stored shape, its dtype's short name, the layout (NCX, NXC),
    epsilon (None with variance as invstd), M (elements per channel), training or inference."""

    shape: tuple[int, ...]
    dtype: str
    layout: str
    epsilon: float | None
    m: int
    is_training: bool


def problem_of(op: Op) -> Problem:
    channels = op.mean.shape[0]
    return Problem(tuple(op.src.shape), dtype_label(op.src.dtype), op.data_format,
                   None if op.variance_is_invstd else float(op.epsilon),
                   op.src.size // channels if channels else 0, op.training)


@dataclass(frozen=True)
class CaseOutcome:
    """One case file's verdict: a comparison, or the one-line error that kept it from being judged; the op's
    problem when its inputs were read, and the seconds its reading and judging took."""

    path: str
    result: SetComparison | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()
    problem: Problem | None = None
    seconds: float = 0.0

    @property
    def status(self) -> Status:
        """The comparison's status, or ERROR when the case could not be read or judged."""
        return Status.ERROR if self.result is None else self.result.status


@dataclass(frozen=True)
class CaseRequest:
    """What every case of a suite shares: the op's settings (defaults for files that do not say), the judging,
    and the keys (the file's own or canonical names) whose int16/uint16 bits are bfloat16."""

    op: OpSettings
    judging: Judging
    bf16_keys: tuple[str, ...] = ()
    threads: int | None = None  # the core's threads per case (None: the machine's)


OUTPUTS_SUFFIX = ".out.npz"


@dataclass(frozen=True)
class Case:
    """One case: a file (or directory of .npy files) holding the inputs, and the kernel's outputs with them or
    in NAME.out.npz beside NAME.npz."""

    path: str
    outputs_path: str | None = None


def find_cases(arguments: Sequence[str]) -> tuple[Case, ...]:
    """The cases the command line names: a file is a case; a directory means its *.npz cases (not recursive),
    or is one case when it holds .npy files and no .npz, or, holding neither, means its subdirectories as if each
    were named (a folder of case folders: `check d` is `check d/*`); NAME.out.npz is NAME.npz's outputs, never a
    case of its own when NAME.npz exists (a shell glob names both). A path that does not exist stays a case (its
    error)."""
    cases: list[Case] = []
    for argument in arguments:
        path = Path(argument)
        folders = _case_folders(path)
        if folders:
            cases += find_cases([str(folder) for folder in folders])
            continue
        archives = sorted(p for p in path.glob("*.npz") if _is_case_entry(p)) if path.is_dir() else []
        for candidate in archives or [path]:
            candidate = _inputs_of(candidate) or candidate
            outputs = candidate.with_name(candidate.name.removesuffix(".npz") + OUTPUTS_SUFFIX)
            paired = candidate.name.endswith(".npz") and outputs.is_file()
            cases.append(Case(str(candidate) if archives or candidate != path else argument,
                              str(outputs) if paired else None))
    return tuple(dict.fromkeys(cases))


def _is_case_entry(path: Path) -> bool:
    """A file, or a link that leads nowhere (broken or looping): a case whose error is reported, never skipped (a
    suite with a broken entry passed green). A directory named *.npz is not a case."""
    return path.is_file() or (path.is_symlink() and not path.exists())


def _case_folders(path: Path) -> list[Path]:
    """A directory's subdirectories, sorted, when it holds no tensor file itself (else none): one level down,
    each then read as a named argument."""
    if not path.is_dir():
        return []
    try:
        entries = sorted(path.iterdir())
    except OSError:
        return []  # the case's own read says why
    if any(entry.suffix.lower() in (".npy", ".npz", ".safetensors") and entry.is_file() for entry in entries):
        return []
    return [entry for entry in entries if entry.is_dir() and not entry.name.startswith(".")]


def _inputs_of(path: Path) -> Path | None:
    """NAME.npz for NAME.out.npz when it exists, else None."""
    if not path.name.endswith(OUTPUTS_SUFFIX):
        return None
    inputs = path.with_name(path.name.removesuffix(OUTPUTS_SUFFIX) + ".npz")
    return inputs if inputs.is_file() else None


def _read_case(case: Case) -> dict:
    """The case's arrays: its file's, and its NAME.out.npz's (a key in both is an error: which one is meant?)."""
    arrays = read_tensor_set(case.path)
    if case.outputs_path is None:
        return arrays
    outputs = read_tensor_set(case.outputs_path)
    both = sorted(set(arrays) & set(outputs))
    if both:
        raise InputError(f"{case.path}: {both[0]!r} is in both {case.path} and {case.outputs_path}; keep one")
    return {**arrays, **outputs}


def judge_file(case: Case | str, request: CaseRequest) -> CaseOutcome:
    """Read one case (inputs and kernel outputs in one .npz or directory, or NAME.npz and NAME.out.npz) and judge
    it. The file's own 'epsilon', 'data_format' and 'is_training' entries win over request.op."""
    case = Case(case) if isinstance(case, str) else case
    path, bf16 = case.path, request.bf16_keys
    started, problem = time.perf_counter(), None
    try:
        arrays = _read_case(case)
        found = reinterpret_bf16(bf16, {path: arrays})
        naming = Naming(request.judging.key_map, request.judging.ignore)
        split = split_arrays(arrays, SplitRequest(naming, request.op, file_wins=True), path)
        found |= reinterpret_bf16([key for key in bf16 if key not in found], {path: split.inputs})
        check_found(bf16, found, path)
        if not split.outputs and case.outputs_path is None and path.endswith(".npz") and not split.output_guesses():
            raise InputError(f"{path.removesuffix('.npz')}{OUTPUTS_SUFFIX} not found, and {path} holds no outputs "
                             "(diff_src, diff_gamma, diff_beta or a spec's name for them)",
                             hint="did the kernel write its outputs? --map THEIRS=OURS names your own")
        op = split.build_op(judged=True)
        problem = problem_of(op)
        judging = request.judging if request.threads is None else replace(request.judging, threads=request.threads)
        result = judge_kernel(op, split.outputs, judging)
    except InputError as exc:
        message = exc.format_message()  # every error names the case, once
        return CaseOutcome(path, error=message if message.startswith(path) else f"{path}: {message}",
                           problem=problem, seconds=time.perf_counter() - started)
    return CaseOutcome(path, result, notes=(split.note(),) if split.note() else (), problem=problem,
                       seconds=time.perf_counter() - started)


def judge_cases(cases: Sequence[Case | str], request: CaseRequest,
                on_case: Callable[[CaseOutcome], None] | None = None, jobs: int | None = 1,
                on_note: Callable[[str], None] | None = None) -> tuple[CaseOutcome, ...]:
    """Every case, in order; on_case sees each outcome as soon as it and those before it are known (a line per
    case as they go). jobs > 1: that many worker processes, one core thread each, or as many as the machine's
    limits let start (on_note hears which limit stopped the others); None: one a usable core, the CLI's default
    (its note says so, not `--jobs N`); the outcomes are the same."""
    outcomes = []
    for outcome in _outcomes(cases, request, jobs, on_note or (lambda note: None)):
        outcomes.append(outcome)
        if on_case is not None:
            on_case(outcome)
    return tuple(outcomes)


def _outcomes(cases: Sequence[Case | str], request: CaseRequest, jobs: int | None,
              on_note: Callable[[str], None]) -> Iterator[CaseOutcome]:
    pool, asked = None, f"--jobs {jobs}"
    if jobs is None:
        from bnbwd_cli.runtime import usable_cores

        jobs = usable_cores()
        asked = f"{jobs} workers (the default: one a usable core)"
    if min(jobs, len(cases)) > 1:  # a plain check never starts a pool
        from bnbwd_cli.app import workers

        pool = workers.start_pool(min(jobs, len(cases)), asked)
        if pool.note is not None:
            on_note(pool.note)
    if pool is None or pool.executor is None:
        yield from (judge_file(case, request) for case in cases)
        return
    one_thread = replace(request, threads=1)
    yield from workers.results(pool, _judge_in_worker, cases, [one_thread] * len(cases))


@dataclass(frozen=True)
class _Known:
    """An output's details, computed in the worker: what a report of the outcome shows, sent back with it."""

    details: object

    def __call__(self) -> object:
        return self.details


class _NotGathered:
    """The details of an output that passed, left in the worker (a report shows details for failures only, and the
    JSON document's are gathered up front)."""

    def __call__(self) -> object:
        raise RuntimeError("the details of a passing output judged in a worker process were not kept")


def _judge_in_worker(case: Case | str, request: CaseRequest) -> CaseOutcome:
    """judge_file, with each output's lazily computed details made concrete so that the outcome can travel."""
    outcome = judge_file(case, request)
    if outcome.result is None:
        return outcome
    outputs = []
    for output in outcome.result.outputs:
        c = output.comparison
        if c is not None:
            keep = request.judging.details_up_front or not c.passed
            # (every element's judgement stays in the worker: a pass of its own that --save-error asks for up front)
            c = replace(c, details_of=_Known(c.details) if keep else _NotGathered(), errors_of=None)
        outputs.append(replace(output, comparison=c))
    return replace(outcome, result=replace(outcome.result, outputs=tuple(outputs)))


def shard(cases: Sequence[Case], k: int, n: int) -> tuple[Case, ...]:
    """Shard K of N (1-based): a contiguous block of the cases, sizes within one of each other; the N shards are
    disjoint, and in order their union is the whole list (their lines, concatenated, are the unsharded run's)."""
    return tuple(cases[(k - 1) * len(cases) // n:k * len(cases) // n])


def suite_verdict(outcomes: Sequence[CaseOutcome]) -> Status:
    return suite_status(outcome.status for outcome in outcomes)
