"""The kernel's own outputs against each other: one sum written in the other's place, and diff_src recomputed from
the kernel's own diff_beta and diff_gamma (if that explains diff_src, the elementwise pass is right and the sums are
wrong: said with the channels where each sum is off, as ranges).

These are the last tier of hypotheses (coarser statements than a named cause or a fitted model). When nothing
explains a run, ``observations`` adds what the outputs say about each other: the sums pass but diff_src fails (the
bug is in the elementwise pass), diff_src passes but a sum fails (the sums written are wrong, not the ones used),
or an output with no relation to these inputs (uncorrelated with the reference).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.judge.diagnosis.candidate import Candidate, deviating_channels, percent
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from bnbwd_cli.judge.diagnosis.fitted_statistics import sample_rows
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.judge.diagnosis.ranges import channel_ranges

UNRELATED = 0.05  # |correlation| with the reference below which an output has no relation to these inputs
SUMS = ("diff_beta", "diff_gamma")


def candidates(case: Case) -> Iterator[Candidate]:
    yield from _swapped(case)
    yield from _sums_wrong(case)


def _swapped(case: Case) -> Iterator[Candidate]:
    """diff_gamma written where diff_beta belongs, or the reverse, or both swapped; diff_src from the right sums or
    from the ones written."""
    if not all(name in case.outputs for name in SUMS) or not any(case.outputs[n].failed for n in SUMS):
        return
    beta, gamma = case.facts.diff_beta, case.facts.diff_gamma
    for written, said in (({"diff_gamma": beta}, "diff_gamma holds sum(dy): diff_beta written in its place"),
                          ({"diff_beta": gamma}, "diff_beta holds sum(dy*xhat): diff_gamma written in its place"),
                          ({"diff_gamma": beta, "diff_beta": gamma}, "diff_beta and diff_gamma are swapped")):
        yield Candidate("output-in-another-place", Prediction(**written),
                        lambda s, said=said: f"{said}; diff_src uses the right sums (recomputed that way: explains "
                                             f"{percent(s.share)} of the deviation)")
        if "diff_src" in case.outputs:
            used = backward_with(case, Ingredients(beta=written.get("diff_beta", beta),
                                                   gamma_sum=written.get("diff_gamma", gamma)))
            yield Candidate("output-in-another-place", used,
                            lambda s, said=said: f"{said}, and diff_src used them so (recomputed that way: explains "
                                                 f"{percent(s.share)} of the deviation)")


def _sums_wrong(case: Case) -> Iterator[Candidate]:
    """diff_src recomputed from the kernel's own sums (the true ones where the run lacks a sum)."""
    if "diff_src" not in case.outputs or not case.inputs.training:
        return
    held = [n for n in SUMS if n in case.outputs]
    wrong = [n for n in held if case.outputs[n].suspicious]
    if not wrong or not all(np.all(np.isfinite(case.outputs[n].actual)) for n in held):
        return
    beta = case.outputs["diff_beta"].actual if "diff_beta" in case.outputs else None
    gamma = case.outputs["diff_gamma"].actual if "diff_gamma" in case.outputs else None
    prediction = backward_with(case, Ingredients(beta=beta, gamma_sum=gamma))
    where = []
    for name in wrong:
        hit = np.flatnonzero(deviating_channels(case, name))
        where.append(f"{name} in {channel_ranges(hit, case.channels)}" if hit.size else f"{name} (a systematic scale)")
    channels = tuple(sorted({int(c) for n in wrong for c in np.flatnonzero(deviating_channels(case, n))}))
    share = random_share(case, np.array(channels, dtype=np.int64))
    yield Candidate("sums-wrong", prediction,
                    lambda s: (f"diff_src follows from the kernel's own sums (recomputed from its "
                               f"{' and '.join(held)}: explains {percent(s.shares.get('diff_src', 1.0))} of diff_src's "
                               f"deviation): the elementwise pass is right, the sums are wrong: {'; '.join(where)}"
                               + share),
                    channels)


RANDOM_CHANNELS = 4  # channels hit below which a random share is not tested (too few deviations to judge them)
RANDOM_Z = 5.0  # no deviation further than this many standard deviations from the share's expectation
RANDOM_ELEMENTS = 4  # a share of fewer elements a channel than this is no share (rounding errors fit one below)


def random_share(case: Case, channels: np.ndarray) -> str:
    """Words for a random share of each hit channel's elements missing from both sums (or counted twice), when the
    sums' deviations fit one: for elements dropped at random with probability p, a sum T of terms t deviates by
    -p*T on average with variance p(1-p)*sum(t^2) (norm_beta, norm_gamma: no pass over the data). p solves the
    second moments over both sums and the hit channels; accepted when it holds RANDOM_ELEMENTS elements a channel or
    more, every deviation is within RANDOM_Z standard deviations and their mean square is within 4 standard errors
    of 1 (a chi-square). Missing and counted twice differ only in the mean, often too small to tell: then both are
    said. "" when not."""
    if channels.size < RANDOM_CHANNELS or not all(n in case.outputs for n in SUMS):
        return ""
    facts = case.facts
    d = np.concatenate([case.outputs[n].actual[channels] - case.outputs[n].reference[channels] for n in SUMS])
    t = np.concatenate([facts.diff_beta[channels], facts.diff_gamma[channels]])
    q = np.concatenate([facts.norm_beta[channels], facts.norm_gamma[channels]]) ** 2
    noise = np.concatenate([case.sum_scale(n)[channels] for n in SUMS]) ** 2
    if not (np.all(np.isfinite(d)) and np.sum(q) > 0):
        return ""
    found = []
    for sign, verb in ((-1.0, "missing from"), (1.0, "counted twice in")):
        # sum d^2 = p^2 sum T^2 + p(1-p) sum Q (+ noise): the root in (0, 1)
        a, b, c = float(np.sum(t * t) - np.sum(q)), float(np.sum(q)), -float(np.sum(d * d) - np.sum(noise))
        roots = np.roots([a, b, c]) if abs(a) > 1e-300 else np.array([-c / b])
        for p in roots[np.isreal(roots)].real:
            if not 0 < p < 1 or p * case.count < RANDOM_ELEMENTS:
                continue
            with np.errstate(invalid="ignore", divide="ignore"):
                z = (d - sign * p * t) / np.sqrt(p * (1 - p) * q + noise)
            k = z.size
            if np.all(np.abs(z) <= RANDOM_Z) and abs(float(np.mean(z * z)) - 1) <= 4 * np.sqrt(2 / k):
                found.append((float(np.mean(z * z)), p, verb))
    if not found:
        return ""
    verbs = sorted({verb for _, _, verb in found})
    p = min(found)[1]
    spread = p * np.sqrt(2 / d.size)  # its standard error: the second moment of k deviations is known to sqrt(2/k)
    which = verbs[0] if len(verbs) == 1 else "missing from (or counted twice in)"
    where = "every channel" if channels.size == case.channels else channel_ranges(channels, case.channels)
    return (f"; consistent with a random share of about {100 * p:.2g}% (± {100 * spread:.1g}%) of each channel's "
            f"elements {which} both sums in {where} (no pattern: lost or repeated atomic adds?)")


def observations(case: Case, name: str) -> str:
    """What the outputs say about each other when no hypothesis explains ``name`` ("" when nothing)."""
    out = case.outputs[name]
    said = []
    unrelated = _correlation(case, name)
    if unrelated is not None and abs(unrelated) < UNRELATED:
        said.append(f"{name} has no relation to these inputs: its correlation with the reference is {unrelated:.2g} "
                    "(the output of another call, or of other inputs?)")
    held = [n for n in SUMS if n in case.outputs]
    if name == "diff_src" and out.failed and len(held) == 2 and not any(case.outputs[n].suspicious for n in held):
        said.append("diff_beta and diff_gamma pass, so the sums are right: the bug is in the elementwise pass "
                    "that writes diff_src")
    src = case.outputs.get("diff_src")
    if name in SUMS and out.failed and src is not None and not src.suspicious:
        said.append("diff_src passes, so the kernel used the right sums: the bug is in the sums written")
    zeros = _zeros_where_failing(out)
    if zeros is not None:
        said.append(f"every failing element is 0 where the reference is not (|reference| up to {zeros:.2g} there): "
                    "values flushed to zero below a threshold, or never written?")
    return "".join(f"; {s}" for s in said)


def _zeros_where_failing(out) -> float | None:
    """The largest |reference| among the failing elements when every one of them is an exact 0 in the output (a
    fact about the failures, not a cause), else None."""
    if not out.failed or not out.some_beyond:
        return None
    given = out.given[out.beyond]
    if given.size == 0 or np.any(given != 0):
        return None
    return float(np.max(np.abs(to_float64(out.expected[out.beyond]))))


def _correlation(case: Case, name: str) -> float | None:
    """Pearson correlation of actual with the reference (on diff_src's fixed sample), None when undefined."""
    out = case.outputs[name]
    if name == "diff_src":
        rows = sample_rows(case.shape)
        a, r = out.actual_at(rows).reshape(-1), out.reference_at(rows).reshape(-1)
    else:
        a, r = out.actual, out.reference
    usable = np.isfinite(a) & np.isfinite(r)
    if usable.sum() < 8:
        return None
    a, r = a[usable] - a[usable].mean(), r[usable] - r[usable].mean()
    norm = np.sqrt(np.dot(a, a) * np.dot(r, r))
    return float(np.dot(a, r) / norm) if norm > 0 else None
