"""Every number the judged path reports, hashed: run it in two trees and compare the lines (a speed change to
judge/ must keep them all).

    python -m bench.judge_bits [--large] [--threads 2]          # this tree
    cd /tmp && PYTHONPATH=BASE_TREE:REPO python -m bench.judge_bits   # BASE_TREE's bnbwd_cli, this repo's bench/

For each problem (dtype x shape x layout) and each kernel output (bnbwd's own; scaled by 1+3e-6; some elements
NaN and some doubled) it judges with ``judge_kernel`` (``judge_outputs`` in older trees) and hashes the repr of
every row (the verdict, the summary numbers, the bias fit, the diagnosis), the details (worst elements,
per-channel table, histogram), and the channel facts' arrays. ``--large`` adds f32 (32,128,56,56) in both layouts. Prints one line a case, then one
hash over all of them.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time


def problems(large: bool):
    """(label, dtype, shape as NCX, data_format)."""
    shapes = [(8, 16, 14, 14), (3, 5, 7, 11), (64, 4, 9, 9)]
    out = []
    for dtype in ("float32", "float64", "bfloat16", "float16"):
        for shape in shapes:
            for data_format in ("NCX", "NXC"):
                out.append((f"{dtype} {shape} {data_format}", dtype, shape, data_format))
    for dtype in ("float32", "bfloat16"):  # several blocks; a channel's run longer than a block
        for shape in ((24, 8, 96, 96), (3, 6, 600, 300)):
            for data_format in ("NCX", "NXC"):
                out.append((f"{dtype} {shape} {data_format}", dtype, shape, data_format))
    if large:
        for data_format in ("NCX", "NXC"):
            out.append((f"float32 (32,128,56,56) {data_format}", "float32", (32, 128, 56, 56), data_format))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="each verdict on stderr")
    parser.add_argument("--threads", type=int, default=1,
                        help="the judging's threads: 1, the judging pass regresses its own pieces; 2, the regression "
                             "runs on a second thread (the same hash either way)")
    args = parser.parse_args()
    verbose = args.verbose
    import numpy as np

    import bnbwd_cli
    from bnbwd_cli.app import judge as app_judge
    from bnbwd_cli.dtypes import dtype_from_name
    from bnbwd_cli.judge.model import channel_facts
    from bnbwd_cli.judge.tolerance import Judging
    from bnbwd_cli.op import Op

    print(f"tree {bnbwd_cli.__file__}", file=sys.stderr)
    everything = hashlib.sha256()
    started = time.process_time()
    for label, dtype, shape, data_format in problems(args.large):
        rng = np.random.default_rng(sum(map(ord, label)))
        n, c, *spatial = shape
        full = shape if data_format == "NCX" else (n, *spatial, c)
        kind = dtype_from_name({"bfloat16": "bf16"}.get(dtype, dtype))
        src = (rng.standard_normal(full) * 2 + 0.5).astype(kind)
        dy = (rng.standard_normal(full) + 0.1).astype(kind)
        stats = np.float64 if dtype == "float64" else np.float32
        mean = src.astype(np.float64).mean(axis=tuple(i for i in range(4) if i != (1 if data_format == "NCX" else 3)))
        mean = mean.astype(stats)
        variance = rng.uniform(0.5, 4.0, c).astype(stats)
        gamma = rng.uniform(0.5, 1.5, c).astype(stats)
        op = Op(src, dy, mean, variance, gamma, epsilon=1e-5, data_format=data_format)
        facts = channel_facts(op)
        digest = hashlib.sha256(repr(facts).encode())
        for field in ("partial_beta", "partial_gamma", "norm_beta", "norm_gamma", "sequential_beta", "sequential_gamma",
                      "diff_beta", "diff_gamma"):
            digest.update(np.ascontiguousarray(getattr(facts, field)).tobytes())
        from bnbwd_cli.app.judge import reference_outputs
        reference = reference_outputs(op, ("diff_src", "diff_gamma", "diff_beta"), threads=1)
        kernels = {
            "correct": {k: v.copy() for k, v in reference.items()},
            "scaled": {k: (v.astype(np.float64) * (1 + 3e-6)).astype(v.dtype) for k, v in reference.items()},
        }
        broken = {k: v.copy() for k, v in reference.items()}
        flat = broken["diff_src"].reshape(-1)
        flat[rng.choice(flat.size, max(1, flat.size // 1000), replace=False)] = np.nan
        picked = rng.choice(flat.size, max(1, flat.size // 500), replace=False)
        flat[picked] = (flat[picked].astype(np.float64) * 2).astype(flat.dtype)
        broken["diff_gamma"][0] = np.nan
        kernels["nan_doubled"] = broken
        for kernel, actual in kernels.items():
            for up_front in (False, True):
                if hasattr(app_judge, "judge_kernel"):  # one judgement for every face (issue 33)
                    result = app_judge.judge_kernel(op, actual, Judging(details_up_front=up_front, threads=args.threads))
                elif args.threads == 1:  # (as older trees take it: their Judging has no threads)
                    result = app_judge.judge_outputs(op, actual, Judging(details_up_front=up_front), threads=1)
                else:
                    result = app_judge.judge_outputs(op, actual, Judging(details_up_front=up_front, threads=args.threads))
                if verbose:
                    print(label, kernel, up_front, [(row.name, row.status) for row in result.outputs], file=sys.stderr)
                for row in result.outputs:
                    digest.update(repr(row).encode())
                    if row.comparison is not None:
                        digest.update(repr(row.comparison.details).encode())
        line = f"{label}: {digest.hexdigest()[:16]}"
        everything.update(line.encode())
        print(line, flush=True)
    print(f"all: {everything.hexdigest()[:16]}  ({time.process_time() - started:.1f} s CPU)")


if __name__ == "__main__":
    main()
