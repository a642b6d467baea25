"""The formula's terms with fitted coefficients: diff_src = k*(a*dy - b*mean(dy) - c*xhat*mean(dy*xhat)), and each
sum written as a factor times the true one (diff_beta = beta*sum dy, diff_gamma = g*sum dy*xhat).

a, b, c are fitted by weighted least squares on a fixed sample of diff_src (every channel), one triple for the
whole output, and per channel where one triple does not explain it; each sum's factor per output and per channel.
Recognisable values become words: a sign (-1), a missing term (0), M-1 or another count M' for M (b = c = M/M'), a
whole output scaled (a = b = c), a factor of gamma or invstd per channel; the outputs are recomputed with those
values (exactly) and tested by assess.assess like any hypothesis. When no word fits, the fitted coefficients are
shown, but only when one triple for the whole output explains the run (a triple per channel explains too much).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import ulp_spacing, unit_roundoff
from bnbwd_cli.judge.diagnosis.candidate import Candidate, percent
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from bnbwd_cli.judge.diagnosis.fitted_statistics import rounding, sample_rows
from bnbwd_cli.judge.diagnosis.ranges import channel_ranges

MATCH = 6.0  # standard errors within which a fitted coefficient is a recognisable value
RELATIVE = 2.5e-7  # and this relative slack: ~4 float32 unit roundoffs (a kernel rounds its parameters and factors to float32)
RESOLVE = 0.25  # of the output's unit roundoff: a coefficient's effect below it is not resolved
FLOOR = 4 * 2.0**-24  # nor below ~4 float32 unit roundoffs of the output (a float32 kernel's correlated roundings:
# a term 1e-6 of the output, as where sum(dy*xhat) ~ 0, has its coefficient biased by them)
TERMS = ("dy", "mean(dy)", "xhat*mean(dy*xhat)")


@dataclass(frozen=True)
class TermsFit:
    """(C, 3) coefficients (a, b, c) per channel and their standard errors; ``whole``: one triple for all."""

    coefficients: np.ndarray
    errors: np.ndarray  # standard errors, widened by the residuals' spread
    resolution: np.ndarray  # (C, 3): the change of each coefficient the output's precision cannot resolve
    whole: bool


def _basis(case: Case, rows) -> tuple[np.ndarray, ...]:
    """The three terms of diff_src on ``rows`` (each k times dy, -B/M, -xhat*G/M)."""
    facts, m = case.facts, float(case.count)
    k = facts.scale[None, :, None]
    dy, xhat = case.dy_at(rows), case.xhat_at(rows)
    return (k * dy, np.broadcast_to(-k * (facts.diff_beta / m)[None, :, None], dy.shape),
            -k * xhat * (facts.diff_gamma / m)[None, :, None])


def fit_terms(case: Case, whole: bool) -> TermsFit | None:
    """a, b, c by weighted least squares on diff_src's fixed sample: one triple (``whole``) or one per channel."""
    if "diff_src" not in case.outputs or not case.inputs.training:
        return None
    rows = sample_rows(case.shape)
    out = case.outputs["diff_src"]
    actual = out.actual_at(rows)
    noise = case.scale_at(rows) + rounding(out.actual_at(rows), out.reference_at(rows), out.comparison.dtype)
    basis = _basis(case, rows)
    usable = np.isfinite(actual) & (noise > 0) & np.all([np.isfinite(v) for v in basis], axis=0) & out.kept(rows)
    weight = np.where(usable, 1.0 / np.where(usable, noise, 1.0) ** 2, 0.0)
    actual = np.where(usable, actual, 0.0)
    basis = [np.where(usable, v, 0.0) for v in basis]
    normal = np.stack([np.stack([np.einsum("ncs,ncs,ncs->c", u, v, weight) for v in basis], -1) for u in basis], -2)
    right = np.stack([np.einsum("ncs,ncs,ncs->c", u, actual, weight) for u in basis], -1)
    counts = usable.sum(axis=(0, 2)).astype(float)
    if whole:
        normal, right, counts = normal.sum(0, keepdims=True), right.sum(0, keepdims=True), counts.sum(keepdims=True)
    ridge = 1e-12 * np.trace(normal, axis1=1, axis2=2)[:, None, None] * np.eye(3) + 1e-300 * np.eye(3)
    try:
        inverse = np.linalg.inv(normal + ridge)
    except np.linalg.LinAlgError:
        return None
    coefficients = np.einsum("cij,cj->ci", inverse, right)
    fitted = sum(coefficients[:, i][None, :, None] * basis[i] for i in range(3)) if not whole else \
        sum(coefficients[0, i] * basis[i] for i in range(3))
    residual = np.einsum("ncs,ncs,ncs->c", actual - fitted, actual - fitted, weight)
    if whole:
        residual = residual.sum(keepdims=True)
    spread = np.maximum(residual / np.maximum(counts - 3, 1), 1.0)
    errors = np.sqrt(np.abs(np.diagonal(inverse, axis1=1, axis2=2)) * spread[:, None])
    resolution = _resolution(out, actual, basis, weight > 0, whole)
    if whole:
        coefficients, errors, resolution = (np.repeat(v, case.channels, axis=0) for v in (coefficients, errors, resolution))
    return TermsFit(coefficients, errors, resolution, whole)


def _resolution(out, actual: np.ndarray, basis: list, usable: np.ndarray, whole: bool) -> np.ndarray:
    """Per term, the coefficient change that moves the output by RESOLVE of its dtype's unit roundoff, or FLOOR (rms
    over the sample): finer than that, the output's rounding biases the fit and no value can be told from its
    neighbour."""
    axes = (0, 1, 2) if whole else (0, 2)
    counts = np.maximum(usable.sum(axis=axes), 1)
    size = np.sqrt((actual**2).sum(axis=axes) / counts)
    terms = [np.sqrt((v**2).sum(axis=axes) / counts) for v in basis]
    with np.errstate(divide="ignore", invalid="ignore"):
        finest = max(RESOLVE * unit_roundoff(out.comparison.dtype), FLOOR)
        out_of = np.stack([finest * size / t for t in terms], -1)
    out_of = np.where(np.isfinite(out_of), out_of, np.inf)
    return out_of.reshape(1, 3) if whole else out_of


def close(value, error, target) -> np.ndarray:
    """Is ``value`` the ``target`` within its error: MATCH standard errors plus what the output cannot resolve
    (``error`` is a standard error, or a (standard error, resolution) pair)."""
    se, resolution = error if isinstance(error, tuple) else (error, 0.0)
    value, target = np.asarray(value, float), np.asarray(target, float)
    return np.abs(value - target) <= MATCH * np.asarray(se) + np.asarray(resolution) \
        + RELATIVE * np.maximum(np.abs(target), 1e-3)


def nearest(value: float, error, targets) -> float | None:
    """The target ``value`` is closest to among those it is close to (None: none)."""
    near = [t for t in targets if close(value, error, t)]
    return min(near, key=lambda t: abs(value - t)) if near else None


def counts_of(case: Case) -> dict[int, str]:
    """Element counts a kernel might divide by instead of M, with what they are (from the shape)."""
    n, m = case.inputs.src.shape[0], case.count
    named = {m - 1: "M-1", m + 1: "M+1", n: "N, the batch size", m // max(n, 1): "one sample's positions"}
    return {k: v for k, v in named.items() if k > 0 and k != m}


def _count(case: Case, ratio: float, error: float) -> int | None:
    """M' where ratio = M/M' for a whole count M' (within the fit's error), else None."""
    if not ratio > 0:
        return None
    m = case.count
    guess = round(m / ratio)
    if guess < 1 or guess == m:
        return None
    return guess if close(ratio, error, m / guess) and not close(ratio, error, 1.0) else None


def _value_words(v: float) -> str:
    """4 digits, or 1 + the difference where that is small (1+3e-06, not 1)."""
    return f"1{v - 1:+.2g}" if 0 < abs(v - 1) < 1e-2 else f"{v:.4g}"


WORDS = {0.0: "it lacks the {} term", -1.0: "the {} term has its sign flipped (added, not subtracted)",
         2.0: "the {} term is doubled", 0.5: "the {} term is halved", 1.0: ""}


def describe_triple(case: Case, coefficients: np.ndarray, errors) -> tuple[np.ndarray, str] | None:
    """Words for one triple (a, b, c) and the exact values they stand for, or None when no word fits. ``errors``:
    (3,) standard errors and (3,) resolutions."""
    se, resolution = errors
    a, b, c = coefficients
    one = [(float(se[i]), float(resolution[i])) for i in range(3)]
    m = case.count
    if close(a, one[0], b) and close(a, one[0], c) and close(b, one[1], c) and not close(a, one[0], 1.0):
        if close(a, one[0], -1.0):
            return np.array([-1.0] * 3), "diff_src is negated (every term's sign flipped)"
        if close(a, one[0], 0.0):
            return np.zeros(3), "diff_src is zero"
        s = float(a)
        return np.array([s] * 3), f"diff_src is scaled by {_value_words(s)} (every term)"
    if not close(a, one[0], 1.0):
        return None  # the dy term itself is off: only a whole-output scale above is a word for that
    if close(b, one[1], c) and not close(b, one[1], 1.0) and not close(b, one[1], 0.0):
        shown = _count(case, float(b), one[1])
        if shown is not None and close(c, one[2], m / shown):
            what = counts_of(case).get(shown)
            said = f" ({what})" if what else ""
            return (np.array([1.0, m / shown, m / shown]),
                    f"the mean terms divide by M' = {shown}{said} instead of M = {m} (b = c = M/M' = {m / shown:.6g})")
    exact, words = [1.0], []
    counts = {m / k: f"{what} (M' = {k})" if not what.startswith("M") else what for k, what in counts_of(case).items()}
    for name, value, error in ((TERMS[1], b, one[1]), (TERMS[2], c, one[2])):
        target = nearest(float(value), error, WORDS)
        if target is None:  # one term divided by another count (M-1 in the xhat term only)
            target = nearest(float(value), error, counts)
            if target is None:
                return None
            words.append(f"the {name} term divides by {counts[target]} instead of M = {m} (its coefficient "
                         f"M/M' = {target:.6g})")
        elif WORDS[target]:
            words.append(WORDS[target].format(name))
        exact.append(target)
    return (np.array(exact), "diff_src: " + "; ".join(words)) if words else None


def _whole_scale(case: Case, guess: float) -> float:
    """diff_src = s*reference, s fitted by weighted least squares on the sample (the triple's common value ``guess``
    when that fails): one parameter instead of three terms, so it resolves s to the output's own rounding (a
    float64 kernel's scale by 1+3e-6 is fitted to ~1e-16, where the triple's terms leave ~1e-12, hundreds of
    float64 units on the output)."""
    out = case.outputs["diff_src"]
    rows = sample_rows(case.shape)
    actual, reference = out.actual_at(rows), out.reference_at(rows)
    noise = case.scale_at(rows) + rounding(actual, reference, out.comparison.dtype)
    usable = np.isfinite(actual) & np.isfinite(reference) & (noise > 0) & out.kept(rows)
    if not usable.any():
        return guess
    weight = 1.0 / noise[usable] ** 2
    r, a = reference[usable], actual[usable]
    normal = float(np.sum(weight * r * r))
    return float(np.sum(weight * r * a) / normal) if normal > 0 else guess


def _triple_text(coefficients) -> str:
    a, b, c = coefficients
    return (f"diff_src = gamma*invstd*({a:.4g}*dy - {b:.4g}*mean(dy) - {c:.4g}*xhat*mean(dy*xhat)) "
            "(fitted coefficients; 1, 1, 1 is right)")


def _src_prediction(case: Case, coefficients: np.ndarray):
    """diff_src with (C, 3) coefficients, computed on first use, with its error scale: a correct kernel's,
    each term's part scaled by its coefficient."""
    facts, u, m = case.facts, case.unit, float(case.count)
    s_beta, s_gamma = facts.sum_scales(u)

    def diff_src(rows):
        a, b, c = (coefficients[:, i][None, :, None] for i in range(3))
        k = facts.scale[None, :, None]
        dy, xhat = case.dy_at(rows), case.xhat_at(rows)
        mean_dy, mean_g = (facts.diff_beta / m)[None, :, None], (facts.diff_gamma / m)[None, :, None]
        value = k * (a * dy - b * mean_dy - c * xhat * mean_g)
        noise = np.abs(k) * (u * np.abs(a * dy) + np.abs(b) * ((u * np.abs(facts.diff_beta) + s_beta) / m)[None, :, None]
                             + np.abs(c * xhat) * ((u * np.abs(facts.diff_gamma) + s_gamma) / m)[None, :, None])
        return value, noise

    return diff_src


def _sums_prediction(case: Case, coefficients: np.ndarray) -> dict:
    """diff_beta and diff_gamma as diff_src's kernel would write them when its sums are off by b and c."""
    out = {}
    if "diff_beta" in case.outputs:
        out["diff_beta"] = case.facts.diff_beta * coefficients[:, 1]
    if "diff_gamma" in case.outputs:
        out["diff_gamma"] = case.facts.diff_gamma * coefficients[:, 2]
    return out


def src_candidates(case: Case) -> Iterator[Candidate]:
    """diff_src's terms: one triple for the whole output (in words, then as numbers), then per channel in words."""
    src = case.outputs.get("diff_src")
    if src is None or not src.suspicious:
        return
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fit = fit_terms(case, whole=True)
    if fit is None:
        return
    words = describe_triple(case, fit.coefficients[0], (fit.errors[0], fit.resolution[0]))
    if words is not None:
        exact, said = words
        if np.all(exact == exact[0]) and exact[0] not in (0.0, -1.0):
            exact = np.full(3, _whole_scale(case, float(exact[0])))  # one scale: fitted directly, far finer
        coefficients = np.repeat(exact[None], case.channels, axis=0)
        yield from _with_sums(case, coefficients, said)
    if not np.all(close(fit.coefficients[0], (fit.errors[0], fit.resolution[0]), 1.0)):
        said = _triple_text(fit.coefficients[0])
        yield from _with_sums(case, fit.coefficients, said)
    yield from _per_channel(case)


def _with_sums(case: Case, coefficients: np.ndarray, said: str) -> Iterator[Candidate]:
    """diff_src with these coefficients, the sums as given; then with sums the same coefficients scale (the kernel
    wrote the sums it used; for a whole-output scale, every output scaled alike)."""
    src = Prediction(diff_src=_src_prediction(case, coefficients))
    yield Candidate("fitted-terms", src, lambda s: f"{said}; recomputed that way: explains {percent(s.share)} of the "
                                                   "deviation")
    sums = _sums_prediction(case, coefficients)
    if not sums or np.all(coefficients[:, 1:] == 1.0):
        return
    both = Prediction(diff_src=_src_prediction(case, coefficients), **sums)
    scale = coefficients[0, 0]
    if np.all(coefficients == scale):
        text = f"every output is scaled by {_value_words(scale)} (diff_src's terms and the sums alike)"
    else:
        text = (f"{said}, and the sums written are off the same way (diff_beta = b*sum(dy), "
                "diff_gamma = c*sum(dy*xhat))")
    yield Candidate("fitted-terms", both, lambda s: f"{text}; recomputed that way: explains {percent(s.share)} of the "
                                                    "deviation")


def _per_channel(case: Case) -> Iterator[Candidate]:
    """One triple per channel: an extra factor gamma or invstd (or their inverse) in every channel or in the channels
    whose triple is not (1, 1, 1) (a tile of channels without gamma), or those channels sharing one triple in
    words."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fit = fit_terms(case, whole=False)
    if fit is None:
        return
    coefficients, errors = fit.coefficients, (fit.errors, fit.resolution)
    gamma, invstd = case.gamma, case.facts.invstd
    factors = [(gamma, "an extra factor gamma (gamma applied twice)"), (1 / gamma, "no factor gamma (k = invstd)"),
               (invstd, "an extra factor invstd"), (1 / invstd, "no factor invstd (k = gamma)")]
    right = np.all(close(coefficients, errors, 1.0), axis=1)
    for factor, said in factors:
        fits = np.all(close(coefficients, errors, factor[:, None]), axis=1)
        if np.allclose(factor, 1.0) or not np.all(fits | right):
            continue
        hit = np.flatnonzero(fits & ~right)
        if hit.size == 0:
            continue
        exact = np.ones((case.channels, 3))
        exact[hit] = factor[hit, None]  # (a channel where the factor is 1 either way is not one of them)
        where = "every channel" if hit.size == case.channels else f"{channel_ranges(hit, case.channels)} only"
        yield from _with_sums(case, exact, f"diff_src has {said} in {where}")
    for i in (1, 2):  # one term with a factor of its own in every channel (a term missing an invstd: TF's x_offset)
        others = [j for j in range(3) if j != i]
        if not np.all(close(coefficients[:, others], (fit.errors[:, others], fit.resolution[:, others]), 1.0)):
            continue
        for factor, said in ((invstd, "an extra factor invstd"), (1 / invstd, "lacks a factor invstd"),
                             (gamma, "an extra factor gamma"), (1 / gamma, "lacks a factor gamma")):
            if np.allclose(factor, 1.0) or not np.all(close(coefficients[:, i], (fit.errors[:, i], fit.resolution[:, i]),
                                                            factor)):
                continue
            exact = np.ones((case.channels, 3))
            exact[:, i] = factor
            verb = "has " if said.startswith("an") else ""
            yield from _with_sums(case, exact, f"diff_src: the {TERMS[i]} term {verb}{said} in every channel")
    right = np.all(close(coefficients, errors, 1.0), axis=1)
    hit = np.flatnonzero(~right)
    if hit.size == 0 or hit.size == case.channels:
        return
    inverse = 1 / np.maximum(fit.errors[hit], 1e-300) ** 2
    pooled = np.average(coefficients[hit], axis=0, weights=inverse)
    pooled_error = (np.sqrt(1 / np.sum(inverse, axis=0)), np.max(fit.resolution[hit], axis=0))
    if not np.all(close(coefficients[hit], (fit.errors[hit], fit.resolution[hit]), pooled[None])):
        return
    words = describe_triple(case, pooled, pooled_error)
    if words is None:
        return
    exact, said = words
    per = np.ones((case.channels, 3))
    per[hit] = exact
    yield from _with_sums(case, per, f"in {channel_ranges(hit, case.channels)} only: {said}")


def _ratio_words(ratio: float, error: float) -> tuple[float, str] | None:
    for target, said in ((-1.0, "negated"), (0.0, "zero"), (2.0, "doubled"), (0.5, "halved")):
        if close(ratio, error, target):
            return target, said
    return None


def sum_candidates(case: Case) -> Iterator[Candidate]:
    """Each failing sum as a factor times the true one (one factor for the output; gamma, invstd or their inverse
    per channel; a factor in some channels only; a fitted factor), both sums together when both fail; diff_src as
    given."""
    options = {name: _sum_factors(case, name) for name in ("diff_beta", "diff_gamma")
               if name in case.outputs and case.outputs[name].suspicious}
    names = list(options)
    if len(names) == 1:
        combos = [((names[0], option),) for option in options[names[0]]]
    else:
        combos = [tuple(zip(names, pair)) for pair in
                  ((x, y) for x in options.get("diff_beta", []) for y in options.get("diff_gamma", []))]
    for combo in combos:
        truth = {"diff_beta": case.facts.diff_beta, "diff_gamma": case.facts.diff_gamma}
        said = "; ".join(f"{name} = {words}" for name, (_, words) in combo)
        prediction = Prediction(**{name: truth[name] * factor for name, (factor, _) in combo})
        yield Candidate("fitted-terms", prediction,
                        lambda s, said=said: f"{said}; diff_src uses the right sums (recomputed that way: explains "
                                             f"{percent(s.share)} of the deviation)")


def _sum_factors(case: Case, name: str) -> list[tuple[np.ndarray, str]]:
    """(factor per channel, words) options for a sum written as a factor times the true one."""
    out = case.outputs[name]
    truth = case.facts.diff_beta if name == "diff_beta" else case.facts.diff_gamma
    noise = case.sum_scale(name) + ulp_spacing(out.reference, out.comparison.dtype) / 2
    usable = np.isfinite(out.actual) & (np.abs(truth) > 0) & out.kept()
    if not usable.any():
        return []
    with np.errstate(invalid="ignore", divide="ignore"):
        weight = np.where(usable, truth**2 / noise**2, 0.0)
        ratios = np.where(usable, out.actual / truth, 0.0)
        errors = np.where(usable, noise / np.abs(truth), np.inf)
        whole = float(np.sum(weight * ratios) / np.sum(weight))
        spread = np.sum(weight * (ratios - whole) ** 2) / max(int(usable.sum()) - 1, 1)
        whole_error = float(np.sqrt(1 / np.sum(weight) * max(1.0, spread)))
    symbol = "sum(dy)" if name == "diff_beta" else "sum(dy*xhat)"
    options = []
    words = _ratio_words(whole, whole_error)
    if words is not None:
        options.append((np.full(case.channels, words[0]), f"{words[1]} {symbol} in every channel"))
    gamma, invstd = case.gamma, case.facts.invstd
    for factor, said in ((gamma, f"gamma*{symbol}"), (1 / gamma, f"{symbol}/gamma"), (invstd, f"invstd*{symbol}"),
                         (1 / invstd, f"{symbol}/invstd")):
        if not np.allclose(factor, 1.0) and np.all(close(ratios[usable], errors[usable], factor[usable])):
            options.append((factor, f"{said} (a factor per channel)"))
    hit = np.flatnonzero(~(close(ratios, errors, 1.0) | ~usable))
    if 0 < hit.size < case.channels:
        pooled = float(np.average(ratios[hit], weights=weight[hit]))
        some = _ratio_words(pooled, float(np.max(errors[hit])))
        if some is not None and np.all(close(ratios[hit], errors[hit], some[0])):
            factor = np.ones(case.channels)
            factor[hit] = some[0]
            options.append((factor, f"{some[1]} {symbol} in {channel_ranges(hit, case.channels)} only"))
    if not options and abs(whole - 1) > 3 * whole_error and np.all(close(ratios[usable], errors[usable], whole)):
        shown = _value_words(whole)
        shown = f"({shown})" if "+" in shown or "-" in shown[1:] else shown
        options.append((np.full(case.channels, whole), f"{shown}*{symbol} (a fitted factor, every channel)"))
    return options


def candidates(case: Case) -> Iterator[Candidate]:
    yield from src_candidates(case)
    yield from sum_candidates(case)
