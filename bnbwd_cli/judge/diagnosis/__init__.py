"""Why a kernel's outputs fail: causes tested against the data, never guessed.

Pure: arrays in, frozen dataclasses out. ``diagnose`` runs only when an output of the op failed or showed a
significant systematic deviation. Each family module proposes hypotheses (``Candidate``: a cause and the
outputs a kernel with that bug would produce); ``assess.assess`` accepts one only when it explains the whole
run (diff_src, diff_gamma and diff_beta together) down to the error model's rounding noise, and the hint
reports how much of the deviation it explains. The first accepted hypothesis, in the order below (the most
specific first), names the cause; when none is accepted the hint says so and points at the worst channels.

Families: writes.py (unwritten channels, sign flips, swapped spatial axes, the other layout, truncation),
reductions.py (missing 1/M, inference-style, mean(dy) not subtracted, part of a reduction missing,
diff_gamma from x, 16-bit sums, a mean for a sum), statistics.py (variance/invstd confused, unbiased
variance, epsilon, own batch statistics, 16-bit statistics, gamma shifted/ignored/doubled), subsets.py (a
subset of the reduction missing or counted twice, found by search), params.py (gamma, mean or invstd read at
another channel or along another axis), groups.py (diff_src from the sums of groups of samples alone). Then, only when none of those explains, the fitted models (FITTED):
fitted_statistics.py (the mean and invstd used, per channel), terms.py (the formula's terms and the sums with
fitted coefficients), and last own_outputs.py (one sum in the other's place; diff_src from the kernel's own
sums: the sums are wrong).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from bnbwd_cli.judge.diagnosis import (fitted_statistics, groups, own_outputs, params, reductions, statistics,
                                       subsets, terms, writes)
from bnbwd_cli.judge.diagnosis.candidate import Candidate, channel_list, deviating_channels
from bnbwd_cli.judge.diagnosis.assess import assess
from bnbwd_cli.judge.diagnosis.build import build_case
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Assessment
from bnbwd_cli.judge.model import ChannelFacts
from bnbwd_cli.judge.comparison import Comparison, Hint

__all__ = ["diagnose", "Hint"]

AMBIGUOUS = 2.0  # another cause leaving at most this many times the best one's unexplained share: no name
MIN_COUNT = 8  # elements per channel below which no cause is named
MAX_ELEMENTS = 1 << 24  # src elements beyond which no hypothesis is tested (some families hold whole float64 copies)


# Fitted models (a parameter per channel or per term, fitted to the data), tried only when no named cause is
# accepted (a named cause is the same explanation with nothing fitted), in tiers: the models of a tier are rivals
# (two that explain the run equally well: "ambiguous"), a later tier (a coarser statement) is tried only when no
# model of an earlier one explains.
FITTED = ((fitted_statistics.candidates, terms.candidates), (own_outputs.candidates,))


def _candidates(case: Case) -> Iterator[Candidate]:
    yield from writes.candidates(case)
    yield from reductions.candidates(case)
    yield from subsets.candidates(case)
    yield from statistics.candidates(case)
    yield from params.candidates(case)
    yield from groups.candidates(case)


def diagnose(inputs, facts: ChannelFacts,
             outputs: Mapping[str, tuple[np.ndarray, np.ndarray, Comparison]]) -> dict[str, tuple[Hint, ...]]:
    """Hints per output name for the op's outputs judged by the error model (name -> (actual, reference,
    comparison)); empty when every output passed without a significant systematic deviation."""
    judged = {n: v for n, v in outputs.items() if v[2].scaled is not None}
    if not any(c.suspicious for _, _, c in judged.values()):
        return {}
    if inputs.src.size > MAX_ELEMENTS:
        hint = Hint("not-diagnosed", f"no cause tested: src has {inputs.src.size} elements, more than the "
                                     f"{MAX_ELEMENTS} the diagnosis holds in memory; a smaller case with the same "
                                     "kernel gets one")
        return {name: (hint,) for name, (_, _, c) in judged.items() if c.suspicious}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        case = build_case(inputs, facts, judged)
        suspicious = case.suspicious
        if case.count < MIN_COUNT:  # xhat takes a value or two: many bugs predict the same outputs
            hint = Hint("unexplained", f"M = {case.count} elements per channel are too few to tell causes apart")
            return {name: (hint,) for name in suspicious}
        accepted, tested = _test(case, _candidates(case))
        for tier in FITTED:  # the fitted models, only when no named cause explains the run; the first tier wins
            if accepted:
                break
            for model in tier:  # each model's first accepted candidate; the models of a tier are rivals
                found, more = _test(case, model(case), first=True)
                accepted, tested = accepted + found, tested + more
        if accepted:
            hint = _choose(accepted)
            return {name: (hint,) for name in suspicious}
        extra = _input_notes(case)
        return {name: extra + (_unexplained(case, name, tested),) for name in suspicious}


def _test(case: Case, candidates: Iterator[Candidate], first: bool = False) -> tuple[list[tuple[Candidate, Assessment]], int]:
    """The candidates accepted by assess.assess, and how many were tested. ``first``: stop at the first accepted
    (a fitted tier yields its most specific model first; each acceptance reads the whole run)."""
    accepted = []
    tested = 0
    for candidate in candidates:
        tested += 1
        assessment = assess(case, candidate.prediction)
        if assessment is not None:
            accepted.append((candidate, assessment))
            if first:
                break
    return accepted, tested


def _choose(accepted: list) -> Hint:
    """The best-explaining hypothesis; when another cause explains nearly as well (what it leaves is at most
    AMBIGUOUS times what the best leaves), the data cannot tell them apart and neither is named. When only a
    systematic scale is at stake (no element failed), the shares are estimates within their standard
    errors: there another cause is a rival unless the best one's prediction, rounded to the output's grid,
    misses at most half as many elements of the actual output."""
    ranked = sorted(accepted, key=lambda pair: (pair[1].misses, -pair[1].share) if pair[1].statistical
                    else (-pair[1].share,))
    best, assessment = ranked[0]
    left = 1.0 - assessment.share
    rivals = [c for c, a in ranked[1:] if c.cause != best.cause
              and (a.misses <= AMBIGUOUS * assessment.misses if assessment.statistical
                   else 1.0 - a.share <= AMBIGUOUS * max(left, 1e-3))]
    if rivals:
        names = ", ".join(sorted({best.cause, *(c.cause for c in rivals)}))
        return Hint("ambiguous", f"several tested hypotheses explain the deviation equally well ({names}): "
                                 "the data cannot tell them apart")
    return Hint(best.cause, best.text(assessment), best.channels)


def _input_notes(case: Case) -> tuple[Hint, ...]:
    """Facts about the inputs worth saying even when no hypothesis explains the outputs."""
    holds = statistics.variance_holds_invstd(case)
    if holds is None:
        return ()
    return (Hint("variance-holds-invstd", f"the `variance` input holds invstd: it equals 1/sqrt(var + eps) of src "
                                          f"around the mean within {holds:.1e} (relative); pass --variance-is-invstd"),)


def _unexplained(case: Case, name: str, tested: int) -> Hint:
    out = case.outputs[name]
    what = "its systematic deviation" if not out.failed else "the deviation"
    text = f"no tested hypothesis ({tested} tried) explains {what} of {name}"
    channels: tuple[int, ...] = ()
    if out.failed:
        hit = deviating_channels(case, name)
        channels = tuple(int(c) for c in np.flatnonzero(hit))
        if 0 < len(channels) < case.channels:
            text += f"; it fails in {len(channels)} of {case.channels} channels: {channel_list(channels)}"
        elif channels:
            text += "; it fails in every channel"
    text += own_outputs.observations(case, name)
    return Hint("unexplained", text, channels)
