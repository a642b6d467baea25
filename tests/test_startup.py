"""Start-up: the plain `bnbwd run` path imports only what it needs.

CI scripts call bnbwd hundreds of times; every module a command loads without using it costs
every call. Each case runs the command in a fresh interpreter and lists sys.modules at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "fixtures" / "example.npz"

# Imported by no `run` without --reference, quiet or not. Why each one stays out:
NEVER_ON_PLAIN_RUN = {
    "numba": "the optional compiled core (~0.5 s): only when chosen (--core numba, or auto from 100M elements in memory)",
    "llvmlite": "numba's backend, same reason",
    "bnbwd_cli.core.numba_core": "loads numba",
    "bnbwd_cli.judge.sets": "the comparison: only run --reference and verify",
    "bnbwd_cli.judge.compare": "comparison statistics: only run --reference and verify",
    "bnbwd_cli.judge.detail_stats": "a failing output's details: only run --reference and verify",
    "bnbwd_cli.judge.numba_pass": "the compiled judging: only a judged run, and only with numba",
    "bnbwd_cli.judge.model": "the error model: only run --reference and verify --inputs",
    "bnbwd_cli.judge.bias": "systematic-deviation check: only with the error model",
    "bnbwd_cli.judge.hints": "explanations of failures: only with the error model",
    # judge.keys is allowed: a bundle given to run may hold outputs too, and its name tables sort them out.
    "bnbwd_cli.render.json": "the comparison's JSON report",
    "bnbwd_cli.cli.verify": "verify's command: loaded when looked up (cli/main.COMMANDS), or by run --reference",
    "bnbwd_cli.cli.check": "check's command, same reason",
    "bnbwd_cli.cli.show": "the comparison's report: only run --reference and verify",
    "bnbwd_cli.app.judge": "judging a kernel's outputs: only run --reference, verify, check and the API",
    "bnbwd_cli.app.check": "check's suites",
    "bnbwd_cli.cli.cases": "cases' command, same reason",
    "bnbwd_cli.app.cases": "the test-suite generator: only `bnbwd cases`",
    "bnbwd_cli.app.case_values": "its values, same reason",
    "bnbwd_cli.files.suite": "the suite's fixed-byte archives, same reason",
    "hashlib": "only `bnbwd cases` hashes (its streams' keys, the manifest's sha256)",
    "tempfile": "only --stream to a single .npz stages through it",
    "concurrent.futures": "the NumPy core's thread pool: only for working sets it spreads (the example runs inline)",
    "logging": "loaded by concurrent.futures, same reason",
    "secrets": "temporary names come from os.urandom",
    "torch": "the bench's comparison, never bnbwd's",
    "ml_dtypes": "bfloat16 (~10 ms): only when a bf16 array appears; the example is f32",
}
# Also kept out of `run -q`, which renders nothing.
NEVER_ON_QUIET_RUN = {
    **NEVER_ON_PLAIN_RUN,
    "rich": "tables and progress bars (~40 ms): only when something is rendered",
    "bnbwd_cli.render.text": "the console and report rendering: loads rich",
    "json": "only --json writes JSON",
}

# Also kept out of a run whose inputs and outputs are .npy files (the shape of the end-to-end bench's run).
NEVER_ON_NPY_RUN = {
    **NEVER_ON_QUIET_RUN,
    "zipfile": ".npz archives only (files/npz.py imports it with the first archive); brings bz2, lzma, shutil",
    "lzma": "a decompressor for .npz members, via zipfile",
    "bz2": "a decompressor for .npz members, via zipfile",
}

# Runs bnbwd as `python -m bnbwd_cli` does, then lists sys.modules from an atexit function (the script ends the
# process once those have run: bnbwd_cli/__main__.py); imports nothing a command might not (no json: whether
# `run -q` loads json is one of the checks). Also the BLAS pool's size the run had.
PROBE = """
import atexit, os, runpy, sys
def report():
    sys.__stderr__.write("".join("MODULE %s\\n" % name for name in sorted(sys.modules)))
    sys.__stderr__.write("OPENBLAS_NUM_THREADS %s\\n" % os.environ.get("OPENBLAS_NUM_THREADS"))
atexit.register(report)
sys.argv = ["bnbwd", *sys.argv[1:]]
runpy.run_module("bnbwd_cli", run_name="__main__", alter_sys=True)
"""


def probe(args: list[str], env_extra: dict[str, str] | None = None) -> list[str]:
    """The probe's report lines after `bnbwd ARGS` in a fresh interpreter (which must exit 0)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    env.pop("BNBWD_CORE", None)
    if env_extra is None:
        env.pop("OPENBLAS_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def imported_after(args: list[str]) -> set[str]:
    """sys.modules at the end of `bnbwd ARGS` in a fresh interpreter (which must exit 0)."""
    return {line.removeprefix("MODULE ") for line in probe(args) if line.startswith("MODULE ")}


def preloaded() -> set[str]:
    """sys.modules of an interpreter that has imported NumPy alone, under the same environment: what site and .pth
    files import, and what NumPy itself does.

    Some interpreters load stdlib modules before any of our code runs (CI's system Python has a .pth
    that imports tempfile), and NumPy 1.x imports hashlib and secrets (numpy.random). Those are not ours to keep
    out; everything else in the lists still is.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "import sys, numpy; print(*sorted(sys.modules), sep='\\n')"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=True)
    return set(done.stdout.split())


def loaded(modules: set[str], name: str) -> bool:
    """`name` or any of its submodules was imported."""
    return any(m == name or m.startswith(name + ".") for m in modules)


@pytest.mark.parametrize(
    ("args", "forbidden"),
    [(["run", str(EXAMPLE), "-q"], NEVER_ON_QUIET_RUN), (["run", str(EXAMPLE)], NEVER_ON_PLAIN_RUN)],
    ids=["run -q", "run (summary)"],
)
def test_plain_run_imports_only_what_it_needs(args, forbidden):
    modules = imported_after(args)
    assert "bnbwd_cli.core.numpy_core" in modules  # the run did happen, with the NumPy core
    before_us = preloaded()
    crept_in = {name: why for name, why in forbidden.items() if loaded(modules, name) and name not in before_us}
    assert not crept_in, f"imported by `bnbwd {' '.join(args[:1] + args[2:])}`: {crept_in}"


def test_npy_run_to_out_dir_loads_no_archive_code(tmp_path):
    """`run --src x.npy ... --out-dir DIR -q`: .npy in, .npy out; nothing of zipfile's family is imported."""
    rng = np.random.default_rng(0)
    for name, shape in (("src", (2, 3, 4, 4)), ("diff_dst", (2, 3, 4, 4)), ("mean", (3,)), ("gamma", (3,))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    np.save(tmp_path / "variance.npy", rng.uniform(0.5, 1.5, 3).astype(np.float32))
    inputs = [arg for name in ("src", "diff_dst", "mean", "variance", "gamma")
              for arg in (f"--{name.replace('_', '-')}", str(tmp_path / f"{name}.npy"))]
    out = tmp_path / "grads"
    modules = imported_after(["run", *inputs, "--epsilon", "1e-5", "--format", "NCHW", "-q", "--out-dir", str(out)])
    assert sorted(path.name for path in out.iterdir()) == ["diff_beta.npy", "diff_gamma.npy", "diff_src.npy"]
    before_us = preloaded()
    crept_in = {name: why for name, why in NEVER_ON_NPY_RUN.items() if loaded(modules, name) and name not in before_us}
    assert not crept_in, f"imported by `bnbwd run` on .npy files: {crept_in}"


def test_reference_run_loads_the_comparison(tmp_path):
    """The other side of the guard: --reference does load the judge (the lazy imports still resolve)."""
    out = tmp_path / "grads.npz"
    subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", str(EXAMPLE), "-q", "-o", str(out)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120)
    modules = imported_after(["run", str(EXAMPLE), "-q", "--reference", str(out)])
    assert {"bnbwd_cli.judge.sets", "bnbwd_cli.judge.model", "rich"} <= modules


def test_script_keeps_numpys_blas_pool_to_one_thread_unless_the_user_sets_it():
    """The script's numpy starts no spinning BLAS threads (bnbwd makes no BLAS call a pool speeds up); a setting
    in the user's environment wins."""
    assert "OPENBLAS_NUM_THREADS 1" in probe(["run", str(EXAMPLE), "-q"])
    assert "OPENBLAS_NUM_THREADS 3" in probe(["run", str(EXAMPLE), "-q"], {"OPENBLAS_NUM_THREADS": "3"})


def test_script_ends_without_teardown_yet_flushes_stdout_and_keeps_exit_codes(tmp_path):
    """The script's quick end (no interpreter teardown) loses nothing: the archive sent to stdout is whole, and a
    command's exit code is its own (1: a mismatch under --reference; 2: a usage error)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    piped = tmp_path / "piped.npz"
    with piped.open("wb") as stdout:
        done = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", str(EXAMPLE), "-q", "-o", "-"], stdout=stdout,
                              env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0
    with np.load(piped) as archive:
        assert sorted(archive.files) == ["diff_beta", "diff_gamma", "diff_src"]
        wrong = {name: archive[name] * 2 for name in archive.files}
    np.savez(tmp_path / "wrong.npz", **wrong)
    judged = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", str(EXAMPLE), "--reference",
                             str(tmp_path / "wrong.npz")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert judged.returncode == 1 and "diff_src" in judged.stdout
    usage = subprocess.run([sys.executable, "-m", "bnbwd_cli", "run", "--no-such-flag"], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=120)
    assert usage.returncode == 2 and usage.stderr.startswith("error:")
