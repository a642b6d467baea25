"""`python -m bnbwd_cli` and the `bnbwd` script: Ctrl-C while the modules load is exit 130, no traceback.

Two start-up and exit costs that a command does not need are left out here, in the script only (the API, imported
by a user's program, changes nothing of that program):
- NumPy's OpenBLAS starts a pool of threads when numpy is imported, and they spin while the import goes on; on a
  small machine they take a core from the start-up. bnbwd makes no BLAS call a pool speeds up (the judge's 3x3
  solves), so the pool is one thread unless the user's environment sets OPENBLAS_NUM_THREADS.
- Once the command has finished (outputs renamed into place, stdout flushed), the interpreter's teardown frees
  every module and array one by one; the process ends without it (`_exit`), after what that exit would run
  first: the atexit functions, and the flush of stdout and stderr.
"""

import os
import sys


def entry() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from bnbwd_cli.cli import main
    except KeyboardInterrupt:
        try:
            sys.stderr.write("error: interrupted; no partial output file is left\n")
        except (OSError, ValueError, AttributeError):
            pass
        sys.exit(130)  # errors.ExitCode.INTERRUPTED: importing it here could itself be interrupted
    try:
        main(prog_name="bnbwd")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):  # the group's codes are ExitCode, an IntEnum
            _exit_now(int(exc.code or 0))
        raise


def _exit_now(code: int) -> None:
    """End the process with `code` without the interpreter's teardown, when nothing depends on it: no other thread
    is running (a thread pool's workers would be joined first) and this interpreter runs atexit functions the usual
    way. Otherwise returns, and the caller exits normally."""
    import atexit
    import threading

    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_functions is None or threading.active_count() > 1:
        return
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return  # a failing flush: the normal exit reports it as it always has
    os._exit(code)


if __name__ == "__main__":
    entry()
