"""What both cores read: the (N, C, S) views, the float64 per-channel values and the reduction order.

Built by core.backward, read by core/numpy_core.py and core/numba_core.py; a module of its own so that the
cores name it without importing the package that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bnbwd_cli.core import plan


@dataclass(frozen=True)
class Views:
    """What both cores read: C-contiguous (N, C, S) views, float64 (C,) per-channel values, the reduction order.

    scale = gamma·invstd, or its mantissa when scale_exp is not None (then scale·2**scale_exp, see
    plan.split_scale). need_sums: the cores must form Σdy and Σdy·(src - mean).
    """

    src3: np.ndarray
    dy3: np.ndarray
    out3: np.ndarray | None
    mean: np.ndarray
    invstd: np.ndarray
    scale: np.ndarray
    scale_exp: np.ndarray | None
    count: int
    training: bool
    need_sums: bool
    geometry: plan.Geometry = field(repr=False)
