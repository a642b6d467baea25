"""The speed targets in one command: whole runs, their phases, judging, and the cores, each a median of rounds.

    python -m bench.targets [--rounds 11] [--threads N] [--skip e2e,phases,judge,route,cores] [--markdown OUT.md]

Every table is measured round by round: each contender once a round, back to back (A, B, C, A, B, C, ...), so
a machine shared with other work moves them alike. A time is the median over the rounds with its min-max; a
ratio is the median of the rounds' own ratios (a round's contenders ran back to back) with its min-max.

- e2e: fresh processes, f32 (32,128,56,56), both layouts, .npz in/out (`bnbwd run x.npz -o out.npz`) and .npy
  in/out (`--out-dir`), against a PyTorch script (load, `native_batch_norm_backward`, save) and a naive NumPy
  script (load, whole-array float32 expressions, save). Net: bnbwd and the naive script less the floor
  `python -c "import numpy"` of the same round, the PyTorch script as timed inside itself after `import torch`;
  with floors: whole processes. Net CPU (user + system, all threads; steadier than wall on a shared machine):
  bnbwd and the naive script less the floor's, the PyTorch script's own after `import torch`. Peak RSS: each
  child's VmHWM.
- phases: the .npy job through bnbwd's layers (imports, read, core, write) against PyTorch's load, compute,
  save, each timed inside its own fresh process (bench/end_to_end.py's scripts).
- judge: `run --reference` against a plain `run` (no output), net of the floor, wall and CPU; a failing kernel's
  `run --reference` (diff_src 0.1% too large: the diagnosis runs); peak RSS against the bytes of src + diff_dst +
  the outputs judged.
- route: judging a passing kernel (exact, and a few ulps off) in one process, bnbwd's reference included, against
  the PyTorch route on the same tensors (`native_batch_norm_backward`, then `torch.testing.assert_close` on the
  three outputs): CPU time (all threads) and wall, each route after a warm-up call on a small problem.
- cores: one worker process per contender (bench/ab_core.py's protocol), (64,128,56,56) f32/bf16/f16 both
  layouts: the NumPy core, the numba core, torch's `native_batch_norm_backward` (channels_last for NXC), a
  naive NumPy expression and a numba triad over the same bytes (read src and diff_dst, write diff_src: the
  bandwidth bound).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import ab_core, end_to_end
from tools.torch_bridge import to_torch

ROOT = Path(__file__).resolve().parent.parent

E2E_SHAPE = (32, 128, 56, 56)
CORE_SHAPE = (64, 128, 56, 56)

# Load, compute, save in PyTorch: the job `bnbwd run` does. argv: kind (npz|npy), inputs, data_format, threads, out.
# Prints its own milliseconds after `import torch` (its net time: torch's import, 1-2.5 s here, is no floor to
# subtract, it moves too much).
TORCH_JOB = """
import sys, time
import numpy as np
import torch
started, started_cpu = time.perf_counter(), time.process_time()
kind, inputs, data_format, threads, out = sys.argv[1:6]
torch.set_num_threads(int(threads))
if kind == "npz":
    with np.load(inputs) as bundle:
        arrays = {name: bundle[name] for name in ("src", "diff_dst", "mean", "variance", "gamma")}
else:
    arrays = {name: np.load(f"{inputs}/{name}.npy") for name in ("src", "diff_dst", "mean", "variance", "gamma")}
src, dy, mean, variance, gamma = (torch.from_numpy(arrays[k]) for k in ("src", "diff_dst", "mean", "variance", "gamma"))
""" + end_to_end.TORCH_BACKWARD + """
outputs = {"diff_src": diff_src.numpy(), "diff_gamma": diff_gamma.numpy(), "diff_beta": diff_beta.numpy()}
if kind == "npz":
    np.savez(out, **outputs)
else:
    for name, array in outputs.items():
        np.save(f"{out}/{name}.npy", array)
print((time.process_time() - started_cpu) * 1e3, (time.perf_counter() - started) * 1e3)  # CPU (all threads), wall
"""

# The same job as a NumPy user writes it first: whole-array float32 expressions (bench/run_bench.py's naive_numpy).
NAIVE_JOB = """
import sys
import numpy as np
kind, inputs, data_format, threads, out = sys.argv[1:6]
if kind == "npz":
    with np.load(inputs) as bundle:
        arrays = {name: bundle[name] for name in ("src", "diff_dst", "mean", "variance", "gamma")}
else:
    arrays = {name: np.load(f"{inputs}/{name}.npy") for name in ("src", "diff_dst", "mean", "variance", "gamma")}
src, g, mean, variance, gamma = (arrays[k] for k in ("src", "diff_dst", "mean", "variance", "gamma"))
axes = (0, 2, 3) if data_format == "NCHW" else (0, 1, 2)
shape = (1, -1, 1, 1) if data_format == "NCHW" else (1, 1, 1, -1)
invstd = 1 / np.sqrt(variance + np.float32(1e-5))
m = src.size // mean.size
xhat = (src - mean.reshape(shape)) * invstd.reshape(shape)
diff_beta = g.sum(axis=axes)
diff_gamma = (g * xhat).sum(axis=axes)
diff_src = (gamma * invstd).reshape(shape) * (g - (diff_beta / m).reshape(shape) - xhat * (diff_gamma / m).reshape(shape))
outputs = {"diff_src": diff_src, "diff_gamma": diff_gamma, "diff_beta": diff_beta}
if kind == "npz":
    np.savez(out, **outputs)
else:
    for name, array in outputs.items():
        np.save(f"{out}/{name}.npy", array)
"""


def spread(values: list[float], form: str = ".0f") -> str:
    return ab_core.spread(values, form)


def median(values: list[float]) -> float:
    return float(np.median(values))


def run_child(command: list[str], fresh: Path | None = None) -> tuple[float, float, str, float]:
    """Wall seconds, peak RSS (MiB), stdout and CPU seconds (user + system, all threads) of one Python child
    (`-m module ...` or `-c code ...`); `fresh` is emptied first (the child's outputs go there)."""
    if fresh is not None:
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", end_to_end.RSS_WRAPPER, *command], env=end_to_end.child_env(), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: a judged run's mismatch is still a timed run
        raise RuntimeError(f"{' '.join(command[:3])} failed ({done.returncode}): {done.stderr[-400:]}")
    peaks = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("VmHWM_KB")]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, int(peaks[-1]) / 1024 if peaks else float("nan"), done.stdout, cpu


def rounds_of(commands: dict[str, tuple[list[str], Path | None]], rounds: int,
              timed_inside: tuple[str, ...] = ()) -> dict[str, dict[str, list[float]]]:
    """{name: {"wall": [ms...], "cpu": [ms...], "rss": [MiB...], "inner": [ms...], "inner_cpu": [ms...]}} over
    `rounds` rounds, after one warm-up round (page cache, bytecode); "inner" and "inner_cpu": the wall and CPU
    milliseconds the commands named in timed_inside print last."""
    results = {name: {"wall": [], "cpu": [], "rss": [], "inner": [], "inner_cpu": []} for name in commands}
    for round_ in range(rounds + 1):
        for name, (command, fresh) in commands.items():
            seconds, rss, printed, cpu = run_child(command, fresh)
            if round_:
                results[name]["wall"].append(seconds * 1e3)
                results[name]["cpu"].append(cpu * 1e3)
                results[name]["rss"].append(rss)
                if name in timed_inside:
                    results[name]["inner"].append(float(printed.split()[-1]))
                    results[name]["inner_cpu"].append(float(printed.split()[-2]))
    return results


def write_inputs(work: Path, data_format: str) -> None:
    """The .npy inputs (end_to_end's) and the same arrays as one .npz bundle."""
    end_to_end.write_inputs(work, data_format)
    arrays = {name: np.load(work / f"{name}.npy") for name in ("src", "diff_dst", "mean", "variance", "gamma")}
    np.savez(work / "x.npz", **arrays, epsilon=np.float64(1e-5), data_format=np.str_(data_format))


# ---------------------------------------------------------------- whole runs


def e2e_rows(work: Path, data_format: str, threads: int, rounds: int) -> list[str]:
    floor = ["-c", "import numpy"]
    out = work / "out"
    rows = []
    for kind in ("npz", "npy"):
        inputs = str(work / "x.npz") if kind == "npz" else str(work)
        target = str(out / "out.npz") if kind == "npz" else str(out)
        if kind == "npz":
            ours = ["-m", "bnbwd_cli", "run", inputs, "-o", target, "-q", "--threads", str(threads)]
        else:
            ours = end_to_end.run_command(work, data_format, threads, ["--out-dir", target])[1:]
        job = [kind, inputs, data_format, str(threads), target]
        timing = rounds_of({"floor": (floor, None), "bnbwd": (ours, out),
                            "torch": (["-c", TORCH_JOB, *job], out), "naive": (["-c", NAIVE_JOB, *job], out)}, rounds,
                           timed_inside=("torch",))
        wall = {name: result["wall"] for name, result in timing.items()}
        net = {"bnbwd": [b - f for b, f in zip(wall["bnbwd"], wall["floor"])],
               "torch": timing["torch"]["inner"],
               "naive": [n - f for n, f in zip(wall["naive"], wall["floor"])]}
        cpu = {name: result["cpu"] for name, result in timing.items()}
        net_cpu = {"bnbwd": [b - f for b, f in zip(cpu["bnbwd"], cpu["floor"])], "torch": timing["torch"]["inner_cpu"],
                   "naive": [n - f for n, f in zip(cpu["naive"], cpu["floor"])]}
        ratio = lambda a, b: spread([x / y for x, y in zip(a, b)], ".2f")
        rss = " / ".join(f"{median(timing[name]['rss']):.0f}" for name in ("bnbwd", "torch", "naive"))
        rows.append(f"| {data_format} .{kind} | {spread(wall['bnbwd'])} | {spread(wall['torch'])} | "
                    f"{spread(wall['naive'])} | {spread(wall['floor'])} | {spread(net['torch'])} | "
                    f"**{ratio(net['bnbwd'], net['torch'])}** | **{ratio(net['bnbwd'], net['naive'])}** | "
                    f"{ratio(wall['bnbwd'], wall['torch'])} | {ratio(wall['bnbwd'], wall['naive'])} | "
                    f"{spread(net_cpu['bnbwd'])} / {spread(net_cpu['torch'])} / {spread(net_cpu['naive'])} | "
                    f"{ratio(net_cpu['bnbwd'], net_cpu['torch'])} | {ratio(net_cpu['bnbwd'], net_cpu['naive'])} | {rss} |")
    return rows


E2E_HEADER = ["| layout, files | bnbwd ms | PyTorch script ms | naive NumPy script ms | floor ms (`import numpy`) "
              "| PyTorch after `import torch` ms | bnbwd/PyTorch, net | bnbwd/naive, net | bnbwd/PyTorch, with floors "
              "| bnbwd/naive, with floors | net CPU ms (bnbwd / PyTorch / naive) | bnbwd/PyTorch, net CPU "
              "| bnbwd/naive, net CPU | peak RSS MiB (bnbwd / PyTorch / naive) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


# ---------------------------------------------------------------- phases and judging


def phase_rows(work: Path, data_format: str, threads: int, rounds: int) -> list[str]:
    """bnbwd's imports / read / core / write against PyTorch's load / compute / save (ms, medians)."""
    args = [str(work), data_format, str(threads)]
    commands = {"bnbwd": [sys.executable, "-c", end_to_end.PHASES_SCRIPT, *args],
                "torch": [sys.executable, "-c", end_to_end.TORCH_SCRIPT, *args]}
    seen: dict[str, list[list[float]]] = {name: [] for name in commands}
    out = work / "phases_out"
    for round_ in range(rounds + 1):
        for name, command in commands.items():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            done = subprocess.run([*command, str(out)], env=end_to_end.child_env(), cwd=ROOT, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{name} phases failed: {done.stderr[-400:]}")
            if round_:
                seen[name].append([float(v) * 1e3 for v in done.stdout.split()[-4:]])
    ours = [spread([r[i] for r in seen["bnbwd"]]) for i in range(4)]
    theirs = [spread([r[i] for r in seen["torch"]]) for i in range(3)]
    core_ratio = spread([a[2] / b[1] for a, b in zip(seen["bnbwd"], seen["torch"])], ".2f")
    return [f"| {data_format} | {' / '.join(ours)} | {' / '.join(theirs)} | {core_ratio} |"]


PHASE_HEADER = ["| layout | bnbwd imports / read / core / write ms | PyTorch load / compute / save ms "
                "| core/compute |", "|---|---|---|---|"]


def judge_rows(work: Path, data_format: str, threads: int, rounds: int) -> list[str]:
    out, failing = work / "judged", work / "failing"
    run_child(end_to_end.run_command(work, data_format, threads, ["--out-dir", str(out)])[1:], out)  # what is judged
    failing.mkdir(exist_ok=True)  # a failing kernel: bnbwd's outputs with diff_src 0.1% too large (a scaling bug)
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        values = np.load(out / f"{name}.npy")
        np.save(failing / f"{name}.npy", (values * np.float32(1.001)) if name == "diff_src" else values)
    plain = end_to_end.run_command(work, data_format, threads, [])[1:]
    judged = end_to_end.run_command(work, data_format, threads, ["--reference", str(out)])[1:]
    failed = end_to_end.run_command(work, data_format, threads, ["--reference", str(failing)])[1:]
    timing = rounds_of({"floor": (["-c", "import numpy"], None), "plain": (plain, None), "judged": (judged, None),
                        "failing": (failed, None)}, rounds)
    wall = {name: result["wall"] for name, result in timing.items()}
    cpu = {name: result["cpu"] for name, result in timing.items()}
    added = [(j - p) / (p - f) for j, p, f in zip(wall["judged"], wall["plain"], wall["floor"])]
    added_cpu = [(j - p) / (p - f) for j, p, f in zip(cpu["judged"], cpu["plain"], cpu["floor"])]
    data = sum(np.load(work / f"{name}.npy", mmap_mode="r").nbytes for name in ("src", "diff_dst"))
    data += sum(np.load(out / f"{name}.npy", mmap_mode="r").nbytes for name in ("diff_src", "diff_gamma", "diff_beta"))
    rss = median(timing["judged"]["rss"])
    both = lambda name: f"{spread(wall[name])} / {spread(cpu[name])}"
    return [f"| {data_format} | {both('plain')} | {both('judged')} | {both('failing')} | {both('floor')} | "
            f"**{spread(added, '.2f')}** / {spread(added_cpu, '.2f')} | "
            f"{rss:.0f} MiB = **{rss * 2**20 / data:.2f}x** the data ({data / 2**20:.0f} MiB) |"]


JUDGE_HEADER = ["| layout | `run` ms (wall / CPU) | `run --reference` ms (wall / CPU) | a failing kernel's `run "
                "--reference` ms (wall / CPU) | floor ms (wall / CPU) | judging adds (x a plain run, net; wall / CPU) "
                "| peak RSS of `run --reference` |", "|---|---|---|---|---|---|---|"]


# A passing kernel judged in one process: bnbwd's reference and its judgement (app.judge: reference_outputs, then
# compare) against the PyTorch route (native_batch_norm_backward, then torch.testing.assert_close on the three
# outputs). argv: route (bnbwd|torch), layout (NCHW|NHWC), kernel (exact|ulps), threads. The kernel's outputs are
# bnbwd's own ("exact") or the same with half of diff_src's elements moved by up to 3 ulps ("ulps"); both routes
# judge the same tensors. Each route runs once on a small problem first (its lazy imports and first calls: torch's
# first assert_close costs ~0.7 s of them), then prints its CPU (all threads) and wall milliseconds.
ROUTE_CHILD = """
import sys, time
import numpy as np
route, data_format, kernel, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from bnbwd_cli.app.judge import TensorSets, compare, reference_outputs
from bnbwd_cli.judge.tolerance import Judging
from bnbwd_cli.op import Op
NAMES = ("diff_src", "diff_gamma", "diff_beta")

def problem(n):
    rng = np.random.default_rng(3)
    shape = (n, 128, 56, 56) if data_format == "NCHW" else (n, 56, 56, 128)
    src, dy = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
    mean = rng.standard_normal(128).astype(np.float32) * 0.1
    variance, gamma = (rng.uniform(0.5, 1.5, 128).astype(np.float32) for _ in range(2))
    op = Op(src, dy, mean, variance, gamma, epsilon=1e-5, data_format="NCX" if data_format == "NCHW" else "NXC")
    actual = reference_outputs(op, NAMES, threads=threads)
    if kernel == "ulps":
        bits = actual["diff_src"].reshape(-1).view(np.int32)
        bits += rng.integers(-3, 4, bits.size).astype(np.int32) * (rng.random(bits.size) < 0.5)
    return op, actual

if route.startswith("bnbwd"):  # bnbwd-numba: the same, with $BNBWD_CORE=numba (the compiled judging)
    def judge(op, actual):
        reference = reference_outputs(op, NAMES, threads=threads)
        result = compare(TensorSets(actual, reference, inputs=op), Judging(threads=threads))
        assert result.exit_code == 0, result.status
else:
    import torch
    torch.set_num_threads(threads)

    def judge(op, actual):
        src, dy = torch.from_numpy(op.src), torch.from_numpy(op.diff_dst)
        if data_format == "NHWC":
            src, dy = src.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)  # channels_last strides: torch's NHWC kernel
        mean, variance, gamma = (torch.from_numpy(v) for v in (op.mean, op.variance, op.gamma))
        invstd = torch.rsqrt(variance + 1e-5)
        outputs = torch.ops.aten.native_batch_norm_backward(dy, src, gamma, None, None, mean, invstd, True, 1e-5,
                                                            [True, True, True])
        diff_src = outputs[0].permute(0, 2, 3, 1) if data_format == "NHWC" else outputs[0]
        for name, expected in zip(NAMES, (diff_src, *outputs[1:])):
            try:  # (diff_gamma and diff_beta, float64 sums rounded once, may be past its float32 default tolerances)
                torch.testing.assert_close(torch.from_numpy(actual[name]), expected)
            except AssertionError:
                assert name != "diff_src"

judge(*problem(2))
op, actual = problem(32)
cpu, wall = time.process_time(), time.perf_counter()
judge(op, actual)
print((time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3)
"""


def route_rows(data_format: str, threads: int, rounds: int, numba: bool = False) -> list[str]:
    """Judging a passing kernel in one process: bnbwd's route against PyTorch's, interleaved round by round; with
    ``numba``, bnbwd's route with the compiled judging too ($BNBWD_CORE=numba: judge/numba_facts.py, numba_pass.py;
    the NumPy core still computes the reference, as core=auto does at this size)."""
    rows = []
    routes = ("bnbwd", "torch", "bnbwd-numba") if numba else ("bnbwd", "torch")
    for kernel in ("exact", "ulps"):
        seen: dict[str, dict[str, list[float]]] = {route: {"cpu": [], "wall": []} for route in routes}
        for _ in range(rounds):
            for route, times in seen.items():
                env = {**end_to_end.child_env(), **({"BNBWD_CORE": "numba"} if route == "bnbwd-numba" else {})}
                done = subprocess.run([sys.executable, "-c", ROUTE_CHILD, route, data_format, kernel, str(threads)],
                                      env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"{route} route failed: {done.stderr[-400:]}")
                cpu, wall = (float(v) for v in done.stdout.split()[-2:])
                times["cpu"].append(cpu)
                times["wall"].append(wall)
        ratio = lambda route, clock: spread([a / b for a, b in zip(seen[route][clock], seen["torch"][clock])], ".2f")
        compiled = (f" {spread(seen['bnbwd-numba']['cpu'])} / {spread(seen['bnbwd-numba']['wall'])} | "
                    f"**{ratio('bnbwd-numba', 'cpu')}** |") if numba else " - | - |"
        rows.append(f"| {data_format} | {kernel} | {spread(seen['bnbwd']['cpu'])} / {spread(seen['bnbwd']['wall'])} | "
                    f"{spread(seen['torch']['cpu'])} / {spread(seen['torch']['wall'])} | **{ratio('bnbwd', 'cpu')}** | "
                    f"{ratio('bnbwd', 'wall')} |{compiled}")
    return rows


ROUTE_HEADER = ["| layout | kernel | bnbwd: reference + judging ms (CPU / wall) | PyTorch: backward + assert_close x3 ms "
                "(CPU / wall) | bnbwd/PyTorch CPU | bnbwd/PyTorch wall | bnbwd, numba judging ms (CPU / wall) "
                "| numba judging/PyTorch CPU |", "|---|---|---|---|---|---|---|---|"]


# ---------------------------------------------------------------- the cores


def make_call(case: dict, contender: str):
    """A no-argument function doing one call of the contender on the case's inputs (a worker process's)."""
    import ml_dtypes  # noqa: F401 - registers bfloat16

    if contender in ("numpy", "numba", "naive"):
        return ab_core.make_call({**case, "core": contender if contender != "naive" else "numpy"},
                                 "naive" if contender == "naive" else str(ROOT))
    dtype = np.dtype(case["dtype"])
    shape = tuple(case["shape"]) if case["layout"] == "NCX" else ab_core.nxc(case["shape"])
    rng = np.random.default_rng(0)
    src = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    dy = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if contender == "triad":
        return triad_call(src, dy, case["threads"])
    import torch

    torch.set_num_threads(case["threads"])

    x, g = to_torch(torch, src), to_torch(torch, dy)
    if case["layout"] == "NXC":
        x, g = x.permute(0, 3, 1, 2), g.permute(0, 3, 1, 2)  # channels_last strides
    c = case["shape"][1]
    mean, invstd, gamma = torch.zeros(c), torch.ones(c), torch.ones(c)
    return lambda: torch.ops.aten.native_batch_norm_backward(g, x, gamma, None, None, mean, invstd, True, 1e-5,
                                                             [True, True, True])


def triad_call(src: np.ndarray, dy: np.ndarray, threads: int):
    """out = src + dy over the same bytes as integers (read two tensors, write one): the bandwidth bound."""
    import numba
    from numba import njit, prange

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    kind = {2: np.uint16, 4: np.uint32, 8: np.uint64}[src.itemsize]
    a, b = src.reshape(-1).view(kind), dy.reshape(-1).view(kind)
    out = np.empty_like(a)

    @njit(parallel=True)
    def kernel(a, b, out):
        for i in prange(a.shape[0]):
            out[i] = a[i] + b[i]

    return lambda: kernel(a, b, out)


def worker(contender: str) -> None:
    call = None
    for line in sys.stdin:
        request = json.loads(line)
        if "case" in request:
            call = make_call(request["case"], contender)
            call()  # warm: numba compiles or loads its cache, pages are touched
            answer = {"ok": True}
        else:
            started = time.perf_counter()
            call()
            answer = {"wall": time.perf_counter() - started}
        print(json.dumps(answer), flush=True)


class Worker(ab_core.Worker):
    def __init__(self, contender: str) -> None:  # ab_core's pipe protocol, this file's worker
        self.process = subprocess.Popen([sys.executable, "-m", "bench.targets", "--worker", contender],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def core_rows(threads: int, rounds: int, dtypes: list[str], contenders: list[str]) -> list[str]:
    workers = {name: Worker(name) for name in contenders}
    rows = []
    try:
        for layout in ("NCX", "NXC"):
            for dtype in dtypes:
                case = dict(shape=CORE_SHAPE, layout=layout, dtype=dtype, threads=threads)
                for w in workers.values():
                    w.ask({"case": case})
                times = {name: [] for name in workers}
                for _ in range(rounds):
                    for name, w in workers.items():
                        times[name].append(w.ask({"time": True})["wall"] * 1e3)
                cells = " | ".join(spread(times[name], ".1f") if name in times else "–" for name in CORE_CONTENDERS)

                def ratio(a: str, b: str) -> str:
                    if a not in times or b not in times:
                        return "–"
                    return spread([x / y for x, y in zip(times[a], times[b])], ".2f")

                rows.append(f"| {layout} | {dtype} | {cells} | **{ratio('numpy', 'torch')}** | {ratio('numba', 'torch')} "
                            f"| **{ratio('numba', 'triad')}** | {ratio('numpy', 'triad')} | {ratio('naive', 'torch')} |")
                print(rows[-1], flush=True)
    finally:
        for w in workers.values():
            w.process.stdin.close()
            w.process.wait()
    return rows


CORE_CONTENDERS = ("numpy", "numba", "torch", "naive", "triad")
CORE_HEADER = ["| layout | dtype | NumPy core ms | numba core ms | torch ms | naive NumPy ms | triad ms | NumPy/torch "
               "| numba/torch | numba/triad | NumPy/triad | naive/torch |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]


def cpu_model() -> str:
    """The CPU's model name (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def available(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    parser.add_argument("--skip", default="", help="comma list of tables to skip: e2e,phases,judge,route,cores")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16", help="the cores table's dtypes")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    from bnbwd_cli.runtime import usable_cores

    threads = args.threads or usable_cores()
    skip = set(args.skip.split(","))
    has_torch, has_numba = available("torch"), available("numba")
    lines = [f"# bnbwd targets ({args.rounds} interleaved rounds; medians (min-max))", "",
             f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {threads} threads; Python "
             f"{platform.python_version()}, NumPy {np.__version__}; load average at start "
             f"{' / '.join(f'{v:.2f}' for v in os.getloadavg())}", ""]
    print("\n".join(lines), flush=True)

    def section(title: str, header: list[str], rows: list[str]) -> None:
        block = [f"## {title}", "", *header, *rows, ""]
        lines.extend(block)
        print("\n".join(block), flush=True)

    if not has_torch and not {"e2e", "phases"} <= skip:
        print("torch is not installed here: the e2e and phases tables need it (pip install '.[bench]')", flush=True)
        skip |= {"e2e", "phases"}
    with tempfile.TemporaryDirectory(dir=args.workdir) as work_root:
        for data_format in ("NCHW", "NHWC"):
            if {"e2e", "phases", "judge", "route"} <= skip:
                break
            work = Path(work_root) / data_format
            work.mkdir()
            write_inputs(work, data_format)
            if "e2e" not in skip:
                section(f"Whole run, f32 {E2E_SHAPE} {data_format} (fresh processes)", E2E_HEADER,
                        e2e_rows(work, data_format, threads, args.rounds))
            if "phases" not in skip:
                section(f"Where the time goes, {data_format} (.npy in, --out-dir)", PHASE_HEADER,
                        phase_rows(work, data_format, threads, args.rounds))
            if "judge" not in skip:
                section(f"Judging, {data_format} (.npy, `run --reference` vs `run`)", JUDGE_HEADER,
                        judge_rows(work, data_format, threads, args.rounds))
            if "route" not in skip and has_torch:
                section(f"Judging a passing kernel, f32 {E2E_SHAPE} {data_format}, in one process: bnbwd against the "
                        "PyTorch route", ROUTE_HEADER, route_rows(data_format, threads, args.rounds, has_numba))
            shutil.rmtree(work)
    if "cores" not in skip:
        contenders = [c for c in CORE_CONTENDERS if (c != "torch" or has_torch) and (c not in ("numba", "triad") or has_numba)]
        print(f"## The cores, {CORE_SHAPE} and its NXC twin, {threads} threads (worker processes)\n", flush=True)
        print("\n".join(CORE_HEADER), flush=True)
        rows = core_rows(threads, args.rounds, args.dtypes.split(","), contenders)
        lines.extend([f"## The cores, {CORE_SHAPE} and its NXC twin, {threads} threads (worker processes)", "",
                      *CORE_HEADER, *rows, ""])
    lines.append(f"load average at the end {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(lines[-1])
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
