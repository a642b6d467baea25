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


def formula_terms(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """diff_src = k*(a*dy - b*mean(dy) - c*xhat*mean(dy*xhat)) with recognisable (a, b, c): a sign, a missing term,
    M-1 or another count M' for M, the whole output scaled; or coefficients no word fits."""
    c = problem["mean"].shape[0]
    m = problem["src"].size // c
    n = problem["src"].shape[0]
    kinds = ["xhat-sign", "mean-sign", "no-xhat-term", "count", "scaled", "unrecognised"] + (["m-1"] if wide else [])
    kind = str(rng.choice(kinds))
    words = {"xhat-sign": ((1, 1, -1), "the xhat*mean(dy*xhat) term has its sign flipped"),
             "mean-sign": ((1, -1, 1), "the mean(dy) term has its sign flipped"),
             "no-xhat-term": ((1, 1, 0), "it lacks the xhat*mean(dy*xhat) term"),
             "m-1": ((1, m / (m - 1), m / (m - 1)), f"divide by M' = {m - 1} (M-1) instead of M = {m}"),
             "count": ((1, n, n), f"divide by M' = {m // n} (one sample's positions) instead of M = {m}")}
    if kind in words:
        coefficients, said = words[kind]
    elif kind == "scaled":
        scale = float(rng.choice([0.5, 2.0, round(float(rng.uniform(0.6, 0.9)), 3)]))
        coefficients, said = (scale, scale, scale), "diff_src is " + {0.5: "scaled by 0.5", 2.0: "scaled by 2"}.get(
            scale, f"scaled by {scale:.4g}")
    else:
        coefficients = (1.0, round(float(rng.uniform(1.3, 1.8)), 3), round(float(rng.uniform(0.2, 0.4)), 3))
        said = "fitted coefficients"
    return Fitted(f"terms-{kind}", "fitted-terms", {"coefficients": coefficients}, {"coefficients": coefficients, "words": said})


def parameter_factor(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """diff_src with an extra factor invstd, or without its invstd (k = gamma), in every channel."""
    power = int(rng.choice([1, -1]))
    factor = _given(problem)[1] ** power
    said = "an extra factor invstd" if power == 1 else "no factor invstd (k = gamma)"
    return Fitted("parameter-factor", "fitted-terms", {"coefficients": (factor, factor, factor)}, {"words": said})


def sum_factor(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """A sum written as a factor of the true one (diff_src uses the true sums): negated, doubled or halved in every
    channel or a few, times gamma or invstd per channel."""
    c = problem["mean"].shape[0]
    name = str(rng.choice(["diff_beta", "diff_gamma"]))
    kind = str(rng.choice(["negated", "doubled", "halved", "gamma", "invstd", "some"]))
    value = {"negated": -1.0, "doubled": 2.0, "halved": 0.5}
    symbol = "sum(dy)" if name == "diff_beta" else "sum(dy*xhat)"
    channels: tuple[int, ...] = ()
    if kind in value:
        factor, said = value[kind], f"{kind} {symbol} in every channel"
    elif kind == "gamma":
        factor, said = problem["gamma"].astype(np.float64), f"gamma*{symbol}"
    elif kind == "invstd":
        factor, said = _given(problem)[1], f"invstd*{symbol}"
    else:
        channels = tuple(_subset(rng, c))
        factor = np.ones(c)
        factor[list(channels)] = -1.0
        said = f"negated {symbol} in {channel_ranges_of(channels, c)} only"
    return Fitted(f"sum-{kind}", "fitted-terms", {"sum_factors": {name: factor}}, {"words": f"{name} = {said}"},
                  channels)


def sum_used(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """A sum negated (or doubled) and used so by diff_src: diff_src's coefficient and the sum's factor agree."""
    name = str(rng.choice(["diff_beta", "diff_gamma"]))
    factor = float(rng.choice([-1.0, 2.0]))
    return Fitted("sum-used", "fitted-terms", {"sum_factors": {name: factor}, "sums_in_src": True},
                  {"words": "the sums written are off the same way"})


def sums_wrong(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """A random share of the elements (1-20%) left out of both sums in a run of channels, diff_src computed from those
    sums: the elementwise pass is right, the sums are wrong there."""
    c = problem["mean"].shape[0]
    first = int(rng.integers(0, c - 1))
    last = int(rng.integers(first, c))
    channels = tuple(range(first, last + 1))
    dropped = {ch: float(rng.uniform(0.01, 0.2)) for ch in channels}
    return Fitted("sums-wrong", "sums-wrong", {"dropped": dropped}, {"words": channel_ranges_of(channels, c)}, channels)


def swapped_sums(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """One sum written in the other's place (or both swapped); diff_src uses the right sums."""
    kind = int(rng.integers(3))
    written_as = ({"diff_gamma": "diff_beta"}, {"diff_beta": "diff_gamma"},
                  {"diff_gamma": "diff_beta", "diff_beta": "diff_gamma"})[kind]
    words = ("diff_gamma holds sum(dy)", "diff_beta holds sum(dy*xhat)", "diff_beta and diff_gamma are swapped")[kind]
    return Fitted("swapped-sums", "output-in-another-place", {"written_as": written_as}, {"words": words})


OWN = {f.__name__: f for f in (sums_wrong, swapped_sums)}


def channel_ranges_of(channels, c: int) -> str:
    from bnbwd_cli.judge.diagnosis.ranges import channel_ranges

    return channel_ranges(channels, c)


def one_term(rng: np.random.Generator, problem: dict, wide: bool) -> Fitted:
    """One term of diff_src off alone: the xhat term divided by M-1 (float32 only: a 16-bit output cannot resolve
    M/(M-1)), or a term with a factor invstd or gamma of its own, or without its invstd (TensorFlow's x_offset
    form with one invstd left out: c = 1/invstd)."""
    c = problem["mean"].shape[0]
    m = problem["src"].size // c
    invstd, gamma = _given(problem)[1], problem["gamma"].astype(np.float64)
    kinds = ["lacks-invstd", "extra-invstd", "extra-gamma"] + (["xhat-m-1"] if wide else [])
    kind = str(rng.choice(kinds))
    term = int(rng.choice([1, 2])) if kind != "lacks-invstd" else 2
    name = ("dy", "mean(dy)", "xhat*mean(dy*xhat)")[term]
    coefficients: list = [1.0, 1.0, 1.0]
    if kind == "xhat-m-1":
        coefficients[2] = m / (m - 1)
        said = f"the xhat*mean(dy*xhat) term divides by M-1 instead of M = {m}"
    else:
        factor, said = {"lacks-invstd": (1 / invstd, "lacks a factor invstd"),
                        "extra-invstd": (invstd, "has an extra factor invstd"),
                        "extra-gamma": (gamma, "has an extra factor gamma")}[kind]
        coefficients[term] = factor
        said = f"the {name} term {said} in every channel"
    return Fitted(f"one-term-{kind}", "fitted-terms", {"coefficients": tuple(coefficients)}, {"words": said})


TERMS = {f.__name__: f for f in (formula_terms, parameter_factor, sum_factor, sum_used, one_term)}


def plant(family: str, rng: np.random.Generator, fmt: str, dtype: str, shape: tuple | None = None,
          m_range: tuple[int, int] = (600, 6000)) -> tuple[dict, dict, Fitted]:
    """(problem, outputs, bug): one bug of ``family`` on a random problem (float32 statistics and gamma)."""
    shape = shape or bugs.random_shape(rng, fmt, m_range)
    problem = zoo.make_problem(rng, shape, fmt, bugs.DTYPES[dtype], np.float32)
    bug = FAMILIES[family](rng, problem, dtype == "f32")
    return problem, bugs.kernel(problem, bug.hooks), bug


FAMILIES = {**STATISTICS, **TERMS, **OWN}
