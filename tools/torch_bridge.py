"""NumPy arrays to torch tensors and back, bfloat16 included (ml_dtypes' bfloat16 has no torch counterpart
that torch.from_numpy knows, so it crosses as int16 bits). torch is imported by the caller and passed in:
nothing here imports it, so the tools that use this module run where torch is not installed."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def to_torch(torch, array: np.ndarray):
    """A CPU tensor with the array's values and dtype (bfloat16 as torch.bfloat16); shares memory where it can."""
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:  # torch.from_numpy warns on a read-only array
        array = array.copy()
    if array.dtype == BF16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(torch, tensor) -> np.ndarray:
    """The tensor's values as a contiguous NumPy array (torch.bfloat16 as ml_dtypes' bfloat16)."""
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BF16)
    return tensor.numpy()
