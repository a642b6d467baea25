"""Systematic deviations: a scale of actual vs reference beyond what rounding noise allows.

A wrong epsilon, an unbiased variance or a mean rounded to a narrower type moves every element of a
channel the same way by a fraction of an ulp: each element stays within tolerance, the channel as a
whole does not. Per channel c, diff_src's deviation d = a - r is fitted by least squares to

    d ~ offset + slope * xhat + scale * r

(offset and slope absorb the errors of a correct kernel's two sums, which shift whole channels;
``scale`` is what no correct kernel produces beyond a few roundings). Its standard error comes from
the fit's own residuals. The channel estimates are pooled (inverse-variance weights) into one
overall scale. For (C,) outputs (diff_gamma, diff_beta) one scale is fitted over the channels, with
the error model's scale as the noise. A scale fails when it is more than BIAS_Z standard errors from
zero *and* larger than BIAS_FLOOR_UNITS unit roundoffs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli import runtime
from bnbwd_cli.dtypes import ulp_spacing
from bnbwd_cli.judge.model import blocks
from bnbwd_cli.judge.comparison import Bias
from bnbwd_cli.judge.tolerance import BIAS_FLOOR_UNITS, BIAS_Z, SYSTEMATIC_UNITS, bias_threshold
from bnbwd_cli.scratch import Scratch

MIN_ELEMENTS = 8  # fewer elements per channel than this: no per-channel estimate
MIN_CHANNELS = 4  # fewer channels than this: no scale for a (C,) output
COLLINEAR = 1e-4  # smallest determinant of the basis' correlation matrix
RESOLUTION = 4  # r's rms must be this many times the actual output's rms spacing
CLUSTER_BITS = 6
CLUSTERS = 1 << CLUSTER_BITS  # hashed clusters per channel for the robust standard error
INT64, BOOL = np.dtype(np.int64), np.dtype(bool)
PIECE = 1 << 15  # elements whose products and bins stay in the CPU's cache while they are summed
SPARSE = 0.15  # at most this share of a piece's d non-zero: its sums are scattered from the non-zero ones only
_PRODUCTS = ("xx", "xr", "rr", "xd", "rd")  # the scratch buffers of a piece's products


@dataclass(frozen=True)
class ChannelFit:
    """Per-channel least-squares coefficients of d = offset + slope*xhat + scale*r (NaN where undefined)."""

    offset: np.ndarray
    slope: np.ndarray
    scale: np.ndarray
    stderr: np.ndarray  # of scale
    residual_rms: np.ndarray  # rms of d after the fit
    rms_xhat: np.ndarray
    rms_reference: np.ndarray


class ChannelRegression:
    """Sums of products of the basis [1, xhat, r] and d, per channel and cluster, over blocks.

    Elements are not independent when the data is coarse: a reduced-precision diff_dst takes few
    distinct values, and elements that share a value (or share a reference value) round the same
    way under a correct kernel's constant sum error. The standard error is therefore the largest of
    the plain least-squares one and two cluster-robust (sandwich) ones: clusters by diff_dst value
    and by reference value, each hashed into CLUSTERS groups per channel (a union of clusters is
    still a valid cluster, so hashing only costs degrees of freedom), held to Student's t with one
    degree of freedom fewer than its clusters.
    """

    def __init__(self, channels: int, dtype: str, scratch: Scratch | None = None, elements: int = 0,
                 flushed_below: float = 0.0, unmoved: bool = False) -> None:
        """``elements``: how many the regression will sum (runtime.numba_judging decides from it whether the
        pieces' sums run compiled, judge/numba_sums.py: the same numbers). ``flushed_below`` > 0: an actual 0 where
        the reference is below it (a subnormal flushed to zero, which the judge lets pass: Judging.ftz) is left
        out, as a non-finite element is, not read as a deviation. ``unmoved``: the output equals the reference bit
        for bit, every element finite (fed by add_unmoved: see there)."""
        self.flushed_below = flushed_below
        self.unmoved = unmoved
        self.undecided = False  # (unmoved) a decision add_unmoved's sums cannot make: fit() gives None
        # (unmoved) per clustering and channel: the first element's cluster (-1: none yet) and whether another
        # element's cluster differs from it (two clusters or more: all the fit needs to know of them there)
        self.first_cluster = np.full((2, channels), -1, dtype=np.int64)
        self.spread = np.zeros((2, channels), dtype=bool)
        # Per clustering, channel and cluster: the 6 distinct entries of X'X and the 3 of X'd.
        self.cross = np.zeros((2, channels, CLUSTERS, 9))
        self.dd = np.zeros(channels)
        self.ulp_squares = np.zeros(channels)  # of the actual output's spacing
        self.dtype = dtype
        # A block's d and the actual output's ULP spacing; a piece's bins by both keys (2, size) and products.
        self.scratch = Scratch() if scratch is None else scratch
        self.compiled = _compiled_sums() if not unmoved and runtime.numba_judging(elements) else None

    def add(self, xhat: np.ndarray, reference: np.ndarray, actual: np.ndarray, diff_dst: np.ndarray,
            channels: slice) -> None:
        """Float64 blocks of shape (n, c, s); non-finite elements are left out."""
        block = BlockSums(self, xhat.shape, by_piece=False)
        for piece in blocks(xhat.shape, PIECE):
            np.subtract(actual[piece], reference[piece], out=block.difference[piece])
            block.add(piece, PieceValues(xhat[piece], reference[piece], actual[piece], diff_dst[piece]))
        self._add_sums(block, channels)
        # The actual output's spacing in d's memory, now that d is summed: one block-sized buffer, not two (the
        # diagnosis passes whole tensors).
        usable = np.isfinite(actual) & np.isfinite(reference) & np.isfinite(xhat)
        spacing = _spacing(actual, None if usable.all() else usable, self.dtype, block.difference)
        self.ulp_squares[channels] += np.einsum("ncs,ncs->c", spacing, spacing)

    def start(self, shape: tuple[int, int, int]) -> BlockSums:
        """The sums of one (n, c, s) block, to be fed piece by piece (BlockSums.add) and then handed to finish()."""
        return BlockSums(self, shape)

    def finish(self, block: BlockSums, channels: slice) -> None:
        """A block's sums into the channels ``channels`` it covers."""
        self._add_sums(block, channels)
        self.ulp_squares[channels] += np.einsum("ncs,ncs->c", block.spacing, block.spacing)

    def add_unmoved(self, values: PieceValues, channels: slice) -> None:
        """One (n, c, s) piece of channels ``channels`` of an output equal to its reference bit for bit, every
        element finite (the caller's promise; d = 0 everywhere). There every channel's fit is scale 0 and stderr 0
        whatever the sums of x and r (the X'd sums are +0: beta is +0, every score 0); the sums only decide which
        channels can be fitted (fit's ``ok``). So the counts per cluster are summed exactly (integers) and the
        other sums per channel in any order (einsum, not one scattered sum each), and fit() checks that no
        decision lies within those sums' rounding of its threshold (else it gives None: the exact sums then). Of
        the clusters only whether a channel's elements fall in two or more matters (the robust error is 0 whatever
        their number): its elements are hashed until one differs from its first (``spread``), then no more; every
        element counts (in cluster 0's count). A non-finite xhat (left out by the exact sums) makes the fit
        undecided too."""
        x, r = values.xhat, values.reference
        if not np.isfinite(x).all():
            self.undecided = True
            return
        self.cross[:, channels, 0, 0] += r.shape[0] * r.shape[2]
        for clustering, key in enumerate((values.diff_dst, r)):
            pending = np.flatnonzero(~self.spread[clustering, channels])
            if pending.size:
                self._spread(clustering, key[:, pending], channels.start + pending)
        totals = [np.einsum("ncs->c", x), np.einsum("ncs->c", r), np.einsum("ncs,ncs->c", x, x),
                  np.einsum("ncs,ncs->c", x, r), np.einsum("ncs,ncs->c", r, r)]
        self.cross[:, channels, 0, 1:6] += np.stack(totals, axis=1)
        spacing = _spacing(values.actual, None, self.dtype, self.scratch.get("spacing", r.shape))
        self.ulp_squares[channels] += np.einsum("ncs,ncs->c", spacing, spacing)

    def _spread(self, clustering: int, key: np.ndarray, channels: np.ndarray) -> None:
        """add_unmoved's clusters: the (n, k, s) keys of the channels ``channels`` (indices) not yet seen in two."""
        ids = cluster_of(key)
        first = self.first_cluster[clustering, channels]
        first = np.where(first < 0, ids[0, :, 0], first)
        self.first_cluster[clustering, channels] = first
        self.spread[clustering, channels] |= (ids != first[None, :, None]).any(axis=(0, 2))

    def _clusters(self) -> np.ndarray:
        """(2, C): per clustering and channel, its clusters holding an element; unmoved: 1, or 2 for two or more."""
        if self.unmoved:
            return np.where(self.spread, 2, np.minimum(self.cross[:, :, 0, 0], 1)).astype(np.int64)
        return np.count_nonzero(self.cross[:, :, :, 0], axis=2)

    def _add_sums(self, block: BlockSums, channels: slice) -> None:
        c = block.sums.shape[2] // CLUSTERS
        self.cross[:, channels] += block.sums.transpose(0, 2, 1).reshape(2, c, CLUSTERS, 9)
        self.dd[channels] += np.einsum("ncs,ncs->c", block.difference, block.difference)

    def fit(self) -> ChannelFit | None:
        """The channels' fits; None when the regression is unmoved (add_unmoved) and its sums cannot decide
        which channels can be fitted: the caller then sums exactly."""
        if self.undecided:
            return None
        totals = self.cross[0].sum(axis=1)
        gram = _symmetric(totals[:, :6])
        rhs = totals[:, 6:]
        count = gram[:, 0, 0]
        norms = np.sqrt(np.diagonal(gram, axis1=1, axis2=2))
        safe = np.where(norms > 0, norms, 1.0)
        unit_gram = gram / safe[:, :, None] / safe[:, None, :]  # unit diagonal: better conditioned
        ok = (count >= MIN_ELEMENTS) & np.all(norms > 0, axis=1)
        # r nearly a multiple of xhat (diff_dst constant over the channel: diff_src is -k*xhat*
        # diff_gamma/M) confounds scale with slope, a sum error with a scaling bug: no estimate.
        determinant = np.abs(np.linalg.det(np.where(ok[:, None, None], unit_gram, np.eye(3))))
        if self.unmoved and not _decided(gram, norms, determinant, self.ulp_squares, ok):
            return None
        ok &= determinant > COLLINEAR
        # The output's resolution must show r's variation: where the actual values' spacing is
        # not well below r's spread (a large correct sum error moved every element to one
        # value), rounding makes d = -r exactly and a scale says nothing.
        ok &= norms[:, 2] > RESOLUTION * np.sqrt(self.ulp_squares)
        clusters = self._clusters()
        ok &= clusters.min(axis=0) >= 2
        inverse = np.linalg.inv(np.where(ok[:, None, None], unit_gram, np.eye(3)))
        coef = np.einsum("cij,cj->ci", inverse, rhs / safe)  # in the unit-diagonal basis
        sse = np.maximum(self.dd - np.einsum("ci,ci->c", coef, rhs / safe), 0.0)
        beta = coef / safe  # in the original basis
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = sse / np.maximum(count - 3, 1)
            stderr = np.sqrt(variance * inverse[:, 2, 2]) / safe[:, 2]
            robust = np.max([_robust_stderr(cross, beta, (inverse, safe), held) for cross, held in zip(self.cross, clusters)],
                            axis=0)
            # However few the clusters, rounding moves an element by at most about an ulp: the
            # scale that an ulp of error on every element, all in step, would fit bounds it.
            rms_ulp = np.sqrt(self.ulp_squares / np.maximum(count, 1))
            in_step = rms_ulp * np.sqrt(inverse[:, 2, 2] * count) / safe[:, 2]
            stderr = np.maximum(stderr, np.minimum(robust, in_step))
            rms = np.sqrt(variance)
            rms_x = norms[:, 1] / np.sqrt(np.maximum(count, 1))
            rms_r = norms[:, 2] / np.sqrt(np.maximum(count, 1))
        nan = np.where(ok, 1.0, np.nan)
        return ChannelFit(beta[:, 0] * nan, beta[:, 1] * nan, beta[:, 2] * nan, stderr * nan, rms * nan, rms_x, rms_r)


def _decided(gram: np.ndarray, norms: np.ndarray, determinant: np.ndarray, ulp_squares: np.ndarray,
             checked: np.ndarray) -> bool:
    """Whether sums formed in another order than the exact ones' (ChannelRegression.add_unmoved) make fit's
    decisions as the exact sums would, in the channels ``checked`` (count and norms already decided: integers, and
    sums of squares that are 0 in any order or none): every sum finite and far from overflowing, the determinant
    and r's norm against its resolution each farther from its threshold than the two orders can differ. Two
    orders of M terms differ by at most 2*M*u*sum|t| (u = 2**-53); for the unit Gram matrix's entries (correlations,
    by Cauchy-Schwarz) that is at most 4*M*u each, for its determinant at most 48*M*u: 64*M*u is the margin."""
    if not checked.any():
        return True
    entries = gram[checked]
    if not (np.isfinite(entries).all() and np.abs(entries).max() < 2.0**1000):
        return False
    gamma = (float(gram[checked, 0, 0].max()) + 1024) * 2.0**-53
    margin = 64 * gamma + 2.0**-40
    if np.any(np.abs(determinant[checked] - COLLINEAR) <= margin):
        return False
    resolution = RESOLUTION * np.sqrt(ulp_squares[checked])
    return not np.any(np.abs(norms[checked, 2] - resolution) <= margin * norms[checked, 2])


@dataclass(frozen=True)
class PieceValues:
    """One piece of a block, float64 arrays of one shape (n, c, s): what the regression reads besides d."""

    xhat: np.ndarray
    reference: np.ndarray
    actual: np.ndarray
    diff_dst: np.ndarray


class BlockSums:
    """One block's sums (ChannelRegression.start): per clustering, product and bin, from 0 over the block's
    elements in storage order, piece after piece (np.add.at adds in order: the sums of one np.bincount over the
    block, bit for bit, however the block is cut), each piece's bins and products formed and summed while they
    are in the CPU's cache. ``difference``: the block's d = actual - reference, which the caller writes piece by
    piece before add (the judge's verdict reads it too); ``spacing``: the actual output's ULP spacing."""

    def __init__(self, regression: ChannelRegression, shape: tuple[int, int, int], by_piece: bool = True) -> None:
        self.regression = regression
        bins = shape[1] * CLUSTERS
        # compiled: the sums bin by bin (judge/numba_sums.py), read as the (2, 9, bins) sums by ``sums``
        self.table = np.zeros((bins, 18)) if regression.compiled is not None else None
        self._sums = np.zeros((2, 9, bins)) if self.table is None else None
        self.difference = regression.scratch.get("difference", shape)
        # by_piece False: the caller forms the spacing itself, after d is summed (ChannelRegression.add)
        self.spacing = regression.scratch.get("spacing", shape) if by_piece else None
        self.masked = False  # whether some element was left out (its d set to 0): d is then not a - r there

    @property
    def sums(self) -> np.ndarray:
        """(2, 9, bins): per clustering (by diff_dst, by reference), the sums of w, x, r, x*x, x*r, r*r (the _PAIRS
        order), d, x*d and r*d per bin."""
        if self.table is None:
            return self._sums
        return self.table.reshape(-1, 2, 9).transpose(1, 2, 0)

    def add(self, piece: tuple[slice, slice, slice], values: PieceValues, finite: bool = False) -> None:
        """The piece ``piece`` of the block; ``finite``: the caller knows that actual, reference and xhat are all
        finite there (else it is checked)."""
        d = self.difference[piece]
        usable = None if finite else np.isfinite(values.actual) & np.isfinite(values.reference) & np.isfinite(values.xhat)
        flushed = _flushed(values, self.regression.flushed_below) if self.regression.flushed_below else None
        if flushed is not None:
            usable = ~flushed if usable is None else usable & ~flushed
        if usable is None or usable.all():  # the usual case: nothing to mask, and the weight w is 1 (counted, not summed)
            w, x, r, usable = None, values.xhat, values.reference, None
        else:
            w = usable.astype(np.float64)
            x, r = (np.where(usable, v, 0.0) for v in (values.xhat, values.reference))
            np.copyto(d, np.where(usable, d, 0.0))
            self.masked = True
        if self.table is not None:
            self._add_compiled(piece, values, (w, x, r, d))
        else:
            bins = self._bins(values.diff_dst, values.reference, piece[1])
            self._add_piece(bins, tuple(None if v is None else v.reshape(-1) for v in (w, x, r, d)))
        if self.spacing is None:
            return
        out = self.spacing[piece]
        spacing = _spacing(values.actual, usable, self.regression.dtype, out)
        if not np.may_share_memory(spacing, out):  # (float64's spacing is built apart)
            np.copyto(out, spacing)

    def _add_compiled(self, piece: tuple[slice, slice, slice], values: PieceValues, basis: tuple) -> None:
        """_bins and _add_piece in one compiled loop (judge/numba_sums.py): the same sums."""
        w, x, r, d = basis
        keys = tuple(np.ascontiguousarray(k, dtype=np.float64).reshape(-1).view(np.uint64)
                     for k in (values.diff_dst, values.reference))
        weights = _NO_WEIGHTS if w is None else w
        basis = tuple(np.ascontiguousarray(v, dtype=np.float64).reshape(-1) for v in (x, r, d, weights))
        geometry = (piece[1].start, *x.shape[1:], CLUSTERS)
        self.regression.compiled.piece_sums(self.table, keys, basis, geometry, np.uint64(64 - CLUSTER_BITS))

    def _bins(self, diff_dst: np.ndarray, reference: np.ndarray, channels: slice) -> np.ndarray:
        """(2, size): each element of a piece (n, c, s) whose channels are ``channels`` of the block: its bin,
        channel * CLUSTERS + its cluster, by diff_dst and by reference."""
        bins = self.regression.scratch.get("bins", (2, *reference.shape), INT64)
        for key, out in zip((diff_dst, reference), bins):
            cluster_of(key, out=out.view(np.uint64))
        bins += np.arange(channels.start, channels.stop)[:, None] * CLUSTERS
        return bins.reshape(2, -1)

    def _add_piece(self, bins: np.ndarray, basis: tuple) -> None:
        """One piece's w, x, r and d into the block's sums (w None: every weight is 1); bins: (2, piece)."""
        sums = self._sums
        w, x, r, d = basis
        # X'X and X'd entries in _PAIRS order, then d: w*w = w, w*x = x and w*d = d exactly (x, r and d
        # are 0 wherever w is), so only five products are formed (into reused buffers).
        xx, xr, rr = (np.multiply(p, q, out=out) for (p, q), out in zip(
            ((x, x), (x, r), (r, r)), self.regression.scratch.take(_PRODUCTS[:3], x.size)))
        _scatter(sums[:, :6], bins, (w, x, r, xx, xr, rr))
        # Where d is 0 (the output equals the reference there), d, x*d and r*d add ±0 to sums that began at +0:
        # no bit changes, so only d's non-zero elements are scattered (none, when the piece is exact).
        nonzero = np.not_equal(d, 0.0, out=self.regression.scratch.get("nonzero", d.size, BOOL))
        count = int(np.count_nonzero(nonzero))  # (of a boolean mask: several times faster than of d itself)
        if count == 0:
            return
        if count <= d.size * SPARSE:
            where = np.flatnonzero(nonzero)
            d, x, r, bins = d[where], x[where], r[where], np.take(bins, where, axis=1)
        xd, rd = (np.multiply(p, d, out=out) for p, out in zip((x, r), self.regression.scratch.take(_PRODUCTS[3:], d.size)))
        _scatter(sums[:, 6:], bins, (d, xd, rd))


def _flushed(values: PieceValues, below: float) -> np.ndarray | None:
    """Where the actual output is 0 and the reference is subnormal (0 < |r| < ``below``); None where nowhere."""
    zero = values.actual == 0
    if not zero.any():  # the usual case: one comparison per element
        return None
    ref = np.abs(values.reference)
    flushed = zero & (ref > 0) & (ref < below)
    return flushed if flushed.any() else None


_NO_WEIGHTS = np.zeros(0)  # (the compiled sums' w when every weight is 1)


def _compiled_sums():
    """judge/numba_sums.py, imported with numba's settings (runtime.prepare_numba); None when numba fails to load
    (the NumPy sums then, the same numbers)."""
    runtime.prepare_numba()
    try:
        from bnbwd_cli.judge import numba_sums
    except ImportError:
        return None
    return numba_sums


def _spacing(actual: np.ndarray, usable: np.ndarray | None, dtype: str, out: np.ndarray) -> np.ndarray:
    """The actual output's ULP spacing where ``usable`` (None: everywhere), 0 elsewhere; built in ``out`` (float64,
    the shape of actual) when every element is usable."""
    if usable is None:
        return ulp_spacing(actual, dtype, out=out.reshape(-1).view(INT64))
    return np.where(usable, ulp_spacing(np.where(usable, actual, 0.0), dtype), 0.0)


def _scatter(sums: np.ndarray, bins: np.ndarray, products: tuple) -> None:
    """Each product's values added to its bin's sum, element after element in storage order; sums (2, k, bins) by
    both clusterings, bins (2, size); a product None is a weight of 1 everywhere (its sums are the counts)."""
    for clustering, ids in enumerate(bins):
        for k, values in enumerate(products):
            if values is None:  # the counts, the sums of w = 1 (integers: exact in any order)
                sums[clustering, k] += np.bincount(ids, None, sums.shape[2])
            else:  # faster than np.bincount with weights, and the same sequential sums
                np.add.at(sums[clustering, k], ids, values)


def _robust_stderr(cross: np.ndarray, beta: np.ndarray, bread: tuple[np.ndarray, np.ndarray],
                   clusters: np.ndarray) -> np.ndarray:
    """Cluster-robust standard error of the r coefficient: bread = (X'X)^-1 (its unit-diagonal inverse and the
    norms that scale it), meat = sum over clusters of the outer products of each cluster's score
    X_g'(d_g - X_g beta); ``clusters``: how many clusters hold an element, per channel."""
    inverse, safe = bread
    scores = cross[:, :, 6:] - np.einsum("cgij,cj->cgi", _symmetric(cross[:, :, :6]), beta)
    scores = scores / safe[:, None, :]  # into the unit-diagonal basis of `inverse`
    meat = np.einsum("cgi,cgj->cij", scores, scores)
    correction = clusters / np.maximum(clusters - 1, 1)  # the usual small-sample factor G/(G-1)
    row = inverse[:, 2, :]  # the r coefficient's row of the bread
    variance = np.einsum("cj,cjk,ck->c", row, meat, row) * correction
    return np.sqrt(np.maximum(variance, 0.0)) / safe[:, 2] * t_inflation(clusters - 1)


# Student t quantile over the normal one at BIAS_Z = 6 (two-sided p = 2e-9), degrees of freedom
# 1..15 (computed with mpmath); beyond, the two-term Cornish-Fisher expansion. A robust error from
# G clusters has G - 1 degrees of freedom: with bf16 diff_dst = 1000 + N(0, 1) a channel has ~5.
_T_OVER_Z = (5.38e7, 3750.0, 173.0, 39.1, 16.5, 9.49, 6.46, 4.89, 3.96, 3.36, 2.95, 2.65, 2.43, 2.26, 2.12)


def t_inflation(dof: np.ndarray) -> np.ndarray:
    dof = np.maximum(np.asarray(dof, dtype=np.float64), 1.0)
    z = BIAS_Z
    expansion = 1 + (z * z + 1) / (4 * dof) + (5 * z**4 + 16 * z * z + 3) / (96 * dof * dof)
    table = np.asarray(_T_OVER_Z)[np.minimum(dof, len(_T_OVER_Z)).astype(int) - 1]
    return np.where(dof <= len(_T_OVER_Z), table, expansion)


_PAIRS = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))


def _symmetric(entries: np.ndarray) -> np.ndarray:
    """(..., 6) upper-triangle entries in _PAIRS order -> (..., 3, 3)."""
    out = np.empty(entries.shape[:-1] + (3, 3))
    for k, (i, j) in enumerate(_PAIRS):
        out[..., i, j] = out[..., j, i] = entries[..., k]
    return out


def cluster_of(key: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Hash each element's key (its float64 bits) into one of CLUSTERS groups (Fibonacci hashing).
    ``out``: a uint64 array of key's shape to build the ids in."""
    bits = np.multiply(np.ascontiguousarray(key, dtype=np.float64).view(np.uint64), np.uint64(0x9E3779B97F4A7C15), out=out)
    bits >>= np.uint64(64 - CLUSTER_BITS)
    return bits.view(np.intp)  # < CLUSTERS: the same value read as a signed integer, no copy


def pooled_bias(scale: np.ndarray, stderr: np.ndarray, unit: float) -> Bias | None:
    """Pool per-channel scales into one; flag the overall scale and each significant channel."""
    usable = np.isfinite(scale) & np.isfinite(stderr)
    if not usable.any():
        return None
    floor = BIAS_FLOOR_UNITS * unit
    se = np.maximum(stderr[usable], unit * 1e-3)  # a perfect fit has no residual: still not infinitely sure
    weights = 1.0 / se**2
    overall = float(np.sum(weights * scale[usable]) / np.sum(weights))
    overall_se = float(1.0 / np.sqrt(np.sum(weights)))
    threshold = bias_threshold(overall_se, floor)
    flagged = tuple(
        (int(c), float(scale[c]), float(max(stderr[c], unit * 1e-3)))
        for c in np.flatnonzero(usable)
        if abs(scale[c]) > bias_threshold(max(stderr[c], unit * 1e-3), floor)
    )
    significant = bool(abs(overall) > threshold or flagged)
    return Bias(overall, overall_se, threshold, significant, flagged, floor)


def vector_bias(actual: np.ndarray, reference: np.ndarray, noise: np.ndarray, unit: float,
                systematic: np.ndarray | None = None, flushed_below: float = 0.0) -> Bias | None:
    """One scale over the channels of a (C,) output: actual ~ (1 + scale) * reference, noise = its sd.

    ``systematic``: per-channel errors a correct kernel may make *in the same direction* on every
    channel (a float32 accumulator's correlated roundings, judge/model.py); a scale up to
    SYSTEMATIC_UNITS times what they would fit to is not a deviation. ``flushed_below`` > 0: an actual 0 where
    the reference is below it (a subnormal flushed to zero, which the judge lets pass: Judging.ftz) is left out,
    as ChannelRegression leaves it out of diff_src's fit (its noise is the subnormal's tiny ulp: a -100% error
    there would weigh as a bias).
    """
    usable = np.isfinite(actual) & np.isfinite(reference) & (noise > 0) & (reference != 0)
    if flushed_below > 0:
        usable &= ~((actual == 0) & (np.abs(reference) < flushed_below))
    if usable.sum() < MIN_CHANNELS:
        return None
    r, d, w = reference[usable], actual[usable] - reference[usable], 1.0 / noise[usable] ** 2
    information = float(np.sum(w * r * r))
    scale = float(np.sum(w * r * d) / information)
    stderr = 1.0 / np.sqrt(information)
    floor = BIAS_FLOOR_UNITS * unit
    if systematic is not None:
        floor = max(floor, SYSTEMATIC_UNITS * float(np.sum(w * np.abs(r) * systematic[usable]) / information))
    threshold = bias_threshold(stderr, floor)
    return Bias(scale, float(stderr), float(threshold), bool(abs(scale) > threshold), (), floor)
