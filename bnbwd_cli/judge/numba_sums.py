"""The bias regression's sums of one piece, compiled (numba, optional): judge/bias.py's bins, products and
scattered sums fused into one loop over the elements, the same numbers.

Each sum is a float64 sum from 0 over its bin's elements in storage order, as np.add.at forms it, so the loop
adds each element's products to its two bins (by diff_dst, by reference) in storage order; the counts are sums of
w (1.0, or 0.0 for an element left out), exact integers. Where d is 0 the three sums of d add nothing (bias.py's
dense and sparse paths give the same bits for that reason). The bins are bias.cluster_of's Fibonacci hash of the
float64 bits, wrapping in uint64 as NumPy's does. The block's sums are held bin by bin, (bins, 2 * 9): the 18
sums an element adds to lie in two rows, where NumPy's (2, 9, bins) would spread them over 18 cache lines.
Imported only when the regression runs compiled (runtime.numba_judging).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # bias.cluster_of's multiplier


@njit(cache=True, nogil=True)
def piece_sums(sums, keys, basis, geometry, shift):  # pragma: no cover - compiled
    """Add one piece's elements to a block's sums (bins, 18): columns 0-8 by diff_dst's cluster, 9-17 by the
    reference's, each in bias._PAIRS order then d, x*d, r*d. keys: the float64 bits of diff_dst and the reference
    (uint64); basis: x, r, d (0 where an element is left out) and w, the weights (empty: every weight is 1);
    geometry: the piece's first channel in the block, its channels, its run and bias.CLUSTERS (the piece is
    (rows, channels, run) in storage order); shift: 64 - bias.CLUSTER_BITS (uint64: an int64 would make numba's
    uint64 arithmetic float)."""
    dy_bits, reference_bits = keys
    x, r, d, w = basis
    first, channels, run, clusters = geometry
    golden = _GOLDEN
    weighted = w.size > 0
    i = 0
    for _ in range(x.size // max(channels * run, 1)):
        for channel in range(channels):
            base = (first + channel) * clusters
            for _ in range(run):
                by_dy = base + np.int64((dy_bits[i] * golden) >> shift)
                by_reference = base + np.int64((reference_bits[i] * golden) >> shift)
                xi, ri, di = x[i], r[i], d[i]
                wi = w[i] if weighted else 1.0
                xx, xr, rr = xi * xi, xi * ri, ri * ri
                sums[by_dy, 0] += wi
                sums[by_dy, 1] += xi
                sums[by_dy, 2] += ri
                sums[by_dy, 3] += xx
                sums[by_dy, 4] += xr
                sums[by_dy, 5] += rr
                sums[by_reference, 9] += wi
                sums[by_reference, 10] += xi
                sums[by_reference, 11] += ri
                sums[by_reference, 12] += xx
                sums[by_reference, 13] += xr
                sums[by_reference, 14] += rr
                if di != 0.0:
                    xd, rd = xi * di, ri * di
                    sums[by_dy, 6] += di
                    sums[by_dy, 7] += xd
                    sums[by_dy, 8] += rd
                    sums[by_reference, 15] += di
                    sums[by_reference, 16] += xd
                    sums[by_reference, 17] += rd
                i += 1
