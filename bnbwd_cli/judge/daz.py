"""Subnormal inputs read as zero (DAZ: x86 fast-math's denormals-are-zero, CUDA's -ftz for float32 operands).

A correct float32 kernel built that way computes the op of its inputs with every subnormal one replaced by zero.
Where the inputs hold none, it is the op itself; where they do, its outputs may differ from bnbwd's by far more
than rounding (a channel whose diff_dst is all subnormal has diff_beta 0 in the kernel, ~1e-37 in the reference).
The policy (docs/tolerances.md, "Subnormals"): such a kernel passes, with a note, unless --no-ftz; so a run that
fails is judged once more against the op of the flushed inputs, and when that passes, that judgement is the run's.

Pure: the op in, the op of the flushed inputs out (None when no input is subnormal); which judgement stands.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bnbwd_cli.dtypes import SMALLEST_NORMAL, dtype_name
from bnbwd_cli.op import Op

INPUTS = ("src", "diff_dst", "mean", "variance", "gamma")


def _threshold(dtype: np.dtype) -> float:
    """The magnitude below which a value is read as zero: float64 data computes in float64, the rest in float32
    (a float16 value below float16's smallest normal is a normal float32 once loaded: only float32's subnormals
    are flushed)."""
    return SMALLEST_NORMAL["f64"] if dtype_name(dtype) == "f64" else SMALLEST_NORMAL["f32"]


def _flushed(array: np.ndarray) -> np.ndarray | None:
    """The array with its subnormal values as zero, or None when it holds none."""
    below = _threshold(array.dtype)
    magnitude = np.abs(array)
    subnormal = (magnitude < below) & (magnitude > 0)
    if not subnormal.any():
        return None
    flushed = array.copy()
    flushed[subnormal] = 0
    return flushed


def inputs_read_as_zero(op: Op) -> Op | None:
    """The op with every subnormal input read as zero, or None when no input is subnormal (nothing to try)."""
    changed = {}
    for name in INPUTS:
        array = getattr(op, name)
        if array is None:
            continue
        flushed = _flushed(np.asarray(array))
        if flushed is not None:
            changed[name] = flushed
    return replace(op, **changed) if changed else None


def accepted(ieee, daz):
    """The run's judgement: ``daz`` (against the flushed inputs) when it passes, each output counting in
    ``read_as_zero`` the elements that failed against the inputs as given; else ``ieee``. Both are
    judge.SetComparison of the same outputs."""
    if daz.status != "pass":
        return ieee
    failed = {o.name: o.comparison.mismatches for o in ieee.outputs if o.comparison is not None}
    outputs = tuple(o if o.comparison is None else replace(o, comparison=replace(
        o.comparison, read_as_zero=failed.get(o.name, 0))) for o in daz.outputs)
    return replace(daz, outputs=outputs)
