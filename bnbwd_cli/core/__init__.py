"""The math of batch-norm training backward, pure: arrays in, arrays out (no files, no terminal).

backward(op, settings) checks the call, builds the Problem both cores share (the (N, C, S) views,
float64 per-channel mean, invstd and scale, the count, and the reduction order of core/plan.py),
picks a core and runs it:

- core/numpy_core.py: blocked NumPy, always available;
- core/numba_core.py: the optional compiled core (numba), imported only when chosen;
- core/reference.py: the plain float64 oracle the tests compare both with.

Both cores compute in float64 and round once to the output dtype, and both sum in the one order the
shape fixes, so their outputs are the same bits for any thread count, block size, streaming or core
(docs/guarantees.md, "Accuracy and reproducibility of the reference").
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from bnbwd_cli.core import mapped, numpy_core, plan
from bnbwd_cli.core.budget import default_block_bytes, usable_cores
from bnbwd_cli.core.rounding import round_to
from bnbwd_cli.core.stats import OutputStats, from_extremes, scan
from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.layout import channel_axis, view3

CORES = ("auto", "numpy", "numba")
OUTPUT_NAMES = ("diff_src", "diff_gamma", "diff_beta")
# core="auto" picks numba for inputs this big only. Measured per fresh process (a `bnbwd run` calls the core once),
# f32 (N,128,56,56) both layouts, 2 threads, warm on-disk cache, best of 3 (a busy 2-core EPYC, so ~2x a quiet
# machine's times): import numba + cached-kernel load + first call ~1.0-1.3 s at N=1 vs 16-33 ms for the NumPy core;
# each further MB of src costs the NumPy core 7.6-10 ms and numba 3.8-5.8 ms (first call: fresh pages included),
# so numba breaks even at 260-290 MB. Below 256 MiB, core="numba" opts in.
AUTO_NUMBA_MIN_BYTES = 256 << 20

ProgressCallback = Callable[[int, int], None]  # (elements done, elements in all)


@dataclass(frozen=True)
class Op:
    """The op's inputs. src, diff_dst: (N, C, X...) for NCX or (N, X..., C) for NXC, same dtype T1
    (f16/bf16/f32/f64); mean, variance, gamma: (C,), dtype T2 (gamma None means 1). With
    variance_is_invstd the variance array holds 1/sqrt(var + eps) and epsilon is not used.
    training=False is TF's is_training=False: diff_src = gamma·invstd·diff_dst."""

    src: np.ndarray
    diff_dst: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    gamma: np.ndarray | None = None
    _: KW_ONLY
    epsilon: float
    data_format: str
    training: bool = True
    variance_is_invstd: bool = False


@dataclass(frozen=True)
class Settings:
    """How to run, never what comes out: outputs to compute, an optional preallocated C-contiguous diff_src
    (e.g. a memmap), the NumPy core's tile budget in bytes, worker threads, a progress callback, the core."""

    outputs: Sequence[str] = OUTPUT_NAMES
    diff_src_out: np.ndarray | None = None
    block_bytes: int | None = None
    threads: int | None = None
    progress: ProgressCallback | None = None
    core: str = "auto"


@dataclass(frozen=True)
class BackwardResult:
    """diff_src has src's shape and dtype; diff_gamma/diff_beta are (C,) in the stats dtype. None = not asked for.

    core: the core that ran ("numpy" or "numba"). stats: each output's min/max over finite values and NaN/Inf
    count (core/stats.py), diff_src's gathered in the write pass.
    """

    diff_src: np.ndarray | None
    diff_gamma: np.ndarray | None
    diff_beta: np.ndarray | None
    core: str = "numpy"
    stats: dict[str, OutputStats] = field(default_factory=dict)


@dataclass(frozen=True)
class Problem:
    """What both cores read: C-contiguous (N, C, S) views, float64 (C,) per-channel values, the reduction order.

    scale = gamma·invstd, or its mantissa when scale_exp is not None (then scale·2**scale_exp, see
    plan.split_scale). need_sums: the cores must form Σdy and Σdy·(src - mean).
    """

    src3: np.ndarray
    dy3: np.ndarray
    out3: np.ndarray | None
    mean: np.ndarray
    invstd: np.ndarray
    scale: np.ndarray
    scale_exp: np.ndarray | None
    count: int
    training: bool
    need_sums: bool
    geometry: plan.Geometry = field(repr=False)


def numba_available() -> bool:
    """Whether the optional compiled core can be used (numba installed); does not import numba."""
    return importlib.util.find_spec("numba") is not None


def channel_invstd(variance: np.ndarray, epsilon: float, variance_is_invstd: bool) -> np.ndarray:
    """1/sqrt(variance + epsilon) per channel, in float64."""
    variance64 = to_float64(variance)
    return variance64 if variance_is_invstd else 1.0 / np.sqrt(variance64 + epsilon)


def _check(op: Op, settings: Settings) -> None:
    if settings.core not in CORES:
        raise ValueError(f"core must be one of {CORES}, got {settings.core!r}")
    unknown = set(settings.outputs) - set(OUTPUT_NAMES)
    if unknown:
        raise ValueError(f"unknown outputs {sorted(unknown)}; expected some of {OUTPUT_NAMES}")
    if op.diff_dst.shape != op.src.shape or op.diff_dst.dtype != op.src.dtype:
        raise ValueError(f"diff_dst {op.diff_dst.shape} {op.diff_dst.dtype} differs from src {op.src.shape} {op.src.dtype}")
    channels = op.src.shape[channel_axis(op.data_format, op.src.ndim)]
    for name in ("mean", "variance", "gamma"):
        array = getattr(op, name)
        if array is not None and array.shape != (channels,):
            raise ValueError(f"{name} has shape {array.shape}, expected ({channels},)")
    out = settings.diff_src_out
    if out is not None and (out.shape != op.src.shape or out.dtype != op.src.dtype or not out.flags.c_contiguous):
        raise ValueError("diff_src_out must be a C-contiguous array of src's shape and dtype")


def _problem(op: Op, diff_src: np.ndarray | None, need_sums: bool) -> Problem:
    src3 = view3(np.ascontiguousarray(op.src), op.data_format)  # Fortran-ordered or strided input: one copy
    dy3 = view3(np.ascontiguousarray(op.diff_dst), op.data_format)
    invstd = channel_invstd(op.variance, op.epsilon, op.variance_is_invstd)
    gamma = to_float64(op.gamma) if op.gamma is not None else np.ones_like(invstd)
    scale, scale_exp = plan.split_scale(gamma, invstd)
    n, c, s = src3.shape
    return Problem(src3, dy3, view3(diff_src, op.data_format) if diff_src is not None else None,
                   to_float64(op.mean), invstd, scale, scale_exp, n * s, op.training, need_sums, plan.geometry(n, c, s))


def choose_core(core: str, op: Op, diff_src: np.ndarray | None) -> str:
    """"numpy" or "numba". auto: numba for in-memory src of AUTO_NUMBA_MIN_BYTES or more (its start-up costs more
    below), when installed and supporting the dtype, unless $BNBWD_CORE is "numpy"; memory-mapped data stays
    on the NumPy core (it keeps RSS bounded)."""
    if core == "numpy" or op.src.size == 0:
        return "numpy"
    if core == "auto":
        if os.environ.get("BNBWD_CORE", "").lower() == "numpy" or op.src.nbytes < AUTO_NUMBA_MIN_BYTES:
            return "numpy"
        if mapped.file_mappings(op.src, op.diff_dst, diff_src) or not numba_available():
            return "numpy"
    elif not numba_available():
        raise ImportError("core='numba' needs numba: pip install 'bnbwd[fast]'")
    return "numba" if load_numba_core().supports(op.src.dtype) else "numpy"


NUMBA_SOURCES = ("numba_kernels.py", "numba_bits.py", "plan.py")  # the files numba_kernels' compiled code is built from


def load_numba_core():
    """The numba core module, imported on first use.

    Idle OpenMP workers sleep instead of spinning: on a small, shared machine a spinning worker steals the core
    the next kernel launch waits on (measured: 0.15 ms launches became 4-8 ms). numba reads OMP_WAIT_POLICY when
    it starts its pool, so the default is set here, where the numba core is chosen; an explicit setting wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = str(numba_cache_dir())
        if "numba" in sys.modules:
            # numba read its settings when it was imported (by the user's own code, or a test module): without a
            # reload our kernels cached beside the installed source, missed the user cache every run and compiled
            # again (the cold test suite paid the whole JIT twice, +55 s).
            from numba.core import config

            config.reload_config()
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

    from bnbwd_cli import __version__

    try:
        numba_version = version("numba")
    except PackageNotFoundError:
        numba_version = "unknown"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "bnbwd" / f"numba-cache-{__version__}-numba-{numba_version}-{_compiled_source_digest()}"


def _compiled_source_digest() -> str:
    """A short hash of every source file the numba kernels are compiled from."""
    import hashlib

    digest = hashlib.sha256()
    for name in NUMBA_SOURCES:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:12]


def backward(op: Op, settings: Settings = Settings()) -> BackwardResult:
    """Batch-norm training backward: diff_src (T1, src's shape) and diff_gamma, diff_beta (T2, the dtype of mean)
    for the names in settings.outputs. Inputs are assumed validated (spec.validate_inputs); this checks only
    that the arrays fit together. Every output is computed in float64 and rounded once."""
    _check(op, settings)
    want_diff_src = "diff_src" in settings.outputs
    want_sums = "diff_gamma" in settings.outputs or "diff_beta" in settings.outputs
    diff_src = None
    if want_diff_src:
        diff_src = settings.diff_src_out if settings.diff_src_out is not None else np.empty(op.src.shape, op.src.dtype)
    problem = _problem(op, diff_src, want_sums or (op.training and want_diff_src))
    threads = settings.threads or usable_cores()
    ran = choose_core(settings.core, op, diff_src)
    sums, extremes = np.zeros((2, problem.geometry.c)), None
    if op.src.size and ran == "numba":
        sums, extremes = load_numba_core().run(problem, threads)
        if settings.progress is not None:
            settings.progress(op.src.size, op.src.size)
    elif op.src.size:
        sums, extremes = numpy_core.run(problem, settings.block_bytes or default_block_bytes(threads), threads,
                                        settings.progress)
    with np.errstate(over="ignore", invalid="ignore"):
        _, _, dy_xhat = plan.coefficients(sums[0], sums[1], problem.invstd, max(problem.count, 1))
    param_dtype = op.mean.dtype
    outputs = {"diff_src": diff_src,
               "diff_gamma": round_to(dy_xhat, param_dtype) if "diff_gamma" in settings.outputs else None,
               "diff_beta": round_to(sums[0], param_dtype) if "diff_beta" in settings.outputs else None}
    summary = {name: scan(array) for name, array in outputs.items() if array is not None and name != "diff_src"}
    if diff_src is not None:
        summary["diff_src"] = from_extremes(*(extremes or (np.nan, np.nan)), diff_src)
    return BackwardResult(**outputs, core=ran, stats=summary)
