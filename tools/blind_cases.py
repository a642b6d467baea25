"""The blind zoo's correct kernels on bnbwd's own hard cases: every verdict must be PASS.

Issue 34's held-out target asks that every verdict stays right. tools/blind_check.py measures it on the zoo's own
data; this runs the zoo's correct kernels (written from how real kernels compute, not from the project's) on the
suites `bnbwd cases` writes (odd sizes around block boundaries, |mean|/sd = 1e4, variances near epsilon, gamma
0, masked gradients, M ~ 1e5, ranks 2..5, NCX and NXC, f32/bf16/f16, and generated ones), judged by the real
`bnbwd check` in one process. A correct kernel that fails is a false failure.

    python -m tools.blind_cases                          # default preset, f32/bf16/f16, NCX and NXC
    python -m tools.blind_cases --count 20 --seed 3      # plus 20 generated cases
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import bnbwd_cli
from tools import blind_zoo as bz

ROOT = Path(__file__).resolve().parent.parent
KERNELS = {
    "pytorch_cpu": bz.k_pytorch_cpu, "f64_accumulate": bz.k_f64_accumulate, "kahan": bz.k_kahan,
    "split_blocks": bz.k_split_blocks, "warp_shuffle": bz.k_warp_shuffle, "tf_fused": bz.k_tf_fused,
    "onednn_nhwc": bz.k_onednn_nhwc, "jax_autodiff": bz.k_jax_autodiff, "sequential_f32": bz.k_sequential_f32,
}


@dataclasses.dataclass
class CaseProblem(bz.Problem):
    """A case's arrays in the zoo kernels' logical (N, C, S, 1) view, any rank, either layout."""

    original: tuple = ()

    def stored(self, a):
        s = a.transpose(0, 2, 3, 1) if self.layout == "NHWC" else a
        return np.ascontiguousarray(s).reshape(self.original)

    def logical(self, a):
        n, c, s, _ = self.x.shape
        if self.layout == "NHWC":
            return a.reshape(n, s, 1, c).transpose(0, 3, 1, 2)
        return a.reshape(n, c, s, 1)


def problem(case) -> CaseProblem:
    inputs = case.inputs
    src = inputs["src"]
    last = case.data_format == "NXC"
    n, c = src.shape[0], src.shape[-1] if last else src.shape[1]
    s = src.size // (n * c)

    def view(a):
        return a.reshape(n, s, 1, c).transpose(0, 3, 1, 2) if last else a.reshape(n, c, s, 1)

    gamma = inputs.get("gamma")
    return CaseProblem(view(src), view(inputs["diff_dst"]), np.asarray(inputs["mean"], np.float32),
                       np.asarray(inputs["variance"], np.float32),
                       np.ones(c, np.float32) if gamma is None else np.asarray(gamma, np.float32),
                       "NHWC" if last else "NCHW", "", np.random.default_rng(0), None, original=src.shape)


def outputs(case, kernel) -> dict:
    p = problem(case)
    saved, bz.EPS = bz.EPS, float(case.epsilon)  # the zoo's kernels read their epsilon from the module
    try:
        planted = kernel(p)
    finally:
        bz.EPS = saved
    dt = case.inputs["src"].dtype
    sums_dtype = case.inputs["mean"].dtype
    return {"diff_src": p.stored(planted.dx.astype(np.float32).astype(dt)),
            "diff_gamma": np.asarray(planted.dg, np.float32).astype(sums_dtype),
            "diff_beta": np.asarray(planted.db, np.float32).astype(sums_dtype)}


def write_suite(folder: Path, dtypes, formats, count: int, seed: int) -> int:
    written = 0
    for dtype in dtypes:
        for fmt in formats:
            for case in bnbwd_cli.cases(dtype=dtype, data_format=fmt, seed=seed, count=count):
                if not case.is_training:
                    continue
                inputs = {k: v for k, v in case.inputs.items()}
                inputs.update(epsilon=np.float32(case.epsilon), data_format=np.array(case.data_format))
                for name, kernel in KERNELS.items():
                    stem = folder / f"{case}-{dtype}-{fmt}-{name}"
                    np.savez(f"{stem}.npz", **inputs)
                    np.savez(f"{stem}.out.npz", **outputs(case, kernel))
                    written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="f32,bf16,f16")
    parser.add_argument("--formats", default="NCX,NXC")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="blind-cases-") as tmp:
        folder = Path(tmp)
        n = write_suite(folder, args.dtypes.split(","), args.formats.split(","), args.count, args.seed)
        report = folder / "report.json"
        done = subprocess.run([sys.executable, "-m", "bnbwd_cli", "check", str(folder), "-q", "--jobs",
                               str(args.jobs), "--json", str(report)], cwd=ROOT, capture_output=True, text=True)
        doc = json.loads(report.read_text())
    bad = [c for c in doc["cases"] if c["status"] != "pass"]
    per_kernel = {name: sum(1 for c in bad if c["case"].endswith(f"-{name}.npz")) for name in KERNELS}
    print(f"{n} runs of correct kernels on bnbwd's cases: {n - len(bad)} pass, {len(bad)} not (exit {done.returncode})")
    print("not passing, per kernel: " + ", ".join(f"{k} {v}" for k, v in per_kernel.items()))
    for c in bad:
        print(f"  {c['line'][:300]}")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
