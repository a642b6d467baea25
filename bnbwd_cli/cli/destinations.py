"""Every command's outputs vetted before any work, by one rule (run, verify, check, report): a name that resolves
to stdout ('-', /dev/stdout, /dev/fd/1, /proc/self/fd/1) is stdout, and two there are a usage error; every other
must be writable, no input, and named once (FIFOs and devices may be named twice: nothing is replaced there).

Click only in its errors: the checks of one destination are files/destinations.vet_destination's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

DATA_FLAGS = ("-o", "--out-dir")  # run's arrays: their messages say "output", as they always have
FILE_ONLY = ("--save-error",)  # arrays for a program, never a stream


@dataclass(frozen=True)
class Destinations:
    """A command's outputs, vetted: its data files (run's -o or --out-dir's .npy files), its reports by flag
    ('-' for one that resolves to stdout) and whether stdout is taken (then the text report goes to stderr)."""

    files: list = field(default_factory=list)
    reports: dict = field(default_factory=dict)
    stdout_busy: bool = False

    @property
    def json_target(self) -> str | None:
        return self.reports.get("--json")


def vet_outputs(named: Sequence[tuple[str, str | Path | None]], inputs: list) -> Destinations:
    """named: (flag, target) pairs in the command line's order, e.g. ("-o", "-"), ("--out-dir", DIR/NAME.npy),
    ("--json", PATH), ("--junit", "-"), ("--save-error", PATH); a None target was not asked for. inputs: every file
    the command reads."""
    from bnbwd_cli.files.destinations import vet_destination
    from bnbwd_cli.files.through import is_stdout, is_write_through

    named = [(flag, target) for flag, target in named if target is not None]
    on_stdout = [f"{flag} {target}" for flag, target in named if is_stdout(target)]
    for flag, target in named:
        if flag in FILE_ONLY and is_stdout(target):
            raise click.UsageError(f"{flag} {target}: the arrays go to a file; give {flag} FILE.npz")
    if len(on_stdout) > 1:
        raise click.UsageError(f"{' and '.join(on_stdout)} both want stdout; send one to a file")
    files: list[tuple[str, Path]] = []
    for flag, target in named:
        if str(target) == "-" or (flag not in DATA_FLAGS and is_stdout(target)):  # run's -o /dev/stdout: a file
            continue
        path = vet_destination(target, inputs, "output" if flag in DATA_FLAGS else flag)
        for other_flag, other in files:
            if path.resolve() == other.resolve() and not is_write_through(path):
                raise click.UsageError(f"{flag} {target} is also another output of this command ({other_flag}); "
                                       "give each output its own file")
        files.append((flag, path))
    reports = {flag: "-" if is_stdout(target) else str(target) for flag, target in named if flag not in DATA_FLAGS}
    return Destinations([path for flag, path in files if flag in DATA_FLAGS], reports, bool(on_stdout))
