"""The math of batch-norm training backward, pure: arrays in, arrays out (no files, no terminal).

backward(op, settings) checks the call, builds the Views both cores share (the (N, C, S) views,
float64 per-channel mean, invstd and scale, the count, and the reduction order of core/plan.py),
picks a core and runs it (which core, how many threads and the tile budget are the machine's: runtime.py):

- core/numpy_core.py: blocked NumPy, always available;
- core/numba_core.py: the optional compiled core (numba), imported only when chosen;
- core/reference.py: the plain float64 oracle the tests compare both with.

Both cores compute in float64 and round once to the output dtype, and both sum in the one order the
shape fixes, so their outputs are the same bits for any thread count, block size, streaming or core
(docs/guarantees.md, "Accuracy and reproducibility of the reference").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from bnbwd_cli import runtime
from bnbwd_cli.core import numpy_core, plan
from bnbwd_cli.core.rounding import round_to
from bnbwd_cli.core.summary import OutputStats, from_extremes, scan
from bnbwd_cli.core.views import Views
from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.layout import channel_axis, view3
from bnbwd_cli.op import Op

OUTPUT_NAMES = ("diff_src", "diff_gamma", "diff_beta")

ProgressCallback = Callable[[int, int], None]  # (elements done, elements in all)


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
    count (core/summary.py), diff_src's gathered in the write pass.
    """

    diff_src: np.ndarray | None
    diff_gamma: np.ndarray | None
    diff_beta: np.ndarray | None
    core: str = "numpy"
    stats: dict[str, OutputStats] = field(default_factory=dict)


def channel_invstd(variance: np.ndarray, epsilon: float, variance_is_invstd: bool) -> np.ndarray:
    """1/sqrt(variance + epsilon) per channel, in float64."""
    variance64 = to_float64(variance)
    return variance64 if variance_is_invstd else 1.0 / np.sqrt(variance64 + epsilon)


def _check(op: Op, settings: Settings) -> None:
    if settings.core not in runtime.CORES:
        raise ValueError(f"core must be one of {runtime.CORES}, got {settings.core!r}")
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


def _views(op: Op, diff_src: np.ndarray | None, need_sums: bool) -> Views:
    src3 = view3(np.ascontiguousarray(op.src), op.data_format)  # Fortran-ordered or strided input: one copy
    dy3 = view3(np.ascontiguousarray(op.diff_dst), op.data_format)
    invstd = channel_invstd(op.variance, op.epsilon, op.variance_is_invstd)
    gamma = to_float64(op.gamma) if op.gamma is not None else np.ones_like(invstd)
    scale, scale_exp = plan.split_scale(gamma, invstd)
    n, c, s = src3.shape
    return Views(src3, dy3, view3(diff_src, op.data_format) if diff_src is not None else None,
                   to_float64(op.mean), invstd, scale, scale_exp, n * s, op.training, need_sums, plan.geometry(n, c, s))


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
    views = _views(op, diff_src, want_sums or (op.training and want_diff_src))
    threads = settings.threads or runtime.usable_cores()
    ran = runtime.choose_core(settings.core, op, diff_src)
    sums, extremes = np.zeros((2, views.geometry.c)), None
    if op.src.size and ran == "numba":
        sums, extremes = runtime.load_numba_core().run(views, threads)
        if settings.progress is not None:
            settings.progress(op.src.size, op.src.size)
    elif op.src.size:
        sums, extremes = numpy_core.run(views, settings.block_bytes or runtime.default_block_bytes(threads), threads,
                                        settings.progress)
    with np.errstate(over="ignore", invalid="ignore"):
        _, _, dy_xhat = plan.coefficients(sums[0], sums[1], views.invstd, max(views.count, 1))
    param_dtype = op.mean.dtype
    outputs = {"diff_src": diff_src,
               "diff_gamma": round_to(dy_xhat, param_dtype) if "diff_gamma" in settings.outputs else None,
               "diff_beta": round_to(sums[0], param_dtype) if "diff_beta" in settings.outputs else None}
    summary = {name: scan(array) for name, array in outputs.items() if array is not None and name != "diff_src"}
    if diff_src is not None:
        summary["diff_src"] = from_extremes(*(extremes or (np.nan, np.nan)), diff_src)
    return BackwardResult(**outputs, core=ran, stats=summary)
