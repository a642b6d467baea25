"""What a hypothesis' prediction is measured by, in every test of it (judge/diagnosis/assess.py and the whole-run
walk, judge/diagnosis/whole_run.py): its tolerance (K units of its noise plus one ulp), its values rounded to an
output's grid, and the share of a failure's deviation it explains.
"""

from __future__ import annotations

import math

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name, ulp_spacing
from bnbwd_cli.judge.diagnosis.case import Case, Output


def prediction_tolerance(case: Case, name: str, p: np.ndarray, r: np.ndarray, extra: np.ndarray | None,
               base: np.ndarray | None = None) -> np.ndarray:
    """K units of the prediction's noise plus one ulp of p; ``base``: the correct kernel's scale where p lies
    (default: the sum's; diff_src's callers give it)."""
    out = case.outputs[name]
    if base is None:
        base = case.sum_scale(name)
    if extra is not None:
        base = np.maximum(base, extra)
    u, root = case.unit, math.sqrt(max(case.count, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        noise = base + u * np.abs(p) + u * root * np.abs(p - r)
        return out.comparison.scaled.max_units * noise + ulp_spacing(p, out.comparison.dtype)


def rounded(p: np.ndarray, dtype: str) -> np.ndarray:
    """The prediction rounded to the output's dtype, as the kernel rounds its own values (float64 out)."""
    if dtype == "f64":
        return p
    with np.errstate(invalid="ignore", over="ignore"):
        return p.astype(dtype_from_name({"f32": "float32", "f16": "float16"}.get(dtype, dtype))).astype(np.float64)


def sum_of_squares(a: np.ndarray, q: np.ndarray | float) -> float:
    """The sum of squares of the finite a - q (flat)."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.reshape(a - q, -1)
    d = np.where(np.isfinite(d), d, 0.0)
    return float(np.dot(d, d))


def share_explained(out: Output, p: np.ndarray) -> float:
    """1 - ||a - p|| / ||a - r|| with p rounded to the output's dtype (as a and r are), over the elements
    beyond K units of the reference (all when none is): the share of the deviation the prediction accounts
    for, not diluted by the rounding noise of the elements the bug left alone. (diff_src: ``confirmed``.)"""
    after = math.sqrt(sum_of_squares(out.where(out.actual), out.where(rounded(p, out.comparison.dtype))))
    return explained(out.deviation_norm, after)


def explained(before: float, after: float) -> float:
    return 1.0 - after / before if before > 0 else 0.0
