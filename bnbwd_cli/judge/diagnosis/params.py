"""Per-channel parameters read at the wrong place: gamma, the mean or invstd (or the variance it comes from) of
channel c taken from another index, or indexed by another axis of the same length.

The index maps tried: a shift by k (wrapped around, or clamped at the ends), the channels reversed, a stride
(c*s mod C, s coprime to C), c XOR 2^j (the halves of a vector load swapped), and a grouping of the channels as
(a, C/a) read transposed. The mean and invstd may be read there together (an off-by-one into a packed array of
statistics), and invstd in the elementwise pass alone (the sums computed with the right one): there diff_src's
per-channel terms are a = b = rho, c = rho^2 with rho = invstd[π]/invstd (terms.fit_terms, one triple a channel). Each map predicts
something cheap to check first: gamma[π]/gamma is the ratio of diff_src to the reference in every channel
(gamma scales it and touches no sum); a mean read at π moves the sum of dy*xhat by invstd*(mean - mean[π])*
sum(dy), an invstd read there scales it by invstd[π]/invstd. Only the maps that fit those per-channel numbers
within their noise are recomputed and tested as every hypothesis is (assess.assess). gamma[c±1] is
statistics.py's own cause (gamma-off-by-one). A parameter indexed by an axis of the tensor as long as C
(gamma[h] when H = C) is recomputed with the parameter taken element by element along that axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from bnbwd_cli.judge.diagnosis import terms
from bnbwd_cli.judge.diagnosis.candidate import Candidate, channel_ratio, percent
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Prediction
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.judge.diagnosis.reductions import sum_deviation
from bnbwd_cli.judge.diagnosis.subsets import channel_shape

RATIO_MATCH = 1e-2  # relative agreement of diff_src's per-channel ratio with gamma[π]/gamma
MAX_CHANNELS = 4096  # beyond this many channels no map is searched (the maps grow as C)
NAMES = {"gamma": "gamma", "mean": "the mean", "invstd": "invstd (or the variance it comes from)",
         "both": "the mean and invstd (both)", "elementwise": "invstd (or the variance it comes from), in the "
         "elementwise pass only (the sums use the right one),"}


def index_maps(channels: int) -> list[tuple[str, np.ndarray]]:
    """(words, π) for every map tried, each distinct map once (the first words for it), the identity excluded."""
    c = np.arange(channels)
    found: list[tuple[str, np.ndarray]] = []
    for k in range(1, channels):
        shift = k if k <= channels // 2 else k - channels
        found.append((f"c{shift:+d} (wrapped around)", (c + k) % channels))
    for k in range(1, channels):
        found.append((f"c+{k} (clamped at the last channel)", np.minimum(c + k, channels - 1)))
        found.append((f"c-{k} (clamped at channel 0)", np.maximum(c - k, 0)))
    found.append(("C-1-c (the channels reversed)", channels - 1 - c))
    for s in range(2, channels):
        if math.gcd(s, channels) == 1:
            found.append((f"c*{s} mod {channels} (a stride of {s})", (c * s) % channels))
    k = 1
    while 2 * k <= channels:  # c XOR k: the halves of a vector load swapped (float2 at k = 1), channel blocks swapped
        if channels % (2 * k) == 0:
            what = "neighbouring channels swapped in pairs" if k == 1 else f"blocks of {k} channels swapped in pairs"
            found.append((f"c XOR {k} ({what})", c ^ k))
        k *= 2
    for a in range(2, channels):
        if channels % a == 0 and a < channels:
            b = channels // a
            found.append((f"(c mod {a})*{b} + c//{a} (channels grouped {b}x{a}, read transposed)", (c % a) * b + c // a))
    distinct, seen = [], {c.tobytes()}
    for words, index in found:
        key = index.tobytes()
        if key not in seen:
            seen.add(key)
            distinct.append((words, index))
    return distinct


def candidates(case: Case) -> Iterator[Candidate]:
    if case.channels < 3 or case.channels > MAX_CHANNELS:
        return
    maps = index_maps(case.channels)
    table = np.array([index for _, index in maps])  # (maps, C)
    yield from _gamma_maps(case, maps, table)
    yield from _statistic_maps(case, maps, table)
    yield from _elementwise_maps(case, maps, table)
    yield from _dy_maps(case)
    yield from _other_axis(case)


def _few_maps(channels: int) -> list[tuple[str, np.ndarray]]:
    """The maps a per-element input is tried at (each a recomputation screened on the sample): shifts by 1..3
    wrapped, by 1 clamped, the channels reversed, c XOR 1."""
    return [(words, index) for words, index in index_maps(channels)
            if words.startswith(("c+1 ", "c-1 ", "c+2 ", "c-2 ", "c+3 ", "c-3 ", "C-1-c", "c XOR 1 "))
            and ("clamped" not in words or words.startswith(("c+1 ", "c-1 ")))]


def _dy_maps(case: Case) -> Iterator[Candidate]:
    """diff_dst read at another channel by the elementwise pass alone (the sums right): diff_src is
    k*(dy[π] - B/M - xhat*G/M), computed at the rows a test reads."""
    src = case.outputs.get("diff_src")
    if src is None or not src.failed or not case.inputs.training:
        return
    facts, m = case.facts, float(case.count)
    k = facts.scale[None, :, None]
    mean_dy, mean_g = (facts.diff_beta / m)[None, :, None], (facts.diff_gamma / m)[None, :, None]
    for words, index in _few_maps(case.channels):
        def diff_src(rows, index=index):
            # rows hold every channel in order (blocks, chunks, the screening sample): channel c's read goes to index[c]
            moved = (rows[0], index[rows[1]], rows[2])
            with np.errstate(invalid="ignore", over="ignore"):
                return k * (case.dy_at(moved) - mean_dy - case.xhat_at(rows) * mean_g), None

        text = (f"the elementwise pass read diff_dst at the wrong channel: dy[{words}] for channel c (the sums use "
                "the right one)")
        yield Candidate("parameter-misread", Prediction(diff_src=diff_src),
                        lambda s, text=text: f"{text}; recomputed that way: explains {percent(s.share)} of the deviation")


def _gamma_maps(case: Case, maps: list, table: np.ndarray) -> Iterator[Candidate]:
    out = case.outputs.get("diff_src")
    if out is None or not out.failed or case.inputs.gamma is None:
        return
    gamma = case.gamma
    ratio = channel_ratio(case)
    with np.errstate(invalid="ignore", divide="ignore"):
        predicted = gamma[table] / gamma  # (maps, C)
        fits = np.all(np.abs(ratio - predicted) <= RATIO_MATCH * np.maximum(np.abs(predicted), 1e-3), axis=1)
    c = np.arange(case.channels)
    near = {index.tobytes() for index in ((c + 1) % case.channels, (c - 1) % case.channels,
                                          np.minimum(c + 1, case.channels - 1), np.maximum(c - 1, 0))}
    yielded: set[bytes] = set()
    for i in np.flatnonzero(fits):
        words, index = maps[i]
        used = gamma[index]
        if index.tobytes() in near or used.tobytes() in yielded or np.array_equal(used, gamma):
            continue  # gamma[c±1]: gamma-off-by-one; the same values another map gave
        yielded.add(used.tobytes())
        yield _candidate(case, "gamma", words, Ingredients(gamma=used))


def _statistic_maps(case: Case, maps: list, table: np.ndarray) -> Iterator[Candidate]:
    """The mean or invstd read at π: first the sum of dy*xhat it implies, against the kernel's (measured from
    diff_gamma, or implied by diff_src)."""
    if not any(case.outputs[n].suspicious for n in ("diff_src", "diff_gamma") if n in case.outputs):
        return
    deviation = sum_deviation(case)
    if deviation is None or case.count < 2:
        return
    facts = case.facts
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if not np.any(np.abs(deviation.gamma) > deviation.gamma_noise):
            return
        grow = facts.invstd[table] / facts.invstd
        shifted = {
            "mean": facts.invstd * (facts.mean - facts.mean[table]) * facts.diff_beta,
            "invstd": facts.diff_gamma * (grow - 1),
            # sum dy*(x - m')*i' = (i'/i)*(G + i*(m - m')*B), less G
            "both": grow * (facts.diff_gamma + facts.invstd * (facts.mean - facts.mean[table]) * facts.diff_beta)
            - facts.diff_gamma,
        }
    for name, moved in shifted.items():
        with np.errstate(invalid="ignore"):
            fits = np.all(np.abs(deviation.gamma - moved) <= deviation.gamma_noise, axis=1)
        yielded: set[bytes] = set()
        for i in np.flatnonzero(fits):
            words, index = maps[i]
            used = {n: getattr(facts, n)[index] for n in (("mean", "invstd") if name == "both" else (name,))}
            key = b"".join(v.tobytes() for v in used.values())
            if key in yielded or all(np.array_equal(v, getattr(facts, n)) for n, v in used.items()):
                continue
            if name == "both" and any(np.array_equal(v, getattr(facts, n)) for n, v in used.items()):
                continue  # one of the two as given: the single statistic's own candidate
            yielded.add(key)
            yield _candidate(case, name, words, Ingredients(**used))


def _elementwise_maps(case: Case, maps: list, table: np.ndarray) -> Iterator[Candidate]:
    """invstd read at π in the elementwise pass alone, the sums computed with the right one: diff_src's terms per
    channel are then a = b = rho and c = rho^2, rho = invstd[π]/invstd; only the maps whose rho every channel's
    fitted triple holds (within its errors) are recomputed."""
    out = case.outputs.get("diff_src")
    if out is None or not out.failed or not case.inputs.training:
        return
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fit = case.once("terms per channel", lambda: terms.fit_terms(case, whole=False))
        if fit is None:
            return
        facts = case.facts
        rho = facts.invstd[table] / facts.invstd  # (maps, C)
        a, b, c = (fit.coefficients[:, i] for i in range(3))
        one = [(fit.errors[:, i], fit.resolution[:, i]) for i in range(3)]
        fits = (np.all(terms.close(a, one[0], rho), axis=1) & np.all(terms.close(b, one[1], rho), axis=1)
                & np.all(terms.close(c, one[2], rho**2), axis=1))
    yielded: set[bytes] = set()
    for i in np.flatnonzero(fits):
        words, index = maps[i]
        used = facts.invstd[index]
        if used.tobytes() in yielded or np.array_equal(used, facts.invstd):
            continue
        yielded.add(used.tobytes())
        yield _candidate(case, "elementwise", words,
                         Ingredients(invstd=used, beta=facts.diff_beta, gamma_sum=facts.diff_gamma))


def _candidate(case: Case, name: str, words: str, used: Ingredients) -> Candidate:
    symbol = {"both": "mean and invstd", "elementwise": "invstd"}.get(name, name)
    text = f"{NAMES[name]} read at the wrong channel: the kernel used {symbol}[{words}] for channel c"
    return Candidate("parameter-misread", backward_with(case, used),
                     lambda s, text=text: f"{text}; recomputed that way: explains {percent(s.share)} of the deviation")


def _other_axis(case: Case) -> Iterator[Candidate]:
    """gamma or the mean indexed by another axis of the same length as C (n, or a spatial one)."""
    shape = channel_shape(case)
    names = ("n",) + {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}.get(len(shape) - 1, tuple(f"x{i}" for i in range(len(shape) - 1)))
    for axis, axis_name in enumerate(names):
        if shape[axis] != case.channels:
            continue
        along = _along(case, shape, axis)  # each element's coordinate on that axis, broadcast to the (N, C, S) view
        if case.inputs.gamma is not None and "diff_src" in case.outputs and case.outputs["diff_src"].failed:
            yield _gamma_along(case, along, axis_name)
        if any(case.outputs[n].suspicious for n in case.outputs):
            yield _mean_along(case, along, axis_name)


def _along(case: Case, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """(N, C, S)-broadcastable int array: each element's coordinate on ``axis`` of its channel's (N, *spatial)."""
    coordinate = np.indices(shape)[axis]
    if case.inputs.data_format == "NCX":
        return coordinate.reshape(shape[0], 1, -1)
    return coordinate.reshape(-1, 1, 1)


def _gamma_along(case: Case, along: np.ndarray, axis_name: str) -> Candidate:
    plain = backward_with(case, Ingredients(gamma=np.ones(case.channels)))
    view = case.shape
    gamma = np.broadcast_to(case.gamma[along], view)

    def diff_src(rows):
        p, noise = plain.diff_src(rows)
        g = gamma[rows]
        return p * g, None if noise is None else noise * np.abs(g)

    text = f"gamma indexed by {axis_name} (as long as C) instead of the channel: the kernel used gamma[{axis_name}]"
    return Candidate("parameter-misread", Prediction(diff_src, plain.diff_gamma, plain.diff_beta),
                     lambda s: f"{text}; recomputed that way: explains {percent(s.share)} of the deviation")


def _mean_along(case: Case, along: np.ndarray, axis_name: str) -> Candidate:
    mean = case.facts.mean
    with np.errstate(invalid="ignore", over="ignore"):
        x = case.x - mean[along] + mean[:, None]  # (x - mean[axis]) as x' - mean[c]: xhat of the mean misread
    text = f"the mean indexed by {axis_name} (as long as C) instead of the channel: the kernel used mean[{axis_name}]"
    return Candidate("parameter-misread", backward_with(case, Ingredients(x=x)),
                     lambda s: f"{text}; recomputed that way: explains {percent(s.share)} of the deviation")
