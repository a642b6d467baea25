"""One output's comparison, gathered chunk by chunk into a frozen ``Comparison`` (judge/comparison.py).

Pure: arrays in, dataclasses out. Both sides are upcast to float64. Each chunk is judged by a rule
(judge/rules.py) and fed to small accumulators, one per statistic (judge/accumulators.py); the details' own in
judge/detail_stats.py.

Two tiers: the verdict and the numbers of the summary (mismatches, max abs/ULP/units, rel L2, the
minimum passing tolerance, NaN/Inf and zero counts) come from one cheap pass; the details (max
relative error, worst elements, per-channel table, histogram) cost about as much again and only a
failing output's report or --verbose/--json shows them. They are computed lazily, by a second pass
on first use (``Once``): here for the fixed rule, in judge/diff_src.py for the scaled rule's diff_src
(which rebuilds its error scale for it); a Setup with ``detailed`` gathers them in the same pass, which
--json and --verbose ask for up front (Judging.details_up_front), since they read every output's details.
A pass without them starts gathering them where its output is seen to fail (more mismatches than allowed:
its report will read them), after a detailed judgement of the chunks before (``continue_details``): a
failing output pays one pass, with the details of a detailed pass from the start.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from bnbwd_cli.dtypes import SMALLEST_NORMAL, dtype_name, to_float64, ulp_spacing
from bnbwd_cli.judge.accumulators import Largest, MaxLocated, NonFiniteCounts, ZeroCounts, count_zeros
from bnbwd_cli.judge.comparison import Bias, Comparison, Details, ElementErrors, Once
from bnbwd_cli.judge.detail_stats import DetailStats, Judged
from bnbwd_cli.judge.rules import Chunk, FixedRule, ScaledRule, pass_flushed
from bnbwd_cli.judge.tolerance import MaxMismatch, Tolerance, comparison_dtype
from bnbwd_cli.judge.histogram import log_histogram
from bnbwd_cli.judge.norms import RelativeL2
from bnbwd_cli.scratch import Scratch

__all__ = ["Accumulator", "Coordinates", "Setup", "compare_arrays", "log_histogram", "FixedRule", "ScaledRule"]

CHUNK = 1 << 16  # elements per pass: its float64 scratch arrays (512 KiB each) stay in the CPU's cache
# add_scaled: past this share (half) of a chunk's elements more than one ULP off, the whole chunk is judged (a
# gather of that many elements' values costs more than the rule's passes over the rest)
DENSE_SHARE = 0.5


@dataclass(frozen=True)
class Coordinates:
    """How to name an output's coordinates and find its channels (both None: plain indices)."""

    axis_names: tuple[str, ...] | None = None
    channel_axis: int | None = None


@dataclass(frozen=True)
class Setup:
    """How one output is judged, besides its rule. ``detailed``: gather the details in the same pass.
    ``dtype``: the dtype whose ULP grid applies; None: the coarser side's (``resolved``)."""

    dtype: str | None = None
    max_mismatch: MaxMismatch = MaxMismatch()
    equal_nan: bool = False
    layout: Coordinates = Coordinates()
    top_k: int = 10
    detailed: bool = True
    keep_errors: bool = False  # the details keep every element's judgement (Details.errors: --save-error)
    ftz: bool = True  # a zero where the reference is subnormal in the dtype passes (Judging.ftz)

    def resolved(self, actual: np.ndarray, reference: np.ndarray) -> Setup:
        """This setup with its dtype settled (None: the coarser of the two sides)."""
        if self.dtype is not None:
            return self
        return replace(self, dtype=comparison_dtype(actual.dtype, reference.dtype))

    def channel_axis(self, ndim: int) -> int | None:
        """The axis of the per-channel table; None without one (no channel axis, or a 1-D output)."""
        return self.layout.channel_axis if ndim >= 2 else None


class Accumulator:
    """Statistics of one output's comparison, fed chunk by chunk (flat ranges in storage order)."""

    def __init__(self, actual: np.ndarray, reference: np.ndarray, rule: FixedRule | ScaledRule, setup: Setup) -> None:
        if actual.shape != reference.shape:
            raise ValueError(f"shapes differ: {actual.shape} vs {reference.shape}")
        setup = setup.resolved(actual, reference)
        self.actual, self.reference, self.rule, self.setup = actual, reference, rule, setup
        self.dtype = setup.dtype
        self.shape = tuple(int(s) for s in reference.shape)
        self.allowed = setup.max_mismatch.allowed(math.prod(self.shape))
        self.mismatches = 0
        # flush-to-zero: failing zeros where the reference is below this (subnormal) pass, counted in ``flushed``
        self.smallest_normal = SMALLEST_NORMAL[self.dtype] if setup.ftz else 0.0
        self.flushed = 0
        self.nonfinite = NonFiniteCounts(setup.equal_nan, self.shape, setup.channel_axis(len(self.shape)))
        self.zeros, self.l2 = ZeroCounts(), RelativeL2()
        self.max_abs, self.max_ulp, self.max_units = MaxLocated(), MaxLocated(), MaxLocated()
        self.need = [Largest(self.allowed + 1) for _ in range(2)]
        self.details = DetailStats(self.shape, setup.top_k, setup.channel_axis(len(self.shape)), setup.layout.axis_names,
                                    setup.keep_errors) if setup.detailed else None
        self.scratch = Scratch()

    def add(self, a: np.ndarray, r: np.ndarray, offset: int, scale: np.ndarray | None = None, *,
            norms: bool = True) -> None:
        """a, r: float64 flat chunks starting at flat index `offset`; scale: the error scale (scaled rule).
        ``norms`` False: the relative L2's sums are left to add_norms, fed larger chunks (its float sums
        depend on the chunking; every other statistic here does not)."""
        self.zeros.update(a, r)
        finite = bad = None
        # |a - r|, the ULP spacing, and three for the rule (judge/rules.Chunk)
        abs_err, spacing, *scratch = self.scratch.take(("abs_err", "spacing", "rule0", "rule1", "rule2"), a.size)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: classified below
            np.subtract(a, r, out=abs_err)
        if np.isfinite(abs_err).all():  # the usual case: a and r are finite, nothing to classify or mask
            np.abs(abs_err, out=abs_err)
        else:
            finite, bad = self.nonfinite.update(a, r, offset)
            a, r = np.where(finite, a, 0.0), np.where(finite, r, 0.0)
            np.abs(a - r, out=abs_err)
            scale = None if scale is None else np.where(finite, scale, 1.0)
        spacing = ulp_spacing(r, self.dtype, out=spacing.view(np.int64))
        chunk = Chunk(abs_err, r, spacing, scale, tuple(scratch))
        verdicts = self.rule.judge(chunk, with_ratio=self.details is not None)
        if self.smallest_normal:
            self.flushed += pass_flushed(verdicts, a, r, self.smallest_normal)
        fails = verdicts.fails if bad is None else bad | (finite & verdicts.fails)
        self.mismatches += int(np.count_nonzero(fails))
        failing_nonfinite = np.full(0 if bad is None else int(np.count_nonzero(bad)), np.inf)
        for largest, need in zip(self.need, verdicts.need):
            largest.update(np.concatenate([need, failing_nonfinite]) if failing_nonfinite.size else need)
        if norms:
            self.l2.update(abs_err, r)
        self.max_abs.update(abs_err, finite, offset)
        self.max_ulp.update(verdicts.ulp_err, finite, offset)
        if verdicts.units is not None:
            self.max_units.update(verdicts.units, finite, offset)
        if self.details is not None:
            self.details.update(chunk, Judged(verdicts, fails, finite, bad, offset))

    def add_scaled(self, a: np.ndarray, r: np.ndarray, d: np.ndarray, offset: int,
                   scale_at: Callable[[np.ndarray | None], np.ndarray],
                   floor_at: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """add(..., norms=False) under the scaled rule for a flat chunk whose d = a - r is given and finite, forming
        the scale only where |a - r| is more than one ULP of r: elsewhere an element passes with 0 units, whatever
        its scale, as long as that scale is >= 0 and not NaN and K >= 0 (the caller's promise). ``scale_at``:
        the scale at these flat positions of the chunk, ascending (None: at every one). ``floor_at``: a lower bound of
        the scale as scale_at computes it at these positions (the caller's promise), so the exact scale is formed
        only where an element may fail or reach the largest units so far (_may_count). Without details only (they
        need every element's ratio): with them, add() is used."""
        if self.details is not None:
            self.add(a, r, offset, scale_at(None), norms=False)
            return
        abs_err = np.abs(d, out=self.scratch.get("abs_err", d.size))
        top = int(np.argmax(abs_err))
        self.max_abs.offer(abs_err[top], offset + top)
        if abs_err[top] == 0:  # the chunk equals the reference: every error, ULP and unit is 0 (the first is kept)
            zeros = count_zeros(r)
            self.zeros.add(zeros, zeros, r.size)
            self.max_ulp.offer(0.0, offset)
            self.max_units.offer(0.0, offset)
            return
        self.zeros.update(a, r)
        spacing = ulp_spacing(r, self.dtype, out=self.scratch.get("spacing", d.size).view(np.int64))
        outside = np.flatnonzero(abs_err > spacing)
        with np.errstate(over="ignore"):  # f64 subnormal spacing: huge ULP counts are honest
            if not outside.size:  # within one ULP everywhere: nothing fails, every unit is 0
                ulp_err = np.divide(abs_err, spacing, out=self.scratch.get("rule0", d.size))
                top = int(np.argmax(ulp_err))
                self.max_ulp.offer(ulp_err[top], offset + top)
                self.max_units.offer(0.0, offset)
                return
        self._add_past_one_ulp((a, r, abs_err, spacing), outside, offset, scale_at, floor_at)

    def _add_past_one_ulp(self, values: tuple[np.ndarray, ...], outside: np.ndarray, offset: int,
                          scale_at: Callable[[np.ndarray | None], np.ndarray],
                          floor_at: Callable[[np.ndarray], np.ndarray] | None) -> None:
        """add_scaled's chunk where some elements are past one ULP (``outside``, ascending); ``values``: its a, r,
        |a - r| and ULP spacing."""
        a, r, abs_err, spacing = values
        with np.errstate(over="ignore"):  # f64 subnormal spacing: huge ULP counts are honest
            # Past one ULP, as ScaledRule.judge forms them. ULP errors there are > 1 (|a - r| over a power of two),
            # within one ULP <= 1: the largest is here.
            if outside.size > abs_err.size * DENSE_SHARE:
                # Most elements are past one ULP: the rule judges the whole chunk (gathering the rest would cost
                # more). Those within one ULP add nothing: they pass with 0 units and an ULP error <= 1, so every
                # count, maximum and first position below is the one the elements past one ULP give.
                verdicts = self.rule.judge(Chunk(abs_err, r, spacing, scale_at(None),
                                                 self.scratch.take(("rule0", "rule1", "rule2"), abs_err.size)), False)
                outside = None
                if self.smallest_normal:
                    self.flushed += pass_flushed(verdicts, a, r, self.smallest_normal)
            else:  # the rule's own judgement of the elements past one ULP
                err, space = abs_err[outside], spacing[outside]
                if floor_at is not None:
                    # every one's ULP error, then the scale only where the rule's verdict or units can count
                    ulp_err = np.divide(err, space)
                    top = int(np.argmax(ulp_err))
                    self.max_ulp.offer(ulp_err[top], offset + int(outside[top]))
                    keep = self._may_count(err, space, floor_at(outside))
                    outside, err, space = outside[keep], err[keep], space[keep]
                    if not outside.size:  # none can fail nor reach the units kept: nothing else changes
                        return
                verdicts = self.rule.judge(Chunk(err, r[outside], space, scale_at(outside)), False)
                if self.smallest_normal:
                    self.flushed += pass_flushed(verdicts, a[outside], r[outside], self.smallest_normal)
        self.mismatches += int(np.count_nonzero(verdicts.fails))
        units, ulp_err = verdicts.units, verdicts.ulp_err
        self.need[0].update(units)  # (it takes any subset holding every non-zero value it could keep)
        if floor_at is None or outside is None:  # (else offered above, over every element past one ULP)
            top = int(np.argmax(ulp_err))
            self.max_ulp.offer(ulp_err[top], offset + (top if outside is None else int(outside[top])))
        top = int(np.argmax(units))
        if units[top] > 0:
            self.max_units.offer(units[top], offset + (top if outside is None else int(outside[top])))
        else:  # (a scale of inf) every unit is 0: the chunk's first element holds the maximum
            self.max_units.offer(0.0, offset)

    def _may_count(self, abs_err: np.ndarray, spacing: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """Which elements past one ULP (their |a - r|, spacing and a lower bound of their scale, as judged by
        ScaledRule) may fail or have units the statistics keep: |a - r| past K*floor + spacing, or (|a - r| - spacing)
        / floor at or above the k-th largest units kept so far (need: the largest is max_units'). Rounding keeps
        both bounds: fl(K*s) + spacing and (|a - r| - spacing) / s are monotone in s, and K >= 0 (add_scaled's
        caller's promise), so the others pass with units below every one kept: nothing they hold is reported."""
        excess = abs_err - spacing
        with np.errstate(divide="ignore", over="ignore"):  # a floor of 0: every such element may count
            allowance = np.multiply(self.rule.scaled.max_units, floor)
            allowance += spacing
            keep = abs_err > allowance
            keep |= np.divide(excess, floor) >= self.need[0].floor()
        return keep

    def continue_details(self, earlier: Accumulator) -> None:
        """Gather the details from the next chunk on, continuing ``earlier``'s: a detailed judgement of every chunk
        fed here so far, in the same order (the details then are a detailed pass's from the start, bit for bit). A
        pass that finds its output failing calls it: the failing output's report reads the details, which then
        cost no second pass."""
        self.details = earlier.details

    def add_norms(self, a: np.ndarray, r: np.ndarray) -> None:
        """The relative L2's sums of a flat chunk, as add() forms them (non-finite positions count as 0 on both
        sides; |a - r| and a - r have the same squares)."""
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.subtract(a, r, out=self.scratch.get("difference", a.size))
            if not np.isfinite(diff).all():
                finite = np.isfinite(a) & np.isfinite(r)
                diff, r = np.where(finite, diff, 0.0), np.where(finite, r, 0.0)
        self.l2.update(diff, r)

    def result(self, bias: Bias | None = None, details_of: Callable[[], Details] | None = None,
               errors_of: Callable[[], ElementErrors] | None = None) -> Comparison:
        """The comparison; ``details_of`` supplies the details when this pass did not gather them, ``errors_of``
        every element's judgement when they do not keep it."""
        shape, size = self.shape, math.prod(self.shape)
        scaled = isinstance(self.rule, ScaledRule)
        rel_l2, ref_norm = self.l2.finish()
        # The relative-L2 gate belongs to the fixed rule; with no reference norm the elements decide.
        rel_l2_passed = scaled or ref_norm == 0 or rel_l2 <= self.rule.tolerance.rel_l2
        zero_a, zero_r = self.zeros.finish()
        if self.details is not None:
            details = self.details.finish(self.actual, self.reference, self.dtype)
            details_of = lambda: details  # a constant
        return Comparison(
            shape=shape,
            dtype=self.dtype,
            actual_dtype=dtype_name(self.actual.dtype) or str(self.actual.dtype),
            reference_dtype=dtype_name(self.reference.dtype) or str(self.reference.dtype),
            tolerance=None if scaled else self.rule.tolerance,
            scaled=self.rule.scaled if scaled else None,
            max_mismatch=self.setup.max_mismatch,
            equal_nan=self.setup.equal_nan,
            elements=size,
            mismatches=self.mismatches,
            allowed_mismatches=self.allowed,
            max_abs=self.max_abs.finish(shape),
            max_ulp=self.max_ulp.finish(shape),
            max_units=self.max_units.finish(shape) if scaled else None,
            rel_l2=rel_l2,
            rel_l2_passed=rel_l2_passed,
            min_atol=None if scaled else self.need[0].finish(),
            min_rtol=None if scaled else self.need[1].finish(),
            min_units=self.need[0].finish() if scaled else None,
            nonfinite=self.nonfinite.finish(),
            channel_axis=self.setup.channel_axis(len(shape)),
            axis_names=self.setup.layout.axis_names,
            zero_fraction_actual=zero_a,
            zero_fraction_reference=zero_r,
            mostly_zeros=zero_a >= 0.5 and zero_r <= zero_a / 2,
            details_of=details_of,
            errors_of=errors_of,
            bias=bias,
            flushed=self.flushed,
        )


def _fixed_pass(actual: np.ndarray, reference: np.ndarray, tolerance: Tolerance, setup: Setup,
                end: int | None = None) -> Accumulator:
    """The chunks of the flat range [0, end) (None: the whole output) judged in order. Without details, they are
    gathered from the chunk where the output is seen to fail (more mismatches than allowed) on, after a detailed
    pass over the chunks before: its report reads them, and a failing output then pays one pass."""
    state = Accumulator(actual, reference, FixedRule(tolerance), setup)
    a_flat, r_flat = actual.reshape(-1), reference.reshape(-1)
    scratch = Scratch()
    for start in range(0, a_flat.size if end is None else end, CHUNK):
        stop = min(start + CHUNK, a_flat.size)
        a64, r64 = scratch.take(("a", "r"), stop - start)
        state.add(to_float64(a_flat[start:stop], a64), to_float64(r_flat[start:stop], r64), start)
        if state.details is None and state.mismatches > state.allowed:
            state.continue_details(_fixed_pass(actual, reference, tolerance, replace(setup, detailed=True), stop))
    return state


def compare_arrays(actual: np.ndarray, reference: np.ndarray, tolerance: Tolerance, setup: Setup = Setup(), *,
                   lazy_details: bool = True) -> Comparison:
    """Compare two arrays of the same shape under fixed tolerances, element by element and as a whole.

    ``actual`` and ``reference``: same shape, floating dtypes (f64, f32, f16, bf16).
    ``setup``: the mismatch allowance, NaN handling, the dtype whose ULP grid applies (default: the
    coarser side's), the tensor's layout (for coordinates and the per-channel table; default: plain
    indices, no per-channel table) and how many worst elements to keep. Its ``detailed`` is not used: the
    details are computed on first use by a second pass (the Comparison keeps both arrays), or with
    ``lazy_details=False`` in the same pass (for a caller that will read them).
    Works in chunks of the flattened tensors, so memory stays bounded for large outputs.
    """
    setup = replace(setup.resolved(actual, reference), detailed=not lazy_details)
    keeping = replace(setup, detailed=True, keep_errors=True)

    def errors_of() -> ElementErrors:
        return _fixed_pass(actual, reference, tolerance, keeping).details.finish(actual, reference, setup.dtype).errors

    if not lazy_details:
        return _fixed_pass(actual, reference, tolerance, setup).result(errors_of=errors_of)
    detailed = replace(setup, detailed=True)
    details_of = Once(lambda: _fixed_pass(actual, reference, tolerance, detailed).details.finish(actual, reference, setup.dtype))
    return _fixed_pass(actual, reference, tolerance, setup).result(details_of=details_of, errors_of=errors_of)
