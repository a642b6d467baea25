"""Compile every numba kernel the tests use, once: each supported dtype through each of the core's paths.

The session fixture `numba_jit` (conftest.py) runs this in a background process as soon as numba tests are
collected, so that on a cold numba cache (CI) the JIT compiles on the second core while the other tests
run; the test process then loads the kernels from the disk cache (`cache=True`) instead of compiling them.

    python -m tests.numba_warmup
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

from bnbwd_cli.app.judge import reference_outputs
from bnbwd_cli.judge.sets import compare_sets
from bnbwd_cli.judge.tolerance import Judging

from bnbwd_cli.core import Op, Settings, backward
from bnbwd_cli.layout import view3
from bnbwd_cli.runtime import load_numba_core

DTYPES = (np.float64, np.float32, ml_dtypes.bfloat16, np.float16)
# The core's paths (core/numba_core.run): planes fused (C >= 2 * threads), planes in (channel, chunk) tasks
# (few channels), and rows (short contiguous runs, e.g. NXC).
# (Read-only inputs, as --stream hands the core, need no versions of their own: the core hands its kernels
# read-only views always.)
PATHS = (((2, 4, 300), "NCX"), ((2, 1, 300), "NCX"), ((50, 3), "NXC"))


def warm_up() -> None:
    numba_core = load_numba_core()
    for dtype in DTYPES:
        if not numba_core.supports(np.dtype(dtype)):
            continue  # float16 without hardware half conversions runs on the NumPy core
        for shape, data_format in PATHS:
            channels = shape[1] if data_format == "NCX" else shape[-1]
            src, diff_dst = np.ones(shape, dtype), np.ones(shape, dtype)
            op = Op(src, diff_dst, np.zeros(channels, np.float32), np.ones(channels, np.float32), None,
                    epsilon=1e-5, data_format=data_format)
            backward(op, Settings(core="numba", threads=1))
    warm_up_judging()


def warm_up_judging() -> None:
    """The compiled judging's kernels (judge/numba_facts.py), each dtype in each layout's loop."""
    from bnbwd_cli.judge import model, numba_facts

    for dtype in DTYPES:
        if not load_numba_core().supports(np.dtype(dtype)):
            continue
        for shape, data_format in (((2, 3, 5), "NCX"), ((4, 3), "NXC")):
            channels = shape[1] if data_format == "NCX" else shape[-1]
            src, diff_dst = np.ones(shape, dtype), np.ones(shape, dtype)
            op = Op(src, diff_dst, np.zeros(channels, np.float32), np.ones(channels, np.float32), None,
                    epsilon=1e-5, data_format=data_format)
            blocks = list(model.blocks(view3(diff_dst, data_format).shape))
            numba_facts.facts_sums(op, blocks, model.channel_constants(op)[:2])
            outputs = reference_outputs(op, ("diff_src",), threads=1)
            moved = outputs["diff_src"].copy()
            moved.reshape(-1).view(f"u{moved.itemsize}")[:] += 1  # one ULP off: the judging pass, not the unmoved sums
            os.environ["BNBWD_CORE"] = "numba"  # (this process only: judge/numba_pass.py and numba_unmoved.py)
            compare_sets({"diff_src": moved}, outputs, Judging(threads=1), inputs=op)
            compare_sets(outputs, outputs, Judging(threads=1), inputs=op)


def warm_up_once() -> None:
    """warm_up, one process at a time: pytest-xdist starts this warm-up in every worker, and the first to take the
    lock compiles while the others wait, then load its disk cache (~2 s). Two compiling side by side on a 2-core
    machine doubled the JIT's CPU (~60 s each, cold) and left the tests one core."""
    with open(Path(tempfile.gettempdir()) / "bnbwd-numba-warmup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process ends, killed or not
        warm_up()


if __name__ == "__main__":
    warm_up_once()
