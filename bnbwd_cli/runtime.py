"""The impure edge of the cores: what the machine and the environment offer, never what the result is.

Loading the optional numba core (its cache directory, OpenMP's wait policy), which core runs
($BNBWD_CORE, numba installed, memory-mapped data), worker threads and the NumPy core's tile budget
(cache sizes from sysfs). core/ asks here and stays the math.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from bnbwd_cli._version import __version__
from bnbwd_cli.files.mapped import file_mappings
from bnbwd_cli.op import Op

CORES = ("auto", "numpy", "numba")
# core="auto" picks numba for src of this many elements or more: below it, importing numba and loading its cached
# kernels (a fixed cost a fresh process pays once) costs more than the compiled core saves in one call, which
# saves a fixed time an element whatever its dtype (the break-even measured: bench/RESULTS.md, "core=auto").
AUTO_NUMBA_MIN_ELEMENTS = 100_000_000

DEFAULT_CACHE_BYTES = 1 << 20  # 1 MiB: a typical per-core L2 when the OS will not say
MIN_BLOCK_BYTES = 4 << 20  # tile budgets measured best on 8 and 32 MiB L3s: see default_block_bytes
# and on a 480 MiB L3, where tiles up to 32 MiB ran faster still (bench/RESULTS.md, 2026-11-26)
MAX_BLOCK_BYTES = 32 << 20

NUMBA_SOURCES = ("numba_kernels.py", "numba_bits.py", "plan.py")  # core/'s files numba_kernels' code is built from


def numba_available() -> bool:
    """Whether the optional compiled core can be used (numba installed); does not import numba."""
    return importlib.util.find_spec("numba") is not None


def choose_core(core: str, op: Op, diff_src: np.ndarray | None) -> str:
    """"numpy" or "numba". auto: numba for in-memory src of AUTO_NUMBA_MIN_ELEMENTS elements or more (its start-up
    costs more below), when installed and supporting the dtype, unless $BNBWD_CORE is "numpy"; memory-mapped data
    stays on the NumPy core (it keeps RSS bounded)."""
    if core == "numpy" or op.src.size == 0:
        return "numpy"
    if core == "auto":
        if os.environ.get("BNBWD_CORE", "").lower() == "numpy" or op.src.size < AUTO_NUMBA_MIN_ELEMENTS:
            return "numpy"
        if file_mappings(op.src, op.diff_dst, diff_src) or not numba_available():
            return "numpy"
    elif not numba_available():
        raise ImportError("core='numba' needs numba: pip install 'bnbwd[fast]'")
    numba_core = usable_numba_core()
    return "numba" if numba_core is not None and numba_core.supports(op.src.dtype) else "numpy"


NUMBA_FALLBACK: list[str] = []  # why numba could not run in this process (at most one reason; the CLI's note)


@functools.lru_cache(maxsize=1)
def usable_numba_core():
    """The numba core, or None when numba's own settings keep it from starting here: NUMBA_NUM_THREADS=0 (numba's
    import fails), a NUMBA_THREADING_LAYER that is not installed (its first parallel launch fails), no home for
    the kernels' cache. The NumPy core gives the same bits, so the run goes on there; NUMBA_FALLBACK says why."""
    try:
        numba_core = load_numba_core()
        from numba.np.ufunc import parallel

        parallel._launch_threads()  # the threading layer, loaded now rather than inside the first kernel
    except Exception as exc:  # numba's settings fail as ValueError, RuntimeError, ImportError, OSError...
        text = " ".join(str(exc).split())
        NUMBA_FALLBACK.append(f"numba cannot start here ({type(exc).__name__}: {text[:200]}); the NumPy core ran "
                              "instead (the same bits, slower)")
        return None
    return numba_core


def numba_judging(elements: int) -> bool:
    """Whether the judge works on diff_src's ``elements`` compiled (the same numbers): the channel facts
    (judge/numba_facts.py), the judging pass with the bias regression's sums (judge/numba_pass.py), the regression's
    sums of the NumPy pass (judge/numba_sums.py). When numba is installed and $BNBWD_CORE is not "numpy", and either
    $BNBWD_CORE is "numba" (so BNBWD_CORE=numba / numpy force it on / off), the numba core has run in this process
    (numba's start-up is paid), or there are AUTO_NUMBA_MIN_ELEMENTS elements or more;
    and numba can start here (its own settings may keep it from it: then the NumPy sums, and NUMBA_FALLBACK's note,
    where the compiled sums' import failed as an internal error)."""
    choice = os.environ.get("BNBWD_CORE", "").lower()
    if choice == "numpy" or not numba_available():
        return False
    wanted = choice == "numba" or "bnbwd_cli.core.numba_core" in sys.modules or elements >= AUTO_NUMBA_MIN_ELEMENTS
    return wanted and usable_numba_core() is not None


def prepare_numba() -> None:
    """numba's settings, before its first import by bnbwd's code.

    Idle OpenMP workers sleep instead of spinning: on a small, shared machine a spinning worker steals the core
    the next kernel launch waits on, and a launch waits many times its own length. numba reads OMP_WAIT_POLICY when
    it starts its pool, so the default is set here, where numba is chosen; an explicit setting wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = str(numba_cache_dir())
        if "numba" in sys.modules:
            # numba read its settings when it was imported (by the user's own code, or a test module): without a
            # reload our kernels cached beside the installed source, missed the user cache every run and compiled
            # again: every fresh process paid the whole JIT.
            from numba.core import config

            config.reload_config()


def load_numba_core():
    """The numba core module, imported on first use (numba's settings: prepare_numba)."""
    prepare_numba()
    from bnbwd_cli.core import numba_core

    return numba_core


def numba_cache_dir() -> Path:
    """Where the compiled kernels are cached: a user cache directory keyed by numba's version and the bytes of
    the compiled code's source files.

    numba's default, __pycache__ beside the installed source, goes with every reinstall (and may not be
    writable); a directory outside the package keeps the kernels across a reinstall of the same code. numba
    checks only the file a cached function is defined in (numba_kernels.py), not plan.py whose arithmetic
    it compiles in: the digest of both in the name makes an edit to either start a fresh cache instead of
    loading stale kernels. Set (before numba is first imported) only when the user has not set NUMBA_CACHE_DIR.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        numba_version = version("numba")
    except PackageNotFoundError:
        numba_version = "unknown"
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except (RuntimeError, KeyError):  # no HOME and no passwd entry (a bare container's uid)
        base = Path()
    if not base.is_absolute():  # HOME="" would put the cache in the working directory
        raise RuntimeError("no directory for the compiled kernels' cache: set HOME, XDG_CACHE_HOME or "
                           "NUMBA_CACHE_DIR")
    return base / "bnbwd" / f"numba-cache-{__version__}-numba-{numba_version}-{_compiled_source_digest()}"


def _compiled_source_digest() -> str:
    """A short hash of every source file the numba kernels are compiled from."""
    import hashlib

    digest = hashlib.sha256()
    for name in NUMBA_SOURCES:
        digest.update((Path(__file__).parent / "core" / name).read_bytes())
    return digest.hexdigest()[:12]


@functools.lru_cache(maxsize=1)  # sysfs is read once a process: every plan asks, and the caches do not change
def cache_sizes() -> dict[int, int]:
    """Data/unified cache size in bytes by level, from sysfs (Linux); empty elsewhere."""
    cache_dir = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = {}
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            sizes[level] = int(text.rstrip("KMG")) * scale
    return sizes


def default_block_bytes(threads: int) -> int:
    """Working-set budget of one tile (src, diff_dst, diff_src and scratch all count): half the thread's
    share of the last-level cache, but never under MIN_BLOCK_BYTES nor over MAX_BLOCK_BYTES.

    Small tiles pay per-call overhead (a tile is ~20 NumPy calls); big ones fall out of cache between the
    reduce and the write pass. Half the share is big enough that a whole f32 channel plane and its float64
    scratch fit one tile, so both passes fuse (3 tensor passes over memory, not 5). The measurements on a
    32 MiB and an 8 MiB L3 are in bench/RESULTS.md ("Core A/B after the reproducible core"); on a 480 MiB L3
    bigger tiles than 8 MiB were faster still (fewer calls; the L3 holds them), up to 32 MiB.
    """
    sizes = cache_sizes()
    last_level = sizes[max(sizes)] if sizes else DEFAULT_CACHE_BYTES * 8
    shared = max(sizes, default=0) >= 3  # an L3 is shared by the cores; L1/L2 are per core
    share = last_level // max(threads, 1) if shared else last_level
    return int(min(max(share // 2, MIN_BLOCK_BYTES), MAX_BLOCK_BYTES))


def usable_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)
