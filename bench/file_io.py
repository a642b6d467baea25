"""Reading and writing tensors: bnbwd's files layer against NumPy's own np.load / np.save / np.savez.

    python -m bench.file_io [--pairs N] [--baseline DIR]

In one process, interleaved (bnbwd, NumPy, bnbwd, NumPy, ...), f32 (32,128,56,56) (51 MB a tensor), page cache
warm: each row is the median of N pairs (default 11) of each side, the median of the paired ratios and their
spread (min-max). Rows: reading a .npy, a stored .npz and a deflated .npz (src and diff_dst, 103 MB, plus three
small arrays, as `bnbwd run x.npz` reads them), writing the three outputs of a run as .npy files and as an .npz.
With --baseline DIR (a checkout of an earlier commit, e.g. `git archive BASE | tar -x -C DIR`), the whole
`bnbwd run x.npz -o out.npz -q` (a subprocess) of that checkout against this one, interleaved the same way.
The load average is printed first and last: the machine is shared.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (32, 128, 56, 56)


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    c = SHAPE[1]
    return {"src": rng.standard_normal(SHAPE, dtype=np.float32), "diff_dst": rng.standard_normal(SHAPE, dtype=np.float32),
            "mean": (rng.standard_normal(c) * 0.1).astype(np.float32), "variance": rng.uniform(0.5, 1.5, c).astype(np.float32),
            "gamma": rng.uniform(0.5, 1.5, c).astype(np.float32)}


def outputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(6)
    return {"diff_src": rng.standard_normal(SHAPE, dtype=np.float32),
            "diff_gamma": rng.standard_normal(SHAPE[1]).astype(np.float32),
            "diff_beta": rng.standard_normal(SHAPE[1]).astype(np.float32)}


def seconds(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def paired(ours: Callable[[], object], theirs: Callable[[], object], pairs: int) -> tuple[list[float], list[float]]:
    """Seconds of each side, run in turn after one warm-up of each."""
    ours(), theirs()
    mine, other = [], []
    for _ in range(pairs):
        mine.append(seconds(ours))
        other.append(seconds(theirs))
    return mine, other


def row(what: str, baseline: str, times: tuple[list[float], list[float]]) -> str:
    mine, other = times
    ratios = [a / b for a, b in zip(mine, other)]
    return (f"| {what} | {len(mine)} | {statistics.median(mine) * 1e3:.1f} ({min(mine) * 1e3:.1f}-{max(mine) * 1e3:.1f}) | "
            f"{baseline} {statistics.median(other) * 1e3:.1f} ({min(other) * 1e3:.1f}-{max(other) * 1e3:.1f}) | "
            f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) |")


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def in_process_rows(work: Path, pairs: int) -> list[str]:
    from bnbwd_cli.files.read import read_array, read_bundle
    from bnbwd_cli.files.write import write_npy_dir, write_npz

    arrays, results = inputs(), outputs()
    np.save(work / "src.npy", arrays["src"])
    np.savez(work / "stored.npz", **arrays)
    np.savez_compressed(work / "deflated.npz", **arrays)
    (work / "ours").mkdir()
    (work / "numpy").mkdir()

    def numpy_npz(path: Path) -> Callable[[], object]:
        def load() -> dict:
            with np.load(path) as archive:
                return {key: archive[key] for key in archive.files}
        return load

    def numpy_save() -> None:
        for key, array in results.items():
            np.save(work / "numpy" / f"{key}.npy", array)

    rows = [row("read .npy (src, 51 MB): `read_array` vs `np.load`", "np.load",
                paired(lambda: read_array(str(work / "src.npy"), "src"), lambda: np.load(work / "src.npy"), pairs))]
    for name, kind in (("stored.npz", "stored"), ("deflated.npz", "deflated")):
        rows.append(row(f"read {kind} .npz (5 arrays, 103 MB): `read_bundle` vs `np.load` of every key", "np.load",
                        paired(lambda name=name: read_bundle(str(work / name)), numpy_npz(work / name), pairs)))
    rows.append(row("write 3 outputs as .npy (51 MB): `write_npy_dir` vs `np.save` each", "np.save",
                    paired(lambda: write_npy_dir(work / "ours", results), numpy_save, pairs)))
    rows.append(row("write 3 outputs as .npz (51 MB): `write_npz` vs `np.savez`", "np.savez",
                    paired(lambda: write_npz(work / "ours.npz", results), lambda: np.savez(work / "numpy.npz", **results),
                           pairs)))
    return rows


def run_row(work: Path, baseline: Path, pairs: int) -> str:
    """The whole `bnbwd run stored.npz -o out.npz -q`, this checkout against the baseline's, interleaved."""
    def command(checkout: Path) -> Callable[[], object]:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        argv = [sys.executable, "-m", "bnbwd_cli", "run", str(work / "stored.npz"), "-o", str(work / "out.npz"), "-q",
                "--format", "NCHW", "--epsilon", "1e-5"]
        return lambda: subprocess.run(argv, env=env, cwd=work, check=True)

    return row("whole `bnbwd run stored.npz -o out.npz -q` (subprocess): this checkout vs the baseline", "baseline",
               paired(command(ROOT), command(baseline), pairs))


def main() -> None:
    pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 11
    baseline = Path(sys.argv[sys.argv.index("--baseline") + 1]).resolve() if "--baseline" in sys.argv else None
    print(f"load average at the start: {load_average()}")
    print("| what (interleaved pairs) | pairs | bnbwd median ms (min-max) | baseline median ms (min-max) | "
          "ratio, median of pairs (min-max) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for line in in_process_rows(Path(work), pairs):
            print(line, flush=True)
        if baseline is not None:
            print(run_row(Path(work), baseline, pairs), flush=True)
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
