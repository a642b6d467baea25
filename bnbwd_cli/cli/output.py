"""What the commands and the group share about stdout and stderr: one-line errors, the verdict once it is
decided (a report cut short afterwards cannot change the exit code), and a report's writes to stdout."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

import click

from bnbwd_cli.literal import literal_line


class _Verdict:
    """The exit code of a judgement, once known (run --reference, verify, check): a report cut short by a closed
    stdout afterwards cannot change it. Reset by every invocation of the group."""

    code: int | None = None


def record_verdict(code: int) -> None:
    """The command's verdict is decided: from now on a failing stdout only cuts its report short."""
    _Verdict.code = int(code)


class ReportWriter:
    """A report's writes to stdout: the first that fails (its reader gone, a full device) ends the report, never
    the judging; finish() raises that failure once the verdict is recorded (then the exit code is the verdict's)."""

    def __init__(self) -> None:
        self.failure: OSError | None = None

    def write(self, func: Callable[..., object], *args: object) -> None:
        if self.failure is not None:
            return
        try:
            func(*args)
        except OSError as exc:
            self.failure = exc
            silence_stdout()

    def finish(self) -> None:
        if sys.stdout is None:  # started with stdout closed (`>&-`): nothing could be written
            echo_error(f"note: no report: stdout is closed; exit code {_Verdict.code} is the verdict's")
        elif self.failure is not None:
            raise self.failure


def recorded_verdict() -> int | None:
    """The exit code of the verdict recorded by this invocation; None before one is decided."""
    return _Verdict.code


def forget_verdict() -> None:
    """A new invocation of the group: no verdict yet."""
    _Verdict.code = None


def echo_error(text: str) -> None:
    """One line on stderr, printed literally (literal.py: control bytes escaped, at most LINE_LIMIT
    characters); a failing stderr cannot change the exit code."""
    echo_text(literal_line(text))


def echo_text(text: str) -> None:
    """Text on stderr as it is (a traceback asked for); a failing stderr cannot change the exit code."""
    with contextlib.suppress(OSError, ValueError):
        click.echo(text, err=True)


def silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (e.g. under CliRunner)
        pass
