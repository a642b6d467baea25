"""A failing kernel's `run --reference`: what the whole run costs with its diagnosis, CPU time beside wall.

    python -m bench.diagnosis_cost [--rounds 5] [--threads 2] [--bugs lost-block,epsilon,...] [--base TREE]

f32 (32,128,56,56), both layouts, .npy inputs (bench/end_to_end.py's). Each bug is one of tools/zoo.py's hooks
planted in its float32 kernel (or a pattern written into bnbwd's own outputs: every 32nd element off), saved as
the kernel's outputs; each round runs fresh processes back to back: the floor (`import numpy`), a plain `run`,
and `run --reference` on each failing kernel. Prints per bug the median (min-max) CPU seconds (user + system,
all threads: steadier than wall on a shared machine) and wall seconds of the whole failing run, what it adds to
a plain run, and the cause the diagnosis named (from --json). ``--base TREE`` (e.g. `git archive BASE bnbwd_cli |
tar -x -C /tmp/base`): each round also runs every failing kernel with TREE's bnbwd_cli, back to back with this
tree's, and a row per bug gives its numbers and the paired CPU ratio this/base. A second table (unless
--no-phases) splits each failing run's CPU by phase (startup and imports, reading and the core, the channel facts,
the judging pass, where and the heat map, the diagnosis, the DAZ scan, the report, the rest): one more fresh
process per bug and round, timed by bench/failing_phases.py without a profiler.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import end_to_end
from bench.targets import run_child, spread

# name -> the zoo kernel's hooks (None: bnbwd's own outputs with every 32nd element of diff_src 1% off)
BUGS = {
    "lost-block": {"block": 256, "lost": {3: 5, 70: 2}},
    "missing-tail": {"skip_tail": 37},
    "epsilon": {"epsilon": 1e-3},
    "gamma-next": {"gamma": "next"},
    "mean-dy": {"no_mean_dy": (1, 2, 3)},
    "every-32nd": None,
}


def write_kernels(work: Path, data_format: str, names: list[str], reference: Path) -> dict[str, Path]:
    """Each bug's outputs as .npy files in work/<bug>/ (the inputs: end_to_end.write_inputs's)."""
    from tools import zoo

    problem = {name: np.load(work / f"{name}.npy") for name in ("src", "diff_dst", "mean", "variance", "gamma")}
    problem.update(epsilon=1e-5, data_format="NCX" if data_format == "NCHW" else "NXC")
    out = {}
    for name in names:
        hooks = BUGS[name]
        if hooks is None:
            outputs = {key: np.load(reference / f"{key}.npy") for key in ("diff_src", "diff_gamma", "diff_beta")}
            flat = outputs["diff_src"].reshape(-1)
            flat[31::32] *= np.float32(1.01)
        else:
            outputs = zoo.kernel(problem, hooks=hooks)
        folder = work / name
        folder.mkdir()
        for key, array in outputs.items():
            np.save(folder / f"{key}.npy", array)
        out[name] = folder
    return out


def _in_tree(command: list[str], tree: str) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one child running ``tree``'s bnbwd_cli."""
    env = {**end_to_end.child_env(), "PYTHONPATH": tree}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *command], env=env, cwd=tree, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{tree}: {done.stderr[-400:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# The phase table's columns: bench/failing_phases.py's phases, grouped by who owns the work
PHASE_COLUMNS = {
    "startup, imports": ("startup", "imports"),
    "read, core": ("read inputs", "reading files", "core", "read kernel"),
    "channel facts": ("channel facts",),
    "judging pass": ("judging", "regression sums"),
    "where, heat map": ("where, heat map",),
    "diagnosis": ("diagnosis", "precision hints"),
    "DAZ scan": ("DAZ scan",),
    "report (text, JSON)": ("text report", "JSON", "--save-error"),
    "other": ("other",),
}
PHASE_HEADER = ["| layout | failing kernel | whole run CPU s (phases' process) | "
                + " | ".join(f"{column} s" for column in PHASE_COLUMNS) + " |",
                "|---|---|---|" + "---|" * len(PHASE_COLUMNS)]


def _phases(command: list[str], into: Path) -> dict[str, float]:
    """One fresh process of ``command`` (``-m bnbwd_cli run ...``) timed by bench/failing_phases.py: CPU s by column."""
    run_child(["-m", "bench.failing_phases", str(into), *command[2:]])
    phases = json.loads(into.read_text())
    return {"whole": phases["total"], **{column: sum(phases[name] for name in names)
                                         for column, names in PHASE_COLUMNS.items()}}


def phase_rows(data_format: str, seen: dict[str, list[dict[str, float]]]) -> list[str]:
    """Per bug the median of each column over the rounds."""
    out = []
    for name, runs in seen.items():
        cells = [spread([run[column] for run in runs], ".2f") for column in ("whole", *PHASE_COLUMNS)]
        out.append(f"| {data_format} | {name} | {' | '.join(cells)} |")
    return out


def rows(work: Path, data_format: str, threads: int, rounds: int, names: list[str], base: str | None = None,
         phases: dict[str, list[dict[str, float]]] | None = None) -> list[str]:
    """The whole-run table's rows; with ``phases`` (a dict), each round also runs every failing kernel once timed by
    phase (bench/failing_phases.py), its columns added to ``phases`` by bug."""
    end_to_end.write_inputs(work, data_format)
    reference = work / "reference"
    run_child(end_to_end.run_command(work, data_format, threads, ["--out-dir", str(reference)])[1:], reference)
    kernels = write_kernels(work, data_format, names, reference)
    floor = ["-c", "import numpy"]
    plain = end_to_end.run_command(work, data_format, threads, [])[1:]
    report = work / "report.json"
    judged = {name: end_to_end.run_command(work, data_format, threads, ["--reference", str(folder), "--json",
                                                                          str(report)])[1:]
              for name, folder in kernels.items()}
    seen: dict[str, dict[str, list[float]]] = {}
    causes: dict[str, str] = {}
    for round_ in range(rounds + 1):  # round 0 warms the page cache and bytecode
        for name, command in [("floor", floor), ("plain", plain), *judged.items()]:
            wall, _, _, cpu = run_child(command)
            if round_:
                seen.setdefault(name, {"wall": [], "cpu": []})
                seen[name]["wall"].append(wall)
                seen[name]["cpu"].append(cpu)
            if name in judged and name not in causes:
                causes[name] = _causes(report)
            if phases is not None and name in judged and round_:
                phases.setdefault(name, []).append(_phases(command, work / "phases.json"))
            if base is not None and name in judged:
                wall, cpu = _in_tree(command, base)
                if round_:
                    seen.setdefault(f"base {name}", {"wall": [], "cpu": []})
                    seen[f"base {name}"]["wall"].append(wall)
                    seen[f"base {name}"]["cpu"].append(cpu)
    out = []
    for name in judged:
        cpu, wall = seen[name]["cpu"], seen[name]["wall"]
        added = [j - p for j, p in zip(cpu, seen["plain"]["cpu"])]
        out.append(f"| {data_format} | {name} | **{spread(cpu, '.2f')}** | {spread(wall, '.2f')} | "
                   f"{spread(added, '.2f')} | {causes[name]} |")
        if base is not None:
            before = seen[f"base {name}"]
            ratio = [a / b for a, b in zip(cpu, before["cpu"])]
            out.append(f"| {data_format} | {name}, base tree | {spread(before['cpu'], '.2f')} | "
                       f"{spread(before['wall'], '.2f')} | this/base CPU **{spread(ratio, '.2f')}** | |")
    out.append(f"| {data_format} | (plain `run`; floor) | {spread(seen['plain']['cpu'], '.2f')}; "
               f"{spread(seen['floor']['cpu'], '.2f')} | {spread(seen['plain']['wall'], '.2f')}; "
               f"{spread(seen['floor']['wall'], '.2f')} | | |")
    return out


def _causes(report: Path) -> str:
    """The causes the diagnosis named (every hint's "cause" in the run's --json), in order of appearance."""
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if "cause" in node and "evidence" in node and node["cause"] not in found:
                found.append(node["cause"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(report.read_text()))
    return ", ".join(found) or "-"


HEADER = ["| layout | failing kernel | `run --reference` CPU s | wall s | CPU added to a plain `run` s | cause named |",
          "|---|---|---|---|---|---|"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bugs", default=",".join(BUGS), help=f"comma list of {', '.join(BUGS)}")
    parser.add_argument("--layouts", default="NCHW,NHWC")
    parser.add_argument("--base", help="another tree holding bnbwd_cli, run back to back with this one")
    parser.add_argument("--no-phases", action="store_true", help="skip the table of each failing run's CPU by phase")
    args = parser.parse_args()
    names = args.bugs.split(",")
    unknown = set(names) - set(BUGS)
    if unknown:
        parser.error(f"unknown bugs {sorted(unknown)}")
    print(f"# A failing kernel's run --reference, f32 (32,128,56,56), {args.rounds} rounds, {args.threads} threads; "
          f"medians (min-max); load average {' / '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print("\n".join(HEADER), flush=True)
    phases: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as root:
        for layout in args.layouts.split(","):
            work = Path(root) / layout
            work.mkdir()
            phases[layout] = {} if not args.no_phases else None
            print("\n".join(rows(work, layout, args.threads, args.rounds, names, args.base, phases[layout])), flush=True)
    if not args.no_phases:
        print("\nThe same failing runs by phase (bench/failing_phases.py: CPU s, medians (min-max); startup is the "
              "interpreter's own):\n")
        print("\n".join(PHASE_HEADER))
        for layout, seen in phases.items():
            print("\n".join(phase_rows(layout, seen)), flush=True)
    print(f"\nload average at the end {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")



if __name__ == "__main__":
    main()
