"""One output's comparison, gathered chunk by chunk: counts, maxima with locations, worst elements.

Pure: arrays in, a frozen ``Comparison`` out. Both sides are upcast to float64. Each chunk is judged
by a rule (``FixedRule``: atol/rtol/ulp; ``ScaledRule``: K units of the error model's scale) that
says which elements fail and how far each is from its allowance (err / allowance, > 1 fails).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import dtype_name, to_float64, ulp_spacing
from bnbwd_cli.judge.tolerance import MaxMismatch, Scaled, Tolerance, comparison_dtype

CHUNK = 1 << 20  # elements per pass: float64 temporaries stay ~8 MB each, whatever the tensor size


@dataclass(frozen=True)
class Located:
    """A statistic and the index where it occurs (None when there is no such element)."""

    value: float
    index: tuple[int, ...] | None


@dataclass(frozen=True)
class Element:
    """One element of the worst-k list. ``ratio`` = error / allowance; > 1 fails."""

    index: tuple[int, ...]
    actual: float
    expected: float
    abs_err: float
    rel_err: float
    ulp_err: float
    ratio: float
    passed: bool
    units: float | None = None  # scaled rule: the error in units of the element's scale


@dataclass(frozen=True)
class ChannelStat:
    """Mismatches and the worst errors in one channel."""

    channel: int
    elements: int
    mismatches: int
    max_abs: float
    max_ratio: float


@dataclass(frozen=True)
class HistogramBin:
    """Count of |a - r| in [low, high); the bin low == high == 0 counts exact matches."""

    low: float
    high: float
    count: int


@dataclass(frozen=True)
class NonFinite:
    """NaN/Inf counts per side and how many positions fail because of them."""

    nan_actual: int
    nan_reference: int
    nan_mismatches: int
    inf_actual: int
    inf_reference: int
    inf_mismatches: int


@dataclass(frozen=True)
class Bias:
    """A systematic deviation of actual from reference: actual ~ (1 + scale) * reference.

    ``scale`` and its standard error over all channels, the threshold it was held to, and the
    channels whose own estimate is significant (channel, scale, standard error).
    """

    scale: float
    stderr: float
    threshold: float
    significant: bool
    channels: tuple[tuple[int, float, float], ...]

    @property
    def z(self) -> float:
        return abs(self.scale) / self.stderr if self.stderr > 0 else math.inf


@dataclass(frozen=True)
class Comparison:
    """Everything known about one output's comparison."""

    shape: tuple[int, ...]
    dtype: str  # the dtype whose ULP grid (and fixed tolerances) apply
    actual_dtype: str
    reference_dtype: str
    tolerance: Tolerance | None  # the fixed rule, or None under the scaled rule
    scaled: Scaled | None  # the scaled rule, or None under the fixed rule
    max_mismatch: MaxMismatch
    equal_nan: bool
    elements: int
    mismatches: int
    allowed_mismatches: int
    max_abs: Located
    max_rel: Located
    max_ulp: Located
    max_units: Located | None  # scaled rule only
    rel_l2: float
    rel_l2_passed: bool
    min_atol: float | None  # fixed rule: the smallest atol (rtol, ulp as set) that would pass, inf if none
    min_rtol: float | None  # fixed rule: the smallest rtol (atol, ulp as set) that would pass
    min_units: float | None  # scaled rule: the smallest K that would pass, inf if none
    nonfinite: NonFinite
    worst: tuple[Element, ...]
    channel_axis: int | None
    axis_names: tuple[str, ...] | None
    channels: tuple[ChannelStat, ...] | None
    histogram: tuple[HistogramBin, ...]
    zero_fraction_actual: float
    zero_fraction_reference: float
    mostly_zeros: bool
    bias: Bias | None = None
    hints: tuple[str, ...] = ()

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.elements if self.elements else 0.0

    @property
    def elements_passed(self) -> bool:
        return self.mismatches <= self.allowed_mismatches and self.rel_l2_passed

    @property
    def bias_failed(self) -> bool:
        return self.bias is not None and self.bias.significant and self.scaled is not None and self.scaled.bias_check

    @property
    def passed(self) -> bool:
        return self.elements_passed and not self.bias_failed


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Verdicts:
    """One chunk's per-element judgement (finite elements; non-finite ones are handled apart)."""

    fails: np.ndarray
    ratio: np.ndarray  # error / allowance
    units: np.ndarray | None  # scaled rule only
    need: tuple[np.ndarray, ...]  # what each "would pass with" statistic needs per element


class FixedRule:
    """|a - r| <= atol + rtol*|r|, or within `ulp` ULPs."""

    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance

    def judge(self, abs_err: np.ndarray, abs_ref: np.ndarray, spacing: np.ndarray, scale: np.ndarray | None) -> Verdicts:
        tol = self.tolerance
        bound = tol.atol + tol.rtol * abs_ref
        with np.errstate(over="ignore"):  # f64 subnormal spacing: huge ULP counts are honest
            ulp_err = abs_err / spacing
        within_ulp = ulp_err <= tol.ulp
        fails = ~((abs_err <= bound) | within_ulp)
        ratio = np.minimum(_safe_ratio(abs_err, bound), _safe_ratio(ulp_err, np.full(abs_err.size, float(tol.ulp))))
        need_atol = np.where(within_ulp, 0.0, np.maximum(0.0, abs_err - tol.rtol * abs_ref))
        need_rtol = np.where(within_ulp | (abs_err <= tol.atol), 0.0, _safe_ratio(abs_err - tol.atol, abs_ref))
        return Verdicts(fails, ratio, None, (need_atol, need_rtol))


class ScaledRule:
    """|a - r| <= K*s + ulp_D(r): K units of the element's error scale s, plus one ulp of rounding."""

    def __init__(self, scaled: Scaled) -> None:
        self.scaled = scaled

    def judge(self, abs_err: np.ndarray, abs_ref: np.ndarray, spacing: np.ndarray, scale: np.ndarray | None) -> Verdicts:
        allowance = self.scaled.max_units * scale + spacing
        fails = abs_err > allowance
        units = _safe_ratio(np.maximum(abs_err - spacing, 0.0), scale)
        return Verdicts(fails, _safe_ratio(abs_err, allowance), units, (units,))


def _safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator with x/0 = inf for x > 0 and 0/0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = numerator / denominator
    zero = denominator == 0
    ratio[zero] = np.where(numerator[zero] > 0, np.inf, 0.0)
    return ratio


# --------------------------------------------------------------------------- small accumulators


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


class _Best:
    """Running maximum of a statistic and the flat index of its first occurrence."""

    def __init__(self) -> None:
        self.value, self.index = -math.inf, -1

    def update(self, values: np.ndarray, mask: np.ndarray, offset: int) -> None:
        if not mask.any():
            return
        masked = np.where(mask, values, -np.inf)
        i = int(np.argmax(masked))
        if masked[i] > self.value:
            self.value, self.index = float(masked[i]), offset + i

    def located(self, shape: tuple[int, ...]) -> Located:
        if self.index < 0:
            return Located(float("nan"), None)
        return Located(self.value, _unravel(self.index, shape))


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Flat positions of the k largest values; ties go to the lowest positions."""
    if k <= 0 or values.size == 0:
        return np.zeros(0, dtype=np.intp)
    if values.size <= k:
        return np.arange(values.size)
    if k == 1:  # the common case (no outliers allowed): a max, not a partition
        return np.array([int(np.argmax(values))])
    threshold = np.partition(values, values.size - k)[values.size - k]
    above = np.flatnonzero(values > threshold)
    ties = np.flatnonzero(values == threshold)[: k - above.size]
    return np.concatenate([above, ties])


class _Largest:
    """The k largest values seen (for the minimum tolerance with k-1 allowed outliers)."""

    def __init__(self, k: int) -> None:
        self.k, self.kept = k, np.zeros(0)

    def update(self, values: np.ndarray) -> None:
        self.kept = np.concatenate([self.kept, values[_top(values, self.k)]])
        if self.kept.size > 4 * self.k:
            self.kept = self.kept[_top(self.kept, self.k)]

    def kth(self) -> float:
        """The k-th largest value; 0 when fewer than k were seen."""
        if self.kept.size < self.k:
            return 0.0
        return float(np.partition(self.kept, self.kept.size - self.k)[self.kept.size - self.k])


class _Worst:
    """The top-k elements by error/allowance (positive ratios only), with their pass/fail."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.index = np.zeros(0, dtype=np.intp)
        self.ratio = np.zeros(0)
        self.fail = np.zeros(0, dtype=bool)
        self.units = np.zeros(0)

    def update(self, ratio: np.ndarray, fails: np.ndarray, units: np.ndarray | None, offset: int) -> None:
        top = _top(np.where(ratio > 0, ratio, -1.0), self.k)
        top = top[ratio[top] > 0]
        self.index = np.concatenate([self.index, offset + top])
        self.ratio = np.concatenate([self.ratio, ratio[top]])
        self.fail = np.concatenate([self.fail, fails[top]])
        self.units = np.concatenate([self.units, units[top] if units is not None else np.full(top.size, np.nan)])

    def elements(self, a_flat, r_flat, shape, dtype: str) -> tuple[Element, ...]:
        order = np.lexsort((self.index, -self.ratio))[: self.k]
        elements = []
        for i in order:
            flat = int(self.index[i])
            a, r = float(to_float64(a_flat[flat : flat + 1])[0]), float(to_float64(r_flat[flat : flat + 1])[0])
            finite = math.isfinite(a) and math.isfinite(r)
            err = abs(a - r) if finite else math.nan
            if finite:
                rel = err / abs(r) if r != 0 else (math.inf if err > 0 else 0.0)
                ulp = err / float(ulp_spacing(np.array([r]), dtype)[0])
            else:
                rel = ulp = math.nan
            units = None if math.isnan(self.units[i]) else float(self.units[i])
            elements.append(Element(_unravel(flat, shape), a, r, err, rel, ulp, float(self.ratio[i]), not bool(self.fail[i]), units))
        return tuple(elements)


class _Channels:
    """Mismatches, max |a-r| and max err/allowance per channel."""

    def __init__(self, shape: tuple[int, ...], channel_axis: int) -> None:
        count = shape[channel_axis]
        self.stride = math.prod(shape[channel_axis + 1 :])
        self.fail = np.zeros(count, dtype=np.int64)
        self.abs = np.zeros(count)
        self.ratio = np.zeros(count)
        self.rows = math.prod(shape) // count if count else 0

    def update(self, fails: np.ndarray, abs_err: np.ndarray, ratio: np.ndarray, offset: int) -> None:
        channel = (np.arange(offset, offset + fails.size) // self.stride) % self.fail.size
        self.fail += np.bincount(channel, weights=fails, minlength=self.fail.size).astype(np.int64)
        np.maximum.at(self.abs, channel, abs_err)
        np.maximum.at(self.ratio, channel, ratio)

    def stats(self) -> tuple[ChannelStat, ...]:
        return tuple(ChannelStat(c, self.rows, int(self.fail[c]), float(self.abs[c]), float(self.ratio[c])) for c in range(self.fail.size))


class _Decades:
    """Counts of finite |a - r| per decade, and of exact matches."""

    def __init__(self) -> None:
        self.exact = 0
        self.counts: dict[int, int] = {}

    def update(self, finite_err: np.ndarray) -> None:
        self.exact += int((finite_err == 0).sum())
        nonzero = finite_err[finite_err > 0]
        if nonzero.size:
            values, numbers = np.unique(np.floor(np.log10(nonzero)).astype(int), return_counts=True)
            for decade, number in zip(values.tolist(), numbers.tolist()):
                self.counts[decade] = self.counts.get(decade, 0) + number

    def histogram(self) -> tuple[HistogramBin, ...]:
        return _histogram(self.exact, self.counts)


def _histogram(exact: int, decades: Mapping[int, int], max_bins: int = 12) -> tuple[HistogramBin, ...]:
    bins = [HistogramBin(0.0, 0.0, exact)]
    if not decades:
        return tuple(bins)
    top, lowest = max(decades), min(decades)
    bottom = max(lowest, top - max_bins + 1)
    for k in range(bottom, top + 1):
        low_edge = k == bottom and lowest < bottom
        count = sum(n for d, n in decades.items() if d <= k) if low_edge else decades.get(k, 0)
        bins.append(HistogramBin(0.0 if low_edge else 10.0**k, 10.0 ** (k + 1), count))
    return tuple(bins)


def log_histogram(abs_err: np.ndarray, max_bins: int = 12) -> tuple[HistogramBin, ...]:
    """Counts of finite |a - r| per decade [10**k, 10**(k+1)), after a bin of exact zeros.

    At most ``max_bins`` decades: the lowest bin then starts at 0 and collects everything
    below it (exact zeros still have their own bin).
    """
    nonzero = abs_err[abs_err > 0]
    values, numbers = np.unique(np.floor(np.log10(nonzero)).astype(int), return_counts=True)
    return _histogram(int((abs_err == 0).sum()), dict(zip(values.tolist(), numbers.tolist())), max_bins)


# --------------------------------------------------------------------------- the accumulator


@dataclass(frozen=True)
class Layout:
    """How to name an output's coordinates and find its channels (both None: plain indices)."""

    axis_names: tuple[str, ...] | None = None
    channel_axis: int | None = None


class Accumulator:
    """Statistics of one output's comparison, fed chunk by chunk (flat ranges in storage order)."""

    def __init__(self, actual: np.ndarray, reference: np.ndarray, rule: FixedRule | ScaledRule, *,
                 dtype: str, max_mismatch: MaxMismatch = MaxMismatch(), equal_nan: bool = False,
                 layout: Layout = Layout(), top_k: int = 10) -> None:
        if actual.shape != reference.shape:
            raise ValueError(f"shapes differ: {actual.shape} vs {reference.shape}")
        self.actual, self.reference = actual, reference
        self.shape = tuple(int(s) for s in reference.shape)
        self.rule, self.dtype, self.equal_nan, self.layout = rule, dtype, equal_nan, layout
        self.max_mismatch = max_mismatch
        self.allowed = max_mismatch.allowed(math.prod(self.shape))
        self.counts = dict.fromkeys(("mismatches", "nan_a", "nan_r", "nan_bad", "inf_a", "inf_r", "inf_bad", "zero_a", "zero_r"), 0)
        self.diff_sq = self.ref_sq = 0.0
        self.max_abs, self.max_rel, self.max_ulp, self.max_units = _Best(), _Best(), _Best(), _Best()
        self.need = [_Largest(self.allowed + 1) for _ in range(2)]
        self.worst = _Worst(top_k)
        self.decades = _Decades()
        use_channels = layout.channel_axis is not None and len(self.shape) >= 2
        self.channels = _Channels(self.shape, layout.channel_axis) if use_channels else None

    def add(self, a: np.ndarray, r: np.ndarray, offset: int, scale: np.ndarray | None = None) -> None:
        """a, r: float64 flat chunks starting at flat index `offset`; scale: the error scale (scaled rule)."""
        finite = self._count_nonfinite(a, r)
        nonfinite_bad = self._nonfinite_bad
        all_finite = bool(finite.all())
        af, rf = (a, r) if all_finite else (np.where(finite, a, 0.0), np.where(finite, r, 0.0))
        abs_err, abs_ref = np.abs(af - rf), np.abs(rf)
        spacing = ulp_spacing(rf, self.dtype)
        if scale is not None and not all_finite:
            scale = np.where(finite, scale, 1.0)
        verdicts = self.rule.judge(abs_err, abs_ref, spacing, scale)
        fails = nonfinite_bad | (finite & verdicts.fails)
        self.counts["mismatches"] += int(fails.sum())
        ratio = verdicts.ratio
        ratio[nonfinite_bad] = np.inf
        for largest, need in zip(self.need, verdicts.need):
            need[nonfinite_bad] = np.inf
            largest.update(need)
        self.diff_sq += float(np.dot(abs_err, abs_err))
        self.ref_sq += float(np.dot(rf, rf))
        self.max_abs.update(abs_err, finite, offset)
        self.max_rel.update(_safe_ratio(abs_err, abs_ref), finite & (rf != 0), offset)
        with np.errstate(over="ignore"):
            self.max_ulp.update(abs_err / spacing, finite, offset)
        if verdicts.units is not None:
            self.max_units.update(verdicts.units, finite, offset)
        self.worst.update(ratio, fails, verdicts.units, offset)
        self.decades.update(abs_err[finite])
        if self.channels is not None:
            self.channels.update(fails, abs_err, ratio, offset)

    def _count_nonfinite(self, a: np.ndarray, r: np.ndarray) -> np.ndarray:
        counts = self.counts
        finite = np.isfinite(a) & np.isfinite(r)
        if finite.all():  # the usual case: no NaN/Inf to classify, only zeros to count
            self._nonfinite_bad = np.zeros(a.shape, dtype=bool)
            counts["zero_a"] += a.size - int(np.count_nonzero(a))
            counts["zero_r"] += r.size - int(np.count_nonzero(r))
            return finite
        nan_a, nan_r = np.isnan(a), np.isnan(r)
        any_nan = nan_a | nan_r
        self._nonfinite_bad = ~finite & ~((nan_a & nan_r & self.equal_nan) | (np.isinf(a) & np.isinf(r) & (a == r)))
        counts["nan_a"] += int(nan_a.sum())
        counts["nan_r"] += int(nan_r.sum())
        counts["nan_bad"] += int((self._nonfinite_bad & any_nan).sum())
        counts["inf_a"] += int(np.isinf(a).sum())
        counts["inf_r"] += int(np.isinf(r).sum())
        counts["inf_bad"] += int((self._nonfinite_bad & ~any_nan).sum())
        counts["zero_a"] += int((a == 0).sum())
        counts["zero_r"] += int((r == 0).sum())
        return finite

    def result(self, bias: Bias | None = None) -> Comparison:
        shape, counts = self.shape, self.counts
        size = math.prod(shape)
        scaled = isinstance(self.rule, ScaledRule)
        diff_norm, ref_norm = math.sqrt(self.diff_sq), math.sqrt(self.ref_sq)
        rel_l2 = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
        # The relative-L2 gate belongs to the fixed rule; with no reference norm the elements decide.
        rel_l2_passed = scaled or ref_norm == 0 or rel_l2 <= self.rule.tolerance.rel_l2
        zero_a = counts["zero_a"] / size if size else 0.0
        zero_r = counts["zero_r"] / size if size else 0.0
        a_flat, r_flat = self.actual.reshape(-1), self.reference.reshape(-1)
        return Comparison(
            shape=shape,
            dtype=self.dtype,
            actual_dtype=dtype_name(self.actual.dtype) or str(self.actual.dtype),
            reference_dtype=dtype_name(self.reference.dtype) or str(self.reference.dtype),
            tolerance=None if scaled else self.rule.tolerance,
            scaled=self.rule.scaled if scaled else None,
            max_mismatch=self.max_mismatch,
            equal_nan=self.equal_nan,
            elements=size,
            mismatches=counts["mismatches"],
            allowed_mismatches=self.allowed,
            max_abs=self.max_abs.located(shape),
            max_rel=self.max_rel.located(shape),
            max_ulp=self.max_ulp.located(shape),
            max_units=self.max_units.located(shape) if scaled else None,
            rel_l2=rel_l2,
            rel_l2_passed=rel_l2_passed,
            min_atol=None if scaled else self.need[0].kth(),
            min_rtol=None if scaled else self.need[1].kth(),
            min_units=self.need[0].kth() if scaled else None,
            nonfinite=NonFinite(counts["nan_a"], counts["nan_r"], counts["nan_bad"], counts["inf_a"], counts["inf_r"], counts["inf_bad"]),
            worst=self.worst.elements(a_flat, r_flat, shape, self.dtype),
            channel_axis=self.layout.channel_axis if self.channels is not None else None,
            axis_names=self.layout.axis_names,
            channels=self.channels.stats() if self.channels is not None else None,
            histogram=self.decades.histogram(),
            zero_fraction_actual=zero_a,
            zero_fraction_reference=zero_r,
            mostly_zeros=zero_a >= 0.5 and zero_r <= zero_a / 2,
            bias=bias,
        )


def compare_arrays(
    actual: np.ndarray,
    reference: np.ndarray,
    tolerance: Tolerance,
    *,
    max_mismatch: MaxMismatch = MaxMismatch(),
    equal_nan: bool = False,
    dtype: str | None = None,
    axis_names: tuple[str, ...] | None = None,
    channel_axis: int | None = None,
    top_k: int = 10,
) -> Comparison:
    """Compare two arrays of the same shape under fixed tolerances, element by element and as a whole.

    ``actual`` and ``reference``: same shape, floating dtypes (f64, f32, f16, bf16).
    ``dtype``: the dtype whose ULP grid applies (default: the coarser side's).
    ``axis_names``/``channel_axis``: the tensor's layout, for coordinates and the
    per-channel table (None: plain indices, no per-channel table).
    Works in chunks of the flattened tensors, so memory stays bounded for large outputs.
    """
    dtype = dtype or comparison_dtype(actual.dtype, reference.dtype)
    state = Accumulator(actual, reference, FixedRule(tolerance), dtype=dtype, max_mismatch=max_mismatch,
                        equal_nan=equal_nan, layout=Layout(axis_names, channel_axis), top_k=top_k)
    a_flat, r_flat = actual.reshape(-1), reference.reshape(-1)
    for start in range(0, a_flat.size, CHUNK):
        stop = min(start + CHUNK, a_flat.size)
        state.add(to_float64(a_flat[start:stop]), to_float64(r_flat[start:stop]), start)
    return state.result()
