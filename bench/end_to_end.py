"""End-to-end rows of the bench: whole processes, as a CI script or a user sees them.

Each row is a ratio of two things measured in the same run, interleaved (A, B, A, B, ...) and
best-of-N, so that a machine shared with other work moves both sides alike:

- start-up: `bnbwd run fixtures/example.npz -q` (a (4,8,6,6) problem: nothing but start-up) against
  `python -c "import numpy"`, the floor any NumPy tool pays;
- `bnbwd run` to `--out-dir` on f32 (32,128,56,56) .npy inputs, net of that floor, against a PyTorch
  script doing the same job (np.load the inputs, native_batch_norm_backward, np.save the three
  outputs), timed inside its own process after `import torch`; both layouts;
- `run --reference`: the same run judging a kernel's outputs (bnbwd's own, so it passes) against
  the plain run, both net of the floor;
- where the time goes: the same job through bnbwd's layers (the CLI's imports, files.read, core.backward,
  files.write) timed by phase in fresh processes, interleaved with the PyTorch script's load, compute, save.

Children run with bytecode caching on (PYTHONDONTWRITEBYTECODE removed), as for an installed
package, and with `python -m bnbwd_cli` (what the `bnbwd` script runs, plus runpy's ~1 ms).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BNBWD = [sys.executable, "-m", "bnbwd_cli"]
FLOOR = [sys.executable, "-c", "import numpy"]
SHAPE = (32, 128, 56, 56)  # 51 MB a tensor in f32

# PyTorch's batch-norm backward on src, dy, mean, variance, gamma (torch tensors, the layout in data_format),
# giving diff_src, diff_gamma, diff_beta: the compute step of every PyTorch job the benches time.
TORCH_BACKWARD = """
if data_format == "NHWC":
    src, dy = src.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)  # channels_last strides: torch's NHWC kernel
invstd = torch.rsqrt(variance + 1e-5)
diff_src, diff_gamma, diff_beta = torch.ops.aten.native_batch_norm_backward(
    dy, src, gamma, None, None, mean, invstd, True, 1e-5, [True, True, True])
if data_format == "NHWC":
    diff_src = diff_src.permute(0, 2, 3, 1)
"""

# Runs a child (`-m module args` or `-c code args`) and reports its peak RSS (VmHWM) on stderr at exit.
# The peak is the child's own: getrusage/wait4's ru_maxrss would also count the parent's pages that
# the child inherited before its exec.
RSS_WRAPPER = """
import atexit, runpy, sys
def report():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            sys.stderr.write('VmHWM_KB ' + line.split()[1] + '\\n')
atexit.register(report)
mode, target, *rest = sys.argv[1:]
sys.argv = [target, *rest]
if mode == '-m':
    runpy.run_module(target, run_name='__main__', alter_sys=True)
else:
    exec(compile(target, '<script>', 'exec'), {'__name__': '__main__'})
"""

# Load, compute, save: the job `bnbwd run --out-dir` does, in PyTorch; prints its own seconds (after import torch).
TORCH_SCRIPT = """
import sys, time
import numpy as np
import torch
work, data_format, threads, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
started = time.perf_counter()
src, dy = (torch.from_numpy(np.load(f"{work}/{name}.npy")) for name in ("src", "diff_dst"))
mean, variance, gamma = (torch.from_numpy(np.load(f"{work}/{name}.npy")) for name in ("mean", "variance", "gamma"))
loaded = time.perf_counter()
""" + TORCH_BACKWARD + """
computed = time.perf_counter()
for name, tensor in (("diff_src", diff_src), ("diff_gamma", diff_gamma), ("diff_beta", diff_beta)):
    np.save(f"{out}/{name}.npy", tensor.numpy())
done = time.perf_counter()
print(loaded - started, computed - loaded, done - computed, done - started)  # load, compute, save, total
"""

# The same job through bnbwd's own layers in one fresh process, timed by phase (what `run --out-dir -q` calls:
# the CLI's imports, files.read, core.backward, files.write); prints imports, read, core, write seconds.
PHASES_SCRIPT = """
import sys, time
from pathlib import Path
import numpy  # the floor: imports are counted net of it, as the run rows are
started = time.perf_counter()
import bnbwd_cli.cli  # everything `python -m bnbwd_cli run` imports before it reads a file
from bnbwd_cli import core
from bnbwd_cli.files import write
from bnbwd_cli.files.read import read_array
imported = time.perf_counter()
work, data_format, threads, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
inputs = {name: read_array(f"{work}/{name}.npy", name) for name in ("src", "diff_dst", "mean", "variance", "gamma")}
read = time.perf_counter()
op = core.Op(*inputs.values(), epsilon=1e-5, data_format="NCX" if data_format == "NCHW" else "NXC")
result = core.backward(op, core.Settings(threads=threads))
computed = time.perf_counter()
write.write_npy_dir(out, {name: getattr(result, name) for name in ("diff_src", "diff_gamma", "diff_beta")})
print(imported - started, read - imported, computed - read, time.perf_counter() - computed)
"""


@dataclass(frozen=True)
class Timing:
    """Best wall seconds, and best CPU seconds (user + system), of each command, measured interleaved."""

    best: dict[str, float]
    best_cpu: dict[str, float]

    def net(self, name: str) -> float:
        return self.best[name] - self.best["floor"]


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode compiled
    env.pop("BNBWD_CORE", None)
    return env


def wall(command: list[str], fresh_dir: Path | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one child process; `fresh_dir` is emptied first (outputs go there).

    CPU time (the child's user + system) moves less than wall time when other work shares the cores.
    """
    if fresh_dir is not None:
        shutil.rmtree(fresh_dir, ignore_errors=True)
        fresh_dir.mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-400:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def interleaved(commands: dict[str, tuple[list[str], Path | None]], reps: int) -> Timing:
    """Best of `reps` for each command, run in turn; one warm-up round (bytecode, page cache) first."""
    best = {name: float("inf") for name in commands}
    best_cpu = dict(best)
    for round_ in range(reps + 1):
        for name, (command, fresh_dir) in commands.items():
            seconds, cpu = wall(command, fresh_dir)
            if round_:
                best[name], best_cpu[name] = min(best[name], seconds), min(best_cpu[name], cpu)
    return Timing(best, best_cpu)


def startup_rows(reps: int) -> list[str]:
    timing = interleaved({"floor": (FLOOR, None), "bnbwd": (BNBWD + ["run", "fixtures/example.npz", "-q"], None)}, reps)
    return [f"| start-up: `bnbwd run fixtures/example.npz -q` vs `python -c \"import numpy\"` | {reps} | "
            f"{timing.best['bnbwd'] * 1e3:.0f} ms | {timing.best['floor'] * 1e3:.0f} ms | "
            f"+{timing.net('bnbwd') * 1e3:.0f} ms ({timing.best['bnbwd'] / timing.best['floor']:.2f}x); CPU time "
            f"+{(timing.best_cpu['bnbwd'] - timing.best_cpu['floor']) * 1e3:.0f} ms |"]


def write_inputs(work: Path, data_format: str) -> None:
    rng = np.random.default_rng(3)
    shape = SHAPE if data_format == "NCHW" else (SHAPE[0], *SHAPE[2:], SHAPE[1])
    for name in ("src", "diff_dst"):
        np.save(work / f"{name}.npy", rng.standard_normal(shape, dtype=np.float32))
    c = SHAPE[1]
    np.save(work / "mean.npy", rng.standard_normal(c).astype(np.float32) * 0.1)
    np.save(work / "variance.npy", rng.uniform(0.5, 1.5, c).astype(np.float32))
    np.save(work / "gamma.npy", rng.uniform(0.5, 1.5, c).astype(np.float32))


def run_command(work: Path, data_format: str, threads: int, extra: list[str]) -> list[str]:
    inputs = [arg for name in ("src", "diff_dst", "mean", "variance", "gamma")
              for arg in (f"--{name.replace('_', '-')}", str(work / f"{name}.npy"))]
    return BNBWD + ["run", *inputs, "--epsilon", "1e-5", "--format", data_format, "-q", "--threads", str(threads), *extra]


def phase_seconds(commands: dict[str, list[str]], out: Path, reps: int) -> dict[str, list[float]]:
    """Best of `reps` fresh processes of each command, run in turn (A, B, A, B, ...) after a warm-up round; each
    prints its own four phase times in seconds on one line, and each phase keeps its own best."""
    best = {name: [float("inf")] * 4 for name in commands}
    for round_ in range(reps + 1):
        for name, command in commands.items():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            done = subprocess.run([*command, str(out)], env=child_env(), cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{name} script failed: {done.stderr[-400:]}")
            if round_:
                best[name] = [min(a, float(b)) for a, b in zip(best[name], done.stdout.split()[-4:])]
    return best


def phases(torch_python: str | None, work: Path, data_format: str, threads: int, reps: int) -> dict[str, list[float]]:
    """bnbwd's imports, read, core, write and (with torch) PyTorch's load, compute, save, total: seconds."""
    args = [str(work), data_format, str(threads)]
    commands = {"bnbwd": [sys.executable, "-c", PHASES_SCRIPT, *args]}
    if torch_python:
        commands["torch"] = [torch_python, "-c", TORCH_SCRIPT, *args]
    return phase_seconds(commands, work / "phases_out", reps)


def phases_row(best: dict[str, list[float]], data_format: str, reps: int) -> str:
    ours, theirs = best["bnbwd"], best.get("torch")
    theirs_text = " / ".join(f"{t * 1e3:.0f}" for t in theirs[:3]) if theirs else "–"
    ratio = f"core/compute **{ours[2] / theirs[1]:.2f}x**" if theirs else "–"
    return (f"| where the time goes, {data_format}: bnbwd imports / read / core / write (ms) vs PyTorch load / "
            f"compute / save | {reps} | {' / '.join(f'{t * 1e3:.0f}' for t in ours)} | {theirs_text} | {ratio} |")


def run_rows(torch_python: str | None, threads: int, reps: int, workdir: str | None) -> list[str]:
    """`bnbwd run --out-dir` vs the PyTorch script, and `run --reference` vs the plain run, per layout."""
    rows = []
    for data_format in ("NCHW", "NHWC"):
        with tempfile.TemporaryDirectory(dir=workdir) as work:
            work = Path(work)
            write_inputs(work, data_format)
            out = work / "bnbwd_out"
            commands = {"floor": (FLOOR, None),
                        "run": (run_command(work, data_format, threads, ["--out-dir", str(out)]), out)}
            timing = interleaved(commands, reps)  # leaves bnbwd_out/ holding the last run's outputs
            checked = interleaved({"floor": (FLOOR, None), "plain": (run_command(work, data_format, threads, []), None),
                                   "reference": (run_command(work, data_format, threads, ["--reference", str(out)]), None)},
                                  min(reps, 2))  # ~10 s a --reference run at this size: 2 rounds
            net = timing.net("run")
            best = phases(torch_python, work, data_format, threads, reps)
            if "torch" in best:
                theirs = best["torch"][3]
                versus = f"{theirs * 1e3:.0f} ms | **{net / theirs:.2f}x**"
            else:
                versus = "– (torch not installed: row skipped) | –"
            rows.append(f"| `bnbwd run --out-dir`, f32 {data_format} {SHAPE}, net of the floor, vs PyTorch | {reps} | "
                        f"{net * 1e3:.0f} ms "
                        f"(wall {timing.best['run'] * 1e3:.0f}, floor {timing.best['floor'] * 1e3:.0f}) | {versus} |")
            rows.append(f"| `run --reference` (judging the outputs) vs `run` (no output), {data_format}, net | "
                        f"{min(reps, 2)} | "
                        f"{checked.net('reference') * 1e3:.0f} ms | {checked.net('plain') * 1e3:.0f} ms | "
                        f"**{checked.net('reference') / checked.net('plain'):.2f}x** |")
            rows.append(phases_row(best, data_format, reps))
    return rows


def end_to_end_table(torch_python: str | None, threads: int, quick: bool, workdir: str | None) -> list[str]:
    """The table's lines: start-up, then run vs PyTorch and run --reference, both layouts."""
    reps = 5 if quick else 15
    lines = ["| what (interleaved with its baseline) | best of | bnbwd | baseline | ratio |", "|---|---|---|---|---|"]
    lines += startup_rows(reps * 2)
    lines += run_rows(torch_python, threads, max(reps // 3, 3), workdir)
    return lines


if __name__ == "__main__":  # python -m bench.end_to_end [--quick]: this table alone
    from bnbwd_cli.runtime import usable_cores

    python = sys.executable if subprocess.run([sys.executable, "-c", "import torch"]).returncode == 0 else None
    print("\n".join(end_to_end_table(python, usable_cores(), "--quick" in sys.argv, None)))
