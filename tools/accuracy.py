"""How far an output is from a float64 reference, as the conformance fixtures, the bench and the tests report it."""

from __future__ import annotations

import numpy as np

from bnbwd_cli.dtypes import to_float64


def normalised_error(actual: np.ndarray, expected64: np.ndarray) -> float:
    """max|actual - expected| / max|expected| in float64 (the plain max if expected is all 0; 0 for empty arrays)."""
    if expected64.size == 0:
        return 0.0
    difference = np.max(np.abs(to_float64(actual) - expected64))
    scale = np.max(np.abs(expected64))
    return float(difference / scale) if scale > 0 else float(difference)
