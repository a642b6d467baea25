"""An unmoved diff_src's regression sums (bias.ChannelRegression.add_unmoved), compiled (numba, optional): one loop
over a block's actual, reference, diff_dst and src instead of a float64 upcast and seven NumPy reductions a piece.

Not NumPy's bits, and they need not be: for an output equal to its reference every channel's fit is scale 0 and
stderr 0 whatever these sums hold, and they only decide which channels can be fitted, which fit() checks against
the rounding of sums formed in any order (bias._decided; past it fit() gives None and the exact sums decide). The
counts are exact, the clusters' spread is the same test (does an element's cluster differ from its channel's
first), and the other sums are float64 sums in storage order. Imported only when the judging runs compiled
(runtime.numba_judging).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from bnbwd_cli.core.numba_bits import _f64_to_bits, load
from bnbwd_cli.core.numba_core import _bits_view, supports
from bnbwd_cli.dtypes import FLOAT_FORMAT
from bnbwd_cli.judge.bias import CLUSTER_BITS, ChannelRegression
from bnbwd_cli.judge.model import blocks
from bnbwd_cli.judge.numba_pass import _GOLDEN, _grid, _spacing


def add(regression: ChannelRegression, views: tuple[np.ndarray, ...], constants: tuple[np.ndarray, np.ndarray],
        block: int, stop: threading.Event | None = None) -> bool | None:
    """Every block of ``views`` (diff_src's actual and reference, diff_dst and src as (N, C, S)) into an unmoved
    ``regression`` (ChannelRegression(unmoved=True)), as add_unmoved would piece by piece; stops at an undecided
    fit (a non-finite xhat). False, having done nothing, where it does not apply (a dtype without compiled loads or
    a float64 ULP grid); None when ``stop`` is set."""
    if not all(supports(view.dtype) for view in views) or FLOAT_FORMAT[regression.dtype][1] - FLOAT_FORMAT[
            regression.dtype][0] < -1022:
        return False
    mean, invstd = constants
    smallest, mantissa = _grid(regression.dtype)
    grid = np.array([smallest, mantissa]).astype(np.int64)
    a3 = views[0]
    for where in blocks(a3.shape, block):
        if stop is not None and stop.is_set():
            return None
        values = tuple(_bits_view(np.ascontiguousarray(view[where])) for view in views)
        channels = where[1]
        totals = np.zeros((channels.stop - channels.start, 6))
        if not unmoved_block(values, (mean[channels], invstd[channels]), grid, totals,
                             (regression.first_cluster[:, channels], regression.spread[:, channels])):
            regression.undecided = True
            return True
        regression.cross[:, channels, 0, 0] += a3[where].shape[0] * a3[where].shape[2]
        regression.cross[:, channels, 0, 1:6] += totals[:, :5]
        regression.ulp_squares[channels] += totals[:, 5]
    return True


@njit(cache=True, nogil=True)
def unmoved_block(values, constants, grid, totals, clusters):  # pragma: no cover - compiled
    """One (n, c, s) block: per channel the sums of x, r, x*x, x*r, r*r and the actual output's squared ULP spacing
    (totals (c, 6)), and the clusters' spread by diff_dst and by the reference (clusters: first (2, c), -1 for none
    yet, and spread (2, c), updated in place). False at a non-finite xhat."""
    a3, r3, dy3, src3 = values
    mean, invstd = constants
    first, spread = clusters
    n, c, s = a3.shape
    shift = np.uint64(64 - CLUSTER_BITS)
    golden = _GOLDEN
    for i in range(n):  # storage order (NXC's rows of one element a channel: channel by channel would stride)
        for j in range(c):
            m, k = mean[j], invstd[j]
            for q in range(s):
                x = (np.float64(load(src3, (i, j, q))) - m) * k
                if not np.isfinite(x):
                    return False
                r = np.float64(load(r3, (i, j, q)))
                spacing = _spacing(np.float64(load(a3, (i, j, q))), grid[0], grid[1])
                totals[j, 0] += x
                totals[j, 1] += r
                totals[j, 2] += x * x
                totals[j, 3] += x * r
                totals[j, 4] += r * r
                totals[j, 5] += spacing * spacing
                for clustering in range(2):
                    if spread[clustering, j]:
                        continue
                    key = np.float64(load(dy3, (i, j, q))) if clustering == 0 else r
                    cluster = np.int64((np.uint64(_f64_to_bits(key)) * golden) >> shift)
                    if first[clustering, j] < 0:
                        first[clustering, j] = cluster
                    elif cluster != first[clustering, j]:
                        spread[clustering, j] = True
    return True
