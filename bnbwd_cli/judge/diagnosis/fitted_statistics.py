"""Other statistics, fitted per channel: the mean and invstd a kernel must have used, found from its outputs.

A correct kernel that used a mean m' and an invstd i' other than the ones given (its own float32 statistics, saved
16-bit ones that are not the nearest 16-bit values, running statistics, a single-pass variance) writes, per
channel, with delta = (m' - m)*invstd (the mean's shift in standard deviations) and eps = i'/invstd - 1:

    diff_src'   = k*((1 + eps)*(dy - B/M) - (1 + eps)**3*(xhat - delta)*(G - delta*B)/M)
    diff_gamma' = (1 + eps)*(G - delta*B)
    diff_beta'  = B

(k = gamma*invstd, B = sum dy, G = sum dy*xhat: exact, since xhat' = (1 + eps)*(xhat - delta)). The two
parameters of every channel are fitted jointly from diff_src (on a fixed sample of its elements) and diff_gamma,
each residual weighted by its error model's noise, by Gauss-Newton from (0, 0): diff_gamma alone cannot tell a
mean shift from an invstd change where B ~ 0, and diff_src alone sees the mean only through terms 1/M smaller
than dy's. The fitted statistics are then a hypothesis like any other: the outputs are recomputed with them
(kernels.backward_with) and assess.assess tests the whole run. The catalogue's named statistics (epsilon, unbiased
variance, own batch statistics, 16-bit statistics) are tested first; this is the model they are special cases of.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import ulp_spacing
from bnbwd_cli.judge.diagnosis.candidate import Candidate, percent, sixteen_bit_types
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.judge.diagnosis.ranges import channel_ranges

SAMPLE = 1 << 16  # diff_src elements the fit reads (every channel, every few samples and positions)
ITERATIONS = 6
SIGNIFICANT = 10.0  # standard errors from which a fitted parameter counts as a deviation (the weights are the
# error model's units, not standard deviations: a correct kernel's fit spreads over about 2 of them)
EVERY = 2.0  # a deviation "in every channel" when all channels' values lie within this factor of their median
MAX_UNITS = 1e4  # float32 units (ulps of the statistic) are said up to this many; beyond, the relative size says it


def sample_rows(shape: tuple[int, int, int], target: int = SAMPLE) -> tuple[slice, slice, slice]:
    """A fixed sample of an (N, C, S) view: every channel, every few samples and positions (about ``target``)."""
    n, _, s = shape
    factor = max(1, -(-int(np.prod(shape)) // target))
    step_n = min(n, factor)
    step_s = min(s, -(-factor // step_n))
    return slice(0, n, step_n), slice(None), slice(0, s, step_s)


def rounding(actual: np.ndarray, reference: np.ndarray, dtype: str) -> np.ndarray:
    """Half an ulp of the output's dtype at the larger of actual and reference: the rounding noise of an element
    of a fit (the actual's rounding, where a bug moved it far from a reference near zero)."""
    return np.maximum(ulp_spacing(np.nan_to_num(actual), dtype), ulp_spacing(reference, dtype)) / 2


@dataclass(frozen=True)
class StatisticsFit:
    """Per channel (C,): the fitted invstd change eps (relative), the mean's shift delta (in sd), their
    standard errors, and the statistics the kernel used (m', i')."""

    eps: np.ndarray
    delta: np.ndarray
    eps_error: np.ndarray
    delta_error: np.ndarray
    mean: np.ndarray
    invstd: np.ndarray


@dataclass(frozen=True)
class _Sample:
    """diff_src's fixed sample as the fit reads it (unusable elements weigh 0), with what the model needs."""

    actual: np.ndarray
    xhat: np.ndarray
    centred: np.ndarray  # dy - B/M
    weight: np.ndarray  # 1/noise**2, scaled by M / the channel's sampled elements (the sample stands for all)
    per_channel: np.ndarray


def _sample(case: Case) -> _Sample:
    rows = sample_rows(case.shape)
    src = case.outputs["diff_src"]
    actual, xhat, dy = src.actual_at(rows), case.xhat_at(rows), case.dy_at(rows)
    noise = case.scale_at(rows) + rounding(src.actual_at(rows), src.reference_at(rows), src.comparison.dtype)
    usable = np.isfinite(actual) & np.isfinite(xhat) & np.isfinite(dy) & (noise > 0) & src.kept(rows)
    weight = np.where(usable, 1.0 / np.where(usable, noise, 1.0) ** 2, 0.0)
    actual, xhat, dy = (np.where(usable, v, 0.0) for v in (actual, xhat, dy))
    per_channel = usable.sum(axis=(0, 2))
    weight = weight * (case.count / np.maximum(per_channel, 1))[None, :, None]
    return _Sample(actual, xhat, dy - (case.facts.diff_beta / case.count)[:, None], weight, per_channel)


def _model(case: Case, sample: _Sample, eps: np.ndarray, delta: np.ndarray):
    """diff_src' on the sample and its derivatives in eps and delta (module docstring), (N, C, S) each."""
    facts, m = case.facts, float(case.count)
    k, b = facts.scale[None, :, None], facts.diff_beta[None, :, None]
    moved = ((facts.diff_gamma - delta * facts.diff_beta) / m)[None, :, None]  # (G - delta*B)/M
    shifted = sample.xhat - delta[None, :, None]
    grow = (1 + eps)[None, :, None]
    p = k * (grow * sample.centred - grow**3 * shifted * moved)
    j_eps = k * (sample.centred - 3 * grow**2 * shifted * moved)
    j_delta = k * grow**3 * (moved + b / m * shifted)
    return p, j_eps, j_delta


def fit_statistics(case: Case) -> StatisticsFit | None:
    """The mean and invstd per channel that best explain diff_src and diff_gamma (None without diff_src)."""
    if "diff_src" not in case.outputs or case.count < 2:
        return None
    facts = case.facts
    sample = _sample(case)
    b, g = facts.diff_beta, facts.diff_gamma
    gamma_out = case.outputs.get("diff_gamma")
    g_weight = np.zeros(case.channels)
    g_actual = g
    if gamma_out is not None:
        g_noise = case.sum_scale("diff_gamma") + ulp_spacing(gamma_out.reference, gamma_out.comparison.dtype) / 2
        g_weight = np.where(np.isfinite(gamma_out.actual) & (g_noise > 0) & gamma_out.kept(),
                            1.0 / np.maximum(g_noise, 1e-300) ** 2, 0.0)
        g_actual = np.where(np.isfinite(gamma_out.actual), gamma_out.actual, 0.0)
    eps, delta = np.zeros(case.channels), np.zeros(case.channels)
    for _ in range(ITERATIONS):  # Gauss-Newton on the (C,) 2x2 normal equations
        p, j_eps, j_delta = _model(case, sample, eps, delta)
        r = sample.actual - p
        w = sample.weight
        gj_eps, gj_delta, gr = g - delta * b, -(1 + eps) * b, g_actual - (1 + eps) * (g - delta * b)
        a11 = np.einsum("ncs,ncs,ncs->c", j_eps, j_eps, w) + g_weight * gj_eps**2
        a12 = np.einsum("ncs,ncs,ncs->c", j_eps, j_delta, w) + g_weight * gj_eps * gj_delta
        a22 = np.einsum("ncs,ncs,ncs->c", j_delta, j_delta, w) + g_weight * gj_delta**2
        r1 = np.einsum("ncs,ncs,ncs->c", j_eps, r, w) + g_weight * gj_eps * gr
        r2 = np.einsum("ncs,ncs,ncs->c", j_delta, r, w) + g_weight * gj_delta * gr
        ridge = 1e-12 * (a11 + a22) + 1e-300
        a11, a22 = a11 + ridge, a22 + ridge
        det = a11 * a22 - a12 * a12
        step_eps = np.nan_to_num((a22 * r1 - a12 * r2) / det)
        step_delta = np.nan_to_num((a11 * r2 - a12 * r1) / det)
        eps, delta = eps + step_eps, delta + step_delta
        if np.all(np.abs(step_eps) <= 1e-3 * np.abs(eps) + 1e-12) and np.all(np.abs(step_delta) <= 1e-3 * np.abs(delta) + 1e-12):
            break
    widen = _widening(case, sample, eps, delta, g_weight * (g_actual - (1 + eps) * (g - delta * b)) ** 2)
    eps_error, delta_error = widen * np.sqrt(np.abs(a22 / det)), widen * np.sqrt(np.abs(a11 / det))
    return StatisticsFit(eps, delta, eps_error, delta_error, facts.mean + delta / facts.invstd, facts.invstd * (1 + eps))


def _widening(case: Case, sample: _Sample, eps: np.ndarray, delta: np.ndarray, gamma_chi: np.ndarray) -> np.ndarray:
    """How much wider than the weights say the standard errors are: where the residuals exceed the noise the
    weights assume (the error model's scale is a bound's unit, not a standard deviation, and the model may leave a
    misfit); diff_gamma's one residual per channel pooled over the channels."""
    r = sample.actual - _model(case, sample, eps, delta)[0]
    spread = np.einsum("ncs,ncs,ncs->c", r, r, sample.weight) / case.count / np.maximum(sample.per_channel - 2, 1) \
        * sample.per_channel
    pooled = float(np.mean(gamma_chi)) if gamma_chi.size else 0.0
    return np.sqrt(np.maximum(np.maximum(spread, 1.0), pooled))


def _significant(values: np.ndarray, errors: np.ndarray) -> np.ndarray:
    return np.isfinite(values) & (np.abs(values) > SIGNIFICANT * errors) & (values != 0)


def _amount(values: np.ndarray, hit: np.ndarray, channels: int, unit: str, per_f32: np.ndarray | None) -> str:
    """e.g. "+6.5e-06 relative (~55 float32 units) in every channel" or "off by -2e-3..+4e-3 sd in c=32..63"."""
    chosen = values[hit]
    f32 = ""
    if per_f32 is not None:
        ulps = np.abs(chosen) / per_f32[hit]
        if np.median(ulps) <= MAX_UNITS:
            f32 = f" (~{np.median(ulps):.0f} float32 units)" if np.max(ulps) <= EVERY * np.median(ulps) \
                else f" ({np.min(ulps):.0f}..{np.max(ulps):.0f} float32 units)"
    median = np.median(chosen)
    if np.all(np.sign(chosen) == np.sign(median)) and np.all(np.abs(chosen) <= EVERY * abs(median)) \
            and np.all(np.abs(chosen) >= abs(median) / EVERY):
        amount = f"{median:+.2g} {unit}{f32}"
    else:
        amount = f"{np.min(chosen):+.2g}..{np.max(chosen):+.2g} {unit}{f32}"
    where = "in every channel" if hit.all() else f"in {channel_ranges(np.flatnonzero(hit), channels)}"
    return f"{amount} {where}"


def describe(case: Case, fit: StatisticsFit) -> str:
    """The fitted deviation in words: each statistic's change where it is significant, "unchanged" elsewhere."""
    facts = case.facts
    c = case.channels
    eps_hit = _significant(fit.eps, fit.eps_error)
    delta_hit = _significant(fit.delta, fit.delta_error)
    with np.errstate(divide="ignore", invalid="ignore"):
        invstd_ulp = np.spacing(np.abs(facts.invstd).astype(np.float32)).astype(np.float64) / np.abs(facts.invstd)
        mean_ulp = np.spacing(np.abs(facts.mean).astype(np.float32)).astype(np.float64) * facts.invstd
    parts = [f"invstd {_amount(fit.eps, eps_hit, c, 'relative', invstd_ulp)}" if eps_hit.any() else "invstd unchanged",
             f"mean {_amount(fit.delta, delta_hit, c, 'sd', mean_ulp)}" if delta_hit.any() else "mean unchanged"]
    return ", ".join(parts)


SNAP = 3.0  # standard errors within which a fitted value is taken to be the 16-bit value next to it


def _snapped(fit: StatisticsFit, facts, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fitted mean and invstd moved to the nearest ``dtype`` values in the channels where both lie within SNAP
    standard errors of them (a kernel that kept its statistics in that type: its saved values, not the nearest
    ones to the given statistics); and those channels."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean16 = fit.mean.astype(dtype).astype(np.float64)
        invstd16 = fit.invstd.astype(dtype).astype(np.float64)
        close = ((np.abs(mean16 - fit.mean) * facts.invstd <= SNAP * fit.delta_error + 1e-300)
                 & (np.abs(invstd16 / fit.invstd - 1) <= SNAP * fit.eps_error + 1e-300))
    return np.where(close, mean16, fit.mean), np.where(close, invstd16, fit.invstd), close


def candidates(case: Case) -> Iterator[Candidate]:
    if "diff_src" not in case.outputs or not any(case.outputs[n].suspicious for n in ("diff_src", "diff_gamma")
                                                   if n in case.outputs):
        return
    if "diff_beta" in case.outputs and case.outputs["diff_beta"].failed:
        return  # other statistics leave diff_beta as it is
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fit = fit_statistics(case)
        if fit is None or not (np.all(np.isfinite(fit.mean)) and np.all(np.isfinite(fit.invstd))):
            return
        said = describe(case, fit)
    if said == "invstd unchanged, mean unchanged":
        return
    hit = _significant(fit.eps, fit.eps_error) | _significant(fit.delta, fit.delta_error)
    channels = () if hit.all() else tuple(int(k) for k in np.flatnonzero(hit))
    advice = "pass the statistics your kernel used (PyTorch: save_mean/save_invstd, with --variance-is-invstd)"
    # first the fit with its values on a 16-bit grid where they lie within the noise of one (a kernel that kept its
    # statistics in that type): the fit alone cannot resolve a bfloat16 output's rounding, the grid can
    for name, dtype in sixteen_bit_types():
        mean, invstd, close = _snapped(fit, case.facts, dtype)
        if not close[hit].all():
            continue
        yield Candidate("fitted-statistics", backward_with(case, Ingredients(mean=mean, invstd=invstd)),
                        lambda s, name=name: (
                            f"your kernel used statistics other than the ones given: {said}, {name} values (fitted "
                            f"per channel; recomputed with the nearest {name} values: explains {percent(s.share)} of "
                            f"the deviation); {advice}"), channels)
    yield Candidate("fitted-statistics", backward_with(case, Ingredients(mean=fit.mean, invstd=fit.invstd)),
                    lambda s: (f"your kernel used statistics other than the ones given: {said} (fitted per channel; "
                               f"recomputed with them: explains {percent(s.share)} of the deviation); {advice}"),
                    channels)
