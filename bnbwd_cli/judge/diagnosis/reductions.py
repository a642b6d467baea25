"""Bugs in the reductions and in how diff_src uses them.

The kernel's own sums are what its diff_beta/diff_gamma outputs hold, or, when the run lacks them, what
diff_src implies: a kernel whose sums are off by (dB, dG) in a channel writes diff_src off by
-k*(dB + xhat*dG)/M there, so a per-channel fit of diff_src's deviation to offset + slope*xhat gives
dB = -offset*M/k and dG = -slope*M/k. Each hypothesis predicts those sums (part of the channel missing:
a last partial block, a vector loop's remainder, one block's partial; diff_gamma from x or x - mean; 16-bit
running sums; a mean instead of a sum), then recomputes the outputs from them and is tested as a whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from bnbwd_cli.dtypes import exact_narrower, ulp_spacing
from bnbwd_cli.judge.diagnosis.candidate import (Candidate, channel_fit, channel_line, channel_list, percent,
                                                 sixteen_bit_types)
from bnbwd_cli.judge.diagnosis.measures import share_explained
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.judge.model import running_sum_scale

BLOCKS = tuple(2**k for k in range(1, 14))  # block sizes searched for a lost partial sum: 2 .. 8192
MAX_EMULATED = 1 << 15  # elements per channel up to which a 16-bit running sum is emulated
CLEAR = 4.0  # how much better than the runner-up a lost block or tail must fit its sums


@dataclass(frozen=True)
class SumDeviation:
    """The kernel's sums minus the true ones, per channel, with the noise of each (C,) estimate."""

    beta: np.ndarray
    gamma: np.ndarray
    beta_noise: np.ndarray
    gamma_noise: np.ndarray
    observed: bool  # from the sums the kernel wrote (else implied by diff_src)


def sum_deviation(case: Case) -> SumDeviation | None:
    """The kernel's sums' deviation: measured from the sums the run holds, implied by diff_src for the others
    (None without diff_src and either sum)."""
    k_units = case.max_units
    s_beta, s_gamma = case.facts.sum_scales(case.unit)
    if "diff_beta" in case.outputs and "diff_gamma" in case.outputs:
        b, g = case.outputs["diff_beta"], case.outputs["diff_gamma"]
        noise_b = b.comparison.scaled.max_units * s_beta + ulp_spacing(b.reference, b.comparison.dtype)
        noise_g = g.comparison.scaled.max_units * s_gamma + ulp_spacing(g.reference, g.comparison.dtype)
        return SumDeviation(b.actual - b.reference, g.actual - g.reference, noise_b, noise_g, True)
    if "diff_src" not in case.outputs:
        return None
    offset, slope, rms = channel_fit(case)
    m = case.count
    k = case.facts.scale
    with np.errstate(invalid="ignore", divide="ignore"):
        per = m / np.abs(k)
        fit_noise = 6 * rms / np.sqrt(m) * per
        implied = SumDeviation(-offset * per * np.sign(k), -slope * per * np.sign(k), k_units * s_beta + fit_noise,
                               k_units * s_gamma + fit_noise * np.sqrt(2), False)
    for name in ("diff_beta", "diff_gamma"):  # a sum the run holds is measured, not implied
        if name in case.outputs:
            out = case.outputs[name]
            noise = out.comparison.scaled.max_units * case.sum_scale(name) + ulp_spacing(out.reference, out.comparison.dtype)
            part = "beta" if name == "diff_beta" else "gamma"
            implied = replace(implied, **{part: out.actual - out.reference, f"{part}_noise": noise})
    return implied


def candidates(case: Case) -> Iterator[Candidate]:
    yield from _diff_src_formula(case)
    deviation = sum_deviation(case)
    if deviation is None:
        return
    yield from _missing_part(case, deviation)
    yield from _gamma_from_x(case)
    yield from _sixteen_bit(case, deviation)
    yield from _single_pass(case, deviation)
    yield from _mean_not_sum(case)


def _diff_src_formula(case: Case) -> Iterator[Candidate]:
    if "diff_src" not in case.outputs or not case.outputs["diff_src"].suspicious or not case.inputs.training:
        return
    m = case.count
    if m > 1:
        yield Candidate("missing-1/M", backward_with(case, Ingredients(divisor=1.0)),
                        lambda s: f"missing 1/M: diff_src's mean terms are M = {m} times too large (sums not divided "
                                  f"by M; explains {percent(s.share)} of the deviation)")
    yield Candidate("inference-backward", backward_with(case, Ingredients(inference=True)),
                    lambda s: "inference-style backward in training: diff_src = gamma*invstd*diff_dst, without the "
                              f"mean terms (explains {percent(s.share)} of the deviation)")
    # mean(diff_dst) not subtracted: diff_src is off by +k*diff_beta/M, a constant per channel
    offset, _ = channel_line(case)
    expected = case.facts.scale * case.facts.diff_beta / max(m, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        close = np.abs(offset - expected) <= 0.1 * np.abs(expected)
    hit = np.flatnonzero(close & (np.abs(expected) > 0))
    if hit.size:
        keep = np.ones(case.channels, bool)
        keep[hit] = False
        channels = tuple(int(c) for c in hit)
        everywhere = len(channels) == case.channels
        where = "in every channel" if everywhere else f"in {len(channels)} of {case.channels} channels: {channel_list(channels)}"
        yield Candidate("mean-dy-not-subtracted", backward_with(case, Ingredients(subtract_mean=keep)),
                        lambda s: f"diff_src does not subtract mean(diff_dst) = diff_beta/M {where} "
                                  f"(explains {percent(s.share)} of the deviation)", channels)


def _ordered(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(C, M) float64 terms dy and dy*xhat, each channel's elements in storage order."""
    dy = np.ascontiguousarray(case.dy.transpose(1, 0, 2)).reshape(case.channels, -1)
    terms = np.ascontiguousarray((case.dy * case.xhat).transpose(1, 0, 2)).reshape(case.channels, -1)
    return dy, terms


def _matches(deviation: SumDeviation, lost_beta: np.ndarray, lost_gamma: np.ndarray) -> np.ndarray:
    """Where the kernel's sums are the true ones minus (lost_beta, lost_gamma), within their noise."""
    with np.errstate(invalid="ignore"):
        return ((np.abs(deviation.beta + lost_beta) <= deviation.beta_noise)
                & (np.abs(deviation.gamma + lost_gamma) <= deviation.gamma_noise))


def _misfit(deviation: SumDeviation, c: int, lost_beta: np.ndarray, lost_gamma: np.ndarray) -> np.ndarray:
    """How far channel c's sums are from the true ones minus each candidate's (lost_beta, lost_gamma), in
    units of their noise (<= 1: within it)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.maximum(np.abs(deviation.beta[c] + lost_beta) / deviation.beta_noise[c],
                          np.abs(deviation.gamma[c] + lost_gamma) / deviation.gamma_noise[c])


def _best(misfit: np.ndarray) -> int | None:
    """The one candidate within the noise, or the best of several when it fits CLEAR times better than the
    next (a real match fits to rounding; others within the noise do so by chance); None when unclear."""
    inside = np.flatnonzero(misfit <= 1)
    if inside.size == 0:
        return None
    order = inside[np.argsort(misfit[inside])]
    if order.size > 1 and misfit[order[0]] * CLEAR > misfit[order[1]]:
        return None
    return int(order[0])


def _row(case: Case, c: int, last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Channel c's terms dy and dy*xhat (float64, (M,)) in storage order (_ordered's row c, the same numbers);
    ``last``: only the row's end, whole samples holding at least its last ``last`` elements (a tail's sums need no
    more: the storage order is sample by sample)."""
    n, _, s = case.shape
    samples = slice(0 if last is None else max(0, n - -(-last // max(s, 1))), None)
    dy, xhat = case.channel(c, samples)
    return dy.reshape(-1), (dy * xhat).reshape(-1)


def _tail_sums(row: np.ndarray, t: np.ndarray | int) -> np.ndarray:
    """The sums of a row's last t elements, added from the last one backwards (a reversed running sum: the same
    numbers from any end of the row holding those t, as a running sum adds one element at a time)."""
    t = np.asarray(t)
    return np.cumsum(row[:-int(t.max()) - 1:-1])[t - 1]


def _missing_part(case: Case, deviation: SumDeviation) -> Iterator[Candidate]:
    """Part of each channel's reduction missing: its last t elements (a partial last block, a vector loop's
    remainder), or one block of b elements (a partial sum lost) in some channels."""
    m = case.count
    if m < 2 or case.channels * m > (1 << 26):
        return
    hit = ~_matches(deviation, np.zeros(case.channels), np.zeros(case.channels))
    if not hit.any():
        return
    t = _tail_length(case, deviation, hit)
    if t is not None:
        yield _missing_tail(case, t)
    yield from _lost_block(case, deviation, hit)


def _tail_length(case: Case, deviation: SumDeviation, hit: np.ndarray) -> int | None:
    """The tail length t (1 .. M-1) whose sums, left out, explain every channel's (_best of the worst misfit
    over the channels). The channel farthest from its true sums is tried on every t first: only the lengths
    within its noise there can be within every channel's, so the others are tried on those alone."""
    with np.errstate(invalid="ignore", divide="ignore"):
        far = np.maximum(np.abs(deviation.beta) / deviation.beta_noise, np.abs(deviation.gamma) / deviation.gamma_noise)
    first = int(np.argmax(np.where(hit & np.isfinite(far), far, -np.inf)))  # (any channel when none is finite)
    lengths = np.arange(1, case.count)
    worst = np.zeros(lengths.size)
    for c in [first] + [c for c in range(case.channels) if c != first]:
        dy, terms = _row(case, c, None if c == first else int(lengths.max()))  # (the first: every length)
        worst = np.maximum(worst, _misfit(deviation, c, _tail_sums(dy, lengths), _tail_sums(terms, lengths)))
        keep = worst <= 1
        if not keep.any():
            return None
        lengths, worst = lengths[keep], worst[keep]
    t = _best(np.concatenate([worst, [np.inf]]))  # (the lengths left out fit worse than noise: inf)
    return None if t is None else int(lengths[t])


def _missing_tail(case: Case, t: int) -> Candidate:
    """The last t elements of every channel left out of the sums."""
    m = case.count
    rows = [_row(case, c, t) for c in range(case.channels)]
    tail_beta = np.array([_tail_sums(dy, t) for dy, _ in rows])
    tail_gamma = np.array([_tail_sums(terms, t) for _, terms in rows])
    used = Ingredients(beta=case.facts.diff_beta - tail_beta, gamma_sum=case.facts.diff_gamma - tail_gamma)
    widths = [v for v in (16, 8, 4, 2) if m % v == t]
    blocks = [b for b in BLOCKS if b > t and m % b == t]
    if t < 16 and widths:
        what = (f"a vector loop's remainder was skipped: each channel's sums lack its last {t} element(s) "
                f"(M = {m} = {m // widths[0]}*{widths[0]} + {t})")
    elif t % (m // case.inputs.src.shape[0]) == 0:  # whole samples: the storage order is sample by sample
        n, k = case.inputs.src.shape[0], t // (m // case.inputs.src.shape[0])
        where = f"n={n - 1}" if k == 1 else f"n={n - k}..{n - 1}"
        what = f"each channel's sums lack its last {t} elements: samples {where} (the last {k} of {n})"
    else:
        what = f"each channel's sums lack its last {t} elements: a partial last block was skipped"
        if blocks:
            what += f" (M = {m} leaves {t} after whole blocks of {' or '.join(map(str, blocks[:3]))})"
    return Candidate("missing-tail", backward_with(case, used),
                     lambda s, what=what: f"{what}; recomputed without them: explains {percent(s.share)} of the deviation")


def _block_sums(row: np.ndarray, b: int) -> np.ndarray:
    """A row's sums over blocks of b elements (the last one partial, padded with zeros)."""
    nb = -(-row.size // b)
    return np.pad(row, (0, nb * b - row.size)).reshape(nb, b).sum(axis=1)


def _lost_block(case: Case, deviation: SumDeviation, hit: np.ndarray) -> Iterator[Candidate]:
    """One block of b elements left out of the sums of the deviating channels: the smallest b for which each
    such channel has exactly one block whose sums match what is missing (tried channel by channel: most block
    sizes fail on the first)."""
    m = case.count
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # a channel's terms, formed when first tried
    for b in BLOCKS:
        if b >= m:
            break
        nb = -(-m // b)
        lost = np.full(case.channels, -1)
        missing_beta, missing_gamma = np.zeros(case.channels), np.zeros(case.channels)
        ok = True
        for c in map(int, np.flatnonzero(hit)):
            dy, terms = rows[c] if c in rows else rows.setdefault(c, _row(case, c))
            block_beta, block_gamma = _block_sums(dy, b), _block_sums(terms, b)
            found = _best(_misfit(deviation, c, block_beta, block_gamma))
            if found is None:
                ok = False
                break
            lost[c], missing_beta[c], missing_gamma[c] = found, block_beta[found], block_gamma[found]
        if not ok:
            continue
        channels = tuple(int(c) for c in np.flatnonzero(lost >= 0))
        if all(lost[c] == nb - 1 for c in channels) and len(channels) == case.channels:
            continue  # the last block in every channel: the missing tail above
        used = Ingredients(beta=case.facts.diff_beta - missing_beta, gamma_sum=case.facts.diff_gamma - missing_gamma)
        where = ("every channel" if len(channels) == case.channels
                 else f"{len(channels)} of {case.channels} channels ({channel_list(channels)})")
        indices = sorted({int(lost[c]) for c in channels})
        which = f"block {indices[0]}" if len(indices) == 1 else f"blocks {', '.join(map(str, indices[:4]))}"
        yield Candidate("lost-partial-sum", backward_with(case, used),
                        lambda s, b=b, where=where, which=which: (
                            f"one partial sum of {b} elements is missing from the sums in {where} ({which} of "
                            f"{-(-m // b)}: a lost block or warp result, e.g. a race); recomputed without it: "
                            f"explains {percent(s.share)} of the deviation"), channels)


def _gamma_from_x(case: Case) -> Iterator[Candidate]:
    """diff_gamma = sum dy*x or sum dy*(x - mean) (xhat without invstd); diff_src using it or not."""
    facts = case.facts
    s_beta, s_gamma = facts.sum_scales(case.unit)
    centred = facts.diff_gamma / facts.invstd
    raw = centred + facts.mean * facts.diff_beta
    for label, value, noise in (("x", raw, s_gamma / facts.invstd + np.abs(facts.mean) * s_beta),
                                ("x - mean", centred, s_gamma / facts.invstd)):
        scales = {"diff_gamma": noise}
        for in_src in (False, True):
            used = Ingredients(gamma_sum=value) if in_src else Ingredients(written_gamma=value)
            prediction = backward_with(case, used)
            prediction = Prediction(prediction.diff_src, prediction.diff_gamma, prediction.diff_beta,
                                    {**prediction.sum_scales, **scales}, lean=prediction.lean)
            also = " (and diff_src used it)" if in_src else ""
            yield Candidate("gamma-sum-from-x", prediction,
                            lambda s, label=label, also=also: (
                                f"diff_gamma = sum(diff_dst*({label})) instead of sum(diff_dst*xhat){also}: "
                                f"recomputed that way it explains {percent(s.share)} of the deviation"))


def _running_sum(terms: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Per row, a running sum of float32 terms whose accumulator is rounded to ``dtype`` after each addition."""
    total = np.zeros(terms.shape[0], np.float32)
    for k in range(terms.shape[1]):
        total = (total + terms[:, k]).astype(dtype).astype(np.float32)
    return total.astype(np.float64)


def _sixteen_bit(case: Case, deviation: SumDeviation) -> Iterator[Candidate]:
    """Sums accumulated in a 16-bit type: only with evidence, i.e. the sums written lie on a 16-bit grid
    that the output type does not force, or a 16-bit running sum in storage order reproduces them."""
    if case.count < 64:
        return
    if np.all(_matches(deviation, np.zeros(case.channels), np.zeros(case.channels))):
        return  # the kernel's sums are right: they were not accumulated in 16 bits
    sums = [n for n in ("diff_beta", "diff_gamma") if n in case.outputs]
    suspicious = [n for n in sums if case.outputs[n].suspicious]
    evidence = None
    if suspicious:
        wide = all(case.outputs[n].comparison.actual_dtype in ("f32", "f64") for n in suspicious)
        actual = np.concatenate([case.outputs[n].actual for n in suspicious])
        reference = np.concatenate([case.outputs[n].reference for n in suspicious])
        grid = exact_narrower(actual) if wide else None
        if grid is not None and exact_narrower(reference) is None:
            name = {"bf16": "bfloat16", "f16": "float16"}[grid]
            evidence = f"every value of {' and '.join(suspicious)} lies on the {name} grid, the reference's do not"
    emulated = None
    if case.count <= MAX_EMULATED:
        dy, _ = _ordered(case)
        mean32, invstd32 = case.facts.mean.astype(np.float32), case.facts.invstd.astype(np.float32)
        x32 = np.ascontiguousarray(case.x.transpose(1, 0, 2)).reshape(case.channels, -1).astype(np.float32)
        dy32 = dy.astype(np.float32)
        terms32 = dy32 * ((x32 - mean32[:, None]) * invstd32[:, None])
        for name, dtype in sixteen_bit_types():
            beta, gamma = _running_sum(dy32, dtype), _running_sum(terms32, dtype)
            lost_b, lost_g = case.facts.diff_beta - beta, case.facts.diff_gamma - gamma
            predicted = {"diff_beta": beta, "diff_gamma": gamma}
            if deviation.observed:
                shares = [share_explained(case.outputs[n], predicted[n]) for n in suspicious]
                if shares and min(shares) >= 0.9:
                    emulated, evidence = (beta, gamma), (f"a {name} running sum in storage order reproduces "
                                                        f"{percent(min(shares))} of the sums' deviation")
                    break
            else:
                dev = np.concatenate([deviation.beta, deviation.gamma])
                with np.errstate(invalid="ignore"):
                    share = 1 - np.linalg.norm(dev + np.concatenate([lost_b, lost_g])) / np.linalg.norm(dev)
                if share >= 0.9:
                    emulated, evidence = (beta, gamma), (f"a {name} running sum in storage order reproduces "
                                                        f"{percent(share)} of the sums diff_src implies")
                    break
    if evidence is None:
        return
    if deviation.observed:
        beta, gamma = case.outputs["diff_beta"].actual, case.outputs["diff_gamma"].actual
    else:
        beta, gamma = emulated
    prediction = backward_with(case, Ingredients(beta=beta, gamma_sum=gamma))
    yield Candidate("16-bit-accumulation", prediction,
                    lambda s: f"the sums were accumulated in a 16-bit type: {evidence}; diff_src follows from them "
                              f"(explains {percent(s.share)} of its deviation)")


CANCELLING = 10.0  # |mean|/sd from which a single-pass formula's cancellation is worth naming


def _single_pass(case: Case, deviation: SumDeviation) -> Iterator[Candidate]:
    """diff_gamma as (sum(x*dy) - mean*sum(dy))*invstd: correct in exact arithmetic, but in float32 the two
    terms are |mean|/sd times larger than their difference, so the sum of x*dy carries an error of about
    u*|mean|*(R + sqrt(M)*||dy||)*invstd (R: judge/model's running-sum scale of dy). Named when diff_beta is right, diff_gamma
    is beyond a correct kernel's noise only in channels with |mean|/sd >= CANCELLING, and within K times
    that formula's error everywhere (its signature: no recomputation can reproduce a rounding error's draw)."""
    facts = case.facts
    ratio = np.abs(facts.mean) * facts.invstd
    root = np.sqrt(max(case.count, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        # sum(x*dy) ~ mean*sum(dy): its error is |mean| times a running sum's over dy (judge/model), plus its terms'
        running = running_sum_scale(facts.partial_beta, facts.diff_beta, facts.norm_beta, case.count)
        single = case.max_units * case.unit * ratio * (running + root * facts.norm_beta) + deviation.gamma_noise
        beyond = ~(np.abs(deviation.gamma) <= deviation.gamma_noise)
        if not beyond.any() or not np.all(np.abs(deviation.beta) <= deviation.beta_noise):
            return
        if not np.all(ratio[beyond] >= CANCELLING) or not np.all(np.abs(deviation.gamma) <= single):
            return
        used = np.nanmax(np.abs(deviation.gamma[beyond]) / (single[beyond] - deviation.gamma_noise[beyond]) * case.max_units)
    gamma = facts.diff_gamma + deviation.gamma
    prediction = backward_with(case, Ingredients(gamma_sum=gamma))
    worst = float(np.nanmax(ratio[beyond]))
    channels = tuple(int(c) for c in np.flatnonzero(beyond))
    yield Candidate("single-pass-cancellation", prediction,
                    lambda s: (f"diff_gamma is off only where |mean|/sd is large (up to {worst:.3g}), by at most "
                               f"{used:.2g} units of a single-pass formula's rounding error: sum(x*dy) - mean*sum(dy) "
                               f"loses ~{np.log2(max(worst, 1)):.0f} bits to cancellation; sum((x - mean)*dy) does not"),
                    channels)


def _mean_not_sum(case: Case) -> Iterator[Candidate]:
    """diff_beta or diff_gamma divided by M (a mean) or multiplied by it."""
    m = case.count
    if m < 2:
        return
    for name in ("diff_beta", "diff_gamma"):
        out = case.outputs.get(name)
        if out is None or not out.failed:
            continue
        for factor, said in ((1.0 / m, f"{m} = M times too small: the mean over M, not the sum"),
                             (float(m), f"M = {m} times too large")):
            p = out.reference * factor
            yield Candidate("sum-scaled-by-M", Prediction(**{name: p}),
                            lambda s, name=name, said=said: f"{name} is {said} (explains {percent(s.share)} of the deviation)")
