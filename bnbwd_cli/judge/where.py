"""Where a failing output's errors sit: the simplest description that covers nearly all of its failing elements
and few passing ones, in the user's own coordinates (n, c, h, w) or in storage order.

Pure: a boolean mask in (the output's own shape, C order, its flat order the buffer's), a frozen ``Where`` out;
no files, no terminal. The descriptions tried, each a few vectorised passes over the mask:

- **axes**: a product of index ranges per axis (``h=24..27 only``, ``c=32..63``, a spatial tile ``h=16..31,
  w=16..31``), the ranges of the indices that hold failures (and, against stray failures, of those that hold many);
- **range**: one contiguous range of the buffer (``the last 256 elements of the buffer``), with its coordinates;
- **period**: residues of the flat index modulo a period (``every 32nd element in storage order, offset 31``;
  ``lanes 28..31 of every 32-element group``), the period read from the failures' own spacing and warp sizes;
- **reduction**: a range of each channel's reduction order (its other axes flattened in storage order: the tail or
  a block of every channel's sum);
- **elements**: a few elements, named one by one.

A description is accepted when it covers at least NEARLY_ALL of the failing elements and at least MOSTLY of the
elements it names fail; of those accepted, the one with the fewest index ranges wins, a tight one (TIGHT on both
counts) before any loose one (ties: an exact one, then the order above). When none is accepted the answer says
so, with the densest channel or index. The mask is read through judge/failures.py, index sets said by
judge/index_words.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bnbwd_cli.judge.failures import Failures
from bnbwd_cli.judge.index_words import index_ranges, indices_text, ordinal, ranges_needed, ranges_text

NEARLY_ALL = 0.9  # share of the failing elements a description must cover
TIGHT = 0.95  # a description this good on both counts beats any looser one, however simple
MOSTLY = 0.5  # share of the elements a description names that must fail
STRAY = 0.1  # an index holding fewer failures than this share of the busiest index's is stray (second axes try)
WARPS = (32, 64)  # group sizes tried as lanes whatever the failures' spacing
FEW_ELEMENTS = 3  # this many failing elements or fewer may be named one by one
SAMPLE = 1 << 16  # failing positions read to find a period
PREFIX = 1 << 20  # with many failures, a period is tried on the buffer's first elements before all of them

_UNIT = {"n": "samples", "c": "channels", "h": "rows", "w": "columns", "d": "planes"}


@dataclass(frozen=True)
class Where:
    """One description of where the failing elements sit.

    ``kind``: "all", "most" (failures spread over the whole tensor), "axes", "range", "period", "reduction",
    "elements" or "scattered" (nothing simple covers them).
    ``failing``: the failing elements; ``covered``: those inside the description; ``region``: the elements it names.
    ``axes``: per restricted axis its name and inclusive index ranges (kind axes, and the box of a range).
    ``start``/``stop``: the flat range [start, stop) (kind range) or the range of each channel's reduction order
    (kind reduction); ``period`` and ``lanes`` (inclusive residue ranges) for kind period."""

    kind: str
    text: str
    failing: int
    covered: int
    region: int
    axes: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    start: int | None = None
    stop: int | None = None
    period: int | None = None
    lanes: tuple[tuple[int, int], ...] = ()
    complexity: int = 0  # index ranges the description takes (how simple it is: fewer wins)
    above: int | None = None  # of the failing elements, those whose actual value is above the reference (with_sign)
    larger: int | None = None  # and those larger in magnitude than the reference

    @property
    def exact(self) -> bool:
        return self.covered == self.failing == self.region

    @property
    def tight(self) -> bool:
        """Covers all but a few failing elements and names few passing ones: preferred to a simpler loose one."""
        return self.covered >= TIGHT * self.failing and self.covered >= TIGHT * self.region


@dataclass(frozen=True)
class Coordinates:
    """An output's shape and how its axes are named (None: plain dim0, dim1, ...) and which is the channel axis."""

    shape: tuple[int, ...]
    names: tuple[str, ...] | None = None
    channel_axis: int | None = None

    def name(self, axis: int) -> str:
        return self.names[axis] if self.names is not None and len(self.names) == len(self.shape) else f"dim{axis}"

    def at(self, flat: int) -> str:
        """``n=7 c=3 h=27 w=24`` for a flat index."""
        index = np.unravel_index(flat, self.shape) if self.shape else ()
        return " ".join(f"{self.name(a)}={int(i)}" for a, i in enumerate(index))


def _count_text(count: int, total: int, axis_name: str) -> str:
    unit = _UNIT.get(axis_name, "indices")
    return f"{count} of {total} {unit if total != 1 else unit.rstrip('s')}"


# --------------------------------------------------------------------------- the descriptions


def _axes(failures: Failures, where: Coordinates, counts: list[np.ndarray], stray: bool) -> Where | None:
    """The product of each axis's indices that hold failures (``stray``: only those holding many)."""
    shape = where.shape
    keep = [c >= max(1, STRAY * c.max()) if stray else c > 0 for c in counts]
    if stray and all(k.all() for k in keep):
        return None
    sets = [np.flatnonzero(k) for k in keep]
    region = math.prod(s.size for s in sets)
    failing = failures.count
    covered = failures.inside(sets) if stray else failing
    restricted = [a for a, s in enumerate(sets) if s.size < shape[a]]
    parts = [f"{where.name(a)}={indices_text(sets[a])}" for a in restricted]
    if len(restricted) == 1:
        a = restricted[0]
        parts[0] += f" only ({_count_text(sets[a].size, shape[a], where.name(a))})"
    rest = [where.name(a) for a in range(len(shape)) if a not in restricted]
    text = ", ".join(parts) + (f"; all {', '.join(rest)}" if rest else "")
    axes = tuple((where.name(a), index_ranges(sets[a])) for a in restricted)
    complexity = sum(ranges_needed(sets[a]) for a in restricted) or 99
    return Where("axes", text, failing, covered, region, axes=axes, complexity=complexity)


def _box(start: int, stop: int, where: Coordinates) -> tuple[str, bool]:
    """The coordinates of the flat range [start, stop): its box when the range fills one, else its two ends."""
    lo, hi = np.unravel_index(start, where.shape), np.unravel_index(stop - 1, where.shape)
    spans = []
    for a in range(len(where.shape)):
        # the leading axes that vary decide the box; a range fills its box when its length is the box's size
        spans.append((int(lo[a]), int(hi[a])))
        if lo[a] != hi[a]:
            rest = where.shape[a + 1:]
            box = (hi[a] - lo[a] + 1) * math.prod(rest)
            if box == stop - start:
                parts = [f"{where.name(b)}={s}" if s == e else f"{where.name(b)}={s}..{e}" for b, (s, e) in enumerate(spans)]
                names = [where.name(b) for b in range(a + 1, len(where.shape))]
                return ", ".join(parts) + (f"; all {', '.join(names)}" if names else ""), True
            break
    return f"from {where.at(start)} to {where.at(stop - 1)}", False


def _flat_range(failures: Failures, where: Coordinates) -> Where:
    flat, failing = failures.flat, failures.count
    start, stop = failures.bounds()
    length = stop - start
    box, _ = _box(start, stop, where)
    if stop == flat.size:
        lead = f"the last {length} elements of the buffer"
    elif start == 0:
        lead = f"the first {length} elements of the buffer"
    else:
        lead = f"elements {start}..{stop - 1} of the buffer in storage order ({length})"
    return Where("range", f"{lead}: {box}", failing, failing, length, start=start, stop=stop, complexity=1)


def _periods(failures: Failures) -> list[int]:
    """Periods worth trying: the spacing of the first failures' runs (the most common one and their gcd) and the
    warp sizes."""
    positions = failures.first(SAMPLE)
    found: list[int] = []
    if positions.size > 1:
        starts = positions[np.concatenate([[True], np.diff(positions) > 1])]
        gaps = np.diff(starts)
        if gaps.size:
            values, numbers = np.unique(gaps, return_counts=True)
            found += [int(values[np.argmax(numbers)]), int(np.gcd.reduce(gaps))]
    return [p for p in dict.fromkeys(found + list(WARPS)) if 2 <= p <= failures.flat.size // 2]


def _period(failures: Failures, period: int, where: Coordinates) -> Where | None:
    size, failing = failures.flat.size, failures.count
    whole = size // period * period
    if failures.positions is None and size > PREFIX:  # many failures: a look at the buffer's start first
        sample = failures.per_lane(period, PREFIX)
        if np.count_nonzero(sample >= max(1, STRAY * sample.max())) == period:
            return None
    by_lane = failures.per_lane(period)
    lanes = np.flatnonzero(by_lane >= max(1, STRAY * by_lane.max()))
    if lanes.size == period:
        return None
    positions = whole // period * lanes.size + int(np.count_nonzero(lanes < size - whole))
    covered = int(by_lane[lanes].sum())
    ranges = index_ranges(lanes)
    block = _trailing_axes(where, period)
    if block is not None and len(ranges) == 1:  # a range of every block of the trailing axes: say which axes
        lo, hi = ranges[0]
        inner = Coordinates(where.shape[len(where.shape) - len(block):], block)
        text = (f"elements {lo}..{hi} of every ({', '.join(block)}) block of {period} in storage order: "
                f"from {inner.at(lo)} to {inner.at(hi)}")
    elif lanes.size == 1:
        text = f"every {ordinal(period)} element in storage order, offset {int(lanes[0])}"
    else:
        text = f"lanes {ranges_text(ranges)} of every {period}-element group in storage order"
    return Where("period", text, failing, covered, positions, period=period, lanes=ranges,
                 complexity=ranges_needed(lanes))


def _trailing_axes(where: Coordinates, period: int) -> tuple[str, ...] | None:
    """The names of the trailing axes whose elements make one period, if any do (at least two axes' worth)."""
    for k in range(1, len(where.shape) - 1):
        if math.prod(where.shape[k:]) == period:
            return tuple(where.name(a) for a in range(k, len(where.shape)))
    return None


def _reduction(failures: Failures, where: Coordinates, channels: np.ndarray) -> Where | None:
    """A range of each channel's reduction order (the other axes flattened in storage order), in the channels that
    hold failures."""
    axis = where.channel_axis
    shape, failing = where.shape, failures.count
    if axis is None or len(shape) < 2:
        return None
    per_position = failures.per_position(axis)
    start = int(np.argmax(per_position > 0))
    stop = per_position.size - int(np.argmax(per_position[::-1] > 0))
    if stop - start == per_position.size:
        return None
    used = np.flatnonzero(channels)
    region = (stop - start) * used.size
    span = per_position.size
    lead = (f"the last {stop - start} of each channel's {span} elements in reduction order" if stop == span else
            f"the first {stop - start} of each channel's {span} elements in reduction order" if start == 0 else
            f"elements {start}..{stop - 1} of each channel's {span} in reduction order")
    if used.size < shape[axis]:
        lead += f", in {where.name(axis)}={indices_text(used)}"
    complexity = 1 + (ranges_needed(used) if used.size < shape[axis] else 0)
    return Where("reduction", lead, failing, failing, region, start=start, stop=stop, complexity=complexity)


def _reduction_lanes(failures: Failures, where: Coordinates, channels: np.ndarray, period: int) -> Where | None:
    """Lanes of a warp-sized group of each channel's reduction order (its other axes flattened in storage order):
    the positions p with p mod ``period`` in a range, in the channels that hold failures (a channel's reduction by a
    warp; in channels-last storage these are not lanes of the buffer)."""
    axis = where.channel_axis
    if axis is None or len(where.shape) < 2:
        return None
    per_position = failures.per_position(axis)
    span = per_position.size
    if span < 2 * period:
        return None
    whole = span // period * period
    by_lane = np.bincount(np.arange(span) % period, weights=per_position, minlength=period)
    lanes = np.flatnonzero(by_lane >= max(1, STRAY * by_lane.max()))
    ranges = index_ranges(lanes)
    if lanes.size == period or len(ranges) > 2:
        return None
    used = np.flatnonzero(channels)
    positions = whole // period * lanes.size + int(np.count_nonzero(lanes < span - whole))
    covered = int(by_lane[lanes].sum())
    which = (f"position {int(lanes[0])} of every {period}" if lanes.size == 1 else
             f"lanes {ranges_text(ranges)} of every {period} positions")
    text = f"{which} of each channel's {span} elements in reduction order"
    if used.size < where.shape[axis]:
        text += f", in {where.name(axis)}={indices_text(used)}"
    complexity = len(ranges) + (ranges_needed(used) if used.size < where.shape[axis] else 0)
    return Where("reduction", text, failures.count, covered, positions * used.size, period=period, lanes=ranges,
                 complexity=complexity)


def _elements(failures: Failures, where: Coordinates) -> Where:
    positions, failing = failures.first(FEW_ELEMENTS), failures.count
    text = f"{failing} element{'s' if failing > 1 else ''}: " + "; ".join(where.at(int(p)) for p in positions)
    return Where("elements", text, failing, failing, failing, complexity=1)  # (a few: as simple as one range)


def _scattered(failing: int, where: Coordinates, counts: list[np.ndarray]) -> Where:
    """Nothing simple covers the failures: how far they spread, and the densest index of the channel axis (or of the
    axis they crowd most)."""
    shape = where.shape
    axis = where.channel_axis if where.channel_axis is not None else max(
        range(len(shape)), key=lambda a: counts[a].max() / max(1, failing) * shape[a])
    per = counts[axis]
    hit = int(np.count_nonzero(per))
    name = where.name(axis)
    densest = int(np.argmax(per))
    size = math.prod(shape) // shape[axis]
    text = (f"no simple pattern covers them: {failing} failing elements in {_count_text(hit, shape[axis], name)}; "
            f"densest {name}={densest} ({100 * per[densest] / size:.3g}% of its {size} elements fail)")
    return Where("scattered", text, failing, failing, math.prod(shape), complexity=99)


def _most(failing: int, size: int) -> Where:
    """Failures spread over the whole tensor: how many of its elements fail (a range "from the first to the last
    element", or lanes 1..862 of every 864, would name the whole buffer in more words)."""
    if failing >= NEARLY_ALL * size:
        text = f"all but {size - failing} of the {size} elements"
    else:
        text = f"{100 * failing / size:.3g}% of the {size} elements, spread over the whole tensor"
    return Where("most", text, failing, failing, size, complexity=1)


_ORDER = ("elements", "axes", "range", "reduction", "period")


def localize(mask: np.ndarray, where: Coordinates, elevated: np.ndarray | None = None,
             failures: Failures | None = None) -> Where | None:
    """Where the True elements of ``mask`` (shape where.shape) sit; None when there are none. ``elevated`` (the same
    shape, a superset of ``mask``): the elements off by more than ELEVATED of their allowance, read when nothing
    simple covers the failures (see _by_elevated). ``failures``: Failures(mask) when the caller has it (the heat map
    reads the same one)."""
    failures = failures or Failures(mask)
    failing, size = failures.count, mask.size
    if failing == 0:
        return None
    if failing == size:
        return Where("all", "every element", failing, failing, size)
    counts = failures.per_axis()
    axes = _axes(failures, where, counts, stray=False)
    found = [axes, _flat_range(failures, where)]
    if not axes.tight:  # stray failures widen the sets: those holding many
        found.append(_axes(failures, where, counts, stray=True))
    if failing <= FEW_ELEMENTS:
        found.append(_elements(failures, where))
    if where.channel_axis is not None and mask.ndim >= 2:
        found.append(_reduction(failures, where, counts[where.channel_axis] > 0))
        found += [_reduction_lanes(failures, where, counts[where.channel_axis] > 0, lanes) for lanes in WARPS]
    strided = any(len(ranges) > 2 for _, ranges in axes.axes)  # indices at a stride: storage order may say it too
    if not axes.tight or axes.complexity > 1 or strided:
        found += [_period(failures, p, where) for p in _periods(failures)]
    accepted = [w for w in found if w is not None and w.covered >= NEARLY_ALL * failing and w.covered >= MOSTLY * w.region]
    if not accepted:
        region = _by_elevated(mask, failing, where, elevated) if elevated is not None else None
        return region if region is not None else _scattered(failing, where, counts)
    best = min(accepted, key=lambda w: (not w.tight, w.complexity, not w.exact, _ORDER.index(w.kind)))
    if best.kind in ("range", "period", "reduction") and best.region >= TIGHT * size:
        return _most(failing, size)  # a range or lanes that name (nearly) the whole buffer say no more than this
    period = next((w for w in accepted if w.kind == "period" and w.exact and w.complexity == 1), None)
    if best.kind == "axes" and period is not None:  # a stride across the channels: both are true, say both
        best = replace(best, text=f"{best.text}; also {period.text}")
    if best.covered < failing:  # say that some are elsewhere
        best = replace(best, text=f"{best.text} ({failing - best.covered} of the {failing} elsewhere)")
    return best


ELEVATED = 0.5  # of an element's allowance: an error above it is "elevated" (a region of a small error, _by_elevated)


def _by_elevated(mask: np.ndarray, failing: int, where: Coordinates, elevated: np.ndarray) -> Where | None:
    """A region whose error is only a few units fails in about half of its elements (the rest fall just inside the
    allowance) and so is no description of the failures; of the elevated elements (error > ELEVATED of the
    allowance, nearly all of such a region) it is. Accepted when the elevated elements' own description (axes, a
    range or a period: kinds whose region is a mask) covers NEARLY_ALL of the failures and MOSTLY of its elements
    are elevated; its words then say how many of its elements fail."""
    found = localize(elevated, where)
    if found is None or found.kind not in ("axes", "range", "period"):
        return None
    region = _region_mask(found, where)
    covered = int(np.count_nonzero(mask & region))
    if covered < NEARLY_ALL * failing or found.covered < MOSTLY * found.region:
        return None
    said = found.text.removesuffix(f" ({found.failing - found.covered} of the {found.failing} elsewhere)")
    text = (f"{said} ({covered} of its {found.region} elements fail, {found.covered} are off by more than "
            f"{ELEVATED:g} of their allowance)")
    if covered < failing:
        text += f" ({failing - covered} of the {failing} elsewhere)"
    return replace(found, text=text, failing=failing, covered=covered)


def _region_mask(found: Where, where: Coordinates) -> np.ndarray:
    """The elements a description of kind axes, range or period names, as a mask of where.shape."""
    shape = where.shape
    if found.kind == "range":
        flat = np.zeros(math.prod(shape), bool)
        flat[found.start:found.stop] = True
        return flat.reshape(shape)
    if found.kind == "period":
        lane = np.arange(math.prod(shape)) % found.period
        return np.any([(lane >= lo) & (lane <= hi) for lo, hi in found.lanes], axis=0).reshape(shape)
    region = np.ones(shape, bool)
    axis_of = {where.name(a): a for a in range(len(shape))}
    for name, ranges in found.axes:
        a = axis_of[name]
        index = np.arange(shape[a])
        member = np.any([(index >= lo) & (index <= hi) for lo, hi in ranges], axis=0)
        region &= member.reshape([-1 if b == a else 1 for b in range(len(shape))])
    return region


ONE_SIGN = 0.9  # share of the failures on one side of the reference that is said ("97% below the reference")


def with_sign(where: Where, above: int, larger: int | None = None) -> Where:
    """``where`` with the sign of its failing elements' errors: how many lie above the reference, and in words when
    all or nearly all (ONE_SIGN) lie on one side (an error all one way is a bias, a lost or doubled share, a missing
    term; one that goes both ways is noise, a misread or a wrong sign); else, when all or nearly all are larger (or
    smaller) in magnitude than the reference (``larger`` of them: a scale), that. Mixed signs add no words."""
    words = _one_side(where.failing, above, ("above", "below"), "the reference")
    if not words and larger is not None:
        words = _one_side(where.failing, larger, ("larger", "smaller"), "in magnitude than the reference")
    return replace(where, text=where.text + words, above=above, larger=larger)


def _one_side(failing: int, first: int, sides: tuple[str, str], what: str) -> str:
    """"; all above the reference" (or its share, at least ONE_SIGN), "" when the failures go both ways."""
    second = failing - first
    share = max(first, second) / failing if failing else 0.0
    side = sides[0] if first >= second else sides[1]
    if share == 1.0:
        return f"; all {side} {what}" if failing > 1 else f"; {side} {what}"
    if share >= ONE_SIGN:
        return f"; {100 * share:.3g}% {side} {what}"
    return ""

