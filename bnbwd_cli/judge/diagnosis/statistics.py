"""Other statistics than the ones given: variance and invstd confused, an unbiased variance, another
epsilon, the kernel's own batch statistics, a mean or invstd kept in bfloat16/float16; gamma shifted by a
channel, ignored, or applied twice; diff_dst read rounded to bfloat16/float16.

Each is a recomputation of the outputs with those statistics (kernels.backward_with), tested as a whole
(assess.assess). bnbwd knows src and the mean, so it also checks what the `variance` input holds: a
variance of src around the mean, or 1/sqrt(variance + eps) (PyTorch's save_invstd).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bnbwd_cli.dtypes import is_bfloat16, to_float64
from bnbwd_cli.judge.diagnosis.candidate import Candidate, percent, sixteen_bit_types
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import chunks
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.judge.diagnosis.sample import screening_sample
from bnbwd_cli.scratch import Scratch

EPSILONS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 0.0)
INPUT_MATCH = 1e-2  # relative agreement for "the variance input holds invstd"


def batch_variance(case: Case, mean: np.ndarray) -> np.ndarray:
    """Per channel, the mean of (x - mean)^2 over the channel's elements (chunk by chunk, in one buffer: no
    whole float64 copy of src, no fresh pages a chunk)."""
    squares = np.zeros(case.channels)
    scratch = Scratch()
    for part in chunks(case.shape):
        view = case.src3[part]
        buffer = scratch.get("centred", view.shape)
        centred = np.subtract(to_float64(view, out=buffer), mean[:, None], out=buffer)
        squares += np.einsum("ncs,ncs->c", centred, centred)
    return squares / max(case.count, 1)


def own_mean(case: Case) -> np.ndarray:
    """Per channel, the mean of src: np.mean of its float64 values (float32 and float16 src are reduced in float64
    as they are, the same sums as of a float64 copy: no copy is made)."""
    if is_bfloat16(case.src3.dtype):
        return case.x.mean(axis=(0, 2))
    return np.mean(case.src3, axis=(0, 2), dtype=np.float64)


def variance_holds_invstd(case: Case) -> float | None:
    """When the `variance` input is 1/sqrt(var + eps) of src around the mean given (and not var), the
    largest relative difference; else None (computed once a case)."""
    return case.once("variance_holds_invstd", lambda: _variance_holds_invstd(case))


def _variance_holds_invstd(case: Case) -> float | None:
    if case.inputs.variance_is_invstd or case.count < 2:
        return None
    given = to_float64(case.inputs.variance)
    var = batch_variance(case, case.facts.mean)
    with np.errstate(invalid="ignore", divide="ignore"):
        as_invstd = np.max(np.abs(given * np.sqrt(var + case.inputs.epsilon) - 1))
        as_variance = np.max(np.abs(given / var - 1))
    if as_invstd <= INPUT_MATCH and not as_variance <= INPUT_MATCH:
        return float(as_invstd)
    return None


def candidates(case: Case) -> Iterator[Candidate]:
    if not any(case.outputs[n].suspicious for n in ("diff_src", "diff_gamma") if n in case.outputs):
        return
    yield from _variance_invstd(case)
    yield from _scaled_invstd(case)
    if variance_holds_invstd(case) is None:  # else src's own statistics are the right ones: not a bug
        yield from _own_statistics(case)
    yield from _sixteen_bit_statistics(case)
    if "diff_src" in case.outputs and case.outputs["diff_src"].suspicious:
        yield from _gamma(case)
        yield from _sixteen_bit_diff_dst(case)


def _sixteen_bit_diff_dst(case: Case) -> Iterator[Candidate]:
    """diff_dst rounded to bfloat16 or float16 before use (a float32 kernel under autocast, a gradient kept in 16
    bits): screened on diff_src's sample first, where the deviation less k*(dy16 - dy) must leave only a constant and
    a multiple of xhat per channel (the sums' change) within the tolerance; only a survivor is recomputed in full."""
    if case.inputs.diff_dst.dtype.itemsize <= 2 or not case.inputs.training:
        return
    out, sample = case.outputs["diff_src"], screening_sample(case)
    rows = sample.rows
    k = case.facts.scale[None, :, None]
    d = sample.actual - sample.reference
    xhat = case.xhat_at(rows)
    tolerance = out.comparison.scaled.max_units * sample.scale
    for name, dtype in sixteen_bit_types():
        dy = case.dy_at(rows)
        with np.errstate(over="ignore", invalid="ignore"):
            left = d - k * (dy.astype(dtype).astype(np.float64) - dy)
        if not np.all(np.isfinite(left)) or np.linalg.norm(left) > 0.5 * np.linalg.norm(d):
            continue
        # per channel, the least-squares constant and slope in xhat (the sums' change), then what is left
        x0, l0 = xhat - xhat.mean(axis=2, keepdims=True), left - left.mean(axis=2, keepdims=True)
        slope = np.sum(x0 * l0, axis=2, keepdims=True) / np.maximum(np.sum(x0 * x0, axis=2, keepdims=True), 1e-300)
        residual = l0 - slope * x0
        if np.count_nonzero(np.abs(residual) > tolerance) > out.comparison.allowed_mismatches:
            continue
        rounded = np.empty(case.shape)
        for part in chunks(case.shape):
            rows_of = (part, slice(None), slice(None))
            with np.errstate(over="ignore", invalid="ignore"):
                rounded[rows_of] = case.dy_at(rows_of).astype(dtype).astype(np.float64)
        yield Candidate("16-bit-inputs", backward_with(case, Ingredients(dy=rounded)),
                        lambda s, name=name: f"the kernel read diff_dst rounded to {name} (a float32 kernel under "
                                             f"autocast, or a gradient kept in {name}); recomputed with it: explains "
                                             f"{percent(s.share)} of the deviation")


def _variance_invstd(case: Case) -> Iterator[Candidate]:
    given = to_float64(case.inputs.variance)
    eps = case.inputs.epsilon
    if case.inputs.variance_is_invstd:
        with np.errstate(invalid="ignore", divide="ignore"):
            invstd = 1 / np.sqrt(given + eps)
        yield Candidate("invstd-read-as-variance", backward_with(case, Ingredients(invstd=invstd)),
                        lambda s: "the kernel read the invstd input as a variance (took 1/sqrt(it + eps)); recomputed "
                                  f"that way: explains {percent(s.share)} of the deviation")
        return
    holds = variance_holds_invstd(case)
    prediction = backward_with(case, Ingredients(invstd=given))
    if holds is not None:
        yield Candidate("variance-holds-invstd", prediction,
                        lambda s: f"the `variance` input holds invstd: it equals 1/sqrt(var + eps) of src around the mean "
                                  f"within {holds:.1e} (relative); pass --variance-is-invstd (the kernel used it as invstd: "
                                  f"explains {percent(s.share)} of the deviation)")
    else:
        yield Candidate("variance-read-as-invstd", prediction,
                        lambda s: "the kernel used the variance input as invstd; recomputed that way: explains "
                                  f"{percent(s.share)} of the deviation")


def _scaled_invstd(case: Case) -> Iterator[Candidate]:
    """An unbiased variance or another epsilon."""
    if case.inputs.variance_is_invstd:
        return
    v, m, eps = to_float64(case.inputs.variance), case.count, case.inputs.epsilon
    if m > 1:
        with np.errstate(invalid="ignore", divide="ignore"):
            invstd = 1 / np.sqrt(v * m / (m - 1) + eps)
        yield Candidate("unbiased-variance", backward_with(case, Ingredients(invstd=invstd)),
                        lambda s: f"an unbiased variance (divided by M-1 = {m - 1}, not M) explains the scale "
                                  f"({percent(s.share)} of the deviation)")
    fitted = _fitted_epsilon(case)
    for candidate in EPSILONS + (() if fitted is None else (fitted,)):
        if candidate == eps:
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            invstd = 1 / np.sqrt(v + candidate)
        how = " (fitted to the scale)" if candidate == fitted else ""
        yield Candidate("epsilon", backward_with(case, Ingredients(invstd=invstd)),
                        lambda s, e=candidate, how=how: f"an epsilon of {e:g}{how} (you passed {eps:g}) explains the "
                                                        f"scale ({percent(s.share)} of the deviation)")


def _fitted_epsilon(case: Case) -> float | None:
    """The epsilon whose invstd scale matches the fitted systematic scale of diff_src (else diff_gamma):
    sqrt((v + eps) / (v + e)) - 1 averaged over the channels, solved for e >= 0 by bisection."""
    scale = None
    for name in ("diff_src", "diff_gamma"):
        out = case.outputs.get(name)
        if out is not None and out.comparison.bias is not None and out.comparison.bias.significant:
            scale = out.comparison.bias.scale
            break
    if scale is None:
        return None
    v, eps = to_float64(case.inputs.variance), case.inputs.epsilon

    def predicted(e: float) -> float:
        return float(np.mean(np.sqrt((v + eps) / (v + e)) - 1))

    low, high = 0.0, 1.0
    if not predicted(high) <= scale <= predicted(low):
        return None
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if predicted(middle) > scale else (low, middle)
    fitted = float(f"{0.5 * (low + high):.2g}")
    return fitted if fitted != eps and fitted not in EPSILONS else None


def _deviation_text(case: Case, mean: np.ndarray, invstd: np.ndarray) -> str:
    """The implied per-channel deviation of the statistics the kernel used from the ones passed."""
    facts = case.facts
    with np.errstate(invalid="ignore", divide="ignore"):
        dm = np.nanmax(np.abs(mean - facts.mean) * facts.invstd)
        di = np.nanmax(np.abs(invstd / facts.invstd - 1))
    parts = ([f"mean off by up to {dm:.1e} sd"] if dm > 0 else []) + (
        [f"invstd by up to {di:.1e} (relative)"] if di > 0 else [])
    return " and ".join(parts) + " per channel"


def _own_statistics(case: Case) -> Iterator[Candidate]:
    if case.count < 2:
        return
    mean = own_mean(case)
    var = batch_variance(case, mean)
    with np.errstate(invalid="ignore", divide="ignore"):
        invstd = 1 / np.sqrt(var + case.inputs.epsilon)
    said = _deviation_text(case, mean, invstd)
    yield Candidate("own-batch-statistics", backward_with(case, Ingredients(mean=mean, invstd=invstd)),
                    lambda s: f"the kernel used src's own batch statistics, not the ones passed ({said}); "
                              f"recomputed with them: explains {percent(s.share)} of the deviation; pass the batch "
                              "mean and variance the forward pass saved")


def _sixteen_bit_statistics(case: Case) -> Iterator[Candidate]:
    facts = case.facts
    for name, dtype in sixteen_bit_types():
        with np.errstate(over="ignore", invalid="ignore"):
            mean16 = facts.mean.astype(dtype).astype(np.float64)
            invstd16 = facts.invstd.astype(dtype).astype(np.float64)
        for which, mean, invstd in (("mean and invstd", mean16, invstd16), ("mean", mean16, None),
                                    ("invstd", None, invstd16)):
            if (mean is None or np.array_equal(mean, facts.mean)) and (invstd is None or np.array_equal(invstd, facts.invstd)):
                continue
            said = _deviation_text(case, facts.mean if mean is None else mean, facts.invstd if invstd is None else invstd)
            yield Candidate("16-bit-statistics", backward_with(case, Ingredients(mean=mean, invstd=invstd)),
                            lambda s, which=which, name=name, said=said: (
                                f"the kernel kept the {which} in {name} ({said}); recomputed with them: explains "
                                f"{percent(s.share)} of the deviation; pass the {which} it used (its saved "
                                f"{name} tensors, with --variance-is-invstd for an invstd)"))


def _gamma(case: Case) -> Iterator[Candidate]:
    gamma = case.gamma
    if case.inputs.gamma is None or case.channels < 1:
        return
    shifted = [(np.roll(gamma, -1), "gamma[c+1]"), (np.roll(gamma, 1), "gamma[c-1]")]
    if case.channels > 1:
        shifted += [(np.concatenate([gamma[1:], gamma[-1:]]), "gamma[c+1]"),
                    (np.concatenate([gamma[:1], gamma[:-1]]), "gamma[c-1]")]
    for used, label in shifted:
        yield Candidate("gamma-off-by-one", backward_with(case, Ingredients(gamma=used)),
                        lambda s, label=label: f"gamma is off by one channel: the kernel used {label} (recomputed "
                                               f"that way: explains {percent(s.share)} of the deviation)")
    yield Candidate("gamma-ignored", backward_with(case, Ingredients(gamma=np.ones_like(gamma))),
                    lambda s: "gamma was ignored (taken as 1, as with affine off): recomputed that way it explains "
                              f"{percent(s.share)} of the deviation")
    yield Candidate("gamma-applied-twice", backward_with(case, Ingredients(gamma=gamma * gamma)),
                    lambda s: "gamma was applied twice (gamma^2): recomputed that way it explains "
                              f"{percent(s.share)} of the deviation")
