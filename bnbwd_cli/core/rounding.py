"""Rounding float64 results once to T1 (f64, f32, f16, bf16): NumPy's own casts where they round once, else
through float32 rounded to odd (bfloat16: ml_dtypes' float64 cast rounds through float32; only the elements a
plain float32 rounding puts on a bfloat16 tie need it).

Pure NumPy, shared by the NumPy core (its write pass), backward (diff_gamma, diff_beta) and core/summary.py.
"""

from __future__ import annotations

import numpy as np

from bnbwd_cli.dtypes import is_bfloat16
from bnbwd_cli.scratch import FLOAT64, Scratch


# ---------------------------------------------------------------- float32 -> float16
# NumPy's own float32 -> float16 cast is the slower one (bench/RESULTS.md, "The core's constants"); these bit
# manipulations give the same bits (round to nearest even, subnormals, inf, NaN) in a few vectorised
# integer passes. The other way NumPy's cast is the faster one (numpy_core._Kernel._load widens with it). Used only
# where NumPy's float64 -> float16 cast would round twice (store).

_U32 = np.uint32
_F32_DENORM_MAGIC = np.array(((127 - 15) + (23 - 10) + 1) << 23, _U32)


def float_to_half(values: np.ndarray, out: np.ndarray, magnitude: np.ndarray, result: np.ndarray) -> None:
    """out (float16) = values (float32) rounded to nearest even; magnitude, result: uint32 scratch."""
    bits = values.view(_U32)
    np.bitwise_and(bits, _U32(0x7FFFFFFF), out=magnitude)
    np.right_shift(magnitude, _U32(13), out=result)  # normal numbers: round half to even on bit 13
    result &= _U32(1)
    result += magnitude
    result += _U32((((15 - 127) << 23) + 0xFFF) & 0xFFFFFFFF)
    result >>= _U32(13)
    small = magnitude < _U32(113 << 23)  # below the f16 normal range
    if small.any():
        rounded = (magnitude[small].view(np.float32) + _F32_DENORM_MAGIC.view(np.float32)).view(_U32)
        result[small] = rounded - _F32_DENORM_MAGIC
    large = magnitude >= _U32((127 + 16) << 23)  # overflow to inf, or NaN
    if large.any():
        result[large] = np.where(magnitude[large] > _U32(0xFF << 23), _U32(0x7E00), _U32(0x7C00))
    np.right_shift(bits, _U32(16), out=magnitude)
    magnitude &= _U32(0x8000)
    result |= magnitude
    np.copyto(out.view(np.uint16), result, casting="unsafe")


# ---------------------------------------------------------------- rounding float64 once


def round_to_odd_float32(values: np.ndarray, out: np.ndarray) -> None:
    """out (float32) = values (float64) rounded to odd: truncated, the last bit set when inexact.

    Rounding that to 8 or 11 significant bits (bf16, f16) rounds values once, as if directly: the odd
    bit keeps a value that was not a tie from looking like one (a plain float32 rounding would not).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(out, values, casting="same_kind")
        back = out.astype(FLOAT64)
        inexact = back != values
        np.abs(back, out=back)
        away = back > np.abs(values)  # rounded away from zero: step back one
    bits = out.view(np.uint32)
    np.subtract(bits, away, out=bits, casting="unsafe")
    np.bitwise_or(bits, inexact, out=bits, casting="unsafe")


def _half_cast_rounds_once() -> bool:
    """Whether NumPy's own float64 -> float16 cast rounds once (npy_doublebits_to_halfbits or a hardware
    conversion). A cast through float32 would round twice. Each probe lies beyond a float16 tie by less than
    float32 holds, so a double rounding lands on the tie and rounds it to even."""
    beyond_tie = np.array([1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40), 2.0**-25 + 2.0**-60])
    return bool(np.array_equal(beyond_tie.astype(np.float16).astype(np.float64), [1 + 2.0**-10, -(1 + 2.0**-10), 2.0**-24]))


HALF_CAST_ROUNDS_ONCE = _half_cast_rounds_once()


def store(values: np.ndarray, out: np.ndarray, scratch: Scratch | None = None) -> np.ndarray:
    """out (T1) = values (float64), rounded once (NaN stays NaN).

    Returns an array whose min and max round to out's extremes (every step is monotone): out itself (f32,
    f64), the float64 values (f16 by NumPy's cast), or the rounded-to-odd float32 copy (bf16, or f16 where
    NumPy's cast would round twice).
    """
    if out.dtype == np.float16 and HALF_CAST_ROUNDS_ONCE:
        # One cast instead of the float32 detour below: fewer passes over the output, the same bits
        # (tests/test_core_tiling.py checks the two).
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(out, values, casting="unsafe")
        return values
    if is_bfloat16(out.dtype):
        return _store_bfloat16(values, out, scratch or Scratch())
    if out.dtype == np.float16:
        scratch = scratch or Scratch()
        odd = scratch.get("odd32", values.shape, np.dtype(np.float32))
        round_to_odd_float32(values, odd)
        if is_bfloat16(out.dtype):
            np.copyto(out, odd, casting="unsafe")
        else:
            float_to_half(odd, out, scratch.get("u32a", values.shape, np.dtype(np.uint32)),
                          scratch.get("u32b", values.shape, np.dtype(np.uint32)))
        return odd
    with np.errstate(over="ignore"):
        np.copyto(out, values, casting="unsafe")
    return out


_LOW_BITS = np.uint32(0xFFFF)  # a float32's low 16 bits: the ones a bfloat16 drops
_BF16_TIE = np.uint32(0x8000)  # a float32 whose low 16 bits are this lies halfway between two bfloat16s


def _store_bfloat16(values: np.ndarray, out: np.ndarray, scratch: Scratch) -> np.ndarray:
    """out (bfloat16) = values (float64) rounded once: to float32 and on to bfloat16, both to nearest even.

    Rounding twice differs from rounding once only where the float32 lands exactly on a bfloat16 tie (every
    bfloat16 and every midpoint between two is a float32, so any other float32 lies on the value's side of
    each midpoint): those few elements (about 1 in 65536 of random values; exact ties too) go through float32
    rounded to odd. Three passes where rounding every element to odd took ten (the 16-bit write's cost).
    Returns the float32 copy: each of its elements rounds to the element written (see store).
    """
    narrow = scratch.get("narrow32", values.shape, np.dtype(np.float32))
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(narrow, values, casting="same_kind")
    # The low 16 bits of each float32, masked in a contiguous uint32 copy: a strided uint16 view of them (every
    # other half) cost 0.64 ns an element, the costliest pass of a bf16 write; the mask and compare ~0.2.
    low = np.bitwise_and(narrow.view(np.uint32), _LOW_BITS, out=scratch.get("u32a", values.shape, np.dtype(np.uint32)))
    ties = np.equal(low, _BF16_TIE, out=scratch.get("ties", values.shape, np.dtype(np.bool_)))
    if ties.any():
        odd = np.empty(int(np.count_nonzero(ties)), np.float32)
        round_to_odd_float32(values[ties], odd)
        narrow[ties] = odd
    np.copyto(out, narrow, casting="unsafe")  # ml_dtypes' float32 -> bfloat16 cast: round to nearest even
    return narrow


def round_to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 array rounded once to dtype (f64, f32, f16 or bf16)."""
    out = np.empty(values.shape, dtype)
    store(np.ascontiguousarray(values, dtype=FLOAT64), out)
    return out
