"""The pytest route: a kernel judged by bnbwd in parametrized tests, spread over cores by pytest-xdist.

    pip install 'bnbwd[test]'          # pytest and pytest-xdist
    python -m pytest -n auto docs/examples/test_kernel_pytest.py

Each test judges one problem with bnbwd_cli.assert_backward_close: no subprocess, no files; a failure reads as
the report `bnbwd run --reference` prints. Replace my_kernel with yours (a torch function works as it is: the
API takes tensors, and a tuple of outputs in (diff_src, diff_gamma, diff_beta) order).
"""

from __future__ import annotations

import numpy as np
import pytest

import bnbwd_cli

SHAPES = [(2, 3, 4, 4), (8, 16, 7, 7), (4, 32, 1, 1), (1, 5, 9, 9)]
DTYPES = [np.float32, np.float64]


def my_kernel(x, dy, mean, var, gamma, eps):
    """A float32-accumulating NCHW batch-norm backward: the kernel under test."""
    axes, m, shape = (0, 2, 3), x.size // x.shape[1], (1, -1, 1, 1)
    invstd = 1 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    dbeta, dgamma = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
    dx = (gamma * invstd).reshape(shape) * (dy - dbeta.reshape(shape) / m - xhat * dgamma.reshape(shape) / m)
    return dx.astype(x.dtype), dgamma.astype(mean.dtype), dbeta.astype(mean.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_my_kernel(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(0.5, 2.0, size=shape).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    gamma = rng.uniform(0.5, 1.5, size=shape[1]).astype(dtype)
    outputs = my_kernel(x, dy, mean, var, gamma, 1e-5)
    bnbwd_cli.assert_backward_close(outputs, src=x, diff_dst=dy, mean=mean, variance=var, gamma=gamma,
                                    epsilon=1e-5, data_format="NCHW")
