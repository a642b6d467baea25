"""What the localization of a failing output costs (judge/where.py): localize and heat_map on planted failing
masks of a (32,128,56,56) output (12.8M elements) in both layouts: the best CPU time of a few rounds.

    python -m bench.where_cost [--rounds 5] [--small]
"""

from __future__ import annotations

import argparse
import time


def _best(function, rounds: int) -> float:
    """The best CPU time of a few calls (process time: what a busy machine's other processes do not add)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        function()
        best = min(best, time.process_time() - started)
    return best


def _masks(np, shape: tuple[int, ...], channel_axis: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    spatial = tuple(a for a in range(1, 4) if a != channel_axis)

    def planted(fill):
        mask = np.zeros(shape, dtype=bool)
        fill(mask)
        return mask

    def rows(mask):
        index = [slice(None)] * 4
        index[spatial[0]] = slice(shape[spatial[0]] * 3 // 4, None)
        mask[tuple(index)] = True

    def tile(mask):
        index = [slice(None)] * 4
        index[spatial[0]], index[spatial[1]] = slice(16, 32), slice(16, 32)
        mask[tuple(index)] = True

    return {
        "every 32nd": planted(lambda m: m.reshape(-1).__setitem__(slice(31, None, 32), True)),
        "last 256": planted(lambda m: m.reshape(-1).__setitem__(slice(-256, None), True)),
        "rows": planted(rows),
        "16x16 tile": planted(tile),
        "scattered 0.04%": planted(lambda m: m.reshape(-1).__setitem__(rng.choice(m.size, 5000), True)),
        "scattered 40%": rng.random(shape) < 0.4,
        "every element": np.ones(shape, dtype=bool),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="(8,64,28,28): a quick look")
    args = parser.parse_args()
    import numpy as np

    from bnbwd_cli.judge.heat_map import heat_map
    from bnbwd_cli.judge.where import Coordinates, localize

    n, c, h, w = (8, 64, 28, 28) if args.small else (32, 128, 56, 56)
    for layout, shape, names, axis in (("NCX", (n, c, h, w), ("n", "c", "h", "w"), 1),
                                       ("NXC", (n, h, w, c), ("n", "h", "w", "c"), 3)):
        where = Coordinates(shape, names, axis)
        for label, mask in _masks(np, shape, axis).items():
            located = _best(lambda: localize(mask, where), args.rounds)
            pictured = _best(lambda: heat_map(mask, axis), args.rounds)
            text = localize(mask, where).text
            print(f"{layout} {shape} {label:>16}: localize {located * 1e3:6.1f} ms, heat map {pictured * 1e3:6.1f} ms"
                  f"  -> {text[:70]}", flush=True)


if __name__ == "__main__":
    main()
