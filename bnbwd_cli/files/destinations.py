"""Where outputs may go, vetted before any work: one destination (not empty, not a directory nor a name ending in
'/', in an existing writable directory, no input by name or inode, never a terminal), and --out-dir's directory,
made like `mkdir -p` and removed again when the command fails. cli/destinations.py applies it to every output of a
command; files/write.py writes them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from click.exceptions import Exit

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import display, reason
from bnbwd_cli.files.through import is_terminal, is_write_through


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def vet_destination(target: str | Path, inputs: list[Path], what: str = "output") -> Path:
    """Fail before any work if `target` cannot be written or would overwrite an input. Returns it as a Path."""
    text = os.fspath(target)
    shown = display(text)
    if not text:
        raise BnbwdError(f"{what} '': empty file name")
    path = Path(text)
    if text.endswith(os.sep) or path.is_dir():
        raise BnbwdError(f"{what} {shown}: is a directory, expected a file name")
    for source in inputs:
        if _same_file(path, source) or path.resolve() == source.resolve():
            raise BnbwdError(f"{what} {shown}: is also an input ({display(source)}); refusing to overwrite it")
    if is_write_through(path):
        if is_terminal(path):
            raise BnbwdError(f"{what} {shown}: is a terminal; refusing to write binary data or a report there "
                             "(redirect it to a file)")
        return path
    if path.exists() and not path.is_file():
        raise BnbwdError(f"{what} {shown}: exists and is not a regular file, a FIFO or a character device")
    parent = path.parent
    if not parent.is_dir():
        raise BnbwdError(f"{what} {shown}: directory {display(parent)} does not exist")
    if not os.access(parent, os.W_OK):
        raise BnbwdError(f"{what} {shown}: directory {display(parent)} is not writable")
    return path


@contextlib.contextmanager
def output_directory(path: Path) -> Iterator[Path]:
    """--out-dir DIR: made like `mkdir -p` when missing. The directories it made are removed again (if still
    empty) when the command fails or is interrupted, so that a failed run leaves nothing behind."""
    if path.exists() and not path.is_dir():
        raise BnbwdError(f"output directory {path}: exists and is not a directory")
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BnbwdError(f"output directory {path}: cannot create it ({reason(exc)})") from None
    try:
        yield path
    except BaseException as exc:
        if not (isinstance(exc, Exit) and exc.exit_code in (0, 1)):  # 0 and 1 (mismatch) wrote their outputs
            for directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
        raise
