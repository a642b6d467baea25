"""The numba core's plane sums take rows two at a time (each lane still adds row i, then row i + 1): chunks of an
odd number of rows, one row and every dtype give the NumPy core's bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.oracle import backward_arrays, op_args
from tests.test_reproducible import assert_same_bits


@pytest.mark.numba
@pytest.mark.parametrize("shape", [(67, 3, 200), (1, 2, 300), (129, 2, 5000)], ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16], ids=["f64", "f32", "bf16"])
def test_odd_rows_of_planes_give_the_numpy_core_bits(rng, shape, dtype):
    pytest.importorskip("numba")
    arrays = op_args(rng, shape, "NCX", dtype, np.float64 if dtype == np.float64 else np.float32)
    expected = backward_arrays(*arrays, epsilon=1e-5, data_format="NCX", core="numpy")
    for threads in (1, 2):  # 2 threads, 2-3 channels: (channel, chunk) tasks; 1 thread: one task a channel
        result = backward_arrays(*arrays, epsilon=1e-5, data_format="NCX", core="numba", threads=threads)
        assert result.core == "numba"
        assert_same_bits(expected, result, f"threads={threads}")
