"""The click group: exit-code mapping, SIGTERM and Ctrl-C, one-line errors (the commands are in run/verify/check;
what they share with the group about stdout and stderr is cli/output.py)."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import warnings

import click

from bnbwd_cli._version import __version__
from bnbwd_cli.cli.output import echo_error, echo_text, forget_verdict, recorded_verdict, silence_stdout
from bnbwd_cli.cli.params import CONTEXT
from bnbwd_cli.errors import ExitCode, InputError
from bnbwd_cli.files.common import display, reason
from bnbwd_cli.literal import literal

class InputFailed(click.ClickException):
    """An InputError on its way out of a command: one `error:` line, exit 3."""

    exit_code = ExitCode.INPUT

    def __init__(self, error: InputError) -> None:
        super().__init__(error.format_message())

    def show(self, file=None) -> None:  # click's signature
        echo_error(f"error: {self.message}")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, so that the same cleanup as for Ctrl-C runs."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


def _on_sigterm(signum, frame) -> None:  # signal's signature
    raise Terminated(signum)


# SIGHUP (the terminal closed, the ssh session lost) ends a command as SIGTERM does: its temp files removed.
TERMINATING = ("SIGTERM", "SIGHUP")


@contextlib.contextmanager
def _sigterm_as_exception():
    """SIGTERM and SIGHUP -> Terminated for the duration (main thread only; elsewhere the defaults stay). A
    signal the caller ignores (`nohup` ignores SIGHUP) stays ignored."""
    previous = {}
    try:
        for name in TERMINATING:
            number = getattr(signal, name, None)
            if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
                previous[number] = signal.signal(number, _on_sigterm)
    except (ValueError, OSError):  # not the main thread
        pass
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _show_error(exc: click.ClickException) -> None:
    """Every error is one `error: ...` line on stderr; a usage error also names the --help to read.

    click's own block (Usage:, Try ..., Error: ...) spans three lines; `bnbwd` alone still prints the help.
    """
    if not isinstance(exc, click.UsageError) or isinstance(exc, click.exceptions.NoArgsIsHelpError):
        exc.show()
        return
    text = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        text += f" (see '{exc.ctx.command_path} --help')"
    echo_error(f"error: {text}")


# Each command's module, imported when the command is looked up: a `bnbwd run` never imports verify's and
# check's modules (the comparison, case files), which it does not use (tests/test_startup.py).
COMMANDS = {"run": "bnbwd_cli.cli.run", "verify": "bnbwd_cli.cli.verify", "check": "bnbwd_cli.cli.check",
            "cases": "bnbwd_cli.cli.cases", "report": "bnbwd_cli.cli.merge"}


class BnbwdGroup(click.Group):
    """Maps failures that are not user errors to one line and a stable exit code; loads commands lazily."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS and name not in self.commands:
            module = importlib.import_module(COMMANDS[name])
            self.add_command(getattr(module, name))
        return super().get_command(ctx, name)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's main, with exit codes that a failing stdout or stderr cannot change, and SIGTERM handled."""
        forget_verdict()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        _escape_unencodable_output()
        with _sigterm_as_exception():
            try:
                try:
                    code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
                    code = code if isinstance(code, int) else ExitCode.OK
                except click.exceptions.Exit as exc:
                    code = exc.exit_code
                _flush_stdout()  # here, not at exit: a closed stdout still gets one line and the verdict's code
            except click.ClickException as exc:
                with contextlib.suppress(OSError, ValueError):
                    _show_error(exc)
                code = exc.exit_code
            except (click.exceptions.Abort, KeyboardInterrupt) as exc:  # Ctrl-C while parsing the command line
                code = _interrupted(exc.__context__ if isinstance(exc, click.exceptions.Abort) else exc)
            except OSError as exc:  # stdout failed at the final flush
                code = _stream_failed(exc)
        sys.exit(code)

    def invoke(self, ctx: click.Context):
        try:
            with warnings.catch_warnings():
                # NumPy's "invalid value encountered" lines are noise: a run counts and reports NaN/Inf itself.
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    return super().invoke(ctx)
                finally:
                    _note_numba_fallback()
        except InputError as exc:
            raise InputFailed(exc) from None
        except MemoryError:
            raise InputFailed(InputError("out of memory", "try --stream (inputs as .npy files) or a smaller --block-size")) from None
        except KeyboardInterrupt as exc:
            ctx.exit(_interrupted(exc))
        except OSError as exc:  # the working directory, a file no reader named, or stdout or stderr
            ctx.exit(_os_failed(exc))
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug in bnbwd: one line, and the traceback on request
            if ctx.params.get("traceback") or os.environ.get("BNBWD_TRACEBACK"):
                from traceback import format_exc  # only on this path: it loads linecache, tokenize, textwrap

                echo_text(format_exc().rstrip())  # and still exit 4: an uncaught exception would exit 1 (mismatch)
            else:
                echo_error(f"error: internal error: {type(exc).__name__}: {exc} (rerun with --traceback)")
            ctx.exit(ExitCode.INTERNAL)


def _note_numba_fallback() -> None:
    """Why numba could not start (its own settings), when a core asked for it: the NumPy core ran instead. Read
    only where runtime.py was imported (a plain `bnbwd --help` loads nothing for it)."""
    runtime = sys.modules.get("bnbwd_cli.runtime")
    for note in getattr(runtime, "NUMBA_FALLBACK", ())[:1]:
        echo_error(f"note: {note}")


def _escape_unencodable_output() -> None:
    """A name that is not UTF-8 (or not in the terminal's encoding) printed as escapes (\\udcff), never a crash:
    stdout is strict under most locales, stderr already escapes."""
    stream = sys.stdout
    if stream is not None and getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        with contextlib.suppress(OSError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def _interrupted(exc: BaseException | None) -> ExitCode:
    if isinstance(exc, Terminated) and exc.signum == getattr(signal, "SIGHUP", None):
        echo_error("error: hung up (SIGHUP); no partial output file is left")
        return ExitCode.HANGUP
    if isinstance(exc, Terminated):
        echo_error("error: terminated (SIGTERM); no partial output file is left")
        return ExitCode.TERMINATED
    echo_error("error: interrupted; no partial output file is left")
    return ExitCode.INTERRUPTED


def _os_failed(exc: OSError) -> int:
    """An OSError that reached the group, said for what it is: a deleted working directory and a file's failure
    are input errors (exit 3) naming their cause; only what names no file is stdout's or stderr's."""
    try:
        os.getcwd()
    except OSError:
        echo_error(f"error: the working directory no longer exists ({reason(exc)}); run bnbwd from one that does")
        return ExitCode.INPUT
    if exc.filename is not None:
        echo_error(f"error: {literal(display(exc.filename))}: {reason(exc)}")
        return ExitCode.INPUT
    return _stream_failed(exc)


def _stream_failed(exc: OSError) -> int:
    """stdout or stderr failed: after a verdict, the report was cut short and the verdict's code stands (one line
    says so); before one, exit 3 (an output that cannot be written), never 1 or 4."""
    silence_stdout()
    code = recorded_verdict()
    if code is not None:
        cause = "its reader closed it" if isinstance(exc, BrokenPipeError) else reason(exc)
        echo_error(f"note: the report on stdout was cut short ({cause}); exit code {code} is the verdict's")
        return code
    if isinstance(exc, BrokenPipeError):  # the reader of stdout went away (`bnbwd run ... -o - | head -c 10`)
        echo_error("error: stdout was closed before bnbwd finished writing to it (broken pipe)")
    else:
        echo_error(f"error: cannot write to stdout or stderr ({reason(exc)})")
    return ExitCode.INPUT


def _flush_stdout() -> None:
    stream = sys.stdout
    if stream is not None:
        stream.flush()


@click.group(cls=BnbwdGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="bnbwd")
@click.option("--traceback", is_flag=True, help="Show a Python traceback on internal errors.")
def main(traceback: bool) -> None:
    """Batch-normalization training backward pass, from tensors on disk.

    \b
    Exit codes: 0 ok, 1 verification mismatch, 2 usage error,
                3 input error (unreadable, malformed or inconsistent input,
                  or an output that cannot be written),
                4 internal error (a bug: rerun with --traceback),
                129 hung up (SIGHUP), 130 interrupted (Ctrl-C),
                143 terminated (SIGTERM).

    \b
    Start with:  bnbwd run --help,  bnbwd verify --help  and  bnbwd check --help
    """
