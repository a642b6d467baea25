"""Exit codes and the one user-facing error type."""

from __future__ import annotations

import enum

from bnbwd_cli.literal import literal_line


class ExitCode(enum.IntEnum):
    """Stable exit codes: scripts and CI depend on them."""

    OK = 0
    MISMATCH = 1  # verification found numerical differences beyond tolerance
    USAGE = 2  # click's own usage errors
    INPUT = 3  # unreadable, malformed or inconsistent input; structural mismatch
    INTERNAL = 4  # a bug in bnbwd (the traceback is shown with --traceback)
    HANGUP = 129  # SIGHUP (a closed terminal, a lost session): 128 + 1, handled as SIGTERM is
    INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + 2, as shells report it; no partial output is left
    TERMINATED = 143  # SIGTERM: 128 + 15; no partial output is left


class InputError(ValueError):
    """A problem with the user's input: the command line prints it as one `error:` line and exits 3; the Python
    API raises it as it is.

    str(error) is the message; ``hint`` says what to type on the command line instead (e.g. "give --epsilon"),
    so the API's message carries no CLI wording. format_message() is the CLI's line: message and hint.
    """

    exit_code = ExitCode.INPUT

    def __init__(self, message: str, hint: str | None = None) -> None:
        # One printable line, whatever it quotes: a newline in a file's name would forge a line of a log, ESC would
        # reach the terminal, a 10 MB key would be a 10 MB line (literal.py).
        self.message = " ".join(literal_line(str(message)).split())
        self.hint = hint
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def format_message(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


BnbwdError = InputError  # the name files/ raises it by
