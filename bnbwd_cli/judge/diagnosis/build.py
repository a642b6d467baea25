"""A diagnosis' case built from a judged run: ``build_case``, and its one pass over diff_src, block by block, that
finds the elements beyond K units of the reference, the deviation's norm and the per-channel sums (``DiffSrcSums``)
a fitted line and the channels' ratios read (judge/diagnosis/case.py holds the ``Case`` it builds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import SMALLEST_NORMAL, to_float64, ulp_spacing
from bnbwd_cli.judge.comparison import Comparison
from bnbwd_cli.judge.diagnosis.case import Case, Output, upcast
from bnbwd_cli.judge.diagnosis.prediction import blocks
from bnbwd_cli.judge.model import diff_src_scale
from bnbwd_cli.layout import view3

if TYPE_CHECKING:
    from bnbwd_cli.core import Op
    from bnbwd_cli.judge.model import ChannelFacts


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
