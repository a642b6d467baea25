"""Data formats: NCX / NXC, their spec aliases, axis naming, and the (N, C, S) view with per-channel operations on it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bnbwd_cli.errors import InputError

# alias -> (canonical format, rank the alias fixes or None)
FORMAT_ALIASES: dict[str, tuple[str, int | None]] = {
    "NCX": ("NCX", None),
    "NXC": ("NXC", None),
    "NC": ("NCX", 2),  # rank 2: both layouts are the same (N, C)
    "NCW": ("NCX", 3),
    "NWC": ("NXC", 3),
    "NCHW": ("NCX", 4),
    "NHWC": ("NXC", 4),
    "NCDHW": ("NCX", 5),
    "NDHWC": ("NXC", 5),
}

SPATIAL_LETTERS = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}


def canonical_format(name: str) -> str:
    """'nhwc' -> 'NXC'. Raises InputError for an unknown name."""
    try:
        return FORMAT_ALIASES[name.upper()][0]
    except KeyError:
        known = ", ".join(FORMAT_ALIASES)
        raise InputError(f"data_format is {name!r}, expected one of {known}") from None


def resolve_format(name: str, ndim: int) -> str:
    """Canonical format for a tensor of rank `ndim`, checking the rank an alias implies."""
    canonical = canonical_format(name)
    fixed_rank = FORMAT_ALIASES[name.upper()][1]
    if fixed_rank is not None and fixed_rank != ndim:
        raise InputError(f"data_format {name.upper()} needs a rank-{fixed_rank} src, found rank {ndim}")
    return canonical


def other_format(data_format: str, ndim: int) -> str:
    """The other layout, named for this rank: NHWC for an NCHW tensor, NCX for NXC at rank 6, ..."""
    other = "NXC" if canonical_format(data_format) == "NCX" else "NCX"
    return next((alias for alias, (canonical, rank) in FORMAT_ALIASES.items() if canonical == other and rank == ndim),
                other)


def channel_axis(data_format: str, ndim: int) -> int:
    """Index of the channel axis: 1 for NCX, last for NXC."""
    return 1 if canonical_format(data_format) == "NCX" else ndim - 1


def axis_letters(data_format: str, ndim: int) -> tuple[str, ...]:
    """Names of the axes, for coordinates in reports: ('n','c','h','w') for NCHW, ('n','h','w','c') for NHWC."""
    n_spatial = max(ndim - 2, 0)
    spatial = SPATIAL_LETTERS.get(n_spatial, tuple(f"x{i}" for i in range(1, n_spatial + 1)))
    if ndim < 2:
        return ("n", "c")[:ndim]
    if canonical_format(data_format) == "NCX":
        return ("n", "c", *spatial)
    return ("n", *spatial, "c")


def view3(array: np.ndarray, data_format: str) -> np.ndarray:
    """(N, C, S) for NCX, (M, C, 1) for NXC: one channel per middle index. A view when C-contiguous."""
    if canonical_format(data_format) == "NCX":
        return array.reshape(array.shape[0], array.shape[1], math.prod(array.shape[2:]))
    return array.reshape(math.prod(array.shape[:-1]), array.shape[-1], 1)


def coordinates(index: Sequence[int] | None, axis_names: Sequence[str] | None) -> str:
    """``n=3 c=17 h=5 w=9`` in the tensor's own layout, or ``(3, 17, 5, 9)`` without one."""
    if index is None:
        return "-"
    if axis_names is not None and len(axis_names) == len(index):
        return " ".join(f"{name}={i}" for name, i in zip(axis_names, index))
    return "(" + ", ".join(str(i) for i in index) + ")"


# A block's channels are applied one at a time (a float64 scalar each) when they are several and their runs at least
# this long: NumPy iterates an (n, channels, s) block against a (channels, 1) broadcast about half as fast as
# against one channel's scalar. Short runs (NXC rows) broadcast: a loop over channels would cost more calls.
PER_CHANNEL_RUN = 64


def per_channel(ufunc: np.ufunc, values: np.ndarray, coefficients: np.ndarray,
                out: np.ndarray | None = None) -> np.ndarray:
    """out = ufunc(values, each channel's coefficient), elementwise, for an (n, channels, s) block of a view3 and
    its channels' (channels,) float64 coefficients, into ``out`` (float64; None: a new array). The same operation
    and bits however it is iterated: the loop is float64 (dtype=float64), so float32 and float16 values are
    computed in float64 as against the array; a scalar alone would not promote them under NumPy 1.x's value-based
    casting (nor would a Python float under NumPy 2). Returns out."""
    if out is None:
        out = np.empty(values.shape)
    channels, run = values.shape[1], values.shape[2]
    if channels == 1 or run < PER_CHANNEL_RUN:
        return ufunc(values, coefficients[:, None], out=out, dtype=np.float64)
    for j, coefficient in enumerate(coefficients):
        ufunc(values[:, j], coefficient, out=out[:, j], dtype=np.float64)
    return out
