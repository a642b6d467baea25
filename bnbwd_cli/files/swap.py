"""A finished temp file put in place of its target, atomically: os.replace, or on Linux, when the target is an
existing regular file, an exchange of the two names (renameat2 with RENAME_EXCHANGE) and then the removal of the
old file, which the exchange left under the temp name.

Why: ext4 (with auto_da_alloc, its default) writes a file's data out inside the rename that replaces an existing
file, which can take longer than writing it. An exchange is as atomic (the target names the old file
or the new one at every instant) and does not wait for that. Power loss is what --fsync guards against (the data
are synced before any rename), as before. Where the exchange is not available (another system, a file system
without it, a target that vanished), os.replace does the same job the ordinary way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


def replace(temp: Path, target: Path) -> None:
    """`temp` renamed to `target` (which it replaces), atomically; an OSError as os.replace raises it."""
    if _exchange(temp, target):
        with contextlib.suppress(OSError):  # the new file is in place; the old one is left under the temp name
            os.unlink(temp)
        return
    os.replace(temp, target)


def _exchange(temp: Path, target: Path) -> bool:
    """Whether the two names were exchanged; False, with nothing changed, when the target is not a regular file or
    the exchange is not available."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    try:
        if not stat.S_ISREG(os.lstat(target).st_mode):
            return False
    except OSError:
        return False
    return renameat2(AT_FDCWD, os.fsencode(temp), AT_FDCWD, os.fsencode(target), RENAME_EXCHANGE) == 0


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """glibc's renameat2 (2.28 and later), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function
