"""Floating dtypes: short names, the one float64 upcast, and the ULP grid of each format.

ml_dtypes (bfloat16) is imported on first use, not with this module: it costs start-up time
(~26M instructions, about a tenth of bnbwd's own) that an f32 run need not pay. An array can only
have the bfloat16 dtype once ml_dtypes is loaded, so ``is_bfloat16`` never needs to load it.
"""

from __future__ import annotations

import sys

import numpy as np

# Short names used in reports, JSON and tolerance tables (bfloat16: see dtype_name).
SHORT_NAMES: dict[np.dtype, str] = {
    np.dtype(np.float64): "f64",
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
}
# (explicit mantissa bits, minimum normal exponent) per short name.
FLOAT_FORMAT: dict[str, tuple[int, int]] = {"f64": (52, -1022), "f32": (23, -126), "f16": (10, -14), "bf16": (7, -126)}


def __getattr__(name: str):
    """``BFLOAT16``: ml_dtypes' bfloat16 dtype, loaded on first use (PEP 562)."""
    if name != "BFLOAT16":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import ml_dtypes

    globals()["BFLOAT16"] = value = np.dtype(ml_dtypes.bfloat16)
    return value


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16, without importing ml_dtypes when nothing did."""
    return "ml_dtypes" in sys.modules and np.dtype(dtype) == (globals().get("BFLOAT16") or __getattr__("BFLOAT16"))


def dtype_name(dtype: np.dtype) -> str | None:
    """Short name ("f64", "f32", "f16", "bf16") of a float dtype, None for anything else."""
    dtype = np.dtype(dtype)
    return SHORT_NAMES.get(dtype) or ("bf16" if is_bfloat16(dtype) else None)


def to_float64(array: np.ndarray) -> np.ndarray:
    """Upcast to float64; bfloat16 goes through float32 (NumPy's bf16 promotion is unreliable)."""
    if is_bfloat16(array.dtype):
        return array.astype(np.float32).astype(np.float64)
    return np.asarray(array, dtype=np.float64)


def unit_roundoff(name: str) -> float:
    """Half the spacing at 1.0: the relative error of one correctly rounded operation."""
    return 2.0 ** -(FLOAT_FORMAT[name][0] + 1)


def coarser(*names: str) -> str:
    """The name with the fewest mantissa bits."""
    return min(names, key=lambda n: FLOAT_FORMAT[n][0])


def ulp_spacing(reference: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype``'s representable numbers at |reference| (float64 in, float64 out).

    ``2**(max(e, emin) - p)`` with ``e = floor(log2 |r|)``: np.spacing of r rounded to the dtype,
    computed the same way for every format (bfloat16 has no np.spacing). Subnormals keep the
    smallest spacing, as np.spacing does.
    """
    nmant, emin = FLOAT_FORMAT[dtype]
    magnitude = np.abs(reference)
    _, exponent = np.frexp(magnitude)  # magnitude = m * 2**exponent, m in [0.5, 1)
    exponent = np.where(magnitude > 0, exponent - 1, emin)
    return np.ldexp(1.0, np.maximum(exponent, emin) - nmant)
