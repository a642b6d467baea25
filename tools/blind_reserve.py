"""The blind zoo's reserve: kernels kept back from the gaps list, to measure whether the diagnosis generalises.

tools/blind_zoo.py's misses are published (to the engineers who fix the diagnosis), so its rates can rise for
the wrong reason: fixes that fit its kernels. These kernels, of the same kinds but other realisations (other
strides, tiles, rows, channels, samples, statistics, terms, subsets, maps), were written at the same time and
kept out of the gaps list until the last measurement; their rate against the zoo's says how much of the gain is
general.

    python -m tools.blind_check --zoo tools.blind_reserve
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from tools.blind_zoo import (
    DTYPES, F32, F64, Planted, _small_off, _stored_mask, _storage_bug, _variants, ch, elementwise, invstd_of, k_f64_accumulate, k_kahan,
    k_split_blocks, k_tf_fused, k_jax_autodiff, masked_sums, number_words, reference_kernel, region_where, sums, to16,
)


def _region_bug(p, mask, wrong, what, **kw):
    planted = reference_kernel(p)
    return dataclasses.replace(planted, dx=np.where(mask, wrong, planted.dx), region=region_where(p, mask),
                               what=what, **kw)


# --- places ---------------------------------------------------------------------------------------------------------

def r_lane_pair(p):
    """Lanes 6..7 of every 8 stored elements read gamma as 1 (a float8 store's last pair)."""
    planted = reference_kernel(p)
    wrong = p.stored(elementwise(p, planted.db, planted.dg, gamma=np.ones_like(p.gamma)).astype(F32)).reshape(-1)
    mask = np.arange(wrong.size) % 8 >= 6
    stored, region = _storage_bug(p, planted, mask, wrong[mask])
    return dataclasses.replace(planted, stored_dx=stored, region=region, what="lanes 6..7 of 8")


def r_every_48th(p):
    planted = reference_kernel(p)
    flat = p.stored(planted.dx.astype(F32)).reshape(-1)
    mask = np.arange(flat.size) % 48 == 47
    stored, region = _storage_bug(p, planted, mask, flat[mask] * F32(1.05))
    return dataclasses.replace(planted, stored_dx=stored, region=region, what="every 48th, offset 47, x1.05")


def r_stale_zero_tail(p):
    planted = reference_kernel(p)
    flat = p.stored(planted.dx.astype(F32)).reshape(-1)
    mask = np.arange(flat.size) >= flat.size - 1000
    stored, region = _storage_bug(p, planted, mask, np.zeros(1000, F32))
    return dataclasses.replace(planted, stored_dx=stored, region=region, what="last 1000 zero")


def r_odd_rows(p):
    """An interleaved row loop whose odd rows use diff_dst of the row above."""
    planted = reference_kernel(p)
    dy = p.dy.astype(F32).copy()
    dy[:, :, 1::2] = p.dy[:, :, 0::2][:, :, : dy[:, :, 1::2].shape[2]]
    wrong = elementwise(dataclasses.replace(p, dy=dy), planted.db, planted.dg)
    mask = np.zeros(p.shape, bool)
    mask[:, :, 1::2] = True
    return _region_bug(p, mask, wrong, "odd rows")


def r_top_rows(p):
    mask = np.zeros(p.shape, bool)
    mask[:, :, :4] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, -planted.dx, "h=0..3 negated")


def r_right_columns(p):
    mask = np.zeros(p.shape, bool)
    mask[..., -4:] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, planted.dx * F32(1.5), "w=W-4.. x1.5")


def r_two_channel_tiles(p):
    mask = np.zeros(p.shape, bool)
    mask[:, 0:8] = mask[:, 24:32] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, planted.dx * F32(0.9), "c=0..7, 24..31 x0.9", causes=("fitted-terms",),
                       words=r"scaled by 0\.9(?!\d)")


def r_channels_mod8(p):
    """A loop over channels in blocks of 8 whose first channel of each block reads invstd of the previous block."""
    c = np.arange(p.shape[1])
    invstd = invstd_of(p.var)
    bad = invstd[np.where(c % 8 == 0, (c - 1) % p.shape[1], c)]
    planted = reference_kernel(p)
    wrong = elementwise(p, planted.db, planted.dg, invstd=bad)
    mask = np.zeros(p.shape, bool)
    mask[:, c % 8 == 0] = True
    return _region_bug(p, mask, wrong, "c % 8 == 0")


def r_first_and_last_sample(p):
    mask = np.zeros(p.shape, bool)
    mask[0] = mask[-1] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, planted.dx + F32(0.01), "n=0 and n=N-1 +0.01")


def r_last_two_samples(p):
    mask = np.zeros(p.shape, bool)
    mask[-2:] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, np.zeros_like(planted.dx), "n=N-2.. zero")


def r_diagonal_tiles(p):
    mask = np.zeros(p.shape, bool)
    for t in range(0, min(p.shape[2:]), 16):
        mask[:, :, t:t + 8, t:t + 8] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, planted.dx * F32(1.2), "8x8 tiles on the diagonal")


def r_tile_one_channel(p):
    mask = np.zeros(p.shape, bool)
    c0 = int(p.rng.integers(0, p.shape[1]))
    mask[:, c0, 4:12, 4:12] = True
    planted = reference_kernel(p)
    return _region_bug(p, mask, planted.dx * F32(2), f"tile h,w=4..11 in c={c0}")


def r_nan_tile(p):
    mask = np.zeros(p.shape, bool)
    c0 = int(p.rng.integers(0, p.shape[1]))
    mask[:, c0, :4, :4] = True
    return _region_bug(p, mask, np.full(p.shape, np.nan, F32), f"NaN tile in c={c0}", region_output="nonfinite")


def r_inf_every_64th(p):
    planted = reference_kernel(p)
    size = int(np.prod(p.shape))
    mask = np.arange(size) % 64 == 5
    stored, region = _storage_bug(p, planted, mask, np.full(mask.sum(), np.inf, F32))
    return dataclasses.replace(planted, stored_dx=stored, region=region, region_output="nonfinite",
                               what="Inf every 64th")


def r_nan_all_dgamma(p):
    db, dg = sums(p)
    dg_out = np.full_like(dg, np.nan)
    return Planted(elementwise(p, db, dg), dg_out, db, region=np.ones(p.shape[1], bool),
                   region_output="diff_gamma:nonfinite", what="diff_gamma all NaN")


# --- causes ---------------------------------------------------------------------------------------------------------

def r_stats_f16(p):
    mean, invstd = to16(p.mean, np.float16), to16(invstd_of(p.var), np.float16)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db,
                   causes=("16-bit-statistics", "fitted-statistics"), what="stats saved in f16")


def r_no_eps(p):
    invstd = (1 / np.sqrt(p.var)).astype(F32)
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("epsilon", "fitted-statistics"),
                   words=r"\b0\b|no epsilon|without|epsilon 0", what="epsilon left out")


def r_running_mean_only(p):
    """The running mean (a stale estimate) with the batch variance."""
    mean = (p.mean + p.rng.normal(0, 0.2, p.mean.shape) * np.sqrt(p.var)).astype(F32)
    db, dg = sums(p, mean=mean)
    return Planted(elementwise(p, db, dg, mean=mean), dg, db, causes=("fitted-statistics",), what="running mean")


def r_divide_by_invstd(p):
    """k = gamma / invstd (the standard deviation where invstd belongs)."""
    db, dg = sums(p)
    invstd = invstd_of(p.var)
    dx = elementwise(p, db, dg) / ch(invstd * invstd)
    return Planted(dx, dg, db, causes=("fitted-terms",), words="invstd", what="gamma/invstd")


def r_dy_term_scaled(p):
    db, dg = sums(p)
    m = p.m
    return Planted(elementwise(p, db, dg, terms=(m / (m - 1), 1, 1)), dg, db, causes=("fitted-terms",),
                   words=r"M.?1|M-1|" + number_words(m / (m - 1)), what="dy term x M/(M-1)")


def r_dbeta_next_channel(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), dg, np.roll(db, -1), causes=("output-in-another-place",
                   "parameter-misread", "fitted-terms"), coarse=("unexplained:bug is in the sums written",),
                   what="diff_beta written one channel ahead")


def r_dgamma_from_x(p):
    """diff_gamma = sum(dy * x): the mean not subtracted and invstd not applied."""
    db, dg = sums(p)
    dgx = (p.dy.astype(F32) * p.x.astype(F32)).sum((0, 2, 3), dtype=F32)
    return Planted(elementwise(p, db, dg), dgx, db, causes=("gamma-sum-from-x",), what="diff_gamma = sum(dy*x)")


def r_dx_never_written(p):
    planted = reference_kernel(p)
    return dataclasses.replace(planted, dx=np.zeros_like(planted.dx), causes=("unwritten-channels",),
                               coarse=("unexplained:elementwise pass",), what="diff_src all zeros")


def r_lanes_0_3_of_16(p):
    keep = np.ones((p.shape[1], p.m))
    keep[:, (np.arange(p.m) % 16) < 4] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing",), coarse=("sums-wrong",),
                   words=r"0\.\.3|16", what="lanes 0..3 of 16 missing")


def r_samples_1_2_missing(p):
    hw = p.shape[2] * p.shape[3]
    keep = np.ones((p.shape[1], p.m))
    keep[:, hw:3 * hw] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing", "lost-partial-sum"),
                   coarse=("sums-wrong",), words=r"n=1\.\.2|1\.\.2|block", what="n=1..2 missing")


def r_last_row_doubled(p):
    h, w = p.shape[2], p.shape[3]
    rows = np.zeros((p.shape[0], h, w), bool)
    rows[:, -1] = True
    keep = np.where(rows.reshape(1, -1), 2.0, 1.0).repeat(p.shape[1], 0)
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-doubled",), coarse=("sums-wrong",),
                   words=rf"h={h - 1}", what="the last row counted twice")


def r_prefix_missing(p):
    keep = np.ones((p.shape[1], p.m))
    keep[:, :100] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing", "lost-partial-sum"),
                   coarse=("sums-wrong",), words=r"100", what="the first 100 of each channel missing")


def r_gamma_half_index(p):
    idx = np.arange(p.shape[1]) // 2
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, gamma=p.gamma[idx]), dg, db, causes=("parameter-misread",),
                   what="gamma[c//2]")


def r_invstd_reversed(p):
    invstd = invstd_of(p.var)[::-1].copy()
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("parameter-misread",),
                   words=r"revers", what="invstd reversed")


def r_mean_stride3(p):
    c = p.shape[1]
    mean = p.mean[(np.arange(c) * 3) % c]
    db, dg = sums(p, mean=mean)
    return Planted(elementwise(p, db, dg, mean=mean), dg, db, causes=("parameter-misread",), what="mean[3c mod C]")


def r_gamma_by_w(p):
    db, dg = sums(p)
    invstd = invstd_of(p.var)
    x, dy = p.x.astype(F32), p.dy.astype(F32)
    xhat = (x - ch(p.mean)) * ch(invstd)
    m = F32(p.m)
    dx = p.gamma[None, None, None, :] * ch(invstd) * (dy - ch(db / m) - xhat * ch(dg / m))
    return Planted(dx, dg, db, causes=("parameter-misread",), words=r"\bw\b|w\]|\[w", what="gamma[w]")


def r_k_in_bf16(p):
    """gamma*invstd kept in bfloat16 (a fused scale in the 16-bit parameter dtype)."""
    db, dg = sums(p)
    k = to16(p.gamma * invstd_of(p.var), ml_dtypes.bfloat16)
    dx = elementwise(p, db, dg, gamma=k / invstd_of(p.var))
    return Planted(dx, dg, db, causes=("fitted-terms", "16-bit-statistics", "fitted-statistics"),
                   what="gamma*invstd rounded to bf16")


# --- small errors (a few units) in other patterns -------------------------------------------------------------------

def r_off_every_16th(p):
    size = int(np.prod(p.shape))
    return _small_off(p, (np.arange(size) % 16 == 9).reshape(p.stored(p.x).shape), "every 16th, offset 9")


def r_off_columns(p):
    mask = np.zeros(p.shape, bool)
    mask[..., :5] = True
    return _small_off(p, _stored_mask(p, mask), "w=0..4")


def r_off_channels_nchw(p):
    mask = np.zeros(p.shape, bool)
    mask[:, 8:24] = True
    return _small_off(p, _stored_mask(p, mask), "c=8..23")


def r_off_two_samples(p):
    mask = np.zeros(p.shape, bool)
    mask[1:3] = True
    return _small_off(p, _stored_mask(p, mask), "n=1..2")


def r_off_tail_2000(p):
    size = int(np.prod(p.shape))
    return _small_off(p, (np.arange(size) >= size - 2000).reshape(p.stored(p.x).shape), "last 2000")


def r_off_tile_8(p):
    mask = np.zeros(p.shape, bool)
    mask[:, :, 8:16, 24:32] = True
    return _small_off(p, _stored_mask(p, mask), "tile h=8..15 w=24..31")


# --- more causes (added 06:05) --------------------------------------------------------------------------------------

def r_var_bf16(p):
    """The variance rounded to bfloat16 before the rsqrt (a bf16 parameter buffer)."""
    invstd = invstd_of(to16(p.var, ml_dtypes.bfloat16))
    db, dg = sums(p, invstd=invstd)
    return Planted(elementwise(p, db, dg, invstd=invstd), dg, db, causes=("16-bit-statistics", "fitted-statistics"),
                   what="variance rounded to bf16")


def r_previous_batch_stats(p):
    """The statistics of the previous batch (another draw of the same distribution)."""
    x = (p.x.astype(F64) + p.rng.normal(0, 0.05, p.shape[1])[None, :, None, None] * np.sqrt(p.var)[None, :, None, None])
    mean = x.mean((0, 2, 3)).astype(F32)
    var = (p.var * p.rng.uniform(0.9, 1.1, p.shape[1])).astype(F32)
    invstd = invstd_of(var)
    db, dg = sums(p, mean=mean, invstd=invstd)
    return Planted(elementwise(p, db, dg, mean=mean, invstd=invstd), dg, db, causes=("fitted-statistics",),
                   what="the previous batch's statistics")


def r_no_dy_term(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, terms=(0, 1, 1)), dg, db, causes=("fitted-terms",), what="no dy term")


def r_xhat_term_over_m2(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, terms=(1, 1, 1 / p.m)), dg, db, causes=("fitted-terms",),
                   what="xhat term divided by M twice")


def r_dgamma_halved(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), dg / 2, db, causes=("fitted-terms",), words=r"0\.5|half|halv",
                   what="diff_gamma / 2")


def r_dbeta_times_gamma(p):
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg), dg, db * p.gamma, causes=("fitted-terms",), words="gamma",
                   what="diff_beta = sum(gamma*dy)")


def r_every_other_block(p):
    keep = np.ones((p.shape[1], p.m))
    keep[:, (np.arange(p.m) // 512) % 2 == 1] = 0
    db, dg = masked_sums(p, keep)
    return Planted(elementwise(p, db, dg), dg, db, causes=("partial-reduction-missing", "lost-partial-sum"),
                   coarse=("sums-wrong",), what="every other block of 512 missing")


def r_gamma_plus2_clamped(p):
    c = p.shape[1]
    g = p.gamma[np.minimum(np.arange(c) + 2, c - 1)]
    db, dg = sums(p)
    return Planted(elementwise(p, db, dg, gamma=g), dg, db, causes=("parameter-misread",), words=r"2",
                   what="gamma[c+2] clamped")


def zoo() -> list:
    S = (4, 32, 16, 16)
    L = (4, 32, 32, 32)
    e = []
    e += _variants("r_kahan", "correct", k_kahan, [("bf16", "NCHW", S, 300)], True)
    e += _variants("r_split_m1e5", "correct", k_split_blocks, [("bf16", "NCHW", (16, 4, 80, 80), 301)], True)
    e += _variants("r_tf", "correct", k_tf_fused, [("f16", "NHWC", L, 302)], True)
    e += _variants("r_jax_r5", "correct", k_jax_autodiff, [("f32", "NHWC", (2, 8, 12, 8), 303,
                                                                   {"rank": 5, "depth": 3})], True)
    e += _variants("r_f64", "correct", k_f64_accumulate, [("f32", "NCHW", (8, 64, 7, 7), 304)], True)
    e += _variants("r_lane_pair", "strided", r_lane_pair, [("f32", "NCHW", S, 310)])
    e += _variants("r_every_48th", "strided", r_every_48th, [("bf16", "NHWC", S, 311)])
    e += _variants("r_stale_zero_tail", "tail", r_stale_zero_tail, [("f16", "NHWC", L, 312)])
    e += _variants("r_odd_rows", "rows", r_odd_rows, [("f32", "NCHW", S, 313)])
    e += _variants("r_top_rows", "rows", r_top_rows, [("bf16", "NHWC", S, 314)])
    e += _variants("r_right_columns", "spatial tile", r_right_columns, [("f32", "NHWC", S, 315)])
    e += _variants("r_two_channel_tiles", "channel tile", r_two_channel_tiles, [("f16", "NCHW", S, 316)])
    e += _variants("r_channels_mod8", "channel tile", r_channels_mod8, [("f32", "NHWC", S, 317)])
    e += _variants("r_first_last_sample", "sample", r_first_and_last_sample, [("f32", "NCHW", S, 318)])
    e += _variants("r_last_two_samples", "sample", r_last_two_samples, [("bf16", "NHWC", (6, 16, 8, 8), 319)])
    e += _variants("r_diagonal_tiles", "spatial tile", r_diagonal_tiles, [("f32", "NCHW", L, 320)])
    e += _variants("r_tile_one_channel", "spatial tile", r_tile_one_channel, [("f16", "NHWC", S, 321)])
    e += _variants("r_nan_tile", "NaN", r_nan_tile, [("f32", "NHWC", S, 322)])
    e += _variants("r_inf_every_64th", "NaN", r_inf_every_64th, [("bf16", "NCHW", S, 323)])
    e += _variants("r_nan_all_dgamma", "NaN", r_nan_all_dgamma, [("f32", "NCHW", S, 324)])
    e += _variants("r_stats_f16", "statistics", r_stats_f16, [("f16", "NCHW", S, 330)])
    e += _variants("r_no_eps", "statistics", r_no_eps, [("f32", "NHWC", S, 331, {"data": "smallvar"})])
    e += _variants("r_running_mean", "statistics", r_running_mean_only, [("bf16", "NCHW", S, 332)])
    e += _variants("r_divide_by_invstd", "terms", r_divide_by_invstd, [("f32", "NCHW", S, 333)])
    e += _variants("r_dy_term_scaled", "terms", r_dy_term_scaled, [("f32", "NHWC", (2, 16, 5, 5), 334)])
    e += _variants("r_k_in_bf16", "terms", r_k_in_bf16, [("f32", "NCHW", L, 335)])
    e += _variants("r_dbeta_next", "sums", r_dbeta_next_channel, [("f32", "NHWC", S, 336)])
    e += _variants("r_dgamma_from_x", "sums", r_dgamma_from_x, [("bf16", "NCHW", S, 337)])
    e += _variants("r_dx_never_written", "outputs", r_dx_never_written, [("f32", "NHWC", S, 338)])
    e += _variants("r_lanes_0_3_of_16", "reduction", r_lanes_0_3_of_16, [("f32", "NCHW", S, 340)])
    e += _variants("r_samples_1_2", "reduction", r_samples_1_2_missing, [("f16", "NHWC", S, 341)])
    e += _variants("r_last_row_doubled", "reduction", r_last_row_doubled, [("f32", "NCHW", S, 342)])
    e += _variants("r_prefix_missing", "reduction", r_prefix_missing, [("bf16", "NHWC", S, 343)])
    e += _variants("r_gamma_half_index", "parameters", r_gamma_half_index, [("f32", "NCHW", S, 350)])
    e += _variants("r_invstd_reversed", "parameters", r_invstd_reversed, [("f32", "NHWC", S, 351)])
    e += _variants("r_mean_stride3", "parameters", r_mean_stride3, [("bf16", "NCHW", S, 352)])
    e += _variants("r_gamma_by_w", "parameters", r_gamma_by_w, [("f32", "NHWC", (4, 16, 8, 16), 353)])
    e += _variants("r_off_every_16th", "strided", r_off_every_16th, [("f32", "NHWC", L, 360)])
    e += _variants("r_off_columns", "spatial tile", r_off_columns, [("f32", "NCHW", L, 361)])
    e += _variants("r_off_channels", "channel tile", r_off_channels_nchw, [("f32", "NCHW", L, 362)])
    e += _variants("r_off_two_samples", "sample", r_off_two_samples, [("f32", "NHWC", L, 363)])
    e += _variants("r_off_tail_2000", "tail", r_off_tail_2000, [("f32", "NCHW", L, 364)])
    e += _variants("r_off_tile_8", "spatial tile", r_off_tile_8, [("bf16", "NCHW", L, 365)])
    e += _variants("r_var_bf16", "statistics", r_var_bf16, [("f32", "NCHW", L, 370)])
    e += _variants("r_previous_batch", "statistics", r_previous_batch_stats, [("f32", "NHWC", S, 371)])
    e += _variants("r_no_dy_term", "terms", r_no_dy_term, [("bf16", "NCHW", S, 372)])
    e += _variants("r_xhat_over_m2", "terms", r_xhat_term_over_m2, [("f32", "NHWC", S, 373)])
    e += _variants("r_dgamma_halved", "outputs", r_dgamma_halved, [("f16", "NCHW", S, 374)])
    e += _variants("r_dbeta_x_gamma", "sums", r_dbeta_times_gamma, [("f32", "NHWC", S, 375)])
    e += _variants("r_every_other_block", "reduction", r_every_other_block, [("f32", "NCHW", L, 376)])
    e += _variants("r_gamma_plus2", "parameters", r_gamma_plus2_clamped, [("f32", "NHWC", S, 377)])
    return e


__all__ = ["zoo", "DTYPES", "F64"]
