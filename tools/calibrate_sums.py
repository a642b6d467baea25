#!/usr/bin/env python3
"""Calibrate K for diff_gamma and diff_beta on synthetic sums: correct orders never fail, lost partials do.

Dev-only. A seed is C channels of M float32 terms drawn from one distribution (the terms of diff_beta,
dy, or of diff_gamma, dy*xhat). For each seed:

- the error scale s of each channel's sum comes from the model itself (judge/model.terms_sum_scale: the
  root-sum-square of the running partial sums, the random-order one, and a sequential float32 sum's
  realised error as a floor), and the truth r is the float64 sum rounded to float32, as `run --reference`
  compares with;
- correct float32 kernels sum each channel in the orders real ones use (ORDERS) and are judged by the
  scaled rule (judge/rules.ScaledRule: |a - r| <= K*s + ulp(r)); their worst units and failures are
  counted per order;
- lost partial sums: a kernel summing 32-element blocks (a warp's partials) that drops one block in one
  channel. The block is picked among those whose exact partial sum L is 10-15x, 20-25x or 30-40x the
  channel's running-sum error sigma = c * u*sqrt(sum_k S_k**2) (S_k its storage-order prefix sums; c the
  RMS of a sequential float32 sum's realised error in those units over the seeds of this distribution and
  M, estimated on the first seeds and re-measured on all: the bins use the final one). Power = the share of
  such kernels that fail.

The distribution of a lost partial relative to sigma depends on the data: with a mean offset (dy = 1 +
N(0, 1)) no 32-element block reaches 10x sigma at large M, and none is planted there (the table says so).

    python -m tools.calibrate_sums                            # M = 2^18, 1000 seeds, every distribution
    python -m tools.calibrate_sums --m 2097152 --dists normal,product --seeds 1000
    python -m tools.calibrate_sums --quick                    # M = 2^14, 100 seeds (~10 s)
    python -m tools.calibrate_sums --examples                 # lost partials at M ~ 2e6, old and new units

Exits 1 when a run of a correct order fails (the lost partials are expected to).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from bnbwd_cli.dtypes import ulp_spacing
from bnbwd_cli.judge.model import U32, terms_sum_scale
from bnbwd_cli.judge.rules import Chunk, ScaledRule
from bnbwd_cli.judge.tolerance import SUM_MAX_UNITS, Scaled

F32 = np.float32
ORDERS = ("sequential", "blocked", "float64-combine", "pairwise", "tree", "shuffled-atomic", "block-atomic")
LOST_BLOCK = 32
BINS = ((10.0, 15.0), (20.0, 25.0), (30.0, 40.0))
PILOT_SEEDS = 100


def draw(dist: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 terms, (C, M)."""
    a = rng.standard_normal(shape, dtype=np.float32)
    if dist == "normal":  # dy ~ N(0, 1): diff_beta of a typical gradient
        return a
    if dist == "offset1":  # dy ~ 1 + N(0, 1)
        return a + F32(1)
    if dist == "offset10":  # partly correlated roundings at large M
        return a + F32(10)
    if dist == "offset100":  # correlated roundings: the realised sequential floor decides
        return a + F32(100)
    b = rng.standard_normal(shape, dtype=np.float32)
    if dist == "product":  # dy * xhat with independent dy, xhat: diff_gamma, zero mean, heavier tails
        return a * b
    if dist == "correlated-product":  # dy = xhat + noise: diff_gamma ~ M, same-sign terms
        return a * (a + b)
    if dist == "scaled":  # terms spanning decades (|x| log-uniform over 1e-3..1e3), random sign
        return a * F32(10.0) ** rng.uniform(-3, 3, shape).astype(F32)
    raise ValueError(dist)


DISTS = ("normal", "offset1", "offset10", "offset100", "product", "correlated-product", "scaled")


def _sequential(rows: np.ndarray) -> np.ndarray:
    """Row sums, one float32 accumulator per row, element after element."""
    return np.cumsum(rows, axis=1, dtype=F32)[:, -1] if rows.shape[1] else np.zeros(rows.shape[0], F32)


def _tree(rows: np.ndarray) -> np.ndarray:
    """Pairwise tree over the last axis (length a power of two after zero padding), float32."""
    width = 1 << max(0, (rows.shape[1] - 1).bit_length())
    level = np.pad(rows, ((0, 0), (0, width - rows.shape[1])))
    while level.shape[1] > 1:
        level = (level[:, 0::2] + level[:, 1::2]).astype(F32)
    return level[:, 0]


def _block_partials(terms: np.ndarray, block: int) -> np.ndarray:
    """(C, blocks) float32 partial sums of consecutive blocks, each sequential."""
    c, m = terms.shape
    padded = np.pad(terms, ((0, 0), (0, (-m) % block))).reshape(c, -1, block)
    return np.cumsum(padded, axis=2, dtype=F32)[:, :, -1]


def order_sums(terms: np.ndarray, order: str, rng: np.random.Generator) -> np.ndarray:
    """Per-row float32 sums of (C, M) float32 terms in one of the orders correct kernels use."""
    c, m = terms.shape
    if order == "sequential":  # one accumulator per channel in storage order (PyTorch channels_last CPU)
        return _sequential(terms)
    if order == "blocked":  # 256-element partials, sequential, combined in float32 one after another
        return _sequential(_block_partials(terms, 256))
    if order == "float64-combine":  # PyTorch CPU NCHW: float32 partials combined in float64
        return _block_partials(terms, 256).astype(np.float64).sum(axis=1).astype(F32)
    if order == "pairwise":  # NumPy's float32 sum
        return terms.sum(axis=1, dtype=F32)
    if order == "tree":  # GPU block: 1024 threads, each a strided sequential sum, then a tree over the threads
        threads = min(1024, m)
        padded = np.pad(terms, ((0, 0), (0, (-m) % threads))).reshape(c, -1, threads)
        strided = np.cumsum(padded, axis=1, dtype=F32)[:, -1, :]
        return _tree(strided)
    if order == "shuffled-atomic":  # every element atomically added to one float32 accumulator: any order
        return _sequential(np.take_along_axis(terms, rng.permuted(np.tile(np.arange(m), (c, 1)), axis=1), axis=1))
    if order == "block-atomic":  # 256-element blocks reduced by a tree, their partials atomically added in any order
        padded = np.pad(terms, ((0, 0), (0, (-m) % 256))).reshape(c, -1, 256)
        partials = _tree(padded.reshape(-1, 256)).reshape(c, -1)
        return _sequential(rng.permuted(partials, axis=1))
    raise ValueError(order)


def judge(actual: np.ndarray, truth: np.ndarray, scale: np.ndarray, max_units: float) -> tuple[np.ndarray, np.ndarray]:
    """(fails, units) per channel under the scaled rule, f32 outputs."""
    a, r = actual.astype(np.float64), truth.astype(np.float64)
    chunk = Chunk(np.abs(a - r), r, ulp_spacing(r, "f32"), scale)
    verdicts = ScaledRule(Scaled(max_units, U32)).judge(chunk, with_ratio=False)
    return verdicts.fails, verdicts.units


@dataclass
class Tally:
    """Per order: runs, failures, the worst units and where."""

    runs: int = 0
    fails: int = 0
    worst: float = 0.0
    worst_seed: int = -1
    units: list = field(default_factory=list)


def lost_partial_sum(partials: np.ndarray, channel: int, block: int) -> np.ndarray:
    """The 32-block kernel's sums when one block's partial in one channel is lost (never added)."""
    kept = partials.copy()
    kept[channel, block] = 0
    return _sequential(kept)


def _rss(terms: np.ndarray) -> np.ndarray:
    """u * sqrt(sum_k S_k**2) per channel, S_k the storage-order prefix sums."""
    prefix = np.cumsum(terms, axis=1, dtype=np.float64)
    return U32 * np.sqrt(np.einsum("cm,cm->c", prefix, prefix))


def calibrate(dist: str, m: int, seeds: int, channels: int, max_units: float) -> dict:
    start = time.time()
    shape = (channels, m)
    pilot = []
    for seed in range(min(PILOT_SEEDS, seeds)):
        terms = draw(dist, np.random.default_rng([seed, m]), shape)
        exact = terms.astype(np.float64).sum(axis=1)
        pilot.append((_sequential(terms).astype(np.float64) - exact) / _rss(terms))
    c_pilot = float(np.sqrt(np.mean(np.square(pilot))))
    tallies = {order: Tally() for order in ORDERS}
    relative_errors = []
    planted = []  # (|L| / (u*rss) of the channel, fails, units)
    for seed in range(seeds):
        rng = np.random.default_rng([seed, m])
        terms = draw(dist, rng, shape)
        exact = terms.astype(np.float64).sum(axis=1)
        truth = exact.astype(F32)
        scale = terms_sum_scale(terms)
        rss = _rss(terms)
        for order in ORDERS:
            result = order_sums(terms, order, rng)
            if order == "sequential":
                relative_errors.extend((result.astype(np.float64) - exact) / rss)
            fails, units = judge(result, truth, scale, max_units)
            tally = tallies[order]
            tally.runs += 1
            tally.fails += int(fails.any())
            tally.units.extend(units.tolist())
            if units.max() > tally.worst:
                tally.worst, tally.worst_seed = float(units.max()), seed
        partials = _block_partials(terms, LOST_BLOCK)
        exact_partials = np.pad(terms, ((0, 0), (0, (-m) % LOST_BLOCK))).astype(np.float64).reshape(channels, -1, LOST_BLOCK).sum(axis=2)
        channel = int(rng.integers(channels))
        ratio = np.abs(exact_partials[channel]) / (c_pilot * rss[channel])
        for low, high in BINS:  # one block per bin, with slack: the final sigma decides its bin
            candidates = np.flatnonzero((ratio >= 0.8 * low) & (ratio < 1.2 * high))
            if candidates.size:
                block = int(rng.choice(candidates))
                fails, units = judge(lost_partial_sum(partials, channel, block), truth, scale, max_units)
                planted.append((abs(float(exact_partials[channel, block])) / rss[channel], bool(fails[channel]), float(units[channel])))
    c_final = float(np.sqrt(np.mean(np.square(relative_errors))))
    power = {}
    for low, high in BINS:
        hits = [(f, u) for size, f, u in planted if low <= size / c_final < high]
        power[(low, high)] = (sum(f for f, _ in hits), len(hits), min((u for _, u in hits), default=float("nan")))
    return {"dist": dist, "m": m, "seeds": seeds, "channels": channels, "c": c_final, "c_pilot": c_pilot,
            "tallies": tallies, "power": power, "seconds": time.time() - start}


def print_result(res: dict, max_units: float) -> None:
    print(f"\n### {res['dist']}, M = {res['m']}, {res['seeds']} seeds x {res['channels']} channels "
          f"({res['seconds']:.0f} s; a sequential sum's error: RMS {res['c']:.3g} x u*sqrt(sum S_k^2), pilot {res['c_pilot']:.3g})\n")
    print("| order | runs | fail | worst units | 99.9th pct | margin K/worst |")
    print("|---|---:|---:|---:|---:|---:|")
    for order, t in res["tallies"].items():
        pct = float(np.percentile(t.units, 99.9)) if t.units else float("nan")
        print(f"| {order} | {t.runs} | {t.fails} | {t.worst:.3g} (seed {t.worst_seed}) | {pct:.3g} | {max_units / max(t.worst, 1e-300):.3g} |")
    print()
    print("| lost 32-element partial, |L|/sigma | kernels | fail | power | least units |")
    print("|---|---:|---:|---:|---:|")
    for (low, high), (failed, total, least) in res["power"].items():
        share = f"{failed / total:.1%}" if total else "n/a (no such block)"
        print(f"| {low:g}-{high:g}x | {total} | {failed} | {share} | {least:.3g} |")


def examples(seeds: int, max_units: float) -> None:
    """Lost partial sums at M = 2^21 with dy ~ N(0, 1), 4 channels: units under the scale before this
    change, u*sqrt(M)*(D + ||x||_2) raised to the sequential floor, and under the current one."""
    m, channels = 1 << 21, 4
    print(f"\n### Examples: M = {m}, dy ~ N(0, 1) float32, {channels} channels, old scale vs new (K old 16, new {max_units:g})\n")
    print("| seed | bug | old units | new units | new verdict |")
    print("|---:|---|---:|---:|---|")
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 7])
        terms = draw("normal", rng, (channels, m))
        exact = terms.astype(np.float64).sum(axis=1)
        truth = exact.astype(F32)
        prefix = np.cumsum(terms.astype(np.float64), axis=1)
        sequential = _sequential(terms).astype(np.float64)
        old = np.maximum(U32 * np.sqrt(m) * (np.abs(prefix).max(axis=1) + np.sqrt(np.square(terms.astype(np.float64)).sum(axis=1))),
                         np.abs(sequential - exact))
        new = terms_sum_scale(terms)
        partials = _block_partials(terms, LOST_BLOCK)
        exact_partials = terms[0].astype(np.float64).reshape(-1, LOST_BLOCK).sum(axis=1)
        sigma = 0.42 * _rss(terms[:1])[0]  # the channel's running-sum error (RMS measured by calibrate())
        near_20 = int(np.argmin(np.abs(np.abs(exact_partials) / sigma - 20)))
        bugs = {"lost 32-element partial (a random block), channel 0": lost_partial_sum(partials, 0, int(rng.integers(partials.shape[1]))),
                f"lost 32-element partial of {abs(exact_partials[near_20]) / sigma:.1f} sigma, channel 0": lost_partial_sum(partials, 0, near_20),
                "vector loop skips the last 7 elements": _sequential(terms[:, : m - 7])}
        for name, result in bugs.items():
            _, units_old = judge(result, truth, old, 16.0)
            fails, units_new = judge(result, truth, new, max_units)
            print(f"| {seed} | {name} | {units_old.max():.3g} | {units_new.max():.3g} | {'FAIL' if fails.any() else 'pass'} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=1 << 18, help="terms per channel")
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--dists", default=",".join(DISTS))
    parser.add_argument("--max-units", type=float, default=SUM_MAX_UNITS, help="K to judge with")
    parser.add_argument("--quick", action="store_true", help="M = 2^14, 100 seeds")
    parser.add_argument("--examples", action="store_true", help="only the lost-partial examples at M = 2^21")
    args = parser.parse_args(argv)
    if args.examples:
        examples(3, args.max_units)
        return 0
    m, seeds = (1 << 14, 100) if args.quick else (args.m, args.seeds)
    print(f"K = {args.max_units:g}; orders: {', '.join(ORDERS)}")
    correct_failures = 0
    for dist in args.dists.split(","):
        result = calibrate(dist, m, seeds, args.channels, args.max_units)
        print_result(result, args.max_units)
        correct_failures += sum(tally.fails for tally in result["tallies"].values())
        sys.stdout.flush()
    if correct_failures:
        print(f"\n{correct_failures} run(s) of a correct order failed at K = {args.max_units:g}")
    return 1 if correct_failures else 0


if __name__ == "__main__":
    sys.exit(main())
