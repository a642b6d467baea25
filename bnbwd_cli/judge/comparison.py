"""What one output's comparison says: the frozen ``Comparison`` with its verdict and numbers, its lazily computed
``Details``, the ``Bias`` fit and the ``Hint`` of a tested cause. judge/compare.py gathers them; render/ and the
API read them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from bnbwd_cli.judge.accumulators import ChannelStat, Element, Located, NonFinite
from bnbwd_cli.judge.criteria import Criterion, criteria_of, deciding
from bnbwd_cli.judge.tolerance import MaxMismatch, Scaled, Tolerance, bias_threshold
from bnbwd_cli.judge.heat_map import HeatMap
from bnbwd_cli.judge.histogram import HistogramBin
from bnbwd_cli.judge.where import Where

__all__ = ["Bias", "ChannelStat", "Comparison", "Details", "Element", "ElementErrors", "Hint", "HistogramBin",
           "Located", "NonFinite", "Once"]


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
    floor: float = 0.0  # the smallest threshold any estimate is held to (what a correct kernel's roundings shift)

    @property
    def z(self) -> float:
        return abs(self.scale) / self.stderr if self.stderr > 0 else math.inf

    def decisive(self) -> tuple[int | None, float, float]:
        """The estimate that decides: (its channel, None for the overall one; its scale; its threshold). The one
        furthest beyond its threshold; when none is beyond, the overall one."""
        best: tuple[int | None, float, float] = (None, self.scale, self.threshold)
        for channel, scale, stderr in self.channels:
            threshold = bias_threshold(stderr, self.floor)
            if threshold > 0 and abs(scale) * best[2] > abs(best[1]) * threshold:
                best = (channel, scale, threshold)
        return best


@dataclass(frozen=True)
class Hint:
    """A cause bnbwd tested against the data (judge/diagnosis/): a stable ``cause`` id, one line of ``text``
    with its evidence number, and the channels it names (may be empty)."""

    cause: str
    text: str
    channels: tuple[int, ...] = ()


@dataclass(frozen=True)
class ElementErrors:
    """Every element's judgement in the output's own shape (--save-error, the API's Report.errors): whether it
    fails, whether it fails for a NaN/Inf, its error / allowance (> 1 fails) and, under the scaled rule, its error
    in units; float32, NaN where a side is not finite."""

    failing: np.ndarray
    nonfinite: np.ndarray
    ratio: np.ndarray
    units: np.ndarray | None


def errors_arrays(errors: ElementErrors) -> dict[str, np.ndarray]:
    """The arrays --save-error writes and Report.errors returns, by name ("units" under the scaled rule only)."""
    arrays = {"failing": errors.failing, "nonfinite": errors.nonfinite, "ratio": errors.ratio}
    return arrays if errors.units is None else {**arrays, "units": errors.units}


@dataclass(frozen=True)
class Details:
    """The statistics that explain a comparison but do not decide it. ``where``: where the finite failing elements
    sit, ``nonfinite_where``: where the NaN/Inf ones do (judge/where.py); ``picture``: the failing share over
    channels x positions; ``errors``: every element's judgement, when asked for (Setup.keep_errors)."""

    max_rel: Located
    worst: tuple[Element, ...]
    channels: tuple[ChannelStat, ...] | None
    histogram: tuple[HistogramBin, ...]
    # out of the repr (bench/judge_bits hashes the repr: these describe failures it already counts)
    where: Where | None = field(default=None, repr=False)
    nonfinite_where: Where | None = field(default=None, repr=False)
    picture: HeatMap | None = field(default=None, repr=False)
    errors: ElementErrors | None = field(default=None, repr=False, compare=False)
    # the failing elements (the output's shape; NaN/Inf ones included), None when none fails: the diagnosis takes
    # them instead of judging every element again (judge/diagnosis/case.py)
    failing: np.ndarray | None = field(default=None, repr=False, compare=False)


class Once:
    """A value computed on first use, then kept (the details' second pass runs at most once)."""

    def __init__(self, compute: Callable[[], Details]) -> None:
        self._compute, self._value = compute, None

    @property
    def ready(self) -> bool:
        """Is the value computed already (reading it costs nothing)?"""
        return self._value is not None

    def __call__(self) -> Details:
        if self._value is None:
            self._value, self._compute = self._compute(), None
        return self._value


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
    max_ulp: Located
    max_units: Located | None  # scaled rule only
    rel_l2: float
    rel_l2_passed: bool
    min_atol: float | None  # fixed rule: the smallest atol (rtol, ulp as set) that would pass, inf if none
    min_rtol: float | None  # fixed rule: the smallest rtol (atol, ulp as set) that would pass
    min_units: float | None  # scaled rule: the smallest K that would pass, inf if none
    nonfinite: NonFinite
    channel_axis: int | None
    axis_names: tuple[str, ...] | None
    zero_fraction_actual: float
    zero_fraction_reference: float
    mostly_zeros: bool
    details_of: Callable[[], Details] = field(repr=False, compare=False, kw_only=True)
    # a detail pass that keeps every element's judgement (None: the details keep it already, or none can be made)
    errors_of: Callable[[], ElementErrors] | None = field(default=None, repr=False, compare=False, kw_only=True)
    bias: Bias | None = None
    hints: tuple[str, ...] = ()  # the texts of ``diagnosis``
    diagnosis: tuple[Hint, ...] = ()  # the causes tested (judge/diagnosis/), then notes (judge/hints.py)
    # elements that passed as subnormal results flushed to zero (Judging.ftz); out of the repr, which
    # bench/judge_bits hashes (0 for every kernel there)
    flushed: int = field(default=0, repr=False)
    # elements that failed against the inputs as given and pass against them with their subnormals read as zero
    # (DAZ, judge/daz.py: the whole run passes that way; Judging.ftz); out of the repr as ``flushed``
    read_as_zero: int = field(default=0, repr=False)

    @property
    def details(self) -> Details:
        return self.details_of()

    @property
    def details_ready(self) -> bool:
        """Are the details in hand (gathered by the judging pass, or computed already), so reading them costs no
        pass?"""
        return not isinstance(self.details_of, Once) or self.details_of.ready

    @property
    def errors(self) -> ElementErrors | None:
        """Every element's judgement in the output's shape (--save-error, the API's Report.errors): the details'
        when they kept it, else from a detail pass of its own."""
        kept = self.details.errors
        return kept if kept is not None or self.errors_of is None else self.errors_of()

    @property
    def max_rel(self) -> Located:
        return self.details.max_rel

    @property
    def worst(self) -> tuple[Element, ...]:
        return self.details.worst

    @property
    def channels(self) -> tuple[ChannelStat, ...] | None:
        return self.details.channels

    @property
    def histogram(self) -> tuple[HistogramBin, ...]:
        return self.details.histogram

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.elements if self.elements else 0.0

    @property
    def elements_passed(self) -> bool:
        """Few enough failing elements (a NaN/Inf that the other side lacks fails whatever the allowance)."""
        return self.mismatches <= self.allowed_mismatches and self.rel_l2_passed and not self.nonfinite.mismatches

    @property
    def finite_mismatches(self) -> int:
        """Failing elements whose both sides are finite (units and the worst element are computed on those)."""
        return self.mismatches - self.nonfinite.mismatches

    @property
    def bias_failed(self) -> bool:
        return self.bias is not None and self.bias.significant and self.scaled is not None and self.scaled.bias_check

    @cached_property
    def criteria(self) -> tuple[Criterion, ...]:
        """Each criterion the output is held to, its statistic against its threshold, decided (judge/criteria.py):
        what every report and the JSON document show, deciding nothing themselves."""
        return criteria_of(self)

    @property
    def deciding(self) -> Criterion:
        """The criterion that decided: the first one failed, else the first (the elements')."""
        return deciding(self.criteria)

    @property
    def passed(self) -> bool:
        """Every criterion passed (the same verdict as elements_passed and not bias_failed: one rule, decided once)."""
        return all(criterion.passed for criterion in self.criteria)

    @property
    def suspicious(self) -> bool:
        """Failed its elements or showed a significant systematic deviation (even where the bias check is off):
        what the diagnosis explains."""
        return not self.elements_passed or (self.bias is not None and self.bias.significant)
