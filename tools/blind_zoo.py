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
import re
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
    entry: "Entry"

    @property
    def shape(self):
        return self.x.shape

    @property
    def m(self) -> int:
        n, _, h, w = self.x.shape
        return n * h * w

    def stored(self, a: np.ndarray) -> np.ndarray:
        """A logical (N, C, H, W) array as the file stores it: channels last for NHWC, at the entry's rank (2: the
        (N, C) of BatchNorm1d, H = W = 1; 5: H holds depth*height)."""
        s = np.ascontiguousarray(a.transpose(0, 2, 3, 1) if self.layout == "NHWC" else a)
        n, c, h, w = a.shape
        if self.entry.rank == 2:
            return s.reshape(n, c)
        if self.entry.rank == 5:
            d = self.entry.depth
            return s.reshape((n, d, h // d, w, c) if self.layout == "NHWC" else (n, c, d, h // d, w))
        return s

    def logical(self, a: np.ndarray) -> np.ndarray:
        """A stored array back in the kernel's logical (N, C, H, W) view."""
        n, c, h, w = self.x.shape
        s = a.reshape((n, h, w, c) if self.layout == "NHWC" else (n, c, h, w))
        return s.transpose(0, 3, 1, 2) if self.layout == "NHWC" else s

    @property
    def data_format(self) -> str:
        if self.entry.rank == 2:
            return "NC"
        if self.entry.rank == 5:
            return "NDHWC" if self.layout == "NHWC" else "NCDHW"
        return self.layout

    def inputs(self) -> dict:
        return {
            "src": self.stored(self.x), "diff_dst": self.stored(self.dy), "mean": self.mean,
            "variance": self.var, "gamma": self.gamma, "epsilon": np.float32(EPS),
            "data_format": np.array(self.data_format),
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
    region_output: str = "diff_src"  # or diff_gamma / diff_beta (a (C,) mask); "NAME:nonfinite" for its NaN/Inf
    # (plain "nonfinite": diff_src's)
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
    rank: int = 4  # 2: shape (N, C, 1, 1) stored as (N, C); 5: H split into (depth, H / depth)
    depth: int = 1

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
        if self.data == "small":  # one channel's gradient at 1e-8 scale (normal float32 numbers, far from subnormal)
            dy[:, 3] = (rng.standard_normal((n, h, w)) * 1e-8).astype(F32).astype(dt)
        if self.data == "smallvar":  # variances near epsilon (a nearly constant channel)
            x = (rng.standard_normal((n, c, h, w)) * 3e-3 + loc[:, None, None]).astype(dt)
        x64 = x.astype(F64)
        mean = x64.mean((0, 2, 3)).astype(F32)
        var = x64.var((0, 2, 3)).astype(F32)
        gamma = rng.uniform(0.5, 1.5, c).astype(F32)
        if self.data == "gamma0":  # frozen channels: gamma = 0 in a quarter of them
            gamma[rng.random(c) < 0.25] = 0
        return Problem(x, dy, mean, var, gamma, self.layout, self.dtype, rng, self)

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


def number_words(x: float) -> str:
    """A regex for x as a hint may print it: 3 or 4 significant digits or 2 to 4 decimals, trailing zeros dropped,
    never a bare integer (1.0004 is not "1")."""
    forms = {f"{x:.{d}g}" for d in (3, 4)} | {f"{x:.{d}f}".rstrip("0") for d in (2, 3, 4)}
    return "|".join(re.escape(f) + r"(?!\d)" for f in sorted(forms) if "." in f and not f.endswith("."))


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
    shifted = p.logical(np.roll(p.stored(p.dy.astype(F32)).reshape(-1), -1))
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
    prev = dataclasses.replace(p.entry, kernel=k_pytorch_cpu, seed=int(p.rng.integers(1 << 30)))
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
    return Planted(elementwise(p, db, dg), dg_part, db, causes=("partial-reduction-missing", "lost-partial-sum"),
                   words=r"n=1\.\.3|768|256", coarse=("unexplained:bug is in the sums written",),
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
    prev = dataclasses.replace(p.entry, kernel=k_pytorch_cpu, seed=int(p.rng.integers(1 << 30)))
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


# --- the second round: harder shapes, subtler errors, more realistic variants ----------------------------------------

def k_jax_autodiff(p):
    """JAX/apex ordering: dx = (gamma*invstd/M) * (M*dy - sum(dy) - xhat*sum(dy*xhat))."""
    db, dg = sums(p)
    invstd = invstd_of(p.var)
    x, dy = p.x.astype(F32), p.dy.astype(F32)
    xhat = (x - ch(p.mean)) * ch(invstd)
    m = F32(p.m)
    dx = ch(p.gamma * invstd / m) * (m * dy - ch(db) - xhat * ch(dg))
    return Planted(dx, dg, db)


def k_sequential_f32(p):
    """A naive CPU loop: each channel's sums accumulated one element at a time in float32, in storage order."""
    invstd = invstd_of(p.var)
    xhat = (p.x.astype(F32) - ch(p.mean)) * ch(invstd)
    dyc = channel_positions(p, p.dy.astype(F32))
    prod = dyc * channel_positions(p, xhat)
    db, dg = np.zeros(dyc.shape[0], F32), np.zeros(dyc.shape[0], F32)
    for i in range(dyc.shape[1]):
        db, dg = db + dyc[:, i], dg + prod[:, i]
    return Planted(elementwise(p, db, dg), dg, db)


def k_own_stats_tiny_m(p):
    """PyTorch with its own saved statistics at M = 2 (two-pass float32 mean and biased variance)."""
    x = p.x.astype(F32)
    mean = x.mean((0, 2, 3), dtype=F32)
    var = ((x - ch(mean)) ** 2).mean((0, 2, 3), dtype=F32)
    invstd = invstd_of(var)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db)


def k_rows_subtle(p):
    """A row-tiled pass whose last tile (h >= h0) reads the mean of the previous channel for xhat: errors of
    all sizes, many of its elements still inside the tolerance."""
    h0 = int(p.rng.integers(p.shape[2] // 2, p.shape[2] - 2))
    planted = reference_kernel(p)
    mean = p.mean + (np.roll(p.mean, 1) - p.mean) * F32(1e-2 if p.dtype == "f32" else 0.3)
    wrong = elementwise(p, planted.db, planted.dg, mean=mean)
    rows = np.zeros(p.shape, bool)
    rows[:, :, h0:] = True
    return dataclasses.replace(planted, dx=np.where(rows, wrong, planted.dx), region=region_where(p, rows),
                               what=f"rows h>={h0}, small errors")


def k_halo_rows(p):
    """A stencil-style tiled pass mishandles the halo: the first two and the last row of every image."""
    planted = reference_kernel(p)
    rows = np.zeros(p.shape, bool)
    rows[:, :, :2] = rows[:, :, -1:] = True
    wrong = planted.dx * F32(0.75)
    return dataclasses.replace(planted, dx=np.where(rows, wrong, planted.dx), region=region_where(p, rows),
                               what="h=0..1 and the last row")


def k_border_columns(p):
    """Columns w = 0 and w = W-1 (the image border) computed with diff_dst of their neighbour."""
    planted = reference_kernel(p)
    dy = p.dy.astype(F32).copy()
    dy[..., 0], dy[..., -1] = p.dy[..., 1], p.dy[..., -2]
    wrong = elementwise(dataclasses.replace(p, dy=dy), planted.db, planted.dg)
    cols = np.zeros(p.shape, bool)
    cols[..., 0] = cols[..., -1] = True
    return dataclasses.replace(planted, dx=np.where(cols, wrong, planted.dx), region=region_where(p, cols),
                               what="w=0 and w=W-1")


def k_partial_last_tile(p):
    """Tiles of 8 rows over H = 30: the partial last tile (h = 24..29) indexes its rows from the tile's end."""
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    dx[:, :, 24:30] = planted.dx[:, :, 24:30][:, :, ::-1]
    mask = np.zeros(p.shape, bool)
    mask[:, :, 24:30] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what="h=24..29 reversed")


def k_channel_remainder(p):
    """Channels-last, vectorised by 8 channels: the remainder channels C - C%8 .. C-1 use gamma = 1."""
    c = p.shape[1]
    r = c % 8
    planted = reference_kernel(p)
    gamma = p.gamma.copy()
    gamma[c - r:] = 1
    dx = elementwise(p, planted.db, planted.dg, gamma=gamma)
    mask = np.zeros(p.shape, bool)
    mask[:, c - r:] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what=f"c={c - r}..{c - 1}",
                               causes=("fitted-terms", "gamma-ignored"), words=rf"gamma.*c={c - r}\.\.{c - 1}")


def k_every_4th_channel(p):
    """A float4 loop over channels whose 4th component reads gamma of the 1st (c % 4 == 3 wrong)."""
    c = np.arange(p.shape[1])
    gamma = np.where(c % 4 == 3, p.gamma[c - 3], p.gamma).astype(F32)
    planted = reference_kernel(p)
    dx = elementwise(p, planted.db, planted.dg, gamma=gamma)
    mask = np.zeros(p.shape, bool)
    mask[:, c % 4 == 3] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), what="c % 4 == 3")


def k_odd_stride(p):
    """Every 3rd stored element (a 3-wide unrolled loop whose third lane adds the mean term twice)."""
    planted = reference_kernel(p)
    wrong = p.stored(elementwise(p, planted.db, planted.dg, terms=(1, 2, 1)).astype(F32)).reshape(-1)
    off = int(p.rng.integers(0, 3))
    mask = np.arange(wrong.size) % 3 == off
    stored, region = _storage_bug(p, planted, mask, wrong[mask])
    return dataclasses.replace(planted, stored_dx=stored, region=region, what=f"every 3rd stored, offset {off}")


def k_one_nan(p):
    """One NaN (a 0/0 in one thread)."""
    planted = reference_kernel(p)
    size = int(np.prod(p.shape))
    mask = np.zeros(size, bool)
    mask[int(p.rng.integers(0, size))] = True
    stored, region = _storage_bug(p, planted, mask, np.array([np.nan]))
    return dataclasses.replace(planted, stored_dx=stored, region=region, region_output="nonfinite", what="one NaN")


def k_nan_sample(p):
    """Sample n0's diff_dst read past the end of a buffer: its diff_src is all NaN, the sums are right."""
    n0 = int(p.rng.integers(0, p.shape[0]))
    planted = reference_kernel(p)
    dx = planted.dx.copy()
    dx[n0] = np.nan
    mask = np.zeros(p.shape, bool)
    mask[n0] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), region_output="nonfinite",
                               what=f"n={n0} NaN")


def k_epsilon_1e3(p):
    invstd = (1 / np.sqrt(p.var + F32(1e-3))).astype(F32)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("epsilon", "fitted-statistics"),
                   words=r"0\.001|1e-0?3", what="epsilon 1e-3")


def k_bf16_stats_nearest(p):
    """Mean and invstd saved in bfloat16, rounded to nearest (PyTorch with bf16 parameters)."""
    mean, invstd = to16(p.mean, ml_dtypes.bfloat16), to16(invstd_of(p.var), ml_dtypes.bfloat16)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db,
                   causes=("16-bit-statistics", "fitted-statistics"), what="bf16-nearest stats")


def k_xhat_term_m_minus_1(p):
    """M - 1 in the xhat term only (an unbiased count where the variance's derivative is taken)."""
    db, dg = sums(p)
    m = p.m
    return Planted(elementwise(p, db, dg, terms=(1, 1, m / (m - 1))), dg, db, causes=("fitted-terms",),
                   words=r"M.?1|M-1|M − 1|" + number_words(m / (m - 1)), what="M-1 in the xhat term")


def k_no_xhat_term(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, terms=(1, 1, 0)), dg, db, causes=("fitted-terms",), what="no xhat term")


def k_gamma_twice(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, gamma=p.gamma * p.gamma), dg, db,
                   causes=("gamma-applied-twice", "fitted-terms"), what="gamma^2")


def k_invstd_squared(p):
    """k = gamma*invstd^2 (invstd applied once in xhat and twice in front)."""
    db, dg = sums(p)
    invstd = invstd_of(p.var)
    dx = elementwise(p, db, dg) * ch(invstd)
    return Planted(dx, dg, db, causes=("fitted-terms",), words="invstd", what="extra invstd")


def k_dgamma_negated(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), -dg, db, causes=("fitted-terms",), words=r"negat|sign|-1", what="-dgamma")


def k_dbeta_doubled(p):
    """diff_beta accumulated by two passes into the same buffer: twice the sum."""
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), dg, 2 * db, causes=("fitted-terms",), words=r"doubl|2", what="2*dbeta")


def k_sums_never_written(p):
    """diff_gamma and diff_beta never copied out: the zeros they were allocated with."""
    planted = reference_kernel(p)
    z = np.zeros_like(planted.db)
    return dataclasses.replace(planted, dg=z, db=z.copy(), causes=("fitted-terms",), words="zero",
                               coarse=("unexplained:bug is in the sums written",), what="sums never written (zeros)")


def k_f16_accumulate(p):
    """Sums accumulated in float16 (the storage type) in a vectorised loop of 8 lanes."""
    invstd = invstd_of(p.var)
    xhat = (p.x.astype(F32) - ch(p.mean)) * ch(invstd)
    out = []
    for v in (channel_positions(p, p.dy.astype(F32)), channel_positions(p, p.dy.astype(F32) * xhat)):
        v = v.astype(np.float16)
        c, m = v.shape
        acc = np.zeros((c, 8), np.float16)
        for i in range(0, m - m % 8, 8):
            acc = (acc + v[:, i:i + 8]).astype(np.float16)
        out.append(acc.astype(F32).sum(1, dtype=F32))
    db, dg = out
    return Planted(elementwise(p, db, dg), dg, db, causes=("16-bit-accumulation",), coarse=("sums-wrong",),
                   what="f16 accumulators")


def k_warp_per_block_lost(p):
    """Blocks of 1024 elements, 32 warps each; warp 0's result is overwritten (elements 0..31 of every 1024)."""
    keep = np.ones((p.shape[1], p.m))
    keep[:, (np.arange(p.m) % 1024) < 32] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing",), coarse=("sums-wrong",),
                   what="elements 0..31 of every 1024")


def k_first_column_missing(p):
    """The reduction's inner loop starts at w = 1."""
    cols = np.zeros((p.shape[0], p.shape[2], p.shape[3]), bool)
    cols[..., 0] = True
    keep = np.where(cols.reshape(1, -1), 0.0, 1.0).repeat(p.shape[1], 0)
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing",), coarse=("sums-wrong",),
                   words=r"w=0", what="w=0 missing from the sums")


def k_last_partials_dropped(p):
    """Two-level reduction: 16 block partials of 256, reduced 8 at a time; the second group of 8 is dropped when
    the kernel is launched with too few threads (the last 2048 of 4096 missing)."""
    keep = np.ones((p.shape[1], p.m))
    keep[:, p.m // 2:] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db,
                   causes=("partial-reduction-missing", "missing-tail", "lost-partial-sum"), coarse=("sums-wrong",),
                   what="second half of the reduction missing")


def k_mean_clamped(p):
    """mean read at c - 1 (clamped at 0) in both the sums and diff_src."""
    mean = p.mean[np.maximum(np.arange(p.shape[1]) - 1, 0)]
    db, dg = sums(p, mean=mean)
    return Planted(elementwise(p, db, dg, mean=mean), dg, db, causes=("parameter-misread",), what="mean[c-1] clamped")


def k_gamma_by_h(p):
    """gamma indexed by h (H == C)."""
    db, dg = sums(p)
    invstd = invstd_of(p.var)
    x, dy = p.x.astype(F32), p.dy.astype(F32)
    xhat = (x - ch(p.mean)) * ch(invstd)
    m = F32(p.m)
    dx = p.gamma[None, None, :, None] * ch(invstd) * (dy - ch(db / m) - xhat * ch(dg / m))
    return Planted(dx, dg, db, causes=("parameter-misread",), words=r"\bh\b|h\]|\[h", what="gamma[h]")


def k_stats_shifted_struct(p):
    """mean and invstd read one channel ahead (an off-by-one into a packed stats array), everywhere."""
    idx = (np.arange(p.shape[1]) + 1) % p.shape[1]
    mean, invstd = p.mean[idx], invstd_of(p.var)[idx]
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db, causes=("parameter-misread",),
                   what="mean and invstd at c+1")


def k_layout_written_nchw(p):
    """The kernel computes right but writes diff_src in NCHW order into a channels-last buffer."""
    planted = reference_kernel(p)
    dt = DTYPES[p.dtype]
    nchw = np.ascontiguousarray(planted.dx.astype(F32).astype(dt)).reshape(-1)
    stored = nchw.reshape(p.stored(p.x).shape)
    return dataclasses.replace(planted, stored_dx=stored, causes=("layout-mixup",), what="diff_src written NCHW")


def k_dx_transposed_hw(p):
    """diff_src written with h and w swapped (a non-square image)."""
    planted = reference_kernel(p)
    n, c, h, w = p.shape
    dx = np.ascontiguousarray(planted.dx.transpose(0, 1, 3, 2)).reshape(n, c, h, w)
    return dataclasses.replace(planted, dx=dx, causes=("spatial-axes-swapped",), what="h, w swapped")


# --- the third round: CTA tiles, approximations, data-parallel mistakes, sums' own places, edge data -----------------

def k_cta_tile_lost(p):
    """Channels-last CUDA reduction over a (positions x channels) grid of CTAs: the CTA covering channels
    c0..c0+15 and positions 1024..2047 has its partial overwritten."""
    c = p.shape[1]
    c0 = int(p.rng.integers(0, c // 16)) * 16
    keep = np.ones((c, p.m))
    keep[c0:c0 + 16, 1024:2048] = 0
    db, dg = masked_sums(p, keep)
    mask = np.zeros(p.shape, bool)
    mask[:, c0:c0 + 16] = True
    return Planted(elementwise(p, db, dg), dg, db, causes=("lost-partial-sum", "partial-reduction-missing"),
                   coarse=("sums-wrong",), words=r"1024", region=region_where(p, mask),
                   what=f"c={c0}..{c0 + 15} positions 1024..2047 lost")


def k_racy_block_per_channel(p):
    """A race: each channel loses one block of 256 (a different block in each channel)."""
    c = p.shape[1]
    keep = np.ones((c, p.m))
    blocks = p.rng.integers(0, p.m // 256, c)
    for ci, b in enumerate(blocks):
        keep[ci, b * 256:(b + 1) * 256] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("lost-partial-sum", "partial-reduction-missing"),
                   coarse=("sums-wrong",), what="a different block of 256 lost in each channel")


def k_rsqrt_approx(p):
    """invstd from an approximate reciprocal square root without the Newton step (SSE rsqrtps: ~12 bits)."""
    exact = invstd_of(p.var)
    bits = exact.view(np.uint32) & np.uint32(0xFFFFF000)  # keep ~11 mantissa bits, like the estimate's precision
    invstd = bits.view(F32) * F32(1 + 1.5 * 2.0 ** -13)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("fitted-statistics",),
                   what="12-bit rsqrt estimate")


def k_var_as_std(p):
    """The kernel expects the standard deviation and is given the variance: invstd = 1/(value + eps)."""
    invstd = (1 / (p.var + F32(EPS))).astype(F32)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("fitted-statistics",),
                   what="variance read as the standard deviation")


def k_eps_twice(p):
    invstd = (1 / np.sqrt(p.var + F32(2 * EPS))).astype(F32)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("epsilon", "fitted-statistics"),
                   words=r"2e-0?5|2\.0e-0?5|0\.00002", what="epsilon added twice")


def k_dy_rounded_bf16(p):
    """An f32 kernel under autocast: its copy of diff_dst is rounded to bfloat16 before everything else."""
    dy = to16(p.dy, ml_dtypes.bfloat16)
    q = dataclasses.replace(p, dy=dy)
    db, dg = sums(q)
    return Planted(elementwise(q, db, dg), dg, db, causes=("16-bit-inputs",), words=r"diff_dst.*bfloat16",
                   what="diff_dst read through bf16")


def k_dgamma_unbiased_invstd(p):
    """diff_gamma computed with an invstd from the unbiased variance (diff_src and diff_beta right)."""
    db, dg = sums(p)
    unb = invstd_of((p.var.astype(F64) * p.m / (p.m - 1)).astype(F32))
    _, dg_u = sums(p, invstd=unb)
    factor = float(np.sqrt((p.m - 1) / p.m))
    return Planted(elementwise(p, db, dg), dg_u, db, causes=("fitted-terms", "unbiased-variance"),
                   words=r"M.?1|M-1|" + number_words(factor), what="diff_gamma with the unbiased invstd")


def k_syncbn_no_allreduce(p):
    """SyncBatchNorm without the all-reduce: two devices, each half of the batch normalised by its own half's sums
    and M/2; the weight gradients are all-reduced (right)."""
    n = p.shape[0]
    db, dg = sums(p)
    dx = np.empty(p.shape, F32)
    for lo, hi in ((0, n // 2), (n // 2, n)):
        q = dataclasses.replace(p, x=p.x[lo:hi], dy=p.dy[lo:hi])
        qb, qg = sums(q)
        dx[lo:hi] = elementwise(q, qb, qg)
    return Planted(dx, dg, db, causes=("sample-group-sums",), words=rf"group of {n // 2} samples",
                   coarse=("unexplained:elementwise pass",), what="each half-batch uses its own sums")


def k_stale_dgamma_channels(p):
    """diff_gamma of channels c0..c0+7 (one CTA's channels) copied from a stale buffer; everything else right."""
    c = p.shape[1]
    c0 = int(p.rng.integers(0, c - 8))
    db, dg = sums(p)
    dg_out = dg.copy()
    dg_out[c0:c0 + 8] = p.rng.normal(0, np.abs(dg).mean(), 8)
    mask = np.zeros(c, bool)
    mask[c0:c0 + 8] = True
    return Planted(elementwise(p, db, dg), dg_out, db, coarse=("unexplained:bug is in the sums written",),
                   region=mask, region_output="diff_gamma", what=f"diff_gamma c={c0}..{c0 + 7} stale")


def k_inf_dbeta(p):
    """One channel's diff_beta overflows to Inf (an accumulator reset to FLT_MAX, not 0)."""
    c0 = int(p.rng.integers(0, p.shape[1]))
    db, dg = sums(p)
    db_out = db.copy()
    db_out[c0] = np.inf
    mask = np.zeros(p.shape[1], bool)
    mask[c0] = True
    return Planted(elementwise(p, db, dg), dg, db_out, region=mask, region_output="diff_beta:nonfinite",
                   what=f"diff_beta c={c0} Inf")


def k_frozen_dgamma_zero(p):
    """Channels with gamma = 0 are skipped entirely, diff_gamma included (written 0; it should not be)."""
    db, dg = sums(p)
    frozen = p.gamma == 0
    dg_out = np.where(frozen, F32(0), dg)
    return Planted(elementwise(p, db, dg), dg_out, db, coarse=("unexplained:bug is in the sums written",),
                   region=frozen, region_output="diff_gamma", what=f"diff_gamma 0 where gamma = 0 ({frozen.sum()})")


def k_last_cta_no_gamma(p):
    """The last CTA of channels (c = C-16..C-1) forgets gamma in diff_src."""
    c = p.shape[1]
    gamma = p.gamma.copy()
    gamma[c - 16:] = 1
    planted = reference_kernel(p)
    dx = elementwise(p, planted.db, planted.dg, gamma=gamma)
    mask = np.zeros(p.shape, bool)
    mask[:, c - 16:] = True
    return dataclasses.replace(planted, dx=dx, region=region_where(p, mask), causes=("fitted-terms",
                               "gamma-ignored"), words=rf"{c - 16}", what=f"c={c - 16}..{c - 1} without gamma")


# --- near misses: bugs that look like a catalogued cause but are not it (a wrong cause named would show here) -------

def k_mean_dy_twice(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, terms=(1, 2, 1)), dg, db, causes=("fitted-terms",), words=r"\b2\b|twice|doubl",
                   what="mean(dy) subtracted twice")


def k_front_invstd_unbiased(p):
    """The front factor gamma*invstd uses the unbiased variance, xhat and the sums the biased one."""
    db, dg = sums(p)
    invstd = invstd_of(p.var)
    unb = invstd_of((p.var.astype(F64) * p.m / (p.m - 1)).astype(F32))
    dx = elementwise(p, db, dg) * ch(unb / invstd)
    factor = float(np.sqrt((p.m - 1) / p.m))
    return Planted(dx, dg, db, causes=("fitted-terms",), words=r"M.?1|M-1|" + number_words(factor),
                   what="front invstd unbiased")


def k_dy_next_channel(p):
    """diff_src reads diff_dst of channel c+1 (a channel pointer off by one) in the elementwise pass only."""
    db, dg = sums(p)
    dy = np.roll(p.dy.astype(F32), -1, axis=1)
    return Planted(elementwise(dataclasses.replace(p, dy=dy), db, dg), dg, db, causes=("parameter-misread",),
                   words=r"diff_dst.*c\+1", coarse=("unexplained:elementwise pass",),
                   what="dy[c+1] in the elementwise pass")


def k_samples_reversed(p):
    """diff_src's samples written in reverse order (a batch index counted from the end)."""
    planted = reference_kernel(p)
    return dataclasses.replace(planted, dx=planted.dx[::-1], causes=("samples-reversed",),
                               coarse=("unexplained:elementwise pass",), what="samples reversed in diff_src")


def k_own_welford_large_m(p):
    """PyTorch-like channels-last with its own float32 statistics (Welford merged over 64 threads) at M = 102400:
    correct (its drift stays within what a correct kernel may make; the planted cause is unused)."""
    x = channel_positions(p, p.x.astype(F32))
    c, m = x.shape
    lanes = x.reshape(c, -1, 64)
    mean = np.zeros((c, 64), F32)
    m2 = np.zeros((c, 64), F32)
    for i in range(lanes.shape[1]):
        d = lanes[:, i] - mean
        mean = mean + d / F32(i + 1)
        m2 = m2 + d * (lanes[:, i] - mean)
    count = F32(lanes.shape[1])
    mu = mean.mean(1, dtype=F32)
    var = ((m2.sum(1, dtype=F32) + count * ((mean - mu[:, None]) ** 2).sum(1, dtype=F32)) / F32(m)).astype(F32)
    invstd = invstd_of(var)
    db, dg = sums(p, mean=mu, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mu, invstd=invstd), dg, db,
                   causes=("fitted-statistics", "own-batch-statistics"), what="own f32 Welford stats at M=1e5")


# --- the issue's own patterns with small errors: "off" by a few units, so part of the region still passes ----------

SMALL_OFF = {"f32": 4e-6, "f16": 2.5e-3, "bf16": 1.6e-2}  # a relative error of ~2-30 units of each dtype


def _small_off(p, mask_stored, what):
    planted = reference_kernel(p)
    exact = p.stored(planted.dx.astype(F32)).reshape(-1)
    flat = mask_stored.reshape(-1)
    stored, region = _storage_bug(p, planted, flat, exact[flat] * F32(1 + SMALL_OFF[p.dtype]))
    # scaling a region by 1 + rel: where the region is whole channels, "diff_src scaled by ... in c=..." is the bug
    return dataclasses.replace(planted, stored_dx=stored, region=region, what=what + " (small error)",
                               causes=("fitted-terms",), words=r"scaled by")


def _stored_mask(p, logical_mask):
    return p.stored(np.broadcast_to(logical_mask, p.shape))


def k_off_every_32nd(p):
    size = int(np.prod(p.shape))
    off = int(p.rng.integers(0, 32))
    return _small_off(p, (np.arange(size) % 32 == off).reshape(p.stored(p.x).shape), f"every 32nd, offset {off}")


def k_off_last_256(p):
    size = int(np.prod(p.shape))
    return _small_off(p, (np.arange(size) >= size - 256).reshape(p.stored(p.x).shape), "last 256")


def k_off_rows(p):
    mask = np.zeros(p.shape, bool)
    h0 = p.shape[2] * 3 // 4
    mask[:, :, h0:] = True
    return _small_off(p, _stored_mask(p, mask), f"h>={h0}")


def k_off_channels(p):
    mask = np.zeros(p.shape, bool)
    c0 = p.shape[1] // 2
    mask[:, c0:] = True
    return _small_off(p, _stored_mask(p, mask), f"c={c0}..")


def k_off_sample(p):
    mask = np.zeros(p.shape, bool)
    n0 = int(p.rng.integers(0, p.shape[0]))
    mask[n0] = True
    return _small_off(p, _stored_mask(p, mask), f"n={n0}")


def k_off_tile(p):
    mask = np.zeros(p.shape, bool)
    mask[:, :, 16:32, 16:32] = True
    return _small_off(p, _stored_mask(p, mask), "tile h=16..31 w=16..31")


def k_flush_threshold(p):
    """A hand-written "flush" that zeroes every |diff_src| < 1e-8 (normal numbers, not subnormals: a bug)."""
    planted = reference_kernel(p)
    dx = planted.dx.astype(F32)
    flushed = np.abs(dx) < 1e-8
    mask = np.zeros(p.shape, bool)
    mask[:, 3] = True
    return dataclasses.replace(planted, dx=np.where(flushed, F32(0), dx), region=region_where(p, mask),
                               what=f"|dx| < 1e-8 flushed ({int(flushed.sum())} elements)")


# --- the zoo ----------------------------------------------------------------------------------------------------------

def _variants(name, kind, kernel, specs, correct=False, data="normal"):
    """Entries of one kernel: (dtype, layout, shape, seed) each, and optionally a dict of Entry fields (rank...)."""
    out = []
    for dt, lay, shape, seed, *extra in specs:
        fields = extra[0] if extra else {}
        suffix = f"-r{fields['rank']}" if "rank" in fields else ""
        out.append(Entry(f"{name}-{dt}-{lay}{suffix}", kind, kernel, correct, dt, lay, shape, seed,
                         fields.get("data", data), fields.get("rank", 4), fields.get("depth", 1)))
    return out


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
    # second round: other ranks, M from 2 to 1e5, C up to 8192, subtler and more varied bugs
    e += _variants("jax_autodiff", "correct", k_jax_autodiff, [("f32", "NCHW", (64, 48, 1, 1), 13, {"rank": 2})],
                   True)
    e += _variants("sequential_f32", "correct", k_sequential_f32, [("f32", "NCHW", S, 14)], True)
    e += _variants("own_stats_m2", "correct", k_own_stats_tiny_m, [("f32", "NCHW", (2, 64, 1, 1), 15, {"rank": 2})],
                   True)
    e += _variants("split_blocks_c8192", "correct", k_split_blocks, [("bf16", "NHWC", (4, 8192, 2, 2), 16)], True)
    e += _variants("split_blocks_m1e5", "correct", k_split_blocks, [("f32", "NHWC", (16, 4, 80, 80), 17)], True)
    e += _variants("warp_shuffle_3d", "correct", k_warp_shuffle, [("f16", "NHWC", (2, 16, 32, 16), 18,
                                                                           {"rank": 5, "depth": 4})], True)
    e += _variants("rows_subtle", "rows", k_rows_subtle, [("f32", "NCHW", L, 100), ("bf16", "NHWC", L, 101)])
    e += _variants("halo_rows", "rows", k_halo_rows, [("f16", "NCHW", S, 102)])
    e += _variants("border_columns", "spatial tile", k_border_columns, [("f32", "NHWC", S, 103)])
    e += _variants("partial_last_tile", "spatial tile", k_partial_last_tile, [("f32", "NCHW", (2, 16, 30, 20), 104)])
    e += _variants("channel_remainder", "channel tile", k_channel_remainder, [("f32", "NHWC", (4, 37, 8, 8), 105),
                                                                               ("bf16", "NHWC", (2, 100, 6, 6), 106)])
    e += _variants("every_4th_channel", "channel tile", k_every_4th_channel, [("f32", "NCHW", S, 107)])
    e += _variants("odd_stride", "strided", k_odd_stride, [("f32", "NCHW", (3, 20, 10, 10), 108)])
    e += _variants("one_nan", "NaN", k_one_nan, [("bf16", "NCHW", S, 109)])
    e += _variants("nan_sample", "NaN", k_nan_sample, [("f32", "NHWC", (4, 16, 8, 8), 110, {"rank": 5, "depth": 2})])
    e += _variants("stride_lane_3d", "strided", k_stride_lane, [("f32", "NCHW", (2, 8, 32, 16), 111,
                                                                        {"rank": 5, "depth": 4})])
    e += _variants("one_sample_1d", "sample", k_one_sample, [("f32", "NCHW", (16, 40, 1, 1), 112, {"rank": 2})])
    e += _variants("epsilon_1e3", "statistics", k_epsilon_1e3, [("f32", "NCHW", S, 113)])
    e += _variants("bf16_stats_nearest", "statistics", k_bf16_stats_nearest, [("f32", "NHWC", L, 114)])
    e += _variants("xhat_m_minus_1", "terms", k_xhat_term_m_minus_1, [("f32", "NCHW", (2, 16, 4, 4), 115)])
    e += _variants("no_xhat_term", "terms", k_no_xhat_term, [("bf16", "NHWC", S, 116)])
    e += _variants("gamma_twice", "terms", k_gamma_twice, [("f32", "NCHW", S, 117)])
    e += _variants("invstd_squared", "terms", k_invstd_squared, [("f16", "NHWC", S, 118)])
    e += _variants("dgamma_negated", "outputs", k_dgamma_negated, [("f32", "NHWC", S, 119)])
    e += _variants("dbeta_doubled", "outputs", k_dbeta_doubled, [("bf16", "NCHW", S, 120)])
    e += _variants("sums_never_written", "sums", k_sums_never_written, [("f32", "NCHW", S, 121)])
    e += _variants("f16_accumulate", "reduction", k_f16_accumulate, [("f16", "NCHW", W, 122)])
    e += _variants("warp_per_block_lost", "reduction", k_warp_per_block_lost, [("f32", "NHWC", L, 123)])
    e += _variants("first_column_missing", "reduction", k_first_column_missing, [("f32", "NCHW", S, 124)])
    e += _variants("last_partials_dropped", "reduction", k_last_partials_dropped, [("bf16", "NHWC", L, 125)])
    e += _variants("mean_clamped", "parameters", k_mean_clamped, [("f32", "NHWC", S, 126)])
    e += _variants("gamma_by_h", "parameters", k_gamma_by_h, [("f32", "NCHW", (4, 16, 16, 8), 127)])
    e += _variants("stats_shifted", "parameters", k_stats_shifted_struct, [("f16", "NCHW", S, 128)])
    e += _variants("layout_written_nchw", "outputs", k_layout_written_nchw, [("f32", "NHWC", (2, 24, 6, 6), 129)])
    e += _variants("dx_transposed_hw", "outputs", k_dx_transposed_hw, [("f32", "NCHW", (2, 16, 12, 8), 130)])
    # third round
    e += _variants("pytorch_offset", "correct", k_pytorch_cpu, [("f32", "NCHW", L, 19, {"data": "offset"})], True)
    e += _variants("pytorch_smallvar", "correct", k_pytorch_cpu, [("f32", "NHWC", S, 140, {"data": "smallvar"})],
                   True)
    e += _variants("pytorch_gamma0", "correct", k_pytorch_cpu, [("bf16", "NCHW", S, 141, {"data": "gamma0"})], True)
    e += _variants("one_channel", "correct", k_split_blocks, [("f32", "NCHW", (1, 1, 256, 256), 142)], True)
    e += _variants("f16_m1e5", "correct", k_warp_shuffle, [("f16", "NCHW", (16, 4, 80, 80), 143)], True)
    e += _variants("f64_rank5", "correct", k_f64_accumulate, [("bf16", "NCHW", (2, 8, 24, 12), 144,
                                                                        {"rank": 5, "depth": 3})], True)
    e += _variants("cta_tile_lost", "reduction", k_cta_tile_lost, [("f32", "NHWC", L, 150)])
    e += _variants("racy_block", "reduction", k_racy_block_per_channel, [("f32", "NCHW", L, 151)])
    e += _variants("rsqrt_approx", "statistics", k_rsqrt_approx, [("f32", "NCHW", S, 152)])
    e += _variants("var_as_std", "statistics", k_var_as_std, [("bf16", "NHWC", S, 153)])
    e += _variants("eps_twice", "statistics", k_eps_twice, [("f32", "NCHW", S, 154, {"data": "smallvar"})])
    e += _variants("dy_rounded_bf16", "statistics", k_dy_rounded_bf16, [("f32", "NHWC", S, 155)])
    e += _variants("dgamma_unbiased", "terms", k_dgamma_unbiased_invstd, [("f32", "NCHW", (2, 16, 4, 4), 156)])
    e += _variants("syncbn_no_allreduce", "reduction", k_syncbn_no_allreduce, [("f32", "NCHW", S, 157)])
    e += _variants("stale_dgamma_channels", "sums", k_stale_dgamma_channels, [("f32", "NHWC", S, 158)])
    e += _variants("inf_dbeta", "NaN", k_inf_dbeta, [("f32", "NCHW", S, 159)])
    e += _variants("frozen_dgamma_zero", "sums", k_frozen_dgamma_zero, [("bf16", "NCHW", S, 160, {"data": "gamma0"})])
    e += _variants("last_cta_no_gamma", "channel tile", k_last_cta_no_gamma, [("f32", "NHWC", (2, 64, 8, 8), 161)])
    # near misses
    e += _variants("mean_dy_twice", "terms", k_mean_dy_twice, [("f32", "NHWC", S, 170)])
    e += _variants("front_invstd_unbiased", "terms", k_front_invstd_unbiased, [("f32", "NCHW", (2, 16, 4, 4), 171)])
    e += _variants("dy_next_channel", "parameters", k_dy_next_channel, [("bf16", "NCHW", S, 172)])
    e += _variants("samples_reversed", "outputs", k_samples_reversed, [("f32", "NHWC", S, 173)])
    e += _variants("own_welford_m1e5", "correct", k_own_welford_large_m, [("f32", "NHWC", (16, 4, 80, 80), 174,
                                                                                  {"data": "offset"})], True)
    # the patterns, off by a few units only
    e += _variants("off_every_32nd", "strided", k_off_every_32nd, [("f32", "NCHW", L, 180), ("bf16", "NHWC", L, 181)])
    e += _variants("off_last_256", "tail", k_off_last_256, [("f32", "NHWC", L, 182), ("f16", "NCHW", L, 183)])
    e += _variants("off_rows", "rows", k_off_rows, [("f32", "NCHW", L, 184), ("bf16", "NHWC", L, 185)])
    e += _variants("off_channels", "channel tile", k_off_channels, [("f32", "NHWC", L, 186), ("f16", "NCHW", L, 187)])
    e += _variants("off_sample", "sample", k_off_sample, [("f32", "NCHW", L, 188), ("bf16", "NHWC", L, 189)])
    e += _variants("off_tile", "spatial tile", k_off_tile, [("f32", "NHWC", L, 190), ("f16", "NCHW", L, 191)])
    # flushing
    e += _variants("ftz_bf16", "correct", k_ftz, [("bf16", "NHWC", S, 192, {"data": "tiny"})], True)
    e += _variants("flush_threshold", "channel tile", k_flush_threshold, [("f32", "NCHW", S, 193, {"data": "small"})])
    return e


def main() -> int:
    for entry in zoo():
        print(f"{entry.name:32s} {entry.kind:14s} {'correct' if entry.correct else 'failing'} {entry.shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
