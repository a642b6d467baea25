"""bnbwd benchmark: one command, one run, two tables (speed and accuracy).

    python -m bench.run_bench [--quick] [--torch-python PATH] [--markdown OUT.md]

Speed: for L2-, L3- and DRAM-sized tensors, both layouts, f32/bf16/f16: the bnbwd core
(best of several runs), whole-array NumPy, PyTorch CPU `native_batch_norm_backward`
(when a Python with torch is found: this one, --torch-python, or $BNBWD_BENCH_TORCH_PYTHON;
torch runs in a child process, so bnbwd's own environment needs no torch), the
bandwidth bound (3 tensor passes at the copy bandwidth measured in this run), the
ratios, and one 1 GB+ `bnbwd run` through the CLI against NumPy load + save alone.
End to end (bench/end_to_end.py): start-up, `bnbwd run` against a PyTorch load + compute + save
script, and `run --reference` against `run`, whole processes, each a ratio measured in this run.
Accuracy: normalised max error max|out - ref| / max|ref| against the package's float64
oracle (bnbwd_cli.core.reference), on ordinary and cancellation-prone inputs (mean offset 1e4 standard deviations).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

from bench import end_to_end
from bnbwd_cli.core.reference import reference_backward
from bnbwd_cli.dtypes import BFLOAT16
from tools.accuracy import normalised_error
from tools.torch_bridge import to_torch

ROOT = Path(__file__).resolve().parent.parent


def best_of(function, reps: int) -> float:
    function()  # warm-up: page faults, scratch buffers
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def nxc_shape(shape):
    return (shape[0], *shape[2:], shape[1])


# ---------------------------------------------------------------- torch, in a child process


def torch_worker(spec_path: str) -> None:
    """Run inside a Python that has torch: time or evaluate the cases in the JSON spec."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
    results = []
    for case in spec["cases"]:
        if "src" in case:  # accuracy: load the very inputs bnbwd saw
            arrays = {k: np.load(case[k]) for k in ("src", "diff_dst", "mean", "invstd", "gamma")}
            arrays = {k: a.view(BFLOAT16) if a.dtype.kind == "V" else a for k, a in arrays.items()}  # .npy keeps bf16 as V2
            dtype = dtypes[case["dtype"]]
            src, dy = to_torch(torch, arrays["src"]), to_torch(torch, arrays["diff_dst"])
        else:
            shape = case["shape"] if case["format"] == "NCX" else nxc_shape(case["shape"])
            dtype = dtypes[case["dtype"]]
            src = torch.randn(shape, dtype=torch.float32).to(dtype)
            dy = torch.randn(shape, dtype=torch.float32).to(dtype)
            c = case["shape"][1]
            arrays = {"mean": np.zeros(c, np.float32), "invstd": np.ones(c, np.float32), "gamma": np.ones(c, np.float32)}
        if case["format"] == "NXC":
            src, dy = src.movedim(-1, 1), dy.movedim(-1, 1)  # channels_last strides: torch's NHWC kernel
        mean, invstd, gamma = (torch.from_numpy(arrays[k].astype(np.float32)) for k in ("mean", "invstd", "gamma"))

        def call():
            return torch.ops.aten.native_batch_norm_backward(dy, src, gamma, None, None, mean, invstd, True, 1e-5,
                                                             [True, True, True])

        if "src" in case:
            out = call()
            diff_src = out[0].movedim(1, -1) if case["format"] == "NXC" else out[0]
            np.save(case["out"], diff_src.float().contiguous().numpy())
            np.save(case["out"] + ".gamma.npy", out[1].double().numpy())
            np.save(case["out"] + ".beta.npy", out[2].double().numpy())
            results.append(None)
        else:
            results.append(best_of(call, case["reps"]))
    print(json.dumps({"torch": torch.__version__, "results": results}))


def find_torch_python(flag: str | None) -> str | None:
    candidates = [flag, os.environ.get("BNBWD_BENCH_TORCH_PYTHON"), sys.executable]
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode == 0:
            return candidate
    return None


def run_torch(python: str | None, cases: list[dict], threads: int) -> tuple[list, str | None]:
    if python is None:
        return [None] * len(cases), None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump({"threads": threads, "cases": cases}, spec)
    try:
        done = subprocess.run([python, "-m", "bench.run_bench", "--torch-worker", spec.name], capture_output=True,
                              text=True, cwd=ROOT)
    finally:
        os.unlink(spec.name)
    if done.returncode != 0:
        print(f"torch worker failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
        return [None] * len(cases), None
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["results"], answer["torch"]


# ---------------------------------------------------------------- NumPy baselines


def naive_numpy(src, dy, mean, invstd, gamma, data_format):
    """Whole-array expressions, float32 compute: the obvious implementation."""
    axes = tuple(i for i in range(src.ndim) if i != (1 if data_format == "NCX" else src.ndim - 1))
    shape = [1] * src.ndim
    shape[1 if data_format == "NCX" else -1] = -1
    x, g = src.astype(np.float32, copy=False), dy.astype(np.float32, copy=False)
    m = src.size // mean.size
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    diff_beta = g.sum(axis=axes)
    diff_gamma = (g * xhat).sum(axis=axes)
    diff_src = (gamma * invstd).reshape(shape) * (g - (diff_beta / m).reshape(shape) - xhat * (diff_gamma / m).reshape(shape))
    return diff_src.astype(src.dtype), diff_gamma, diff_beta


def copy_bandwidth(threads: int) -> float:
    """Bytes/s of a threaded NumPy copy of a 256 MiB array (read + write counted)."""
    source = np.ones(64 << 20, np.float32)
    target = np.empty_like(source)
    halves = np.array_split(np.arange(source.size), threads)
    bounds = [(h[0], h[-1] + 1) for h in halves]
    with ThreadPoolExecutor(threads) as pool:
        def copy():
            list(pool.map(lambda b: np.copyto(target[b[0] : b[1]], source[b[0] : b[1]]), bounds))
        seconds = best_of(copy, 5)
    return 2 * source.nbytes / seconds


# ---------------------------------------------------------------- the tables


def dtype_of(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def speed_table(args, torch_python: str | None, threads: int) -> tuple[list[str], str | None]:
    from bnbwd_cli.core import Op, Settings, backward
    from bnbwd_cli.runtime import numba_available

    shapes = {"L2": (8, 32, 14, 14), "L3": (16, 64, 64, 64), "DRAM": (64, 128, 56, 56)}
    dtypes = ["float32", "bfloat16", "float16"]
    reps = 3 if args.quick else 7
    bandwidth = copy_bandwidth(threads)
    rng = np.random.default_rng(0)
    rows, torch_cases = [], []
    for size, base in shapes.items():
        for data_format in ("NCX", "NXC"):
            for dtype_name in dtypes:
                shape = base if data_format == "NCX" else nxc_shape(base)
                dtype = dtype_of(dtype_name)
                src = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
                dy = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
                c = base[1]
                mean, var, gamma = np.zeros(c, np.float32), np.ones(c, np.float32), np.ones(c, np.float32)
                out = np.empty_like(src)
                op = Op(src, dy, mean, var, gamma, epsilon=1e-5, data_format=data_format)
                # partial, not a closure: the loop `del`s src, dy and out to free them before the next
                # shape, and a closure over deleted names is one the linter cannot prove defined.
                core = best_of(partial(backward, op, Settings(diff_src_out=out, threads=threads, core="numpy")), reps)
                fast = None
                if numba_available():
                    fast = best_of(partial(backward, op, Settings(diff_src_out=out, threads=threads, core="numba")), reps)
                naive = best_of(partial(naive_numpy, src, dy, mean, var, gamma, data_format), max(reps // 2, 1))
                bound = 3 * src.nbytes / bandwidth
                rows.append(dict(size=size, format=data_format, dtype=dtype_name, shape=shape, mb=src.nbytes / 1e6,
                                 core=core, fast=fast, naive=naive, bound=bound))
                torch_cases.append(dict(shape=list(base), format=data_format, dtype=dtype_name, reps=reps))
                del src, dy, out
    torch_times, torch_version = run_torch(torch_python, torch_cases, threads)
    lines = [f"copy bandwidth (NumPy, {threads} threads): {bandwidth / 1e9:.1f} GB/s; bound = 3 tensor passes at that rate",
             "",
             "| size | layout | dtype | shape | MB/tensor | bnbwd (NumPy) ms | bnbwd (numba) ms | naive NumPy ms | torch ms "
             "| NumPy/torch | numba/torch | bound ms | bound/NumPy | bound/numba |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, torch_time in zip(rows, torch_times):
        fast = row["fast"]
        ratio = f"{row['core'] / torch_time:.2f}" if torch_time else "–"
        fast_ratio = f"{fast / torch_time:.2f}" if torch_time and fast else "–"
        torch_ms = f"{torch_time * 1e3:.1f}" if torch_time else "–"
        fast_ms = f"{fast * 1e3:.1f}" if fast else "–"
        fast_bound = f"{row['bound'] / fast:.2f}" if fast else "–"
        lines.append(f"| {row['size']} | {row['format']} | {row['dtype']} | {row['shape']} | {row['mb']:.1f} | "
                     f"{row['core'] * 1e3:.1f} | {fast_ms} | {row['naive'] * 1e3:.1f} | {torch_ms} | {ratio} | {fast_ratio} | "
                     f"{row['bound'] * 1e3:.1f} | {row['bound'] / row['core']:.2f} | {fast_bound} |")
    return lines, torch_version


def run_child(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB, the child's own VmHWM) of one Python child (`-m module ...` or `-c script`)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", end_to_end.RSS_WRAPPER, *command[1:]], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-400:]}")
    peaks = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("VmHWM_KB")]
    return seconds, int(peaks[-1]) / 1024 if peaks else float("nan")


def cli_table(args, threads: int) -> list[str]:
    shape = (64, 128, 64, 64) if args.quick else (128, 256, 64, 64)  # 268 MB / 537 MB a tensor
    lines = ["| run | inputs GB | wall s | peak RSS MiB |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        work = Path(work)
        rng = np.random.default_rng(1)
        for name in ("src", "diff_dst"):
            array = np.empty(shape, np.float32)
            for i in range(shape[0]):
                array[i] = rng.standard_normal(shape[1:], dtype=np.float32)
            np.save(work / f"{name}.npy", array)
            del array
        c = shape[1]
        np.save(work / "mean.npy", np.zeros(c, np.float32))
        np.save(work / "variance.npy", np.ones(c, np.float32))
        gigabytes = 2 * np.prod(shape) * 4 / 1e9
        io_script = (f"import numpy as np; a = np.load('{work}/src.npy'); b = np.load('{work}/diff_dst.npy'); "
                     f"np.save('{work}/io_out.npy', a)")
        io_seconds, io_rss = run_child([sys.executable, "-c", io_script])
        lines.append(f"| NumPy alone: np.load both, np.save one | {gigabytes:.2f} | {io_seconds:.2f} | {io_rss:.0f} |")
        base = [sys.executable, "-m", "bnbwd_cli", "run", "--src", str(work / "src.npy"), "--diff-dst", str(work / "diff_dst.npy"),
                "--mean", str(work / "mean.npy"), "--variance", str(work / "variance.npy"), "--epsilon", "1e-5",
                "--format", "NCHW", "-q", "--threads", str(threads)]
        runs = [("bnbwd run --no-stream --out-dir (loaded, NumPy core)", ["--out-dir", str(work / "a"), "--no-stream",
                                                                            "--core", "numpy"]),
                ("bnbwd run --out-dir (default: streams)", ["--out-dir", str(work / "b")])]
        from bnbwd_cli.runtime import numba_available

        if numba_available():
            runs.insert(1, ("bnbwd run --no-stream --core numba --out-dir (loaded)",
                            ["--out-dir", str(work / "c"), "--no-stream", "--core", "numba"]))
        for label, extra in runs:
            (work / extra[1].rsplit("/", 1)[1]).mkdir()
            seconds, rss = run_child(base + extra)
            lines.append(f"| {label} | {gigabytes:.2f} | {seconds:.2f} ({seconds / io_seconds:.2f}x NumPy I/O) | {rss:.0f} |")
    return lines


def verify_table(args) -> list[str]:
    """`bnbwd verify A.npz R.npz` against the same check done by hand: load both, assert_allclose."""
    shape = (8, 64, 112, 112) if args.quick else (32, 64, 112, 112)  # 6.4M / 25.7M elements
    lines = ["| verify two .npz files (diff_src %s f32 + diff_gamma, diff_beta) | wall s | peak RSS MiB |"
             % "x".join(map(str, shape)), "|---|---|---|"]
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        rng = np.random.default_rng(2)
        reference = {"diff_src": rng.standard_normal(shape, dtype=np.float32),
                     "diff_gamma": rng.standard_normal(shape[1], dtype=np.float32),
                     "diff_beta": rng.standard_normal(shape[1], dtype=np.float32)}
        actual = {k: np.nextafter(v, np.float32(np.inf)) for k, v in reference.items()}  # 1 ulp off: passes
        np.savez(f"{work}/a.npz", **actual)
        np.savez(f"{work}/r.npz", **reference)
        del reference, actual
        by_hand = (f"import numpy as np; a = np.load('{work}/a.npz'); r = np.load('{work}/r.npz')\n"
                   "for k in r.files: np.testing.assert_allclose(a[k], r[k], rtol=1e-5, atol=1e-5)")
        base_seconds, base_rss = run_child([sys.executable, "-c", by_hand])
        lines.append(f"| Python: np.load both, np.testing.assert_allclose | {base_seconds:.2f} | {base_rss:.0f} |")
        for label, extra in (("bnbwd verify", []), ("bnbwd verify --json -", ["--json", "-"])):
            seconds, rss = run_child([sys.executable, "-m", "bnbwd_cli", "verify", f"{work}/a.npz", f"{work}/r.npz", *extra])
            lines.append(f"| {label} | {seconds:.2f} ({seconds / base_seconds:.2f}x by hand) | {rss:.0f} |")
    return lines


def accuracy_table(args, torch_python: str | None, threads: int) -> list[str]:
    from bnbwd_cli.core import Op, Settings, backward
    from bnbwd_cli.runtime import numba_available

    cores = ["numpy", "numba"] if numba_available() else ["numpy"]
    m_target = 2_000_000 if args.quick else 10_000_000
    base = (m_target // 10_000, 4, 100, 100)  # M = N·H·W
    lines = ["| inputs | layout | dtype | M | bnbwd core | bnbwd diff_src | torch diff_src | bnbwd diff_gamma | torch diff_gamma | bnbwd diff_beta | torch diff_beta |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(2)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        work = Path(work)
        for kind, offset in (("ordinary", 0.0), ("mean offset 1e4 sd", 1e4)):
            for data_format in ("NCX", "NXC"):
                for dtype_name in ("float32", "bfloat16"):
                    if offset and dtype_name == "bfloat16":
                        continue  # bf16 cannot hold src = 1e4 sd + noise: the input itself is the noise
                    shape = base if data_format == "NCX" else nxc_shape(base)
                    dtype = dtype_of(dtype_name)
                    src = (offset + rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
                    dy = (0.1 + rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
                    axes = tuple(i for i in range(src.ndim) if i != (1 if data_format == "NCX" else src.ndim - 1))
                    src64 = src.astype(np.float64)
                    mean = src64.mean(axis=axes).astype(np.float32)
                    variance = src64.var(axis=axes).astype(np.float32)
                    del src64
                    invstd = (1 / np.sqrt(variance.astype(np.float64) + 1e-5)).astype(np.float32)
                    gamma = rng.uniform(0.5, 1.5, base[1]).astype(np.float32)
                    reference = reference_backward(Op(src, dy, mean, invstd, gamma, epsilon=1e-5, data_format=data_format,
                                                   variance_is_invstd=True))
                    expected = [reference[k] for k in ("diff_src", "diff_gamma", "diff_beta")]
                    errors = {}
                    for core in cores:
                        op = Op(src, dy, mean, invstd, gamma, epsilon=1e-5, data_format=data_format,
                                variance_is_invstd=True)
                        ours = backward(op, Settings(threads=threads, core=core))
                        errors[core] = [normalised_error(getattr(ours, k), e)
                                        for k, e in zip(("diff_src", "diff_gamma", "diff_beta"), expected)]
                        del ours
                    theirs = [None] * 3
                    if torch_python:
                        paths = {}
                        for name, array in dict(src=src, diff_dst=dy, mean=mean, invstd=invstd, gamma=gamma).items():
                            paths[name] = str(work / f"{name}.npy")
                            np.save(paths[name], array)
                        out = str(work / "torch_out.npy")
                        results, _ = run_torch(torch_python, [dict(paths, format=data_format, dtype=dtype_name, out=out)], threads)
                        if results != [None] or Path(out).exists():
                            theirs = [normalised_error(np.load(p), e) for p, e in zip((out, out + ".gamma.npy", out + ".beta.npy"), expected)]
                    for core in cores:
                        cells = []
                        for mine, other in zip(errors[core], theirs):
                            cells += [f"{mine:.1e}", f"{other:.1e}" if other is not None else "–"]
                        lines.append(f"| {kind} | {data_format} | {dtype_name} | {src.size // base[1]:.1e} | {core} | "
                                     + " | ".join(cells) + " |")
                    del src, dy, expected
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller CLI and accuracy runs")
    parser.add_argument("--torch-python", help="a Python interpreter with torch (default: this one, or $BNBWD_BENCH_TORCH_PYTHON)")
    parser.add_argument("--threads", type=int, help="threads for bnbwd, torch and the copy (default: usable cores)")
    parser.add_argument("--workdir", default=None, help="where the CLI run's ~1 GB of .npy files go (default: $TMPDIR)")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--torch-worker", help=argparse.SUPPRESS)
    parser.add_argument("--skip", default="", help="comma list of tables to skip: e2e,speed,cli,verify,accuracy")
    args = parser.parse_args()
    if args.torch_worker:
        torch_worker(args.torch_worker)
        return
    from bnbwd_cli.runtime import default_block_bytes, usable_cores

    threads = args.threads or usable_cores()
    torch_python = find_torch_python(args.torch_python)
    skip = set(args.skip.split(","))
    load = os.getloadavg()
    out = [f"# bnbwd bench ({'quick' if args.quick else 'full'})", "",
           f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {threads} threads used; "
           f"Python {platform.python_version()}, NumPy {np.__version__}; block budget {default_block_bytes(threads) >> 20} MiB; "
           f"load average at start {load[0]:.2f}", ""]
    print("\n".join(out), flush=True)
    sections = []
    if "e2e" not in skip:
        lines = end_to_end.end_to_end_table(torch_python, threads, args.quick, args.workdir)
        sections += ["## End to end (whole processes, page cache warm)", "", *lines, ""]
        print("\n".join(lines), flush=True)
    if "speed" not in skip:
        lines, torch_version = speed_table(args, torch_python, threads)
        sections += ["## Speed (best of several runs)", f"torch: {torch_version or 'not available'}", "", *lines, ""]
        print("\n".join(sections[-len(lines) - 4 :]), flush=True)
    if "cli" not in skip:
        lines = cli_table(args, threads)
        sections += ["## bnbwd run through the CLI (.npy files, page cache warm)", "", *lines, ""]
        print("\n".join(lines), flush=True)
    if "verify" not in skip:
        lines = verify_table(args)
        sections += ["## bnbwd verify through the CLI (.npz files, page cache warm)", "", *lines, ""]
        print("\n".join(lines), flush=True)
    if "accuracy" not in skip:
        lines = accuracy_table(args, torch_python, threads)
        sections += ["## Accuracy: normalised max error vs a float64 oracle", "", *lines, ""]
        print("\n".join(lines), flush=True)
    sections.append(f"bench process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(out + sections) + "\n")


if __name__ == "__main__":
    main()
