"""What the numba core's reduction pays for float64 and a fixed order, measured in one run.

    python -m bench.reduction_cost [--threads 2] [--reps 15]

The two channel sums (Σdy, Σdy·(x - mean)) of f32 (64, 128, 56·56) NCX, three ways, best of N:
- bnbwd's order: the numba core's own lanes and trees (core/plan.py), float64, the same bits on any machine;
- float64 running sums with fast-math: vectorised in whatever order the compiler picks (not reproducible
  across instruction sets), the fastest float64 sum numba makes;
- float32 running sums with fast-math: what the float32 core of commit 6ff4aba accumulated in.
The gap between the last two is the price of float64 accumulation alone (the 1-ulp accuracy of the reference); the gap between
the first two, the price of a fixed order. Needs numba (`pip install '.[fast]'`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SHAPE = (64, 128, 56 * 56)


def build():
    from numba import njit, prange

    from bnbwd_cli.core import plan
    from bnbwd_cli.runtime import load_numba_core

    load_numba_core()  # the cache directory and thread policy, as a run sets them
    from bnbwd_cli.core import numba_kernels

    geometry = plan.geometry(*SHAPE)
    rows = geometry.chunk_rows  # a global int numba freezes into the kernel (it cannot type Geometry)

    @njit(parallel=True)
    def fixed_order(src3, dy3, mean, out):
        n, c, s = src3.shape
        for task in prange(c):
            ch = np.int64(task)
            acc0, acc1 = np.empty(s), np.empty(s)
            for j in range(out.shape[1]):
                out[ch, j, 0], out[ch, j, 1] = numba_kernels._plane_partial(
                    src3, dy3, ch, (j * rows, min((j + 1) * rows, n)), (np.int64(0), s), 1, mean[ch], acc0, acc1)

    @njit(parallel=True, fastmath=True)
    def fast_f64(src3, dy3, mean, out):
        n, c, s = src3.shape
        for ch in prange(c):
            a0 = a1 = 0.0
            for i in range(n):
                for j in range(s):
                    g = np.float64(dy3[i, ch, j])
                    a0 += g
                    a1 += g * (np.float64(src3[i, ch, j]) - mean[ch])
            out[ch, 0, 0], out[ch, 0, 1] = a0, a1

    @njit(parallel=True, fastmath=True)
    def fast_f32(src3, dy3, mean, out):
        n, c, s = src3.shape
        for ch in prange(c):
            a0 = a1 = np.float32(0.0)
            m = np.float32(mean[ch])
            for i in range(n):
                for j in range(s):
                    g = dy3[i, ch, j]
                    a0 += g
                    a1 += g * (src3[i, ch, j] - m)
            out[ch, 0, 0], out[ch, 0, 1] = a0, a1

    return geometry, (("bnbwd's fixed order, float64", fixed_order), ("float64 fast-math", fast_f64),
                      ("float32 fast-math (the old core's sums)", fast_f32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    geometry, kernels = build()
    rng = np.random.default_rng(0)
    src, dy = (rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(2))
    mean = np.zeros(SHAPE[1])
    print(f"| channel sums of f32 {SHAPE} NCX, {args.threads} threads | best of {args.reps} ms |\n|---|---|")
    for name, kernel in kernels:
        out = np.zeros((SHAPE[1], geometry.chunks, 2))
        kernel(src, dy, mean, out)  # compile
        best = float("inf")
        for _ in range(args.reps):
            start = time.perf_counter()
            kernel(src, dy, mean, out)
            best = min(best, time.perf_counter() - start)
        print(f"| {name} | {best * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
