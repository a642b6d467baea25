"""A suite of cases: each a file holding the op's inputs and a kernel's outputs, read and judged one by one.

A case that cannot be read or judged is an outcome with its one-line error, never an exception: the
others are still judged. Each case's inputs go through app/inputs.py and its outputs through
app/judge.py, as `run --reference` and the API judge them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bnbwd_cli.app.inputs import Naming, OpSettings, SplitRequest, split_arrays
from bnbwd_cli.app.judge import judge_outputs
from bnbwd_cli.errors import InputError
from bnbwd_cli.files.read import read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.status import Status, suite_status

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import SetComparison
    from bnbwd_cli.judge.tolerance import Judging


@dataclass(frozen=True)
class CaseOutcome:
    """One case file's verdict: a comparison, or the one-line error that kept it from being judged."""

    path: str
    result: SetComparison | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()

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
    bf16: tuple[str, ...] = ()


def judge_file(path: str, request: CaseRequest) -> CaseOutcome:
    """Read one case (inputs and kernel outputs in one .npz or directory) and judge it. The file's own
    'epsilon' and 'data_format' entries win over request.op."""
    bf16 = request.bf16
    try:
        arrays = read_tensor_set(path)
        found = reinterpret_bf16(bf16, {path: arrays})
        naming = Naming(request.judging.key_map, request.judging.ignore)
        split = split_arrays(arrays, SplitRequest(naming, request.op, file_wins=True), path)
        found |= reinterpret_bf16([key for key in bf16 if key not in found], {path: split.inputs})
        check_found(bf16, found, path)
        problem = split.build_op()
        result = judge_outputs(problem, split.outputs, request.judging)
    except InputError as exc:
        message = exc.format_message()  # every error names the case, once
        return CaseOutcome(path, error=message if message.startswith(path) else f"{path}: {message}")
    return CaseOutcome(path, result, notes=(split.note(),) if split.note() else ())


def judge_cases(paths: Sequence[str], request: CaseRequest,
                on_case: Callable[[CaseOutcome], None] | None = None) -> tuple[CaseOutcome, ...]:
    """Every case in order; on_case sees each outcome as soon as it is known (a line per case as they go)."""
    outcomes = []
    for path in paths:
        outcome = judge_file(path, request)
        outcomes.append(outcome)
        if on_case is not None:
            on_case(outcome)
    return tuple(outcomes)


def suite_verdict(outcomes: Sequence[CaseOutcome]) -> Status:
    return suite_status(outcome.status for outcome in outcomes)
