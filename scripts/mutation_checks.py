"""Mutation checks: each plants one bug in the package and runs the tests that must catch it.

    python scripts/mutation_checks.py      (from the repository root; restores every file it touches)

Prints one markdown row per mutant: caught (the named tests fail) or NOT caught (the tests stayed green:
a test that cannot fail where it should). Each mutant edits text that occurs exactly once in its file.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (what the bug is, file, text, replacement, the pytest arguments that must fail)
MUTANTS = (
    ("--bf16 reads float16 bits", "bnbwd_cli/files/reinterpret.py", ".view(dtypes.BFLOAT16)", '.view("<f2")',
     "tests/test_readers.py tests/test_check_cli.py -k bf16"),
    ("min_atol doubled", "bnbwd_cli/judge/stats.py", "min_atol=None if scaled else self.need[0].finish(),",
     "min_atol=None if scaled else 2 * self.need[0].finish(),", "tests/test_compare.py -k min_tolerance"),
    ("an internal error exits 3", "bnbwd_cli/cli/main.py", "ctx.exit(ExitCode.INTERNAL)", "ctx.exit(ExitCode.INPUT)",
     "tests/test_exit_codes.py -k 'exit_4 or traceback'"),
    ("--traceback prints one line", "bnbwd_cli/cli/main.py", "_echo_stderr(format_exc().rstrip())",
     '_echo_stderr("error: internal error")', "tests/test_exit_codes.py -k traceback"),
    ("a mismatch exits 0", "bnbwd_cli/status.py", "Status.MISMATCH: ExitCode.MISMATCH", "Status.MISMATCH: ExitCode.OK",
     "tests/test_exit_codes.py -k exit_1"),
    ("pair_sum drops its error term", "bnbwd_cli/core/plan.py", "return total, (lo_a + lo_b) + error",
     "return total, (lo_a + lo_b)", "tests/test_reproducible.py tests/test_core.py tests/test_golden_bits.py -m 'not numba'"),
    ("bf16 writes round twice at ties", "bnbwd_cli/core/rounding.py", "    if ties.any():", "    if False:",
     "tests/test_reproducible.py -k 'bfloat16 or round_to' -m 'not numba'"),
    ("float16 cast through float32 (double rounding)", "bnbwd_cli/core/rounding.py",
     'np.copyto(out, values, casting="unsafe")\n        return values',
     'np.copyto(out, values.astype(np.float32), casting="unsafe")\n        return values', "tests/test_kernels_tiling.py -k 'half or float16'"),
    ("a report cut short by a closed stdout exits 3", "bnbwd_cli/cli/main.py", "        return _Verdict.code\n",
     "        return ExitCode.INPUT\n", "tests/test_pipes.py -k 'reader or full'"),
    ("PyTorch's save_invstd read as a variance", "bnbwd_cli/spec.py", 'invstd = seen_as.get("variance") in INVSTD_KEYS',
     "invstd = False", "tests/test_pytorch_names.py -k 'folder or invstd'"),
    ("a case's is_training ignored", "bnbwd_cli/app/inputs.py",
     'training=attributes.get("is_training", self.training))', "training=self.training)",
     "tests/test_check_cases.py -k own_entries"),
    ("numba's cache directory not reloaded", "bnbwd_cli/runtime.py", "            config.reload_config()\n",
     "            pass\n", "tests/test_numba_cache.py -k reinstall"),
)


def check(name: str, path: str, text: str, replacement: str, tests: str) -> bool:
    """Plant one mutant, run its tests, restore the file; True when the tests caught it (exit 1)."""
    source = ROOT / path
    original = source.read_text()
    if original.count(text) != 1:
        raise SystemExit(f"{name}: the text to mutate occurs {original.count(text)} times in {path}")
    source.write_text(original.replace(text, replacement))
    Path(importlib.util.cache_from_source(str(source))).unlink(missing_ok=True)  # never a stale .pyc of the original
    try:
        done = subprocess.run(f"{sys.executable} -m pytest -x -q -p no:cacheprovider {tests}", shell=True,
                              capture_output=True, text=True, cwd=ROOT)
    finally:
        source.write_text(original)
    failed = next((line[len("FAILED "):] for line in done.stdout.splitlines() if line.startswith("FAILED")), "")
    verdict = "caught" if done.returncode == 1 else f"NOT caught (pytest exit {done.returncode})"
    print(f"| {name} | `{path}` | {verdict} | {failed or done.stdout.strip().splitlines()[-1]} |", flush=True)
    return done.returncode == 1


def main() -> None:
    print("| mutant | file | verdict | first failing test |\n|---|---|---|---|")
    caught = [check(*mutant) for mutant in MUTANTS]
    sys.exit(0 if all(caught) else 1)


if __name__ == "__main__":
    main()
