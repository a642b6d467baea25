"""The op's inputs, checked and bundled: what the core computes from and the judge judges with."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import numpy as np


@dataclass(frozen=True)
class Op:
    """The op's inputs. src, diff_dst: (N, C, X...) for NCX or (N, X..., C) for NXC, same dtype T1
    (f16/bf16/f32/f64); mean, variance, gamma: (C,), dtype T2 (gamma None means 1). With
    variance_is_invstd the variance array holds 1/sqrt(var + eps) and epsilon is not used.
    training=False is TF's is_training=False: diff_src = gamma·invstd·diff_dst."""

    src: np.ndarray
    diff_dst: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    gamma: np.ndarray | None = None
    _: KW_ONLY
    epsilon: float
    data_format: str
    training: bool = True
    variance_is_invstd: bool = False
