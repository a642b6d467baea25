"""16-bit floats inside numba's compiled code: loads and stores of float16 and bfloat16 held as integer bits,
float64 rounded once to each type, and the order-preserving integer keys of the written values' extremes.

Part of the compiled code of core/numba_kernels.py (listed in core.NUMBA_SOURCES, so an edit here starts a
fresh kernel cache).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)  # the bits below a float64's sign
KEY_LIMITS = (np.iinfo(np.int64).max, np.iinfo(np.int64).min)  # the extremes' start: (lo, hi) of no value


# ---------------------------------------------------------------- 16-bit floats as integer bits
# numba has no float16 or bfloat16 type, so both travel as 16-bit integers: bfloat16 as uint16,
# float16 as int16 (the signedness only selects the conversion). float16 converts with LLVM's
# half type (one vcvtph2ps/vcvtps2ph on x86 with F16C), bfloat16 by shifting bits.


@intrinsic
def _bits_to_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _f32_to_bf16(typingctx, value):
    """bfloat16 bits of a float32: round to nearest even on bit 16 (overflow carries into inf, as it
    should), but a NaN stays a (quiet) NaN. Written in LLVM IR so the NaN case is a select, which
    vectorises (numba's own conditional expression inside an inlined overload did too, with warnings)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        high = builder.lshr(bits, ir.Constant(i32, 16))
        rounded = builder.lshr(builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)),
                                           builder.and_(high, ir.Constant(i32, 1))), ir.Constant(i32, 16))
        quiet = builder.or_(high, ir.Constant(i32, 0x40))
        is_nan = builder.icmp_unsigned(">", builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF)), ir.Constant(i32, 0x7F800000))
        return builder.trunc(builder.select(is_nan, quiet, rounded), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def _half_to_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.int16), codegen


@intrinsic
def _f32_to_half(typingctx, value):
    """Round to nearest even (LLVM's fptrunc in the default rounding mode); NaN stays NaN."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.int16(types.float32), codegen


def load(array, index):  # pragma: no cover - replaced by the overload inside compiled code
    raise NotImplementedError


def store(array, index, value):  # pragma: no cover
    raise NotImplementedError


@overload(load)
def _load_impl(array, index):
    if array.dtype == types.uint16:  # bfloat16 bits: the high half of a float32
        return lambda array, index: _bits_to_f32(np.uint32(array[index]) << np.uint32(16))
    if array.dtype == types.int16:  # float16 bits
        return lambda array, index: _half_to_f32(array[index])
    return lambda array, index: array[index]


@intrinsic
def _f32_to_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _f64_to_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _bits_to_f64(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@njit
def track(lo, hi, value):
    """Running (min, max) of float64 values as order keys (see order_key): integer min/max vectorise, and a
    NaN lands beyond ±inf's keys, so it shows in the extremes."""
    bits = _f64_to_bits(value)
    key = bits ^ ((bits >> 63) & MAGNITUDE)
    return min(lo, key), max(hi, key)


@njit
def round_to_odd(value):
    """float32 of a float64 rounded to odd (truncated, last bit set when inexact): see rounding.round_to_odd_float32."""
    narrow = np.float32(value)
    back = np.float64(narrow)
    # Without branches (a branch here kept the write loops scalar): rounded away from zero -> one step back
    # (toward zero: the truncation), then inexact -> last bit set. A NaN is "inexact" and keeps a NaN's bits.
    toward_zero = np.uint32(abs(back) > abs(value))
    inexact = np.uint32(back != value)
    return _bits_to_f32((_f32_to_bits(narrow) - toward_zero) | inexact)


@overload(store)
def _store_impl(array, index, value):
    """array[index] = value (float64) rounded once to the array's type."""
    if array.dtype == types.uint16:
        def store_bf16(array, index, value):
            array[index] = _f32_to_bf16(round_to_odd(value))
        return store_bf16
    if array.dtype == types.int16:
        def store_f16(array, index, value):
            array[index] = _f32_to_half(round_to_odd(value))
        return store_f16
    if array.dtype == types.float32:
        def store_f32(array, index, value):
            array[index] = np.float32(value)
        return store_f32

    def store(array, index, value):
        array[index] = value
    return store
