"""What a diagnosis works on: the run under diagnosis, read where and when a test needs it.

``Case`` holds the op's inputs and each judged output as the kernel and bnbwd gave them (diff_src and the inputs as
(N, C, S) views, any float dtype), the per-channel facts, and what one pass over diff_src, block by block, found: which
elements are beyond K units of the reference (``Output.beyond``) and the deviation's norm. A test reads float64
values where it needs them: ``Case.x_at``/``dy_at``/``xhat_at``/``scale_at`` and ``Output.actual_at``/``reference_at``
upcast (and for xhat and the error scale compute) any rows of the view, the same numbers element for element as
the whole tensors (float32 and float16 widen exactly; xhat and the scale are element-wise formulas). The whole
float64 tensors (``Case.x``, ``Output.actual``...) are formed only when a family asks for them: a failing run's
diagnosis mostly tests its hypotheses on a sample and the sums, and confirms one on the whole run block by block (prediction.blocks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import SMALLEST_NORMAL, to_float64, ulp_spacing
from bnbwd_cli.judge.comparison import Comparison
from bnbwd_cli.judge.diagnosis.prediction import Assessment, Prediction, blocks, chunks
from bnbwd_cli.judge.model import ChannelFacts, DiffSrcScale, diff_src_scale
from bnbwd_cli.layout import view3

if TYPE_CHECKING:
    from bnbwd_cli.core import Op

# what a family module needs besides the case, importable from here as before the split (prediction.py holds them)
__all__ = ["Assessment", "Case", "Output", "Prediction", "build_case", "chunks"]

SUMS = ("diff_gamma", "diff_beta")
def _is_slices(rows: tuple) -> bool:
    """Are ``rows`` slices only (a block of prediction.blocks, a chunk, a strided sample), not an index array?"""
    if len(rows) == 3:  # (the (N, C, S) view's: called once a block and value, so without a generator)
        return type(rows[0]) is slice and type(rows[1]) is slice and type(rows[2]) is slice
    return all(type(r) is slice for r in rows)


def upcast(view: np.ndarray, rows: tuple) -> np.ndarray:
    """float64 of ``view[rows]`` (a fresh array; float64 input: a view or a gather)."""
    return to_float64(view[rows])


WIDENING = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def operand(view: np.ndarray, rows: tuple) -> np.ndarray:
    """``view[rows]`` for a ufunc whose other operand is float64: as stored where NumPy widens it to float64 exactly
    on the way (float16, float32), so the result is upcast()'s without its pass; bfloat16 upcast (to_float64)."""
    part = view[rows]
    return part if part.dtype in WIDENING else to_float64(part)


def gathered(view: np.ndarray, index: tuple) -> np.ndarray:
    """float64 of ``view[index]`` (an index of np.unravel_index: scattered elements of a block)."""
    return to_float64(view[index])


@dataclass(frozen=True)
class Output:
    """One judged output. ``given``/``expected``: actual and reference as given ((N, C, S) views for diff_src,
    (C,) for the sums); ``beyond``: the elements beyond K units of the reference (the judge's failures);
    ``deviation_norm``: ||a - r|| over the elements a share is measured on (``where``); ``flushed``: the elements the
    judge let pass as subnormal results flushed to zero (Judging.ftz), left out of every test and fit (None: none)."""

    given: np.ndarray
    expected: np.ndarray
    comparison: Comparison
    beyond: np.ndarray
    deviation_norm: float
    flushed: np.ndarray | None = None

    def kept(self, index=...) -> np.ndarray | bool:
        """Which elements (of ``index``) a test or fit reads: all but the flushed ones (True when none is)."""
        return True if self.flushed is None else ~self.flushed[index]

    @property
    def failed(self) -> bool:
        return not self.comparison.elements_passed

    @property
    def biased(self) -> bool:
        return self.comparison.bias is not None and self.comparison.bias.significant

    @property
    def suspicious(self) -> bool:
        return self.failed or self.biased

    @cached_property
    def some_beyond(self) -> bool:
        return bool(self.beyond.any())

    @cached_property
    def actual(self) -> np.ndarray:
        """The whole actual output as float64 (formed on first use, chunk by chunk)."""
        return _whole(self.given)

    @cached_property
    def reference(self) -> np.ndarray:
        return _whole(self.expected)

    def actual_at(self, rows: tuple) -> np.ndarray:
        return self.actual[rows] if "actual" in self.__dict__ else upcast(self.given, rows)

    def reference_at(self, rows: tuple) -> np.ndarray:
        return self.reference[rows] if "reference" in self.__dict__ else upcast(self.expected, rows)

    def actual_operand(self, rows: tuple) -> np.ndarray:
        """actual_at's values for a ufunc with float64 operands (case.operand: no pass of their own)."""
        return self.actual[rows] if "actual" in self.__dict__ else operand(self.given, rows)

    def reference_at_positions(self, rows: tuple, index: tuple) -> np.ndarray:
        """reference_at(rows)[index] (``rows``: slices; ``index``: np.unravel_index's of some elements there), upcast
        at those elements alone."""
        if "reference" in self.__dict__:
            return self.reference[rows][index]
        return gathered(self.expected[rows], index)

    def where(self, values: np.ndarray, rows: tuple | None = None) -> np.ndarray:
        """The elements a share is measured on (of ``values``, the output's ``rows``): those beyond K units when
        there are any, else all."""
        if self.some_beyond:
            mask = self.beyond if rows is None else self.beyond[rows]
            return values if mask.all() else values[mask]
        return values


def _whole(array: np.ndarray) -> np.ndarray:
    """to_float64 of an (N, C, S) view or a vector, converted chunk by chunk (float64 stays a view)."""
    if array.dtype == np.float64:
        return to_float64(array)
    if array.ndim != 3:
        return to_float64(array)
    out = np.empty(array.shape)
    for part in chunks(array.shape):
        to_float64(array[part], out=out[part])
    return out


@dataclass(frozen=True)
class _Block:
    """One block's float64 values, kept while a test walks the run block by block (the last one only)."""

    key: tuple
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """The run under diagnosis (see the module docstring). ``src3``/``dy3``: src and diff_dst as (N, C, S) views."""

    inputs: Op
    facts: ChannelFacts
    src3: np.ndarray
    dy3: np.ndarray
    gamma: np.ndarray  # (C,) float64, ones when the op has none
    outputs: Mapping[str, Output]
    unit: float
    max_units: float  # K of diff_src, or of the first output (each output's own K judges it)
    model: DiffSrcScale  # diff_src's error scale of a correct kernel
    shared: dict = field(default_factory=dict, compare=False, repr=False)  # whole-tensor facts families share

    def once(self, key: str, compute: Callable[[], object]):
        """``compute()``'s value, computed on the first call for ``key`` only (a whole-tensor pass several
        families use, e.g. candidate.channel_fit)."""
        if key not in self.shared:
            self.shared[key] = compute()
        return self.shared[key]

    @property
    def count(self) -> int:
        return self.facts.count

    @property
    def shape(self) -> tuple[int, int, int]:
        """The (N, C, S) view's shape."""
        return self.src3.shape

    @property
    def channels(self) -> int:
        return self.src3.shape[1]

    @property
    def suspicious(self) -> tuple[str, ...]:
        return tuple(name for name, out in self.outputs.items() if out.suspicious)

    def sum_scale(self, name: str) -> np.ndarray:
        s_beta, s_gamma = self.facts.sum_scales(self.unit)
        return s_gamma if name == "diff_gamma" else s_beta

    # float64 values at rows of the (N, C, S) view: the whole tensor's when it was formed, else computed there (the
    # same numbers); a block's are kept while a test walks the run block by block (several read the same block), and
    # those at the last index rows asked for (the same tuple object: the screening sample's, which every hypothesis
    # reads)

    def _at(self, name: str, rows: tuple, compute: Callable[[tuple], np.ndarray]) -> np.ndarray:
        if name in self.__dict__:
            return self.__dict__[name][rows]
        if _is_slices(rows):
            held = self.shared.get("block")
            if held is None or held.key != rows:
                held = self.shared["block"] = _Block(rows)
        else:
            held = self.shared.get("gathered")
            if held is None or held.key is not rows:
                held = self.shared["gathered"] = _Block(rows)
        if name not in held.values:
            held.values[name] = compute(rows)
        return held.values[name]

    def x_at(self, rows: tuple) -> np.ndarray:
        return self._at("x", rows, lambda r: upcast(self.src3, r))

    def dy_at(self, rows: tuple) -> np.ndarray:
        return self._at("dy", rows, lambda r: upcast(self.dy3, r))

    def xhat_at(self, rows: tuple) -> np.ndarray:
        return self._at("xhat", rows, lambda r: _xhat(self.src_operand(r), self.facts))

    def src_operand(self, rows: tuple) -> np.ndarray:
        """x_at's values for a ufunc with float64 operands (operand: no upcast pass where src widens exactly)."""
        return self.x[rows] if "x" in self.__dict__ else operand(self.src3, rows)

    def dy_operand(self, rows: tuple) -> np.ndarray:
        """dy_at's values for a ufunc with float64 operands."""
        return self.dy[rows] if "dy" in self.__dict__ else operand(self.dy3, rows)

    def xhat_gathered(self, rows: tuple, index: tuple, channel: np.ndarray) -> np.ndarray:
        """xhat_at(rows)[index] (``channel``: each element's), formed at those elements alone: _xhat's operations on
        the same operands, the channels' mean and invstd gathered."""
        if "xhat" in self.__dict__:
            return self.xhat[rows][index]
        x = self.x[rows][index] if "x" in self.__dict__ else gathered(self.src3[rows], index)
        with np.errstate(invalid="ignore", over="ignore"):
            xhat = np.subtract(x, self.facts.mean[channel])
            return np.multiply(xhat, self.facts.invstd[channel], out=xhat)

    def dy_gathered(self, rows: tuple, index: tuple) -> np.ndarray:
        """dy_at(rows)[index], upcast at those elements alone."""
        return self.dy[rows][index] if "dy" in self.__dict__ else gathered(self.dy3[rows], index)

    def scale_at(self, rows: tuple) -> np.ndarray:
        """diff_src's error scale of a correct kernel at ``rows`` (the run must hold diff_src)."""
        reference = self.outputs["diff_src"].reference_at
        return self._at("src_scale", rows, lambda r: self.model.block(self.xhat_at(r), self.dy_at(r), reference(r),
                                                                      slice(0, self.channels)))

    def channel(self, c: int, samples: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Channel c's dy and xhat, float64 (n, S) arrays in storage order (the whole tensors' numbers there) of the
        ``samples`` (default: all N)."""
        if "dy" in self.__dict__ and "xhat" in self.__dict__:
            return np.ascontiguousarray(self.dy[samples, c, :]), np.ascontiguousarray(self.xhat[samples, c, :])
        dy = upcast(self.dy3, (samples, c, slice(None)))
        with np.errstate(invalid="ignore", over="ignore"):
            xhat = np.subtract(upcast(self.src3, (samples, c, slice(None))), self.facts.mean[c])
            return dy, np.multiply(xhat, self.facts.invstd[c], out=xhat)

    def _whole(self, at: Callable[[tuple], np.ndarray]) -> np.ndarray:
        out = np.empty(self.shape)
        for rows in blocks(self.shape):
            out[rows] = at(rows)
        return out

    @cached_property
    def x(self) -> np.ndarray:
        """src as a whole float64 (N, C, S) array (formed on first use; x_at reads rows without it)."""
        return _whole(self.src3)

    @cached_property
    def dy(self) -> np.ndarray:
        return _whole(self.dy3)

    @cached_property
    def xhat(self) -> np.ndarray:
        return self._whole(self.xhat_at)

    @cached_property
    def src_scale(self) -> np.ndarray:
        return self._whole(self.scale_at)


def _xhat(x: np.ndarray, facts: ChannelFacts) -> np.ndarray:
    """(x - mean) * invstd of rows of the (N, C, S) view holding every channel (a new float64 array; x float64 or
    one NumPy widens exactly, case.operand)."""
    mean, invstd = facts.mean[:, None], facts.invstd[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        xhat = np.subtract(x, mean)
        return np.multiply(xhat, invstd, out=xhat)


def build_case(inputs: Op, facts: ChannelFacts, outputs: Mapping[str, tuple[np.ndarray, np.ndarray, Comparison]]) -> Case:
    """The case of a run; ``outputs``: name -> (actual, reference, comparison). One pass over diff_src, block by
    block, finds its elements beyond K units, the deviation's norm and its per-channel sums."""
    fmt = inputs.data_format
    gamma = np.ones_like(facts.mean) if inputs.gamma is None else to_float64(inputs.gamma)
    first = outputs.get("diff_src", next(iter(outputs.values())))[2]
    unit, max_units = first.scaled.unit, first.scaled.max_units
    s_beta, s_gamma = facts.sum_scales(unit)
    observed = {}
    pending = None
    for name, (a, r, comparison) in outputs.items():
        if name == "diff_src":
            pending = (view3(a, fmt), view3(r, fmt), comparison)
            continue
        a, r = to_float64(a).reshape(-1), to_float64(r).reshape(-1)
        s = s_gamma if name == "diff_gamma" else s_beta
        with np.errstate(invalid="ignore", over="ignore"):
            beyond = ~(np.abs(a - r) <= comparison.scaled.max_units * s + ulp_spacing(r, comparison.dtype))
        flushed = _flushed(a, r, comparison)
        if flushed is not None:
            beyond &= ~flushed
            flushed = flushed if flushed.any() else None
        observed[name] = Output(a, r, comparison, beyond, _norm(a, r, beyond if beyond.any() else None), flushed)
    case = Case(inputs, facts, view3(inputs.src, fmt), view3(inputs.diff_dst, fmt), gamma, observed, unit, max_units,
                diff_src_scale(facts, unit, inputs.training))
    if pending is not None:
        output, sums = _diff_src_pass(case, *pending, _judged_failing(pending[2], fmt))
        observed["diff_src"] = output
        observed = {name: observed[name] for name in outputs}  # (the run's order)
        case = Case(case.inputs, facts, case.src3, case.dy3, gamma, observed, unit, max_units, case.model,
                    {"diff_src_sums": sums})
    return case


@dataclass
class DiffSrcSums:
    """Per channel (C,), over diff_src's finite d = a - r (with finite xhat): how many, and the sums of xhat,
    xhat^2, d and xhat*d (a line fitted to d: candidate.channel_fit), and of a*r and r*r (non-finite values as
    nan_to_num gives them: candidate.channel_ratio). Formed in build_case's pass, block by block."""

    count: np.ndarray
    x: np.ndarray
    xx: np.ndarray
    d: np.ndarray
    xd: np.ndarray
    ar: np.ndarray
    rr: np.ndarray

    def add(self, a: np.ndarray, r: np.ndarray, d: np.ndarray, x: np.ndarray, kept: np.ndarray | bool = True) -> None:
        """One block's a, r, d = a - r and xhat; ``kept``: the elements the line's fit reads (not the flushed)."""
        if kept is True:  # the usual case first: every d and xhat finite, which their channel sums say (a NaN or Inf
            d_sum, x_sum = d.sum(axis=(0, 2)), x.sum(axis=(0, 2))  # makes its sum so; an overflow takes the check)
            if np.isfinite(d_sum).all() and np.isfinite(x_sum).all():
                self.count += d.shape[0] * d.shape[2]
                self.x += x_sum
                self.xx += np.einsum("ncs,ncs->c", x, x)
                self.d += d_sum
                self.xd += np.einsum("ncs,ncs->c", x, d)
                self._products(a, r)
                return
        usable = np.isfinite(d) & np.isfinite(x) & kept
        if not usable.all():
            d, x = np.where(usable, d, 0.0), np.where(usable, x, 0.0)
        self.count += usable.sum(axis=(0, 2))
        self.x += x.sum(axis=(0, 2))
        self.xx += np.einsum("ncs,ncs->c", x, x)
        self.d += d.sum(axis=(0, 2))
        self.xd += np.einsum("ncs,ncs->c", x, d)
        self._products(a, r)

    def _products(self, a: np.ndarray, r: np.ndarray) -> None:
        """a*r and r*r, non-finite values as nan_to_num gives them: summed as they are first (finite sums: every a
        and r finite, nothing to replace), else again with the replacement."""
        ar, rr = np.einsum("ncs,ncs->c", a, r), np.einsum("ncs,ncs->c", r, r)
        if not (np.isfinite(ar).all() and np.isfinite(rr).all()):
            a, r = (v if np.isfinite(v).all() else np.nan_to_num(v) for v in (a, r))
            ar, rr = np.einsum("ncs,ncs->c", a, r), np.einsum("ncs,ncs->c", r, r)
        self.ar += ar
        self.rr += rr


def _judged_failing(comparison: Comparison, fmt: str) -> np.ndarray | None:
    """The judge's failing elements of diff_src as an (N, C, S) view, when they are the elements beyond K units of
    the reference _diff_src_pass would find: the judging pass gathered them (a failed output's details are in hand),
    every actual and reference value is finite (the judge's NaN/Inf classes differ from a plain comparison) and none
    passed as a flushed subnormal. Else None (_diff_src_pass judges every element itself)."""
    nonfinite = comparison.nonfinite
    if (comparison.elements_passed or not comparison.details_ready or comparison.flushed
            or nonfinite.nan_actual or nonfinite.nan_reference or nonfinite.inf_actual or nonfinite.inf_reference):
        return None
    failing = comparison.details.failing
    return None if failing is None else view3(failing, fmt)


def _diff_src_pass(case: Case, a3: np.ndarray, r3: np.ndarray, comparison: Comparison,
                   failing: np.ndarray | None = None) -> tuple[Output, DiffSrcSums]:
    """diff_src's Output and its per-channel sums: one pass, block by block, for the elements beyond K units, the
    deviation's norm (||a - r|| over them, or over all when none is: then a second pass) and DiffSrcSums.
    ``failing``: the elements beyond as the judge found them (_judged_failing), not judged again."""
    beyond = np.empty(a3.shape, bool) if failing is None else failing
    flushed = np.zeros(a3.shape, bool) if comparison.flushed else None
    squares = 0.0
    k = comparison.scaled.max_units
    sums = DiffSrcSums(*(np.zeros(case.channels) for _ in range(7)))
    with np.errstate(invalid="ignore", over="ignore"):
        for rows in blocks(a3.shape):
            a, r, xhat = upcast(a3, rows), upcast(r3, rows), case.xhat_at(rows)
            difference = a - r
            here = beyond[rows]
            kept = True
            if failing is None:
                scale = case.model.block(xhat, case.dy_at(rows), r, slice(0, case.channels))
                np.less_equal(np.abs(difference), k * scale + ulp_spacing(r, comparison.dtype), out=here)
                np.logical_not(here, out=here)
                if flushed is not None:
                    flushed[rows] = _flushed(a, r, comparison)
                    here &= ~flushed[rows]
                    kept = ~flushed[rows]
            squares += _squares(difference if here.all() else difference[here])
            sums.add(a, r, difference, xhat, kept)
        if not beyond.any():  # the share is measured on every element
            squares = sum(_squares(upcast(a3, rows) - upcast(r3, rows)) for rows in blocks(a3.shape))
    flushed = flushed if flushed is not None and flushed.any() else None
    return Output(a3, r3, comparison, beyond, math.sqrt(squares), flushed), sums


def _flushed(a: np.ndarray, r: np.ndarray, comparison: Comparison) -> np.ndarray | None:
    """The elements the judge let pass as subnormal results flushed to zero: a == 0 where 0 < |r| < the smallest
    normal of the output's dtype (judge/rules.pass_flushed); None when the judge let none pass so."""
    if not comparison.flushed:
        return None
    below = SMALLEST_NORMAL.get(comparison.dtype, 0.0)
    reference = np.abs(r)
    return (a == 0) & (reference > 0) & (reference < below)


def _squares(difference: np.ndarray) -> float:
    """The sum of squares of the finite differences (flat)."""
    d = difference.reshape(-1)
    total = float(np.dot(d, d))
    if math.isfinite(total):  # (a non-finite difference makes the sum non-finite: then they are left out)
        return total
    d = np.where(np.isfinite(d), d, 0.0)
    return float(np.dot(d, d))


def _norm(a: np.ndarray, r: np.ndarray, mask: np.ndarray | None) -> float:
    """||a - r|| over ``mask`` (None: all) of two vectors, non-finite differences left out."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = a - r if mask is None else a[mask] - r[mask]
    return float(np.sqrt(_squares(d)))
