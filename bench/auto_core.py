"""Where core=auto should switch to numba: one fresh process per call, as `bnbwd run` calls the core once.

    python -m bench.auto_core [--rounds 5] [--rows 1,32] [--dtypes float32,bfloat16] [--threads 2]

Each child builds seeded inputs (N, 128, 56, 56), both layouts, then times one `core.backward` call with the core
named, numba's import and cached-kernel load included (the first call of a fresh process: what a run pays). CPU
time (all threads) and wall, interleaved round by round. From the medians: numba's fixed cost (its time at the
smallest N less the NumPy core's) and the CPU each core spends an element (the slope between the two Ns), and the
break-even in elements: fixed cost / saving an element. Run it once first with numba's cache cold to fill it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.ab_core import spread

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
import numpy as np
import ml_dtypes  # noqa: F401 (the bfloat16 dtype name)
from bnbwd_cli.core import Settings, backward
from bnbwd_cli.op import Op
rows, layout, dtype, core, threads = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
shape = (rows, 128, 56, 56) if layout == "NCX" else (rows, 56, 56, 128)
rng = np.random.default_rng(0)
src, dy = (rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(2))
mean, variance = rng.normal(size=128).astype(np.float32), rng.uniform(0.5, 2, 128).astype(np.float32)
op = Op(src, dy, mean, variance, np.ones(128, np.float32), epsilon=1e-5, data_format=layout)
cpu, wall = time.process_time(), time.perf_counter()
result = backward(op, Settings(threads=threads, core=core))
print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "ran": result.core}))
"""


def child(rows: int, layout: str, dtype: str, core: str, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(rows), layout, dtype, core, str(threads)], env=env,
                          cwd=ROOT, capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout.splitlines()[-1])
    if answer["ran"] != core:
        raise RuntimeError(f"asked for {core}, ran {answer['ran']}")
    return answer


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="1,32", help="two batch sizes N: the fixed cost at the first, the slope between")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--layouts", default="NCX,NXC")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    low, high = (int(n) for n in args.rows.split(","))
    print(f"load average at start {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| layout | dtype | N | NumPy core CPU ms | numba core CPU ms | NumPy wall ms | numba wall ms |")
    print("|---|---|---|---|---|---|---|")
    fits = []
    for layout in args.layouts.split(","):
        for dtype in args.dtypes.split(","):
            times = {(n, core): {"cpu": [], "wall": []} for n in (low, high) for core in ("numpy", "numba")}
            for _ in range(args.rounds):
                for n in (low, high):
                    for core in ("numpy", "numba"):
                        answer = child(n, layout, dtype, core, args.threads)
                        for clock in ("cpu", "wall"):
                            times[(n, core)][clock].append(answer[clock] * 1e3)
            for n in (low, high):
                numpy_t, numba_t = times[(n, "numpy")], times[(n, "numba")]
                print(f"| {layout} | {dtype} | {n} | {spread(numpy_t['cpu'], '.0f')} | {spread(numba_t['cpu'], '.0f')} | "
                      f"{spread(numpy_t['wall'], '.0f')} | {spread(numba_t['wall'], '.0f')} |", flush=True)
            elements = (high - low) * 128 * 56 * 56
            slope = {core: (median(times[(high, core)]["cpu"]) - median(times[(low, core)]["cpu"])) / elements * 1e6
                     for core in ("numpy", "numba")}  # ns an element
            fixed = median(times[(low, "numba")]["cpu"]) - median(times[(low, "numpy")]["cpu"])  # ms
            saving = slope["numpy"] - slope["numba"]
            even = fixed * 1e6 / saving if saving > 0 else float("inf")
            fits.append(f"{layout} {dtype}: numba's fixed cost {fixed:.0f} ms CPU; NumPy core {slope['numpy']:.2f} ns an "
                        f"element, numba {slope['numba']:.2f}: break-even {even / 1e6:.0f}M elements")
    print()
    print("\n".join(fits))
    print(f"load average at the end {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
