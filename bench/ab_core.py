"""A/B timing of core versions: each version in its own worker process, calls interleaved, best of N.

    python -m bench.ab_core old=/tmp/old-core base=/tmp/base-core new=.
    (make the trees with e.g. `git worktree add --detach /tmp/old-core 6ff4aba`)
    python -m bench.ab_core naive=naive b2=.@2097152 b8=.@8388608 --cores numpy   (tile budgets)
    python -m bench.ab_core old=/tmp/old-core new=. --cores numpy --dtypes float32,bfloat16,float16 --clock cpu

A version is name=tree[@block_bytes]; the tree "naive" is bench/run_bench.py's whole-array NumPy expressions.

Each worker imports bnbwd_cli from its tree (the tree is its PYTHONPATH), builds the same seeded inputs
per case and times one backward call per request: the parent asks every worker in turn, round after round,
so a disturbance on a shared machine hits every version alike. Reported per (case, version): the median time in
ms with its spread (min-max over the rounds), and each version's ratio to the first one as the median of the
rounds' paired ratios (a round's versions ran back to back) with their spread. Trees from before the core/ package (bnbwd_cli.kernels)
are called through batchnorm_backward.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve()
ROOT = WORKER.parent.parent
SHAPE = (64, 128, 56, 56)


def nxc(shape):
    return (shape[0], *shape[2:], shape[1])


def make_call(case: dict, tree: str):
    """A no-argument function running one backward call of this tree for the case."""
    import ml_dtypes  # noqa: F401 - registers "bfloat16" as a NumPy dtype name
    import numpy as np

    dtype = np.dtype(case["dtype"])
    shape = tuple(case["shape"]) if case["layout"] == "NCX" else nxc(case["shape"])
    rng = np.random.default_rng(0)
    src = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    dy = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    c = case["shape"][1]
    mean, var, gamma = rng.normal(size=c).astype(np.float32), rng.uniform(0.5, 2, c).astype(np.float32), np.ones(c, np.float32)
    out = np.empty_like(src)
    options = dict(epsilon=1e-5, data_format=case["layout"])
    settings = dict(diff_src_out=out, threads=case["threads"], core=case["core"], block_bytes=case.get("block_bytes"))
    if tree == "naive":
        from bench.run_bench import naive_numpy

        invstd = 1 / np.sqrt(var + np.float32(1e-5))
        return lambda: naive_numpy(src, dy, mean, invstd, gamma, case["layout"])
    try:
        from bnbwd_cli.core import Op, Settings, backward
    except ImportError:
        from bnbwd_cli.kernels import batchnorm_backward

        return lambda: batchnorm_backward(src, dy, mean, var, gamma, **options, **settings)
    op = Op(src, dy, mean, var, gamma, **options)
    return lambda: backward(op, Settings(**settings))


def worker(version: str) -> None:
    tree, _, budget = version.partition("@")
    call = None
    for line in sys.stdin:
        request = json.loads(line)
        if "case" in request:
            case = request["case"] if not budget else {**request["case"], "block_bytes": int(budget)}
            call = make_call(case, tree)
            call()  # warm: numba compiles or loads its cache, scratch is allocated
            answer = {"ok": True}
        else:
            start, cpu = time.perf_counter(), time.process_time()
            call()
            answer = {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu}
        print(json.dumps(answer), flush=True)


class Worker:
    def __init__(self, version: str) -> None:
        # The worker runs as a file, from /, so that its PYTHONPATH alone says whose bnbwd_cli it imports: the tree's
        # (a tree may hold its own bench/ too), or this checkout's for "naive" (bench.run_bench's expressions).
        tree = version.partition("@")[0]
        env = {**os.environ, "PYTHONPATH": str(ROOT) if tree == "naive" else tree}
        self.process = subprocess.Popen([sys.executable, str(WORKER), "--worker", version], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd="/", env=env)

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())


def spread(values: list[float], form: str) -> str:
    """median (min-max) of the values."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"{median:{form}} ({ordered[0]:{form}}-{ordered[-1]:{form}})"


def resolve(version: str) -> str:
    tree, at, budget = version.partition("@")
    return (tree if tree == "naive" else str(Path(tree).resolve())) + at + budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", help="name=tree")
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cores", default="numpy,numba")
    parser.add_argument("--layouts", default="NCX,NXC")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or the process's CPU time (all threads: less disturbed by other processes)")
    parser.add_argument("--block-bytes", type=int, default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    names = [v.split("=", 1)[0] for v in args.versions]
    # trees resolved here: the workers run in / (a relative tree such as "." would import the installed package)
    workers = [Worker(resolve(v.split("=", 1)[1])) for v in args.versions]
    print("| core | layout | dtype | " + " | ".join(f"{n} ms, median (min-max)" for n in names) + " | "
          + " | ".join(f"{n}/{names[0]}, median (min-max)" for n in names[1:]) + " |")
    print("|---" * (3 + 2 * len(names) - 1) + "|")
    for core in args.cores.split(","):
        for layout in args.layouts.split(","):
            for dtype in args.dtypes.split(","):
                case = dict(shape=SHAPE, layout=layout, dtype=dtype, core=core, threads=args.threads,
                            block_bytes=args.block_bytes)
                for w in workers:
                    w.ask({"case": case})
                rounds = [[w.ask({"time": True})[args.clock] * 1e3 for w in workers] for _ in range(args.reps)]
                cells = " | ".join(spread([r[i] for r in rounds], ".1f") for i in range(len(workers)))
                ratios = " | ".join(spread([r[i] / r[0] for r in rounds], ".2f") for i in range(1, len(workers)))
                print(f"| {core} | {layout} | {dtype} | {cells} | {ratios} |", flush=True)
    for w in workers:
        w.process.stdin.close()
        w.process.wait()


if __name__ == "__main__":
    main()
