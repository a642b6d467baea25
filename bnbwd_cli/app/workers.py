"""Worker processes for `check --jobs`: as many as the machine's limits let start, each ending with its parent.

A pool asked for more workers than the open-file limit (about two descriptors a worker in the parent) or the
process limit (`ulimit -u`, a container's pids limit) allows starts the workers that fit, and says so in one note
naming the limit and a --jobs that fits; when not even two fit, the cases are judged in this process. A failed
start never leaves a worker behind (the interpreter would wait for it at exit: the hang of issue 35).

A worker ends with its parent: on Linux the kernel kills it when the parent dies (prctl PR_SET_PDEATHSIG, set as
the worker starts, then the parent's pid checked once against the race where the parent died first); elsewhere a
watchdog thread checks the parent's pid every second. So a `check` killed by SIGKILL (the OOM killer, a CI
runner's timeout) or SIGHUP leaves no worker holding its output pipe.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from bnbwd_cli.files.common import reason

# Measured (Linux, CPython 3.11, fork): a pool holds 6 descriptors in the parent and 2 more per worker.
POOL_FDS, FDS_PER_WORKER = 6, 2
# Left free for what the parent opens while the workers run (--json's temp file, stdout) and for the files a
# worker opens (it inherits its siblings' pipes, so it holds about as many as the parent).
RESERVE_FDS = 24
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCHDOG_PERIOD = 1.0  # seconds between a worker's checks of its parent's pid, where there is no prctl


@dataclass(frozen=True)
class Pool:
    """A started pool (None: judge in this process) and, when fewer workers started than asked, the note why."""

    executor: ProcessPoolExecutor | None
    workers: int
    note: str | None = None
    processes: list = field(default_factory=list)  # the executor's worker processes, as it started them


def start_pool(asked: int, asked_text: str) -> Pool:
    """A pool of at most `asked` workers, every one started now; fewer when a limit stops them (with a note)."""
    workers, limit = min(asked, _descriptors_fit()), OPEN_FILES
    while workers >= 2:
        context = _TrackedContext()
        try:
            return Pool(_started(workers, context), workers, _fewer(asked, asked_text, workers, limit),
                        context.processes)
        except OSError as exc:
            started, limit = _reap(context.processes), _limit_name(exc)
            workers = min(started, workers - 1)
    return Pool(None, 1, _fewer(asked, asked_text, 1, limit))


def results(pool: Pool, function: Callable, *arguments: Iterable) -> Iterator:
    """pool.executor.map(function, *arguments), in order; when the caller stops early (an error, Ctrl-C, SIGTERM,
    SIGHUP) the queued work is dropped and the workers are killed, not waited for."""
    try:
        yield from pool.executor.map(function, *arguments)
    except BaseException:
        pool.executor.shutdown(wait=False, cancel_futures=True)
        _reap(pool.processes)
        raise
    pool.executor.shutdown()


class _TrackedContext:
    """A start method's context that records every process it makes: a pool's own workers, so that a failed
    start or an early stop kills them and never the other children of the process (an API user's own)."""

    def __init__(self) -> None:
        import multiprocessing

        # fork where there is one: a worker starts in milliseconds with bnbwd already imported
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        self._context = multiprocessing.get_context(method)
        self.processes: list = []

    def __getattr__(self, name: str):  # the queues, get_start_method, ...: the context's own
        return getattr(self._context, name)

    def Process(self, *args, **kwargs):  # the name ProcessPoolExecutor calls
        process = self._context.Process(*args, **kwargs)
        self.processes.append(process)
        return process


def _started(workers: int, context: _TrackedContext) -> ProcessPoolExecutor:
    """A pool whose workers have all started (fork starts them at the first task; a no-op task starts them now)."""
    executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_end_with_parent,
                                   initargs=(os.getpid(),))
    try:
        executor.submit(int).result()
    except BaseException:
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    return executor


def _reap(processes: list) -> int:
    """Kill and wait for a pool's workers (none may outlive it, nor another process be touched); how many had
    started."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        process.kill()
    for process in started:
        process.join()
    return len(started)


def _descriptors_fit() -> int:
    """How many workers the open-file limit leaves room for, beside the descriptors already open."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        open_now = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except (ImportError, OSError):
        return 1 << 30  # no way to know: starting says
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(0, (soft - open_now - POOL_FDS - RESERVE_FDS) // FDS_PER_WORKER)


def _limit_name(exc: OSError) -> str:
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return OPEN_FILES
    if exc.errno == errno.EAGAIN:
        return PROCESSES
    return f"the system's resources ({reason(exc)})"


OPEN_FILES, PROCESSES = "the open-file limit", "the process limit"
_ULIMIT = {OPEN_FILES: ("-n", "RLIMIT_NOFILE"), PROCESSES: ("-u", "RLIMIT_NPROC")}


def _fewer(asked: int, asked_text: str, workers: int, limit: str) -> str | None:
    """The note when fewer workers start than asked: which limit, and a --jobs that fits."""
    if workers >= asked:
        return None
    if workers <= 1:
        return f"{asked_text}: no worker process could start ({_shown(limit)}); the cases are judged in this " \
               f"process, as with --jobs 1"
    return f"{asked_text}: {workers} worker processes started ({_shown(limit)}); --jobs {workers} fits"


def _shown(limit: str) -> str:
    """The limit as the shell sets it: `the open-file limit, ulimit -n 40`."""
    flag, name = _ULIMIT.get(limit, (None, None))
    try:
        import resource

        soft = resource.getrlimit(getattr(resource, name))[0] if name else None
    except (ImportError, OSError, AttributeError, TypeError):
        soft = None
    if soft is None:
        return limit
    return f"{limit}, ulimit {flag} {'unlimited' if soft == resource.RLIM_INFINITY else soft}"


def _end_with_parent(parent: int) -> None:
    """A worker's first act: die with its parent (SIGKILL: a worker holds nothing to clean up), even if the
    parent is already gone. The signals a terminal sends the whole group end it at once, quietly: the parent
    reports them."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    if not _death_signal(signal.SIGKILL):
        threading.Thread(target=_watch_parent, args=(parent, os._exit), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the death signal was set
        os._exit(1)


def _death_signal(signum: int) -> bool:
    """prctl(PR_SET_PDEATHSIG): the kernel sends signum when the parent dies (Linux only); False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, end: Callable[[int], None]) -> None:
    import time

    while os.getppid() == parent:
        time.sleep(WATCHDOG_PERIOD)
    end(1)
