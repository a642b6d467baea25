"""The judged path before and after a change, interleaved: bench/targets.py's judge rows for two trees.

    git archive BASE bnbwd_cli | tar -x -C /tmp/base && python -m bench.judge_ab /tmp/base [--rounds 7] [--cpu]

Each round runs fresh processes, back to back: the floor (`import numpy`), then for the base tree and this one
(PYTHONPATH and the working directory pick the tree) a plain `run` and a `run --reference`. f32 (32,128,56,56),
.npy inputs, both layouts, 2 threads. Prints each round, then medians (min-max): judging's added time as a
multiple of the plain run (both net of the floor), `run --reference`'s wall time and its paired after/before
ratio, and its peak RSS over the bytes of src + diff_dst + the outputs judged.

``--cpu``: instead, the comparison alone, in-process CPU time (steadier than wall time on a shared machine): each
round a fresh process per tree builds the same problem, bnbwd's outputs as the reference, and judges a kernel's
outputs with ``app.judge.compare``: bnbwd's own (exact), and the same with half the elements of diff_src moved
by up to 3 ulps (a kernel that rounds differently).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import end_to_end, targets

ROOT = Path(__file__).resolve().parent.parent


def child(command: list[str], tree: str) -> tuple[float, float]:
    """Wall milliseconds and peak RSS (MiB) of one Python child running `tree`'s bnbwd_cli."""
    env = {**end_to_end.child_env(), "PYTHONPATH": tree}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", end_to_end.RSS_WRAPPER, *command], env=env, cwd=tree,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: a mismatch is still a timed run
        raise RuntimeError(done.stderr[-400:])
    peaks = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("VmHWM_KB")]
    return seconds * 1e3, int(peaks[-1]) / 1024


def layout_rows(work: Path, data_format: str, trees: dict[str, str], rounds: int) -> None:
    end_to_end.write_inputs(work, data_format)
    out = work / "judged"
    out.mkdir()
    child(end_to_end.run_command(work, data_format, 2, ["--out-dir", str(out)])[1:], trees["after"])
    plain = end_to_end.run_command(work, data_format, 2, [])[1:]
    judged = end_to_end.run_command(work, data_format, 2, ["--reference", str(out)])[1:]
    data = sum(np.load(work / f"{name}.npy", mmap_mode="r").nbytes for name in ("src", "diff_dst"))
    data += sum(np.load(out / f"{name}.npy", mmap_mode="r").nbytes for name in ("diff_src", "diff_gamma", "diff_beta"))
    results = {name: {"added": [], "rss": [], "judged": []} for name in trees}
    for round_ in range(rounds + 1):  # round 0 warms the page cache and bytecode
        floor, _ = child(["-c", "import numpy"], trees["after"])
        for name, tree in trees.items():
            plain_ms, _ = child(plain, tree)
            judged_ms, rss = child(judged, tree)
            if round_:
                results[name]["added"].append((judged_ms - plain_ms) / (plain_ms - floor))
                results[name]["rss"].append(rss * 2**20 / data)
                results[name]["judged"].append(judged_ms)
                print(f"{data_format} round {round_} {name}: plain {plain_ms:.0f} judged {judged_ms:.0f} floor "
                      f"{floor:.0f} ms, rss {rss:.0f} MiB; load {os.getloadavg()[0]:.2f}", flush=True)
    for name, result in results.items():
        print(f"{data_format} {name}: judging adds {targets.spread(result['added'], '.2f')}x a plain run; "
              f"`run --reference` {targets.spread(result['judged'])} ms; peak RSS "
              f"{targets.spread(result['rss'], '.2f')}x the data ({data / 2**20:.0f} MiB)")
    ratio = [a / b for a, b in zip(results["after"]["judged"], results["before"]["judged"])]
    print(f"{data_format} `run --reference` after/before, paired: {targets.spread(ratio, '.2f')}")


# One judged comparison, timed in-process: argv tree, layout (NCX/NXC), kernel (exact/ulps); prints CPU seconds.
CPU_CHILD = """
import sys, time
import numpy as np
from bnbwd_cli.app.judge import TensorSets, compare, reference_outputs
from bnbwd_cli.judge.tolerance import Judging
from bnbwd_cli.op import Op
data_format, kernel = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(3)
shape = (32, 128, 56, 56) if data_format == "NCX" else (32, 56, 56, 128)
src, dy = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
mean = rng.standard_normal(128).astype(np.float32) * 0.1
variance, gamma = (rng.uniform(0.5, 1.5, 128).astype(np.float32) for _ in range(2))
op = Op(src, dy, mean, variance, gamma, epsilon=1e-5, data_format=data_format)
reference = reference_outputs(op, ("diff_src", "diff_gamma", "diff_beta"), threads=2)
actual = {name: value.copy() for name, value in reference.items()}
if kernel == "ulps":
    bits = actual["diff_src"].reshape(-1).view(np.int32)
    bits += rng.integers(-3, 4, bits.size).astype(np.int32) * (rng.random(bits.size) < 0.5)
started = time.process_time()
compare(TensorSets(actual, reference, inputs=op), Judging())
print(time.process_time() - started)
"""


def cpu_rows(trees: dict[str, str], rounds: int) -> None:
    for data_format in ("NCX", "NXC"):
        for kernel in ("exact", "ulps"):
            seconds: dict[str, list[float]] = {name: [] for name in trees}
            for round_ in range(rounds):
                for name, tree in trees.items():
                    done = subprocess.run([sys.executable, "-c", CPU_CHILD, data_format, kernel], capture_output=True,
                                          text=True, env={**end_to_end.child_env(), "PYTHONPATH": tree}, cwd=tree)
                    if done.returncode:
                        raise RuntimeError(done.stderr[-400:])
                    seconds[name].append(float(done.stdout.split()[-1]))
                print(f"{data_format} {kernel} round {round_ + 1}: " + ", ".join(
                    f"{name} {values[-1]:.3f} s" for name, values in seconds.items())
                    + f"; load {os.getloadavg()[0]:.2f}", flush=True)
            ratio = [a / b for a, b in zip(seconds["after"], seconds["before"])]
            print(f"{data_format} {kernel}: compare CPU s before {targets.spread(seconds['before'], '.3f')}, after "
                  f"{targets.spread(seconds['after'], '.3f')}; after/before, paired {targets.spread(ratio, '.2f')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="a tree holding the base's bnbwd_cli/")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpu", action="store_true", help="the comparison's in-process CPU time instead")
    args = parser.parse_args()
    trees = {"before": str(Path(args.base).resolve()), "after": str(ROOT)}
    print(f"load average at start {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.cpu:
        cpu_rows(trees, args.rounds)
        print(f"load average at the end {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
        return
    with tempfile.TemporaryDirectory() as root:
        for data_format in ("NCHW", "NHWC"):
            work = Path(root) / data_format
            work.mkdir()
            layout_rows(work, data_format, trees, args.rounds)
            shutil.rmtree(work)
    print(f"load average at the end {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
