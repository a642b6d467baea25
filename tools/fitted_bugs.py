"""Parametrised bugs for the diagnosis's fitted models (judge/diagnosis/fitted_statistics.py, terms.py,
own_outputs.py): each draws its parameters (the statistics used, the coefficients, the channels hit, the factor)
at random and says the cause and the numbers the diagnosis must find.

Kept apart from tools/bugs.py's FAMILIES (the named causes) so that those families' tests keep their draws; the
kernel is the same (tools/zoo.py's float32 emulation, blocks of 256) with the hooks added for these models.
tests/test_judge_fitted.py plants every family in float32 and a 16-bit dtype, both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tools import bugs, zoo

BF16 = zoo.BF16


@dataclass(frozen=True)
class Fitted:
    """A planted bug: the cause the diagnosis must name, the kernel's hooks, and what it must say (``numbers``:
    name -> the planted value; ``channels``: those hit, when not every one)."""

    family: str
    cause: str
    hooks: dict
    numbers: dict = field(default_factory=dict)
    channels: tuple[int, ...] = ()


def _subset(rng: np.random.Generator, c: int) -> list[int]:
    """A run of channels (`c=a..b`) or a scattered few, never all."""
    if rng.random() < 0.5:
        first = int(rng.integers(0, c - 1))
        last = int(rng.integers(first, c - 1))
        return list(range(first, last + 1))
    return sorted(rng.choice(c, size=int(rng.integers(1, max(2, c // 2))), replace=False).tolist())


def _given(problem: dict) -> tuple[np.ndarray, np.ndarray]:
    mean = problem["mean"].astype(np.float64)
    invstd = 1 / np.sqrt(problem["variance"].astype(np.float64) + problem["epsilon"])
    return mean, invstd


def other_statistics(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """The kernel used an invstd eps off (relative) in every channel, and a mean delta sd off in some: the same
    eps and delta in each channel hit, sized to fail the judge (wide: float32 data; else a 16-bit one)."""
    mean, invstd = _given(problem)
    c = mean.shape[0]
    sign = float(rng.choice([-1.0, 1.0]))
    eps = sign * float(rng.uniform(1e-5, 3e-4) if wide else rng.uniform(1e-2, 3e-2))
    hit = _subset(rng, c)
    delta = float(rng.choice([-1.0, 1.0])) * float(rng.uniform(2e-4, 2e-3) if wide else rng.uniform(2e-2, 6e-2))
    shift = np.zeros(c)
    shift[hit] = delta
    used = (mean + shift / invstd, invstd * (1 + eps))
    return Fitted("other-statistics", "fitted-statistics", {"stats_used": used}, {"eps": eps, "delta": delta},
                  tuple(hit))


def saved_bf16_not_nearest(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """Statistics saved in bfloat16 whose invstd is not the nearest bfloat16 value in some channels (rounded the
    other way, as a kernel that computes it in another order does): "kept in bf16" alone does not explain it."""
    mean, invstd = _given(problem)
    c = mean.shape[0]
    nearest = invstd.astype(BF16)
    hit = _subset(rng, c)
    bits = nearest.view(np.uint16).copy()
    below = nearest.astype(np.float64) > invstd  # the other neighbour: one step toward the exact value's side
    bits[hit] = np.where(below[hit], bits[hit] - 1, bits[hit] + 1).astype(np.uint16)
    used_invstd = bits.view(BF16).astype(np.float64)
    used_mean = mean.astype(BF16).astype(np.float64)
    return Fitted("saved-bf16-not-nearest", "fitted-statistics", {"stats_used": (used_mean, used_invstd)},
                  {"eps": used_invstd / invstd - 1}, tuple(hit))


STATISTICS = {f.__name__: f for f in (other_statistics, saved_bf16_not_nearest)}


def plant(family: str, rng: np.random.Generator, fmt: str, dtype: str, shape: tuple | None = None,
          m_range: tuple[int, int] = (600, 6000)) -> tuple[dict, dict, Fitted]:
    """(problem, outputs, bug): one bug of ``family`` on a random problem (float32 statistics and gamma)."""
    shape = shape or bugs.random_shape(rng, fmt, m_range)
    problem = zoo.make_problem(rng, shape, fmt, bugs.DTYPES[dtype], np.float32)
    bug = FAMILIES[family](rng, problem, dtype == "f32")
    return problem, bugs.kernel(problem, bug.hooks), bug


FAMILIES = dict(STATISTICS)
