"""Scratch arrays reused from block to block, and the float64 upcast into them.

The judge's passes work in blocks of up to a million elements. A fresh float64 temporary per block and
step costs page faults (the kernel zeroes every new page: ~0.35 s of system time per pass over a
12.8M-element tensor, measured) and evicts the cache; writing into the same arrays with ``out=`` computes
the same values without either.
"""

from __future__ import annotations

import numpy as np

from bnbwd_cli.dtypes import BFLOAT16, to_float64


class Buffers:
    """``count`` arrays of ``dtype`` reused from block to block, grown when a block is larger."""

    def __init__(self, count: int, dtype: type = np.float64) -> None:
        self.count, self.dtype, self.arrays = count, dtype, [np.empty(0, dtype)] * count

    def take(self, size: int, shape: tuple[int, ...] | None = None) -> list[np.ndarray]:
        """The arrays' first ``size`` elements, flat or as ``shape`` (which holds ``size`` elements)."""
        if size > self.arrays[0].size:
            self.arrays = [np.empty(size, self.dtype) for _ in range(self.count)]
        return [array[:size] if shape is None else array[:size].reshape(shape) for array in self.arrays]


def upcast(block: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """``block`` as float64: itself, or cast into ``buffer`` of its shape (bfloat16: dtypes.to_float64's route)."""
    if block.dtype == np.float64 or block.dtype == BFLOAT16:
        return to_float64(block)
    np.copyto(buffer, block)
    return buffer
