"""Draw random bugs from tools/bugs.py's families at random shapes, seeds, dtypes and layouts, judge each
with bnbwd (run --reference's judgement) and count how often the diagnosis names the planted cause, names a
wrong one, or says that no hypothesis explains it; correct kernels are drawn too (they must pass, no hint).

    python -m tools.diagnosis_check [--draws 200] [--seed 1] [--verbose]

Exits 1 when a correct kernel fails or is given a hint, else 0 (the shares named are for a person to read).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from bnbwd_cli.judge import Judging, compare_sets
from tools import bugs, zoo


# Coarser causes that name the bug's place correctly (judge/diagnosis/own_outputs.py): a bug in the reductions whose
# own cause is not pinned down (e.g. several blocks fit a lost partial sum in bf16) is rightly "the sums are wrong,
# the elementwise pass is right".
PLACE = {cause: {"sums-wrong"} for cause in ("missing-tail", "lost-partial-sum", "16-bit-accumulation",
                                             "sum-scaled-by-M", "gamma-sum-from-x")}


def causes(problem: dict, outputs: dict, keep: tuple[str, ...] = ("diff_src", "diff_gamma", "diff_beta")) -> tuple[str, set[str]]:
    reference = zoo.bnbwd_outputs(problem)
    result = compare_sets({k: outputs[k] for k in keep}, {k: reference[k] for k in keep}, Judging(),
                          inputs=zoo.inputs_of(problem))
    named = {h.cause for o in result.outputs if o.comparison is not None for h in o.comparison.diagnosis}
    return result.status, named


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--bf16-params", action="store_true",
                        help="a quarter of the problems hold mean, variance and gamma in bfloat16")
    parser.add_argument("--partial", action="store_true",
                        help="also judge runs that hold only some outputs (diff_src alone, or without diff_gamma)")
    parser.add_argument("--family", action="append")
    parser.add_argument("--m-range", type=int, nargs=2, default=(600, 6000), metavar=("LOW", "HIGH"),
                        help="elements per channel drawn from [LOW, HIGH)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    families = args.family or sorted(bugs.FAMILIES)
    tally: Counter = Counter()
    per_family: dict[str, Counter] = {}
    start = time.time()
    drawn = 0
    while drawn < args.draws:
        family = str(rng.choice(families))
        fmt = str(rng.choice(["NCX", "NXC"]))
        dtype = str(rng.choice(["f32", "bf16", "f16"]))
        stats = "bf16" if args.bf16_params and rng.random() < 0.25 else "f32"
        planted = bugs.plant(family, rng, fmt, dtype, m_range=tuple(args.m_range), stats=stats)
        if planted is None:
            continue
        drawn += 1
        keep = ("diff_src", "diff_gamma", "diff_beta")
        if args.partial:
            keep = (keep, ("diff_src",), ("diff_src", "diff_beta"))[int(rng.integers(3))]
        status, named = causes(planted.problem, planted.outputs, keep)
        expected = planted.bug.cause
        if status == "pass":
            outcome = "passed"
        elif expected in named and named <= {expected, "variance-holds-invstd"}:
            outcome = "named"
        elif named and named <= PLACE.get(expected, set()) | {"variance-holds-invstd"}:
            outcome = "place"
        elif named - {"unexplained", "ambiguous"}:
            outcome = "wrong"
        else:
            outcome = "unexplained"
        tally[outcome] += 1
        per_family.setdefault(planted.bug.family, Counter())[outcome] += 1
        if args.verbose and outcome != "named":
            print(f"{outcome:11s} {planted.bug.family} {fmt} {dtype}/{stats} {planted.problem['src'].shape} {keep} "
                  f"-> {sorted(named)}")
    # correct kernels: must pass with no hint
    correct_fail = 0
    for _ in range(max(20, args.draws // 10)):
        fmt = str(rng.choice(["NCX", "NXC"]))
        dtype = str(rng.choice(["f32", "bf16", "f16"]))
        problem = zoo.make_problem(rng, bugs.random_shape(rng, fmt, tuple(args.m_range)), fmt, bugs.DTYPES[dtype], np.float32)
        status, named = causes(problem, bugs.correct(problem))
        correct_fail += status != "pass" or bool(named)
    failing = drawn - tally["passed"]
    print(f"{drawn} planted bugs, {failing} failed the judge ({tally['passed']} passed it)")
    for outcome in ("named", "place", "wrong", "unexplained"):
        share = 100 * tally[outcome] / failing if failing else 0.0
        print(f"  {outcome:11s} {tally[outcome]:4d}  {share:5.1f}% of the failing ones")
    print(f"correct kernels failing or hinted: {correct_fail}")
    for family, counter in sorted(per_family.items()):
        print(f"  {family:26s} " + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())))
    print(f"({time.time() - start:.0f} s)")
    return 1 if correct_fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
