"""Exit codes and the one user-facing error type."""

from __future__ import annotations

import enum

import click


class ExitCode(enum.IntEnum):
    """Stable exit codes: scripts and CI depend on them."""

    OK = 0
    MISMATCH = 1  # verification found numerical differences beyond tolerance
    USAGE = 2  # click's own usage errors
    INPUT = 3  # unreadable, malformed or inconsistent input; structural mismatch
    INTERNAL = 4  # a bug in bnbwd (the traceback is shown with --traceback)
    INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + 2, as shells report it; no partial output is left
    TERMINATED = 143  # SIGTERM: 128 + 15; no partial output is left


class BnbwdError(click.ClickException):
    """A problem with the user's input: printed as one line, never a traceback."""

    exit_code = ExitCode.INPUT

    def format_message(self) -> str:
        # One line, whatever the cause: newlines would break log greps.
        return " ".join(self.message.split())

    def show(self, file=None) -> None:  # noqa: ANN001 - click's signature
        click.echo(f"error: {self.format_message()}", file=file, err=True)
