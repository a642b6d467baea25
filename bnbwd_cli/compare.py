"""Compare computed tensors with references: tolerance model, statistics, key matching.

Pure: arrays in, frozen dataclasses out. No printing and no files (report.py renders,
verify_cli.py reads). Everything is computed in float64 after upcasting both sides
(bfloat16 through float32, as ml_dtypes recommends).

The tolerance model, per output:

- element-wise: an element passes when ``|a - r| <= atol + rtol * |r|`` *or* its ULP
  distance is ``<= ulp``. ``atol`` is absolute, not scaled: batch-norm's ``diff_src``
  cancels, so elements near zero carry absolute, not relative, error.
- whole tensor: the relative L2 error ``||a - r||2 / ||r||2`` must be ``<= rel_l2``
  (benchdnn's gate for batch-norm backward). Skipped when ``||r||2 == 0``.
- ``max_mismatch``: how many failing elements are tolerated (a count or a percentage).
- NaN/Inf positions are compared first: a NaN fails unless both sides are NaN and
  ``equal_nan`` is set; infinities must match in sign. Those failures count as
  mismatches and are also counted separately.

ULP distance is ``|a - r| / ulp_D(r)`` where ``D`` is the *output's* dtype (the coarser of
the two sides when they differ) and ``ulp_D(r) = 2**(max(e, emin) - p)`` with
``e = floor(log2 |r|)``, ``emin`` the dtype's minimum normal exponent and ``p`` its explicit
mantissa bits (52, 23, 10, 7). That is ``np.spacing`` of ``r`` rounded to ``D``, computed
the same way for every dtype (bfloat16 has no ``np.spacing``); it is measured at the
reference, so it need not be an integer when the reference is not representable in D.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from bnbwd_cli import layout
from bnbwd_cli.errors import ExitCode

# Short dtype names used in reports, JSON and the defaults table.
_DTYPE_NAMES: dict[np.dtype, str] = {
    np.dtype(np.float64): "f64",
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(ml_dtypes.bfloat16): "bf16",
}
# (explicit mantissa bits, minimum normal exponent) per dtype name.
_FLOAT_FORMAT: dict[str, tuple[int, int]] = {"f64": (52, -1022), "f32": (23, -126), "f16": (10, -14), "bf16": (7, -126)}


@dataclass(frozen=True)
class Tolerance:
    """The tolerances in force for one output."""

    atol: float
    rtol: float
    ulp: float
    rel_l2: float


# Why these defaults:
# - f64: reductions over M elements in a different order differ by ~sqrt(M)*eps relative
#   (~1e-13 at M = 1e6); rtol 1e-9 leaves room for that, atol 1e-12 for cancelled diff_src.
# - f32: torch.testing uses atol 1e-5; rtol 1e-5 (~84 ulp) admits float32 accumulation
#   order differences (numpy's naive axis-0 sum is ~3e-5 off at M = 4e6 and *should* show).
# - f16 / bf16: results are rounded once to the output dtype; two correct kernels disagree
#   by about one rounding (eps = 9.8e-4 / 7.8e-3), rtol ~1 ulp (f16) and 2 ulp (bf16,
#   torch.testing's 1.6e-2), atol at the same scale for values near zero.
# - ulp 1: a one-ulp disagreement is a rounding direction, never a bug.
# - rel_l2 = k * 2**-mantissa_bits: k = 2 for f16/bf16 (final rounding dominates),
#   k = 2**6 for f32 and 2**20 for f64 (accumulation order dominates; consistent with rtol).
_REL_L2_SCALE = {"f64": 2.0**20, "f32": 2.0**6, "f16": 2.0, "bf16": 2.0}
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "f64": Tolerance(atol=1e-12, rtol=1e-9, ulp=1.0, rel_l2=_REL_L2_SCALE["f64"] * 2.0**-52),
    "f32": Tolerance(atol=1e-5, rtol=1e-5, ulp=1.0, rel_l2=_REL_L2_SCALE["f32"] * 2.0**-23),
    "f16": Tolerance(atol=1e-3, rtol=1e-3, ulp=1.0, rel_l2=_REL_L2_SCALE["f16"] * 2.0**-10),
    "bf16": Tolerance(atol=1e-2, rtol=1.6e-2, ulp=1.0, rel_l2=_REL_L2_SCALE["bf16"] * 2.0**-7),
}


def dtype_name(dtype: np.dtype) -> str | None:
    """Short name ("f64", "f32", "f16", "bf16") of a comparable dtype, None otherwise."""
    return _DTYPE_NAMES.get(np.dtype(dtype))


def comparison_dtype(actual: np.dtype, reference: np.dtype) -> str:
    """The dtype whose tolerances and ULP grid apply: the coarser of the two sides."""
    names = [dtype_name(actual), dtype_name(reference)]
    if None in names:
        raise ValueError(f"not comparable: {actual} vs {reference}")
    return min(names, key=lambda n: _FLOAT_FORMAT[n][0])


@dataclass(frozen=True)
class MaxMismatch:
    """How many failing elements an output may have: a count, or a percentage of its size."""

    value: float = 0.0
    percent: bool = False

    def allowed(self, size: int) -> int:
        if self.percent:
            return int(math.floor(size * self.value / 100.0))
        return int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else f"{int(self.value)}"


@dataclass(frozen=True)
class PerOutput:
    """One option's value: a global override and per-output overrides (by either key)."""

    default: object = None
    by_name: Mapping[str, object] = field(default_factory=dict)

    def lookup(self, names: Iterable[str]) -> object:
        for name in names:
            if name in self.by_name:
                return self.by_name[name]
        return self.default


@dataclass(frozen=True)
class CompareSettings:
    """The user's tolerance overrides; unset values fall back to DEFAULT_TOLERANCES."""

    atol: PerOutput = field(default_factory=PerOutput)
    rtol: PerOutput = field(default_factory=PerOutput)
    ulp: PerOutput = field(default_factory=PerOutput)
    rel_l2: PerOutput = field(default_factory=PerOutput)
    max_mismatch: PerOutput = field(default_factory=PerOutput)
    equal_nan: bool = False

    def tolerance_for(self, names: Sequence[str], dtype: str) -> Tolerance:
        base = DEFAULT_TOLERANCES[dtype]
        values = {}
        for attr in ("atol", "rtol", "ulp", "rel_l2"):
            override = getattr(self, attr).lookup(names)
            values[attr] = getattr(base, attr) if override is None else float(override)
        return Tolerance(**values)

    def max_mismatch_for(self, names: Sequence[str]) -> MaxMismatch:
        value = self.max_mismatch.lookup(names)
        return MaxMismatch() if value is None else value

    def output_names(self) -> dict[str, set[str]]:
        """Option name -> the output names it overrides (to reject names that match nothing)."""
        return {
            attr: set(getattr(self, attr).by_name)
            for attr in ("atol", "rtol", "ulp", "rel_l2", "max_mismatch")
            if getattr(self, attr).by_name
        }


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Located:
    """A statistic and the index where it occurs (None when there is no such element)."""

    value: float
    index: tuple[int, ...] | None


@dataclass(frozen=True)
class Element:
    """One element of the worst-k list. ``ratio`` = error / tolerance; > 1 fails."""

    index: tuple[int, ...]
    actual: float
    expected: float
    abs_err: float
    rel_err: float
    ulp_err: float
    ratio: float
    passed: bool


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
class Comparison:
    """Everything known about one output's comparison."""

    shape: tuple[int, ...]
    dtype: str  # the dtype whose tolerances apply
    actual_dtype: str
    reference_dtype: str
    tolerance: Tolerance
    max_mismatch: MaxMismatch
    equal_nan: bool
    elements: int
    mismatches: int
    allowed_mismatches: int
    max_abs: Located
    max_rel: Located
    max_ulp: Located
    rel_l2: float
    rel_l2_passed: bool
    min_atol: float  # the smallest atol (rtol, ulp as set) that would pass, inf if none
    min_rtol: float  # the smallest rtol (atol, ulp as set) that would pass, inf if none
    nonfinite: NonFinite
    worst: tuple[Element, ...]
    channel_axis: int | None
    axis_names: tuple[str, ...] | None
    channels: tuple[ChannelStat, ...] | None
    histogram: tuple[HistogramBin, ...]
    zero_fraction_actual: float
    zero_fraction_reference: float
    mostly_zeros: bool

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.elements if self.elements else 0.0

    @property
    def passed(self) -> bool:
        return self.mismatches <= self.allowed_mismatches and self.rel_l2_passed


# --------------------------------------------------------------------------- arithmetic


def to_float64(array: np.ndarray) -> np.ndarray:
    """Upcast to float64 (bfloat16 via float32: NumPy's bf16 promotion is unreliable)."""
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return array.astype(np.float32).astype(np.float64)
    return np.asarray(array, dtype=np.float64)


def ulp_spacing(reference: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype``'s representable numbers at |reference| (float64 in, float64 out).

    Subnormal range: the spacing stays at 2**(emin - p), as np.spacing does.
    """
    nmant, emin = _FLOAT_FORMAT[dtype]
    magnitude = np.abs(reference)
    _, exponent = np.frexp(magnitude)  # magnitude = m * 2**exponent, m in [0.5, 1)
    exponent = np.where(magnitude > 0, exponent - 1, emin)
    return np.ldexp(1.0, np.maximum(exponent, emin) - nmant)


def _safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator with x/0 = inf for x > 0 and 0/0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = numerator / denominator
    ratio[denominator == 0] = np.where(numerator[denominator == 0] > 0, np.inf, 0.0)
    return ratio


_CHUNK = 1 << 20  # elements per pass: float64 temporaries stay ~8 MB each, whatever the tensor size


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
    """Compare two arrays of the same shape, element by element and as a whole.

    ``actual`` and ``reference``: same shape, floating dtypes (f64, f32, f16, bf16).
    ``dtype``: the dtype whose ULP grid applies (default: the coarser side's).
    ``axis_names``/``channel_axis``: the tensor's layout, for coordinates and the
    per-channel table (None: plain indices, no per-channel table).
    Works in chunks of the flattened tensors, so memory stays bounded for large outputs.
    """
    if actual.shape != reference.shape:
        raise ValueError(f"shapes differ: {actual.shape} vs {reference.shape}")
    shape = tuple(int(s) for s in reference.shape)
    dtype = dtype or comparison_dtype(actual.dtype, reference.dtype)
    a_flat, r_flat = actual.reshape(-1), reference.reshape(-1)
    size = a_flat.size
    allowed = max_mismatch.allowed(size)
    state = _Accumulator(shape, tolerance, equal_nan, dtype, channel_axis if len(shape) >= 2 else None, top_k, allowed + 1)
    for start in range(0, size, _CHUNK):
        stop = min(start + _CHUNK, size)
        state.add(to_float64(a_flat[start:stop]), to_float64(r_flat[start:stop]), start)
    return state.result(a_flat, r_flat, max_mismatch, allowed, axis_names)


class _Accumulator:
    """Statistics of one comparison, gathered chunk by chunk."""

    def __init__(self, shape, tolerance: Tolerance, equal_nan: bool, dtype: str, channel_axis, top_k: int, keep: int) -> None:
        self.shape, self.tol, self.equal_nan, self.dtype = shape, tolerance, equal_nan, dtype
        self.channel_axis, self.top_k = channel_axis, top_k
        self.counts = dict.fromkeys(("mismatches", "nan_a", "nan_r", "nan_bad", "inf_a", "inf_r", "inf_bad", "zero_a", "zero_r", "exact"), 0)
        self.diff_sq = self.ref_sq = 0.0
        self.max_abs, self.max_rel, self.max_ulp = _Best(), _Best(), _Best()
        self.need_atol, self.need_rtol = _Largest(keep), _Largest(keep)
        self.worst_index = np.zeros(0, dtype=np.intp)
        self.worst_ratio = np.zeros(0)
        self.worst_fail = np.zeros(0, dtype=bool)
        self.decades: dict[int, int] = {}
        if channel_axis is not None:
            count = shape[channel_axis]
            self.channel_stride = math.prod(shape[channel_axis + 1 :])
            self.ch_fail = np.zeros(count, dtype=np.int64)
            self.ch_abs = np.zeros(count)
            self.ch_ratio = np.zeros(count)

    def add(self, a: np.ndarray, r: np.ndarray, offset: int) -> None:
        tol, counts = self.tol, self.counts
        finite = np.isfinite(a) & np.isfinite(r)
        nan_a, nan_r = np.isnan(a), np.isnan(r)
        any_nan = nan_a | nan_r
        nonfinite_bad = ~finite & ~((nan_a & nan_r & self.equal_nan) | (np.isinf(a) & np.isinf(r) & (a == r)))
        counts["nan_a"] += int(nan_a.sum())
        counts["nan_r"] += int(nan_r.sum())
        counts["nan_bad"] += int((nonfinite_bad & any_nan).sum())
        counts["inf_a"] += int(np.isinf(a).sum())
        counts["inf_r"] += int(np.isinf(r).sum())
        counts["inf_bad"] += int((nonfinite_bad & ~any_nan).sum())
        counts["zero_a"] += int((a == 0).sum())
        counts["zero_r"] += int((r == 0).sum())

        af, rf = np.where(finite, a, 0.0), np.where(finite, r, 0.0)
        abs_err = np.abs(af - rf)
        abs_ref = np.abs(rf)
        bound = tol.atol + tol.rtol * abs_ref
        with np.errstate(over="ignore"):  # f64 subnormal spacing: huge ULP counts are honest
            ulp_err = abs_err / ulp_spacing(rf, self.dtype)
        within_ulp = ulp_err <= tol.ulp
        fails = nonfinite_bad | (finite & ~((abs_err <= bound) | within_ulp))
        counts["mismatches"] += int(fails.sum())

        # How far each element is from passing: error / tolerance under the looser rule.
        ratio = np.minimum(_safe_ratio(abs_err, bound), _safe_ratio(ulp_err, np.full(a.size, float(tol.ulp))))
        ratio[nonfinite_bad] = np.inf

        need_atol = np.where(within_ulp, 0.0, np.maximum(0.0, abs_err - tol.rtol * abs_ref))
        need_rtol = np.where(within_ulp | (abs_err <= tol.atol), 0.0, _safe_ratio(abs_err - tol.atol, abs_ref))
        need_atol[nonfinite_bad] = np.inf
        need_rtol[nonfinite_bad] = np.inf
        self.need_atol.update(need_atol)
        self.need_rtol.update(need_rtol)

        self.diff_sq += float(np.dot(abs_err, abs_err))
        self.ref_sq += float(np.dot(rf, rf))
        self.max_abs.update(abs_err, finite, offset)
        self.max_rel.update(_safe_ratio(abs_err, abs_ref), finite & (rf != 0), offset)
        self.max_ulp.update(ulp_err, finite, offset)

        top = _top(np.where(ratio > 0, ratio, -1.0), self.top_k)
        top = top[ratio[top] > 0]
        self.worst_index = np.concatenate([self.worst_index, offset + top])
        self.worst_ratio = np.concatenate([self.worst_ratio, ratio[top]])
        self.worst_fail = np.concatenate([self.worst_fail, fails[top]])

        finite_err = abs_err[finite]
        self.counts["exact"] += int((finite_err == 0).sum())
        nonzero = finite_err[finite_err > 0]
        if nonzero.size:
            values, numbers = np.unique(np.floor(np.log10(nonzero)).astype(int), return_counts=True)
            for decade, number in zip(values.tolist(), numbers.tolist()):
                self.decades[decade] = self.decades.get(decade, 0) + number

        if self.channel_axis is not None:
            channel = (np.arange(offset, offset + a.size) // self.channel_stride) % self.ch_fail.size
            self.ch_fail += np.bincount(channel, weights=fails, minlength=self.ch_fail.size).astype(np.int64)
            np.maximum.at(self.ch_abs, channel, abs_err)
            np.maximum.at(self.ch_ratio, channel, ratio)

    def result(self, a_flat, r_flat, max_mismatch: MaxMismatch, allowed: int, axis_names) -> Comparison:
        shape, tol, counts = self.shape, self.tol, self.counts
        size = math.prod(shape)
        diff_norm, ref_norm = math.sqrt(self.diff_sq), math.sqrt(self.ref_sq)
        if ref_norm > 0:
            rel_l2 = diff_norm / ref_norm
            rel_l2_passed = rel_l2 <= tol.rel_l2
        else:  # nothing to be relative to: the element-wise check decides
            rel_l2 = 0.0 if diff_norm == 0 else math.inf
            rel_l2_passed = True
        zero_a = counts["zero_a"] / size if size else 0.0
        zero_r = counts["zero_r"] / size if size else 0.0
        return Comparison(
            shape=shape,
            dtype=self.dtype,
            actual_dtype=dtype_name(a_flat.dtype) or str(a_flat.dtype),
            reference_dtype=dtype_name(r_flat.dtype) or str(r_flat.dtype),
            tolerance=tol,
            max_mismatch=max_mismatch,
            equal_nan=self.equal_nan,
            elements=size,
            mismatches=counts["mismatches"],
            allowed_mismatches=allowed,
            max_abs=self.max_abs.located(shape),
            max_rel=self.max_rel.located(shape),
            max_ulp=self.max_ulp.located(shape),
            rel_l2=rel_l2,
            rel_l2_passed=rel_l2_passed,
            min_atol=self.need_atol.kth(),
            min_rtol=self.need_rtol.kth(),
            nonfinite=NonFinite(
                nan_actual=counts["nan_a"],
                nan_reference=counts["nan_r"],
                nan_mismatches=counts["nan_bad"],
                inf_actual=counts["inf_a"],
                inf_reference=counts["inf_r"],
                inf_mismatches=counts["inf_bad"],
            ),
            worst=self._worst(a_flat, r_flat),
            channel_axis=self.channel_axis,
            axis_names=axis_names,
            channels=self._channels(size),
            histogram=_histogram(counts["exact"], self.decades),
            zero_fraction_actual=zero_a,
            zero_fraction_reference=zero_r,
            mostly_zeros=zero_a >= 0.5 and zero_r <= zero_a / 2,
        )

    def _worst(self, a_flat, r_flat) -> tuple[Element, ...]:
        """The top_k elements by error/tolerance (ties: lower index first); exact matches omitted."""
        order = np.lexsort((self.worst_index, -self.worst_ratio))[: self.top_k]
        elements = []
        for i in order:
            flat = int(self.worst_index[i])
            a, r = float(to_float64(a_flat[flat : flat + 1])[0]), float(to_float64(r_flat[flat : flat + 1])[0])
            finite = math.isfinite(a) and math.isfinite(r)
            err = abs(a - r) if finite else math.nan
            if finite:
                spacing = float(ulp_spacing(np.array([r]), self.dtype)[0])
                rel = err / abs(r) if r != 0 else (math.inf if err > 0 else 0.0)
                ulp = err / spacing
            else:
                rel = ulp = math.nan
            elements.append(Element(_unravel(flat, self.shape), a, r, err, rel, ulp, float(self.worst_ratio[i]), not bool(self.worst_fail[i])))
        return tuple(elements)

    def _channels(self, size: int) -> tuple[ChannelStat, ...] | None:
        if self.channel_axis is None:
            return None
        count = self.ch_fail.size
        rows = size // count if count else 0
        return tuple(
            ChannelStat(channel=c, elements=rows, mismatches=int(self.ch_fail[c]), max_abs=float(self.ch_abs[c]), max_ratio=float(self.ch_ratio[c]))
            for c in range(count)
        )


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



# --------------------------------------------------------------------------- key matching


@dataclass(frozen=True)
class Pairing:
    """An actual key and the reference key it is compared with."""

    actual_key: str
    reference_key: str

    @property
    def name(self) -> str:
        """Report name: the reference key, or ``actual=reference`` when they differ."""
        if self.actual_key == self.reference_key:
            return self.reference_key
        return f"{self.actual_key}={self.reference_key}"

    @property
    def names(self) -> tuple[str, str]:
        """Names a per-output override may use (actual key first)."""
        return (self.actual_key, self.reference_key)


@dataclass(frozen=True)
class Problem:
    """A structural failure: kind is "missing", "extra", "shape", "dtype" or "empty"."""

    kind: str
    name: str
    message: str


@dataclass(frozen=True)
class KeyMatch:
    pairs: tuple[Pairing, ...]
    problems: tuple[Problem, ...]


def match_keys(
    actual_keys: Sequence[str],
    reference_keys: Sequence[str],
    key_map: Mapping[str, str] | None = None,
    only: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> KeyMatch:
    """Pair actual keys with reference keys (by name; ``key_map`` maps actual -> reference).

    ``only``/``ignore`` select by either key. A reference key without an actual partner is
    "missing", an unpaired actual key is "extra": both are structural failures.
    Order follows the reference.
    """
    key_map = dict(key_map or {})
    only, ignore = set(only), set(ignore)
    problems: list[Problem] = []
    for a_key, r_key in key_map.items():
        if a_key not in actual_keys:
            problems.append(Problem("missing", a_key, f"--map {a_key}={r_key}: actual has no key {a_key!r}"))
        if r_key not in reference_keys:
            problems.append(Problem("missing", r_key, f"--map {a_key}={r_key}: reference has no key {r_key!r}"))
    unknown = sorted(only - set(actual_keys) - set(reference_keys) - set(key_map))
    for name in unknown:
        problems.append(Problem("missing", name, f"--only {name}: no such key in actual or reference"))

    def selected(*names: str) -> bool:
        return (not only or any(n in only for n in names)) and not any(n in ignore for n in names)

    reverse = {r: a for a, r in key_map.items()}
    pairs: list[Pairing] = []
    paired_actual: set[str] = set()
    for r_key in reference_keys:
        a_key = reverse.get(r_key, r_key)
        if not selected(a_key, r_key):
            continue
        if a_key in actual_keys:
            pairs.append(Pairing(a_key, r_key))
            paired_actual.add(a_key)
        else:
            problems.append(Problem("missing", r_key, f"{r_key}: in reference, missing from actual"))
    for a_key in actual_keys:
        r_key = key_map.get(a_key, a_key)
        if a_key not in paired_actual and selected(a_key, r_key) and not (a_key in key_map and r_key not in reference_keys):
            problems.append(Problem("extra", a_key, f"{a_key}: in actual, missing from reference"))
    if not pairs and not problems:
        problems.append(Problem("empty", "", "nothing to compare: no keys selected"))
    return KeyMatch(tuple(pairs), tuple(problems))


# --------------------------------------------------------------------------- structure

_LAYOUT_NAMES = {3: ("NCW", "NWC"), 4: ("NCHW", "NHWC"), 5: ("NCDHW", "NDHWC")}


def permutation_hint(actual_shape: Sequence[int], reference_shape: Sequence[int]) -> str | None:
    """Say which axis permutation would make the shapes agree (never applied), if any."""
    a, r = tuple(actual_shape), tuple(reference_shape)
    if len(a) != len(r) or sorted(a) != sorted(r):
        if math.prod(a) == math.prod(r):
            return f"same number of elements ({math.prod(a)}): a reshape, not a transpose, would make them agree"
        return None
    ndim = len(r)
    if ndim in _LAYOUT_NAMES:
        ncx, nxc = _LAYOUT_NAMES[ndim]
        to_nxc = (0, *range(2, ndim), 1)
        to_ncx = (0, ndim - 1, *range(1, ndim - 1))
        if a == tuple(r[i] for i in to_nxc):
            return f"actual looks like the {nxc} transpose of reference ({ncx}); bnbwd never transposes: convert one side"
        if a == tuple(r[i] for i in to_ncx):
            return f"actual looks like the {ncx} transpose of reference ({nxc}); bnbwd never transposes: convert one side"
    if ndim <= 6:
        for perm in itertools.permutations(range(ndim)):
            if a == tuple(r[i] for i in perm):
                return f"actual looks like reference transposed with axes {perm}; bnbwd never transposes"
    return None


def structural_problem(name: str, actual: np.ndarray, reference: np.ndarray) -> Problem | None:
    """A reason the pair cannot be compared (dtype, shape), or None."""
    for side, array in (("actual", actual), ("reference", reference)):
        if dtype_name(array.dtype) is None:
            return Problem(
                "dtype", name, f"{name}: {side} has dtype {array.dtype}, which cannot be compared (expected f64, f32, f16 or bf16)"
            )
    if actual.shape != reference.shape:
        hint = permutation_hint(actual.shape, reference.shape)
        message = f"{name}: actual has shape {tuple(actual.shape)}, reference {tuple(reference.shape)}"
        return Problem("shape", name, f"{message}; {hint}" if hint else message)
    return None


# --------------------------------------------------------------------------- tensor sets


@dataclass(frozen=True)
class OutputResult:
    """One output's row: a comparison, or the structural problem that prevented it."""

    name: str
    actual_key: str | None
    reference_key: str | None
    comparison: Comparison | None
    problem: Problem | None

    @property
    def status(self) -> str:
        """"pass", "fail", or the problem's kind ("missing", "extra", "shape", "dtype")."""
        if self.problem is not None:
            return self.problem.kind
        return "pass" if self.comparison.passed else "fail"


@dataclass(frozen=True)
class SetComparison:
    """All outputs of two tensor sets, plus key-level problems (e.g. an empty selection)."""

    outputs: tuple[OutputResult, ...]
    problems: tuple[Problem, ...]
    settings: CompareSettings

    @property
    def all_problems(self) -> tuple[Problem, ...]:
        return self.problems + tuple(o.problem for o in self.outputs if o.problem is not None)

    @property
    def status(self) -> str:
        """"structural" beats "mismatch" beats "pass"."""
        if self.all_problems:
            return "structural"
        return "mismatch" if any(o.status == "fail" for o in self.outputs) else "pass"

    @property
    def exit_code(self) -> ExitCode:
        return {"pass": ExitCode.OK, "mismatch": ExitCode.MISMATCH, "structural": ExitCode.INPUT}[self.status]


def tensor_layout(data_format: str | None, ndim: int) -> tuple[tuple[str, ...] | None, int | None]:
    """(axis names, channel axis) of an output in ``data_format``; 1-D outputs are (C,)."""
    if data_format is None:
        return None, None
    if ndim == 1:
        return ("c",), None
    if ndim < 1:
        return None, None
    return layout.axis_letters(data_format, ndim), layout.channel_axis(data_format, ndim)


def compare_sets(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    settings: CompareSettings,
    *,
    key_map: Mapping[str, str] | None = None,
    only: Iterable[str] = (),
    ignore: Iterable[str] = (),
    data_format: str | None = None,
    top_k: int = 10,
) -> SetComparison:
    """Match keys, then compare each pair; structural failures become rows, never skips."""
    match = match_keys(list(actual), list(reference), key_map, only, ignore)
    outputs: list[OutputResult] = []
    for pair in match.pairs:
        a, r = actual[pair.actual_key], reference[pair.reference_key]
        problem = structural_problem(pair.name, a, r)
        comparison = None
        if problem is None:
            dtype = comparison_dtype(a.dtype, r.dtype)
            axis_names, channel_axis = tensor_layout(data_format, r.ndim)
            comparison = compare_arrays(
                a,
                r,
                settings.tolerance_for(pair.names, dtype),
                max_mismatch=settings.max_mismatch_for(pair.names),
                equal_nan=settings.equal_nan,
                dtype=dtype,
                axis_names=axis_names,
                channel_axis=channel_axis,
                top_k=top_k,
            )
        outputs.append(OutputResult(pair.name, pair.actual_key, pair.reference_key, comparison, problem))
    key_problems = []
    for problem in match.problems:
        if problem.kind in ("missing", "extra") and not problem.message.startswith("--"):
            in_actual = problem.kind == "extra"
            outputs.append(
                OutputResult(problem.name, problem.name if in_actual else None, None if in_actual else problem.name, None, problem)
            )
        else:
            key_problems.append(problem)
    return SetComparison(tuple(outputs), tuple(key_problems), settings)
