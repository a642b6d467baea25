"""NumPy arrays to torch tensors and back, bfloat16 included (torch.from_numpy knows no ml_dtypes bfloat16, so it
crosses as int16 bits). Nothing here imports torch: callers import it inside the functions that need it and pass
it in, so the tools that use this module run where torch is not installed."""

from __future__ import annotations

import numpy as np

from bnbwd_cli.api_arguments import from_torch
from bnbwd_cli.dtypes import BFLOAT16


def to_torch(torch, array: np.ndarray):
    """A CPU tensor with the array's values and dtype (bfloat16 as torch.bfloat16); shares memory where it can."""
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:  # torch.from_numpy warns on a read-only array
        array = array.copy()
    if array.dtype == BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor) -> np.ndarray:
    """The tensor's values as a contiguous NumPy array (torch.bfloat16 as ml_dtypes' bfloat16): the API's own
    conversion of a caller's tensor, in C order."""
    return np.ascontiguousarray(from_torch(tensor))
