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


# Where a value's bits tell a subnormal without arithmetic: the unsigned integer of the dtype's width, the mask that
# clears the sign, and the first normal's bits (a subnormal's magnitude bits are 1 .. first normal - 1). float16
# holds none that are read as zero (each is a normal float32 once loaded, _threshold).
_BITS = {"f64": (np.uint64, (1 << 63) - 1, 1 << 52), "f32": (np.uint32, (1 << 31) - 1, 1 << 23),
         "bf16": (np.uint16, (1 << 15) - 1, 1 << 7)}
_CHUNK = 1 << 16  # elements: a chunk's integers stay in cache between the three passes over them


def _holds_subnormal(array: np.ndarray) -> bool:
    """Whether the array holds a value read as zero: asked of every input of a failing run, nearly always of inputs
    that hold none, so it reads the bits a cache-sized chunk at a time (no array-sized temporaries: in a fresh
    process their pages cost more than the test) and stops at the first subnormal."""
    name = dtype_name(array.dtype)
    if name == "f16":
        return False
    if name not in _BITS or not (array.flags.c_contiguous and array.dtype.isnative):
        return bool(_subnormal_mask(array).any())
    unsigned, magnitude, first_normal = _BITS[name]
    bits = array.reshape(-1).view(unsigned)
    scratch = np.empty(min(_CHUNK, bits.size), unsigned)
    for start in range(0, bits.size, _CHUNK):
        chunk = bits[start:start + _CHUNK]
        part = scratch[:chunk.size]
        np.bitwise_and(chunk, magnitude, out=part)
        np.subtract(part, 1, out=part)  # a zero wraps to the largest value: only subnormals fall below first_normal - 1
        if part.min() < first_normal - 1:
            return True
    return False


def _subnormal_mask(array: np.ndarray) -> np.ndarray:
    """Where the array's values are read as zero (by magnitude: any dtype, any strides)."""
    below = _threshold(array.dtype)
    magnitude = np.abs(array)
    with np.errstate(invalid="ignore"):  # NaN is no subnormal (bfloat16's comparisons would warn of it)
        return (magnitude < below) & (magnitude > 0)


def _flushed(array: np.ndarray) -> np.ndarray | None:
    """The array with its subnormal values as zero, or None when it holds none."""
    if not _holds_subnormal(array):
        return None
    subnormal = _subnormal_mask(array)
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
