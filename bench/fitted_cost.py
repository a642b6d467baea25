"""What the diagnosis costs on a failing run at (32,128,56,56) float32 (12.8M elements) for each fitted model's family
(tools/fitted_bugs.py): the whole diagnosis (judge/diagnosis.diagnose), and of it the fitted models' own fits on their
fixed sample (fitted_statistics.fit_statistics, terms.fit_terms) and the tiers' hypothesis tests.

    python -m bench.fitted_cost [--layout NCX|NXC] [--family NAME ...] [--shape 32 128 56 56]

One line a family: the cause named, the CPU seconds of the diagnosis (and its wall time), of the fits, of the fitted
tiers' tests (the full-run confirmation of an accepted hypothesis is most of it).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="NCX", choices=("NCX", "NXC"))
    parser.add_argument("--family", action="append")
    parser.add_argument("--shape", type=int, nargs=4, default=(32, 128, 56, 56), metavar=("N", "C", "H", "W"))
    args = parser.parse_args()
    import numpy as np

    import bnbwd_cli.judge.diagnosis as diagnosis
    from bnbwd_cli.judge import Judging, compare_sets
    from bnbwd_cli.judge.diagnosis import fitted_statistics, terms
    from tools import bugs, fitted_bugs, zoo

    spent: dict[str, float] = {}

    def timed(name, function):  # CPU seconds of this process (wall time too for the whole diagnosis)
        def run(*a, **k):
            start, wall = time.process_time(), time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - start
                spent[name + " wall"] = spent.get(name + " wall", 0.0) + time.perf_counter() - wall
        return run

    diagnosis.diagnose = timed("diagnosis", diagnosis.diagnose)
    fitted_statistics.fit_statistics = timed("fits", fitted_statistics.fit_statistics)
    terms.fit_terms = timed("fits", terms.fit_terms)
    test = diagnosis._test
    n, c, h, w = args.shape
    shape = (n, c, h, w) if args.layout == "NCX" else (n, h, w, c)
    for family in args.family or list(fitted_bugs.FAMILIES):
        rng = np.random.default_rng(1)
        problem = zoo.make_problem(rng, shape, args.layout, np.float32, np.float32)
        bug = fitted_bugs.FAMILIES[family](rng, problem, True)
        outputs = bugs.kernel(problem, bug.hooks)
        truth = zoo.bnbwd_outputs(problem)
        spent.clear()
        tiers = {"fitted tiers": 0.0}

        def counting(case, candidates, first=False):
            start = time.process_time()
            try:
                return test(case, candidates, first)
            finally:
                if first:
                    tiers["fitted tiers"] += time.process_time() - start

        diagnosis._test = counting
        result = compare_sets(outputs, truth, Judging(), inputs=zoo.inputs_of(problem))
        causes = sorted({hint.cause for o in result.outputs for hint in o.comparison.diagnosis})
        print(f"{family} {args.layout}: {causes} diagnosis {spent.get('diagnosis', 0):.2f} s CPU "
              f"({spent.get('diagnosis wall', 0):.2f} s wall), of it the fits {spent.get('fits', 0):.2f} s and the "
              f"fitted tiers' tests {tiers['fitted tiers']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
