"""What a diagnosis works on, and the test every hypothesis must pass.

``Case`` holds the op's inputs as float64 (N, C, S) views, the per-channel facts, and each judged output
(actual and reference in float64). A hypothesis is a ``Prediction``: the outputs a kernel with that bug
would produce (float64, before its own rounding; None where the bug leaves an output as it is).
``assess`` accepts it only when it explains the whole run down to rounding noise:

- every output, suspicious or not, is within K units of the prediction, where the unit is the error
  model's scale of a correct kernel (judge/model.py) widened by the roundings of the predicted values
  themselves (u*|p|) and of the bug's larger sums (u*sqrt(M)*|p - r|), plus one ulp of the output dtype;
- every output that failed element-wise has >= MIN_SHARE of its deviation explained:
  1 - ||a - p|| / ||a - r|| (the number a hint reports);
- every output with a significant systematic deviation but no element beyond K units (where the share above
  says nothing: the deviation is rounding-sized) has none left after the prediction is taken out
  (the same least-squares fit and threshold as judge/bias.py), and its scale shrank by >= MIN_SCALE_SHARE
  or what is left is within 3 standard errors of zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name, to_float64, ulp_spacing
from bnbwd_cli.judge.bias import ChannelRegression, pooled_bias, vector_bias
from bnbwd_cli.judge.model import ChannelFacts, diff_src_scale
from bnbwd_cli.judge.comparison import Comparison
from bnbwd_cli.layout import view3

if TYPE_CHECKING:
    from bnbwd_cli.core import Op

MIN_SHARE = 0.9  # of an element-wise failure's deviation a hypothesis must explain
MIN_SCALE_SHARE = 0.75  # of a systematic scale (its estimate carries the fit's noise)
SUMS = ("diff_gamma", "diff_beta")


@dataclass(frozen=True)
class Output:
    """One judged output: actual and reference as float64 ((N, C, S) for diff_src, (C,) for the sums)."""

    actual: np.ndarray
    reference: np.ndarray
    comparison: Comparison
    beyond: np.ndarray | None = None  # elements beyond K units of the reference (the judge's failures)

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
    def deviation_norm(self) -> float:
        """||a - r|| over the elements the share is measured on (see share_explained)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return _norm(self.where(self.actual - self.reference))

    def where(self, values: np.ndarray) -> np.ndarray:
        """The elements a share is measured on: those beyond K units when there are any, else all."""
        if self.beyond is not None and self.beyond.any():
            return values[self.beyond]
        return values


def _norm(d: np.ndarray) -> float:
    d = d.reshape(-1)
    return float(np.sqrt(np.dot(*(np.where(np.isfinite(d), d, 0.0),) * 2)))


@dataclass(frozen=True)
class Case:
    """The run under diagnosis. x, dy, xhat: (N, C, S) float64 views of src, diff_dst and the true xhat."""

    inputs: Op
    facts: ChannelFacts
    x: np.ndarray
    dy: np.ndarray
    xhat: np.ndarray
    gamma: np.ndarray  # (C,) float64, ones when the op has none
    outputs: Mapping[str, Output]
    unit: float
    max_units: float  # K of diff_src, or of the first output (each output's own K judges it)
    src_scale: np.ndarray | None = field(default=None, repr=False)  # diff_src's error scale, (N, C, S)

    @property
    def count(self) -> int:
        return self.facts.count

    @property
    def channels(self) -> int:
        return self.x.shape[1]

    @property
    def suspicious(self) -> tuple[str, ...]:
        return tuple(name for name, out in self.outputs.items() if out.suspicious)

    def sum_scale(self, name: str) -> np.ndarray:
        s_beta, s_gamma = self.facts.sum_scales(self.unit)
        return s_gamma if name == "diff_gamma" else s_beta


def build_case(inputs: Op, facts: ChannelFacts, outputs: Mapping[str, tuple[np.ndarray, np.ndarray, Comparison]]) -> Case:
    """float64 views of the inputs and outputs; ``outputs``: name -> (actual, reference, comparison)."""
    fmt = inputs.data_format
    x, dy = (to_float64(view3(a, fmt)) for a in (inputs.src, inputs.diff_dst))
    with np.errstate(invalid="ignore", over="ignore"):
        xhat = (x - facts.mean[:, None]) * facts.invstd[:, None]
    gamma = np.ones_like(facts.mean) if inputs.gamma is None else to_float64(inputs.gamma)
    first = outputs.get("diff_src", next(iter(outputs.values())))[2]
    unit, max_units = first.scaled.unit, first.scaled.max_units
    scale = None
    if "diff_src" in outputs:
        model = diff_src_scale(facts, unit, inputs.training)
        with np.errstate(invalid="ignore", over="ignore"):
            scale = model.block(xhat, dy, to_float64(view3(outputs["diff_src"][1], fmt)), slice(0, x.shape[1]))
    s_beta, s_gamma = facts.sum_scales(unit)
    observed = {}
    for name, (a, r, comparison) in outputs.items():
        if name == "diff_src":
            a, r, s = to_float64(view3(a, fmt)), to_float64(view3(r, fmt)), scale
        else:
            a, r = to_float64(a).reshape(-1), to_float64(r).reshape(-1)
            s = s_gamma if name == "diff_gamma" else s_beta
        with np.errstate(invalid="ignore", over="ignore"):
            beyond = ~(np.abs(a - r) <= comparison.scaled.max_units * s + ulp_spacing(r, comparison.dtype))
        observed[name] = Output(a, r, comparison, beyond)
    return Case(inputs, facts, x, dy, xhat, gamma, observed, unit, max_units, scale)


@dataclass(frozen=True)
class Prediction:
    """A hypothesis' outputs (float64; None: as the reference). ``sum_scales``: per output, the error scale of
    a kernel computing that way where it exceeds a correct kernel's (e.g. sums of dy*x instead of dy*xhat,
    diff_src from sums not divided by M); the larger of the two applies. ``diff_src`` may be a function
    of an index into the (N, C, S) view returning (diff_src, its error scale), computed on first use: most
    hypotheses are rejected on the sums alone or on a sample of diff_src, and all of it costs a pass."""

    diff_src: np.ndarray | Callable[[tuple], tuple[np.ndarray, np.ndarray | None]] | None = None
    diff_gamma: np.ndarray | None = None
    diff_beta: np.ndarray | None = None
    sum_scales: Mapping[str, np.ndarray] = field(default_factory=dict)
    _computed: dict = field(default_factory=dict, compare=False, repr=False)

    def _resolve(self) -> None:
        if "diff_src" not in self._computed:
            if callable(self.diff_src):
                self._computed["diff_src"], self._computed["noise"] = self.diff_src((slice(None),) * 3)
            else:
                self._computed["diff_src"], self._computed["noise"] = self.diff_src, self.sum_scales.get("diff_src")

    def of(self, name: str) -> np.ndarray | None:
        if name != "diff_src":
            return getattr(self, name)
        self._resolve()
        return self._computed["diff_src"]

    def diff_src_rows(self, rows: tuple[slice, slice, slice]) -> np.ndarray:
        """diff_src's prediction for part of the (N, C, S) view only: a cheap first look."""
        if "diff_src" in self._computed or not callable(self.diff_src):
            return self.of("diff_src")[rows]
        return self.diff_src(rows)[0]

    def noise(self, name: str) -> np.ndarray | None:
        if name != "diff_src":
            return self.sum_scales.get(name)
        self._resolve()
        return self._computed["noise"]


@dataclass(frozen=True)
class Assessment:
    """Share of each suspicious output's deviation a prediction explains (element-wise or systematic)."""

    shares: Mapping[str, float]
    statistical: bool = False  # every share is a systematic scale's (no output failed element-wise)
    misses: float = 1.0  # share of the suspicious outputs' elements that differ from the rounded prediction

    @property
    def share(self) -> float:
        return min(self.shares.values())


def _tolerance(case: Case, name: str, p: np.ndarray, r: np.ndarray, extra: np.ndarray | None) -> np.ndarray:
    out = case.outputs[name]
    base = case.src_scale if name == "diff_src" else case.sum_scale(name)
    if extra is not None:
        base = np.maximum(base, extra)
    u, root = case.unit, math.sqrt(max(case.count, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        noise = base + u * np.abs(p) + u * root * np.abs(p - r)
        return out.comparison.scaled.max_units * noise + ulp_spacing(p, out.comparison.dtype)


def within(case: Case, name: str, p: np.ndarray, extra: np.ndarray | None = None) -> bool:
    """Is the actual output within K units of ``p`` (as many elements beyond as the judge allows)?"""
    out = case.outputs[name]
    with np.errstate(invalid="ignore", over="ignore"):
        beyond = ~(np.abs(out.actual - p) <= _tolerance(case, name, p, out.reference, extra))
    return int(np.count_nonzero(beyond)) <= out.comparison.allowed_mismatches


def rounded(p: np.ndarray, dtype: str) -> np.ndarray:
    """The prediction rounded to the output's dtype, as the kernel rounds its own values (float64 out)."""
    if dtype == "f64":
        return p
    with np.errstate(invalid="ignore", over="ignore"):
        return p.astype(dtype_from_name({"f32": "float32", "f16": "float16"}.get(dtype, dtype))).astype(np.float64)


def share_explained(out: Output, p: np.ndarray) -> float:
    """1 - ||a - p|| / ||a - r|| with p rounded to the output's dtype (as a and r are), over the elements
    beyond K units of the reference (all when none is): the share of the deviation the prediction accounts
    for, not diluted by the rounding noise of the elements the bug left alone."""
    p = rounded(p, out.comparison.dtype)
    before = out.deviation_norm
    with np.errstate(invalid="ignore", over="ignore"):
        after = _norm(out.where(out.actual - p))
    return 1.0 - after / before if before > 0 else 0.0


def _bias_left(case: Case, name: str, p: np.ndarray):
    """The systematic deviation of actual from ``p`` (judge/bias.py's fit and threshold), or None."""
    out = case.outputs[name]
    # d = a - p against the reference's basis, p rounded to the output's grid as a and r are (else every
    # element carries p's distance to the grid, noise that a - r does not have)
    shifted = out.actual - rounded(p, out.comparison.dtype) + out.reference
    if name == "diff_src":
        regression = ChannelRegression(case.channels, out.comparison.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            regression.add(case.xhat, out.reference, shifted, case.dy, slice(0, case.channels))
        fit = regression.fit()
        return pooled_bias(fit.scale, fit.stderr, case.unit)
    noise = case.sum_scale(name) + ulp_spacing(out.reference, out.comparison.dtype) / 2
    sys_beta, sys_gamma = case.facts.systematic(case.unit)
    return vector_bias(shifted, out.reference, noise, case.unit, sys_gamma if name == "diff_gamma" else sys_beta)


def _bias_share(case: Case, name: str, p: np.ndarray) -> float | None:
    """The share of a significant systematic deviation that ``p`` explains, or None when what is left is
    still significant or more than noise (3 standard errors) and MIN_SCALE_SHARE of the original."""
    before = case.outputs[name].comparison.bias
    left = _bias_left(case, name, p)
    if left is None:
        return 1.0
    if left.significant:
        return None
    if abs(before.scale) <= before.threshold:  # only single channels were flagged, and none is now
        return 1.0
    share = 1.0 - abs(left.scale) / abs(before.scale)
    if share < MIN_SCALE_SHARE and abs(left.scale) > 3 * left.stderr:
        return None
    return max(share, 0.0)


SAMPLE = 1 << 16  # diff_src elements of the first look


def _sample_agrees(out: Output, prediction: Prediction) -> bool:
    """Does the prediction explain MIN_SHARE - 0.1 of the deviation on a sample of about SAMPLE elements
    (every few samples and spatial positions, every channel)?"""
    n, _, s = out.actual.shape
    factor = -(-out.actual.size // SAMPLE)
    if factor <= 1:
        return True
    step_n = min(n, factor)
    step_s = min(s, -(-factor // step_n))
    rows = (slice(0, n, step_n), slice(None), slice(0, s, step_s))
    sample = Output(out.actual[rows], out.reference[rows], out.comparison, out.beyond[rows])
    return share_explained(sample, prediction.diff_src_rows(rows)) >= MIN_SHARE - 0.1


def assess(case: Case, prediction: Prediction) -> Assessment | None:
    """The shares explained when ``prediction`` explains the whole run down to rounding noise, else None."""
    shares: dict[str, float] = {}
    changed = False
    # the (C,) sums first: cheap, and they reject most hypotheses before diff_src is computed
    names = sorted(case.outputs, key=lambda n: n == "diff_src")
    for name in names:
        out = case.outputs[name]
        if name == "diff_src" and out.failed and prediction.diff_src is not None and not _sample_agrees(out, prediction):
            return None
        p = prediction.of(name)
        if p is None:
            p = out.reference
        else:
            changed = True
        if out.failed:
            shares[name] = share_explained(out, p)
            if shares[name] < MIN_SHARE:
                return None
        if not within(case, name, p, prediction.noise(name)):
            return None
    for name in names:  # the systematic deviations of outputs within K units last: a least-squares pass each
        out = case.outputs[name]
        if out.biased and not out.failed:
            p = prediction.of(name)
            share = _bias_share(case, name, out.reference if p is None else p)
            if share is None:
                return None
            shares[name] = min(shares.get(name, 1.0), share)
    if not changed or not shares:
        return None
    statistical = not any(out.failed for out in case.outputs.values())
    return Assessment(shares, statistical, _misses(case, prediction) if statistical else 1.0)


def _misses(case: Case, prediction: Prediction) -> float:
    """Share of the suspicious outputs' elements whose actual value is not the prediction rounded to the
    output's grid: when every element is within an ulp, what tells two explanations of a scale apart."""
    differ = total = 0
    for name, out in case.outputs.items():
        if out.suspicious:
            p = prediction.of(name)
            p = out.reference if p is None else rounded(p, out.comparison.dtype)
            differ += int(np.count_nonzero(out.actual != p))
            total += out.actual.size
    return differ / total if total else 1.0
