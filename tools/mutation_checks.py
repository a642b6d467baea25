"""Mutation checks: plant one realistic bug at a time in a copy of the tree and run the behavioural tests that must
catch it.

    python -m tools.mutation_checks              every mutant; exits 1 when fewer than 90% are killed
    python -m tools.mutation_checks -k ratio     only the mutants whose name holds 'ratio'
    python -m tools.mutation_checks --list       the mutants and their tests, nothing run

Each mutant replaces text that occurs exactly once in its file (one line) of a temporary copy of the repository,
so the checkout is never touched, and runs its tests there (-x, no xdist, numba tests left out). A mutant is
killed when its tests fail (pytest exit 1), survived when they pass; any other exit (an error, a timeout) is
reported as such and counts as not killed. The tests are behavioural ones: README and doc snapshot tests
(SNAPSHOT_TESTS) never count. Each distinct test selection first runs on the unmutated copy: a selection already
red there would kill every mutant for nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT_TESTS = ("tests/test_docs.py",)  # they compare text with the README and docs: a change, not a bug, fails them
KILLED_SHARE = 0.9
TIMEOUT_S = 300
COPY_IGNORED = (".git", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".hypothesis", "*.egg-info", "build",
                "dist")


@dataclass(frozen=True)
class Mutant:
    """One planted bug: `old` (exactly once in `path`) replaced by `new`; `tests`: pytest arguments that must fail.
    Names hold no '|' (they are markdown table cells)."""

    name: str
    path: str
    old: str
    new: str
    tests: str


TOL, MODEL, RULES = "bnbwd_cli/judge/tolerance.py", "bnbwd_cli/judge/model.py", "bnbwd_cli/judge/rules.py"
NPZ, SAFE, RAW = "bnbwd_cli/files/npz.py", "bnbwd_cli/files/safetensors_file.py", "bnbwd_cli/files/raw.py"
WRITE, SPEC = "bnbwd_cli/files/write.py", "bnbwd_cli/spec.py"
EDGES, GUARDS, NAMES = "tests/test_tolerance_edges.py", "tests/test_guard_edges.py", "tests/test_spec_names.py"
HISTOGRAM_MODULE, ASSESS, DIAGNOSIS = ("bnbwd_cli/judge/histogram.py", "bnbwd_cli/judge/diagnosis/assess.py",
                                 "bnbwd_cli/judge/diagnosis/__init__.py")
BIAS_EDGES, HISTOGRAM, RULES_TESTS = ("tests/test_judge_bias_edges.py", "tests/test_judge_histogram.py",
                                      "tests/test_judge_diagnosis_rules.py")
STREAM_CAPS = "tests/test_files_stream_caps.py"

MUTANTS = (
    # judge/: tolerances, error scales, rules, matching
    Mutant("the sums' K loosened 2x", TOL, "SUM_MAX_UNITS = 5.0", "SUM_MAX_UNITS = 10.0",
           f"{EDGES} -k 'pinned and diff_beta'"),
    Mutant("diff_src's K loosened 2x", TOL, "DEFAULT_MAX_UNITS = 16.0", "DEFAULT_MAX_UNITS = 32.0",
           f"{EDGES} -k 'pinned and diff_src'"),
    Mutant("float32 rtol loosened 2x", TOL, '"f32": Tolerance(atol=1e-5, rtol=1e-5,', '"f32": Tolerance(atol=1e-5, rtol=2e-5,',
           f"{EDGES} -k fixed"),
    Mutant("bfloat16 atol loosened 2x", TOL, '"bf16": Tolerance(atol=1e-2,', '"bf16": Tolerance(atol=2e-2,',
           f"{EDGES} -k fixed"),
    Mutant("the float32 relative-L2 bound loosened 2x", TOL, '"f32": 2.0**6,', '"f32": 2.0**7,',
           f"{EDGES} -k relative_l2"),
    Mutant("the unit roundoff of float32 doubled", MODEL, "U32, U64 = 2.0**-24, 2.0**-53", "U32, U64 = 2.0**-23, 2.0**-53",
           f"{EDGES} -k pinned"),
    Mutant("the bias check's z loosened 2x", TOL, "BIAS_Z = 6.0", "BIAS_Z = 12.0",
           "tests -k small_deviations_fail_as_systematic"),
    Mutant("abs(diff_gamma) dropped from diff_gamma's scale", MODEL,
           "np.abs(self.mean) * self.invstd * np.abs(self.diff_beta) + np.abs(self.diff_gamma))",
           "np.abs(self.mean) * self.invstd * np.abs(self.diff_beta))", f"{EDGES} -k 'pinned and diff_gamma'"),
    Mutant("the terms' own roundings counted once", MODEL, "unit * (2 * self.norm_gamma +", "unit * (self.norm_gamma +",
           f"{EDGES} -k 'pinned and diff_gamma'"),
    Mutant("the realised floor doubled", MODEL, "REALISED_FLOOR = 2.5", "REALISED_FLOOR = 5.0",
           f"{EDGES} -k pinned"),
    Mutant("a random order's norm(x)**2 term dropped", MODEL, "shuffled = count * (total * total / 3 + norm * norm / 6)",
           "shuffled = count * (total * total / 3)", f"{EDGES} -k pinned"),
    Mutant("the mean's rounding dropped from diff_src's scale", MODEL,
           "base = k * (unit * np.abs(facts.diff_beta) + s_beta + mean_shift * np.abs(facts.diff_gamma)) / m",
           "base = k * (unit * np.abs(facts.diff_beta) + s_beta) / m", f"{EDGES} -k 'pinned and diff_src'"),
    Mutant("u*abs(diff_src) dropped from diff_src's scale", MODEL,
           "    scale += np.multiply(unit, np.abs(reference, out=term), out=term)", "    pass",
           f"{EDGES} -k 'pinned and diff_src'"),
    Mutant("float64 unit for float32 outputs of float64 inputs", MODEL,
           'return U64 if names == {"f64"} and output_dtype == "f64" else U32', 'return U64 if names == {"f64"} else U32',
           f"{EDGES} -k float32"),
    Mutant("M from one axis only", MODEL, "count=shape3[0] * shape3[2],", "count=shape3[0],",
           f"{EDGES} -k pinned"),
    Mutant("a single channel's sequential float32 sum taken pairwise", MODEL,
           "self.total[channels] = np.cumsum(rows[:, 0], dtype=np.float32)[-1]",
           "self.total[channels] = np.add.reduce(rows, axis=0, dtype=np.float32)", f"{EDGES} -k 'pinned and C1'"),
    Mutant("the ulp of rounding left out of the scaled rule", RULES, "        allowance += chunk.spacing", "        pass",
           f"{EDGES} -k 'pinned and bf16'"),
    Mutant("the fixed rule's ulp compared with <", RULES, "within_ulp = ulp_err <= tol.ulp", "within_ulp = ulp_err < tol.ulp",
           f"{EDGES} -k ulp_allowance"),
    Mutant("TensorFlow's scale_backprop read as diff_beta", "bnbwd_cli/judge/keys.py", '"scale_backprop": "diff_gamma"',
           '"scale_backprop": "diff_beta"', f"{NAMES} -k tensorflow"),
    Mutant("nGraph's gamma_delta unknown", "bnbwd_cli/judge/keys.py", '"gamma_delta": "diff_gamma", ', "",
           f"{NAMES} -k ngraph"),
    Mutant("a failing last output ignored", "bnbwd_cli/judge/sets.py",
           "return Status.MISMATCH if any(o.status == Status.MISMATCH for o in self.outputs) else Status.PASS",
           "return Status.MISMATCH if any(o.status == Status.MISMATCH for o in self.outputs[:-1]) else Status.PASS",
           f"{NAMES} -k run_reference"),
    # the one judgement of a kernel (app/judge.judge_kernel) and its criteria (judge/criteria.py)
    Mutant("a kernel's missing output no longer required", "bnbwd_cli/app/judge.py",
           "judging = replace(judging, required=tuple(required))", "judging = replace(judging, required=())",
           "tests/test_one_judgement.py -k 'one-missing or fewer'"),
    Mutant("an unchecked systematic scale fails", "bnbwd_cli/judge/criteria.py", "not (checked and beyond), beyond",
           "not beyond, beyond", "tests/test_verify_cli.py -k bias"),
    Mutant("--max-mismatch allows one more", "bnbwd_cli/judge/compare.py",
           "self.allowed = setup.max_mismatch.allowed(math.prod(self.shape))",
           "self.allowed = setup.max_mismatch.allowed(math.prod(self.shape)) + 1", f"{EDGES} -k max_mismatch"),
    Mutant("--max-mismatch P% rounded up", TOL, "return int(math.floor(size * self.value / 100.0))",
           "return int(math.ceil(size * self.value / 100.0))", f"{EDGES} -k max_mismatch"),
    Mutant("inference mode's diff_src scale loosened 2x", MODEL, "        return DiffSrcScale(zero, zero, per_dy, unit)",
           "        return DiffSrcScale(zero, zero, 2 * per_dy, unit)", f"{EDGES} -k inference"),
    Mutant("the bias floor halved", TOL, "BIAS_FLOOR_UNITS = 16.0", "BIAS_FLOOR_UNITS = 8.0", f"{BIAS_EDGES} -k floor"),
    Mutant("the sums' systematic allowance doubled", TOL, "SYSTEMATIC_UNITS = 4.0", "SYSTEMATIC_UNITS = 8.0",
           f"{BIAS_EDGES} -k systematic_allowance"),
    Mutant("the histogram holds one decade more than max_bins", HISTOGRAM_MODULE,
           "bottom = max(lowest, highest - max_bins + 1)", "bottom = max(lowest, highest - max_bins)",
           f"{HISTOGRAM} -k max_bins"),
    Mutant("the histogram's lowest bin leaves out its own decade", HISTOGRAM_MODULE, "if d <= k) if low_edge",
           "if d < k) if low_edge", f"{HISTOGRAM} -k lowest_bin"),
    Mutant("a cause explaining 80% of a failure named", ASSESS, "MIN_SHARE = 0.9", "MIN_SHARE = 0.8",
           f"{RULES_TESTS} -k part_of"),
    Mutant("a cause explaining 96% of a failure not named", ASSESS, "MIN_SHARE = 0.9", "MIN_SHARE = 0.96",
           f"{RULES_TESTS} -k part_of"),
    Mutant("a rival leaving 3x as much still ambiguous", DIAGNOSIS, "AMBIGUOUS = 2.0", "AMBIGUOUS = 3.0",
           f"{RULES_TESTS} -k ambiguous"),
    Mutant("a rival leaving 1.8x as much not ambiguous", DIAGNOSIS, "AMBIGUOUS = 2.0", "AMBIGUOUS = 1.5",
           f"{RULES_TESTS} -k ambiguous"),
    Mutant("every channel said as N of N", DIAGNOSIS, "if 0 < len(channels) < case.channels:",
           "if 0 < len(channels) <= case.channels:", f"{RULES_TESTS} -k every_channel"),
    Mutant("a named cause's every channel said as N of N", "bnbwd_cli/judge/diagnosis/reductions.py",
           "everywhere = len(channels) == case.channels", "everywhere = False", f"{RULES_TESTS} -k every_channel"),
    # the one judgement of a kernel (app/judge.judge_kernel): every face, the same verdict
    Mutant("a kernel that did not give an output passes", "bnbwd_cli/app/judge.py",
           "judging = replace(judging, required=tuple(required))", "judging = replace(judging, required=())",
           "tests/test_one_judgement.py -k every_face"),
    Mutant("an output left out by --only still required", "bnbwd_cli/judge/keys.py",
           "if name not in given and selected(name)]", "if name not in given]",
           "tests/test_one_judgement.py -k judging_fewer"),
    Mutant("a kernel that gave no output judged anyway", "bnbwd_cli/app/judge.py", "    if not present:",
           "    if False:", "tests/test_one_judgement.py -k no_output"),
    # core/
    Mutant("pair_sum drops its error term", "bnbwd_cli/core/plan.py", "return total, (lo_a + lo_b) + error",
           "return total, (lo_a + lo_b)", "tests -k 'golden_bits or core_matches'"),
    Mutant("bf16 ties rounded twice", "bnbwd_cli/core/rounding.py", "    if ties.any():", "    if False:",
           "tests -k 'bfloat16_stat_outputs_are_rounded_once or round_to'"),
    Mutant("epsilon left out of invstd", "bnbwd_cli/core/__init__.py",
           "return variance64 if variance_is_invstd else 1.0 / np.sqrt(variance64 + epsilon)",
           "return variance64 if variance_is_invstd else 1.0 / np.sqrt(variance64)", "tests -k core_matches_float64_oracle"),
    Mutant("mean(dy) over M - 1", "bnbwd_cli/core/plan.py", "return sum_dy / count, invstd * (dy_xhat / count), dy_xhat",
           "return sum_dy / (count - 1), invstd * (dy_xhat / count), dy_xhat", "tests -k core_matches_float64_oracle"),
    Mutant("float64 statistics rounded to float32", "bnbwd_cli/core/__init__.py", "to_float64(op.mean), invstd,",
           "to_float64(op.mean.astype(np.float32)), invstd,", "tests -k float64_stats"),
    Mutant("the channel axis of NXC taken as axis 1", "bnbwd_cli/layout.py",
           'return 1 if canonical_format(data_format) == "NCX" else ndim - 1', "return 1", f"{NAMES} -k openvino"),
    Mutant("rows per lane group rounded down", "bnbwd_cli/core/plan.py",
           "rows_per_lane = 1 if row >= LANES else -(-LANES // row)", "rows_per_lane = 1 if row >= LANES else LANES // row",
           "tests/test_golden_bits.py -k numpy_core_gives"),
    # files/
    Mutant("the compression ratio bound nudged", NPZ, "MAX_DEFLATE_RATIO = 1100", "MAX_DEFLATE_RATIO = 1101",
           f"{GUARDS} -k ratio"),
    Mutant("the ratio's slack off by one", NPZ, "MAX_DEFLATE_RATIO * info.compress_size + 4096",
           "MAX_DEFLATE_RATIO * info.compress_size + 4097", f"{GUARDS} -k ratio"),
    Mutant("a stored member longer than it declares accepted", NPZ, "info.file_size != info.compress_size",
           "info.file_size > info.compress_size", f"{GUARDS} -k stored_member"),
    Mutant("the lzma dictionary bound off by one", NPZ, "if int.from_bytes(properties[1:5], \"little\") > MAX_LZMA_DICTIONARY:",
           "if int.from_bytes(properties[1:5], \"little\") >= MAX_LZMA_DICTIONARY:", f"{GUARDS} -k lzma"),
    Mutant("the streamed central cap off by one", NPZ, "if self.central > MAX_CENTRAL_BYTES:",
           "if self.central >= MAX_CENTRAL_BYTES:", f"{GUARDS} -k 'central or capped'"),
    Mutant("an archive's memory cap off by one", NPZ, "if total > common.memory_cap():", "if total >= common.memory_cap():",
           f"{GUARDS} -k memory_cap"),
    Mutant("a safetensors bundle's memory cap off by one", SAFE, "if total > memory_cap():", "if total >= memory_cap():",
           f"{GUARDS} -k safetensors_bundle"),
    Mutant("a .npy one byte short accepted", "bnbwd_cli/files/npy.py", "needed > available_bytes - offset:",
           "needed > available_bytes - offset + 1:", f"{GUARDS} -k npy_holding"),
    Mutant("the safetensors header cap off by one", SAFE, "if length > MAX_HEADER_BYTES:", "if length >= MAX_HEADER_BYTES:",
           f"{GUARDS} -k header_cap"),
    Mutant("the safetensors JSON item cap off by one", SAFE, "text.count(b\",\") > MAX_JSON_ITEMS:",
           "text.count(b\",\") >= MAX_JSON_ITEMS:", f"{GUARDS} -k json_items"),
    Mutant("a safetensors header running past the file accepted", SAFE, "if not 0 < length <= size - 8:",
           "if not 0 < length <= size:", f"{GUARDS} -k header_length"),
    Mutant("the safetensors dimension limit off by one", SAFE, "if (not isinstance(shape, list) or len(shape) > MAX_DIMENSIONS",
           "if (not isinstance(shape, list) or len(shape) >= MAX_DIMENSIONS", f"{GUARDS} -k safetensors_dimensions"),
    Mutant("the raw dimension limit off by one", RAW, "if len(dims) > MAX_DIMENSIONS:", "if len(dims) >= MAX_DIMENSIONS:",
           f"{GUARDS} -k raw_dimensions"),
    Mutant("a raw dump longer than its shape accepted", RAW, "if size != raw.nbytes:", "if size < raw.nbytes:",
           f"{GUARDS} -k raw_dump_size"),
    Mutant("a failed set's temp files left behind", WRITE, "        self.abort()\n        self._raise(exc, where)",
           "        self._raise(exc, where)", f"{GUARDS} -k full_disk"),
    Mutant("the last output's temp kept when a set fails", WRITE,
           "    def abort(self) -> None:\n        for _, temp, stream in self._entries:",
           "    def abort(self) -> None:\n        for _, temp, stream in self._entries[:-1]:", f"{GUARDS} -k full_disk"),
    Mutant("temp files named like outputs", WRITE, 'TEMP_SUFFIX = ".tmp"', 'TEMP_SUFFIX = ".npy"', f"{GUARDS} -k stale"),
    Mutant("a failed command's output group committed", "bnbwd_cli/files/commit.py",
           "        if isinstance(exc, Exit):  # the command", "        if True:  # the command", f"{GUARDS} -k json_report"),
    Mutant("a .npy on stdin declaring the memory cap refused", "bnbwd_cli/files/npy.py",
           "if available_bytes is None and header.nbytes > common.memory_cap():",
           "if available_bytes is None and header.nbytes >= common.memory_cap():", f"{STREAM_CAPS} -k npy_on_stdin"),
    Mutant("an archive on stdin one byte past the memory cap accepted", NPZ, "            if total > cap:",
           "            if total > cap + 1:", f"{STREAM_CAPS} -k archive_on_stdin"),
    # cli/, app/, status
    Mutant("a mismatch exits 0", "bnbwd_cli/status.py", "Status.MISMATCH: ExitCode.MISMATCH", "Status.MISMATCH: ExitCode.OK",
           "tests -k exit_1_on_a_mismatch"),
    Mutant("an internal error exits 3", "bnbwd_cli/cli/main.py", "ctx.exit(ExitCode.INTERNAL)", "ctx.exit(ExitCode.INPUT)",
           "tests -k 'exit_4_on_an_internal_error or traceback'"),
    Mutant("a file's is_training ignored", "bnbwd_cli/app/inputs.py",
           'training=self.training if self.training is not None else attributes.get("is_training"))',
           "training=self.training)", "tests -k is_training"),
    Mutant("a negative --atol/--rtol/--max-units accepted", "bnbwd_cli/cli/params.py",
           "if not math.isfinite(parsed) or parsed < 0:", "if not math.isfinite(parsed):", "tests -k exit_2_usage"),
    Mutant("--map split at the first '='", "bnbwd_cli/cli/params.py", 'actual, sep, reference = value.rpartition("=")',
           'actual, sep, reference = value.partition("=")', "tests/test_map_cli.py -k equals"),
    # spec.py
    Mutant("TensorFlow's default epsilon 1e-3", SPEC, "default_epsilon=1e-4", "default_epsilon=1e-3",
           f"{NAMES} -k tensorflow"),
    Mutant("a spec's dtype pairs not checked", SPEC,
           "return self.type_pairs is None or (float_name(t1), float_name(t2)) in self.type_pairs", "return True",
           f"{NAMES} -k dtype_pairs"),
    Mutant("nGraph's beta optional", SPEC, 'required=("gamma", "beta")', 'required=("gamma",)',
           f"{NAMES} -k requires"),
    Mutant("PyTorch's save_invstd read as a variance", SPEC, 'invstd = seen_as.get("variance") in INVSTD_KEYS',
           "invstd = False", f"{NAMES} -k pytorch"),
    Mutant("OpenVINO's output_delta unknown", SPEC, '("normalized_delta", "output_delta", "y_backprop", "grad_output")',
           '("normalized_delta", "y_backprop", "grad_output")', f"{NAMES} -k openvino"),
    Mutant("oneDNN's epsilon not rounded to float32", SPEC,
           "required=(), epsilon_is_f32=True, paired_param_grads=True),",
           "required=(), epsilon_is_f32=False, paired_param_grads=True),", f"{NAMES} -k epsilon_f32"),
    Mutant("epsilon 0 accepted", SPEC, "if not math.isfinite(epsilon) or epsilon <= 0:",
           "if not math.isfinite(epsilon) or epsilon < 0:", f"{NAMES} -k lower_limit"),
    # the leftovers of issue 37: dtypes, worker pools, every output vetted by one rule, one error per name set
    Mutant("f16 read as NumPy's float128", "bnbwd_cli/dtypes.py", '"f16": "f2"}', '"f16": "f16"}',
           "tests/test_readers_cli.py -k 'f16 or short_names'"),
    Mutant("a pool's stop reaps every child", "bnbwd_cli/app/workers.py", "        _reap(pool.processes)",
           '        _reap(__import__("multiprocessing").active_children())',
           "tests/test_lifetimes.py -k own_workers"),
    Mutant("two outputs in one file accepted", "bnbwd_cli/cli/destinations.py",
           "if path.resolve() == other.resolve() and not is_write_through(path):",
           "if False:", "tests/test_judgement_reports.py tests/test_suite_reports.py -k 'same or one_file'"),
    Mutant("run --reference's missing outputs left for a later run", "bnbwd_cli/app/run.py",
           "if request.kernel is not None and missing_inputs(inputs, settings):",
           "if False:", "tests/test_missing_names.py -k two_files"),
)


@dataclass(frozen=True)
class Outcome:
    verdict: str  # "killed", "SURVIVED", or what went wrong
    detail: str  # the first failing test, or pytest's last line
    seconds: float


def pytest_command(tests: str) -> list[str]:
    ignored = [f"--ignore={snapshot}" for snapshot in SNAPSHOT_TESTS]
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "not numba",
            *ignored, *shlex.split(tests)]


def run_tests(tree: Path, tests: str) -> tuple[int | None, str]:
    """(pytest's exit status, None on a timeout; the first failing test or its last line) in the copy."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HYPOTHESIS_PROFILE": "ci"}
    try:
        done = subprocess.run(pytest_command(tests), cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {TIMEOUT_S} s"
    lines = done.stdout.strip().splitlines()
    failed = next((line[len("FAILED "):] for line in lines if line.startswith("FAILED ")), "")
    return done.returncode, failed or (lines[-1] if lines else done.stderr.strip()[-200:])


def plant(tree: Path, mutant: Mutant, text: str) -> None:
    """Write `text` as the mutant's file, with no bytecode of the other version left to load."""
    source = tree / mutant.path
    source.write_text(text)
    Path(importlib.util.cache_from_source(str(source))).unlink(missing_ok=True)


def check(tree: Path, mutant: Mutant, baseline: dict[str, tuple[int | None, str]]) -> Outcome:
    """Plant one mutant in the copy, run its tests, restore the file."""
    start = time.monotonic()
    if mutant.tests not in baseline:
        baseline[mutant.tests] = run_tests(tree, mutant.tests)
    code, detail = baseline[mutant.tests]
    if code != 0:
        return Outcome(f"baseline red (pytest exit {code})", detail, time.monotonic() - start)
    original = (tree / mutant.path).read_text()
    plant(tree, mutant, original.replace(mutant.old, mutant.new))
    try:
        code, detail = run_tests(tree, mutant.tests)
    finally:
        plant(tree, mutant, original)
    verdict = {1: "killed", 0: "SURVIVED", None: "timeout"}.get(code, f"error (pytest exit {code})")
    return Outcome(verdict, detail, time.monotonic() - start)


def vet(mutants: tuple[Mutant, ...]) -> None:
    """Every mutant edits text found exactly once, in one line, and names no snapshot test."""
    for mutant in mutants:
        count = (ROOT / mutant.path).read_text().count(mutant.old)
        if count != 1:
            raise SystemExit(f"{mutant.name}: the text to mutate occurs {count} times in {mutant.path}")
        if mutant.old.strip("\n").count("\n") > 1:
            raise SystemExit(f"{mutant.name}: more than one line changed")
        if any(snapshot in mutant.tests for snapshot in SNAPSHOT_TESTS):
            raise SystemExit(f"{mutant.name}: a snapshot test does not count as catching a bug")


def copy_tree(destination: Path) -> Path:
    tree = destination / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*COPY_IGNORED), symlinks=True)
    probe = subprocess.run([sys.executable, "-c", "import bnbwd_cli; print(bnbwd_cli.__file__)"], cwd=tree,
                           env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if not probe.stdout.startswith(str(tree)):  # the editable install must not win over the copy
        raise SystemExit(f"the copy's bnbwd_cli is not the one imported: {probe.stdout.strip() or probe.stderr.strip()}")
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="keyword", default="", help="only mutants whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    args = parser.parse_args(argv)
    mutants = tuple(m for m in MUTANTS if args.keyword.lower() in m.name.lower())
    vet(mutants)
    if args.list:
        for number, mutant in enumerate(mutants, 1):
            print(f"{number:2d}. {mutant.name} ({mutant.path}): {mutant.tests}")
        return 0
    print("| # | mutant | file | verdict | first failing test | s |\n|---|---|---|---|---|---|", flush=True)
    killed = 0
    baseline: dict[str, tuple[int | None, str]] = {}
    with tempfile.TemporaryDirectory(prefix="bnbwd-mutants-") as temp:
        tree = copy_tree(Path(temp))
        for number, mutant in enumerate(mutants, 1):
            outcome = check(tree, mutant, baseline)
            killed += outcome.verdict == "killed"
            print(f"| {number} | {mutant.name} | `{mutant.path}` | {outcome.verdict} | {outcome.detail} | "
                  f"{outcome.seconds:.0f} |", flush=True)
    share = killed / len(mutants) if mutants else 1.0
    print(f"\n{killed} of {len(mutants)} killed ({share:.0%}; at least {KILLED_SHARE:.0%} required)")
    return 0 if share >= KILLED_SHARE else 1


if __name__ == "__main__":
    sys.exit(main())
