"""A blind zoo: batch-norm backward kernels written from the outside, to measure bnbwd's diagnosis honestly.

Issue 34's held-out test set is kept from the project, so this zoo stands in for it: its kernels were written
from the issue's text and from how real kernels are written (PyTorch's CPU and CUDA batch-norm backward,
oneDNN's, TensorFlow's FusedBatchNormGradV3), not from the project's own bug families or diagnosis code, which
its author did not read. Each kernel is plain NumPy: the sums, then the elementwise pass, in float32 (or
wider) as the real kernel computes them; a failing kernel carries one planted bug, its ground truth (the causes
that name it, the words its numbers take) and the region of the output it spoils, for tools/blind_check.py.

Every entry is a function of its seed alone (the same arrays on any machine). Sizes stay under ~2M elements so
that the whole zoo runs through the CLI in a few minutes on 2 cores.

    python -m tools.blind_zoo            # list the entries
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_dtypes
import numpy as np

F32, F64 = np.float32, np.float64
DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
EPS = 1e-5


@dataclasses.dataclass
class Problem:
    """One problem's inputs in the kernel's logical NCHW view, and how they are stored."""

    x: np.ndarray  # (N, C, H, W) in the storage dtype
    dy: np.ndarray
    mean: np.ndarray  # (C,) float32: the statistics the forward saved (what bnbwd is given)
    var: np.ndarray
    gamma: np.ndarray
    layout: str  # NCHW or NHWC
    dtype: str
    rng: np.random.Generator  # the bug's own random choices

    @property
    def shape(self):
        return self.x.shape

    @property
    def m(self) -> int:
        n, _, h, w = self.x.shape
        return n * h * w

    def stored(self, a: np.ndarray) -> np.ndarray:
        """A logical (N, C, H, W) array as the file stores it (channels last for NHWC)."""
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1) if self.layout == "NHWC" else a)

    def logical(self, a: np.ndarray) -> np.ndarray:
        return a.transpose(0, 3, 1, 2) if self.layout == "NHWC" else a

    def inputs(self) -> dict:
        return {
            "src": self.stored(self.x), "diff_dst": self.stored(self.dy), "mean": self.mean,
            "variance": self.var, "gamma": self.gamma, "epsilon": np.float32(EPS),
            "data_format": np.array(self.layout),
        }


@dataclasses.dataclass
class Planted:
    """A kernel's outputs (logical view, float32 or wider) and the ground truth of its bug."""

    dx: np.ndarray
    dg: np.ndarray
    db: np.ndarray
    causes: tuple = ()  # hint causes that name the bug exactly: "cause" or "cause:words in its evidence"
    coarse: tuple = ()  # true but less precise answers: "cause" or "cause:words in its evidence"
    words: str = ""  # a regex the naming hint's text must match (the fitted numbers, the subset)
    region: np.ndarray | None = None  # stored-shape mask of diff_src elements the bug spoils (None: not local)
    region_output: str = "diff_src"  # or diff_gamma / diff_beta (a (C,) mask), or "nonfinite"
    stored_dx: np.ndarray | None = None  # diff_src already in storage layout and dtype (storage-order bugs)
    what: str = ""


@dataclasses.dataclass
class Entry:
    name: str
    kind: str
    kernel: Callable[[Problem], Planted]
    correct: bool
    dtype: str = "f32"
    layout: str = "NCHW"
    shape: tuple = (4, 32, 16, 16)
    seed: int = 0
    data: str = "normal"  # normal | offset (|mean|/sd large) | tiny (a channel at subnormal scale)

    def problem(self) -> Problem:
        rng = np.random.default_rng(self.seed)
        n, c, h, w = self.shape
        dt = DTYPES[self.dtype]
        loc = rng.normal(0, 2, c)
        sd = rng.uniform(0.5, 2.0, c)
        if self.data == "offset":
            loc = rng.choice([-1, 1], c) * sd * rng.uniform(200, 400, c)
        x = (rng.standard_normal((n, c, h, w)) * sd[:, None, None] + loc[:, None, None]).astype(dt)
        dy = rng.standard_normal((n, c, h, w)).astype(dt)
        if self.data == "tiny":  # one channel's gradient at subnormal scale (a masked, vanishing gradient)
            dy[:, 3] = (rng.standard_normal((n, h, w)) * 2e-39).astype(F32).astype(dt)
        x64 = x.astype(F64)
        mean = x64.mean((0, 2, 3)).astype(F32)
        var = x64.var((0, 2, 3)).astype(F32)
        gamma = rng.uniform(0.5, 1.5, c).astype(F32)
        return Problem(x, dy, mean, var, gamma, self.layout, self.dtype, rng)

    def run(self) -> tuple[dict, dict, Planted]:
        """(inputs, kernel outputs, ground truth), the outputs as the kernel writes them."""
        p = self.problem()
        planted = self.kernel(p)
        dt = DTYPES[self.dtype]
        dx = planted.stored_dx if planted.stored_dx is not None else p.stored(planted.dx.astype(F32).astype(dt))
        outputs = {"diff_src": dx, "diff_gamma": np.asarray(planted.dg, F32), "diff_beta": np.asarray(planted.db, F32)}
        return p.inputs(), outputs, planted


# --- the pieces of a plain float32 kernel ------------------------------------------------------------------------

def ch(v):
    """A (C,) vector broadcast over (N, C, H, W)."""
    return np.asarray(v)[None, :, None, None]


def invstd_of(var, acc=F32):
    return (1 / np.sqrt(var.astype(acc) + acc(EPS))).astype(acc)


def sums(p: Problem, mean=None, invstd=None, acc=F32):
    """diff_beta and diff_gamma as a CPU kernel reduces them (NumPy's pairwise sums in `acc`)."""
    mean = p.mean if mean is None else mean
    invstd = invstd_of(p.var, acc) if invstd is None else invstd
    x, dy = p.x.astype(acc), p.dy.astype(acc)
    xhat = (x - ch(mean.astype(acc))) * ch(invstd.astype(acc))
    return dy.sum((0, 2, 3), dtype=acc), (dy * xhat).sum((0, 2, 3), dtype=acc)


def elementwise(p: Problem, db, dg, mean=None, invstd=None, gamma=None, m=None, acc=F32, terms=(1, 1, 1)):
    """diff_src = gamma*invstd*(a*dy - b*db/M - c*xhat*dg/M)."""
    mean = p.mean if mean is None else mean
    invstd = invstd_of(p.var, acc) if invstd is None else invstd
    gamma = p.gamma if gamma is None else gamma
    m = p.m if m is None else m
    a, b, c = terms
    x, dy = p.x.astype(acc), p.dy.astype(acc)
    xhat = (x - ch(np.asarray(mean, acc))) * ch(np.asarray(invstd, acc))
    k = ch((np.asarray(gamma, acc) * np.asarray(invstd, acc)).astype(acc))
    return k * (acc(a) * dy - acc(b) * ch(np.asarray(db, acc) / acc(m)) - acc(c) * xhat * ch(np.asarray(dg, acc) / acc(m)))


def reference_kernel(p: Problem, **kw) -> Planted:
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, **kw), dg, db)


def channel_positions(p: Problem, a: np.ndarray) -> np.ndarray:
    """(C, M): each channel's elements in the kernel's reduction order (storage order of the other axes)."""
    return a.transpose(1, 0, 2, 3).reshape(a.shape[1], -1)  # n, h, w: the same order in either layout


def masked_sums(p: Problem, keep: np.ndarray):
    """The sums over a (C, M) weight of each channel's elements (0: skipped, 2: counted twice)."""
    invstd = invstd_of(p.var)
    xhat = (p.x.astype(F32) - ch(p.mean)) * ch(invstd)
    dyc = channel_positions(p, p.dy.astype(F32))
    xhc = channel_positions(p, xhat)
    w = keep.astype(F32)
    return (dyc * w).sum(1, dtype=F32), (dyc * xhc * w).sum(1, dtype=F32)


def region_where(p: Problem, logical_mask: np.ndarray) -> np.ndarray:
    return p.stored(np.broadcast_to(logical_mask, p.shape))


def to16(a, dtype):
    return np.asarray(a, F32).astype(dtype).astype(F32)


# --- correct kernels -----------------------------------------------------------------------------------------------

def k_pytorch_cpu(p):
    """PyTorch's CPU batch_norm_backward: per-channel sums (vectorised, pairwise), then the elementwise pass."""
    return reference_kernel(p)


def k_f64_accumulate(p):
    db, dg = sums(p, acc=F64)
    return Planted(elementwise(p, db, dg, acc=F64), dg, db)


def k_kahan(p):
    """Kahan-compensated sums, 64 running lanes per channel (a vectorised CPU loop), lanes added at the end."""
    invstd = invstd_of(p.var)
    xhat = (p.x.astype(F32) - ch(p.mean)) * ch(invstd)
    out = []
    for v in (channel_positions(p, p.dy.astype(F32)), channel_positions(p, p.dy.astype(F32) * xhat)):
        c, m = v.shape
        lanes = 64
        pad = (-m) % lanes
        v = np.concatenate([v, np.zeros((c, pad), F32)], 1).reshape(c, -1, lanes)
        s = np.zeros((c, lanes), F32)
        comp = np.zeros((c, lanes), F32)
        for i in range(v.shape[1]):
            y = v[:, i] - comp
            t = s + y
            comp = (t - s) - y
            s = t
        out.append(s.sum(1, dtype=F32))
    db, dg = out
    return Planted(elementwise(p, db, dg), dg, db)


def k_split_blocks(p, block=256):
    """CUDA-style: each block of 256 of a channel's elements tree-reduced, the block partials added in order."""
    invstd = invstd_of(p.var)
    xhat = (p.x.astype(F32) - ch(p.mean)) * ch(invstd)
    out = []
    for v in (channel_positions(p, p.dy.astype(F32)), channel_positions(p, p.dy.astype(F32) * xhat)):
        c, m = v.shape
        pad = (-m) % block
        v = np.concatenate([v, np.zeros((c, pad), F32)], 1).reshape(c, -1, block)
        while v.shape[2] > 1:  # shared-memory tree: s[i] += s[i + half]
            half = v.shape[2] // 2
            v = v[:, :, :half] + v[:, :, half:]
        parts = v[:, :, 0]
        total = np.zeros(c, F32)
        for i in range(parts.shape[1]):
            total = total + parts[:, i]
        out.append(total)
    db, dg = out
    return Planted(elementwise(p, db, dg), dg, db)


def k_warp_shuffle(p):
    """Each of 32 lanes accumulates a strided share sequentially, then a shuffle-down butterfly (CUDA warp reduce)."""
    invstd = invstd_of(p.var)
    xhat = (p.x.astype(F32) - ch(p.mean)) * ch(invstd)
    out = []
    for v in (channel_positions(p, p.dy.astype(F32)), channel_positions(p, p.dy.astype(F32) * xhat)):
        c, m = v.shape
        pad = (-m) % 32
        v = np.concatenate([v, np.zeros((c, pad), F32)], 1).reshape(c, -1, 32)
        acc = np.zeros((c, 32), F32)
        for i in range(v.shape[1]):
            acc = acc + v[:, i]
        off = 16
        while off:
            acc = acc[:, :off] + acc[:, off:2 * off]
            off //= 2
        out.append(acc[:, 0])
    db, dg = out
    return Planted(elementwise(p, db, dg), dg, db)


def k_tf_fused(p):
    """TensorFlow's FusedBatchNormGrad: x_offset = x - mean; dx = scale*invstd*(dy - mean(dy) -
    x_offset*invstd^2*mean(dy*x_offset)); scale_backprop = sum(dy*x_offset)*invstd."""
    invstd = invstd_of(p.var)
    x, dy = p.x.astype(F32), p.dy.astype(F32)
    xo = x - ch(p.mean)
    db = dy.sum((0, 2, 3), dtype=F32)
    dyxo = (dy * xo).sum((0, 2, 3), dtype=F32)
    m = F32(p.m)
    dx = ch(p.gamma * invstd) * (dy - ch(db / m) - xo * ch(invstd * invstd * dyxo / m))
    return Planted(dx, dyxo * invstd, db)


def k_onednn_nhwc(p):
    """oneDNN-style channels-last: partial sums per (n, h) row of W*C values, rows added in order, then the pass."""
    invstd = invstd_of(p.var)
    x = p.x.astype(F32).transpose(0, 2, 3, 1)  # n, h, w, c
    dy = p.dy.astype(F32).transpose(0, 2, 3, 1)
    xhat = (x - p.mean) * invstd
    rows_db = dy.sum(2, dtype=F32).reshape(-1, x.shape[3])
    rows_dg = (dy * xhat).sum(2, dtype=F32).reshape(-1, x.shape[3])
    db, dg = np.zeros(x.shape[3], F32), np.zeros(x.shape[3], F32)
    for r in range(rows_db.shape[0]):
        db, dg = db + rows_db[r], dg + rows_dg[r]
    return Planted(elementwise(p, db, dg), dg, db)


def k_own_welford_small_m(p):
    """PyTorch-like with its own saved statistics: Welford in float32 over the batch, used instead of the given."""
    x = channel_positions(p, p.x.astype(F32))
    c, m = x.shape
    mean = np.zeros(c, F32)
    m2 = np.zeros(c, F32)
    for i in range(m):
        d = x[:, i] - mean
        mean = mean + d / F32(i + 1)
        m2 = m2 + d * (x[:, i] - mean)
    var = (m2 / F32(m)).astype(F32)
    invstd = invstd_of(var)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db)


def k_ftz(p):
    """A correct kernel built with -ftz (fast math): results below float32's normal range written as zero."""
    planted = reference_kernel(p)
    dx = planted.dx.astype(F32)
    dx[np.abs(dx) < np.finfo(F32).tiny] = 0
    return Planted(dx, planted.dg, planted.db)


def k_daz(p):
    """A correct kernel with FTZ and DAZ (x86 fast math): subnormal inputs read as zero, subnormal results zero."""
    tiny = np.finfo(F32).tiny
    dy = p.dy.astype(F32).copy()
    dy[np.abs(dy) < tiny] = 0
    q = dataclasses.replace(p, dy=dy)
    planted = reference_kernel(q)
    dx = planted.dx.astype(F32)
    dx[np.abs(dx) < tiny] = 0
    return Planted(dx, planted.dg, planted.db)


# --- failing kernels: where the elementwise pass goes wrong --------------------------------------------------------

def _storage_bug(p, planted, mask_flat, values_flat):
    """Write `values` into the stored diff_src where `mask` holds (flat, storage order)."""
    dt = DTYPES[p.dtype]
    good = p.stored(planted.dx.astype(F32).astype(dt))
    flat = good.reshape(-1).copy()
    flat[mask_flat] = values_flat.astype(F32).astype(dt)
    return flat.reshape(good.shape), mask_flat.reshape(good.shape)


def k_stride_lane(p):
    """A vectorised loop whose lane `off` of every k reads diff_dst one element ahead (an index off by one)."""
    k = int(p.rng.choice([16, 32, 64]))
    off = int(p.rng.integers(0, k))
    planted = reference_kernel(p)
    db, dg = planted.db, planted.dg
    shifted = p.logical(np.roll(p.stored(p.dy.astype(F32)).reshape(-1), -1).reshape(p.stored(p.dy).shape))
    q = dataclasses.replace(p, dy=shifted)
    wrong = p.stored(elementwise(q, db, dg).astype(F32)).reshape(-1)
    idx = np.arange(wrong.size)
    mask = idx % k == off
    stored, region = _storage_bug(p, planted, mask, wrong[mask])
    return dataclasses.replace(planted, stored_dx=stored, region=region, what=f"every {k}th stored element, offset {off}",
                               words=rf"every {k}(st|nd|rd|th) element")


def k_stale_tail(p):
    """The grid covers all but the last T elements of the buffer: they hold the previous call's output."""
    t = int(p.rng.integers(100, 700))
    planted = reference_kernel(p)
    prev = Entry("prev", "", k_pytorch_cpu, True, p.dtype, p.layout, p.shape, seed=int(p.rng.integers(1 << 30)))
    old = prev.problem()
    stale = p.stored(reference_kernel(old).dx.astype(F32)).reshape(-1)
    mask = np.zeros(stale.size, bool)
    mask[-t:] = True
    stored, region = _storage_bug(p, planted, mask, stale[mask])
    return dataclasses.replace(planted, stored_dx=stored, region=region, what=f"last {t} elements stale")


def k_rows_bound(p):
    """A row-tiled pass whose second tile (h >= h0) uses the inference formula (gamma*invstd*dy)."""
    h0 = int(p.rng.integers(p.shape[2] // 2, p.shape[2] - 1))
    planted = reference_kernel(p)
    rows = np.zeros(p.shape, bool)
    rows[:, :, h0:] = True
    wrong = ch(p.gamma * invstd_of(p.var)) * p.dy.astype(F32)
    dx = np.where(rows, wrong, planted.dx)
    return dataclasses.replace(planted, dx=dx, region=region_where(p, rows), what=f"rows h>={h0}")


def k_channel_tile(p):
    """Channels in tiles of 8: one tile uses its first channel's invstd for all of its channels."""
    c = p.shape[1]
    tile = 8
    t0 = int(p.rng.integers(0, c // tile)) * tile
    invstd = invstd_of(p.var)
    bad = invstd.copy()
    bad[t0:t0 + tile] = invstd[t0]
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    wrong = elementwise(p, planted.db, planted.dg, invstd=bad)
    dx[:, t0 + 1:t0 + tile] = wrong[:, t0 + 1:t0 + tile]
    mask = np.zeros(p.shape, bool)
    mask[:, t0 + 1:t0 + tile] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"c={t0 + 1}..{t0 + tile - 1}")


def k_channel_range_gamma(p):
    """A kernel launched in two halves of channels; the second half reads gamma from the first half's offset."""
    c = p.shape[1]
    c0 = c // 2
    gamma = p.gamma.copy()
    gamma[c0:] = p.gamma[:c - c0]
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    dx[:, c0:] = elementwise(p, planted.db, planted.dg, gamma=gamma)[:, c0:]
    mask = np.zeros(p.shape, bool)
    mask[:, c0:] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"c={c0}..{c - 1}")


def k_one_sample(p):
    """Sample n0's pointer into src is off by one sample: it is computed with sample n0-1's x."""
    n0 = int(p.rng.integers(1, p.shape[0]))
    x = p.x.copy()
    x[n0] = p.x[n0 - 1]
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    dx[n0] = elementwise(dataclasses.replace(p, x=x), planted.db, planted.dg)[n0]
    mask = np.zeros(p.shape, bool)
    mask[n0] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"n={n0}")


def k_spatial_tile(p):
    """A 2-D tiled pass (16x16 tiles): one tile is written transposed within the tile (shared-memory indexing)."""
    t = 16 if min(p.shape[2:]) >= 32 else 8
    h0 = int(p.rng.integers(0, p.shape[2] // t)) * t
    w0 = int(p.rng.integers(0, p.shape[3] // t)) * t
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    tile = dx[:, :, h0:h0 + t, w0:w0 + t]
    dx[:, :, h0:h0 + t, w0:w0 + t] = tile.transpose(0, 1, 3, 2)
    mask = np.zeros(p.shape, bool)
    mask[:, :, h0:h0 + t, w0:w0 + t] = ~np.eye(t, dtype=bool)
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"tile h={h0}..{h0 + t - 1} w={w0}..{w0 + t - 1}")


def k_spatial_tile_zero(p):
    """A 2-D tiled pass whose grid misses one 8x8 tile: left as the zeros the buffer was allocated with."""
    t = 8
    h0 = int(p.rng.integers(0, p.shape[2] // t)) * t
    w0 = int(p.rng.integers(0, p.shape[3] // t)) * t
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    dx[:, :, h0:h0 + t, w0:w0 + t] = 0
    mask = np.zeros(p.shape, bool)
    mask[:, :, h0:h0 + t, w0:w0 + t] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"tile h={h0}.. w={w0}.. zero")


def k_plane_remainder(p):
    """NCHW loop over (n, c) planes, vectorised by 8 with a scalar remainder loop that forgets gamma."""
    hw = p.shape[2] * p.shape[3]
    r = hw % 8 or 5
    planted = reference_kernel(p)
    wrong = elementwise(p, planted.db, planted.dg, gamma=np.ones_like(p.gamma))
    flat = np.zeros(hw, bool)
    flat[hw - r:] = True
    mask = np.broadcast_to(flat.reshape(p.shape[2], p.shape[3]), p.shape)
    dx = np.where(mask, wrong, planted.dx)
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"last {r} of each plane")


def k_half_warp(p):
    """Lanes 24..31 of every 32 consecutive stored elements take the sums' term with the wrong sign."""
    planted = reference_kernel(p)
    wrong = p.stored(elementwise(p, planted.db, planted.dg, terms=(1, 1, -1)).astype(F32)).reshape(-1)
    mask = (np.arange(wrong.size) % 32) >= 24
    stored, region = _storage_bug(p, planted, mask, wrong[mask])
    return dataclasses.replace(planted, stored_dx=stored, region=region, what="lanes 24..31 of 32",
                               causes=("fitted-terms",), words="sign")


def k_racy_writes(p):
    """Two blocks race on a few output elements (0.3%, scattered): the loser's partial value stays."""
    planted = reference_kernel(p)
    mask = p.rng.random(p.shape) < 0.003
    dx = np.where(mask, planted.dx * 0.5, planted.dx)
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), coarse=("unexplained:elementwise pass",),
                               what="0.3% scattered")


def k_nan_warp(p):
    """One warp reads uninitialised shared memory: 32 consecutive stored outputs are NaN."""
    planted = reference_kernel(p)
    size = int(np.prod(p.shape))
    start = int(p.rng.integers(0, size // 32)) * 32
    mask = np.zeros(size, bool)
    mask[start:start + 32] = True
    stored, region = _storage_bug(p, planted, mask, np.full(32, np.nan, F32))
    return dataclasses.replace(planted, stored_dx=stored, region=region, region_output="nonfinite",
                               what=f"NaN at stored {start}..{start + 31}")


def k_nan_channel(p):
    """invstd computed as rsqrt(var - eps) for one channel whose variance is tiny: NaN in that whole channel."""
    c0 = int(p.rng.integers(0, p.shape[1]))
    invstd = invstd_of(p.var)
    invstd[c0] = np.nan
    db, dg = sums(p)
    dx = elementwise(p, db, dg, invstd=invstd)
    mask = np.zeros(p.shape, bool)
    mask[:, c0] = True
    return Planted(dx, dg, db, region=region_where(p, mask), region_output="nonfinite", what=f"c={c0} NaN")


def k_inf_tail(p):
    """The remainder loop divides by a zero count: the last 40 stored elements are +-Inf."""
    planted = reference_kernel(p)
    size = int(np.prod(p.shape))
    mask = np.zeros(size, bool)
    mask[-40:] = True
    vals = np.where(p.rng.random(40) < 0.5, np.inf, -np.inf)
    stored, region = _storage_bug(p, planted, mask, vals)
    return dataclasses.replace(planted, stored_dx=stored, region=region, region_output="nonfinite", what="last 40 Inf")


def k_nan_scattered_channel(p):
    """One channel's accumulator starts uninitialised (NaN) for the sums: its diff_gamma and diff_src are NaN."""
    c0 = int(p.rng.integers(0, p.shape[1]))
    db, dg = sums(p)
    dg = dg.copy()
    dg[c0] = np.nan
    dx = elementwise(p, db, dg)
    mask = np.zeros(p.shape, bool)
    mask[:, c0] = True
    return Planted(dx, dg, db, region=region_where(p, mask), region_output="nonfinite", what=f"dgamma c={c0} NaN")


# --- failing kernels: other statistics -----------------------------------------------------------------------------

def k_own_onepass_stats(p):
    """The kernel recomputes its statistics in float32 with the one-pass E[x^2] - E[x]^2 (large |mean|/sd)."""
    x = p.x.astype(F32)
    mean = x.mean((0, 2, 3), dtype=F32)
    var = np.maximum((x * x).mean((0, 2, 3), dtype=F32) - mean * mean, F32(0))
    invstd = invstd_of(var)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db,
                   causes=("fitted-statistics", "own-batch-statistics"), what="own one-pass f32 stats")


def k_bf16_saved_stats(p):
    """Mixed precision: the forward saved mean and invstd in bfloat16 (truncated, not rounded)."""
    def trunc(v):
        b = np.asarray(v, F32).view(np.uint32) & np.uint32(0xFFFF0000)
        return b.view(F32)
    mean, invstd = trunc(p.mean), trunc(invstd_of(p.var))
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db,
                   causes=("fitted-statistics", "16-bit-statistics"), what="bf16-truncated stats")


def k_running_stats(p):
    """Training backward fed the running statistics (momentum 0.1 from a stale estimate) instead of the batch's."""
    run_mean = (0.9 * (p.mean + p.rng.normal(0, 0.3, p.mean.shape) * np.sqrt(p.var)) + 0.1 * p.mean).astype(F32)
    run_var = (0.9 * p.var * p.rng.uniform(0.7, 1.3, p.var.shape) + 0.1 * p.var).astype(F32)
    invstd = invstd_of(run_var)
    db, dg = sums(p, mean=run_mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=run_mean, invstd=invstd), dg, db,
                   causes=("fitted-statistics", "own-batch-statistics"), what="running stats")


def k_eps_outside_sqrt(p):
    """invstd = 1/(sqrt(var) + eps) instead of 1/sqrt(var + eps) (small variances make it visible)."""
    invstd = (1 / (np.sqrt(p.var.astype(F32)) + F32(EPS))).astype(F32)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("fitted-statistics", "epsilon"),
                   what="eps outside sqrt")


def k_unbiased_var(p):
    """The kernel recomputes the variance with Bessel's correction (torch.var's default)."""
    var = (p.var.astype(F64) * p.m / (p.m - 1)).astype(F32)
    invstd = invstd_of(var)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("unbiased-variance", "fitted-statistics"),
                   what="unbiased var")


# --- failing kernels: the formula's terms ---------------------------------------------------------------------------

def k_sign_xhat_term(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, terms=(1, 1, -1)), dg, db, causes=("fitted-terms",), words=r"sign",
                   what="+xhat term")


def k_m_minus_1(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, m=p.m - 1), dg, db, causes=("fitted-terms",), words=r"M.?1|M-1",
                   what="M-1 in dx")


def k_wrong_m_per_sample(p):
    """The mean over one sample's positions (H*W) instead of the batch's (a per-sample loop's count)."""
    db, dg = sums(p)
    hw = p.shape[2] * p.shape[3]
    return Planted(elementwise(p, db, dg, m=hw), dg, db, causes=("fitted-terms",), words=rf"{hw}",
                   what=f"M'={hw}")


def k_missing_mean_dy(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, terms=(1, 0, 1)), dg, db,
                   causes=("fitted-terms", "mean-dy-not-subtracted"), what="no mean(dy)")


def k_gamma_missing(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, gamma=np.ones_like(p.gamma)), dg, db,
                   causes=("fitted-terms", "gamma-ignored"), words="gamma", what="dx without gamma")


def k_dgamma_times_gamma(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), dg * p.gamma, db, causes=("fitted-terms",), words="gamma",
                   what="diff_gamma*gamma")


def k_tf_missing_invstd(p):
    """TF-style formula with one invstd missing from the x_offset term: x_offset*invstd*mean(dy*x_offset)."""
    invstd = invstd_of(p.var)
    x, dy = p.x.astype(F32), p.dy.astype(F32)
    xo = x - ch(p.mean)
    db = dy.sum((0, 2, 3), dtype=F32)
    dyxo = (dy * xo).sum((0, 2, 3), dtype=F32)
    m = F32(p.m)
    dx = ch(p.gamma * invstd) * (dy - ch(db / m) - xo * ch(invstd * dyxo / m))
    return Planted(dx, dyxo * invstd, db, causes=("fitted-terms",), words="invstd", what="missing invstd factor")


# --- failing kernels: sums against elementwise, outputs against each other ----------------------------------------

def k_sums_lost_atomics(p):
    """Channels c0..c1 (one CTA's channel tile) lose a random 20% of their atomicAdds; diff_src uses those sums."""
    c = p.shape[1]
    c0 = int(p.rng.integers(0, c - 8))
    c1 = c0 + 7
    keep = np.ones((c, p.m))
    keep[c0:c1 + 1] = p.rng.random((8, p.m)) >= 0.2
    db, dg = masked_sums(p, keep)
    mask = np.zeros(p.shape, bool)
    mask[:, c0:c1 + 1] = True
    return Planted(elementwise(p, db, dg), dg, db, causes=("sums-wrong", "partial-reduction-missing"),
                   region=region_where(p, mask), what=f"c={c0}..{c1} lose 20%")


def k_sums_written_early(p):
    """diff_src from the full sums, but diff_gamma written from the first block's partial (stored before the sync)."""
    db, dg = sums(p)
    keep = np.zeros((p.shape[1], p.m))
    keep[:, :256] = 1
    _, dg_part = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg_part, db, coarse=("unexplained:bug is in the sums written",),
                   what="dgamma = first block only")


def k_swap_sums(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), db, dg, causes=("output-in-another-place",), what="dgamma<->dbeta")


def k_dx_halved(p):
    """A data-parallel kernel divides diff_src by the world size (2) as it would a weight gradient."""
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg) / 2, dg, db, causes=("fitted-terms",), words=r"0\.5|half|1/2",
                   what="dx/2")


def k_all_scaled(p):
    """Every output divided by the world size 4 (a misplaced all-reduce average)."""
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg) / 4, dg / 4, db / 4, causes=("fitted-terms",), words=r"0\.25|1/4",
                   what="all /4")


def k_dbeta_mean(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), dg, db / F32(p.m), causes=("sum-scaled-by-M", "fitted-terms"),
                   what="dbeta = mean")


def k_stale_outputs(p):
    """The kernel wrote last step's gradients: outputs computed from other inputs."""
    prev = Entry("prev", "", k_pytorch_cpu, True, p.dtype, p.layout, p.shape, seed=int(p.rng.integers(1 << 30)))
    q = prev.problem()
    planted = reference_kernel(q)
    return dataclasses.replace(planted, causes=("unexplained:no relation",), what="other inputs")


# --- failing kernels: part of a reduction missing or doubled --------------------------------------------------------

def k_skip_sample(p):
    """The reduction's sample loop starts at 1 (sample 0 left out of both sums)."""
    keep = np.ones((p.shape[1], p.m))
    hw = p.shape[2] * p.shape[3]
    keep[:, :hw] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing", "lost-partial-sum"),
                   coarse=("sums-wrong",), words=r"n=0|block 0 of", what="n=0 missing")


def k_double_last_sample(p):
    keep = np.ones((p.shape[1], p.m))
    hw = p.shape[2] * p.shape[3]
    keep[:, -hw:] = 2
    n = p.shape[0] - 1
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-doubled",), coarse=("sums-wrong",),
                   words=rf"n={n}", what=f"n={n} doubled")


def k_lost_block(p):
    """Channels c0..c0+3 lose one block's partial sum (block 512, index j): a missing __syncthreads."""
    c = p.shape[1]
    c0 = int(p.rng.integers(0, c - 4))
    nblocks = p.m // 512
    j = int(p.rng.integers(0, nblocks))
    keep = np.ones((c, p.m))
    keep[c0:c0 + 4, j * 512:(j + 1) * 512] = 0
    db, dg = masked_sums(p, keep)
    mask = np.zeros(p.shape, bool)
    mask[:, c0:c0 + 4] = True
    return Planted(elementwise(p, db, dg), dg, db, causes=("lost-partial-sum", "partial-reduction-missing"),
                   coarse=("sums-wrong",), region=region_where(p, mask), what=f"c={c0}..{c0 + 3} block {j} of 512")


def k_tail_dropped(p):
    """Blocks of 256 with the remainder M mod 256 dropped."""
    keep = np.ones((p.shape[1], p.m))
    t = p.m % 256
    keep[:, p.m - t:] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("missing-tail", "partial-reduction-missing"),
                   coarse=("sums-wrong",), words=rf"{t}", what=f"tail {t} dropped")


def k_warp_lanes_sum(p):
    """Lanes 28..31 of each 32-element group skip the accumulate (an `if (lane < 28)` meant for the tail)."""
    keep = np.ones((p.shape[1], p.m))
    keep[:, (np.arange(p.m) % 32) >= 28] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing",), coarse=("sums-wrong",),
                   words=r"28", what="lanes 28..31 missing")


def k_random_share_sum(p):
    """Unsynchronised atomics: a random 10% of every channel's elements lost from both sums."""
    keep = (p.rng.random((p.shape[1], p.m)) >= 0.1).astype(float)
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing",), coarse=("sums-wrong",),
                   what="random 10% lost")


def k_overlap_chunks(p):
    """Chunks of 1000 stepped by 992: the 8 elements each chunk overlaps are counted twice."""
    keep = np.ones((p.shape[1], p.m))
    for s in range(992, p.m, 992):
        keep[:, s:s + 8] = 2
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-doubled",), coarse=("sums-wrong",),
                   what="overlap 8 of 1000/992 chunks")


def k_rows_missing_sum(p):
    """The reduction's row loop stops two rows early (h < H-2)."""
    h = p.shape[2]
    rows = np.zeros((p.shape[0], h, p.shape[3]), bool)
    rows[:, h - 2:] = True
    keep = np.where(rows.reshape(1, -1), 0.0, 1.0).repeat(p.shape[1], 0)
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing",), coarse=("sums-wrong",),
                   words=rf"h={h - 2}", what=f"h={h - 2}..{h - 1} missing")


# --- failing kernels: parameters at the wrong place -----------------------------------------------------------------

def k_gamma_next(p):
    g = np.roll(p.gamma, -1)
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, gamma=g), dg, db, causes=("gamma-off-by-one", "parameter-misread"),
                   what="gamma[c+1]")


def k_invstd_pair_swap(p):
    """invstd read at c^1 (a float2 load with its halves swapped)."""
    idx = np.arange(p.shape[1]) ^ 1
    invstd = invstd_of(p.var)[idx]
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("parameter-misread",),
                   what="invstd[c^1] in dx")


def k_mean_other_axis(p):
    """mean indexed by w (a channels-last index bug); W == C."""
    planted = reference_kernel(p)
    invstd = invstd_of(p.var)
    x, dy = p.x.astype(F32), p.dy.astype(F32)
    xhat = (x - p.mean[None, None, None, :]) * ch(invstd)
    db = dy.sum((0, 2, 3), dtype=F32)
    dg = (dy * xhat).sum((0, 2, 3), dtype=F32)
    m = F32(p.m)
    dx = ch(p.gamma * invstd) * (dy - ch(db / m) - xhat * ch(dg / m))
    return dataclasses.replace(planted, dx=dx, dg=dg, db=db, causes=("parameter-misread",), words=r"w",
                               what="mean[w]")


def k_gamma_reversed(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, gamma=p.gamma[::-1]), dg, db, causes=("parameter-misread",),
                   what="gamma reversed")


def k_mean_shift3(p):
    mean = np.roll(p.mean, -3)
    invstd = invstd_of(p.var)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean), dg, db, causes=("parameter-misread",), words=r"3",
                   what="mean[c+3]")


# --- the zoo ----------------------------------------------------------------------------------------------------------

def _variants(name, kind, kernel, specs, correct=False, data="normal"):
    return [Entry(f"{name}-{dt}-{lay}", kind, kernel, correct, dt, lay, shape, seed, data)
            for dt, lay, shape, seed in specs]


S = (4, 32, 16, 16)  # M = 1024
L = (4, 32, 32, 32)  # M = 4096, 131K elements
W = (8, 16, 24, 24)  # M = 4608


def zoo() -> list[Entry]:
    e = []
    # correct kernels
    e += _variants("pytorch_cpu", "correct", k_pytorch_cpu, [("f32", "NCHW", L, 1), ("bf16", "NHWC", S, 2)], True)
    e += _variants("f64_accumulate", "correct", k_f64_accumulate, [("f16", "NCHW", S, 3)], True)
    e += _variants("kahan", "correct", k_kahan, [("f32", "NHWC", L, 4)], True)
    e += _variants("split_blocks", "correct", k_split_blocks, [("f32", "NCHW", W, 5), ("bf16", "NCHW", L, 6)], True)
    e += _variants("warp_shuffle", "correct", k_warp_shuffle, [("f32", "NHWC", W, 7)], True)
    e += _variants("tf_fused", "correct", k_tf_fused, [("f32", "NHWC", S, 8)], True)
    e += _variants("onednn_nhwc", "correct", k_onednn_nhwc, [("f16", "NHWC", W, 9)], True)
    e += _variants("own_welford", "correct", k_own_welford_small_m, [("f32", "NCHW", (2, 16, 8, 8), 10)], True)
    e += _variants("ftz", "correct", k_ftz, [("f32", "NCHW", S, 11)], True, data="tiny")
    e += _variants("daz", "correct", k_daz, [("f32", "NHWC", S, 12)], True, data="tiny")
    # where the elementwise pass goes wrong
    e += _variants("stride_lane", "strided", k_stride_lane, [("f32", "NCHW", S, 20), ("bf16", "NHWC", S, 21)])
    e += _variants("stale_tail", "tail", k_stale_tail, [("f32", "NHWC", S, 22), ("f16", "NCHW", S, 23)])
    e += _variants("rows_bound", "rows", k_rows_bound, [("f32", "NCHW", L, 24), ("bf16", "NHWC", L, 25)])
    e += _variants("channel_tile", "channel tile", k_channel_tile, [("f32", "NHWC", S, 26), ("f16", "NCHW", S, 27)])
    e += _variants("channel_half_gamma", "channel tile", k_channel_range_gamma, [("bf16", "NCHW", S, 28)])
    e += _variants("one_sample", "sample", k_one_sample, [("f32", "NCHW", S, 29), ("bf16", "NHWC", S, 30)])
    e += _variants("spatial_tile", "spatial tile", k_spatial_tile, [("f32", "NCHW", L, 31), ("f16", "NHWC", L, 32)])
    e += _variants("spatial_tile_zero", "spatial tile", k_spatial_tile_zero, [("f32", "NHWC", W, 33)])
    e += _variants("plane_remainder", "tail", k_plane_remainder, [("f32", "NCHW", (4, 32, 15, 15), 34)])
    e += _variants("half_warp", "strided", k_half_warp, [("f32", "NHWC", S, 35)])
    e += _variants("racy_writes", "scattered", k_racy_writes, [("f32", "NCHW", S, 36)])
    e += _variants("nan_warp", "NaN", k_nan_warp, [("f32", "NCHW", S, 37), ("bf16", "NHWC", S, 38)])
    e += _variants("nan_channel", "NaN", k_nan_channel, [("f32", "NHWC", S, 39)])
    e += _variants("inf_tail", "NaN", k_inf_tail, [("f16", "NCHW", S, 40)])
    e += _variants("nan_dgamma", "NaN", k_nan_scattered_channel, [("f32", "NCHW", S, 41)])
    # other statistics
    e += _variants("own_onepass", "statistics", k_own_onepass_stats, [("f32", "NCHW", L, 50), ("f32", "NHWC", S, 51)],
                   data="offset")
    e += _variants("bf16_saved", "statistics", k_bf16_saved_stats, [("bf16", "NCHW", S, 52), ("f32", "NHWC", S, 53)])
    e += _variants("running_stats", "statistics", k_running_stats, [("f32", "NCHW", S, 54)])
    e += _variants("eps_outside", "statistics", k_eps_outside_sqrt, [("f32", "NHWC", S, 55)])
    e += _variants("unbiased_var", "statistics", k_unbiased_var, [("f16", "NCHW", (2, 16, 4, 4), 56)])
    # formula terms
    e += _variants("sign_xhat", "terms", k_sign_xhat_term, [("f32", "NHWC", S, 60)])
    e += _variants("m_minus_1", "terms", k_m_minus_1, [("f32", "NCHW", (2, 16, 5, 5), 61)])
    e += _variants("per_sample_m", "terms", k_wrong_m_per_sample, [("bf16", "NCHW", S, 62)])
    e += _variants("no_mean_dy", "terms", k_missing_mean_dy, [("f32", "NHWC", S, 63)])
    e += _variants("no_gamma_dx", "terms", k_gamma_missing, [("f16", "NHWC", S, 64)])
    e += _variants("dgamma_x_gamma", "terms", k_dgamma_times_gamma, [("f32", "NCHW", S, 65)])
    e += _variants("tf_missing_invstd", "terms", k_tf_missing_invstd, [("f32", "NCHW", S, 66)])
    # sums vs elementwise, outputs
    e += _variants("sums_lost_atomics", "sums", k_sums_lost_atomics, [("f32", "NHWC", S, 70), ("bf16", "NCHW", S, 71)])
    e += _variants("sums_written_early", "sums", k_sums_written_early, [("f32", "NCHW", S, 72)])
    e += _variants("swap_sums", "outputs", k_swap_sums, [("f32", "NHWC", S, 73)])
    e += _variants("dx_halved", "outputs", k_dx_halved, [("bf16", "NCHW", S, 74)])
    e += _variants("all_scaled", "outputs", k_all_scaled, [("f32", "NCHW", S, 75)])
    e += _variants("dbeta_mean", "outputs", k_dbeta_mean, [("f32", "NHWC", S, 76)])
    e += _variants("stale_outputs", "outputs", k_stale_outputs, [("f32", "NCHW", S, 77)])
    # reductions missing or doubling a part
    e += _variants("skip_sample", "reduction", k_skip_sample, [("f32", "NCHW", S, 80), ("bf16", "NHWC", S, 81)])
    e += _variants("double_last_sample", "reduction", k_double_last_sample, [("f32", "NHWC", S, 82)])
    e += _variants("lost_block", "reduction", k_lost_block, [("f32", "NCHW", L, 83)])
    e += _variants("tail_dropped", "reduction", k_tail_dropped, [("f32", "NCHW", (4, 16, 15, 15), 84)])
    e += _variants("warp_lanes_sum", "reduction", k_warp_lanes_sum, [("f16", "NHWC", S, 85)])
    e += _variants("random_share", "reduction", k_random_share_sum, [("f32", "NCHW", S, 86)])
    e += _variants("overlap_chunks", "reduction", k_overlap_chunks, [("f32", "NHWC", W, 87)])
    e += _variants("rows_missing_sum", "reduction", k_rows_missing_sum, [("bf16", "NCHW", S, 88)])
    # parameters at the wrong place
    e += _variants("gamma_next", "parameters", k_gamma_next, [("f32", "NCHW", S, 90)])
    e += _variants("invstd_pair_swap", "parameters", k_invstd_pair_swap, [("f32", "NHWC", S, 91)])
    e += _variants("mean_other_axis", "parameters", k_mean_other_axis, [("f32", "NCHW", (4, 16, 8, 16), 92)])
    e += _variants("gamma_reversed", "parameters", k_gamma_reversed, [("bf16", "NHWC", S, 93)])
    e += _variants("mean_shift3", "parameters", k_mean_shift3, [("f32", "NCHW", S, 94)])
    return e


def main() -> int:
    for entry in zoo():
        print(f"{entry.name:32s} {entry.kind:14s} {'correct' if entry.correct else 'failing'} {entry.shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
