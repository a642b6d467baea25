"""A failing kernel's `run --reference` in one fresh process, its CPU split by phase, without a profiler.

    python -m bench.failing_phases OUT.json run --src ... --reference KERNEL_OUT [--json REPORT] ...

Runs `bnbwd` (as `python -m bnbwd_cli` does) with the arguments after OUT.json and writes OUT.json: the CPU
seconds (time.process_time: every thread of the process) spent in each phase below, the whole process's, and
"other" (what no phase claims: click, reading the kernel's files' headers, orchestration). A phase is the time
spent inside its functions less what nested phases took there (so the phases add up to the whole): the judging
pass's channel facts are not the judging pass's, an import inside the diagnosis is an import. cProfile charges
each Python call a few microseconds, which inflates the call-heavy phases (the diagnosis, rich's tables) several
times over; these wrappers cost microseconds per phase entered. bench/diagnosis_cost.py prints a row per bug.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import json
import os
import sys
import threading
import time
from collections import defaultdict

# phase -> the functions (module, name) whose CPU it is, in the order a failing run reaches them
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "read inputs": (("bnbwd_cli.app.run", "prepare"),),
    "core": (("bnbwd_cli.app.run", "compute"),),
    "read kernel": (("bnbwd_cli.app.run", "kernel_under_test"),),
    # the arrays' data, wherever read: the inputs, and the kernel's outputs (read on first use, in the judging)
    "reading files": (("bnbwd_cli.files.read", "_read_npy_path"), ("bnbwd_cli.files.read", "read_npz_key"),
                      ("bnbwd_cli.files.read", "read_safetensors")),
    "channel facts": (("bnbwd_cli.judge.model", "channel_facts"),),
    "judging": (("bnbwd_cli.judge.sets", "_compare_pair"),),
    # diff_src's bias regression: with two threads a pass on a thread of its own, beside the channel facts and the
    # judging pass (its CPU there is that thread's, taken out of whatever the main thread did meanwhile)
    "regression sums": (("bnbwd_cli.judge.diff_src", "_regression_pass"), ("bnbwd_cli.judge.diff_src", "_unmoved_pass")),
    "where, heat map": (("bnbwd_cli.judge.detail_stats", "localize"), ("bnbwd_cli.judge.detail_stats", "heat_map"),
                        ("bnbwd_cli.judge.detail_stats", "_above")),
    "diagnosis": (("bnbwd_cli.judge.diagnosis", "diagnose"),),
    "precision hints": (("bnbwd_cli.judge.hints", "precision_hints"),),
    "DAZ scan": (("bnbwd_cli.judge.daz", "inputs_read_as_zero"),),
    "text report": (("bnbwd_cli.render.text", "render_report"),),
    "JSON": (("bnbwd_cli.render.json", "report_document"), ("bnbwd_cli.render.json", "document_text")),
    "--save-error": (("bnbwd_cli.cli.show", "save_errors"),),
}
SHOWN = ("startup", "imports", *PHASES, "other")  # startup: the interpreter's own, before this module runs


class Clock:
    """CPU seconds per phase, each less its nested phases'. A phase's function called on another thread (a side
    call: diff_src's regression beside the facts and the judging pass) is timed by that thread's own clock, and
    its CPU is taken out of the main thread's phases that ran meanwhile; any other thread's CPU (the core's pool)
    is part of the main thread's phase that started it."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._nested: list[float] = []
        self._main = threading.get_ident()
        self._lock = threading.Lock()
        self._side_done = 0.0  # CPU of the side calls that have returned
        self._side_live: dict[int, tuple[int, float]] = {}  # thread -> (its CPU clock, its CPU when the call began)

    def _cpu(self) -> float:
        """The process's CPU less the side calls'."""
        with self._lock:
            side = self._side_done + sum(time.clock_gettime(clock) - began for clock, began in self._side_live.values())
            return time.process_time() - side

    def inside(self, phase: str, function, args, kwargs):
        if threading.get_ident() != self._main:
            return self._aside(phase, function, args, kwargs)
        started = self._cpu()
        self._nested.append(0.0)
        try:
            return function(*args, **kwargs)
        finally:
            total = self._cpu() - started
            self.spent[phase] += total - self._nested.pop()
            if self._nested:
                self._nested[-1] += total

    def _aside(self, phase: str, function, args, kwargs):
        thread = threading.get_ident()
        with self._lock:
            nested = thread in self._side_live  # then part of the side call it is in
            if not nested:
                self._side_live[thread] = (time.pthread_getcpuclockid(thread), time.thread_time())
        if nested:
            return function(*args, **kwargs)
        try:
            return function(*args, **kwargs)
        finally:
            with self._lock:
                spent = time.thread_time() - self._side_live.pop(thread)[1]
                self._side_done += spent
                self.spent[phase] += spent


def _timed(clock: Clock, phase: str, function):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        return clock.inside(phase, function, args, kwargs)
    return timed


def _time_imports(clock: Clock) -> None:
    """Every import that loads something counts as "imports" (one already loaded passes straight through)."""
    plain_import, import_module = builtins.__import__, importlib.import_module

    def loaded(name, fromlist, level) -> bool:
        module = sys.modules.get(name) if level == 0 else None
        return module is not None and all(hasattr(module, item) for item in fromlist or () if item != "*")

    def timed_import(name, globals=None, locals=None, fromlist=(), level=0):
        if loaded(name, fromlist, level):
            return plain_import(name, globals, locals, fromlist, level)
        return clock.inside("imports", plain_import, (name, globals, locals, fromlist, level), {})

    builtins.__import__ = timed_import
    importlib.import_module = lambda name, package=None: (
        import_module(name, package) if name in sys.modules else clock.inside("imports", import_module, (name, package), {}))


def instrument(clock: Clock) -> None:
    """Wrap every phase's functions wherever a bnbwd_cli module holds them (imported here first: their import is
    an import, and modules imported later bind the wrapped functions)."""
    _time_imports(clock)
    wrapped = {}
    for phase, functions in PHASES.items():
        for module_name, name in functions:
            module = importlib.import_module(module_name)
            function = getattr(module, name)
            wrapped[id(function)] = (function, _timed(clock, phase, function))
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("bnbwd_cli") and module is not None:
            for attribute, value in list(vars(module).items()):
                if id(value) in wrapped and wrapped[id(value)][0] is value:
                    setattr(module, attribute, wrapped[id(value)][1])


def main() -> None:
    startup = time.process_time()
    target, args = sys.argv[1], sys.argv[2:]
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bnbwd_cli/__main__.py
    clock = Clock()
    clock.spent["startup"] = startup
    instrument(clock)
    from bnbwd_cli.cli import main as cli

    code = 0
    try:
        cli(args, prog_name="bnbwd")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    total = time.process_time()
    clock.spent["other"] = total - sum(clock.spent.values())
    with open(target, "w") as out:
        json.dump({"total": total, "exit": code, **{phase: clock.spent.get(phase, 0.0) for phase in SHOWN}}, out)
    sys.stdout.flush()
    os._exit(code)  # as bnbwd_cli/__main__.py: no teardown


if __name__ == "__main__":
    main()
