"""Part of a reduction missing or counted twice, found by search: the kernel's sums (diff_beta, diff_gamma, or
what diff_src implies) are the true ones minus (or plus) the sums over a subset of each channel's elements.

The subsets are drawn from a small grammar over a channel's elements, seen as the tensor (N, *spatial) in
storage order (the channel's reduction order): a range along one axis (samples n=6..7, rows h=24..27, columns),
the first t elements (a kernel that started late), and a range of lanes: the elements whose index in the
reduction order is j0..j1 modulo L (lanes of a warp, a vector's remainder, the overlap of strided chunks),
for L = 2 .. 256. The search is cheap: each kind gives every one of its subsets' sums from a few prefix sums
of one channel, every subset is tried on the channel farthest from its true sums first, and only those within
its noise there are tried on the others. A subset found is applied in the deviating channels, the outputs
recomputed with those sums and tested as every hypothesis is (assess.assess). The last t elements (a tail) and
one aligned block missing are reductions.py's own causes (missing-tail, lost-partial-sum): not proposed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge.diagnosis.candidate import Candidate, channel_list, percent
from bnbwd_cli.judge.diagnosis.case import Case, Prediction
from bnbwd_cli.judge.diagnosis.kernels import Ingredients, backward_with
from bnbwd_cli.judge.diagnosis.reductions import BLOCKS, SumDeviation, sum_deviation

LANES = tuple(2**k for k in range(1, 9))  # moduli of the lane ranges: 2 .. 256
MAX_AXIS = 512  # an axis longer than this is not searched for ranges (its pairs grow as its square)
CLEAR = 4.0  # how much better than the runner-up the subset found must fit the sums


@dataclass(frozen=True)
class Kind:
    """One kind of subset: ``sums(values)`` gives each of its subsets' sums of a channel's (N, *spatial) values,
    ``mask(k)`` subset k as a bool array of that shape, ``said(k)`` its words."""

    name: str
    count: int
    sums: object
    mask: object
    said: object


def _pairs(length: int) -> tuple[np.ndarray, np.ndarray]:
    """Every range lo..hi (inclusive) of 0..length-1 but the whole."""
    lo, hi = np.triu_indices(length)
    keep = ~((lo == 0) & (hi == length - 1))
    return lo[keep], hi[keep]


def _range_sums(vector: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    prefix = np.concatenate([[0.0], np.cumsum(vector)])
    return prefix[hi + 1] - prefix[lo]


def _axis_kind(shape: tuple[int, ...], axis: int, name: str) -> Kind | None:
    length = shape[axis]
    if length < 2 or length > MAX_AXIS:
        return None
    lo, hi = _pairs(length)
    others = tuple(a for a in range(len(shape)) if a != axis)

    def sums(values: np.ndarray) -> np.ndarray:
        return _range_sums(values.sum(axis=others), lo, hi)

    def mask(k: int) -> np.ndarray:
        index = np.arange(length).reshape([-1 if a == axis else 1 for a in range(len(shape))])
        return np.broadcast_to((index >= lo[k]) & (index <= hi[k]), shape)

    def said(k: int) -> str:
        a, b = int(lo[k]), int(hi[k])
        where = f"{name}={a}" if a == b else f"{name}={a}..{b}"
        count = b - a + 1
        if b == length - 1:
            return f"{where} (the last {count} of {length})"
        if a == 0:
            return f"{where} (the first {count} of {length})"
        return f"{where} ({count} of {length})"

    return Kind(f"axis {name}", lo.size, sums, mask, said)


def _lane_kind(shape: tuple[int, ...], lanes: int) -> Kind | None:
    m = int(np.prod(shape))
    if m < 2 * lanes:
        return None
    lo, hi = _pairs(lanes)

    def sums(values: np.ndarray) -> np.ndarray:
        flat = values.reshape(-1)
        padded = np.pad(flat, (0, -m % lanes))
        return _range_sums(padded.reshape(-1, lanes).sum(axis=0), lo, hi)

    def mask(k: int) -> np.ndarray:
        lane = np.arange(m) % lanes
        return ((lane >= lo[k]) & (lane <= hi[k])).reshape(shape)

    def said(k: int) -> str:
        a, b = int(lo[k]), int(hi[k])
        which = f"lane {a}" if a == b else f"lanes {a}..{b}"
        return f"{which} of every group of {lanes} consecutive elements (index mod {lanes} = {a}..{b})"

    return Kind(f"lanes {lanes}", lo.size, sums, mask, said)


def _head_kind(shape: tuple[int, ...]) -> Kind:
    m = int(np.prod(shape))

    def sums(values: np.ndarray) -> np.ndarray:
        return np.cumsum(values.reshape(-1))[:-1]

    def mask(k: int) -> np.ndarray:
        return (np.arange(m) <= k).reshape(shape)

    def said(k: int) -> str:
        return f"the first {k + 1} elements"

    return Kind("head", m - 1, sums, mask, said)


def _axis_names(spatial: int) -> tuple[str, ...]:
    return ("n",) + {0: (), 1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}.get(spatial, tuple(f"x{i}" for i in range(spatial)))


def channel_shape(case: Case) -> tuple[int, ...]:
    """A channel's elements as (N, *spatial) in storage order (both layouts)."""
    shape, fmt = case.inputs.src.shape, case.inputs.data_format
    return (shape[0], *shape[2:]) if fmt == "NCX" else (shape[0], *shape[1:-1])


def kinds(shape: tuple[int, ...]) -> list[Kind]:
    """The grammar, in the order of preference (the first kind describing a subset names it)."""
    names = _axis_names(len(shape) - 1)
    found = [_axis_kind(shape, axis, name) for axis, name in enumerate(names)]
    found += [_lane_kind(shape, lanes) for lanes in LANES]
    found.append(_head_kind(shape))
    return [k for k in found if k is not None and k.count > 0]


def _channel_values(case: Case, c: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Channel c's dy and dy*xhat as (N, *spatial) in storage order."""
    dy, xhat = case.channel(c)
    return dy.reshape(shape), (dy * xhat).reshape(shape)


def _misfit(deviation: SumDeviation, c: int, sign: float, beta: np.ndarray, gamma: np.ndarray,
            parts: tuple[str, ...] = ("beta", "gamma")) -> np.ndarray:
    """How far (in noise) a subset's sums are from the deviation of channel c's sums (those in ``parts``)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        far = [np.abs(getattr(deviation, part)[c] - sign * values) / getattr(deviation, f"{part}_noise")[c]
               for part, values in (("beta", beta), ("gamma", gamma)) if part in parts]
        return np.maximum(*far) if len(far) == 2 else far[0]


def _is_tail_or_block(mask: np.ndarray) -> bool:
    """A subset reductions.py names itself when missing: the last t elements, or one aligned block of 2^k."""
    flat = np.flatnonzero(mask.reshape(-1))
    if flat.size == 0 or flat[-1] - flat[0] + 1 != flat.size:
        return False
    if flat[-1] == mask.size - 1:
        return True
    return flat.size in BLOCKS and flat[0] % flat.size == 0


def candidates(case: Case) -> Iterator[Candidate]:
    deviation = sum_deviation(case)
    if deviation is None or case.count < 4 or case.channels * case.count > (1 << 26):
        return
    yield from _search(case, deviation, ("beta", "gamma"))
    # one sum written from part of its reduction while diff_src used the whole sums (diff_src and the other sum
    # right: a partial stored before the reduction finished): that sum's deviation alone is searched
    src = case.outputs.get("diff_src")
    if deviation.observed and (src is None or not src.suspicious):
        with np.errstate(invalid="ignore"):
            off = {part: bool(np.any(~(np.abs(getattr(deviation, part)) <= getattr(deviation, f"{part}_noise"))))
                   for part in ("beta", "gamma")}
        if off["beta"] != off["gamma"]:
            yield from _search(case, deviation, ("beta",) if off["beta"] else ("gamma",), written=True)


def _search(case: Case, deviation: SumDeviation, parts: tuple[str, ...], written: bool = False) -> Iterator[Candidate]:
    """The subset whose sums match the deviation of the sums in ``parts`` in every deviating channel, if one does
    clearly (``written``: the sums written only; diff_src used the right ones)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        near = [np.abs(getattr(deviation, part)) <= getattr(deviation, f"{part}_noise") for part in parts]
        hit = ~np.logical_and.reduce(near)
        far = np.maximum.reduce([np.abs(getattr(deviation, part)) / getattr(deviation, f"{part}_noise")
                                 for part in parts])
    if not hit.any():
        return
    shape = channel_shape(case)
    grammar = kinds(shape)
    order = sorted(map(int, np.flatnonzero(hit)), key=lambda c: -np.nan_to_num(far[c], nan=-1.0))
    # alive[(kind index, sign)] = (subset indices, their worst misfit so far)
    alive: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {
        (i, sign): (np.arange(kind.count), np.zeros(kind.count)) for i, kind in enumerate(grammar) for sign in (-1.0, 1.0)}
    for c in order:
        dy, terms = _channel_values(case, c, shape)
        for i, kind in enumerate(grammar):
            if not any((i, sign) in alive for sign in (-1.0, 1.0)):
                continue
            beta, gamma = kind.sums(dy), kind.sums(terms)
            for sign in (-1.0, 1.0):
                if (i, sign) not in alive:
                    continue
                index, worst = alive[(i, sign)]
                worst = np.maximum(worst, _misfit(deviation, c, sign, beta[index], gamma[index], parts))
                keep = worst <= 1
                if keep.any():
                    alive[(i, sign)] = (index[keep], worst[keep])
                else:
                    del alive[(i, sign)]
        if not alive:
            return
    found = _distinct(grammar, alive, keep_tails=written)
    if not found:
        return
    misfits = np.array([f[3] for f in found] + [np.inf])
    best = np.argsort(misfits)
    if len(found) > 1 and misfits[best[0]] * CLEAR > misfits[best[1]]:
        return  # several subsets fit the sums: the data cannot tell which
    kind, k, sign, _ = found[int(best[0])]
    yield _candidate(case, hit, shape, (kind, k, sign), parts if written else None)


def _distinct(grammar: list[Kind], alive: dict, keep_tails: bool = False) -> list[tuple[Kind, int, float, float]]:
    """The subsets left, each set once (the first kind's words for it), without those reductions.py names (unless
    ``keep_tails``: a written sum alone, which reductions.py does not try)."""
    found: list[tuple[Kind, int, float, float]] = []
    masks: list[tuple[float, np.ndarray]] = []
    for (i, sign), (index, worst) in sorted(alive.items(), key=lambda item: item[0]):
        kind = grammar[i]
        for k, misfit in zip(index[:64], worst[:64]):  # (more than a few left: found below as unclear anyway)
            mask = np.asarray(kind.mask(int(k)))
            if sign < 0 and not keep_tails and _is_tail_or_block(mask):
                continue
            if any(s == sign and np.array_equal(mask, other) for s, other in masks):
                continue
            masks.append((sign, mask))
            found.append((kind, int(k), sign, float(misfit)))
    return found


def _candidate(case: Case, hit: np.ndarray, shape: tuple[int, ...], subset: tuple[Kind, int, float],
               written: tuple[str, ...] | None = None) -> Candidate:
    """The outputs with the subset's sums (subset k of a kind, sign -1: taken out, +1: added twice) in the channels
    hit; ``written``: in those sums as written only (diff_src used the right ones)."""
    kind, k, sign = subset
    mask = np.asarray(kind.mask(k))
    beta, gamma = np.zeros(case.channels), np.zeros(case.channels)
    for c in map(int, np.flatnonzero(hit)):
        dy, terms = _channel_values(case, c, shape)
        beta[c], gamma[c] = dy[mask].sum(), terms[mask].sum()
    sums = {"beta": case.facts.diff_beta + sign * beta, "gamma": case.facts.diff_gamma + sign * gamma}
    channels = tuple(int(c) for c in np.flatnonzero(hit))
    where = "every channel" if len(channels) == case.channels else f"{len(channels)} of {case.channels} channels ({channel_list(channels)})"
    if written is None:
        prediction = backward_with(case, Ingredients(beta=sums["beta"], gamma_sum=sums["gamma"]))
        names = [n for n in ("diff_gamma", "diff_beta") if n in case.outputs]
        whose = " and ".join(names) if names else "the sums diff_src uses"
    else:
        prediction = Prediction(**{f"diff_{part}": sums[part] for part in written})
        whose = " and ".join(f"diff_{part} as written" for part in written)
    one = written is not None and len(written) == 1
    verb = ("misses" if one else "miss") if sign < 0 else ("counts twice" if one else "count twice")
    count = int(np.count_nonzero(mask))
    said = kind.said(k)
    text = (f"{whose} {verb} {said} ({count} of {mask.size} elements of each channel's reduction) in {where}")
    if written is not None:
        text += " (diff_src used the whole sums: a partial written before the reduction finished?)"
    cause = "partial-reduction-missing" if sign < 0 else "partial-reduction-doubled"
    return Candidate(cause, prediction,
                     lambda s, text=text: f"{text}; recomputed that way: explains {percent(s.share)} of the deviation",
                     channels)
