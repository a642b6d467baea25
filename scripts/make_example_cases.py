"""Writes fixtures/example_case.npz and fixtures/example_case_bad.npz, the `bnbwd check` examples.

A kernel engineer's dump: the inputs of fixtures/example.npz and a float32 kernel's outputs, all in
the kernel's own names (x, dy, var, dx, dgamma, dbeta), as README's "In pytest" section shows. The
kernel is the textbook formula in float32 (a correct kernel: it passes); the bad one divides by M-1
where M belongs in the variance it recomputes (an unbiased variance: it fails).

    python scripts/make_example_cases.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def float32_kernel(x, dy, mean, var, gamma, eps, unbiased=False):
    """NCHW batch-norm backward as a float32 kernel computes it (sums along the reduced axes in float32)."""
    axes, m = (0, 2, 3), x.size // x.shape[1]
    if unbiased:
        var = (var * m / (m - 1)).astype(np.float32)
    shape = (1, -1, 1, 1)
    invstd = (1 / np.sqrt(var + np.float32(eps))).astype(np.float32)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    dbeta = dy.sum(axis=axes, dtype=np.float32)
    dgamma = (dy * xhat).sum(axis=axes, dtype=np.float32)
    dx = (gamma * invstd).reshape(shape) * (dy - dbeta.reshape(shape) / m - xhat * dgamma.reshape(shape) / m)
    return dx.astype(np.float32), dgamma, dbeta


def main() -> None:
    example = np.load(FIXTURES / "example.npz")
    assert str(example["data_format"]) == "NCHW"
    inputs = {"x": example["src"], "dy": example["diff_dst"], "mean": example["mean"], "var": example["variance"],
              "gamma": example["gamma"], "epsilon": example["epsilon"], "data_format": example["data_format"]}
    args = (example["src"], example["diff_dst"], example["mean"], example["variance"], example["gamma"],
            float(example["epsilon"]))
    for name, unbiased in (("example_case.npz", False), ("example_case_bad.npz", True)):
        dx, dgamma, dbeta = float32_kernel(*args, unbiased=unbiased)
        np.savez(FIXTURES / name, **inputs, dx=dx, dgamma=dgamma, dbeta=dbeta)


if __name__ == "__main__":
    main()
