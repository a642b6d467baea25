"""Committing outputs: one set per command, renamed together at its end, with Ctrl-C, SIGTERM and SIGHUP held
while the renames run. Output sets themselves are files/write.OutputSet; this module holds no file."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable, Iterator, Protocol

from click.exceptions import Exit

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import reason


class Committable(Protocol):
    """What a commit needs of files/write.OutputSet (named here by what it does, so this module imports no writer):
    its renames, done when its group ends, and its temp files' removal; its entries (target, temp file or None,
    stream) name the directories the renames go into (locked meanwhile)."""

    _entries: list[tuple[Path, Path | None, object]]

    def _rename(self) -> None: ...

    def abort(self) -> None: ...


_PENDING_GROUPS: list[list[Committable]] = []  # the open one_commit() blocks, innermost last


@contextlib.contextmanager
def one_commit() -> Iterator[None]:
    """Every OutputSet committed inside the block is renamed at its end, together: a command's outputs and its
    --json report appear as one set or not at all. The block ending normally or in click's Exit (a code chosen
    after the work) commits; any other exception (an error, Ctrl-C, SIGTERM) removes every temp file."""
    group: list[Committable] = []
    _PENDING_GROUPS.append(group)
    try:
        yield
    except BaseException as exc:
        _PENDING_GROUPS.remove(group)
        if isinstance(exc, Exit):  # the command chose its exit code after its work (1: a mismatch; 3: a reference
            _commit_group(group)   # that could not be compared): what it wrote stands, as without the block
        else:
            for outputs in group:
                outputs.abort()
        raise
    _PENDING_GROUPS.remove(group)
    _commit_group(group)


def _commit_group(group: list[Committable]) -> None:
    try:
        with signals_deferred(target.parent for outputs in group for target, temp, _ in outputs._entries if temp):
            for outputs in group:
                outputs._rename()  # the group is OutputSet's own commit, deferred
    except OSError as exc:
        for outputs in group:
            outputs.abort()
        raise BnbwdError(f"output: rename failed ({reason(exc)}); the outputs may be incomplete") from None


DEFERRED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def signals_deferred(renamed_into: Iterable[Path] = ()) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held while the block runs (the renames of an output set), then delivered: the
    set is never left half renamed by them. SIGKILL and power loss cannot be held (docs/guarantees.md). The
    directories `renamed_into` are locked meanwhile (directories_locked): two commands never mix their sets."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        with directories_locked(renamed_into):
            yield  # only the main thread may set handlers
        return
    received: list[int] = []
    previous: dict[int, object] = {}
    try:
        for name in DEFERRED_SIGNALS:
            number = getattr(signal, name, None)
            if number is not None:
                previous[number] = signal.signal(number, lambda signum, frame: received.append(signum))
        with directories_locked(renamed_into):
            yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(received):
            if previous.get(number) is not signal.SIG_IGN:
                signal.raise_signal(number)  # now, with the handler the command had


@contextlib.contextmanager
def directories_locked(directories: Iterable[Path]) -> Iterator[None]:
    """Each directory locked (flock on the directory itself: no lock file is left) while a set is renamed into
    it, so that two commands writing one --out-dir at once rename their sets one after the other and the folder
    holds one command's set, never a mix. In one order (sorted) in every process: no deadlock. Best effort: where
    there is no flock (another OS, a file system without locks) the renames go on unlocked."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    held: list[int] = []
    try:
        for directory in sorted({os.path.abspath(d) for d in directories}) if fcntl else ():
            try:
                fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                continue
            held.append(fd)
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in held:
            os.close(fd)  # closing the descriptor releases its lock
