"""How tests measure agreement with the float64 oracle."""

from __future__ import annotations

import numpy as np

from bnbwd_cli.reference import to_float64

# Normalised max error bounds per T1 (issue 3): max|out - ref| / max|ref|.
BOUNDS = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def normalised_error(actual: np.ndarray, expected64: np.ndarray) -> float:
    if expected64.size == 0:
        return 0.0
    difference = np.max(np.abs(to_float64(actual) - expected64))
    scale = np.max(np.abs(expected64))
    return float(difference / scale) if scale > 0 else float(difference)


def problem_arrays(problem: dict):
    """src, diff_dst, mean, variance, gamma (or None) for a hypothesis-drawn problem dict."""
    rng = np.random.default_rng(problem["seed"])
    shape, dtype, stats_dtype = problem["shape"], problem["dtype"], problem["stats_dtype"]
    channels = shape[1] if problem["data_format"] == "NCX" else shape[-1]
    return (
        rng.normal(1.0, 3.0, size=shape).astype(dtype),
        rng.normal(size=shape).astype(dtype),
        rng.normal(1.0, 0.5, size=channels).astype(stats_dtype),
        rng.uniform(0.5, 9.0, size=channels).astype(stats_dtype),
        rng.uniform(0.5, 2.0, size=channels).astype(stats_dtype) if problem["with_gamma"] else None,
    )
